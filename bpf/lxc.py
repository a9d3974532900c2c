"""The per-endpoint tc programs (bpf/lxc.c), attached to the host side of each pod's veth
through `bpf.tc_programs.TcPrograms` (tcx links, clsact filters without tcx), pinned so
they keep working while the agent is down.

    progs = EndpointPrograms(LxcConfig(pin_dir=...))
    progs.load()                  # once: the object with the pinned maps reused
    progs.attach(ifindex)         # per endpoint veth: adopt the pinned links or create them
    progs.detach(ifindex)         # the endpoint is gone
    progs.prune(live_ifindexes)   # after a restart: links of veths no endpoint has
    EndpointPrograms.cleanup(pin_dir)

``sw_lxc_to`` goes on the veth's egress (packets into the pod), ``sw_lxc_from`` on its
ingress (packets from the pod). The object creates no map: every map it reads or writes
(endpoints, ipcache, policy_maps, policy_endpoints, the CT maps and the drop counters)
must be pinned under ``pin_dir`` by the agent's components first. Links are pinned at
``<pin_dir>/lxc/links/if<ifindex>/{to,from}``.
"""

from __future__ import annotations

from dataclasses import dataclass

from bpf.events import EVENT_MAPS
from bpf.objects import object_path
from bpf.probe import DEFAULT_PIN_DIR
from bpf.tc_programs import BPF_TCX_EGRESS, BPF_TCX_INGRESS, TcObject, TcPrograms

#: The compiled endpoint programs, in the objects directory (bpf.objects).
DEFAULT_OBJECT = object_path("lxc.o")
SUBDIR = "lxc"
#: The maps of lxc.c reused from their pins (policy_netns when pinned).
MAPS = ("endpoints", "ipcache", "policy_maps", "policy_endpoints",
        "ct4_global", "ct6_global", "metrics")
#: Reused when pinned: the event maps (bpf/events.py) when the monitor pinned them.
OPTIONAL_MAPS = ("policy_netns", *EVENT_MAPS)
#: program name -> (link pin name, tcx attach type).
PROGRAMS = {
    "sw_lxc_to": ("to", BPF_TCX_EGRESS),
    "sw_lxc_from": ("from", BPF_TCX_INGRESS),
}


@dataclass(frozen=True, slots=True)
class LxcConfig:
    """Where the maps are pinned (and the links go), which object to load and how to
    attach (``auto``: tcx, clsact without it; ``tcx``; ``clsact``)."""

    pin_dir: str = DEFAULT_PIN_DIR
    object_path: str = DEFAULT_OBJECT
    attach_mode: str = "auto"


class EndpointPrograms(TcPrograms):
    """The loaded endpoint programs and the veths they are attached to."""

    def __init__(self, config: LxcConfig) -> None:
        obj = TcObject(SUBDIR, config.object_path, PROGRAMS, MAPS, OPTIONAL_MAPS)
        super().__init__(obj, config.pin_dir, config.attach_mode)
        self.config = config

    @staticmethod
    def cleanup(pin_dir: str = DEFAULT_PIN_DIR, name: str = SUBDIR) -> list[str]:
        """Detach every endpoint program pinned under ``pin_dir`` and remove its directory."""
        return TcPrograms.cleanup(pin_dir, name)
