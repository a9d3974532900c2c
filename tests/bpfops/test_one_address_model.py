"""One address model: the Ops key their state by the tables' address objects themselves."""

from __future__ import annotations

import gc
import ipaddress

import pytest

from bpfops.adapter import RowBackends, backend_specs, frontend_ops_for, frontend_spec
from bpfops.lb_maps import LBMaps
from bpfops.model import Addr
from tables.l3n4 import AddressError, L3n4Addr
from tests.tables.helpers import be, fe, frontend_map, new_writer, svc


def test_the_ops_state_holds_the_rows_address_objects() -> None:
    db, w = new_writer()
    with w.write_txn() as txn:
        w.upsert_service_and_frontends(txn, svc("ns/a"), [fe("10.0.0.1:80/TCP", "ns/a")])
        w.set_backends(txn, "ns/a", "k8s", [be("10.1.0.1:8080/TCP"), be("10.1.0.2:8080/TCP")])
        txn.commit()
    row = frontend_map(db, w)["10.0.0.1:80/TCP"]
    spec = frontend_spec(row, w.config)
    assert spec.addr is row.address
    assert [b.addr for b in spec.backends] == [b.address for b in row.backends]
    assert all(s.addr is r.address for s, r in zip(spec.backends, row.backends, strict=True))
    maps = LBMaps.in_memory(max_entries=64, maglev_table_size=251)
    ops = frontend_ops_for(w, maps, w.config, restore=False)
    ops.update(db.read_txn(), 0, row)
    held = {a: a for a in ops.backend_states}
    assert all(held[r.address] is r.address for r in row.backends)
    # The frontend's list of backends is the row's tuple itself (no tuple of the ops').
    state = ops.frontends[row.address]
    assert spec.shared_backends is row.backends
    assert any(o is row.backends for o in gc.get_referents(state))
    assert state.backends == dict.fromkeys([r.address for r in row.backends], 0)


def test_addr_is_the_table_address_with_the_ops_names() -> None:
    a = Addr(ipaddress.ip_address("10.0.0.1"), 80, "UDP", 1)
    assert type(a) is L3n4Addr
    assert (a.ip, a.port, a.proto, a.scope) == (a.address, 80, "UDP", 1)
    # The IP is held only in the key: ``ip`` and ``address`` build equal objects.
    assert a.ip == a.address and type(a.ip) is ipaddress.IPv4Address
    assert a.proto is a.protocol
    assert a.packed == a.address.packed and a.version == 4
    assert str(a) == "10.0.0.1:80/UDP/i" and a.host_port() == "10.0.0.1:80"
    assert a.with_ip(ipaddress.ip_address("10.0.0.2")) == Addr.of("10.0.0.2", 80, "udp", 1)
    assert sorted([Addr.of("10.0.0.2", 1), Addr.of("10.0.0.1", 9)])[0].port == 9
    with pytest.raises(ValueError):
        Addr.of("10.0.0.1", 70000)
    with pytest.raises(AddressError):
        Addr.of("10.0.0.1", 80, "XTP")


def test_a_rows_spec_stands_for_its_backends_specs() -> None:
    """`frontend_spec` makes its `RowBackends` without ``__init__``: it behaves as one
    made by the class (the specs, built on first use, and what the bulk path reads)."""
    db, w = new_writer()
    with w.write_txn() as txn:
        w.upsert_service_and_frontends(txn, svc("ns/a"), [fe("10.0.0.1:80/TCP", "ns/a")])
        w.set_backends(txn, "ns/a", "k8s", [be("10.1.0.1:8080/TCP"), be("10.1.0.2:8080/TCP")])
        txn.commit()
    row = frontend_map(db, w)["10.0.0.1:80/TCP"]
    made = RowBackends(row.backends)
    for probe in ("len", "usual", "eq", "hash", "iter"):
        lazy = frontend_spec(row, w.config).backends
        assert type(lazy) is RowBackends and lazy.made_from(row.backends)
        if probe == "len":
            assert len(lazy) == len(made) == 2
        elif probe == "usual":
            assert lazy.usual_addresses() == made.usual_addresses() == [
                b.address for b in row.backends
            ]
        elif probe == "eq":
            assert lazy == made and made == lazy and lazy == backend_specs(row.backends)
        elif probe == "hash":
            assert hash(lazy) == hash(made)
        else:
            assert tuple(lazy) == made.specs() and lazy[1] == made[1]
