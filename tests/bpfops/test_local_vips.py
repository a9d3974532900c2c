"""A VIP that is one of the node's addresses gets no wildcard entry, through the tables'
node view (`TablesNodeView.local_keys`, compared with the frontend address' key bytes) as
through any other view; a node address added later takes the wildcard entry away at the
frontend's next update, and one removed brings it back."""

from __future__ import annotations

import ipaddress

from bpfops.adapter import TablesNodeView, frontend_ops_for
from bpfops.frontend_ops import FrontendOps
from bpfops.lb_maps import LBMaps
from bpfops.node_view import StaticNodeView
from bpfops.wildcards import vip_key
from reconciler.operations import BatchEntry
from sources.k8s_convert import K8sConverter
from statedb import DB
from tables.frontends import Frontend
from tables.l3n4 import L3n4Addr
from tables.lb_config import LBConfig
from tables.lb_writer import LBWriter
from tables.node_addresses import NodeAddress


def _node_address(ip: str) -> NodeAddress:
    return NodeAddress.from_dict({"addr": ip, "nodeport": True, "primary": True,
                                  "devicename": "eth0"})


def _wildcards(maps: LBMaps) -> set[str]:
    out = set()
    for m in (maps.svc4, maps.svc6):
        for key, _ in m.dump():
            if key.dport == 0 and key.proto == 0:
                out.add(str(ipaddress.ip_address(key.address)))
    return out


def _service(name: str, ip: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"clusterIP": ip, "type": "ClusterIP",
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
    }


def test_local_keys_are_the_addresses_key_bytes() -> None:
    db = DB()
    writer = LBWriter.create(db, LBConfig())
    view = TablesNodeView(writer.node_addresses, writer.frontends, LBConfig())
    assert view.local_keys(db.read_txn()) == frozenset()
    with writer.write_txn() as txn:
        writer.upsert_node_address(txn, _node_address("1.1.1.1"))
        writer.upsert_node_address(txn, _node_address("fd00::1"))
    keys = view.local_keys(db.read_txn())
    assert keys == {
        L3n4Addr.make("1.1.1.1", 0)[:16],
        L3n4Addr.make("fd00::1", 0)[:16],
    }
    assert vip_key(L3n4Addr.make("1.1.1.1", 80))[:16] in keys
    assert vip_key(L3n4Addr.make("1.1.1.2", 80))[:16] not in keys


def test_vip_on_a_node_address_has_no_wildcard_entry() -> None:
    cfg = LBConfig.from_flags(["--node-name=testnode"])  # wildcard entries by default
    db = DB()
    writer = LBWriter.create(db, cfg)
    conv = K8sConverter(writer, cfg)
    maps = LBMaps.in_memory(max_entries=4096)
    with writer.write_txn() as txn:
        writer.upsert_node_address(txn, _node_address("10.96.0.1"))
        conv.upsert(txn, _service("local", "10.96.0.1"))
        conv.upsert(txn, _service("other", "10.96.0.2"))
    ops = frontend_ops_for(writer, maps, cfg, restore=False)

    def update_all() -> None:
        txn = db.read_txn()
        rows: list[Frontend] = list(writer.frontends.all(txn))
        batch = [BatchEntry(r, 0) for r in rows]
        ops.update_batch(txn, batch)
        assert all(e.result is None for e in batch)

    update_all()
    assert _wildcards(maps) == {"10.96.0.2"}
    # The other VIP becomes a node address too: its entry goes at the next update; the
    # first one's comes back once its address is no longer the node's.
    with writer.write_txn() as txn:
        writer.upsert_node_address(txn, _node_address("10.96.0.2"))
        writer.delete_node_address(txn, _node_address("10.96.0.1"))
    update_all()
    assert _wildcards(maps) == {"10.96.0.1"}


def test_static_view_without_local_keys_is_asked_per_vip() -> None:
    """A node view without ``local_keys`` answers through ``is_local_address``."""
    maps = LBMaps.in_memory(max_entries=4096)
    ops: FrontendOps[object] = FrontendOps(
        maps, node=StaticNodeView(local=[ipaddress.ip_address("10.0.0.9")]), restore=False
    )
    check = ops.local_check(None)  # type: ignore[arg-type]
    assert check is not None
    assert check(L3n4Addr.make("10.0.0.9", 80)) is True
    assert check(L3n4Addr.make("10.0.0.8", 80)) is False
