"""Clean-up helpers for tests that pin BPF maps (bpffs directories and memory-backend pins)."""

from __future__ import annotations

import os

from bpf.memory_map import MemoryMap

BPFFS = "/sys/fs/bpf"


def remove_pin_dir(path: str) -> None:
    """Unlink every pin under ``path`` and the directories (bpffs has no rmtree to rely on)."""
    if not os.path.isdir(path):
        return
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            os.unlink(os.path.join(root, name))
        for name in dirs:
            os.rmdir(os.path.join(root, name))
    os.rmdir(path)


def remove_memory_pins(prefix: str) -> None:
    """Drop every memory-backend pin under the directory ``prefix``."""
    for pinned in MemoryMap.pinned_paths():
        if pinned.startswith(prefix + "/"):
            MemoryMap.remove_pin(pinned)
