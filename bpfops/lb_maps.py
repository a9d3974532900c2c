"""The set of load-balancer maps (v4 and v6), opened through bpf/factory on kernel or memory.

``LBMaps.open(LBMapsConfig(...))`` opens (or creates and pins) every map of
``bpf.catalog.lb_specs``; ``LBMaps.in_memory()`` gives unpinned memory maps for tests.
``wrap`` puts a wrapper (e.g. ``bpf.testing.FaultyMap``) around each map so tests can
inject faults into every operation the LB Ops perform.

Maglev tables are inner maps of the two hash-of-maps: a new inner array is created,
filled and swapped in under the service's rev-NAT id, so the datapath never sees a
half-written table.
"""

from __future__ import annotations

import errno
import ipaddress
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from bpf import lb
from bpf.backend import MapBackend
from bpf.catalog import LBMapSizes, lb_specs, scale_to_zero_spec
from bpf.errors import MapError
from bpf.factory import BackendConfig, BackendKind, MapFactory
from bpf.memory_map import MemoryMap
from bpf.pinning import MapOpener
from bpf.probe import DEFAULT_PIN_DIR
from bpf.spec import MapSpec
from bpf.typed_map import TypedMap

Wrapper = Callable[[MapBackend], MapBackend]

SERVICES4 = "lb4_services"
SERVICES6 = "lb6_services"
BACKENDS4 = "lb4_backends"
BACKENDS6 = "lb6_backends"
REVNAT4 = "lb4_reverse_nat"
REVNAT6 = "lb6_reverse_nat"
AFFINITY_MATCH = "lb_affinity_match"
AFFINITY4 = "lb4_affinity"
AFFINITY6 = "lb6_affinity"
SRCRANGE4 = "lb4_source_range"
SRCRANGE6 = "lb6_source_range"
MAGLEV4 = "lb4_maglev"
MAGLEV6 = "lb6_maglev"
#: Opened only with --enable-scale-to-zero (LBMapsConfig.scale_to_zero), not one of
#: LB_MAP_NAMES: the services-map ids whose service opted into scale-to-zero.
SCALE_TO_ZERO = "lb_scale_to_zero"

LB_MAP_NAMES = (
    SERVICES4,
    SERVICES6,
    BACKENDS4,
    BACKENDS6,
    REVNAT4,
    REVNAT6,
    AFFINITY_MATCH,
    AFFINITY4,
    AFFINITY6,
    SRCRANGE4,
    SRCRANGE6,
    MAGLEV4,
    MAGLEV6,
)
# The maps the control plane owns (the affinity LRU maps are the datapath's).
CONTROL_MAP_NAMES = tuple(n for n in LB_MAP_NAMES if n not in (AFFINITY4, AFFINITY6))


@dataclass(frozen=True, slots=True)
class LBMapsConfig:
    """Where and how the LB maps live."""

    backend: BackendKind = "auto"
    pin_dir: str = DEFAULT_PIN_DIR
    pin: bool = True
    max_entries: int = lb.LB_MAP_MAX_ENTRIES
    maglev_table_size: int = lb.MAGLEV_TABLE_SIZE
    #: Also open the scale-to-zero map (--enable-scale-to-zero).
    scale_to_zero: bool = False
    #: Each map group's capacity (the ``--bpf-lb-*-map-max`` flags); None: every map
    #: ``max_entries``.
    sizes: LBMapSizes | None = None

    @property
    def map_sizes(self) -> LBMapSizes:
        """The capacity of every map group."""
        return self.sizes if self.sizes is not None else LBMapSizes.uniform(self.max_entries)


def delete_quiet(m: TypedMap[Any, Any] | MapBackend, key: Any) -> bool:
    """Delete ``key`` from a typed map (or, with a bytes key, from a byte-level backend); an
    absent entry is not an error (deletes must be idempotent).

    Returns whether an entry was deleted.
    """
    try:
        m.delete(key)
    except MapError as exc:
        if exc.errno != errno.ENOENT:
            raise
        return False
    return True


