"""The netlink source against a real kernel, in a network namespace created per test.

Devices are dummy (or ifb where the kernel lacks dummy) and veth pairs created by the tests;
addresses are netns-local and no traffic is sent. Every expectation is polled with a
deadline (`eventually`), never timed.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from reconciler.status import StatusKind, status_done
from sources.netlink import NetlinkSource
from sources.node_address_selection import (
    REASON_ALLOWED,
    REASON_DOWN,
    REASON_EXCLUDED,
    REASON_LOOPBACK,
    REASON_NO_GLOBAL_ADDRESS,
    REASON_NO_GLOBAL_ROUTE,
    REASON_SELECTED,
    NodeAddressConfig,
)
from statedb import DB
from tables.devices import SCOPE_LINK, SCOPE_UNIVERSE, Device
from tables.frontends import FrontendParams, SVCType
from tables.l3n4 import L3n4Addr
from tables.lb_writer import LBWriter
from tables.services import Service

from .helpers import add_dummy, eventually, ip, netns_names

pytestmark = pytest.mark.kernel

#: Upper bound for one test's run (the whole module stays far below 60 s).
TEST_TIMEOUT = 30.0


def new_source(ns: str, config: NodeAddressConfig | None = None,
               **kwargs: Any) -> tuple[DB, LBWriter, NetlinkSource]:
    db = DB()
    writer = LBWriter.create(db)
    kwargs.setdefault("batch_interval", 0.02)
    return db, writer, NetlinkSource.create(db, writer, config, netns=ns, **kwargs)


@asynccontextmanager
async def running(src: NetlinkSource) -> AsyncIterator[NetlinkSource]:
    """Run the source in a task group; returns once the first dump is in the tables."""
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(15):
            await tg.start(src.run)
        yield src
        tg.cancel_scope.cancel()


def run(test: Callable[[], Any], backend: str = "asyncio") -> None:
    """Run an async test body with an overall deadline."""

    async def main() -> None:
        with anyio.fail_after(TEST_TIMEOUT):
            await test()

    anyio.run(main, backend=backend)


def devices(src: NetlinkSource) -> dict[str, Device]:
    return {d.name: d for d in src.devices.all(src.db.read_txn())}


def node_addrs(src: NetlinkSource) -> dict[tuple[str, str], tuple[bool, bool]]:
    """(address, device) -> (nodeport, primary)."""
    return {
        (str(n.address), n.device_name): (n.nodeport, n.primary)
        for n in src.node_addresses.all(src.db.read_txn())
    }


def addr_texts(dev: Device) -> set[str]:
    return {f"{a.address}/{a.prefixlen}" for a in dev.addresses}


async def link_json(ns: str, name: str) -> dict[str, Any]:
    out = json.loads(await ip(ns, "-j", "link", "show", name))
    assert len(out) == 1
    result: dict[str, Any] = out[0]
    return result


# ----- initial dump ---------------------------------------------------------------------------
def test_initial_dump_fills_tables_and_marks_initialized(netns: str) -> None:
    async def body() -> None:
        kind = await add_dummy(netns, "d0")
        await ip(netns, "link", "set", "d0", "up")
        await ip(netns, "addr", "add", "10.0.0.1/24", "dev", "d0")
        await ip(netns, "addr", "add", "203.0.113.1/24", "dev", "d0")
        await ip(netns, "addr", "add", "2001:db8::1/64", "dev", "d0", "nodad")
        await ip(netns, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
        await ip(netns, "addr", "add", "192.168.1.1/24", "dev", "v0")
        await ip(netns, "addr", "add", "192.168.2.1/24", "dev", "v1")
        await ip(netns, "link", "set", "v0", "up")

        db, writer, src = new_source(netns)
        r = db.read_txn()
        for table in (src.devices, writer.node_addresses):
            assert table.initialized(r)[0] is False
            assert table.pending_initializers(r) == ["netlink"]
        assert src.health()[0] is False

        async with running(src):
            r = db.read_txn()
            assert src.devices.initialized(r)[0] and writer.node_addresses.initialized(r)[0]
            assert src.health()[0] is True, src.health()
            devs = devices(src)
            assert set(devs) == {"lo", "d0", "v0", "v1"}
            d0 = devs["d0"]
            info = await link_json(netns, "d0")
            assert (d0.index, d0.mtu, d0.hardware_addr, d0.kind) == (
                info["ifindex"], info["mtu"], info["address"], kind)
            assert d0.up and not d0.loopback and "up" in d0.flags
            assert (d0.selected, d0.reason) == (True, REASON_SELECTED)
            assert {"10.0.0.1/24", "203.0.113.1/24", "2001:db8::1/64"} <= addr_texts(d0)
            scopes = {str(a.address): a.scope for a in d0.addresses}
            assert scopes["10.0.0.1"] == SCOPE_UNIVERSE
            assert any(s == SCOPE_LINK and a.startswith("fe80:") for a, s in scopes.items())
            assert (devs["lo"].selected, devs["lo"].reason) == (False, REASON_LOOPBACK)
            assert (devs["v1"].selected, devs["v1"].reason) == (False, REASON_DOWN)
            assert devs["v0"].kind == "veth" and devs["v0"].selected
            assert node_addrs(src) == {
                ("10.0.0.1", "d0"): (True, False),
                ("203.0.113.1", "d0"): (False, True),
                ("2001:db8::1", "d0"): (True, True),
                ("192.168.1.1", "v0"): (True, True),
            }
            # What `statewright db show devices` prints.
            assert Device.table_header()[0] == "Name" and d0.table_row()[0] == "d0"

    run(body)


# ----- addresses ------------------------------------------------------------------------------
def test_address_changes_move_flags_and_secondary_is_reported(netns: str) -> None:
    async def body() -> None:
        await add_dummy(netns, "d0")
        await ip(netns, "link", "set", "d0", "up")
        await ip(netns, "addr", "add", "10.0.0.1/24", "dev", "d0")
        _, _, src = new_source(netns)
        async with running(src):
            assert node_addrs(src) == {("10.0.0.1", "d0"): (True, True)}

            await ip(netns, "addr", "add", "10.0.0.2/24", "dev", "d0")

            def secondary() -> None:
                sec = {str(a.address): a.secondary for a in devices(src)["d0"].addresses}
                assert sec.get("10.0.0.2") is True and sec["10.0.0.1"] is False
                assert node_addrs(src) == {
                    ("10.0.0.1", "d0"): (True, True), ("10.0.0.2", "d0"): (False, False)}

            await eventually(secondary)

            await ip(netns, "addr", "add", "203.0.113.1/24", "dev", "d0")
            await ip(netns, "addr", "add", "fd00::1/64", "dev", "d0", "nodad")

            def public_primary() -> None:
                assert node_addrs(src) == {
                    ("10.0.0.1", "d0"): (True, False),
                    ("10.0.0.2", "d0"): (False, False),
                    ("203.0.113.1", "d0"): (False, True),
                    ("fd00::1", "d0"): (True, True),
                }

            await eventually(public_primary)

            await ip(netns, "addr", "del", "203.0.113.1/24", "dev", "d0")
            await ip(netns, "addr", "del", "10.0.0.2/24", "dev", "d0")

            def removed() -> None:
                assert node_addrs(src) == {
                    ("10.0.0.1", "d0"): (True, True), ("fd00::1", "d0"): (True, True)}
                assert "203.0.113.1/24" not in addr_texts(devices(src)["d0"])

            await eventually(removed)

    run(body)


def test_bursts_are_batched(netns: str) -> None:
    async def body() -> None:
        await add_dummy(netns, "d0")
        await ip(netns, "link", "set", "d0", "up")
        await ip(netns, "addr", "add", "10.0.0.1/24", "dev", "d0")
        _, _, src = new_source(netns, batch_interval=0.25)
        async with running(src):
            applies, updates = src.stats.applies, src.stats.updates
            batch = "".join(f"addr add 10.0.{i}.1/24 dev d0\n" for i in range(1, 61))
            await ip(netns, "-batch", "-", stdin=batch)

            def all_there() -> None:
                assert len(node_addrs(src)) == 61

            await eventually(all_there)
            # 60 addresses make well over 60 events (addresses and their routes), written
            # in far fewer transactions.
            assert src.stats.updates - updates >= 60
            assert src.stats.applies - applies < (src.stats.updates - updates) / 4

    run(body)


# ----- links ------------------------------------------------------------------------------------
def test_link_down_up_mtu_and_rename(netns: str) -> None:
    async def body() -> None:
        await add_dummy(netns, "d0")
        await ip(netns, "link", "set", "d0", "up")
        await ip(netns, "addr", "add", "10.0.0.1/24", "dev", "d0")
        _, _, src = new_source(netns)
        async with running(src):
            await ip(netns, "link", "set", "d0", "down")

            def down() -> None:
                d0 = devices(src)["d0"]
                assert (d0.selected, d0.reason, d0.up) == (False, REASON_DOWN, False)
                assert node_addrs(src) == {}

            await eventually(down)

            await ip(netns, "link", "set", "d0", "up")

            def up_again() -> None:
                d0 = devices(src)["d0"]
                assert (d0.selected, d0.reason) == (True, REASON_SELECTED)
                assert node_addrs(src) == {("10.0.0.1", "d0"): (True, True)}

            await eventually(up_again)

            await ip(netns, "link", "set", "d0", "mtu", "1400")

            def mtu() -> None:
                assert devices(src)["d0"].mtu == 1400

            await eventually(mtu)

            await ip(netns, "link", "set", "d0", "down")
            await ip(netns, "link", "set", "d0", "name", "d9")
            await ip(netns, "link", "set", "d9", "up")

            def renamed() -> None:
                devs = devices(src)
                assert "d0" not in devs and devs["d9"].selected
                assert node_addrs(src) == {("10.0.0.1", "d9"): (True, True)}

            await eventually(renamed)

    run(body)


def test_links_added_and_removed(netns: str) -> None:
    async def body() -> None:
        _, _, src = new_source(netns)
        async with running(src):
            assert set(devices(src)) == {"lo"}
            await ip(netns, "link", "add", "va", "type", "veth", "peer", "name", "vb")
            await ip(netns, "addr", "add", "192.168.10.1/24", "dev", "va")
            await ip(netns, "link", "set", "va", "up")
            await ip(netns, "link", "set", "vb", "up")

            def added() -> None:
                devs = devices(src)
                assert set(devs) == {"lo", "va", "vb"}
                assert (devs["va"].selected, devs["va"].reason) == (True, REASON_SELECTED)
                assert (devs["vb"].selected, devs["vb"].reason) == (
                    False, REASON_NO_GLOBAL_ADDRESS)
                assert node_addrs(src) == {("192.168.10.1", "va"): (True, True)}

            await eventually(added)

            await ip(netns, "link", "del", "va")

            def removed() -> None:
                assert set(devices(src)) == {"lo"}
                assert node_addrs(src) == {}

            await eventually(removed)

    run(body)


# ----- routes ------------------------------------------------------------------------------------
def test_route_events_decide_selection(netns: str) -> None:
    async def body() -> None:
        await add_dummy(netns, "d0")
        await ip(netns, "link", "set", "d0", "up")
        await ip(netns, "addr", "add", "198.51.100.7/32", "dev", "d0")
        _, _, src = new_source(netns)
        async with running(src):
            d0 = devices(src)["d0"]
            assert (d0.selected, d0.reason) == (False, REASON_NO_GLOBAL_ROUTE)
            assert node_addrs(src) == {}

            await ip(netns, "route", "add", "198.51.100.128/25", "dev", "d0")

            def routed() -> None:
                assert devices(src)["d0"].selected
                assert node_addrs(src) == {("198.51.100.7", "d0"): (True, True)}

            await eventually(routed)

            await ip(netns, "route", "del", "198.51.100.128/25", "dev", "d0")

            def unrouted() -> None:
                assert devices(src)["d0"].reason == REASON_NO_GLOBAL_ROUTE
                assert node_addrs(src) == {}

            await eventually(unrouted)

            await ip(netns, "route", "add", "default", "dev", "d0")
            await eventually(routed)

    run(body)


# ----- configuration and the LB tables ---------------------------------------------------------
def test_allow_list_and_address_cidrs(netns: str) -> None:
    async def body() -> None:
        await add_dummy(netns, "d0")
        await ip(netns, "link", "set", "d0", "up")
        await ip(netns, "addr", "add", "10.0.0.1/24", "dev", "d0")
        await ip(netns, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
        for a in ("192.168.1.1/24", "10.5.0.1/24"):
            await ip(netns, "addr", "add", a, "dev", "v0")
        await ip(netns, "link", "set", "v0", "up")
        await ip(netns, "link", "set", "v1", "up")
        config = NodeAddressConfig(devices=("v0",),
                                   address_cidrs=(ipaddress.ip_network("10.0.0.0/8"),))
        _, _, src = new_source(netns, config)
        async with running(src):
            devs = devices(src)
            assert (devs["d0"].selected, devs["d0"].reason) == (False, REASON_EXCLUDED)
            assert (devs["v1"].selected, devs["v1"].reason) == (False, REASON_EXCLUDED)
            assert (devs["v0"].selected, devs["v0"].reason) == (True, REASON_ALLOWED)
            assert node_addrs(src) == {("10.5.0.1", "v0"): (True, True)}

    run(body)


def test_nodeport_frontends_follow_node_addresses(netns: str) -> None:
    async def body() -> None:
        await add_dummy(netns, "d0")
        await ip(netns, "link", "set", "d0", "up")
        await ip(netns, "addr", "add", "10.0.0.1/24", "dev", "d0")
        db, writer, src = new_source(netns)
        np = L3n4Addr.parse("0.0.0.0:30080/TCP")
        cip = L3n4Addr.parse("10.96.0.10:80/TCP")
        with writer.write_txn() as txn:
            writer.upsert_service_and_frontends(txn, Service("default/web"), [
                FrontendParams(np, SVCType.NODE_PORT, "default/web", service_port=80),
                FrontendParams(cip, SVCType.CLUSTER_IP, "default/web", service_port=80)])

        def mark_done() -> None:
            with writer.write_txn() as txn:
                for fe in list(writer.frontends.all(txn)):
                    writer.frontends.insert(txn, fe.with_status(status_done()))

        def status(addr: L3n4Addr) -> StatusKind:
            fe = writer.frontends.get(db.read_txn(), addr)
            assert fe is not None
            return fe.status.kind

        async with running(src):
            assert node_addrs(src) == {("10.0.0.1", "d0"): (True, True)}
            mark_done()
            await ip(netns, "addr", "add", "10.0.0.2/24", "dev", "d0")
            await eventually(lambda: _expect(("10.0.0.2", "d0") in node_addrs(src)))
            assert status(np) is StatusKind.PENDING
            assert status(cip) is StatusKind.DONE

            mark_done()
            await ip(netns, "addr", "del", "10.0.0.2/24", "dev", "d0")
            await eventually(lambda: _expect(("10.0.0.2", "d0") not in node_addrs(src)))
            assert status(np) is StatusKind.PENDING

    run(body)


def _expect(cond: bool) -> None:
    assert cond


# ----- errors and rebuilds ------------------------------------------------------------------
def test_injected_error_rebuilds_from_full_dump(netns: str) -> None:
    async def body() -> None:
        await add_dummy(netns, "d0")
        await ip(netns, "link", "set", "d0", "up")
        await ip(netns, "addr", "add", "10.0.0.1/24", "dev", "d0")
        _, _, src = new_source(netns)
        async with running(src):
            assert src.stats.dumps == 1
            src.pause_reading()
            await ip(netns, "addr", "add", "10.0.0.99/24", "dev", "d0")
            # The queued events are dropped with the error: only a new dump finds 10.0.0.99.
            src.inject_error(errno.ENOBUFS)
            src.resume_reading()

            def rebuilt() -> None:
                assert src.stats.dumps == 2
                assert errno.ENOBUFS in src.stats.error_codes
                assert ("10.0.0.99", "d0") in node_addrs(src)
                assert src.health()[0], src.health()

            await eventually(rebuilt)
            assert "ENOBUFS" in src.stats.last_error or "buffer" in src.stats.last_error

            # Events flow again after the rebuild.
            await ip(netns, "addr", "add", "10.0.0.100/24", "dev", "d0")
            await eventually(lambda: _expect(("10.0.0.100", "d0") in node_addrs(src)))

    run(body)


def test_real_enobufs_overflow_rebuilds(netns: str) -> None:
    async def body() -> None:
        await add_dummy(netns, "d0")
        await ip(netns, "link", "set", "d0", "up")
        await ip(netns, "addr", "add", "10.0.0.1/16", "dev", "d0")
        _, _, src = new_source(netns, rcvbuf=4096)
        async with running(src):
            src.pause_reading()
            batch = "".join(f"addr add 10.0.{i // 200}.{i % 200 + 2}/16 dev d0\n"
                            for i in range(300))
            await ip(netns, "-batch", "-", stdin=batch)
            src.resume_reading()

            def recovered() -> None:
                assert errno.ENOBUFS in src.stats.error_codes, src.stats
                assert src.stats.dumps >= 2
                assert len(node_addrs(src)) == 301

            await eventually(recovered)

    run(body)


# ----- lifecycle --------------------------------------------------------------------------------
def _open_fds() -> set[int]:
    return {int(f) for f in os.listdir("/proc/self/fd")}


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_stops_cleanly_when_cancelled(netns: str, backend: str) -> None:
    async def body() -> None:
        await add_dummy(netns, "d0")
        _, _, src = new_source(netns)
        before = _open_fds()
        async with anyio.create_task_group() as tg:
            await tg.start(src.run)
            assert "d0" in devices(src)
            tg.cancel_scope.cancel()
        # run() returns only after the reader thread closed its sockets and pipe.
        assert src._reader is None
        assert _open_fds() <= before

    run(body, backend)


def test_missing_namespace_is_reported_not_created(netns: str) -> None:
    missing = netns + "-missing"

    async def body() -> None:
        _, _, src = new_source(missing)
        async with anyio.create_task_group() as tg:
            tg.start_soon(src.run)

            def failing() -> None:
                assert src.stats.errors >= 1
                assert missing in src.stats.last_error

            await eventually(failing)
            ok, reason = src.health()
            assert not ok and "waiting for the first full dump" in reason
            assert not src.initialized
            tg.cancel_scope.cancel()

    run(body)
    assert missing not in netns_names()


# ----- events agree with a fresh dump --------------------------------------------------------
CHURN = [
    "link add c0 type veth peer name c1",
    "addr add 10.1.0.1/24 dev c0",
    "addr add 10.1.0.2/24 dev c0",
    "addr add 2001:db8:1::1/64 dev c0 nodad",
    "link set c0 up",
    "link set c1 up",
    "route add 10.9.0.0/16 dev c0",
    "route add 2001:db8:9::/48 dev c0",
    "addr add 203.0.113.10/32 dev c1",
    "route add 203.0.113.128/25 dev c1",
    "link set c0 mtu 1280",
    "link set c0 down",
    "link set c0 up",
    "addr add 10.1.0.3/24 dev c0",
    "addr del 10.1.0.1/24 dev c0",
    "link set c1 down",
    "link set c1 name c9",
    "link set c9 up",
    "link add e0 type veth peer name e1",
    "addr add 192.168.50.1/24 dev e0",
    "link set e0 up",
    "link set e1 up",
    "link del e0",
]


def test_events_converge_to_what_a_fresh_dump_shows(netns: str) -> None:
    """After churn (addresses, routes, down/up with silently flushed routes, renames, link
    removal), the event-driven tables equal those built from a new full dump."""

    async def body() -> None:
        await add_dummy(netns, "d0")
        await ip(netns, "link", "set", "d0", "up")
        await ip(netns, "addr", "add", "10.0.0.1/24", "dev", "d0")
        _, _, src = new_source(netns)
        async with running(src):
            for cmd in CHURN:
                await ip(netns, *cmd.split())
            _, _, fresh = new_source(netns)
            async with running(fresh):

                def same() -> None:
                    assert devices(src) == devices(fresh)
                    assert node_addrs(src) == node_addrs(fresh)
                    assert src.model.routes == fresh.model.routes

                await eventually(same)
                assert src.stats.dumps == 1  # converged by events alone
                devs = devices(fresh)
                assert "e0" not in devs and "c1" not in devs
                # Deleting the primary 10.1.0.1 took its secondaries along, going down
                # removed the IPv6 address: c0 has no global address left.
                assert devs["c0"].reason == REASON_NO_GLOBAL_ADDRESS
                # c1 (now c9) lost its static route, silently, when it went down.
                assert devs["c9"].reason == REASON_NO_GLOBAL_ROUTE
                assert devs["d0"].selected

    run(body)
