"""No part of a running agent keeps an old statedb snapshot.

A ReadTxn held by a long-lived loop (a local variable across an await) holds every table's
state of that moment, and statedb then keeps every row version written since: memory grows
with every event for as long as the loop waits (benchmarks/soak.py found 8 GB/hour). Here an
agent, its debug probe on, applies a series of manifest edits; afterwards no table's
oldest live snapshot may be older than the state before the last edit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from statewright.agent.components.debug import PROBE_ENV
from tests.agent.conftest import running_agent, service_yaml, wait_for


def _tables(client: Any) -> dict[str, dict[str, int]]:
    doc: dict[str, dict[str, int]] = client.get("/debug/probe")["statedb"]
    return doc


def test_no_table_keeps_a_snapshot_older_than_its_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PROBE_ENV, "1")
    with running_agent(tmp_path) as agent:
        client = agent.client
        path = agent.manifests / "svc.yaml"
        before: dict[str, dict[str, int]] = {}
        for i in range(12):
            before = _tables(client)  # the state before the last edit
            backends = [f"10.244.7.{i + 1}", f"10.244.7.{i + 2}"]
            path.write_text(service_yaml("churn", "10.96.201.1", backends))
            wait_for(lambda i=i: f"10.244.7.{i + 2}:" in json.dumps(client.get("/lb/services")),
                     what=f"edit {i} in the LB table")
        tables = _tables(client)
        assert tables["frontends"]["revision"] > 12 and tables["backends"]["revision"] > 12

        def settled() -> bool:
            # The LB writer keeps its last transaction until its next one (bounded: that
            # is the state before the last edit); nothing may keep anything older.
            nonlocal tables
            tables = _tables(client)
            return all(t["oldest_snapshot"] >= before[n]["revision"] for n, t in tables.items())

        try:
            wait_for(settled, timeout=10, what="no snapshot older than the last edit")
        except AssertionError:
            behind = {n: t for n, t in tables.items()
                      if t["oldest_snapshot"] < before[n]["revision"]}
            raise AssertionError(f"tables with an old snapshot held: {behind}") from None
