"""BTF for the maps Statewright creates, so that bpftool prints their entries as C structs.

The C headers in ``bpf/include`` define every key and value layout, and ``bpf/maps.c``
declares every map of the catalogue with them (``tests/bpf/test_layout_btf.py`` checks
that it declares exactly the catalogue's maps). clang compiles it with ``-g -target bpf``
into ``maps.o`` of the objects directory (``bpf.objects``: the checkout's ``build/``;
``make setup``, or here on first use when the object is missing or older than its
sources). libbpf opens the object (``bpf_object__open``, which also gives
its data sections the sizes the kernel requires; nothing is loaded or created), its BTF
is copied out, loaded into the kernel once per process (``bpf_btf_load``), and
``KernelMap.create`` passes the BTF fd with the ids of the spec's key and value types,
found by the codecs' C names (``lb4_key``, ``__be16``, ...). The maglev inner value
``__u32[N]`` has a configurable size, so array types are appended to the BTF when first
needed (and the blob is loaded again).

BTF is an aid to people and tools, never a condition for running: without clang, with
an object libbpf cannot open or a kernel that rejects the blob, ``status()`` says why
and maps are created without BTF. Map-of-maps never carry BTF (the kernel refuses
key/value types for them); their inner maps do.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import subprocess
import sysconfig
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bpf import libbpf
from bpf.errors import errno_name
from bpf.objects import object_path
from bpf.spec import MAP_OF_MAPS, MapSpec
from statedb.errors import StatewrightError

log = logging.getLogger("statewright.bpf")

REPO_ROOT = Path(__file__).resolve().parents[1]
#: The C file declaring every map (and so using every key and value type; package data).
SOURCE = Path(__file__).resolve().parent / "maps.c"
#: The headers it includes (their changes make a compiled object stale; package data).
INCLUDE_DIR = Path(__file__).resolve().parent / "include"
#: Where ``make setup`` (or the first use) puts the compiled object: the objects directory
#: (bpf.objects; the checkout's build/ unless $STATEWRIGHT_BPF_OBJECTS names another).
DEFAULT_OBJECT = Path(object_path("maps.o"))
#: Environment variable naming another object, or "off" to create maps without BTF.
OBJECT_ENV = "STATEWRIGHT_BTF_OBJECT"

_ARRAY = re.compile(r"^(?P<elem>.+)\[(?P<n>\d+)\]$")
#: Kinds tried, in order, for a C name: structs and unions by tag, then typedefs.
_KINDS = (libbpf.BTF_KIND_STRUCT, libbpf.BTF_KIND_UNION, libbpf.BTF_KIND_TYPEDEF)
#: Size of the buffer for the kernel's log when it rejects the blob.
_LOG_SIZE = 64 * 1024


class BtfError(StatewrightError, OSError):
    """BTF cannot be built, parsed, loaded or does not describe a map: ``errno`` and a
    message naming the file, type or map and why."""

    def __init__(self, err: int, message: str) -> None:
        super().__init__(err, message)
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[type[BtfError], tuple[int, str]]:
        return (BtfError, (self.errno or 0, self.message))


class BtfLoadError(BtfError):
    """The kernel rejects the BTF blob itself (not one map's use of it)."""


@dataclass(frozen=True, slots=True)
class MapBtf:
    """What map creation passes to the kernel: a loaded BTF fd and two type ids in it."""

    fd: int
    key_type_id: int
    value_type_id: int


@dataclass(frozen=True, slots=True)
class BtfStatus:
    """Whether maps get BTF (``ok``), and from where or why not (``reason``)."""

    ok: bool
    reason: str


def _multiarch_include() -> list[str]:
    """``-I/usr/include/<multiarch>``: Debian keeps ``asm/types.h`` there."""
    arch = sysconfig.get_config_var("MULTIARCH") or ""
    path = f"/usr/include/{arch}"
    return [f"-I{path}"] if arch and os.path.isdir(path) else []


def _sources(source: Path) -> list[Path]:
    """The files the object is built from: the C file and every header it may include."""
    return [source, *sorted(INCLUDE_DIR.glob("*.h"))]


def _shown(path: Path) -> str:
    """``path`` relative to the repository when inside it (shorter health lines)."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def find_clang() -> str | None:
    """The clang on PATH, or None."""
    return shutil.which("clang")


def is_stale(obj: Path, source: Path = SOURCE) -> bool:
    """Whether ``obj`` is missing or older than one of its sources."""
    try:
        built = obj.stat().st_mtime
    except FileNotFoundError:
        return True
    return any(p.stat().st_mtime > built for p in _sources(source) if p.exists())


def compile_types(obj: Path, source: Path = SOURCE, clang: str | None = None) -> None:
    """Compile ``source`` with clang into ``obj`` (written atomically, so concurrent
    first uses never read half an object). Raises BtfError saying what failed."""
    clang = clang or find_clang()
    if clang is None:
        raise BtfError(errno.ENOENT, f"clang not installed, cannot build {obj} from {source}")
    obj.parent.mkdir(parents=True, exist_ok=True)
    tmp = obj.with_name(f".{obj.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    cmd = [clang, "-O2", "-g", "-target", "bpf", *_multiarch_include(), "-c", str(source)]
    try:
        result = subprocess.run(
            [*cmd, "-o", str(tmp)], capture_output=True, text=True, timeout=120, check=False
        )
        if result.returncode != 0:
            detail = result.stderr.strip().splitlines()[-1:] or ["no output"]
            raise BtfError(errno.EINVAL, f"clang failed on {source}: {detail[0]}")
        os.replace(tmp, obj)
    except OSError as exc:
        if isinstance(exc, BtfError):
            raise
        raise BtfError(exc.errno or errno.EIO, f"cannot build {obj}: {exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    log.info("bpf: compiled the map types %s into %s", source, obj)


class BtfTypes:
    """The compiled types as libbpf parsed them, loaded into the kernel on first use.

    Thread-safe. Array types are appended to libbpf's copy when a spec needs one, and
    the next ``for_spec`` loads the grown blob as a new kernel BTF object (each map
    keeps a reference to the object it was created with).
    """

    def __init__(self, btf: int, origin: str) -> None:
        self._btf = btf
        self.origin = origin
        self._lock = threading.Lock()
        self._fd = -1
        self._old_fds: list[int] = []
        self._loaded_types = 0
        self._ids: dict[str, int] = {}

    @classmethod
    def from_object(cls, path: str | Path) -> BtfTypes:
        """The BTF of a compiled BPF object (BtfError when impossible).

        The object is opened with libbpf rather than its ``.BTF`` section read as is:
        clang leaves the sizes of data sections (``.maps``, ``license``) to the loader,
        and the kernel rejects a data section of size 0. The fixed-up BTF is copied into
        a standalone ``struct btf`` so that the object can be closed at once.
        """
        obj = libbpf.object_open(str(path))
        if obj < 0:
            raise BtfError(-obj, f"libbpf cannot open {path}: {errno_name(-obj)}")
        try:
            src = libbpf.object_btf(obj)
            if not src:
                raise BtfError(errno.ENOENT, f"{path} has no BTF (compiled without -g?)")
            raw = libbpf.btf_raw_data(src)
            if isinstance(raw, int):
                raise BtfError(-raw, f"cannot serialize the BTF of {path}: {errno_name(-raw)}")
            btf = libbpf.btf_new(raw)
            if btf < 0:
                raise BtfError(-btf, f"libbpf cannot copy the BTF of {path}: {errno_name(-btf)}")
        finally:
            libbpf.object_close(obj)
        return cls(btf, str(path))

    def close(self) -> None:
        """Close the kernel BTF fd and free libbpf's copy (maps created keep theirs)."""
        with self._lock:
            for fd in [*self._old_fds, self._fd]:
                if fd >= 0:
                    os.close(fd)
            self._fd, self._old_fds = -1, []
            if self._btf:
                libbpf.btf_free(self._btf)
                self._btf = 0

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing useful to report
            pass

    # -- types -----------------------------------------------------------------------

    def type_id(self, c_name: str) -> int:
        """The id of the type a codec calls ``c_name``: a struct or union tag, a typedef
        (``__be16``), or ``T[N]`` (appended when absent). BtfError when unknown."""
        with self._lock:
            return self._type_id(c_name)

    def _check_open(self) -> None:
        """libbpf's copy must not be used once freed (its pointer would be dangling)."""
        if not self._btf:
            raise BtfError(errno.EBADF, f"BTF from {self.origin} is closed")

    def _type_id(self, c_name: str) -> int:
        self._check_open()
        known = self._ids.get(c_name)
        if known is not None:
            return known
        array = _ARRAY.match(c_name)
        if array is not None:
            elem = self._type_id(array["elem"])
            index = self._type_id("__u32")
            tid = libbpf.btf_add_array(self._btf, index, elem, int(array["n"]))
            if tid < 0:
                raise BtfError(-tid, f"cannot add BTF type {c_name}: {errno_name(-tid)}")
        else:
            tid = -errno.ENOENT
            for kind in _KINDS:
                tid = libbpf.btf_find(self._btf, c_name, kind)
                if tid > 0:
                    break
            if tid <= 0:
                raise BtfError(
                    errno.ENOENT,
                    f"no type {c_name} in the BTF of {self.origin} (declare the map in "
                    "bpf/include under SW_DEFINE_MAPS, see bpf/maps.c)",
                )
        self._ids[c_name] = tid
        return tid

    def _sized_id(self, spec: MapSpec[Any, Any], role: str, codec: Any) -> int:
        """The type id for the key or value codec, checked to be the codec's size."""
        c_name = getattr(codec, "c_name", None)
        if not c_name:
            raise BtfError(errno.ENOENT, f"map {spec.name}: the {role} codec has no C name")
        tid = self._type_id(c_name)
        size = libbpf.btf_resolve_size(self._btf, tid)
        if size != codec.size:
            raise BtfError(
                errno.EINVAL,
                f"map {spec.name}: {role} type {c_name} is {size} bytes in {self.origin}, "
                f"the codec's is {codec.size} (rebuild it: make setup)",
            )
        return tid

    # -- kernel ----------------------------------------------------------------------

    def size(self, type_id: int) -> int:
        """The size in bytes of a type (typedefs followed), or -errno."""
        with self._lock:
            self._check_open()
            return libbpf.btf_resolve_size(self._btf, type_id)

    def ids(self, spec: MapSpec[Any, Any]) -> tuple[int, int]:
        """The key and value type ids for ``spec`` (BtfError when the map cannot have
        BTF, or a type is unknown or of another size than the codec)."""
        if spec.type in MAP_OF_MAPS:
            raise BtfError(
                errno.EOPNOTSUPP, f"map {spec.name}: the kernel takes no BTF for map-of-maps"
            )
        with self._lock:
            return self._sized_id(spec, "key", spec.key), self._sized_id(spec, "value", spec.value)

    def for_spec(self, spec: MapSpec[Any, Any]) -> MapBtf:
        """The BTF fd and key/value type ids for creating ``spec``'s map (BtfError as
        ``ids``, or when the kernel rejects the blob)."""
        key_id, value_id = self.ids(spec)
        with self._lock:
            return MapBtf(self._kernel_fd(), key_id, value_id)

    def load(self) -> int:
        """Load the types into the kernel now (BtfLoadError when it rejects them); the fd."""
        with self._lock:
            return self._kernel_fd()

    def _kernel_fd(self) -> int:
        """The kernel BTF object holding every type added so far (loaded on demand)."""
        self._check_open()
        count = libbpf.btf_type_count(self._btf)
        if self._fd >= 0 and self._loaded_types == count:
            return self._fd
        raw = libbpf.btf_raw_data(self._btf)
        if isinstance(raw, int):
            raise BtfError(-raw, f"cannot serialize the BTF of {self.origin}: {errno_name(-raw)}")
        fd, _ = libbpf.btf_load(raw)
        if fd < 0:
            # Again with a log, only now: the kernel says which type it rejects.
            _, text = libbpf.btf_load(raw, _LOG_SIZE)
            why = text.splitlines()[-1] if text else "no log"
            raise BtfLoadError(
                -fd, f"the kernel rejects the BTF of {self.origin}: {errno_name(-fd)} ({why})"
            )
        if self._fd >= 0:
            # Another thread may be creating a map with the previous fd right now, so it
            # stays open until close() (one per array size ever added: a handful).
            self._old_fds.append(self._fd)
        self._fd, self._loaded_types = fd, count
        return fd


# -- the process-wide types -------------------------------------------------------------


class BtfRegistry:
    """Where the types come from, opened once on first use; remembers why not.

    ``object_path`` None means ``$STATEWRIGHT_BTF_OBJECT`` or ``maps.o`` in the objects
    directory (`bpf.objects`);
    ``build`` allows compiling it (when missing or stale and clang is installed).
    """

    def __init__(
        self,
        object_path: str | Path | None = None,
        source: Path = SOURCE,
        build: bool = True,
        clang: str | None = None,
    ) -> None:
        env = os.environ.get(OBJECT_ENV, "")
        self.disabled = object_path is None and env.lower() == "off"
        self.object_path = Path(object_path or env or DEFAULT_OBJECT)
        self.source = source
        self.build = build
        self.clang = clang
        self._lock = threading.Lock()
        self._types: BtfTypes | None = None
        self._retired: list[BtfTypes] = []
        self._status: BtfStatus | None = None
        self._refused: set[str] = set()

    def _open(self) -> BtfTypes:
        if self.disabled:
            raise BtfError(errno.ENOENT, f"disabled (${OBJECT_ENV}=off)")
        obj = self.object_path
        if self.build and is_stale(obj, self.source):
            if self.clang is not None or find_clang() is not None:
                try:
                    compile_types(obj, self.source, self.clang)
                except BtfError as exc:
                    if not obj.exists():
                        raise
                    # The older object still describes the types; sizes are checked per map.
                    log.warning("bpf: %s; using the older %s", exc.message, obj)
            elif not obj.exists():
                raise BtfError(
                    errno.ENOENT, f"{obj} not built and clang not installed (make setup)"
                )
            else:
                log.warning("bpf: %s is older than its sources and clang is missing", obj)
        elif not obj.exists():
            raise BtfError(errno.ENOENT, f"{obj} not built (make setup)")
        types = BtfTypes.from_object(obj)
        try:
            types.load()  # a kernel that rejects the blob is known before the first map
        except BtfError:
            types.close()
            raise
        return types

    def types(self) -> BtfTypes | None:
        """The opened types, or None (``status()`` says why); tried once."""
        with self._lock:
            if self._status is None:
                try:
                    self._types = self._open()
                    self._status = BtfStatus(True, f"BTF from {_shown(self.object_path)}")
                except OSError as exc:  # BtfError, or libbpf itself missing
                    why = exc.message if isinstance(exc, BtfError) else str(exc)
                    self._status = BtfStatus(False, f"no BTF: {why}")
                    log.warning("bpf: maps are created without BTF: %s", why)
            return self._types

    def status(self) -> BtfStatus:
        """Whether maps get BTF, and from where or why not (opens the types if needed)."""
        self.types()
        assert self._status is not None
        return self._status

    def for_spec(self, spec: MapSpec[Any, Any]) -> MapBtf | None:
        """BTF for creating ``spec``'s map, or None (map-of-maps, no BTF here, a type
        missing: the reason is logged once per map name)."""
        types = self.types()
        if types is None or spec.type in MAP_OF_MAPS:
            return None
        try:
            return types.for_spec(spec)
        except BtfLoadError as exc:
            # The blob grew (an array type) and the kernel rejects it: no BTF from now on.
            # Its fds stay open until close(): another thread may be creating a map with one.
            with self._lock:
                self._types, self._status = None, BtfStatus(False, f"no BTF: {exc.message}")
                self._retired.append(types)
            log.warning("bpf: maps are created without BTF from now on: %s", exc.message)
            return None
        except BtfError as exc:
            self.refused(spec, exc.message)
            return None

    def refused(self, spec: MapSpec[Any, Any], why: str) -> None:
        """Note (and log, once per map name) that ``spec``'s map goes without BTF."""
        with self._lock:
            if spec.name in self._refused:
                return
            self._refused.add(spec.name)
        log.warning("bpf: map %s is created without BTF: %s", spec.name, why)

    def close(self) -> None:
        """Release the kernel BTF and libbpf's copy (tests)."""
        with self._lock:
            for types in [*self._retired, self._types]:
                if types is not None:
                    types.close()
            self._types, self._status, self._retired = None, None, []


_registry_lock = threading.Lock()
_registry: BtfRegistry | None = None


def registry() -> BtfRegistry:
    """The process-wide registry (``maps.o`` of the objects directory unless configured
    otherwise)."""
    global _registry
    with _registry_lock:
        if _registry is None:
            _registry = BtfRegistry()
        return _registry


def use_registry(new: BtfRegistry | None) -> BtfRegistry | None:
    """Replace the process-wide registry (None: the default on next use); returns the
    previous one, which the caller closes. For tests and tools."""
    global _registry
    with _registry_lock:
        old, _registry = _registry, new
        return old


def status() -> BtfStatus:
    """Whether the maps this process creates get BTF, and why not."""
    return registry().status()


def map_btf(spec: MapSpec[Any, Any]) -> MapBtf | None:
    """BTF for creating ``spec``'s map with the process-wide registry, or None."""
    return registry().for_spec(spec)
