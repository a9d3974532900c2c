"""Property test: random LBWriter operations keep the tables consistent with a simple model.

The model keeps, per service, its frontend set and the backends per source; after
every step (inside or after a write transaction spanning several steps) the tables
must equal what the model implies: every frontend belongs
to an existing service and lists exactly the backends the selection rules give,
every backend row has at least one instance, the service index agrees with the
instances, and a failed (conflicting) write changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from statedb import DB, ReadTxn, WriteTxn
from tables.backends import BackendParams, BackendState
from tables.frontends import FrontendParams, SVCType
from tables.l3n4 import L3n4Addr
from tables.lb_config import LBConfig
from tables.lb_writer import FrontendConflictError, LBWriter
from tables.services import Service, TrafficPolicy

SERVICES = ["ns/a", "ns/b", "ns/c"]
FRONTEND_IPS = ["10.96.0.1", "10.96.0.2", "10.96.0.3", "fd00::1"]
BACKEND_IPS = ["10.244.0.1", "10.244.0.2", "10.244.0.3", "fd00::10"]
PORT_NAMES = ["", "http", "dns"]
NODES = ["testnode", "other"]
SOURCES = ["k8s", "local"]

frontend_st = st.builds(
    lambda ip, port, name: (ip, port, name),
    st.sampled_from(FRONTEND_IPS), st.sampled_from([80, 53]), st.sampled_from(PORT_NAMES),
)
backend_st = st.builds(
    lambda ip, port, name, node, state: (ip, port, name, node, state),
    st.sampled_from(BACKEND_IPS), st.sampled_from([8080, 53]), st.sampled_from(PORT_NAMES[1:]),
    st.sampled_from(NODES), st.sampled_from([BackendState.ACTIVE, BackendState.TERMINATING]),
)


def _addr(ip: str, port: int) -> L3n4Addr:
    return L3n4Addr.make(ip, port, "TCP")


class WriterMachine(RuleBasedStateMachine):
    """Random writes against LBWriter, checked against a model after each step."""

    def __init__(self) -> None:
        super().__init__()
        self.db = DB()
        self.w = LBWriter.create(self.db, LBConfig(node_name="testnode"))
        # model: service -> (Service, {addr: port_name}); backends: (svc, source) -> {addr: params}
        self.services: dict[str, tuple[Service, dict[L3n4Addr, str]]] = {}
        self.backends: dict[tuple[str, str], dict[L3n4Addr, BackendParams]] = {}
        # An open write transaction spanning several rules (None: one txn per rule).
        self.open: WriteTxn | None = None

    @contextmanager
    def _txn(self) -> Iterator[WriteTxn]:
        if self.open is not None:
            yield self.open
        else:
            with self.w.write_txn() as t:
                yield t

    def _reader(self) -> ReadTxn:
        return self.open if self.open is not None else self.db.read_txn()

    @precondition(lambda self: self.open is None)
    @rule()
    def begin(self) -> None:
        self.open = self.w.write_txn()

    @precondition(lambda self: self.open is not None)
    @rule()
    def commit(self) -> None:
        assert self.open is not None
        self.open.commit()
        self.open = None

    def teardown(self) -> None:
        if self.open is not None:
            self.open.abort()

    @rule(name=st.sampled_from(SERVICES), fes=st.lists(frontend_st, max_size=3),
          local=st.booleans())
    def upsert_service(self, name: str, fes: list[tuple[str, int, str]], local: bool) -> None:
        policy = TrafficPolicy.LOCAL if local else TrafficPolicy.CLUSTER
        svc = Service(name, int_traffic_policy=policy)
        params: dict[L3n4Addr, str] = {}
        for ip, port, pname in fes:
            params.setdefault(_addr(ip, port), pname)
        owners = {a: n for n, (_, fs) in self.services.items() if n != name for a in fs}
        conflict = any(a in owners for a in params)
        fparams = [FrontendParams(a, SVCType.CLUSTER_IP, name, pn) for a, pn in params.items()]
        with self._txn() as t:
            before = [list(tb.all(t)) for tb in self.w.tables]
            try:
                self.w.upsert_service_and_frontends(t, svc, fparams)
            except FrontendConflictError:
                # The refused call wrote nothing, even inside the open transaction.
                assert conflict
                assert [list(tb.all(t)) for tb in self.w.tables] == before
                return
        assert not conflict
        self.services[name] = (svc, params)

    @rule(name=st.sampled_from(SERVICES))
    def delete_service(self, name: str) -> None:
        with self._txn() as t:
            self.w.delete_service_and_frontends(t, name)
        self.services.pop(name, None)

    @rule(name=st.sampled_from(SERVICES), source=st.sampled_from(SOURCES),
          bes=st.lists(backend_st, max_size=4))
    def set_backends(self, name: str, source: str,
                     bes: list[tuple[str, int, str, str, BackendState]]) -> None:
        wanted: dict[L3n4Addr, BackendParams] = {}
        for ip, port, pname, node, state in bes:
            a = _addr(ip, port)
            wanted[a] = BackendParams(a, (pname,), node_name=node, state=state, source=source)
        with self._txn() as t:
            self.w.set_backends(t, name, source, wanted.values())
        if wanted:
            self.backends[(name, source)] = wanted
        else:
            self.backends.pop((name, source), None)

    @rule(name=st.sampled_from(SERVICES), source=st.sampled_from(SOURCES),
          ip=st.sampled_from(BACKEND_IPS), port=st.sampled_from([8080, 53]))
    def release(self, name: str, source: str, ip: str, port: int) -> None:
        with self._txn() as t:
            self.w.release_backends(t, name, source, [_addr(ip, port)])
        cur = self.backends.get((name, source), {})
        cur.pop(_addr(ip, port), None)
        if not cur:
            self.backends.pop((name, source), None)

    # ----- invariants -----------------------------------------------------------------------
    def _expected_backends(self, name: str, fe_addr: L3n4Addr, pname: str,
                           svc: Service) -> list[BackendParams]:
        preferred: dict[L3n4Addr, BackendParams] = {}
        for source in ("local", "k8s"):  # local has the higher priority
            for a, p in self.backends.get((name, source), {}).items():
                preferred.setdefault(a, p)
        out = []
        for a in sorted(preferred, key=L3n4Addr.key):
            p = preferred[a]
            if a.is_ipv6 != fe_addr.is_ipv6:
                continue
            if pname and pname not in p.port_names:
                continue
            if svc.int_traffic_policy is TrafficPolicy.LOCAL and p.node_name != "testnode":
                continue
            out.append(p)
        return out

    @invariant()
    def tables_match_model(self) -> None:
        r = self._reader()
        w = self.w
        assert {s.name for s in w.services.all(r)} == set(self.services)
        fes = {f.address: f for f in w.frontends.all(r)}
        want = {a: n for n, (_, fs) in self.services.items() for a in fs}
        assert {a: f.service_name for a, f in fes.items()} == want
        for a, f in fes.items():
            svc, params = self.services[f.service_name]
            assert f.service == svc
            assert list(f.backends) == self._expected_backends(f.service_name, a, params[a], svc)
        model_addrs = {a for bes in self.backends.values() for a in bes}
        rows = list(w.backends.all(r))
        assert {b.address for b in rows} == model_addrs
        by_service = w.backends.index("service")
        for b in rows:
            assert b.instances
            for name in b.service_names():
                assert b in list(w.backends.list(r, by_service.query(name)))


TestWriterMachine = WriterMachine.TestCase
TestWriterMachine.settings = settings(
    max_examples=60,
    stateful_step_count=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
