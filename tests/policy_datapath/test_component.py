"""The policy-maps component in a hive with the endpoints component (memory maps): the
endpoint's netns cookie reaches policy_netns with its enforcement mode, its entries reach
its own policy map, the maps show in bpf_maps, health says what is written; an enforcing
endpoint without a cookie turns health Degraded; cleanup removes the pins."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from typing import Any

import anyio
import pytest

from bpf.catalog import policy_maps_spec, policy_netns_spec
from bpf.errors import MapError
from bpf.factory import BackendConfig, MapFactory
from bpf.policy import POLICY_MAPS, POLICY_NETNS, PolicyNetns, policy_map_name
from bpfops.policy_ops import PolicyMapError, PolicyMapSet
from reconciler.status import StatusKind
from statewright.agent.components.endpoints import EndpointsComponent, EndpointsConfig
from statewright.agent.components.policy_maps import PolicyMapsComponent, PolicyMapsConfig
from statewright.component import DEGRADED, OK, Hive
from statewright.netns_cookie import own_netns_cookie
from tables.endpoints import EndpointChange
from tables.policy_entries import PolicyEndpoint, PolicyEntry, PolicyKey
from tables.policy_netns import F_EGRESS
from tests.endpoints.helpers import DBComponent, new_pin_dir, remove_pins, wait_for
from tests.policy_datapath.map_hooks import FailingWrites


@pytest.mark.kernel  # reading a namespace's cookie needs CAP_SYS_ADMIN (setns)
def test_component_writes_maps_and_netns() -> None:
    state = tempfile.mkdtemp(prefix=f"sw-polcomp-{os.getpid()}-")
    pin_dir = new_pin_dir("memory")
    cfg = EndpointsConfig(("10.81.0.0/24",), state, "memory", pin_dir)
    policy = PolicyMapsComponent(PolicyMapsConfig("memory", pin_dir, prune_interval=None))

    async def main() -> None:
        comp = EndpointsComponent(cfg, link_exists=lambda ep: True)
        hive = Hive([DBComponent(), comp, policy])
        async with anyio.create_task_group() as tg:
            await hive.start(tg)
            mgr = comp.manager
            assert mgr is not None
            change = EndpointChange.parse(
                {"labels": ["k8s:app=a"], "netns-path": "/proc/self/ns/net"}
            )
            ep = await anyio.to_thread.run_sync(mgr.create, "0", change)
            bare = await anyio.to_thread.run_sync(
                mgr.create, "0", EndpointChange.parse({"labels": ["k8s:app=b"]})
            )
            assert ep.netns_cookie == own_netns_cookie() and bare.netns_cookie == 0
            assert policy.entries is not None and policy.modes is not None
            entries, modes, db = policy.entries, policy.modes, mgr.db
            with db.write_txn(entries, modes) as txn:
                modes.insert(txn, PolicyEndpoint(ep.id, egress_enforced=True))
                entries.insert(
                    txn, PolicyEntry(PolicyKey(ep.id, 0, True, 6, 80, 16), rules=("d/r",))
                )
            netns_map = policy.netns_map
            assert netns_map is not None

            def written() -> bool:
                rows = list(entries.all(db.read_txn()))
                return netns_map.lookup(ep.netns_cookie) == PolicyNetns(ep.id, F_EGRESS) and all(
                    r.status.kind is StatusKind.DONE for r in rows
                )

            await wait_for(written, "policy_netns entry and Done entries")
            names = {v.name for v in policy.bpf_maps()}
            assert {POLICY_MAPS, POLICY_NETNS, policy_map_name(ep.id)} <= names
            [line] = policy.health()
            assert line.state == OK and "1 endpoint policy map(s)" in line.message, line

            # enforcing without a cookie: reported, not silently ignored
            with db.write_txn(modes) as txn:
                modes.insert(txn, PolicyEndpoint(bare.id, egress_enforced=True))
            [line] = policy.health()
            assert line.state == DEGRADED and "netns cookie unknown" in line.message, line
            await hive.stop()
            tg.cancel_scope.cancel()

    try:
        anyio.run(main)
        removed = policy.cleanup()
        assert removed == []  # memory pins are not files: removed without a report
    finally:
        remove_pins("memory", pin_dir)
        shutil.rmtree(state, ignore_errors=True)


@pytest.mark.kernel
def test_cleanup_unpins_every_policy_map() -> None:
    """``statewright agent --cleanup``: policy_maps, policy_netns and every endpoint's map."""
    pin_dir = new_pin_dir("kernel")
    factory = MapFactory(BackendConfig(backend="kernel", pin_dir=pin_dir))
    try:
        outer = factory.open_typed(policy_maps_spec())
        factory.open_typed(policy_netns_spec()).close()
        maps = PolicyMapSet(outer, factory.opener, pin_dir)
        maps.ensure(3)
        maps.close()
        outer.close()
        removed = PolicyMapsComponent(PolicyMapsConfig("kernel", pin_dir)).cleanup()
        assert sorted(removed) == sorted(
            f"pin {os.path.join(pin_dir, n)}"
            for n in (POLICY_MAPS, POLICY_NETNS, policy_map_name(3))
        )
        assert os.listdir(pin_dir) == []
    finally:
        remove_pins("kernel", pin_dir)


