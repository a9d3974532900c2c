"""Chooses the map backend (kernel when permitted, memory otherwise) and opens maps with it."""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from bpf import btf
from bpf.backend import MapBackend
from bpf.errors import MapError
from bpf.kernel_map import KernelMap
from bpf.memory_map import MemoryMap
from bpf.pinning import MapOpener, open_or_create, pin_path
from bpf.probe import DEFAULT_PIN_DIR, kernel_support
from bpf.spec import MAP_OF_MAPS, MapSpec
from bpf.typed_map import TypedMap

log = logging.getLogger("statewright.bpf")

K = TypeVar("K")
V = TypeVar("V")

BackendKind = Literal["auto", "kernel", "memory"]


@dataclass(frozen=True, slots=True)
class BackendConfig:
    """Which backend to use ("auto" = kernel if permitted), where to pin, and whether to pin."""

    backend: BackendKind = "auto"
    pin_dir: str = DEFAULT_PIN_DIR
    pin: bool = True


class MapFactory:
    """Opens maps on the chosen backend; ``kind`` and ``reason`` say which and why.

    On the kernel backend ``reason`` also says whether new maps carry BTF
    (``bpf.btf``) and, when not, why; ``btf`` holds that verdict (None on memory).
    """

    def __init__(self, config: BackendConfig | None = None) -> None:
        self.config = config or BackendConfig()
        support = kernel_support(self.config.pin_dir)
        if self.config.backend == "memory":
            self.kind, self.reason = "memory", "configured"
        elif support.ok:
            self.kind, self.reason = "kernel", support.reason
        elif self.config.backend == "kernel":
            raise MapError(
                "*", "select backend", errno.EPERM, f"kernel maps unavailable: {support.reason}"
            )
        else:
            self.kind, self.reason = "memory", f"kernel maps unavailable: {support.reason}"
        self.opener: MapOpener = KernelMap if self.kind == "kernel" else MemoryMap
        self.btf: btf.BtfStatus | None = None
        if self.kind == "kernel":
            self.btf = btf.status()
            self.reason = f"{self.reason}, {'with ' if self.btf.ok else ''}{self.btf.reason}"
        where = f"pinned under {self.config.pin_dir}" if self.config.pin else "unpinned"
        log.info("bpf: using %s maps (%s), %s", self.kind, self.reason, where)

    def open(self, spec: MapSpec[Any, Any]) -> MapBackend:
        """Open (or create) ``spec``'s map, pinned when configured.

        A pinned kernel map whose layout matches is adopted as it is, also when it was
        created without BTF (by an earlier version or without clang): its entries are
        worth more than a prettier bpftool dump, so it is kept and that is logged.
        """
        if not self.config.pin:
            return self.opener.create(spec)
        if self.kind != "kernel":
            return open_or_create(self.opener, spec, self.config.pin_dir)
        os.makedirs(self.config.pin_dir, exist_ok=True)
        existed = self.opener.is_pinned(pin_path(self.config.pin_dir, spec.name))
        m = open_or_create(self.opener, spec, self.config.pin_dir)
        if existed and self.btf is not None and self.btf.ok and spec.type not in MAP_OF_MAPS:
            try:
                has_btf = m.info().btf_id != 0
            except BaseException:
                m.close()
                raise
            if not has_btf:
                log.info(
                    "bpf: pinned map %s at %s has no BTF; adopted as it is (bpftool shows "
                    "its entries as hex until it is recreated)",
                    spec.name,
                    m.pinned_path,
                )
        return m

    def open_typed(self, spec: MapSpec[K, V]) -> TypedMap[K, V]:
        """Open ``spec``'s map with its codecs."""
        return TypedMap(spec, self.open(spec))
