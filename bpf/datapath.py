"""The socket load-balancing datapath: bpf/sock_lb.c loaded through libbpf, attached to a
cgroup v2 and pinned so it keeps working while the agent is down.

    dp = SockLB(DatapathConfig(cgroup="/sys/fs/cgroup/unified/statewright"))
    dp.attach()    # load, reuse the pinned LB maps, attach (or adopt) and pin the links
    dp.close()     # agent exit: the pinned links keep load balancing
    dp.detach()    # remove: detach and unpin the links of this cgroup
    SockLB.cleanup(pin_dir)   # remove every link and the datapath's own maps

The program reads the LB maps FrontendOps writes: ``attach`` opens each LB map pinned
under ``pin_dir`` and hands its fd to libbpf (``bpf_map__reuse_fd``) before loading, so
the object creates none of them. Only the datapath's reverse-translation maps
(``lb4_sock_revnat``/``lb6_sock_revnat``) are its own; libbpf pins them under
``<pin_dir>/sock_lb/`` and reuses them across restarts, so replies of sockets translated
before a restart are still shown with the service address. For egress policy it also
reads ``ipcache``, ``policy_maps`` and ``policy_netns``, reused from their pins when they
are pinned (the endpoints and policy-maps components pin them; without them the program
gets empty maps of its own and enforces no policy).

Links are pinned at ``<pin_dir>/sock_lb/links/cg<cgroup id>/<program>``. On attach, a
link already pinned there for the same cgroup and hook is adopted: its program is swapped
for the newly loaded one with ``bpf_link_update``, so the cgroup is never without a
program during an agent restart or upgrade.

Nothing attaches to the root of the cgroup2 hierarchy (every process of the machine)
unless ``DatapathConfig.allow_root_cgroup`` says so.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import sys
from dataclasses import dataclass, field

from bpf import lb, libbpf
from bpf.catalog import lb_specs
from bpf.events import EVENT_MAPS
from bpf.objects import missing_object_message, object_path
from bpf.probe import DEFAULT_PIN_DIR
from statedb.errors import StatewrightError

log = logging.getLogger("statewright.bpf.datapath")

#: The compiled socket load balancer, in the objects directory (bpf.objects: ``make setup``
#: builds it into the checkout's build/; $STATEWRIGHT_BPF_OBJECTS points elsewhere).
DEFAULT_OBJECT = object_path("sock_lb.o")
#: The datapath's directory under the pin directory (links and its own maps).
SUBDIR = "sock_lb"
#: The maps of sock_lb.c that are the datapath's own (pinned under SUBDIR).
OWN_MAPS = ("lb4_sock_revnat", "lb6_sock_revnat")
#: Maps of other components the program reads for egress policy (ipcache: endpoints;
#: policy_maps, policy_netns: policy-maps). Reused when pinned under ``pin_dir``; when one
#: is not, the object gets an empty map of its own, which enforces nothing.
POLICY_MAPS = ("ipcache", "policy_maps", "policy_netns")
#: The object's section holding the maglev table size (set before loading).
MAGLEV_SIZE_SECTION = ".rodata.maglev"
#: The programs of sock_lb.c, by name, with their hooks.
PROGRAMS = {
    "sw_sock4_connect": "cgroup/connect4",
    "sw_sock6_connect": "cgroup/connect6",
    "sw_sock4_sendmsg": "cgroup/sendmsg4",
    "sw_sock6_sendmsg": "cgroup/sendmsg6",
    "sw_sock4_recvmsg": "cgroup/recvmsg4",
    "sw_sock6_recvmsg": "cgroup/recvmsg6",
    "sw_sock4_getpeername": "cgroup/getpeername4",
    "sw_sock6_getpeername": "cgroup/getpeername6",
}
_BPF_LINK_TYPE_CGROUP = 3


class DatapathError(StatewrightError, OSError):
    """Loading, attaching or detaching failed; the message names the object or program,
    the cgroup and the errno."""

    def __init__(self, err: int, message: str) -> None:
        name = errno.errorcode.get(err, str(err))
        super().__init__(err, f"{message}: {name} ({os.strerror(err)})")


def cgroup2_mount(mounts: str = "/proc/mounts") -> str:
    """The mount point of the cgroup v2 hierarchy (e.g. /sys/fs/cgroup/unified in hybrid
    mode, /sys/fs/cgroup in unified mode), read from ``mounts``."""
    try:
        with open(mounts, encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[2] == "cgroup2":
                    return parts[1].replace("\\040", " ")
    except OSError as exc:
        raise DatapathError(exc.errno or errno.EIO, f"sock_lb: read {mounts}") from exc
    raise DatapathError(errno.ENOENT, f"sock_lb: no cgroup2 file system in {mounts}")


def cgroup_id(path: str) -> int:
    """The kernel's id of a cgroup v2 directory (its kernfs inode number)."""
    return os.stat(path).st_ino


