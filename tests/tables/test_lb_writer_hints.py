"""LBWriter's per-service address hints: what the writer finds for a service is exactly
what the committed tables' ``service`` indexes hold, through commits, aborted
transactions, replaced endpoints, emptied services, backends given as `CheckedBackends`
(which the hint and the frontends share), other sources' instances and a writer started
over tables that already have rows; stale addresses do not pile up."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statedb import DB
from tables.lb_writer import CheckedBackends, LBWriter
from tables.services import Service

from .helpers import be, fe, new_writer

NAMES = [f"ns/svc-{i}" for i in range(3)]


class _Abort(Exception):
    pass


def _service(
    w: LBWriter, t: object, i: int, backends: list[int], checked: bool = False
) -> None:
    name = NAMES[i]
    w.upsert_service_and_frontends(
        t,  # type: ignore[arg-type]
        Service(name, port_names=(("http", 80),)),
        [fe(f"10.96.0.{i + 1}:80/TCP", name, port_name="http")],
    )
    bes = [be(f"10.244.{i}.{j}:8080/TCP", "http") for j in backends]
    w.set_backends(
        t,  # type: ignore[arg-type]
        name, "k8s", CheckedBackends(bes) if checked else bes,
    )


def _indexed(db: DB, w: LBWriter, name: str) -> tuple[list[str], list[str]]:
    """The service's frontend and backend addresses, from the committed indexes."""
    txn = db.read_txn()
    fes = w.frontends.list(txn, w.frontends.index("service").query(name))
    bes = w.backends.list(txn, w.backends.index("service").query(name))
    return sorted(str(f.address) for f in fes), sorted(str(b.address) for b in bes)


def _found(w: LBWriter, name: str) -> tuple[list[str], list[str]]:
    """The service's frontend and backend addresses as the writer finds them."""
    with w.write_txn() as t:
        fes = w._frontends_of(t, name)
        bes = w._backends_of(t, name)
        t.abort()
    return sorted(str(f.address) for f in fes), sorted(str(b.address) for b in bes)


def test_aborted_removal_keeps_the_rows_findable() -> None:
    db, w = new_writer()
    with w.write_txn() as t:
        _service(w, t, 0, [1, 2])
    try:
        with w.write_txn() as t:
            w.set_backends(t, NAMES[0], "k8s", [])
            w.delete_service_and_frontends(t, NAMES[0])
            raise _Abort
    except _Abort:
        pass
    assert _found(w, NAMES[0]) == _indexed(db, w, NAMES[0])
    assert len(_found(w, NAMES[0])[1]) == 2


def test_aborted_addition_is_not_found() -> None:
    _db, w = new_writer()
    try:
        with w.write_txn() as t:
            _service(w, t, 1, [1, 2, 3])
            raise _Abort
    except _Abort:
        pass
    assert _found(w, NAMES[1]) == ([], [])


def test_replaced_endpoints_leave_no_stale_addresses() -> None:
    _db, w = new_writer()
    with w.write_txn() as t:
        _service(w, t, 0, [1, 2])
    for gen in range(3, 60):
        with w.write_txn() as t:
            w.set_backends(t, NAMES[0], "k8s", [be("10.244.0.1:8080/TCP", "http"),
                                               be(f"10.244.0.{gen}:8080/TCP", "http")])
    with w.write_txn() as t:
        w._backends_of(t, NAMES[0])
    assert w._be_hint is not None and len(w._be_hint[NAMES[0]]) <= 3


def test_a_new_writer_finds_the_rows_of_the_tables() -> None:
    db, w = new_writer()
    with w.write_txn() as t:
        _service(w, t, 2, [1, 2])
    w2 = LBWriter(db, w.config, services=w.services, frontends=w.frontends,
                  backends=w.backends, node_addresses=w.node_addresses)
    assert _found(w2, NAMES[2]) == _indexed(db, w, NAMES[2])
    assert len(_found(w2, NAMES[2])[1]) == 2


_step = st.tuples(
    st.integers(0, 2),  # service
    st.lists(st.integers(1, 6), max_size=4, unique=True),  # backends (empty: none)
    st.booleans(),  # given as CheckedBackends
    st.sampled_from(["", "local", "release"]),  # then: another source's instance, a release
    st.booleans(),  # delete the service and its frontends
    st.booleans(),  # abort
)


