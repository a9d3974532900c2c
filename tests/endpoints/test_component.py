"""The endpoints component on both map backends: API handlers called with Request objects,
map entries for endpoints, host and world, host entries following node addresses,
restore across restarts (vanished interfaces removed, others unchanged and not rewritten),
prune after initialization, bad requests changing nothing."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import anyio
import pytest

from bpf.endpoints import FAMILY_IPV4, EndpointInfo, EndpointKey
from bpf.ipcache import IPCacheKey, RemoteEndpointInfo
from bpfops.endpoint_ops import EndpointMapOps, endpoint_key
from bpfops.ipcache_ops import IPCacheOps, ipcache_key
from statedb import DB
from statewright.agent.components.endpoints import EndpointsComponent, EndpointsConfig
from statewright.api_types import ApiError
from tables.endpoint_manager import host_link_exists
from tables.endpoints import Endpoint, mac_to_u64
from tables.identities import (
    IDENTITY_HOST,
    IDENTITY_WORLD_IPV4,
    IDENTITY_WORLD_IPV6,
    MIN_ALLOCATED_IDENTITY,
)
from tables.node_addresses import NodeAddress, new_node_addresses_table

from .helpers import call, new_pin_dir, remove_pins, running_agent, wait_for


@pytest.fixture(params=["memory", pytest.param("kernel", marks=pytest.mark.kernel)])
def setup(request: pytest.FixtureRequest) -> Iterator[EndpointsConfig]:
    """A config with a unique pin dir and state dir on the backend; removed afterwards."""
    backend = str(request.param)
    pin_dir = new_pin_dir(backend)
    state = tempfile.mkdtemp(prefix=f"sw-ep-{os.getpid()}-")
    try:
        yield EndpointsConfig(
            pod_cidrs=("10.20.0.0/24", "fd00:20::/112"),
            state_dir=state,
            backend=backend,
            pin_dir=pin_dir,
        )
    finally:
        remove_pins(backend, pin_dir)
        shutil.rmtree(state, ignore_errors=True)


POD = {
    "container-id": "c0ffee",
    "interface-name": "lxc12345",
    "interface-index": 42,
    "container-interface-name": "eth0",
    "mac": "0a:00:00:00:00:01",
    "host-mac": "0a:00:00:00:00:02",
    "k8s-pod-name": "web-1",
    "k8s-namespace": "default",
    "labels": ["k8s:app=web"],
    "netns-path": "/var/run/netns/x",
}


def endpoint_map_entries(comp: EndpointsComponent) -> dict[EndpointKey, EndpointInfo]:
    return dict(comp.maps["endpoints"].items())


def ipcache_entries(comp: EndpointsComponent) -> dict[IPCacheKey, RemoteEndpointInfo]:
    return dict(comp.maps["ipcache"].items())


def ip4key(text: str) -> EndpointKey:
    return endpoint_key(ipaddress.ip_address(text))


def net_key(text: str) -> IPCacheKey:
    return ipcache_key(ipaddress.ip_network(text))


def test_endpoint_lifecycle_and_maps(setup: EndpointsConfig) -> None:
    async def main() -> None:
        db = DB()
        na = new_node_addresses_table()
        db.register(na)
        with db.write_txn(na) as txn:
            na.insert(txn, NodeAddress(ipaddress.ip_address("192.0.2.10"), device_name="eth0"))
        async with running_agent(setup, db=db) as (_hive, comp):
            mgr = comp.manager
            assert mgr is not None
            # POST /ipam, then PUT /endpoint with that address, as the CNI plugin does
            got = await call(comp, "POST", "/ipam", query={"family": "ipv4", "owner": "c0ffee"})
            ip4 = got["address"]["ipv4"]
            assert got["ipv4"]["gateway"] == "10.20.0.1" and ip4 == "10.20.0.2"
            body = {**POD, "addressing": {"ipv4": ip4}}
            ep = await call(comp, "PUT", "/endpoint/cni-attachment-id:c0ffee:eth0", body)
            assert ep["id"] == 1 and ep["identity"] == MIN_ALLOCATED_IDENTITY
            assert ep["addressing"] == {"ipv4": ip4, "ipv6": ""}
            await wait_for(lambda: mgr.get("1").state.value == "ready", "endpoint ready")
            lxc = endpoint_map_entries(comp)
            assert lxc[ip4key(ip4)] == EndpointInfo(
                ifindex=42,
                lxc_id=1,
                mac=mac_to_u64("0a:00:00:00:00:01"),
                node_mac=mac_to_u64("0a:00:00:00:00:02"),
                sec_id=MIN_ALLOCATED_IDENTITY,
            )
            # host entries: the node address and the router address; world for both families
            assert lxc[ip4key("192.0.2.10")] == EndpointInfo(ifindex=0, flags=1, sec_id=1)
            assert lxc[ip4key("10.20.0.1")].flags == 1
            ipc = ipcache_entries(comp)
            assert ipc[net_key(f"{ip4}/32")].sec_identity == MIN_ALLOCATED_IDENTITY
            assert ipc[net_key("192.0.2.10/32")].sec_identity == IDENTITY_HOST
            assert ipc[net_key("0.0.0.0/0")].sec_identity == IDENTITY_WORLD_IPV4
            assert ipc[net_key("::/0")].sec_identity == IDENTITY_WORLD_IPV6

            # GET by every kind of reference; list
            for ref in (
                "1",
                "container-id:c0ffee",
                "pod-name:default%2Fweb-1",
                "cni-attachment-id:c0ffee:eth0",
            ):
                assert (await call(comp, "GET", f"/endpoint/{ref}"))["id"] == 1
            assert [e["id"] for e in await call(comp, "GET", "/endpoint")] == [1]

            # a second endpoint with the same labels shares the identity; auto addresses
            ep2 = await call(
                comp, "PUT", "/endpoint/0", {**POD, "container-id": "beef", "interface-index": 43}
            )
            assert ep2["identity"] == MIN_ALLOCATED_IDENTITY
            assert ep2["addressing"]["ipv4"] == "10.20.0.3" and ep2["addressing"]["ipv6"]

            # PATCH labels: a new identity, the map follows
            p = await call(comp, "PATCH", "/endpoint/2", {"labels": ["k8s:app=db"]})
            assert p["identity"] == MIN_ALLOCATED_IDENTITY + 1
            await wait_for(
                lambda: (
                    endpoint_map_entries(comp).get(ip4key("10.20.0.3"), EndpointInfo(0)).sec_id
                    == MIN_ALLOCATED_IDENTITY + 1
                ),
                "map follows the new identity",
            )

            # node addresses come and go: host entries follow
            with db.write_txn(na) as txn:
                na.insert(txn, NodeAddress(ipaddress.ip_address("192.0.2.11"), device_name="e1"))
                na.delete(txn, NodeAddress(ipaddress.ip_address("192.0.2.10"), device_name="eth0"))
            await wait_for(
                lambda: (
                    ip4key("192.0.2.11") in endpoint_map_entries(comp)
                    and ip4key("192.0.2.10") not in endpoint_map_entries(comp)
                    and net_key("192.0.2.10/32") not in ipcache_entries(comp)
                ),
                "host entries follow the node addresses",
            )

            # DELETE: entries, addresses released
            assert await call(comp, "DELETE", "/endpoint/1") == {"deleted": 1}
            await wait_for(lambda: ip4key(ip4) not in endpoint_map_entries(comp), "entry deleted")
            assert net_key(f"{ip4}/32") not in ipcache_entries(comp)
            assert (
                comp.ipam is not None
                and comp.ipam.owner_of(db.read_txn(), ipaddress.ip_address(ip4)) is None
            )
            with pytest.raises(ApiError) as ei:
                await call(comp, "GET", "/endpoint/1")
            assert ei.value.status == 404

    anyio.run(main)


BAD_REQUESTS: list[tuple[str, str, Any, int, str]] = [
    ("PUT", "/endpoint/1", b"{not json", 400, "not JSON"),
    ("PUT", "/endpoint/1", ["x"], 400, "expected a JSON object"),
    ("PUT", "/endpoint/1", {"mac": "zz"}, 400, "'mac'"),
    ("PUT", "/endpoint/1", {"interface-index": -1}, 400, "interface-index"),
    ("PUT", "/endpoint/1", {"bogus": 1}, 400, "unknown field 'bogus'"),
    ("PUT", "/endpoint/1", {"labels": "app=x"}, 400, "labels"),
    ("PUT", "/endpoint/9999", {}, 400, "out of range"),
    ("PUT", "/endpoint/x", {}, 400, "not a number"),
    ("PUT", "/endpoint/foo:bar", {}, 400, "unknown prefix"),
    ("PUT", "/endpoint/1", {"addressing": {"ipv4": "192.168.1.1"}}, 400, "pod CIDRs"),
    ("PUT", "/endpoint/1", {"addressing": {"ipv4": "10.20.0.255"}}, 400, "never handed out"),
    ("PUT", "/endpoint/1", {"addressing": {"ipv4": "fd00:20::5"}}, 400, "is not IPv4"),
    ("PUT", "/endpoint/7", {"addressing": {"ipv4": "10.20.0.9"}}, 409, "belongs to endpoint"),
    ("PUT", "/endpoint/5", {}, 409, "already exists"),
    ("PATCH", "/endpoint/5", {"addressing": {"ipv4": "10.20.0.20"}}, 400, "cannot change"),
    ("PATCH", "/endpoint/5", {"datapath-configuration": {"external-ipam": True}}, 400, "cannot"),
    ("PATCH", "/endpoint/5", {"datapath-configuration": {"external-ipam": 1}}, 400, "bool"),
    ("PATCH", "/endpoint/6", {}, 404, "not found"),
    ("DELETE", "/endpoint/6", None, 404, "not found"),
    ("POST", "/ipam", None, 400, "family"),
    ("POST", "/ipam/10.20.0.9", None, 409, "already allocated"),
    ("POST", "/ipam/nonsense", None, 400, "not an IP address"),
    ("DELETE", "/ipam/10.20.0.77", None, 404, "not allocated"),
    ("DELETE", "/ipam/10.20.0.1", None, 400, "router address"),
]


def test_bad_requests_change_nothing() -> None:
    cfg = EndpointsConfig(
        ("10.20.0.0/24",),
        tempfile.mkdtemp(prefix=f"sw-ep-{os.getpid()}-"),
        "memory",
        new_pin_dir("memory"),
    )

    async def main() -> None:
        async with running_agent(cfg) as (_hive, comp):
            assert comp.manager is not None and comp.ipam is not None
            await call(comp, "PUT", "/endpoint/5", {"addressing": {"ipv4": "10.20.0.9"}})
            mgr = comp.manager
            await wait_for(lambda: mgr.get("5").state.value == "ready", "ready")
            before = (comp.manager.all(), comp.ipam.allocations(), os.listdir(cfg.state_dir))
            for method, path, body, status, msg in BAD_REQUESTS:
                query = {"family": "ipv5"} if path == "/ipam" else None
                with pytest.raises(ApiError) as ei:
                    await call(comp, method, path, body, query=query)
                assert (ei.value.status, msg in str(ei.value)) == (status, True), (
                    method,
                    path,
                    str(ei.value),
                )
                after = (comp.manager.all(), comp.ipam.allocations(), os.listdir(cfg.state_dir))
                assert after == before, (method, path)

    try:
        anyio.run(main)
    finally:
        remove_pins("memory", cfg.pin_dir)
        shutil.rmtree(cfg.state_dir, ignore_errors=True)


def test_restore_keeps_ids_addresses_entries_and_removes_vanished(
    setup: EndpointsConfig,
) -> None:
    gone: set[int] = set()

    async def first_run() -> dict[str, Any]:
        async with running_agent(setup) as (_hive, comp):
            out = {}
            for i in range(1, 4):
                ep = await call(
                    comp,
                    "PUT",
                    f"/endpoint/{i}",
                    {
                        **POD,
                        "container-id": f"c{i}",
                        "interface-index": 100 + i,
                        "labels": [f"k8s:app=a{i % 2}"],
                    },
                )
                out[str(i)] = ep
            mgr = comp.manager
            assert mgr is not None
            await wait_for(lambda: all(e.state.value == "ready" for e in mgr.all()), "ready")
            # a stray entry written behind the agent's back, pruned after the restart
            comp.maps["endpoints"].update(
                EndpointKey(bytes([10, 20, 0, 200]) + bytes(12), FAMILY_IPV4), EndpointInfo(7)
            )
            out["lxc"] = endpoint_map_entries(comp)
            out["ipcache"] = ipcache_entries(comp)
            return out

    async def second_run(before: dict[str, Any]) -> None:
        def alive(ep: Endpoint) -> bool:
            return ep.id not in gone

        async with running_agent(setup, link_exists=alive) as (_hive, comp):
            mgr = comp.manager
            assert mgr is not None and comp.ipam is not None
            assert comp.restore_result.restored == [1, 3]
            assert comp.restore_result.removed == [2]
            for i in (1, 3):
                assert (await call(comp, "GET", f"/endpoint/{i}"))["addressing"] == before[str(i)][
                    "addressing"
                ]
                assert mgr.get(str(i)).identity == before[str(i)]["identity"]
            ip2 = before["2"]["addressing"]["ipv4"]
            assert comp.ipam.owner_of(mgr.db.read_txn(), ipaddress.ip_address(ip2)) is None
            await wait_for(lambda: all(e.state.value == "ready" for e in mgr.all()), "ready")
            await wait_for(
                lambda: (
                    ip4key("10.20.0.200") not in endpoint_map_entries(comp)
                    and ip4key(ip2) not in endpoint_map_entries(comp)
                ),
                "prune after restore",
            )
            want_endpoint_map = {
                k: v
                for k, v in before["lxc"].items()
                if k not in (ip4key("10.20.0.200"), ip4key(ip2))
            }
            assert endpoint_map_entries(comp) == {
                k: v
                for k, v in want_endpoint_map.items()
                if k != endpoint_key(ipaddress.ip_address(before["2"]["addressing"]["ipv6"]))
            }
            # nothing that was already in the maps was written again
            endpoint_map_ops, ipc_ops = comp.ops["endpoint-map"], comp.ops["ipcache"]
            assert isinstance(endpoint_map_ops, EndpointMapOps) and isinstance(ipc_ops, IPCacheOps)
            assert (endpoint_map_ops.writes, ipc_ops.writes) == (0, 0)
            assert endpoint_map_ops.skipped > 0 and ipc_ops.skipped > 0
            # a new endpoint never gets a restored or removed one's id twice; addresses
            # of the removed one may be reused only because they were released
            ep = await call(comp, "PUT", "/endpoint/0", {**POD, "container-id": "new"})
            assert ep["id"] == 2

    before = anyio.run(first_run)
    gone.add(2)
    anyio.run(second_run, before)


def test_corrupt_ipam_state_keeps_the_endpoints_and_their_addresses(
    setup: EndpointsConfig,
) -> None:
    """A torn ``ipam.json`` does not stop the agent: it is set aside, the restored
    endpoints claim their addresses again (no other endpoint gets them) and health says
    Degraded naming the file."""

    async def first_run() -> dict[str, Any]:
        async with running_agent(setup) as (_hive, comp):
            return dict(await call(comp, "PUT", "/endpoint/0", {**POD, "container-id": "c1"}))

    async def second_run(before: dict[str, Any]) -> None:
        async with running_agent(setup) as (_hive, comp):
            mgr = comp.manager
            assert mgr is not None and comp.ipam is not None
            assert comp.restore_result.restored == [before["id"]]
            ip4 = ipaddress.ip_address(before["addressing"]["ipv4"])
            assert comp.ipam.owner_of(mgr.db.read_txn(), ip4) == f"endpoint:{before['id']}"
            (line,) = comp.health()
            assert line.state == "Degraded" and "ipam.json" in line.message
            other = await call(comp, "PUT", "/endpoint/0", {**POD, "container-id": "c2"})
            assert other["addressing"]["ipv4"] != before["addressing"]["ipv4"]
            assert other["addressing"]["ipv6"] != before["addressing"]["ipv6"]

    before = anyio.run(first_run)
    state = os.path.join(setup.state_dir, "ipam.json")
    with open(state, "r+") as f:
        f.truncate(20)
    anyio.run(second_run, before)
    assert any(n.startswith("ipam.json.corrupt-") for n in os.listdir(setup.state_dir))


def test_restart_with_other_pod_cidrs_reports_the_allocations_kept_outside(
    setup: EndpointsConfig,
) -> None:
    """Configured pod CIDRs changed across a restart: the restored endpoint keeps its
    addresses, and health says so (endpoints/pod-cidrs Degraded) instead of only logging;
    the router address (the pods' gateway) moves into the new CIDR."""

    async def first_run() -> dict[str, Any]:
        async with running_agent(setup) as (_hive, comp):
            assert [h.name for h in comp.health()] == ["endpoints"]
            return dict(await call(comp, "PUT", "/endpoint/0", {**POD, "container-id": "c1"}))

    async def second_run(before: dict[str, Any]) -> None:
        async with running_agent(replace(setup, pod_cidrs=("10.21.0.0/24",))) as (_hive, comp):
            assert comp.restore_result.restored == [before["id"]]
            lines = {h.name: h for h in comp.health()}
            cidrs = lines["endpoints/pod-cidrs"]
            assert cidrs.state == "Degraded"
            assert "10.21.0.0/24" in cidrs.message
            assert before["addressing"]["ipv4"] in cidrs.message
            # The router address follows the configuration: the gateway handed out is in
            # the new CIDR, the old router addresses are released and not host entries.
            assert "10.20.0.1" not in cidrs.message and "(router)" not in cidrs.message
            status = await call(comp, "GET", "/ipam")
            assert status["router"] == {"ipv4": "10.21.0.1"}
            doc = await call(comp, "POST", "/ipam", query={"owner": "c2"})
            assert doc["ipv4"]["gateway"] == "10.21.0.1"
            assert doc["ipv4"]["cidrs"] == ["10.21.0.0/24"]
            await wait_for(lambda: net_key("10.21.0.1/32") in ipcache_entries(comp),
                           "the new router's host entry")
            await wait_for(lambda: net_key("10.20.0.1/32") not in ipcache_entries(comp),
                           "the old router's host entry removed")

    before = anyio.run(first_run)
    anyio.run(second_run, before)


def test_host_link_exists() -> None:
    assert host_link_exists(Endpoint(1))  # no interface recorded
    assert host_link_exists(Endpoint(1, interface_name="lo", ifindex=1))
    assert not host_link_exists(Endpoint(1, interface_name="lo", ifindex=2**31 - 7))
    assert not host_link_exists(
        replace(Endpoint(1), interface_name="sw-none-" + str(os.getpid())[:6])
    )


def test_config_from_agent_config_and_health(tmp_path: Any) -> None:
    from statewright.agent.config import AgentConfig

    cfg = EndpointsConfig.from_agent_config(AgentConfig(backend="memory", pin_dir="/x"))
    assert (cfg.backend, cfg.pin_dir, cfg.pod_cidrs) == (
        "memory",
        "/x",
        EndpointsConfig().pod_cidrs,
    )

    cfg = EndpointsConfig.from_agent_config(AgentConfig(
        backend="memory", pin_dir="/y", pod_cidrs=("10.1.0.0/24",), state_dir=str(tmp_path)))
    assert (cfg.pod_cidrs, cfg.state_dir) == (("10.1.0.0/24",), str(tmp_path))
    (tmp_path / "endpoints").mkdir()
    (tmp_path / "endpoints" / "3.json").write_text("{broken")
    cfg = replace(cfg, pin_dir=new_pin_dir("memory"))

    async def main() -> None:
        async with running_agent(cfg) as (_hive, comp):
            (line,) = comp.health()
            assert line.state == "Degraded" and "3.json" in line.message
        assert comp.health()[0].state == "Degraded"

    try:
        anyio.run(main)
    finally:
        remove_pins("memory", cfg.pin_dir)


# ----- lifecycle states ---------------------------------------------------------------------


def _gate(comp: EndpointsComponent, op: str, gate: anyio.Event) -> None:
    """Make the endpoint-map reconciler's ``op`` (update or delete) of endpoint entries
    wait for ``gate`` (host and world entries pass)."""
    ops = comp.ops["endpoint-map"]
    orig = getattr(ops, op)

    async def gated(txn: Any, revision: int, obj: Any) -> None:
        if obj.owner.startswith("endpoint:"):
            await gate.wait()
        orig(txn, revision, obj)

    setattr(ops, op, gated)


def test_ready_only_after_the_entries_are_in_the_maps(setup: EndpointsConfig) -> None:
    async def main() -> None:
        async with running_agent(setup) as (_hive, comp):
            mgr = comp.manager
            assert mgr is not None
            gate = anyio.Event()
            _gate(comp, "update", gate)
            seen: list[tuple[str, bool, bool]] = []

            async def observe() -> None:
                # every state the row takes, with whether its entries were in the maps then
                while True:
                    rows, watch = mgr.endpoints.all_watch(mgr.db.read_txn())
                    for ep in rows:
                        ip = str(ep.ipv4)
                        got = (ep.state.value, ip4key(ip) in endpoint_map_entries(comp),
                               net_key(f"{ip}/32") in ipcache_entries(comp))
                        if not seen or seen[-1] != got:
                            seen.append(got)
                    await watch.wait_async()

            async with anyio.create_task_group() as tg:
                tg.start_soon(observe)
                ep = await call(comp, "PUT", "/endpoint/0", POD)
                assert ep["state"] == "regenerating"
                ip = ep["addressing"]["ipv4"]
                # the ipcache entry is written, the lxc one waits: still regenerating
                await wait_for(lambda: net_key(f"{ip}/32") in ipcache_entries(comp), "ipcache")
                await anyio.sleep(0.2)
                assert mgr.get("1").state.value == "regenerating"
                assert ip4key(ip) not in endpoint_map_entries(comp)
                gate.set()
                await wait_for(lambda: mgr.get("1").state.value == "ready", "ready")
                await anyio.sleep(0.05)
                tg.cancel_scope.cancel()
            assert ip4key(ip) in endpoint_map_entries(comp)
            assert [s for s, _, _ in seen] == ["regenerating", "ready"], seen
            assert all(lxc and ipc for s, lxc, ipc in seen if s == "ready"), seen
            # a change of its entries (new labels, new identity) regenerates it again
            p = await call(comp, "PATCH", "/endpoint/1", {"labels": ["k8s:app=other"]})
            assert p["state"] == "regenerating"
            await wait_for(lambda: mgr.get("1").state.value == "ready", "ready again")
            assert endpoint_map_entries(comp)[ip4key(ip)].sec_id == p["identity"]

    anyio.run(main)


def _file_state(setup: EndpointsConfig, ep_id: int) -> str:
    with open(os.path.join(setup.state_dir, "endpoints", f"{ep_id}.json")) as f:
        return str(json.load(f)["state"])


def test_state_file_says_what_the_api_says_across_a_restart(setup: EndpointsConfig) -> None:
    """The state file follows the endpoint to ``ready`` (and back to ``regenerating`` on a
    change of its entries); after a restart the endpoint is restored, checked against the
    maps and ``ready`` again, and its file says so."""

    async def first_run() -> None:
        async with running_agent(setup) as (_hive, comp):
            mgr = comp.manager
            assert mgr is not None
            await call(comp, "PUT", "/endpoint/0", POD)
            await wait_for(lambda: mgr.get("1").state.value == "ready", "ready")
            await wait_for(lambda: _file_state(setup, 1) == "ready", "ready in the file")
            gate = anyio.Event()
            _gate(comp, "update", gate)
            p = await call(comp, "PATCH", "/endpoint/1", {"labels": ["k8s:app=other"]})
            assert p["state"] == "regenerating" == _file_state(setup, 1)
            gate.set()
            await wait_for(lambda: _file_state(setup, 1) == "ready", "ready in the file again")
            # The file is rewritten just before the endpoint's commit (mark_ready), in a
            # worker thread: the API follows a moment later.
            with anyio.fail_after(5):
                while (await call(comp, "GET", "/endpoint/1"))["state"] != "ready":
                    await anyio.sleep(0.01)

    path = os.path.join(setup.state_dir, "endpoints", "1.json")

    async def second_run() -> None:
        async with running_agent(setup) as (_hive, comp):
            mgr = comp.manager
            assert mgr is not None and comp.restore_result.restored == [1]
            await wait_for(lambda: mgr.get("1").state.value == "ready", "ready after restart")
            assert _file_state(setup, 1) == "ready"
            assert (await call(comp, "GET", "/endpoint/1"))["labels"] == ["k8s:app=other"]
        # The file already said ready with the same contents: not rewritten (an atomic
        # rewrite replaces the inode).
        assert os.stat(path).st_ino == inode_before

    anyio.run(first_run)
    inode_before = os.stat(path).st_ino
    anyio.run(second_run)


def test_a_state_file_that_cannot_be_written_keeps_the_endpoint_regenerating(
    setup: EndpointsConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ready is written to the file before the row says it: when the write fails the
    endpoint stays ``regenerating`` (logged) and becomes ``ready`` once it succeeds."""
    from tables import endpoint_manager

    async def main() -> None:
        async with running_agent(setup) as (_hive, comp):
            mgr = comp.manager
            assert mgr is not None
            gate = anyio.Event()
            _gate(comp, "update", gate)
            await call(comp, "PUT", "/endpoint/0", POD)
            real = endpoint_manager.write_json_atomic

            def failing(path: str, doc: Any) -> None:
                raise endpoint_manager.StateDirError(path, "cannot write: disk full (test)")

            monkeypatch.setattr(endpoint_manager, "write_json_atomic", failing)
            gate.set()
            await anyio.sleep(0.3)
            assert mgr.get("1").state.value == "regenerating" == _file_state(setup, 1)
            monkeypatch.setattr(endpoint_manager, "write_json_atomic", real)
            mgr.mark_ready()
            assert mgr.get("1").state.value == "ready" == _file_state(setup, 1)

    anyio.run(main)


def test_disconnecting_until_the_entries_are_removed(setup: EndpointsConfig) -> None:
    async def main() -> None:
        async with running_agent(setup) as (_hive, comp):
            mgr = comp.manager
            assert mgr is not None
            ep = await call(comp, "PUT", "/endpoint/0", POD)
            ip = ep["addressing"]["ipv4"]
            await wait_for(lambda: mgr.get("1").state.value == "ready", "ready")
            gate = anyio.Event()
            _gate(comp, "delete", gate)
            answer: list[Any] = []

            async def delete() -> None:
                answer.append(await call(comp, "DELETE", "/endpoint/1"))

            async with anyio.create_task_group() as tg:
                tg.start_soon(delete)
                await wait_for(lambda: mgr.get("1").state.value == "disconnecting", "disconnecting")
                await anyio.sleep(0.2)
                # still there, its lxc entry too; the request has not been answered
                assert not answer and ip4key(ip) in endpoint_map_entries(comp)
                assert (await call(comp, "GET", "/endpoint/1"))["state"] == "disconnecting"
                state_file = os.path.join(setup.state_dir, "endpoints", "1.json")
                with open(state_file) as f:
                    assert '"disconnecting"' in f.read()
                with pytest.raises(ApiError) as ei:
                    await call(comp, "PATCH", "/endpoint/1", {"labels": ["k8s:app=x"]})
                assert ei.value.status == 409 and "being deleted" in str(ei.value)
                gate.set()
            # answered once the entries are out of the maps
            assert answer == [{"deleted": 1}]
            assert ip4key(ip) not in endpoint_map_entries(comp)
            assert net_key(f"{ip}/32") not in ipcache_entries(comp)
            assert mgr.all() == [] and not os.path.exists(state_file)
            assert comp.ipam is not None
            assert comp.ipam.owner_of(mgr.db.read_txn(), ipaddress.ip_address(ip)) is None

    anyio.run(main)


def test_restoring_until_the_restore_is_complete(setup: EndpointsConfig) -> None:
    """Restored endpoints are ``restoring`` while the state directory is read back, then
    ``regenerating`` and ``ready``; one whose deletion was under way is removed."""

    async def first_run() -> list[dict[str, Any]]:
        async with running_agent(setup) as (_hive, comp):
            eps = [
                await call(comp, "PUT", "/endpoint/0",
                           {**POD, "container-id": f"c{i}", "interface-index": 50 + i})
                for i in range(3)
            ]
            mgr = comp.manager
            assert mgr is not None
            await wait_for(lambda: all(e.state.value == "ready" for e in mgr.all()), "ready")
            return eps

    eps = anyio.run(first_run)
    # the agent died while endpoint 3 was being deleted
    path = os.path.join(setup.state_dir, "endpoints", "3.json")
    with open(path) as f:
        doc = json.load(f)
    with open(path, "w") as f:
        json.dump({**doc, "state": "disconnecting"}, f)

    async def second_run() -> None:
        db = DB()
        during: list[dict[int, str]] = []

        def link_exists(ep: Endpoint) -> bool:
            table = next(t for t in db.tables if t.name == "endpoints")
            during.append({e.id: e.state.value for e in table.all(db.read_txn())})
            return True

        async with running_agent(setup, link_exists=link_exists, db=db) as (_hive, comp):
            mgr = comp.manager
            assert mgr is not None and comp.ipam is not None
            assert during == [{}, {1: "restoring"}]
            assert comp.restore_result.restored == [1, 2]
            assert comp.restore_result.removed == [3]
            assert all(e.state.value in ("regenerating", "ready") for e in mgr.all())
            await wait_for(lambda: all(e.state.value == "ready" for e in mgr.all()), "ready")
            ip3 = ipaddress.ip_address(eps[2]["addressing"]["ipv4"])
            assert comp.ipam.owner_of(db.read_txn(), ip3) is None
            assert not os.path.exists(path)

    anyio.run(second_run)