@dataclass(frozen=True, slots=True)
class DatapathConfig:
    """Where the datapath attaches and what it reads.

    ``cgroup`` is a cgroup v2 directory; the programs apply to every socket created by a
    process in it or in a cgroup below it. ``pin_dir`` holds the pinned LB maps (as
    ``LBMapsConfig.pin_dir``) and receives the datapath's pins.
    """

    cgroup: str
    pin_dir: str = DEFAULT_PIN_DIR
    object_path: str = DEFAULT_OBJECT
    allow_root_cgroup: bool = False
    maglev_table_size: int = lb.MAGLEV_TABLE_SIZE
    programs: tuple[str, ...] = field(default=tuple(PROGRAMS))


@dataclass(frozen=True, slots=True)
class AttachedProgram:
    """One attached program: its hook, the link's and program's kernel ids, and whether an
    existing pinned link was adopted (program swapped in place) rather than created."""

    name: str
    hook: str
    link_id: int
    prog_id: int
    pin: str
    adopted: bool


@dataclass(frozen=True, slots=True)
class PinnedLink:
    """A link pinned by the datapath: program, pin, kernel ids, and the cgroup id (0 once
    the cgroup is gone and the kernel detached the link); ``error`` when unreadable."""

    program: str
    pin: str
    link_id: int
    prog_id: int
    cgroup_id: int
    error: str = ""


