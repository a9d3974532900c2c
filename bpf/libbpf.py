"""Thin ctypes binding to Debian's libbpf.so.1: the only module in Statewright that uses ctypes.

Functions return a non-negative result or ``-errno`` exactly like libbpf 1.x, so callers
decide how to report errors. Key/value arguments accept ``bytes`` (zero-copy) or a
buffer from ``new_buffer``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct
import sys
from functools import cache
from typing import Any

from statedb.errors import StatewrightError

LIBBPF_SONAME = "libbpf.so.1"

Buffer = ctypes.Array[ctypes.c_char]

_c_int = ctypes.c_int
_c_u32 = ctypes.c_uint32
_c_u64 = ctypes.c_uint64
_c_void_p = ctypes.c_void_p
_c_char_p = ctypes.c_char_p


class _MapCreateOpts(ctypes.Structure):
    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("btf_fd", _c_u32),
        ("btf_key_type_id", _c_u32),
        ("btf_value_type_id", _c_u32),
        ("btf_vmlinux_value_type_id", _c_u32),
        ("inner_map_fd", _c_u32),
        ("map_flags", _c_u32),
        ("map_extra", _c_u64),
        ("numa_node", _c_u32),
        ("map_ifindex", _c_u32),
    ]


class _BatchOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("elem_flags", _c_u64), ("flags", _c_u64)]


class _BtfLoadOpts(ctypes.Structure):
    """struct bpf_btf_load_opts (libbpf 1.1): where the kernel writes its BTF verifier log."""

    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("log_buf", ctypes.c_void_p),
        ("log_level", _c_u32),
        ("log_size", _c_u32),
    ]


# struct bpf_map_info prefix: type, id, key_size, value_size, max_entries, map_flags,
# name[16], ifindex, btf_vmlinux_value_type_id, netns_dev, netns_ino, btf_id,
# btf_key_type_id, btf_value_type_id.
_MAP_INFO = struct.Struct("<6I16sIIQQIII")
_MAP_INFO_LEN = 80


class _TcHook(ctypes.Structure):
    """struct bpf_tc_hook."""

    _fields_ = [("sz", ctypes.c_size_t), ("ifindex", ctypes.c_int),
                ("attach_point", ctypes.c_int), ("parent", _c_u32)]


class _TcOpts(ctypes.Structure):
    """struct bpf_tc_opts."""

    _fields_ = [("sz", ctypes.c_size_t), ("prog_fd", ctypes.c_int), ("flags", _c_u32),
                ("prog_id", _c_u32), ("handle", _c_u32), ("priority", _c_u32)]


class LibBpfUnavailable(StatewrightError, OSError):
    """libbpf.so.1 could not be loaded (package libbpf1 missing)."""


class _Lib:
    """Loaded libbpf with typed function prototypes."""

    def __init__(self) -> None:
        path = ctypes.util.find_library("bpf") or LIBBPF_SONAME
        try:
            lib = ctypes.CDLL(LIBBPF_SONAME)
        except OSError:
            try:
                lib = ctypes.CDLL(path)
            except OSError as exc:
                raise LibBpfUnavailable(
                    errno.ENOENT, f"cannot load {LIBBPF_SONAME} (install libbpf1): {exc}"
                ) from exc
        self.lib = lib
        self._declare_map_calls(lib)
        # Object/program/link API (bpf/datapath.py). Calls returning pointers report
        # failures through errno, so they go through a handle that saves errno.
        self._declare_object_calls(ctypes.CDLL(lib._name, use_errno=True))

    def _declare_map_calls(self, lib: ctypes.CDLL) -> None:
        """The map calls (bpf/kernel_map.py), with their prototypes."""

        def proto(name: str, restype: Any, *argtypes: Any) -> Any:
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = list(argtypes)
            return fn

        self.map_create = proto(
            "bpf_map_create",
            _c_int,
            _c_int,
            _c_char_p,
            _c_u32,
            _c_u32,
            _c_u32,
            ctypes.POINTER(_MapCreateOpts),
        )
        # Hot-path element calls are declared without argtypes: ctypes then passes an
        # int fd, bytes/buffers/None as pointers and a c_uint64 flag object as is, which
        # saves about a third of the per-call cost. Callers pass exactly those types
        # (flags via update_flags()).
        self.update_elem = proto("bpf_map_update_elem", _c_int)
        self.update_elem.argtypes = None
        self.lookup_elem = proto("bpf_map_lookup_elem", _c_int)
        self.lookup_elem.argtypes = None
        self.delete_elem = proto("bpf_map_delete_elem", _c_int)
        self.delete_elem.argtypes = None
        self.get_next_key = proto("bpf_map_get_next_key", _c_int)
        self.get_next_key.argtypes = None
        self.update_batch = proto(
            "bpf_map_update_batch",
            _c_int,
            _c_int,
            _c_void_p,
            _c_void_p,
            ctypes.POINTER(_c_u32),
            ctypes.POINTER(_BatchOpts),
        )
        self.delete_batch = proto(
            "bpf_map_delete_batch",
            _c_int,
            _c_int,
            _c_void_p,
            ctypes.POINTER(_c_u32),
            ctypes.POINTER(_BatchOpts),
        )
        self.lookup_batch = proto(
            "bpf_map_lookup_batch",
            _c_int,
            _c_int,
            _c_void_p,
            _c_void_p,
            _c_void_p,
            _c_void_p,
            ctypes.POINTER(_c_u32),
            ctypes.POINTER(_BatchOpts),
        )
        self.obj_pin = proto("bpf_obj_pin", _c_int, _c_int, _c_char_p)
        self.obj_get = proto("bpf_obj_get", _c_int, _c_char_p)
        self.map_get_fd_by_id = proto("bpf_map_get_fd_by_id", _c_int, _c_u32)
        self.obj_get_info_by_fd = proto(
            "bpf_obj_get_info_by_fd", _c_int, _c_int, _c_void_p, ctypes.POINTER(_c_u32)
        )

    def _declare_object_calls(self, elib: ctypes.CDLL) -> None:
        """The object, program, link and BTF calls (bpf/datapath.py, bpf/btf.py), on a
        handle that saves errno."""

        def eproto(name: str, restype: Any, *argtypes: Any) -> Any:
            fn = getattr(elib, name)
            fn.restype = restype
            fn.argtypes = list(argtypes)
            return fn

        self.object_open_file = eproto("bpf_object__open_file", _c_void_p, _c_char_p, _c_void_p)
        self.object_load = eproto("bpf_object__load", _c_int, _c_void_p)
        self.object_close = eproto("bpf_object__close", None, _c_void_p)
        self.object_find_map = eproto(
            "bpf_object__find_map_by_name", _c_void_p, _c_void_p, _c_char_p
        )
        self.object_next_map = eproto("bpf_object__next_map", _c_void_p, _c_void_p, _c_void_p)
        self.object_next_program = eproto(
            "bpf_object__next_program", _c_void_p, _c_void_p, _c_void_p
        )
        self.map_name = eproto("bpf_map__name", _c_char_p, _c_void_p)
        self.map_reuse_fd = eproto("bpf_map__reuse_fd", _c_int, _c_void_p, _c_int)
        self.map_set_pin_path = eproto("bpf_map__set_pin_path", _c_int, _c_void_p, _c_char_p)
        self.map_set_initial_value = eproto(
            "bpf_map__set_initial_value", _c_int, _c_void_p, _c_char_p, ctypes.c_size_t
        )
        self.program_name = eproto("bpf_program__name", _c_char_p, _c_void_p)
        self.program_section = eproto("bpf_program__section_name", _c_char_p, _c_void_p)
        self.program_fd = eproto("bpf_program__fd", _c_int, _c_void_p)
        self.program_attach_cgroup = eproto(
            "bpf_program__attach_cgroup", _c_void_p, _c_void_p, _c_int
        )
        self.link_fd = eproto("bpf_link__fd", _c_int, _c_void_p)
        self.link_disconnect = eproto("bpf_link__disconnect", None, _c_void_p)
        self.link_destroy = eproto("bpf_link__destroy", _c_int, _c_void_p)
        self.link_update = eproto("bpf_link_update", _c_int, _c_int, _c_int, _c_void_p)
        self.link_detach = eproto("bpf_link_detach", _c_int, _c_int)
        self.link_create = eproto("bpf_link_create", _c_int, _c_int, _c_int, _c_int, _c_void_p)
        # clsact tc filters (bpf/tc_programs.py, kernels without tcx).
        self.tc_hook_create = eproto("bpf_tc_hook_create", _c_int, ctypes.POINTER(_TcHook))
        self.tc_attach = eproto(
            "bpf_tc_attach", _c_int, ctypes.POINTER(_TcHook), ctypes.POINTER(_TcOpts)
        )
        self.tc_detach = eproto(
            "bpf_tc_detach", _c_int, ctypes.POINTER(_TcHook), ctypes.POINTER(_TcOpts)
        )
        self.tc_query = eproto(
            "bpf_tc_query", _c_int, ctypes.POINTER(_TcHook), ctypes.POINTER(_TcOpts)
        )
        # BTF (bpf/btf.py): libbpf parses the compiled types and appends array types;
        # the kernel loads the raw blob.
        self.object_btf = eproto("bpf_object__btf", _c_void_p, _c_void_p)
        self.btf_new = eproto("btf__new", _c_void_p, _c_void_p, _c_u32)
        self.btf_free = eproto("btf__free", None, _c_void_p)
        self.btf_type_cnt = eproto("btf__type_cnt", _c_u32, _c_void_p)
        self.btf_find_by_name_kind = eproto(
            "btf__find_by_name_kind", ctypes.c_int32, _c_void_p, _c_char_p, _c_u32
        )
        self.btf_resolve_size = eproto("btf__resolve_size", ctypes.c_int64, _c_void_p, _c_u32)
        self.btf_add_array = eproto("btf__add_array", _c_int, _c_void_p, _c_int, _c_int, _c_u32)
        self.btf_raw_data = eproto("btf__raw_data", _c_void_p, _c_void_p, ctypes.POINTER(_c_u32))
        self.btf_load = eproto(
            "bpf_btf_load", _c_int, _c_void_p, ctypes.c_size_t, ctypes.POINTER(_BtfLoadOpts)
        )


@cache
def lib() -> _Lib:
    """The loaded library (raises LibBpfUnavailable once per process if missing)."""
    return _Lib()


_UPDATE_FLAGS = tuple(_c_u64(i) for i in range(8))


def update_flags(flags: int) -> Any:
    """The u64 flags argument for update_elem (cached for the common values)."""
    if 0 <= flags < len(_UPDATE_FLAGS):
        return _UPDATE_FLAGS[flags]
    return _c_u64(flags)


def new_buffer(size: int) -> Buffer:
    """A zeroed, reusable C buffer (``.raw`` gives its bytes)."""
    return ctypes.create_string_buffer(size)


def map_create(
    map_type: int,
    name: str,
    key_size: int,
    value_size: int,
    max_entries: int,
    flags: int,
    inner_map_fd: int = 0,
    btf_fd: int = 0,
    btf_key_type_id: int = 0,
    btf_value_type_id: int = 0,
) -> int:
    """Create a map; returns its fd or -errno. Kernel names are cut to 15 characters.

    With ``btf_fd`` (a loaded BTF object, see ``btf_load``) and the two type ids the
    kernel checks the types' sizes against the key and value sizes and keeps them with
    the map, so tools such as bpftool print entries as the C types.
    """
    opts = _MapCreateOpts(sz=ctypes.sizeof(_MapCreateOpts), map_flags=flags)
    opts.inner_map_fd = inner_map_fd
    opts.btf_fd = btf_fd
    opts.btf_key_type_id = btf_key_type_id
    opts.btf_value_type_id = btf_value_type_id
    kname = name[:15].encode()
    fd: int = lib().map_create(map_type, kname, key_size, value_size, max_entries, opts)
    return fd


def obj_pin(fd: int, path: str) -> int:
    """Pin ``fd`` at ``path`` on bpffs; 0 or -errno."""
    ret: int = lib().obj_pin(fd, os.fsencode(path))
    return ret


def obj_get(path: str) -> int:
    """Open the object pinned at ``path``; fd or -errno."""
    fd: int = lib().obj_get(os.fsencode(path))
    return fd


def map_fd_by_id(map_id: int) -> int:
    """Open a map by kernel id (inner maps of map-in-map); fd or -errno."""
    fd: int = lib().map_get_fd_by_id(map_id)
    return fd


def map_info(fd: int) -> tuple[int, int, int, int, int, int, str, int] | int:
    """(type, id, key_size, value_size, max_entries, flags, name, btf_id) of a map fd, or
    -errno. ``btf_id`` is 0 for a map created without BTF."""
    buf = ctypes.create_string_buffer(_MAP_INFO_LEN)
    length = _c_u32(_MAP_INFO_LEN)
    ret: int = lib().obj_get_info_by_fd(fd, buf, ctypes.byref(length))
    if ret < 0:
        return ret
    mtype, mid, ksz, vsz, maxe, flags, name, *_, btf_id, _, _ = _MAP_INFO.unpack_from(buf.raw)
    text = name.rstrip(b"\0").decode(errors="replace")
    return mtype, mid, ksz, vsz, maxe, flags, text, btf_id


class BatchCall:
    """Reusable argument block for the batch syscalls (count in/out and element flags)."""

    def __init__(self) -> None:
        self._count = _c_u32(0)
        self._count_ref = ctypes.byref(self._count)
        self._opts = _BatchOpts(sz=ctypes.sizeof(_BatchOpts))
        self._opts_ref = ctypes.byref(self._opts)

    def update(
        self, fd: int, keys: bytes, values: bytes, count: int, elem_flags: int
    ) -> tuple[int, int]:
        """bpf_map_update_batch: (0 or -errno, elements applied)."""
        self._count.value = count
        self._opts.elem_flags = elem_flags
        ret: int = lib().update_batch(fd, keys, values, self._count_ref, self._opts_ref)
        return ret, self._count.value

    def delete(self, fd: int, keys: bytes, count: int) -> tuple[int, int]:
        """bpf_map_delete_batch: (0 or -errno, elements deleted)."""
        self._count.value = count
        self._opts.elem_flags = 0
        ret: int = lib().delete_batch(fd, keys, self._count_ref, self._opts_ref)
        return ret, self._count.value

    def lookup(
        self,
        fd: int,
        in_token: Buffer | None,
        out_token: Buffer,
        keys: Buffer,
        values: Buffer,
        count: int,
    ) -> tuple[int, int]:
        """bpf_map_lookup_batch: (0 or -errno, elements returned). -ENOENT marks the end."""
        self._count.value = count
        self._opts.elem_flags = 0
        ret: int = lib().lookup_batch(
            fd, in_token, out_token, keys, values, self._count_ref, self._opts_ref
        )
        return ret, self._count.value


# -- objects, programs and links (bpf/datapath.py) ------------------------------------

# struct bpf_link_info prefix: type, id, prog_id, pad, then for cgroup links
# cgroup_id (u64) and attach_type.
_LINK_INFO = struct.Struct("<3I4xQI")
_LINK_INFO_LEN = 40


def _errno_result(ptr: int | None) -> int:
    """The pointer, or -errno when libbpf returned NULL."""
    if ptr:
        return ptr
    return -(ctypes.get_errno() or errno.EINVAL)


def object_open(path: str) -> int:
    """bpf_object__open_file: an object pointer (as int) or -errno."""
    ctypes.set_errno(0)
    return _errno_result(lib().object_open_file(os.fsencode(path), None))


def object_load(obj: int) -> int:
    """bpf_object__load: 0 or -errno (libbpf prints a rejected program's verifier log)."""
    ret: int = lib().object_load(obj)
    return ret


def object_close(obj: int) -> None:
    """bpf_object__close: frees the object and closes its map and program fds."""
    lib().object_close(obj)


def object_maps(obj: int) -> list[tuple[str, int]]:
    """(name, map pointer) of every map of an opened object."""
    out: list[tuple[str, int]] = []
    m = lib().object_next_map(obj, None)
    while m:
        out.append((lib().map_name(m).decode(), m))
        m = lib().object_next_map(obj, m)
    return out


def object_programs(obj: int) -> list[tuple[str, str, int]]:
    """(name, section, program pointer) of every program of an opened object."""
    out: list[tuple[str, str, int]] = []
    p = lib().object_next_program(obj, None)
    while p:
        out.append((lib().program_name(p).decode(), lib().program_section(p).decode(), p))
        p = lib().object_next_program(obj, p)
    return out


def map_reuse_fd(map_ptr: int, fd: int) -> int:
    """bpf_map__reuse_fd (libbpf dups ``fd``): 0 or -errno."""
    ret: int = lib().map_reuse_fd(map_ptr, fd)
    return ret


def map_set_pin_path(map_ptr: int, path: str) -> int:
    """bpf_map__set_pin_path: reuse the map pinned there at load, else create and pin it."""
    ret: int = lib().map_set_pin_path(map_ptr, os.fsencode(path))
    return ret


def map_set_initial_value(map_ptr: int, data: bytes) -> int:
    """bpf_map__set_initial_value of a global-data map (before load; ``data`` must be
    exactly the section's size): 0 or -errno."""
    ret: int = lib().map_set_initial_value(map_ptr, data, len(data))
    return ret


def program_fd(prog: int) -> int:
    """The fd of a loaded program, or -errno."""
    fd: int = lib().program_fd(prog)
    return fd


def program_attach_cgroup(prog: int, cgroup_fd: int) -> int:
    """bpf_program__attach_cgroup, then keep only the link's fd: a new link fd or -errno.

    The libbpf link object is disconnected and freed, so closing the returned fd is all
    that is left to do (the link lives on while pinned or while the fd is open).
    """
    ctypes.set_errno(0)
    link = _errno_result(lib().program_attach_cgroup(prog, cgroup_fd))
    if link < 0:
        return link
    try:
        fd = os.dup(lib().link_fd(link))
    except OSError as exc:
        fd = -(exc.errno or errno.EBADF)
    lib().link_disconnect(link)
    lib().link_destroy(link)
    return fd


def link_create(prog_fd: int, target_fd: int, attach_type: int) -> int:
    """bpf_link_create without options (e.g. a tcx link: ``target_fd`` is the ifindex):
    a new link fd or -errno."""
    ret: int = lib().link_create(prog_fd, target_fd, attach_type, None)
    return ret


def link_update(link_fd: int, prog_fd: int) -> int:
    """bpf_link_update: swap the link's program atomically; 0 or -errno."""
    ret: int = lib().link_update(link_fd, prog_fd, None)
    return ret


def link_detach(link_fd: int) -> int:
    """bpf_link_detach: detach the link now, whoever else holds it; 0 or -errno."""
    ret: int = lib().link_detach(link_fd)
    return ret


def link_info(fd: int) -> tuple[int, int, int, int, int] | int:
    """(type, id, prog_id, cgroup_id, attach_type) of a link fd, or -errno."""
    buf = ctypes.create_string_buffer(_LINK_INFO_LEN)
    length = _c_u32(_LINK_INFO_LEN)
    ret: int = lib().obj_get_info_by_fd(fd, buf, ctypes.byref(length))
    if ret < 0:
        return ret
    ltype, lid, prog_id, cgroup_id, attach_type = _LINK_INFO.unpack_from(buf.raw)
    return ltype, lid, prog_id, cgroup_id, attach_type


# -- BTF (bpf/btf.py) -----------------------------------------------------------------

#: enum btf_kind values used to find types by name.
BTF_KIND_INT = 1
BTF_KIND_STRUCT = 4
BTF_KIND_UNION = 5
BTF_KIND_TYPEDEF = 8


def object_btf(obj: int) -> int:
    """bpf_object__btf of an opened object: its ``struct btf`` pointer (owned by the
    object, valid until ``object_close``), or 0 when the object has no BTF."""
    ptr: int | None = lib().object_btf(obj)
    return ptr or 0


def btf_new(data: bytes) -> int:
    """btf__new: a ``struct btf`` pointer (as int, free it with ``btf_free``) parsed from
    a raw BTF blob (copied), or -errno."""
    ctypes.set_errno(0)
    return _errno_result(lib().btf_new(data, len(data)))


def btf_free(btf: int) -> None:
    """btf__free."""
    lib().btf_free(btf)


def btf_type_count(btf: int) -> int:
    """btf__type_cnt: the number of types, counting the void type (id 0)."""
    n: int = lib().btf_type_cnt(btf)
    return n


def btf_find(btf: int, name: str, kind: int) -> int:
    """btf__find_by_name_kind: the id of the type ``name`` of ``kind``, or -errno
    (-ENOENT when there is none)."""
    ret: int = lib().btf_find_by_name_kind(btf, name.encode(), kind)
    return ret


def btf_resolve_size(btf: int, type_id: int) -> int:
    """btf__resolve_size: the size in bytes of a type (typedefs followed), or -errno."""
    ret: int = lib().btf_resolve_size(btf, type_id)
    return ret


def btf_add_array(btf: int, index_type_id: int, elem_type_id: int, nr_elems: int) -> int:
    """btf__add_array: append ``elem[nr_elems]``; the new type id or -errno."""
    ret: int = lib().btf_add_array(btf, index_type_id, elem_type_id, nr_elems)
    return ret


def btf_raw_data(btf: int) -> bytes | int:
    """btf__raw_data: the BTF blob as the kernel loads it (header, types, strings),
    or -errno."""
    size = _c_u32(0)
    ctypes.set_errno(0)
    ptr = lib().btf_raw_data(btf, ctypes.byref(size))
    if not ptr:
        return -(ctypes.get_errno() or errno.ENOMEM)
    return ctypes.string_at(ptr, size.value)


def btf_load(data: bytes, log_size: int = 0) -> tuple[int, str]:
    """bpf_btf_load: (a new BTF object fd or -errno, the kernel's log). With ``log_size``
    the kernel writes its reasons for rejecting the blob into a buffer of that size."""
    opts = _BtfLoadOpts(sz=ctypes.sizeof(_BtfLoadOpts))
    log = ctypes.create_string_buffer(log_size) if log_size else None
    if log is not None:
        opts.log_buf = ctypes.cast(log, ctypes.c_void_p)
        opts.log_size = log_size
        opts.log_level = 1
    fd: int = lib().btf_load(data, len(data), ctypes.byref(opts))
    text = log.value.decode(errors="replace").strip() if log is not None else ""
    return fd, text


# -- clsact tc filters --------------------------------------------------------------------

#: Enough of struct bpf_prog_info for its type and id.
_PROG_INFO_LEN = 16
#: enum bpf_tc_attach_point.
TC_INGRESS = 1
TC_EGRESS = 2
_TC_F_REPLACE = 1


def _tc_hook(ifindex: int, point: int) -> _TcHook:
    return _TcHook(ctypes.sizeof(_TcHook), ifindex, point, 0)


def tc_attach(ifindex: int, point: int, prog_fd: int, handle: int, priority: int) -> int:
    """Create the device's clsact qdisc when missing and attach (or replace) the
    direct-action filter ``handle``/``priority`` at ``point`` (`TC_INGRESS` or
    `TC_EGRESS`) running ``prog_fd``: 0 or -errno."""
    hook = _tc_hook(ifindex, point)
    ret: int = lib().tc_hook_create(ctypes.byref(hook))
    if ret < 0 and ret != -errno.EEXIST:
        return ret
    opts = _TcOpts(ctypes.sizeof(_TcOpts), prog_fd, _TC_F_REPLACE, 0, handle, priority)
    ret = lib().tc_attach(ctypes.byref(hook), ctypes.byref(opts))
    return ret


def tc_query(ifindex: int, point: int, handle: int, priority: int) -> int:
    """The id of the program of filter ``handle``/``priority``, or -errno (-ENOENT:
    no such filter)."""
    hook = _tc_hook(ifindex, point)
    opts = _TcOpts(ctypes.sizeof(_TcOpts), 0, 0, 0, handle, priority)
    ret: int = lib().tc_query(ctypes.byref(hook), ctypes.byref(opts))
    return ret if ret < 0 else int(opts.prog_id)


def prog_id(fd: int) -> int:
    """The kernel id of the program ``fd`` refers to, or -errno."""
    buf = ctypes.create_string_buffer(_PROG_INFO_LEN)
    length = _c_u32(_PROG_INFO_LEN)
    ret: int = lib().obj_get_info_by_fd(fd, buf, ctypes.byref(length))
    if ret < 0:
        return ret
    return int.from_bytes(buf.raw[4:8], sys.byteorder)


def tc_detach(ifindex: int, point: int, handle: int, priority: int) -> int:
    """Remove the filter ``handle``/``priority`` (the qdisc stays): 0 or -errno."""
    hook = _tc_hook(ifindex, point)
    opts = _TcOpts(ctypes.sizeof(_TcOpts), 0, 0, 0, handle, priority)
    ret: int = lib().tc_detach(ctypes.byref(hook), ctypes.byref(opts))
    return ret