@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(_step, min_size=1, max_size=3), min_size=1, max_size=8))
def test_found_rows_are_the_indexed_rows(
    txns: list[list[tuple[int, list[int], bool, str, bool, bool]]],
) -> None:
    db, w = new_writer()
    for steps in txns:
        try:
            with w.write_txn() as t:
                for i, backends, checked, then, delete, abort in steps:
                    _service(w, t, i, backends, checked)
                    if then == "local":
                        w.upsert_backends(t, NAMES[i], [be(f"10.244.{i}.7:8080/TCP", "http",
                                                           source="local")])
                    elif then == "release" and backends:
                        w.release_backends(t, NAMES[i], "k8s",
                                           [be(f"10.244.{i}.{backends[0]}:8080/TCP").address])
                    if delete:
                        w.delete_service_and_frontends(t, NAMES[i])
                    if abort:
                        raise _Abort
        except _Abort:
            pass
        for name in NAMES:
            assert _found(w, name) == _indexed(db, w, name)


def test_the_frontend_and_the_hint_share_the_given_backends() -> None:
    """A frontend selecting all of a service's `CheckedBackends` stores that very tuple,
    and so does the service's hint once the transaction is folded; a frontend that
    selects fewer (another port name) stores its own tuple."""
    db, w = new_writer()
    bes = CheckedBackends(be(f"10.244.0.{j}:8080/TCP", "http") for j in (1, 2, 3))
    with w.write_txn() as t:
        w.set_backends(t, NAMES[0], "k8s", bes)
        w.upsert_service_and_frontends(
            t, Service(NAMES[0], port_names=(("http", 80),)),
            [fe("10.96.0.1:80/TCP", NAMES[0], port_name="http"),
             fe("10.96.0.1:81/TCP", NAMES[0], port_name="other")],
        )
    rows = {str(f.address): f for f in w.frontends.all(db.read_txn())}
    assert rows["10.96.0.1:80/TCP"].backends is bes
    assert rows["10.96.0.1:81/TCP"].backends == ()
    assert _found(w, NAMES[0])[1] == sorted(str(b.address) for b in bes)
    assert w._be_hint is not None and w._be_hint[NAMES[0]] is bes
    # A frontend written in a later transaction finds the tuple through the hint.
    with w.write_txn() as t:
        w.upsert_service_and_frontends(
            t, Service(NAMES[0], port_names=(("http", 80),)),
            [fe("10.96.0.2:80/TCP", NAMES[0], port_name="http")],
        )
    (row,) = w.frontends.all(db.read_txn())
    assert row.backends is bes


def test_a_finished_transaction_is_not_kept_alive_by_the_writer() -> None:
    """The writer remembers its last transaction's rows, not the transaction: a finished
    one would hold its tables' states, and so every row version written after it."""
    db, w = new_writer()
    with w.write_txn() as t:
        _service(w, t, 0, [1, 2])
    del t
    # Statuses written after the writer's transaction (as the reconciler does).
    for _ in range(3):
        with db.write_txn(w.frontends) as wt:
            for f in list(w.frontends.all(wt)):
                w.frontends.insert(wt, f.pending())
        del wt
    # Beside the table's own ordered-view cache, only the committed state is alive.
    retention = w.frontends.retention(db.read_txn())
    assert retention["oldest_snapshot"] == retention["revision"], retention
    # The next transaction of the writer still finds the rows of the one before.
    with w.write_txn() as t:
        _service(w, t, 1, [3])
    assert _found(w, NAMES[0]) == _indexed(db, w, NAMES[0])
    assert _found(w, NAMES[1]) == _indexed(db, w, NAMES[1])


def test_an_aborted_checked_set_leaves_no_stale_address() -> None:
    """Backends given as `CheckedBackends` in an aborted transaction stay in the hint
    only until the service is next read: then the hint is its committed rows again."""
    db, w = new_writer()
    with w.write_txn() as t:
        _service(w, t, 0, [1, 2], checked=True)
    try:
        with w.write_txn() as t:
            _service(w, t, 0, [1, 2, 3], checked=True)
            raise _Abort
    except _Abort:
        pass
    assert _found(w, NAMES[0]) == _indexed(db, w, NAMES[0])
    with w.write_txn() as t:
        w._backends_of(t, NAMES[0])
    assert w._be_hint is not None and len(w._be_hint[NAMES[0]]) == 2


def test_backends_set_again_in_the_transaction_replace_the_given_tuple() -> None:
    """A service's backends set as `CheckedBackends`, then set again in the same
    transaction as a plain list with another address (the converter merging a second
    EndpointSlice): the hint holds the new address too."""
    db, w = new_writer()
    with w.write_txn() as t:
        _service(w, t, 0, [1], checked=True)
        _service(w, t, 0, [1, 2])
    with w.write_txn() as t:
        _service(w, t, 1, [1])
    assert _found(w, NAMES[0]) == _indexed(db, w, NAMES[0])
    assert len(_found(w, NAMES[0])[1]) == 2
