"""Can this process use kernel BPF maps? Answers with a reason when it cannot."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from functools import cache

from bpf.errors import errno_name

DEFAULT_PIN_DIR = "/sys/fs/bpf/statewright"

CAP_SYS_ADMIN = 21
CAP_BPF = 39


@dataclass(frozen=True, slots=True)
class KernelSupport:
    """The probe's verdict: ``ok`` or not, and why not."""

    ok: bool
    reason: str

    def __bool__(self) -> bool:
        return self.ok


def _effective_caps() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def bpffs_mounts() -> list[str]:
    """Every bpffs mount point of this mount namespace, in mount order."""
    try:
        with open("/proc/self/mounts") as f:
            return [p[1] for p in (line.split() for line in f) if len(p) >= 3 and p[2] == "bpf"]
    except OSError:
        return []


def bpffs_mount_for(path: str) -> str | None:
    """The bpffs mount point containing ``path``, or None."""
    best: str | None = None
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3 or parts[2] != "bpf":
                    continue
                mnt = parts[1]
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and (
                    best is None or len(mnt) > len(best)
                ):
                    best = mnt
    except OSError:
        return None
    return best


@cache
def kernel_support(pin_dir: str = DEFAULT_PIN_DIR) -> KernelSupport:
    """Whether kernel maps can be created and pinned under ``pin_dir``, else why not."""
    caps = _effective_caps()
    if os.geteuid() != 0 and not caps & ((1 << CAP_BPF) | (1 << CAP_SYS_ADMIN)):
        return KernelSupport(False, "not root and no CAP_BPF/CAP_SYS_ADMIN")
    if not caps & ((1 << CAP_BPF) | (1 << CAP_SYS_ADMIN)):
        return KernelSupport(
            False, "root but without CAP_BPF/CAP_SYS_ADMIN (restricted container?)"
        )
    if bpffs_mount_for(os.path.abspath(pin_dir)) is None:
        mounts = bpffs_mounts()
        if mounts:
            return KernelSupport(
                False, f"{pin_dir} is not on a bpffs mount (bpffs is at {', '.join(mounts)})"
            )
        return KernelSupport(
            False, f"bpffs not mounted for {pin_dir} (mount -t bpf bpf /sys/fs/bpf)"
        )
    try:
        from bpf import libbpf

        fd = libbpf.map_create(1, "sw_probe", 4, 4, 1, 0)
    except OSError as exc:
        return KernelSupport(False, f"libbpf unavailable: {exc}")
    if fd < 0:
        err = -fd
        hint = " (unprivileged BPF disabled or missing capability)" if err == errno.EPERM else ""
        return KernelSupport(False, f"bpf(BPF_MAP_CREATE) fails with {errno_name(err)}{hint}")
    os.close(fd)
    return KernelSupport(True, "kernel BPF maps available")
