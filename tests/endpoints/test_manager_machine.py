"""A hypothesis state machine over the endpoint manager: random creates (with and without
requested addresses), label changes, deletions, vanishing interfaces and restarts. After
every step: no address is held by two endpoints, every endpoint address is allocated in
IPAM, identity reference counts equal the endpoints using them, the desired map entries
are exactly the endpoints' (plus host/world), and the endpoints match a dict model
(across restarts too; endpoints whose interface vanished are gone after a restart and
their addresses free)."""

from __future__ import annotations

import collections
import glob
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from statedb import DB
from tables.endpoint_entries import HOST_OWNER, WORLD_OWNER, EntryTables
from tables.endpoint_manager import EndpointManager
from tables.endpoints import Endpoint, EndpointChange, EndpointExistsError
from tables.identities import RESERVED, IdentityAllocator
from tables.ipam import IPAM, AddressInUseError, IPAMConfig, PoolExhaustedError

CIDRS = ("10.31.0.0/28", "fd31::/124")
LABELS = st.sampled_from([["k8s:app=a"], ["k8s:app=b"], ["k8s:app=a", "k8s:tier=x"]])


@pytest.fixture(autouse=True, scope="module")
def _remove_machine_dirs() -> Iterator[None]:
    """The state machine removes its directory in teardown; this also catches a run that
    ended before teardown (the directories carry this process's pid)."""
    yield
    for base in ("/dev/shm", tempfile.gettempdir()):
        for path in glob.glob(os.path.join(base, f"sw-epm-{os.getpid()}-*")):
            shutil.rmtree(path, ignore_errors=True)


@dataclass
class ModelEndpoint:
    addresses: tuple[str, ...]
    labels: tuple[str, ...]


class ManagerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        # tmpfs when there is one: the state files' fsyncs then cost nothing
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.dir = tempfile.mkdtemp(prefix=f"sw-epm-{os.getpid()}-", dir=shm)
        self.gone: set[int] = set()
        self.model: dict[int, ModelEndpoint] = {}
        self._boot()

    def _boot(self) -> None:
        db = DB()
        self.ipam = IPAM(db, IPAMConfig.parse(CIDRS, self.dir))
        self.mgr = EndpointManager(
            db, self.ipam, IdentityAllocator(db), self.dir, entries=EntryTables()
        )
        self.ipam.restore(reserve_router=False)
        result = self.mgr.restore(lambda ep: ep.id not in self.gone)
        self.ipam.reserve_routers()
        self.mgr.sync_host([])
        assert sorted(result.removed) == sorted(self.gone & set(self.model))
        for ep_id in result.removed:
            del self.model[ep_id]
        self.gone.clear()

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(labels=LABELS, index=st.integers(0, 15), requested=st.booleans())
    def create(self, labels: list[str], index: int, requested: bool) -> None:
        body: dict[str, object] = {"labels": labels, "container-id": f"c{index}"}
        if requested:
            body["addressing"] = {"ipv4": f"10.31.0.{index}"}
        try:
            ep = self.mgr.create("0", EndpointChange.parse(body))
        except (PoolExhaustedError, EndpointExistsError, AddressInUseError):
            return
        except Exception as e:  # requested network/broadcast/router addresses are refused
            assert requested and type(e).__name__ == "IPAMRequestError", e
            return
        assert ep.id not in self.model
        self.model[ep.id] = ModelEndpoint(
            tuple(str(a) for a in ep.addresses()), tuple(sorted(set(labels)))
        )

    @precondition(lambda self: bool(self.model))
    @rule(pick=st.integers(0, 100), labels=LABELS)
    def relabel(self, pick: int, labels: list[str]) -> None:
        ep_id = sorted(self.model)[pick % len(self.model)]
        self.mgr.update(str(ep_id), EndpointChange.parse({"labels": labels}))
        self.model[ep_id].labels = tuple(sorted(set(labels)))

    @precondition(lambda self: bool(self.model))
    @rule(pick=st.integers(0, 100))
    def delete(self, pick: int) -> None:
        ep_id = sorted(self.model)[pick % len(self.model)]
        self.mgr.delete(str(ep_id))
        del self.model[ep_id]
        self.gone.discard(ep_id)

    @precondition(lambda self: bool(self.model))
    @rule(pick=st.integers(0, 100))
    def vanish(self, pick: int) -> None:
        self.gone.add(sorted(self.model)[pick % len(self.model)])

    @rule()
    def restart(self) -> None:
        self._boot()

    @invariant()
    def consistent(self) -> None:
        txn = self.mgr.db.read_txn()
        eps: list[Endpoint] = self.mgr.all(txn)
        got = {e.id: ModelEndpoint(tuple(str(a) for a in e.addresses()), e.labels) for e in eps}
        assert got == self.model
        addrs = [a for e in eps for a in e.addresses()]
        assert len(addrs) == len(set(addrs)), "an address held by two endpoints"
        for a in addrs:
            assert self.ipam.owner_of(txn, a) is not None, f"{a} not allocated"
        uses = collections.Counter(e.identity for e in eps)
        for ident in self.mgr.identities.table.all(txn):
            if ident.id not in RESERVED:
                assert ident.refcount == uses[ident.id], ident
        assert set(uses) <= {i.id for i in self.mgr.identities.table.all(txn)}
        lxc = {
            (str(r.ip), r.sec_id)
            for r in self.mgr.entries.endpoint_map.all(txn)
            if r.owner != HOST_OWNER
        }
        assert lxc == {(str(a), e.identity) for e in eps for a in e.addresses()}
        ipc = {
            (str(r.prefix.network_address), r.identity)
            for r in self.mgr.entries.ipcache.all(txn)
            if r.owner not in (HOST_OWNER, WORLD_OWNER)
        }
        assert ipc == lxc


ManagerMachine.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestManagerMachine = ManagerMachine.TestCase
