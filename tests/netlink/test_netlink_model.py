"""The netlink source without a kernel: the kernel model's rules, and the consumer's batching,
rebuilds and table writes driven by a scripted reader thread."""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import pytest

import sources.netlink as netlink
from sources.netlink import (
    AddrInfo,
    KernelModel,
    LinkInfo,
    NetlinkSource,
    ReaderErrorEvent,
    ReaderItem,
    RouteInfo,
    Snapshot,
    Update,
)
from sources.node_address_selection import REASON_DOWN, REASON_NO_GLOBAL_ROUTE, REASON_SELECTED
from statedb import DB
from tables.lb_writer import LBWriter
from tables.node_addresses import NodeAddress

UP = 0x1 | 0x40


def link(index: int, name: str, flags: int = UP, mtu: int = 1500) -> LinkInfo:
    return LinkInfo(index, name, mtu, flags)


def addr(index: int, text: str, scope: int = 0, secondary: bool = False) -> AddrInfo:
    a, _, plen = text.partition("/")
    return AddrInfo(index, ipaddress.ip_address(a), int(plen), scope, secondary)


def route(index: int, dst: str, table: int = 254, type_: int = 1) -> RouteInfo:
    net = ipaddress.ip_network(dst)
    return RouteInfo(net.version, table, net, index, type=type_)


def eth0_snapshot(*extra_addrs: AddrInfo) -> Snapshot:
    return Snapshot(
        links=(link(1, "lo", 0x8 | UP, 65536), link(2, "eth0")),
        addrs=(addr(1, "127.0.0.1/8", 254), addr(2, "10.0.0.1/24"), *extra_addrs),
        routes=(route(2, "10.0.0.0/24"), route(2, "10.0.0.1/32", table=255, type_=2)),
    )


# ----- the model ------------------------------------------------------------------------------
def test_model_selection_and_kernel_side_effects() -> None:
    m = KernelModel()
    m.reset(eth0_snapshot())
    devs = {d.name: d for d in m.devices(netlink.NodeAddressConfig())}
    assert (devs["eth0"].selected, devs["eth0"].reason) == (True, REASON_SELECTED)
    assert not devs["lo"].selected

    # Only the local-table route left: no global route.
    m.apply(Update("delete", route(2, "10.0.0.0/24")))
    assert m.devices(netlink.NodeAddressConfig())[1].reason == REASON_NO_GLOBAL_ROUTE
    m.apply(Update("set", route(2, "0.0.0.0/0")))
    m.apply(Update("set", route(2, "2001:db8::/64")))
    assert m.global_route_devices() == {2}

    # Going down: the kernel flushes IPv4 routes silently (not the local ones of the
    # device's addresses); IPv6 routes are deleted with RTM_DELROUTE (not modelled here).
    m.apply(Update("set", link(2, "eth0", flags=0)))
    assert sorted(str(r.dst) for r in m.routes.values() if r.oif == 2) == [
        "10.0.0.1/32", "2001:db8::/64"]
    assert m.devices(netlink.NodeAddressConfig())[1].reason == REASON_DOWN

    # Removal drops the link's addresses and routes.
    m.apply(Update("delete", link(2, "eth0")))
    assert 2 not in m.addrs and not [r for r in m.routes.values() if r.oif == 2]
    assert [d.name for d in m.devices(netlink.NodeAddressConfig())] == ["lo"]


def test_model_address_updates_and_sorting() -> None:
    m = KernelModel()
    m.reset(eth0_snapshot())
    m.apply(Update("set", addr(2, "2001:db8::1/64")))
    m.apply(Update("set", addr(2, "10.0.0.2/24", secondary=True)))
    m.apply(Update("set", addr(2, "10.0.0.2/24", secondary=False)))  # replaced, not added
    eth0 = m.devices(netlink.NodeAddressConfig())[1]
    assert [str(a) for a in eth0.addresses] == ["10.0.0.1/24", "10.0.0.2/24", "2001:db8::1/64"]
    m.apply(Update("delete", addr(2, "10.0.0.2/24")))
    m.apply(Update("delete", addr(9, "10.9.9.9/24")))  # unknown: ignored
    assert len(m.devices(netlink.NodeAddressConfig())[1].addresses) == 2


