"""The policy-maps component in a hive with the endpoints component (memory maps): the
endpoint's netns cookie reaches policy_netns with its enforcement mode, its entries reach
its own policy map, the maps show in bpf_maps, health says what is written; an enforcing
endpoint without a cookie turns health Degraded; cleanup removes the pins."""

from __future__ import annotations

import os
import shutil
import tempfile

import anyio
import pytest

from bpf.catalog import policy_maps_spec, policy_netns_spec
from bpf.factory import BackendConfig, MapFactory
from bpf.policy import POLICY_MAPS, POLICY_NETNS, PolicyNetns, policy_map_name
from bpfops.policy_ops import PolicyMapSet
from reconciler.status import StatusKind
from statewright.agent.components.endpoints import EndpointsComponent, EndpointsConfig
from statewright.agent.components.policy_maps import PolicyMapsComponent, PolicyMapsConfig
from statewright.component import DEGRADED, OK, Hive
from statewright.netns_cookie import own_netns_cookie
from tables.endpoints import EndpointChange
from tables.policy_entries import PolicyEndpoint, PolicyEntry, PolicyKey
from tables.policy_netns import F_EGRESS
from tests.endpoints.helpers import DBComponent, new_pin_dir, remove_pins, wait_for


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
