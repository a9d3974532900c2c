"""docs/architecture.md's component table is the agent's component list, in order.

The table is written by hand for readers; this keeps it from drifting from
`statewright.agent.runtime.agent_components`: same names, same order, same needs and
provides, and each row names the module that defines the component.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from statewright.agent.config import AgentConfig
from statewright.agent.runtime import agent_components

DOC = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"
ROW = re.compile(r"^\| (\d+) \| `([^`]+)` \| ([^|]+) \|([^|]*)\|([^|]*)\|", re.M)


def _names(cell: str) -> tuple[str, ...]:
    return tuple(re.findall(r"`([^`]+)`", cell))


def test_component_table_matches_the_agent() -> None:
    rows = ROW.findall(DOC.read_text())
    components = agent_components(AgentConfig())
    assert [name for _, name, *_ in rows] == [c.name for c in components]
    for (num, name, module, needs, provides), (i, comp) in zip(
        rows, enumerate(components, 1), strict=True
    ):
        assert int(num) == i, name
        source = Path(inspect.getfile(type(comp))).as_posix()
        assert source.endswith("statewright/" + module.strip()), (name, source)
        assert _names(needs) == tuple(k.name for k in comp.needs), name
        assert _names(provides) == tuple(k.name for k in comp.provides), name
