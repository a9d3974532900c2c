"""tc programs on network devices, loaded through libbpf, attached with tcx links (or
clsact filters on kernels without tcx) and pinned so they keep working while the agent is
down. Shared by the per-endpoint programs (bpf/lxc.py) and the north-south programs
(bpf/nodeport.py); a `TcObject` says which object, programs and maps.

    progs = TcPrograms(obj, pin_dir, mode="auto")
    progs.load()                  # once: the object with the pinned maps reused
    progs.attach(ifindex)         # per device: adopt what is pinned there, or attach
    progs.detach(ifindex)         # the device is no longer served
    progs.prune(live_ifindexes)   # after a restart: devices no longer served
    TcPrograms.cleanup(pin_dir, obj.name)

Attach modes: ``tcx`` (a tcx link per program, pinned at
``<pin_dir>/<name>/links/if<ifindex>/<pin>``; adopted by a restarted agent by swapping
its program with ``bpf_link_update``: no gap), ``clsact`` (a direct-action filter of the
device's clsact qdisc, handle `TC_HANDLE` and priority `TC_PRIORITY`, replaced in place
on restart; the program is pinned at ``.../<pin>-clsact-<hook>`` so a later agent knows the filter
is ours), ``auto`` (tcx, and clsact when the kernel refuses tcx links). A pinned tcx
link whose device is gone (the kernel reports ifindex 0) is removed.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import sys
from dataclasses import dataclass

from bpf import libbpf
from bpf.datapath import DatapathError, remove_pinned_links, reuse_pinned_map
from bpf.objects import missing_object_message

log = logging.getLogger("statewright.bpf.tc")

BPF_TCX_INGRESS = 46
BPF_TCX_EGRESS = 47
_BPF_LINK_TYPE_TCX = 11
ATTACH_MODES = ("auto", "tcx", "clsact")
#: The clsact filter's handle and priority (one filter per hook and device).
TC_HANDLE = 0x5357
TC_PRIORITY = 0x5357
#: The pin suffixes of a program attached as a clsact filter, by hook (bpffs refuses names
#: with a dot).
CLSACT_SUFFIXES = {BPF_TCX_INGRESS: "-clsact-ingress", BPF_TCX_EGRESS: "-clsact-egress"}
#: errnos of a kernel that does not know tcx links (524: ENOTSUPP, the kernel's own).
_NO_TCX = (errno.EINVAL, errno.EOPNOTSUPP, 524)
#: The object's section holding the maglev table size (set before loading when asked).
MAGLEV_SIZE_SECTION = ".rodata.maglev"


@dataclass(frozen=True, slots=True)
class TcObject:
    """One object file of tc programs: ``name`` (the pin subdirectory and the messages'
    prefix), its path, program name -> (pin name, tcx attach type), the maps reused from
    their pins (``maps`` must be pinned; ``optional_maps`` are reused when they are, the
    object's own empty map otherwise) and, when set, the maglev table size."""

    name: str
    object_path: str
    programs: dict[str, tuple[str, int]]
    maps: tuple[str, ...]
    optional_maps: tuple[str, ...] = ()
    maglev_table_size: int | None = None


def _tc_point(attach_type: int) -> int:
    return libbpf.TC_INGRESS if attach_type == BPF_TCX_INGRESS else libbpf.TC_EGRESS


def _marker(pin: str, attach_type: int) -> str:
    """Where the program of a clsact filter is pinned."""
    return pin + CLSACT_SUFFIXES[attach_type]


class TcPrograms:
    """The loaded programs of one object and the devices this process attached them to."""

    def __init__(self, obj: TcObject, pin_dir: str, mode: str = "auto") -> None:
        if mode not in ATTACH_MODES:
            raise DatapathError(errno.EINVAL, f"{obj.name}: attach mode {mode!r} is not one of "
                                f"{', '.join(ATTACH_MODES)}")
        self.obj = obj
        self.pin_dir = pin_dir
        self.mode = mode
        self._prog_fds: dict[str, int] = {}
        self._links: dict[int, dict[str, int]] = {}
        #: ifindex -> "tcx" or "clsact", how the programs are attached there.
        self.modes: dict[int, str] = {}

    @property
    def links_dir(self) -> str:
        """``<pin_dir>/<name>/links``."""
        return os.path.join(self.pin_dir, self.obj.name, "links")

    # -- loading ----------------------------------------------------------------------------

    def load(self) -> None:
        """Open the object, reuse the pinned maps, load it and keep the program fds."""
        name, path = self.obj.name, self.obj.object_path
        if not os.path.exists(path):
            raise DatapathError(errno.ENOENT, f"{name}: {missing_object_message(path)}")
        obj = libbpf.object_open(path)
        if obj < 0:
            raise DatapathError(-obj, f"{name}: open {path}")
        try:
            for map_name, map_ptr in libbpf.object_maps(obj):
                self._prepare_map(map_name, map_ptr)
            ret = libbpf.object_load(obj)
            if ret < 0:
                raise DatapathError(-ret, f"{name}: load {path} (the verifier log is on stderr)")
            for prog_name, _sec, prog in libbpf.object_programs(obj):
                if prog_name in self.obj.programs:
                    fd = libbpf.program_fd(prog)
                    if fd < 0:
                        raise DatapathError(-fd, f"{name}: program {prog_name} not loaded")
                    self._prog_fds[prog_name] = os.dup(fd)
        finally:
            libbpf.object_close(obj)
        missing = set(self.obj.programs) - set(self._prog_fds)
        if missing:
            raise DatapathError(errno.ENOENT, f"{name}: programs {sorted(missing)} not in {path}")

    def _prepare_map(self, map_name: str, map_ptr: int) -> None:
        pin = os.path.join(self.pin_dir, map_name)
        optional = map_name in self.obj.optional_maps and os.path.exists(pin)
        if map_name in self.obj.maps or optional:
            reuse_pinned_map(map_ptr, pin, f"{self.obj.name}: map {map_name}")
        elif map_name == MAGLEV_SIZE_SECTION and self.obj.maglev_table_size is not None:
            size = self.obj.maglev_table_size.to_bytes(4, sys.byteorder)
            ret = libbpf.map_set_initial_value(map_ptr, size)
            if ret < 0:
                raise DatapathError(-ret, f"{self.obj.name}: set the maglev table size")

    # -- attaching --------------------------------------------------------------------------

    def attach(self, ifindex: int) -> bool:
        """Attach every program to device ``ifindex`` (of the agent's network namespace);
        True when all of them were adopted (already attached by an earlier agent)."""
        if not self._prog_fds:
            raise DatapathError(errno.EINVAL, f"{self.obj.name}: attach before load")
        d = os.path.join(self.links_dir, f"if{ifindex}")
        os.makedirs(d, exist_ok=True)
        held = self._links.get(ifindex, {})
        adopted = 0
        for prog, (pin_name, attach_type) in self.obj.programs.items():
            pin = os.path.join(d, pin_name)
            fd, was_there = self._attach_one(prog, pin, ifindex, attach_type)
            self._links[ifindex] = held
            adopted += was_there
            self.modes[ifindex] = "tcx" if fd >= 0 else "clsact"
            old = held.pop(pin_name, None)
            if old is not None and old >= 0:
                os.close(old)
            held[pin_name] = fd
        return adopted == len(self.obj.programs)

    def _attach_one(self, prog: str, pin: str, ifindex: int, attach_type: int) -> tuple[int, int]:
        """(tcx link fd, or -1 for a clsact filter; 1 when adopted). ``auto`` keeps the
        clsact filter an earlier agent had to use; a mode switch attaches the new way
        first, then removes the old one (the programs are idempotent: a packet seen by
        both is translated once)."""
        prog_fd = self._prog_fds[prog]
        marker = _marker(pin, attach_type)
        had_filter = os.path.exists(marker)
        if self.mode == "tcx" or (self.mode == "auto" and not had_filter):
            fd = self._adopt(pin, ifindex, attach_type, prog_fd)
            if fd >= 0:
                return fd, 1
            fd = self._tcx_attach(prog, pin, ifindex, attach_type, prog_fd)
            if fd >= 0:
                if had_filter:
                    _remove_filter(marker, ifindex, attach_type)
                return fd, 0
        adopted = self._clsact_attach(prog, pin, ifindex, attach_type, prog_fd)
        if os.path.exists(pin):  # a tcx link of an earlier agent: the filter replaces it
            remove_pinned_link(pin)
        return -1, adopted

    def _tcx_attach(self, prog: str, pin: str, ifindex: int, attach_type: int,
                    prog_fd: int) -> int:
        """A new pinned tcx link; -1 when the kernel has no tcx and ``auto`` falls back."""
        fd = libbpf.link_create(prog_fd, ifindex, attach_type)
        if fd < 0:
            if self.mode == "auto" and -fd in _NO_TCX:
                log.info("%s: no tcx links on this kernel (%s); using clsact", self.obj.name,
                         errno.errorcode.get(-fd, -fd))
                return -1
            raise DatapathError(-fd, f"{self.obj.name}: attach {prog} to ifindex {ifindex} (tcx)")
        ret = libbpf.obj_pin(fd, pin)
        if ret < 0:
            libbpf.link_detach(fd)
            os.close(fd)
            raise DatapathError(-ret, f"{self.obj.name}: pin the link of {prog} at {pin}")
        return fd

    def _clsact_attach(self, prog: str, pin: str, ifindex: int, attach_type: int,
                       prog_fd: int) -> int:
        """Attach (or replace) the clsact filter and pin the program beside it; 1 when a
        filter of ours was there already."""
        point = _tc_point(attach_type)
        marker = _marker(pin, attach_type)
        existed = (os.path.exists(marker)
                   and libbpf.tc_query(ifindex, point, TC_HANDLE, TC_PRIORITY) >= 0)
        ret = libbpf.tc_attach(ifindex, point, prog_fd, TC_HANDLE, TC_PRIORITY)
        if ret < 0:
            raise DatapathError(-ret, f"{self.obj.name}: attach {prog} to ifindex {ifindex} "
                                "(clsact)")
        if os.path.exists(marker):
            os.unlink(marker)
        ret = libbpf.obj_pin(prog_fd, marker)
        if ret < 0:
            raise DatapathError(-ret, f"{self.obj.name}: pin {prog} at {marker}")
        return int(existed)

    def _adopt(self, pin: str, ifindex: int, attach_type: int, prog_fd: int) -> int:
        """The fd of the tcx link pinned at ``pin`` with ``prog_fd`` swapped in, or -1
        when there is none for this device and direction (a stale pin is removed)."""
        if not os.path.exists(pin):
            return -1
        fd = libbpf.obj_get(pin)
        if fd < 0:
            os.unlink(pin)
            return -1
        if _tcx_target(fd) != (ifindex, attach_type):
            log.info("%s: %s is no longer a link of ifindex %d; replacing it", self.obj.name,
                     pin, ifindex)
            libbpf.link_detach(fd)
            os.close(fd)
            os.unlink(pin)
            return -1
        ret = libbpf.link_update(fd, prog_fd)
        if ret < 0:
            os.close(fd)
            raise DatapathError(-ret, f"{self.obj.name}: update the pinned link {pin}")
        return fd

    # -- state and teardown -----------------------------------------------------------------

    def attached(self) -> list[int]:
        """The ifindexes this process attached the programs to."""
        return sorted(self._links)

    def pinned(self) -> list[int]:
        """The ifindexes with pinned links or clsact programs."""
        if not os.path.isdir(self.links_dir):
            return []
        return sorted(int(n[2:]) for n in os.listdir(self.links_dir)
                      if n.startswith("if") and n[2:].isdigit())

    def detach(self, ifindex: int) -> None:
        """Detach and unpin everything of ``ifindex`` (nothing when there is nothing)."""
        for fd in self._links.pop(ifindex, {}).values():
            if fd >= 0:
                os.close(fd)
        self.modes.pop(ifindex, None)
        errors = _remove_device(os.path.join(self.links_dir, f"if{ifindex}"), ifindex)
        if errors:
            raise DatapathError(errno.EIO, f"{self.obj.name}: detach ifindex {ifindex}: "
                                + "; ".join(errors))

    def prune(self, live: set[int]) -> list[int]:
        """Detach from every pinned ifindex not in ``live``; returns those."""
        gone = [i for i in self.pinned() if i not in live]
        for i in gone:
            self.detach(i)
        return gone

    def close(self) -> None:
        """Release this process's fds; the pinned links and the filters stay."""
        for links in self._links.values():
            for fd in links.values():
                if fd >= 0:
                    os.close(fd)
        self._links.clear()
        for fd in self._prog_fds.values():
            os.close(fd)
        self._prog_fds.clear()

    @staticmethod
    def cleanup(pin_dir: str, name: str) -> list[str]:
        """Detach everything pinned under ``<pin_dir>/<name>`` and remove the directory."""
        base = os.path.join(pin_dir, name)
        links = os.path.join(base, "links")
        removed: list[str] = []
        if os.path.isdir(links):
            for sub in sorted(os.listdir(links)):
                d = os.path.join(links, sub)
                removed += [os.path.join(d, n) for n in sorted(os.listdir(d))]
                ifindex = int(sub[2:]) if sub[2:].isdigit() else 0
                errors = _remove_device(d, ifindex)
                if errors:
                    raise DatapathError(errno.EIO, f"{name}: cleanup {d}: " + "; ".join(errors))
        if os.path.isdir(base):
            shutil.rmtree(base)
        return removed


def _remove_filter(marker: str, ifindex: int, attach_type: int) -> str:
    """Remove the clsact filter whose program is pinned at ``marker`` and the pin; an
    error line, or "" (a filter or device already gone is no error). Only a filter
    running that very program is removed: run from another network namespace (where the
    ifindex is another device), nothing but the pin goes."""
    ret = 0
    fd = libbpf.obj_get(marker)
    ours = libbpf.prog_id(fd) if fd >= 0 else -1
    if fd >= 0:
        os.close(fd)
    point = _tc_point(attach_type)
    if ifindex and ours > 0 and libbpf.tc_query(ifindex, point, TC_HANDLE, TC_PRIORITY) == ours:
        ret = libbpf.tc_detach(ifindex, point, TC_HANDLE, TC_PRIORITY)
    os.unlink(marker)
    if ret < 0 and -ret not in (errno.ENOENT, errno.ENODEV, errno.EINVAL):
        return f"detach the clsact filter of {marker}: {errno.errorcode.get(-ret, -ret)}"
    return ""


def remove_pinned_link(pin: str) -> None:
    """Detach the link pinned at ``pin`` and unpin it."""
    fd = libbpf.obj_get(pin)
    if fd >= 0:
        libbpf.link_detach(fd)
        os.close(fd)
    os.unlink(pin)


def _remove_device(d: str, ifindex: int) -> list[str]:
    """Remove the clsact filters pinned in ``d`` (a filter or device already gone is no
    error), then detach and unpin its tcx links and remove ``d``."""
    errors: list[str] = []
    if not os.path.isdir(d):
        return errors
    for name in sorted(os.listdir(d)):
        types = [t for t, suffix in CLSACT_SUFFIXES.items() if name.endswith(suffix)]
        if types:
            error = _remove_filter(os.path.join(d, name), ifindex, types[0])
            if error:
                errors.append(error)
    return errors + remove_pinned_links(d)


def _tcx_target(fd: int) -> tuple[int, int] | None:
    """(ifindex, attach type) of a tcx link fd; None for other links. A link whose device
    is gone reports ifindex 0."""
    info = libbpf.link_info(fd)
    if isinstance(info, int) or info[0] != _BPF_LINK_TYPE_TCX:
        return None
    word = info[3]  # the tcx part of bpf_link_info: ifindex, then attach_type
    return word & 0xFFFFFFFF, word >> 32
