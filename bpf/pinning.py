"""Open-or-create of pinned maps, with detection of layout changes against the pinned map."""

from __future__ import annotations

import errno
import logging
import os
from typing import Any, Protocol

from bpf.backend import MapBackend
from bpf.errors import MapError
from bpf.spec import MAP_OF_MAPS, MapSpec

log = logging.getLogger("statewright.bpf")


class MapOpener(Protocol):
    """What pinning needs from a backend class (KernelMap, MemoryMap)."""

    def create(self, spec: MapSpec[Any, Any]) -> MapBackend: ...

    def open_pinned(self, path: str, spec: MapSpec[Any, Any]) -> MapBackend: ...

    def is_pinned(self, path: str) -> bool: ...

    def remove_pin(self, path: str) -> None: ...


def pin_path(pin_dir: str, name: str) -> str:
    """Where map ``name`` is pinned under ``pin_dir``."""
    return os.path.join(pin_dir, name)


def _inner_mismatch(m: MapBackend, spec: MapSpec[Any, Any]) -> str | None:
    """For map-of-maps, compare one existing inner map with the inner spec."""
    if spec.type not in MAP_OF_MAPS or spec.inner is None:
        return None
    for key in m:
        inner = m.get_inner(key)
        if inner is None:
            continue
        try:
            why = spec.inner.mismatch(inner.info())
        finally:
            inner.close()
        return None if why is None else f"inner map: {why}"
    return None


def open_or_create(opener: MapOpener, spec: MapSpec[Any, Any], pin_dir: str) -> MapBackend:
    """Open ``spec``'s map pinned under ``pin_dir``, or create and pin it.

    A pinned map whose type, key/value size, capacity, flags or inner layout differ
    from ``spec`` is unpinned and recreated (its entries are lost), with a warning;
    keeping it would make every later write misinterpret its bytes.
    """
    path = pin_path(pin_dir, spec.name)
    if opener.is_pinned(path):
        m = opener.open_pinned(path, spec)
        try:
            why = spec.mismatch(m.info()) or _inner_mismatch(m, spec)
        except BaseException:
            m.close()
            raise
        if why is None:
            log.debug("bpf: reusing pinned map %s at %s", spec.name, path)
            return m
        m.close()
        log.warning(
            "bpf: pinned map %s at %s has a different layout (%s); unpinning and recreating it "
            "empty",
            spec.name,
            path,
            why,
        )
        try:
            opener.remove_pin(path)
        except OSError as exc:
            raise MapError(spec.name, f"unpin {path}", exc.errno or errno.EIO) from exc
    m = opener.create(spec)
    try:
        m.pin(path)
    except BaseException:
        m.close()
        raise
    log.info("bpf: created map %s pinned at %s", spec.name, path)
    return m