class LBMaps:
    """Every LB map as a TypedMap, plus maglev inner-map handling and bulk helpers."""

    def __init__(
        self,
        maps: dict[str, TypedMap[Any, Any]],
        inner_opener: MapOpener,
        maglev_table_size: int,
        kind: str = "memory",
        pin_dir: str | None = None,
    ) -> None:
        missing = [n for n in LB_MAP_NAMES if n not in maps]
        if missing:
            raise ValueError(f"LBMaps: missing maps {missing}")
        self.maps = maps
        self.kind = kind
        self.pin_dir = pin_dir
        self.maglev_table_size = maglev_table_size
        self._inner_opener = inner_opener
        self.svc4: TypedMap[lb.Service4Key, lb.ServiceValue] = maps[SERVICES4]
        self.svc6: TypedMap[lb.Service6Key, lb.ServiceValue] = maps[SERVICES6]
        self.be4: TypedMap[int, lb.Backend4] = maps[BACKENDS4]
        self.be6: TypedMap[int, lb.Backend6] = maps[BACKENDS6]
        self.rev4: TypedMap[int, lb.RevNat4] = maps[REVNAT4]
        self.rev6: TypedMap[int, lb.RevNat6] = maps[REVNAT6]
        self.aff_match: TypedMap[lb.AffinityMatchKey, int] = maps[AFFINITY_MATCH]
        self.src4: TypedMap[lb.SourceRange4Key, int] = maps[SRCRANGE4]
        self.src6: TypedMap[lb.SourceRange6Key, int] = maps[SRCRANGE6]
        self.maglev4: TypedMap[int, int] = maps[MAGLEV4]
        self.maglev6: TypedMap[int, int] = maps[MAGLEV6]
        #: The scale-to-zero map when it was opened (--enable-scale-to-zero), else None.
        self.scale_to_zero: TypedMap[lb.ScaleToZeroKey, lb.ScaleToZeroValue] | None = maps.get(
            SCALE_TO_ZERO
        )

    # -- construction ----------------------------------------------------------------

    @classmethod
    def open(
        cls,
        config: LBMapsConfig | None = None,
        wrap: Wrapper | None = None,
        factory: MapFactory | None = None,
    ) -> LBMaps:
        """Open (or create and pin) every LB map on the backend ``config`` selects."""
        config = config or LBMapsConfig()
        factory = factory or MapFactory(
            BackendConfig(backend=config.backend, pin_dir=config.pin_dir, pin=config.pin)
        )
        sizes = config.map_sizes
        specs = lb_specs(maglev_table_size=config.maglev_table_size, sizes=sizes)
        if config.scale_to_zero:
            specs.append(scale_to_zero_spec(sizes.services))
        maps: dict[str, TypedMap[Any, Any]] = {}
        try:
            for spec in specs:
                backend = factory.open(spec)
                maps[spec.name] = TypedMap(spec, wrap(backend) if wrap else backend)
        except BaseException:
            for m in maps.values():
                m.close()
            raise
        pin_dir = factory.config.pin_dir if factory.config.pin else None
        return cls(maps, factory.opener, config.maglev_table_size, factory.kind, pin_dir)

    @classmethod
    def in_memory(
        cls,
        max_entries: int = lb.LB_MAP_MAX_ENTRIES,
        maglev_table_size: int = lb.MAGLEV_TABLE_SIZE,
        wrap: Wrapper | None = None,
        scale_to_zero: bool = False,
        sizes: LBMapSizes | None = None,
    ) -> LBMaps:
        """Fresh unpinned in-memory maps (tests, tools); ``scale_to_zero`` adds that map;
        ``sizes`` sizes each map group (default: ``max_entries`` each)."""
        maps: dict[str, TypedMap[Any, Any]] = {}
        z = sizes if sizes is not None else LBMapSizes.uniform(max_entries)
        specs = lb_specs(maglev_table_size=maglev_table_size, sizes=z)
        if scale_to_zero:
            specs.append(scale_to_zero_spec(z.services))
        for spec in specs:
            backend: MapBackend = MemoryMap.create(spec)
            maps[spec.name] = TypedMap(spec, wrap(backend) if wrap else backend)
        return cls(maps, MemoryMap, maglev_table_size, "memory", None)

    @property
    def inner_opener(self) -> MapOpener:
        """Creates the maglev inner maps (the backend class of these maps)."""
        return self._inner_opener

    def unwrapped(self) -> LBMaps:
        """The same maps without the wrappers given to ``open``/``in_memory`` (e.g. to dump
        them without injected faults). Shares the handles: close only one of the two."""
        plain = {
            name: TypedMap(m.spec, getattr(m.backend, "inner", m.backend))
            for name, m in self.maps.items()
        }
        return LBMaps(plain, self._inner_opener, self.maglev_table_size, self.kind, self.pin_dir)

    def close(self) -> None:
        """Close every handle (pinned maps live on)."""
        for m in self.maps.values():
            m.close()

    def unpin(self) -> None:
        """Remove the pins (tests clean up with this; the maps die with the last handle)."""
        for m in self.maps.values():
            if m.backend.pinned_path:
                m.backend.unpin()

    def __enter__(self) -> LBMaps:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- per family ------------------------------------------------------------------

    def services(self, v6: bool) -> TypedMap[Any, lb.ServiceValue]:
        """The services map of a family."""
        return self.svc6 if v6 else self.svc4

    def backends(self, v6: bool) -> TypedMap[int, Any]:
        """The backends map of a family."""
        return self.be6 if v6 else self.be4

    def revnat(self, v6: bool) -> TypedMap[int, Any]:
        """The reverse-NAT map of a family."""
        return self.rev6 if v6 else self.rev4

    def source_ranges(self, v6: bool) -> TypedMap[Any, int]:
        """The source-range LPM map of a family."""
        return self.src6 if v6 else self.src4

    def maglev(self, v6: bool) -> TypedMap[int, int]:
        """The outer maglev map of a family."""
        return self.maglev6 if v6 else self.maglev4

    # -- maglev ------------------------------------------------------------------------

    def _inner_spec(self, v6: bool) -> MapSpec[Any, Any]:
        inner = self.maglev(v6).spec.inner
        assert inner is not None
        return inner

    def set_maglev(self, rev_nat_id: int, table: list[int], v6: bool) -> None:
        """Install ``table`` (``maglev_table_size`` backend ids) for ``rev_nat_id``."""
        if len(table) != self.maglev_table_size:
            raise ValueError(
                f"maglev table for rev-NAT {rev_nat_id} has {len(table)} entries, "
                f"need {self.maglev_table_size}"
            )
        spec = self._inner_spec(v6)
        inner = TypedMap(spec, self._inner_opener.create(spec))
        try:
            inner.update(0, table)
            self.maglev(v6).set_inner(rev_nat_id, inner)
        finally:
            inner.close()

    def delete_maglev(self, rev_nat_id: int, v6: bool) -> None:
        """Remove the maglev table of ``rev_nat_id`` (absent is fine)."""
        outer = self.maglev(v6)
        delete_quiet(outer, rev_nat_id)

    def maglev_tables(self, v6: bool) -> Iterator[tuple[int, list[int]]]:
        """(rev-NAT id, table) for every installed maglev table of a family."""
        outer = self.maglev(v6)
        for key in list(outer.keys()):
            inner = outer.get_inner(key)
            if inner is None:
                continue
            try:
                value = inner.lookup(0)
            finally:
                inner.close()
            if value is not None:
                yield key, list(value)

    # -- whole-set helpers ---------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Entries per map."""
        return {name: m.count() for name, m in self.maps.items()}

    def is_empty(self) -> bool:
        """Whether the control-plane maps hold no entry at all."""
        return all(self.maps[n].count() == 0 for n in CONTROL_MAP_NAMES)

    def clear(self) -> None:
        """Delete every entry of every map (tests)."""
        for m in self.maps.values():
            for key in list(m.keys()):
                delete_quiet(m, key)

    def snapshot(self) -> LBSnapshot:
        """A copy of every control-plane entry (the ``lb/maps-snapshot`` command)."""
        entries: dict[str, list[tuple[Any, Any]]] = {}
        for name in CONTROL_MAP_NAMES:
            if name in (MAGLEV4, MAGLEV6):
                continue
            entries[name] = list(self.maps[name].items())
        maglev = {
            False: list(self.maglev_tables(False)),
            True: list(self.maglev_tables(True)),
        }
        return LBSnapshot(entries, maglev)

    def restore(self, snap: LBSnapshot, any_proto: bool = False) -> None:
        """Write ``snap`` back without clearing (``--any-proto``: protocols become ANY)."""
        for name, items in snap.entries.items():
            m = self.maps[name]
            for key, value in items:
                k, v = key, value
                if any_proto and name in (SERVICES4, SERVICES6):
                    k = type(key)(key.address, key.dport, key.backend_slot, 0, key.scope)
                elif any_proto and name in (BACKENDS4, BACKENDS6):
                    v = type(value)(
                        value.address, value.port, 0, value.flags, value.cluster_id, value.zone
                    )
                m.update(k, v)
        for v6, tables in snap.maglev.items():
            for rev_nat_id, table in tables:
                self.set_maglev(rev_nat_id, table, v6)


@dataclass(frozen=True, slots=True)
class LBSnapshot:
    """Decoded entries of the LB maps at one moment (maglev tables separately)."""

    entries: dict[str, list[tuple[Any, Any]]]
    maglev: dict[bool, list[tuple[int, list[int]]]]


def ip_bytes(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bytes:
    """Network-order bytes of an address (what the map structs hold)."""
    return ip.packed
