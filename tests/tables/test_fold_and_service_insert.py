"""`_fold` of a transaction that removed nothing (a load) gives what its general way
gives, with and without given tuples; `_keep_or_insert_service` keeps an equal row and
inserts any other."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tables.l3n4 import L3n4Addr
from tables.lb_writer import CheckedBackends, _fold
from tables.services import Service

from .helpers import fe, new_writer

_ADDRS = [L3n4Addr.parse(f"10.96.0.{i}:80/TCP") for i in range(1, 6)]
_NAMES = [f"ns/svc-{i}" for i in range(4)]

_rows_of = st.dictionaries(
    st.sampled_from(_NAMES),
    st.lists(st.sampled_from(_ADDRS), unique=True, max_size=4).map(
        lambda addrs: {a: object() for a in addrs}
    ),
    max_size=4,
)
_hint = st.dictionaries(
    st.sampled_from(_NAMES),
    st.one_of(st.sampled_from(_ADDRS), st.lists(st.sampled_from(_ADDRS), min_size=2,
                                                max_size=3, unique=True).map(tuple)),
    max_size=4,
)


_given = st.one_of(st.none(), st.dictionaries(
    st.sampled_from(_NAMES),
    st.lists(st.sampled_from(_ADDRS), max_size=3, unique=True).map(
        lambda addrs: CheckedBackends(addrs)  # type: ignore[arg-type]  # stand-ins
    ),
    max_size=3,
))


@settings(max_examples=400, deadline=None, derandomize=True)
@given(_rows_of, _hint, _given)
def test_fold_without_removals_is_the_general_fold(
    rows_of: dict[str, dict[L3n4Addr, Any]],
    hint: dict[str, Any],
    given_of: dict[str, CheckedBackends] | None,
) -> None:
    short = dict(hint)
    _fold(short, rows_of, {}, lambda name, a: True, given_of)
    # A removal under a service the transaction did not read sends _fold the general way
    # and changes nothing else.
    general = dict(hint)
    _fold(general, rows_of, {"other/svc": {_ADDRS[0]}}, lambda name, a: False, given_of)
    assert short == general
    for name, rows in rows_of.items():
        kept = given_of.get(name) if given_of else None
        if kept:
            assert short[name] is kept
        elif len(rows) == 1:
            assert short[name] is next(iter(rows))  # the address itself, no tuple
        elif rows:
            assert short[name] == tuple(rows)
        else:
            assert name not in short


def test_a_new_service_is_inserted_and_an_existing_one_kept_or_replaced() -> None:
    db, w = new_writer()
    svc = Service("ns/a", port_names=(("http", 80),))
    with w.write_txn() as t:
        assert w._keep_or_insert_service(t, svc) == (svc, False)
        assert w.services.get(t, "ns/a") is svc
        equal = Service("ns/a", port_names=(("http", 80),))
        kept, unchanged = w._keep_or_insert_service(t, equal)
        assert kept is svc and unchanged
        other = Service("ns/a", port_names=(("dns", 53),))
        assert w._keep_or_insert_service(t, other) == (other, False)
        assert w.services.get(t, "ns/a") is other
        # A deleted row's name takes the new row as an insert does.
        w.services.delete(t, other)
        again = Service("ns/a")
        assert w._keep_or_insert_service(t, again) == (again, False)
        assert w.services.get(t, "ns/a") is again
        t.commit()
    with w.write_txn() as t:
        # Over a committed row (and its deletion record below), as above.
        w.upsert_service_and_frontends(t, Service("ns/a"), [fe("10.96.0.1:80/TCP", "ns/a")])
        assert w.services.get(t, "ns/a") is again
        w.delete_service_and_frontends(t, "ns/a")
        new = Service("ns/a", port_names=(("http", 80),))
        assert w._keep_or_insert_service(t, new) == (new, False)
        assert w.services.count(t) == 1
        t.commit()
    assert w.services.get(db.read_txn(), "ns/a") is new
