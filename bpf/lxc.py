"""The per-endpoint tc programs (bpf/lxc.c) loaded through libbpf and attached with tcx
links to the host side of each pod's veth, pinned so they keep working while the agent
is down.

    progs = EndpointPrograms(LxcConfig(pin_dir=...))
    progs.load()                  # once: the object with the pinned maps reused
    progs.attach(ifindex)         # per endpoint veth: adopt the pinned links or create them
    progs.detach(ifindex)         # the endpoint is gone
    progs.prune(live_ifindexes)   # after a restart: links of veths no endpoint has
    EndpointPrograms.cleanup(pin_dir)

``sw_lxc_to`` goes on the veth's tcx egress (packets into the pod), ``sw_lxc_from`` on its
tcx ingress (packets from the pod). The object creates no map: every map it reads or
writes (endpoints, ipcache, policy_maps, policy_endpoints, the CT maps and the drop
counters) must be pinned under ``pin_dir`` by the agent's components first. Links are
pinned at ``<pin_dir>/lxc/links/if<ifindex>/{to,from}``; on attach a link pinned there for
the same device and direction is adopted by swapping its program (``bpf_link_update``),
so a restart leaves no gap. A pinned link whose device is gone (the kernel reports
ifindex 0) is removed.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from dataclasses import dataclass

from bpf import libbpf
from bpf.datapath import REPO_ROOT, DatapathError, remove_pinned_links, reuse_pinned_map
from bpf.probe import DEFAULT_PIN_DIR

log = logging.getLogger("statewright.bpf.lxc")

DEFAULT_OBJECT = str(REPO_ROOT / "build" / "lxc.o")
SUBDIR = "lxc"
#: The maps of lxc.c, all reused from their pins (none is the object's own).
MAPS = ("endpoints", "ipcache", "policy_maps", "policy_netns", "policy_endpoints",
        "ct4_global", "ct6_global", "metrics")
#: Maps the program can do without (an empty one of its own is created).
OPTIONAL_MAPS = ("policy_netns",)
BPF_TCX_INGRESS = 46
BPF_TCX_EGRESS = 47
_BPF_LINK_TYPE_TCX = 11
#: program name -> (link pin name, tcx attach type).
PROGRAMS = {
    "sw_lxc_to": ("to", BPF_TCX_EGRESS),
    "sw_lxc_from": ("from", BPF_TCX_INGRESS),
}


@dataclass(frozen=True, slots=True)
class LxcConfig:
    """Where the maps are pinned (and the links go) and which object to load."""

    pin_dir: str = DEFAULT_PIN_DIR
    object_path: str = DEFAULT_OBJECT


class EndpointPrograms:
    """The loaded programs and the links this process holds, by ifindex."""

    def __init__(self, config: LxcConfig) -> None:
        self.config = config
        self._prog_fds: dict[str, int] = {}
        self._links: dict[int, dict[str, int]] = {}

    @property
    def links_dir(self) -> str:
        """``<pin_dir>/lxc/links``."""
        return os.path.join(self.config.pin_dir, SUBDIR, "links")

    def load(self) -> None:
        """Open the object, reuse every pinned map, load it and keep the program fds."""
        path = self.config.object_path
        if not os.path.exists(path):
            raise DatapathError(errno.ENOENT, f"lxc: object {path} not built (run `make setup`)")
        obj = libbpf.object_open(path)
        if obj < 0:
            raise DatapathError(-obj, f"lxc: open {path}")
        try:
            for name, map_ptr in libbpf.object_maps(obj):
                if name in MAPS:
                    self._reuse(name, map_ptr)
            ret = libbpf.object_load(obj)
            if ret < 0:
                raise DatapathError(-ret, f"lxc: load {path} (the verifier log is on stderr)")
            for name, _sec, prog in libbpf.object_programs(obj):
                if name in PROGRAMS:
                    fd = libbpf.program_fd(prog)
                    if fd < 0:
                        raise DatapathError(-fd, f"lxc: program {name} not loaded")
                    self._prog_fds[name] = os.dup(fd)
        finally:
            libbpf.object_close(obj)
        missing = set(PROGRAMS) - set(self._prog_fds)
        if missing:
            raise DatapathError(errno.ENOENT, f"lxc: programs {sorted(missing)} not in {path}")

    def _reuse(self, name: str, map_ptr: int) -> None:
        pin = os.path.join(self.config.pin_dir, name)
        if not os.path.exists(pin) and name in OPTIONAL_MAPS:
            return
        reuse_pinned_map(map_ptr, pin, f"lxc: map {name}")

    def attach(self, ifindex: int) -> bool:
        """Attach both programs to device ``ifindex`` (of the agent's network namespace);
        True when both pinned links were adopted rather than created."""
        if not self._prog_fds:
            raise DatapathError(errno.EINVAL, "lxc: attach before load")
        d = os.path.join(self.links_dir, f"if{ifindex}")
        os.makedirs(d, exist_ok=True)
        held = self._links.setdefault(ifindex, {})
        adopted = 0
        for prog, (pin_name, attach_type) in PROGRAMS.items():
            pin = os.path.join(d, pin_name)
            fd = self._adopt(pin, ifindex, attach_type, self._prog_fds[prog])
            if fd >= 0:
                adopted += 1
            else:
                fd = libbpf.link_create(self._prog_fds[prog], ifindex, attach_type)
                if fd < 0:
                    raise DatapathError(-fd, f"lxc: attach {prog} to ifindex {ifindex} (tcx)")
                ret = libbpf.obj_pin(fd, pin)
                if ret < 0:
                    libbpf.link_detach(fd)
                    os.close(fd)
                    raise DatapathError(-ret, f"lxc: pin the link of {prog} at {pin}")
            old = held.pop(pin_name, None)
            if old is not None:
                os.close(old)
            held[pin_name] = fd
        return adopted == len(PROGRAMS)

    def _adopt(self, pin: str, ifindex: int, attach_type: int, prog_fd: int) -> int:
        """The fd of the link pinned at ``pin`` with ``prog_fd`` swapped in, or -1 when
        there is none for this device and direction (a stale pin is removed)."""
        if not os.path.exists(pin):
            return -1
        fd = libbpf.obj_get(pin)
        if fd < 0:
            os.unlink(pin)
            return -1
        if _tcx_target(fd) != (ifindex, attach_type):
            log.info("lxc: %s is no longer a link of ifindex %d; replacing it", pin, ifindex)
            libbpf.link_detach(fd)
            os.close(fd)
            os.unlink(pin)
            return -1
        ret = libbpf.link_update(fd, prog_fd)
        if ret < 0:
            os.close(fd)
            raise DatapathError(-ret, f"lxc: update the pinned link {pin}")
        return fd

    def attached(self) -> list[int]:
        """The ifindexes this process holds links for."""
        return sorted(self._links)

    def pinned(self) -> list[int]:
        """The ifindexes with pinned links."""
        if not os.path.isdir(self.links_dir):
            return []
        return sorted(int(n[2:]) for n in os.listdir(self.links_dir)
                      if n.startswith("if") and n[2:].isdigit())

    def detach(self, ifindex: int) -> None:
        """Detach and unpin both links of ``ifindex`` (nothing when there are none)."""
        for fd in self._links.pop(ifindex, {}).values():
            os.close(fd)
        errors = remove_pinned_links(os.path.join(self.links_dir, f"if{ifindex}"))
        if errors:
            raise DatapathError(errno.EIO, f"lxc: detach ifindex {ifindex}: " + "; ".join(errors))

    def prune(self, live: set[int]) -> list[int]:
        """Detach the pinned links of every ifindex not in ``live``; returns those."""
        gone = [i for i in self.pinned() if i not in live]
        for i in gone:
            self.detach(i)
        return gone

    def close(self) -> None:
        """Release this process's fds; the pinned links keep the programs attached."""
        for links in self._links.values():
            for fd in links.values():
                os.close(fd)
        self._links.clear()
        for fd in self._prog_fds.values():
            os.close(fd)
        self._prog_fds.clear()

    @staticmethod
    def cleanup(pin_dir: str = DEFAULT_PIN_DIR) -> list[str]:
        """Detach every pinned link under ``pin_dir`` and remove the directory."""
        base = os.path.join(pin_dir, SUBDIR)
        links = os.path.join(base, "links")
        removed: list[str] = []
        if os.path.isdir(links):
            for sub in sorted(os.listdir(links)):
                d = os.path.join(links, sub)
                removed += [os.path.join(d, n) for n in sorted(os.listdir(d))]
                errors = remove_pinned_links(d)
                if errors:
                    raise DatapathError(errno.EIO, f"lxc: cleanup {d}: " + "; ".join(errors))
        if os.path.isdir(base):
            shutil.rmtree(base)
        return removed


def _tcx_target(fd: int) -> tuple[int, int] | None:
    """(ifindex, attach type) of a tcx link fd; None for other links. A link whose device
    is gone reports ifindex 0."""
    info = libbpf.link_info(fd)
    if isinstance(info, int) or info[0] != _BPF_LINK_TYPE_TCX:
        return None
    word = info[3]  # the tcx part of bpf_link_info: ifindex, then attach_type
    return word & 0xFFFFFFFF, word >> 32