@pytest.mark.kernel  # reading a namespace's cookie needs CAP_SYS_ADMIN (setns)
def test_component_enforces_only_a_written_policy() -> None:
    """The two reconcilers of the component in either order: a policy newly selecting the
    endpoint is not enforced while its allow entry cannot be written (policy_netns keeps
    egress off, health names the endpoint and the error, the realized revision does not
    move), and goes on once it is; a policy no longer selecting it keeps the allow entry
    while policy_netns cannot be switched off."""
    state = tempfile.mkdtemp(prefix=f"sw-polcomp-{os.getpid()}-")
    pin_dir = new_pin_dir("memory")
    cfg = EndpointsConfig(("10.82.0.0/24",), state, "memory", pin_dir)
    policy = PolicyMapsComponent(PolicyMapsConfig("memory", pin_dir, prune_interval=None))

    async def main() -> None:
        comp = EndpointsComponent(cfg, link_exists=lambda ep: True)
        hive = Hive([DBComponent(), comp, policy])
        async with anyio.create_task_group() as tg:
            await hive.start(tg)
            mgr = comp.manager
            assert mgr is not None and policy.policy_maps is not None
            change = EndpointChange.parse(
                {"labels": ["k8s:app=a"], "netns-path": "/proc/self/ns/net"}
            )
            ep = await anyio.to_thread.run_sync(mgr.create, "0", change)
            cookie = ep.netns_cookie
            assert policy.entries is not None and policy.modes is not None
            assert policy.netns_map is not None and policy.netns_ops is not None
            entries, modes, netns_map, db = policy.entries, policy.modes, policy.netns_map, mgr.db
            maps = policy.policy_maps
            await wait_for(lambda: netns_map.lookup(cookie) == PolicyNetns(ep.id, 0),
                           "the endpoint's policy_netns entry")

            # the entries reconciler cannot create the endpoint's policy map
            real_ensure = maps.ensure
            spec_name = policy_map_name(ep.id)

            def ensure(endpoint_id: int) -> Any:
                raise PolicyMapError(spec_name, "create", f"endpoint {endpoint_id}",
                                     MapError(spec_name, "create", errno.ENOMEM))

            maps.ensure = ensure  # type: ignore[method-assign]
            entry = PolicyEntry(PolicyKey(ep.id, 0, True, 6, 80, 16), rules=("d/r",))
            with db.write_txn(entries, modes) as txn:
                modes.insert(txn, PolicyEndpoint(ep.id, egress_enforced=True, revision=5))
                entries.insert(txn, entry)
            netns_rec = policy.reconcilers["policy-netns"]

            def attempted() -> bool:
                rows = list(policy.netns.all(db.read_txn()))  # type: ignore[union-attr]
                row = next(iter(entries.all(db.read_txn())))
                return (row.status.kind is StatusKind.ERROR and bool(rows)
                        and rows[0].flags == F_EGRESS and not rows[0].status.needs_work)

            await wait_for(attempted, "both reconcilers attempted the new policy")
            await anyio.sleep(0.2)  # retries come and go
            assert netns_map.lookup(cookie) == PolicyNetns(ep.id, 0), (
                "egress enforced before the endpoint's allow entry is in its policy map")
            [line] = policy.health()
            assert line.state == DEGRADED, line
            assert f"policy of endpoint {ep.id} not enforced yet in egress" in line.message
            assert "ENOMEM" in line.message, line
            assert policy.realized.get(ep.id, 0) < 5
            assert netns_rec.health.error_count == 1

            maps.ensure = real_ensure  # type: ignore[method-assign]
            await wait_for(lambda: netns_map.lookup(cookie) == PolicyNetns(ep.id, F_EGRESS),
                           "egress enforced once the entry is written")
            written = maps.get(ep.id)
            assert written is not None and len(dict(written.items())) == 1
            await wait_for(lambda: policy.realized.get(ep.id) == 5, "revision 5 realized")
            await wait_for(lambda: policy.health()[0].state == OK, "health OK")

            # the policy stops selecting the endpoint; policy_netns cannot be written
            spy = FailingWrites(netns_map)
            policy.netns_ops.map = spy  # type: ignore[assignment]
            with db.write_txn(entries, modes) as txn:
                modes.insert(txn, PolicyEndpoint(ep.id, revision=6))
                entries.delete(txn, entry)
            entries_rec = policy.reconcilers["policy-entries"]
            with anyio.fail_after(10):
                await entries_rec.wait_until_reconciled()
            await anyio.sleep(0.2)
            m = maps.get(ep.id)
            assert m is not None and len(dict(m.items())) == 1, (
                "the allow entry deleted while egress is still enforced")
            spy.failing = False
            await wait_for(lambda: netns_map.lookup(cookie) == PolicyNetns(ep.id, 0),
                           "egress off")
            await wait_for(lambda: maps.get(ep.id) is None, "the policy map removed")
            await wait_for(lambda: policy.realized.get(ep.id) == 6, "revision 6 realized")
            await hive.stop()
            tg.cancel_scope.cancel()

    try:
        anyio.run(main)
    finally:
        remove_pins("memory", pin_dir)
        shutil.rmtree(state, ignore_errors=True)
