"""FrontendOps.delete of a frontend whose address the snapshot holds again (another
service took it over in the same batch): the address keeps its id and entries for the
update that follows; what the new type does not rewrite (expansion, wildcard) goes."""

from __future__ import annotations

from bpfops.frontend_ops import StaticNodeView
from bpfops.lb_maps import LBMaps
from bpfops.maps_dump import dump_lines
from bpfops.model import ServiceSpec
from tests.bpfops.helpers import NO_TXN, addr, be, fe, ip, new_ops


def test_replaced_frontend_keeps_its_id() -> None:
    maps = LBMaps.in_memory(maglev_table_size=1021)
    node = StaticNodeView()
    ops = new_ops(maps, node)
    old = fe("10.96.0.1:80", backends=(be("10.244.0.1:80"),), service=ServiceSpec("a/old"))
    other = fe("10.96.0.2:80", backends=(be("10.244.0.9:80"),))
    ops.update(NO_TXN, 1, old)
    ops.update(NO_TXN, 2, other)
    node.present[old.addr] = "ClusterIP"  # the snapshot holds the new owner's frontend
    ops.delete(NO_TXN, 3, old)
    assert ops.service_id(old.addr) == 1
    new = fe("10.96.0.1:80", backends=(be("10.244.0.2:80"),), service=ServiceSpec("a/new"))
    ops.update(NO_TXN, 4, new)
    lines = dump_lines(maps)
    assert "REV: ID=1 ADDR=10.96.0.1:80" in lines
    assert not any("10.244.0.1:80" in line for line in lines)
    # Without a new owner the deletion is a deletion.
    del node.present[old.addr]
    ops.delete(NO_TXN, 5, new)
    assert ops.service_id(old.addr) is None
    assert not any("10.96.0.1:80" in line for line in dump_lines(maps))


def test_replacement_of_another_type_drops_expansion_and_wildcard() -> None:
    maps = LBMaps.in_memory(maglev_table_size=1021)
    node = StaticNodeView(nodeport=[ip("1.1.1.1")])
    ops = new_ops(maps, node, wildcard_entries=True)
    nodeport = fe("0.0.0.0:30080", "NodePort", backends=(be("10.244.0.1:80"),))
    ops.update(NO_TXN, 1, nodeport)
    assert ops.service_id(addr("1.1.1.1:30080")) is not None
    node.present[nodeport.addr] = "HostPort"  # a host port without host IP: also expanded
    ops.delete(NO_TXN, 2, nodeport)
    assert ops.service_id(addr("1.1.1.1:30080")) is not None  # kept for the new owner
    node.present[nodeport.addr] = "ClusterIP"  # hypothetically: no expansion any more
    ops.delete(NO_TXN, 3, nodeport)
    assert ops.service_id(addr("1.1.1.1:30080")) is None
    assert ops.service_id(nodeport.addr) is not None

    lb_fe = fe("10.0.0.5:80", "LoadBalancer", backends=(be("10.244.0.1:80"),))
    ops.update(NO_TXN, 4, lb_fe)
    assert any("ADDR=10.0.0.5:0/ANY" in line for line in dump_lines(maps))
    node.present[lb_fe.addr] = "ExternalIPs"  # no wildcard entry for that type
    ops.delete(NO_TXN, 5, lb_fe)
    assert not any("ADDR=10.0.0.5:0/ANY" in line for line in dump_lines(maps))
    assert ops.service_id(lb_fe.addr) is not None


def test_update_to_a_type_without_wildcard_drops_it() -> None:
    """Also without a deletion (or when the deletion's wildcard step failed and was not
    retried), the update of the new type removes a wildcard entry it has no use for."""
    maps = LBMaps.in_memory(maglev_table_size=1021)
    ops = new_ops(maps, StaticNodeView(), wildcard_entries=True)
    lb_fe = fe("10.0.0.5:80", "LoadBalancer", backends=(be("10.244.0.1:80"),))
    ops.update(NO_TXN, 1, lb_fe)
    assert any("ADDR=10.0.0.5:0/ANY" in line for line in dump_lines(maps))
    ops.update(NO_TXN, 2, fe("10.0.0.5:80", "ExternalIPs", backends=(be("10.244.0.1:80"),)))
    assert not any("ADDR=10.0.0.5:0/ANY" in line for line in dump_lines(maps))
    assert not ops.wildcard_refs