# ----- the consumer, with a scripted reader -----------------------------------------------------
def scripted_reader(script: Sequence[ReaderItem | Callable[[], None]]) -> type[Any]:
    """A NetlinkReader stand-in that emits ``script`` (callables are called, e.g. to wait)
    from its thread and then waits to be stopped."""

    class Reader:
        def __init__(self, emit: Callable[[ReaderItem], None], **_: Any) -> None:
            self.emit = emit
            self.stopped = threading.Event()

        def stop(self) -> None:
            self.stopped.set()

        def run(self) -> None:
            try:
                for item in script:
                    if callable(item):
                        item()
                    else:
                        self.emit(item)
            except netlink._Stopped:
                return
            self.stopped.wait()

    return Reader


def new_source(monkeypatch: pytest.MonkeyPatch, script: Sequence[Any],
               **kwargs: Any) -> tuple[DB, LBWriter, NetlinkSource]:
    monkeypatch.setattr(netlink, "NetlinkReader", scripted_reader(script))
    db = DB()
    w = LBWriter.create(db)
    return db, w, NetlinkSource.create(db, w, **kwargs)


def addresses(db: DB, w: LBWriter) -> set[str]:
    return {f"{n.address}@{n.device_name}" for n in w.node_addresses.all(db.read_txn())}


def test_bursts_are_applied_at_most_once_per_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    go = threading.Event()
    burst = [(Update("set", addr(2, f"10.0.{i}.1/24")),) for i in range(1, 201)]
    db, w, src = new_source(monkeypatch, [eth0_snapshot(), lambda: go.wait(10), *burst],
                            batch_interval=1.0)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(src.run)
            assert src.stats.applies == 1 and addresses(db, w) == {"10.0.0.1@eth0"}
            go.set()
            with anyio.fail_after(10):
                while len(addresses(db, w)) < 201:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()

    anyio.run(main)
    assert src.stats.event_batches == 200
    # 200 separate event items, written in one or two transactions.
    assert src.stats.applies <= 3


def test_dump_after_error_replaces_state_and_keeps_foreign_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    second = threading.Event()
    after_error = Snapshot(links=(link(1, "lo", 0x8 | UP), link(3, "eth1")),
                           addrs=(addr(3, "192.168.0.5/24"),),
                           routes=(route(3, "192.168.0.0/24"),))
    db, w, src = new_source(monkeypatch, [
        eth0_snapshot(), lambda: second.wait(10),
        ReaderErrorEvent(
            "netlink: OSError: [Errno 105] No buffer space available; rebuilding", 105
        ),
        after_error,
    ])
    foreign = NodeAddress(ipaddress.ip_address("192.0.2.1"), True, True, "cfg")
    with w.write_txn() as txn:
        w.upsert_node_address(txn, foreign)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(src.run)
            assert addresses(db, w) == {"10.0.0.1@eth0", "192.0.2.1@cfg"}
            second.set()
            with anyio.fail_after(10):
                while src.stats.dumps < 2 or src.stats.applies < 2:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()

    anyio.run(main)
    # eth0 vanished in the new dump: its row and node address are gone; the row written
    # by someone else stays.
    assert {d.name for d in src.devices.all(db.read_txn())} == {"lo", "eth1"}
    assert addresses(db, w) == {"192.168.0.5@eth1", "192.0.2.1@cfg"}
    assert src.stats.errors == 1 and list(src.stats.error_codes) == [105]
    assert src.health()[0]


def test_errors_before_first_dump_keep_tables_uninitialized(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    db, w, src = new_source(monkeypatch, [ReaderErrorEvent("netlink in netns 'x': no such netns")])

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(src.run)
            with anyio.fail_after(10):
                while src.stats.errors < 1:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()

    anyio.run(main)
    r = db.read_txn()
    assert src.devices.initialized(r)[0] is False
    assert w.node_addresses.pending_initializers(r) == ["netlink"]
    ok, reason = src.health()
    assert not ok and "no such netns" in reason


def test_constructor_checks() -> None:
    db = DB()
    w = LBWriter.create(db)
    with pytest.raises(ValueError, match="batch_interval must be >= 0"):
        NetlinkSource.create(db, w, batch_interval=-1)
    other = DB()
    from tables.devices import new_devices_table

    t = new_devices_table()
    other.register(t)
    with pytest.raises(ValueError, match="not registered with db"):
        NetlinkSource(db, w, t)
