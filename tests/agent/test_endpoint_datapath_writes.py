"""The endpoint datapath's ``policy_endpoints`` writes on kernel maps, with the map made to
fail: a failed update (ENOSPC), a failed delete (EPERM) and a closed map descriptor
(EBADF) do not end the component's follower. Each is reported in its health with the map,
the endpoint and the errno, retried with backoff while it lasts, and written once the map
works again; meanwhile the component records no more than the map really holds."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest

from bpf.catalog import policy_endpoints_spec
from bpf.errors import MapError
from bpf.factory import BackendConfig, MapFactory
from bpf.policy import NETNS_F_EGRESS, NETNS_F_INGRESS, PolicyNetns
from statewright.agent.components.conntrack import CTComponent, CTConfig
from statewright.agent.components.endpoint_datapath import (
    EndpointDatapathComponent,
    EndpointDatapathConfig,
)
from statewright.agent.components.endpoints import EndpointsComponent, EndpointsConfig
from statewright.agent.components.policy_maps import PolicyMapsComponent, PolicyMapsConfig
from statewright.component import DEGRADED, OK, Health, Hive
from tables.policy_entries import PolicyEndpoint
from tests.endpoints.helpers import DBComponent, new_pin_dir, remove_pins, wait_for
from tests.policy_datapath.map_hooks import FailingWrites

pytestmark = pytest.mark.kernel


class Refusing(FailingWrites):
    """``policy_endpoints`` counting its writes; updates fail while ``failing``, deletes
    while ``failing_deletes`` (with EPERM)."""

    def __init__(self, m: Any, err: int) -> None:
        super().__init__(m, failing=False, err=err)
        self.failing_deletes = False
        self.attempts = 0

    def before_update(self, key: Any, value: Any) -> None:
        self.attempts += 1
        super().before_update(key, value)

    def before_delete(self, key: Any) -> None:
        self.attempts += 1
        if self.failing_deletes:
            raise MapError(self.m.name, "delete", errno.EPERM)


@pytest.fixture
def places() -> Iterator[tuple[str, str]]:
    """A pin directory on bpffs and a state directory, removed after the test."""
    pin_dir = new_pin_dir("kernel")
    state = tempfile.mkdtemp(prefix=f"sw-epdp-{os.getpid()}-")
    try:
        yield pin_dir, state
    finally:
        from bpf.lxc import EndpointPrograms

        EndpointPrograms.cleanup(pin_dir)
        remove_pins("kernel", pin_dir)
        shutil.rmtree(state, ignore_errors=True)


def _line(comp: EndpointDatapathComponent) -> Health:
    [line] = comp.health()
    return line


def _degraded_with(comp: EndpointDatapathComponent, *words: str) -> Callable[[], bool]:
    def check() -> bool:
        line = _line(comp)
        return line.state == DEGRADED and all(w in line.message for w in words)

    return check


def test_map_errors_are_reported_retried_and_recovered(places: tuple[str, str]) -> None:
    pin_dir, state = places
    maps = BackendConfig(backend="kernel", pin_dir=pin_dir)
    assert MapFactory(maps).kind == "kernel", MapFactory(maps).reason
    comp = EndpointDatapathComponent(EndpointDatapathConfig(
        maps=maps, retry_min_backoff=0.01, retry_max_backoff=0.05))
    policy = PolicyMapsComponent(PolicyMapsConfig("kernel", pin_dir, prune_interval=None))
    endpoints = EndpointsComponent(EndpointsConfig(("10.81.0.0/24",), state, "kernel", pin_dir),
                                   link_exists=lambda ep: True)
    hive = Hive([DBComponent(), endpoints, policy, CTComponent(CTConfig("kernel", pin_dir)),
                 comp])

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await hive.start(tg)
            try:
                await scenario()
            finally:
                await hive.stop()
                tg.cancel_scope.cancel()

    async def scenario() -> None:
        assert _line(comp).state == OK, _line(comp)
        real = comp.flags_map
        assert real is not None and policy.modes is not None and endpoints.manager is not None
        db, modes = endpoints.manager.db, policy.modes
        refusing = Refusing(real, errno.ENOSPC)
        comp.flags_map = refusing  # type: ignore[assignment]

        def enforce(ep: int, **directions: bool) -> None:
            with db.write_txn(modes) as txn:
                modes.insert(txn, PolicyEndpoint(ep, **directions))

        # an update refused (map full): reported, retried, the follower keeps going
        refusing.failing = True
        enforce(5, ingress_enforced=True)
        await wait_for(_degraded_with(comp, "endpoint 5", "policy_endpoints", "update",
                                      "ENOSPC"), "the refused update in the health")
        tries = refusing.attempts
        await wait_for(lambda: refusing.attempts >= tries + 3, "retries of the update")
        assert not hive.failures, hive.failures
        assert real.lookup(5) is None and comp.in_force.get(5, 0) == 0
        assert comp.written.get(5, 0) == 0, "recorded as written while the map refused it"
        refusing.failing = False
        await wait_for(lambda: real.lookup(5) == PolicyNetns(5, NETNS_F_INGRESS),
                       "the update once the map takes it")
        await wait_for(lambda: _line(comp).state == OK, "health OK again")
        assert comp.in_force[5] == NETNS_F_INGRESS

        # a delete refused (EPERM): the entry stays recorded as in force until it goes
        refusing.failing_deletes = True
        with db.write_txn(modes) as txn:
            modes.delete(txn, PolicyEndpoint(5))
        await wait_for(_degraded_with(comp, "endpoint 5", "delete", "EPERM"),
                       "the refused delete in the health")
        assert comp.in_force[5] == NETNS_F_INGRESS and real.lookup(5) is not None
        refusing.failing_deletes = False
        await wait_for(lambda: real.lookup(5) is None and 5 not in comp.in_force,
                       "the delete once the map takes it")
        await wait_for(lambda: _line(comp).state == OK, "health OK again")

        # a closed map descriptor: nothing can be read or written until it is replaced
        closed = MapFactory(maps).open_typed(policy_endpoints_spec())
        closed.close()
        comp.flags_map = closed
        enforce(6, egress_enforced=True)
        await wait_for(_degraded_with(comp, "policy_endpoints", "EBADF"),
                       "the closed map in the health")
        assert not hive.failures, hive.failures
        comp.flags_map = real
        await wait_for(lambda: real.lookup(6) == PolicyNetns(6, NETNS_F_EGRESS),
                       "the write once the map is back")
        await wait_for(lambda: _line(comp).state == OK, "health OK again")
        assert not hive.failures, hive.failures

    anyio.run(main)
