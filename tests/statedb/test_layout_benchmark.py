"""benchmarks/statedb_layout.py: its two layouts hold the same rows, and a tiny run prints
every figure for both (the figures themselves are measured, not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks import statedb_layout as layout

SCRIPT = Path(layout.__file__)


def test_layouts_answer_alike() -> None:
    """Both lookups find the same row for every key, and nothing for an unknown one; both
    write loops end with every key's newest row and the replaced one kept as older."""
    rows = [layout.Row(i) for i in range(300)]
    keys = layout.make_keys(300)
    states = {name: {"t": layout.build(name, rows, keys)[0]} for name in layout.LAYOUTS}
    for pk, row in zip(keys, rows):
        for name, get in layout.GETS.items():
            assert get(states[name], pk) is row, name
    for name, get in layout.GETS.items():
        assert get(states[name], b"no such key") is None
    newer = [layout.Row(i) for i in range(300)]
    for name, write in layout.INSERTS.items():
        st = layout.Store()
        older: dict[bytes, object] = {}
        rev = write(rows, keys, st, older, 0)
        write(newer, keys, st, older, rev)
        assert len(older) == 300 and len(st.heads) == 300, name
        if name != "records":
            assert all(st.objs[p - st.lo] is r for p, r in zip(st.heads.values(), newer))
        else:
            assert all(e[0] is r for e, r in zip(st.heads.values(), newer))


def test_tiny_run_prints_every_figure() -> None:
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--rows", "5000", "--gets", "2000", "--rounds", "1"],
        capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    for name in layout.LAYOUTS:
        for figure in ("bytes_per_row_rss", "bytes_per_row_traced", "get_ns", "insert_ns"):
            assert doc[f"{figure}_{name}"] > 0, (figure, name)
    assert doc["rows"] == 5000
    assert "load_avg_1m_at_start" in doc and "load_avg_1m_at_end" in doc
