"""The DNS-records controller example (examples/dns_controller.py): it runs and converges,
and a property test built on `reconciler.testing` drives its table and SQLite target
through random writes, faults, prunes and stray records."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from examples.dns_controller import (
    Record,
    SQLiteTarget,
    expected_records,
    get_status,
    new_table,
    set_status,
)
from reconciler.testing.machine import MachineSpec, reconciler_state_machine
from statedb import keys

ROOT = Path(__file__).resolve().parents[2]


def test_example_runs_and_converges() -> None:
    """With 30% of the database writes failing, the example converges: the leftover record
    is pruned, the moved record has its new address, the deleted one is gone."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "dns_controller.py"), "--failure-rate", "0.3"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert [line for line in lines if line.startswith("sqlite:")] == [
        "sqlite: api.example.org A 192.0.2.11 ttl=300",
        "sqlite: www.example.net AAAA 2001:db8::10 ttl=60",
        "sqlite: www.example.org A 192.0.2.20 ttl=300",
    ]
    assert "health: reconciler-dns level=OK message=OK, 3 object(s)" in lines
    assert "watch (asyncio task) last saw: example.org: 2/2 record(s) Done" in lines


NAMES = [f"{host}.{zone}" for host in ("www", "api", "mail") for zone in ("example.org", "x.net")]

records = st.builds(
    lambda name, typ, value, ttl: Record(name, name.split(".", 1)[1], typ, value, ttl),
    st.sampled_from(NAMES),
    st.sampled_from(["A", "AAAA", "CNAME"]),
    st.sampled_from(["192.0.2.1", "192.0.2.2", "2001:db8::1", "mx.example.net"]),
    st.sampled_from([60, 300]),
)


def new_target() -> SQLiteTarget:
    """A fresh in-memory database; its own failures are off (FaultyOps injects them)."""
    return SQLiteTarget(":memory:")


def stray(target: SQLiteTarget, wanted: frozenset[bytes], n: int) -> None:
    """A record nobody asked for, as another writer of the database would leave."""
    name = NAMES[n % len(NAMES)] if n < len(NAMES) else f"stray{n}.example.org"
    if keys.string(name) not in wanted:
        target.upsert(Record(name, "example.org", "A", f"198.51.100.{n}"))


SPEC: MachineSpec[Record, SQLiteTarget] = MachineSpec(
    new_table=new_table,
    rows=records,
    new_target=new_target,
    observe=lambda target: target.records(),
    expected=expected_records,
    get_object_status=get_status,
    set_object_status=set_status,
    tamper=stray,
)

TestDNSControllerMachine = reconciler_state_machine(SPEC).TestCase
TestDNSControllerMachine.settings = settings(
    max_examples=25,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
