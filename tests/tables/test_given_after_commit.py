"""A service whose first backends a source gave as `CheckedBackends` in a committed
transaction, and that has no frontends yet, is remembered by the LB writer
(``LBWriter._pure``): its new frontends then take the tuple without re-reading the
rows. Whatever transactions come between (committed or aborted, changing the service's
backends or another service's at the same addresses), a new frontend selects exactly
what the selection rules give (`LBWriter.select_backends`); an aborted transaction
never leaves its service remembered."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statedb import WriteTxn
from tables.backends import BackendState
from tables.lb_writer import CheckedBackends, LBWriter
from tables.services import Service, source_priority

from .helpers import be, fe, new_writer

NAMES = ["ns/a", "ns/b", "ns/c"]
FRONTENDS = {name: f"10.96.0.{i + 1}:80/TCP" for i, name in enumerate(NAMES)}


class _Abort(Exception):
    pass


def _backends(ips: list[int], port_names: tuple[str, ...], state: BackendState,
              v6: bool = False) -> CheckedBackends:
    """Given backends at ``ips`` (in that order), as a converted slice gives them."""
    return CheckedBackends(
        be(f"[fd00::{ip + 1}]:8080/TCP" if v6 else f"10.244.0.{ip + 1}:8080/TCP",
           *port_names, state=state)
        for ip in ips
    )


def _apply(w: LBWriter, t: WriteTxn, op: tuple[Any, ...]) -> None:
    kind, name = op[0], op[1]
    if kind == "set":
        w.set_backends(t, name, "k8s", op[2])
    elif kind == "release":
        w.release_backends_of_service(t, name)
    elif kind == "service":
        w.upsert_service_and_frontends(
            t, Service(name), [fe(FRONTENDS[name], name, port_name=op[2])]
        )
    elif kind == "delete":
        w.delete_service_and_frontends(t, name)
    elif kind == "other source":
        w.upsert_backends(t, name, [be(str(op[2][0].address), "http", source="local")])
    else:
        raise AssertionError(kind)


_names = st.sampled_from(NAMES)
_given = st.builds(
    _backends,
    st.lists(st.integers(0, 5), min_size=1, max_size=4, unique=True),
    st.sampled_from([("http",), ("http",), ("dns",), ()]),
    st.sampled_from([BackendState.ACTIVE, BackendState.ACTIVE, BackendState.TERMINATING]),
    st.sampled_from([False, False, False, True]),
)
_op = st.one_of(
    st.tuples(st.just("set"), _names, _given),
    st.tuples(st.just("set"), _names, _given),
    st.tuples(st.just("release"), _names),
    st.tuples(st.just("service"), _names, st.sampled_from(["", "http", "http", "dns"])),
    st.tuples(st.just("service"), _names, st.sampled_from(["", "http"])),
    st.tuples(st.just("delete"), _names),
    st.tuples(st.just("other source"), _names, _given),
)
# Transactions of a few operations each, committed (True) or aborted.
_txns = st.lists(
    st.tuples(st.lists(_op, min_size=1, max_size=4), st.sampled_from([True, True, False])),
    min_size=1,
    max_size=8,
)


def _check(w: LBWriter) -> None:
    """Every frontend has the backends the rules select, and every service the writer
    remembers has exactly its tuple's one-instance rows and no frontend."""
    with w.write_txn() as t:
        w._touched(t)  # folds the transaction before into what the writer remembers
        for row in w.frontends.all(t):
            assert row.backends == w.select_backends(t, row), row
        for name, bes in w._pure.items():
            key = (name, source_priority("k8s"))
            for p in bes:
                be_row = w.backends.get(t, p.address)
                assert be_row is not None
                ((k, inst),) = be_row.instances
                assert k == key and inst is p
            assert sum(1 for f in w.backends.all(t) if f.instance(name) is not None) == len(bes)
            assert all(f.service_name != name for f in w.frontends.all(t))
        t.abort()


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(_txns)
def test_new_frontends_select_by_the_rules_across_transactions(
    txns: list[tuple[list[tuple[Any, ...]], bool]],
) -> None:
    _db, w = new_writer()
    for ops, commit in txns:
        try:
            with w.write_txn() as t:
                for op in ops:
                    _apply(w, t, op)
                if not commit:
                    raise _Abort
        except _Abort:
            pass
        _check(w)


def _sorted(ips: list[int]) -> CheckedBackends:
    return _backends(sorted(ips), ("http",), BackendState.ACTIVE)


def test_a_committed_first_set_is_remembered_and_its_frontend_shares_the_tuple() -> None:
    _db, w = new_writer()
    bes = _sorted([0, 1, 2])
    with w.write_txn() as t:
        w.set_backends(t, NAMES[0], "k8s", bes)
    with w.write_txn() as t:
        w.set_backends(t, NAMES[1], "k8s", _sorted([3]))
        assert w._pure.get(NAMES[0]) is bes  # folded when this transaction began
        w.upsert_service_and_frontends(t, Service(NAMES[0]), [fe(FRONTENDS[NAMES[0]], NAMES[0])])
    with w.write_txn() as t:
        (row,) = [f for f in w.frontends.all(t) if f.service_name == NAMES[0]]
        assert row.backends is bes
        w._touched(t)
        assert NAMES[0] not in w._pure  # it has a frontend now: forgotten
        t.abort()


def _first_frontend_after_forgetting(w: LBWriter) -> Any:
    """In a later transaction (another service's slice folds the one before), NAMES[0] is
    not remembered; its frontend is then written and returned as committed."""
    with w.write_txn() as t:
        w.set_backends(t, NAMES[1], "k8s", _sorted([3]))
        assert NAMES[0] not in w._pure
        w.upsert_service_and_frontends(t, Service(NAMES[0]), [fe(FRONTENDS[NAMES[0]], NAMES[0])])
    with w.write_txn() as t:
        (row,) = [f for f in w.frontends.all(t) if f.service_name == NAMES[0]]
        t.abort()
    return row


def test_an_aborted_first_set_is_not_remembered() -> None:
    _db, w = new_writer()
    bes = _sorted([0, 1, 2])
    try:
        with w.write_txn() as t:
            w.set_backends(t, NAMES[0], "k8s", bes)
            raise _Abort
    except _Abort:
        pass
    row = _first_frontend_after_forgetting(w)
    assert row.backends == ()


def test_an_aborted_change_forgets_the_service() -> None:
    _db, w = new_writer()
    bes = _sorted([0, 1, 2])
    with w.write_txn() as t:
        w.set_backends(t, NAMES[0], "k8s", bes)
    try:
        with w.write_txn() as t:
            w._touched(t)
            assert w._pure.get(NAMES[0]) is bes
            w.release_backends_of_service(t, NAMES[0])
            w.set_backends(t, NAMES[0], "k8s", _sorted([4, 5]))
            raise _Abort
    except _Abort:
        pass
    row = _first_frontend_after_forgetting(w)
    assert row.backends == bes
    with w.write_txn() as t:
        assert row.backends == w.select_backends(t, row)
        t.abort()


def test_a_shared_address_is_not_remembered() -> None:
    _db, w = new_writer()
    with w.write_txn() as t:
        w.set_backends(t, NAMES[1], "k8s", _sorted([1]))
    bes = _sorted([0, 1, 2])
    with w.write_txn() as t:
        w.set_backends(t, NAMES[0], "k8s", bes)
    with w.write_txn() as t:
        w.set_backends(t, NAMES[2], "k8s", _sorted([5]))
        assert NAMES[0] not in w._pure  # its row at 10.244.0.2 is also b's
        t.abort()
