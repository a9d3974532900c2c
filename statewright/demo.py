"""A short end-to-end demo of statedb + reconciler + bpf: endpoint rows reconciled into the
endpoints (lxc) BPF map, with injected map faults, retries, pruning of a stray entry once the
table is initialized, and the resulting table and map printed along the way.

Kernel maps are used when the machine allows (created unpinned, so the demo leaves nothing
behind); otherwise the in-memory twin with the same semantics. The demo says which.
"""

from __future__ import annotations

import dataclasses
import errno
import ipaddress
from collections.abc import Iterator

import anyio

from bpf.backend import MapBackend
from bpf.catalog import endpoints_spec
from bpf.endpoints import EndpointInfo, EndpointKey
from bpf.errors import MapError
from bpf.factory import BackendConfig, BackendKind, MapFactory
from bpf.testing import FaultyMap
from bpf.typed_map import TypedMap
from reconciler import Config, Reconciler, Status, status_pending
from statedb import DB, Index, ReadTxn, Table, keys
from statedb.show import format_rows


@dataclasses.dataclass(frozen=True, slots=True)
class Endpoint:
    """A local endpoint: its IPv4 address, the interface and endpoint id traffic is delivered to."""

    ip: ipaddress.IPv4Address
    ifindex: int
    lxc_id: int
    status: Status = dataclasses.field(default_factory=status_pending)

    def table_header(self) -> list[str]:
        """Columns of ``db show``."""
        return ["IP", "IfIndex", "EndpointID", "Status"]

    def table_row(self) -> list[str]:
        """One row of ``db show``."""
        return [str(self.ip), str(self.ifindex), str(self.lxc_id), str(self.status)]


def _key(ip: ipaddress.IPv4Address) -> EndpointKey:
    return EndpointKey.ipv4(ip.packed)


class EndpointMapOps:
    """Reconciler operations writing Endpoint rows into the endpoints BPF map."""

    def __init__(self, bpf_map: TypedMap[EndpointKey, EndpointInfo]) -> None:
        self.map = bpf_map

    def update(self, txn: ReadTxn, revision: int, ep: Endpoint) -> None:
        """Write the row's map entry."""
        self.map.update(_key(ep.ip), EndpointInfo(ifindex=ep.ifindex, lxc_id=ep.lxc_id))

    def delete(self, txn: ReadTxn, revision: int, ep: Endpoint) -> None:
        """Remove the row's map entry (already gone is fine)."""
        try:
            self.map.delete(_key(ep.ip))
        except MapError as err:
            if err.errno != errno.ENOENT:
                raise

    def prune(self, txn: ReadTxn, objects: Iterator[Endpoint]) -> None:
        """Remove every map entry no row asks for."""
        wanted = {_key(ep.ip) for ep in objects}
        for key in [k for k in self.map if k not in wanted]:
            self.map.delete(key)


def _dump(bpf_map: TypedMap[EndpointKey, EndpointInfo]) -> str:
    lines = []
    for key, info in sorted(bpf_map.items(), key=lambda kv: kv[0].ip):
        ip = ipaddress.IPv4Address(key.ip[:4])
        lines.append(f"  {ip} -> ifindex={info.ifindex} lxc_id={info.lxc_id}")
    return "\n".join(lines) or "  (empty)"


async def _run(factory: MapFactory) -> None:
    spec = endpoints_spec(max_entries=1024)
    raw: MapBackend = factory.open(spec)
    faulty = FaultyMap(raw, probability=0.5, errno=errno.ENOMEM, seed=7)
    bpf_map = TypedMap(spec, faulty)
    table: Table[Endpoint] = Table(
        "endpoints", Index("ip", key=lambda e: e.ip, encode=keys.ip_address)
    )
    db = DB(table)
    # A stray entry, as if left by an earlier run: prune removes it after initialization.
    TypedMap(spec, raw).update(_key(ipaddress.IPv4Address("10.0.9.9")), EndpointInfo(ifindex=99))
    with db.write_txn(table) as txn:
        initialized = table.register_initializer(txn, "demo-source")
    rec = Reconciler(
        db,
        Config(
            table,
            EndpointMapOps(bpf_map),
            get_object_status=lambda e: e.status,
            set_object_status=lambda e, s: dataclasses.replace(e, status=s),
            name="endpoints",
            retry_min_backoff=0.01,
            retry_max_backoff=0.1,
            prune_interval=30.0,
        ),
    )
    async with anyio.create_task_group() as tg:
        await tg.start(rec.run)
        print("1. three endpoints inserted; the map fails half of its operations:")
        with db.write_txn(table) as txn:
            for i in range(1, 4):
                table.insert(txn, Endpoint(ipaddress.IPv4Address(f"10.0.0.{i}"), 10 + i, i))
        await anyio.sleep(0.05)
        print(format_rows(table.all(db.read_txn()), "table", None, Endpoint))
        print(f"   health: {rec.health}")
        faulty.probability = 0.0
        await rec.wait_until_reconciled(table.revision(db.read_txn()), timeout=10)
        await anyio.sleep(0.2)
        print("2. faults stopped; retries converged:")
        print(format_rows(table.all(db.read_txn()), "table", None, Endpoint))
        print(f"   health: {rec.health}\n   map (stray 10.0.0.9 entry still there):")
        print(_dump(bpf_map))
        print("3. the source is initialized, so the reconciler prunes what no row explains:")
        with db.write_txn(table) as txn:
            initialized(txn)
            table.delete(txn, Endpoint(ipaddress.IPv4Address("10.0.0.2"), 0, 0))
        await rec.wait_until_reconciled(table.revision(db.read_txn()), timeout=10)
        await anyio.sleep(0.2)
        print(_dump(bpf_map))
        print(f"   health: {rec.health}")
        tg.cancel_scope.cancel()
    raw.close()


def main(backend: BackendKind = "auto") -> int:
    """Run the demo on the chosen backend; returns the exit code."""
    factory = MapFactory(BackendConfig(backend=backend, pin=False))
    print(f"statewright demo: using {factory.kind} BPF maps ({factory.reason})\n")
    anyio.run(_run, factory)
    print("\ndone: nothing was pinned, nothing is left behind.")
    return 0
