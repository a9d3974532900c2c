"""The north-south tc programs (bpf/nodeport.c) on the node's external devices, attached
through `bpf.tc_programs.TcPrograms` (tcx links, clsact filters without tcx) and pinned so
NodePort, LoadBalancer and externalIPs keep being served while the agent is down.

    progs = NodePortPrograms(NodePortConfig(pin_dir=...))
    progs.load()                  # once: the object with every pinned map reused
    progs.attach(ifindex)         # per external device: adopt what is pinned, or attach
    progs.detach(ifindex)         # the device is no longer selected
    progs.prune(live_ifindexes)   # after a restart: devices no longer selected
    NodePortPrograms.cleanup(pin_dir)

``sw_nodeport_in`` goes on the device's ingress (DNAT of packets to a frontend, reverse
SNAT of replies from other nodes), ``sw_nodeport_out`` on its egress (SNAT of packets to
backends on other nodes, reverse DNAT of replies to clients). The object creates none of
the maps it uses: the LB maps (the lb-maps component), ``endpoints`` and ``ipcache``
(endpoints), the CT maps and ``metrics`` (ct) and the NAT maps and ``nodeport_devices``
(the nodeport component) are reused from their pins. Links are pinned at
``<pin_dir>/nodeport/links/if<ifindex>/{in,out}``.
"""

from __future__ import annotations

from dataclasses import dataclass

from bpf import lb
from bpf.events import EVENT_MAPS
from bpf.objects import object_path
from bpf.probe import DEFAULT_PIN_DIR
from bpf.tc_programs import BPF_TCX_EGRESS, BPF_TCX_INGRESS, TcObject, TcPrograms

#: The compiled north-south programs, in the objects directory (bpf.objects).
DEFAULT_OBJECT = object_path("nodeport.o")
SUBDIR = "nodeport"
#: The maps of nodeport.c that must be pinned.
MAPS = (
    "lb4_services", "lb6_services", "lb4_backends", "lb6_backends", "lb_affinity_match",
    "lb4_affinity", "lb6_affinity", "lb4_source_range", "lb6_source_range", "lb4_maglev",
    "lb6_maglev", "endpoints", "ipcache", "ct4_global", "ct6_global", "metrics",
    "nodeport_nat4", "nodeport_nat6", "nodeport_devices",
)
#: Maps the object declares but does not use, and the event maps (bpf/events.py, when
#: the monitor pinned them): reused when pinned, else its own (events then stay off).
OPTIONAL_MAPS = ("lb4_reverse_nat", "lb6_reverse_nat", "lb_scale_to_zero", "policy_maps",
                 "policy_netns", "policy_endpoints", *EVENT_MAPS)
#: program name -> (link pin name, tcx attach type).
PROGRAMS = {
    "sw_nodeport_in": ("in", BPF_TCX_INGRESS),
    "sw_nodeport_out": ("out", BPF_TCX_EGRESS),
}


@dataclass(frozen=True, slots=True)
class NodePortConfig:
    """Where the maps are pinned (and the links go), which object to load, how to attach
    (``auto``: tcx, clsact without it; ``tcx``; ``clsact``) and the maglev table size the
    LB maps were made with."""

    pin_dir: str = DEFAULT_PIN_DIR
    object_path: str = DEFAULT_OBJECT
    attach_mode: str = "auto"
    maglev_table_size: int = lb.MAGLEV_TABLE_SIZE


class NodePortPrograms(TcPrograms):
    """The loaded north-south programs and the devices they are attached to."""

    def __init__(self, config: NodePortConfig) -> None:
        obj = TcObject(SUBDIR, config.object_path, PROGRAMS, MAPS, OPTIONAL_MAPS,
                       config.maglev_table_size)
        super().__init__(obj, config.pin_dir, config.attach_mode)
        self.config = config

    @staticmethod
    def cleanup(pin_dir: str = DEFAULT_PIN_DIR, name: str = SUBDIR) -> list[str]:
        """Detach every north-south program pinned under ``pin_dir``; remove its directory."""
        return TcPrograms.cleanup(pin_dir, name)