class SockLB:
    """The socket load balancer attached to one cgroup (see the module docstring)."""

    def __init__(self, config: DatapathConfig) -> None:
        self.config = config
        self.attached: dict[str, AttachedProgram] = {}
        self._link_fds: dict[str, int] = {}

    # -- paths ---------------------------------------------------------------------------

    @property
    def base_dir(self) -> str:
        """``<pin_dir>/sock_lb``."""
        return os.path.join(self.config.pin_dir, SUBDIR)

    def links_dir(self, cg_id: int) -> str:
        """Where the links of cgroup ``cg_id`` are pinned."""
        return os.path.join(self.base_dir, "links", f"cg{cg_id}")

    # -- attach ---------------------------------------------------------------------------

    def _check_cgroup(self) -> tuple[str, int]:
        cg = os.path.realpath(self.config.cgroup)
        mount = os.path.realpath(cgroup2_mount())
        if cg != mount and not cg.startswith(mount.rstrip("/") + "/"):
            raise DatapathError(
                errno.EINVAL,
                f"sock_lb: {self.config.cgroup} is not under the cgroup2 mount {mount}",
            )
        if cg == mount and not self.config.allow_root_cgroup:
            raise DatapathError(
                errno.EPERM,
                f"sock_lb: refusing to attach to the root cgroup {mount} (every process of the "
                "machine); set allow_root_cgroup for a real node",
            )
        if not os.path.isdir(cg):
            raise DatapathError(errno.ENOENT, f"sock_lb: cgroup {cg} does not exist")
        return cg, cgroup_id(cg)

    def attach(self) -> list[AttachedProgram]:
        """Load the object with the pinned LB maps, then attach every program to the
        cgroup (adopting links already pinned for it) and pin the links.

        Raises DatapathError naming the object, map or program, the cgroup and the errno.
        Idempotent: a second call swaps in a freshly loaded program again.
        """
        if not 0 < self.config.maglev_table_size < 1 << 20:
            raise DatapathError(
                errno.EINVAL, f"sock_lb: maglev table size {self.config.maglev_table_size}"
            )
        cg, cg_id = self._check_cgroup()
        if not os.path.exists(self.config.object_path):
            raise DatapathError(
                errno.ENOENT, f"sock_lb: {missing_object_message(self.config.object_path)}"
            )
        os.makedirs(self.base_dir, exist_ok=True)  # libbpf pins the own maps there
        self._prune_stale_links()
        try:
            cg_fd = os.open(cg, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise DatapathError(exc.errno or errno.EIO, f"sock_lb: open cgroup {cg}") from exc
        obj = -1
        try:
            obj = self._open_object()
            ret = libbpf.object_load(obj)
            if ret < 0:
                raise DatapathError(
                    -ret,
                    f"sock_lb: load {self.config.object_path} (a rejected program's verifier "
                    "log is on stderr)",
                )
            progs = {name: ptr for name, _sec, ptr in libbpf.object_programs(obj)}
            os.makedirs(self.links_dir(cg_id), exist_ok=True)
            for name in self.config.programs:
                if name not in progs:
                    raise DatapathError(
                        errno.ENOENT, f"sock_lb: program {name} not in {self.config.object_path}"
                    )
                self._attach_one(name, progs[name], cg, cg_id, cg_fd)
        finally:
            # The links hold the programs, the programs hold the maps: the object can go.
            if obj >= 0:
                libbpf.object_close(obj)
            os.close(cg_fd)
        return list(self.attached.values())

    def _open_object(self) -> int:
        path = self.config.object_path
        obj = libbpf.object_open(path)
        if obj < 0:
            raise DatapathError(-obj, f"sock_lb: open {path}")
        try:
            lb_names = {spec.name for spec in lb_specs()}
            found_size = False
            for name, map_ptr in libbpf.object_maps(obj):
                if name in OWN_MAPS:
                    ret = libbpf.map_set_pin_path(map_ptr, os.path.join(self.base_dir, name))
                    if ret < 0:
                        raise DatapathError(-ret, f"sock_lb: map {name}: set pin path")
                elif name in lb_names:
                    self._reuse_lb_map(name, map_ptr)
                elif name in POLICY_MAPS:
                    self._reuse_if_pinned(name, map_ptr)
                elif name in EVENT_MAPS:
                    self._reuse_events_if_pinned(name, map_ptr)
                elif name == MAGLEV_SIZE_SECTION:
                    size = self.config.maglev_table_size.to_bytes(4, sys.byteorder)
                    ret = libbpf.map_set_initial_value(map_ptr, size)
                    if ret < 0:
                        raise DatapathError(-ret, f"sock_lb: set the maglev table size ({name})")
                    found_size = True
                # anything else (.rodata, .bss) is the object's own
            if not found_size:
                raise DatapathError(
                    errno.ENOENT, f"sock_lb: no {MAGLEV_SIZE_SECTION} section in {path}"
                )
        except BaseException:
            libbpf.object_close(obj)
            raise
        return obj

    def _reuse_lb_map(self, name: str, map_ptr: int) -> None:
        pin = os.path.join(self.config.pin_dir, name)
        fd = libbpf.obj_get(pin)
        if fd < 0:
            raise DatapathError(
                -fd,
                f"sock_lb: LB map {name} is not pinned at {pin} (open the LB maps with "
                "LBMaps.open on the kernel backend before attaching the datapath)",
            )
        try:
            ret = libbpf.map_reuse_fd(map_ptr, fd)
            if ret < 0:
                raise DatapathError(-ret, f"sock_lb: map {name}: reuse pinned {pin}")
        finally:
            os.close(fd)  # libbpf keeps its own duplicate

    def _reuse_events_if_pinned(self, name: str, map_ptr: int) -> None:
        """The monitor's event maps (bpf/events.py), when pinned; else the object's own,
        whose configuration keeps events off."""
        pin = os.path.join(self.config.pin_dir, name)
        if os.path.exists(pin):
            reuse_pinned_map(map_ptr, pin, f"sock_lb: map {name}")

    def _reuse_if_pinned(self, name: str, map_ptr: int) -> None:
        pin = os.path.join(self.config.pin_dir, name)
        if not os.path.exists(pin):
            log.info("sock_lb: %s is not pinned at %s; egress policy is not enforced", name, pin)
            return
        reuse_pinned_map(map_ptr, pin, f"sock_lb: map {name}")

    def _attach_one(self, name: str, prog: int, cg: str, cg_id: int, cg_fd: int) -> None:
        hook = PROGRAMS.get(name, "?")
        prog_fd = libbpf.program_fd(prog)
        if prog_fd < 0:
            raise DatapathError(-prog_fd, f"sock_lb: program {name} ({hook}) not loaded")
        pin = os.path.join(self.links_dir(cg_id), name)
        link_fd = self._adopt(name, hook, pin, prog_fd, cg, cg_id)
        adopted = link_fd >= 0
        if not adopted:
            link_fd = libbpf.program_attach_cgroup(prog, cg_fd)
            if link_fd < 0:
                raise DatapathError(
                    -link_fd, f"sock_lb: attach program {name} ({hook}) to cgroup {cg}"
                )
            ret = libbpf.obj_pin(link_fd, pin)
            if ret < 0:
                libbpf.link_detach(link_fd)
                os.close(link_fd)
                raise DatapathError(
                    -ret, f"sock_lb: pin link of {name} ({hook}, cgroup {cg}) at {pin}"
                )
        info = libbpf.link_info(link_fd)
        link_id, prog_id = (info[1], info[2]) if not isinstance(info, int) else (0, 0)
        old = self._link_fds.pop(name, None)
        if old is not None:
            os.close(old)
        self._link_fds[name] = link_fd
        self.attached[name] = AttachedProgram(name, hook, link_id, prog_id, pin, adopted)
        log.info(
            "sock_lb: %s %s (%s) on cgroup %s, link %d pinned at %s",
            "updated" if adopted else "attached",
            name,
            hook,
            cg,
            link_id,
            pin,
        )

    def _adopt(self, name: str, hook: str, pin: str, prog_fd: int, cg: str, cg_id: int) -> int:
        """The fd of the link pinned at ``pin`` with ``prog_fd`` swapped in, or -1 when
        there is none to adopt (a pin that is no cgroup link of this cgroup is removed)."""
        if not os.path.exists(pin):
            return -1
        fd = libbpf.obj_get(pin)
        if fd < 0:
            log.warning("sock_lb: cannot open pinned link %s (errno %d); replacing it", pin, -fd)
            os.unlink(pin)
            return -1
        info = libbpf.link_info(fd)
        if isinstance(info, int) or info[0] != _BPF_LINK_TYPE_CGROUP or info[3] != cg_id:
            log.warning("sock_lb: %s is not a link of cgroup %s; replacing it", pin, cg)
            os.close(fd)
            os.unlink(pin)
            return -1
        ret = libbpf.link_update(fd, prog_fd)
        if ret < 0:
            os.close(fd)
            raise DatapathError(
                -ret, f"sock_lb: update the pinned link of {name} ({hook}) on cgroup {cg}"
            )
        return fd

    def _prune_stale_links(self) -> None:
        """Remove the pins of links whose cgroup is gone (the kernel detached them when the
        cgroup was removed, and reports cgroup id 0 for them)."""
        links = os.path.join(self.base_dir, "links")
        if not os.path.isdir(links):
            return
        for sub in os.listdir(links):
            d = os.path.join(links, sub)
            stale = True
            for name in os.listdir(d):
                fd = libbpf.obj_get(os.path.join(d, name))
                if fd < 0:
                    continue
                info = libbpf.link_info(fd)
                os.close(fd)
                if not isinstance(info, int) and info[3] != 0:
                    stale = False
            if stale:
                log.info("sock_lb: removing pinned links of a removed cgroup: %s", d)
                remove_pinned_links(d)

    # -- status and teardown ----------------------------------------------------------------

    @staticmethod
    def pinned(pin_dir: str = DEFAULT_PIN_DIR) -> list[PinnedLink]:
        """Every link pinned by the datapath under ``pin_dir`` as the kernel reports it.
        For health reports and tools; works from any process."""
        out: list[PinnedLink] = []
        links = os.path.join(pin_dir, SUBDIR, "links")
        if not os.path.isdir(links):
            return out
        for sub in sorted(os.listdir(links)):
            for name in sorted(os.listdir(os.path.join(links, sub))):
                pin = os.path.join(links, sub, name)
                fd = libbpf.obj_get(pin)
                info = libbpf.link_info(fd) if fd >= 0 else fd
                if fd >= 0:
                    os.close(fd)
                if isinstance(info, int):
                    err = errno.errorcode.get(-info, str(-info))
                    out.append(PinnedLink(name, pin, 0, 0, 0, err))
                else:
                    out.append(PinnedLink(name, pin, info[1], info[2], info[3]))
        return out

    def is_attached(self) -> bool:
        """Whether every configured program is attached through this handle."""
        return all(n in self._link_fds for n in self.config.programs)

    def close(self) -> None:
        """Release this process's handles; the pinned links keep the datapath working."""
        for fd in self._link_fds.values():
            os.close(fd)
        self._link_fds.clear()

    def detach(self) -> None:
        """Detach this cgroup's programs and remove their pins (the datapath's own maps
        stay for other cgroups; ``cleanup`` removes everything)."""
        cg = os.path.realpath(self.config.cgroup)
        cg_id = cgroup_id(cg) if os.path.isdir(cg) else None
        errors: list[str] = []
        for name, fd in list(self._link_fds.items()):
            ret = libbpf.link_detach(fd)
            if ret < 0 and ret != -errno.ENOLINK:
                errors.append(f"detach {name}: {errno.errorcode.get(-ret, -ret)}")
        self.close()
        if cg_id is not None:
            errors += remove_pinned_links(self.links_dir(cg_id))
        self.attached.clear()
        if errors:
            raise DatapathError(
                errno.EIO, f"sock_lb: detach from cgroup {cg}: " + "; ".join(errors)
            )

    @staticmethod
    def cleanup(pin_dir: str = DEFAULT_PIN_DIR) -> list[str]:
        """Detach every pinned link of the datapath under ``pin_dir`` and remove its pins
        (links and its own maps), e.g. for ``statewright agent --cleanup``. The LB maps are
        left alone. Returns what was removed."""
        base = os.path.join(pin_dir, SUBDIR)
        removed: list[str] = []
        links = os.path.join(base, "links")
        if os.path.isdir(links):
            for sub in sorted(os.listdir(links)):
                d = os.path.join(links, sub)
                removed += [os.path.join(d, n) for n in sorted(os.listdir(d))]
                errors = remove_pinned_links(d)
                if errors:
                    raise DatapathError(errno.EIO, f"sock_lb: cleanup {d}: " + "; ".join(errors))
        if os.path.isdir(base):
            for name in OWN_MAPS:
                if os.path.exists(os.path.join(base, name)):
                    removed.append(os.path.join(base, name))
            shutil.rmtree(base)
        return removed


def reuse_pinned_map(map_ptr: int, pin: str, what: str) -> None:
    """Make an object's map (``map_ptr``, before load) use the map pinned at ``pin``;
    DatapathError naming ``what`` and the pin when it cannot be opened or reused."""
    fd = libbpf.obj_get(pin)
    if fd < 0:
        raise DatapathError(-fd, f"{what}: open pinned map at {pin}")
    try:
        ret = libbpf.map_reuse_fd(map_ptr, fd)
        if ret < 0:
            raise DatapathError(-ret, f"{what}: reuse pinned {pin}")
    finally:
        os.close(fd)


def remove_pinned_links(links_dir: str) -> list[str]:
    """Detach and unpin every link pinned in ``links_dir``, then remove the directory; the
    errors, one line each (a link already gone is no error)."""
    errors: list[str] = []
    if not os.path.isdir(links_dir):
        return errors
    for name in sorted(os.listdir(links_dir)):
        pin = os.path.join(links_dir, name)
        fd = libbpf.obj_get(pin)
        if fd >= 0:
            ret = libbpf.link_detach(fd)
            os.close(fd)
            if ret < 0 and ret != -errno.ENOLINK:
                errors.append(f"detach {pin}: {errno.errorcode.get(-ret, -ret)}")
        try:
            os.unlink(pin)
        except FileNotFoundError:
            pass
        except OSError as exc:
            errors.append(f"unpin {pin}: {exc}")
    try:
        os.rmdir(links_dir)
    except OSError as exc:
        errors.append(f"remove {links_dir}: {exc}")
    return errors
