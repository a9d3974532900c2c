"""The manifest source: Kubernetes objects from YAML/JSON files, kept in the LB tables.

Point it at directories and/or files. Each ``.yaml``/``.yml``/``.json`` file may
hold several objects (multi-document YAML, a JSON array, or a ``List`` with
``items``). Services, EndpointSlices and Pods are converted by
`sources.k8s_convert.K8sConverter`. Well-known Kubernetes kinds the agent does
not consume (`IGNORED_KINDS`: Deployment, ConfigMap, Namespace, ...) are skipped
with an info log and counted (`SyncResult.ignored`, `ManifestSource.ignored`);
any other kind (a typo such as ``Servce``) is an error.

`ManifestSource.sync` polls once: files that appeared, changed (size, mtime or
content) or disappeared are applied file by file, each in one write
transaction, so a file's valid objects change together. Objects are applied one
by one as ``kubectl apply`` does:

* A file that cannot be read or parsed (not UTF-8, a YAML/JSON syntax error,
  reported with its line and column) changes nothing: its previous objects stay
  in the tables.
* An invalid object (a bad field, a missing name, an unknown kind, defined
  twice in its file) is reported on its own; the file's other objects apply, and
  the object's previous version, if one applied, stays in the tables.
* Conflicts: an object (kind, namespace/name) belongs to the first file that
  applied it; the same object in another file is an error of that other file
  (``already defined in``) until the owner drops it. A Service whose frontend
  address belongs to another service is an error of the later Service
  (`tables.lb_writer.FrontendConflictError`). A file with such an error is
  looked at again on every poll, so its objects apply once the conflict is gone;
  an error in a file's own content (syntax, a bad field, an unknown kind) waits
  for the file to change.

`ManifestSource.errors` maps each problem to its full message, naming the file
and, for an object, its kind, namespace/name and field. The key is the file
path for a file that cannot be read or parsed, and ``path#Kind/namespace/name``
(``path#N``, the object's position, when the object has no usable kind or name)
for an object. An error is logged once when it appears; it disappears when the
file or object is fixed or removed. Only `InputError` (bad input) is reported
this way: any other exception is a bug and propagates out of `sync`.

`ManifestSource.run` polls every ``interval`` seconds (anyio task); this is the
agent's embedded default source.

Other kinds join through `ManifestSource.add_kind_handler` (a `KindHandler`: the policy
component's NetworkPolicy and CiliumNetworkPolicy): their objects are applied in the same
write transaction as the file's other objects (the handler's tables are locked with the
LB tables), after the LB kinds, with the same per-object error reporting. Until a
handler is added, its kinds are skipped as ignored kinds.
"""

from __future__ import annotations

import hashlib
import json
import logging
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio
import yaml

from sources.k8s_convert import (
    KIND_ENDPOINT_SLICE,
    KIND_POD,
    KIND_SERVICE,
    ConversionError,
    K8sConverter,
    namespaced_name,
    object_kind,
)
from statedb import InputError, Table, WriteTxn
from tables.lb_writer import LBWriter
from tables.origins import SOURCE_MANIFESTS, OriginRecorder

log = logging.getLogger(__name__)

#: libyaml's loader when PyYAML has it (about ten times faster on large files), else the
#: pure-Python one; both keep line and column marks.
_SafeLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

#: File name suffixes read by the source.
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")

#: Order in which kinds are applied (services before their endpoints).
_KIND_ORDER = {KIND_SERVICE: 0, KIND_ENDPOINT_SLICE: 1, KIND_POD: 2}

#: Well-known Kubernetes kinds the agent does not consume: skipped, counted, logged at info.
IGNORED_KINDS = frozenset(
    {
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "CronJob",
        "DaemonSet",
        "Deployment",
        "Endpoints",
        "HorizontalPodAutoscaler",
        "Ingress",
        "CiliumNetworkPolicy",
        "Job",
        "Namespace",
        "NetworkPolicy",
        "PersistentVolumeClaim",
        "PodDisruptionBudget",
        "ReplicaSet",
        "Role",
        "RoleBinding",
        "Secret",
        "ServiceAccount",
        "StatefulSet",
    }
)

#: (kind, namespace/name) of an object.
ObjectKey = tuple[str, str]


class KindHandler(Protocol):
    """Applies the objects of further kinds (``kinds``) into its own ``tables``."""

    kinds: tuple[str, ...]

    @property
    def tables(self) -> tuple[Table[Any], ...]:
        """The tables the write transaction must lock besides the LB tables."""
        ...

    def check(self, obj: Mapping[str, Any]) -> None:
        """Raise InputError when ``obj`` is invalid; write nothing."""
        ...

    def upsert(self, txn: WriteTxn, obj: Mapping[str, Any]) -> None:
        """Apply ``obj`` (InputError before writing anything when it is invalid)."""
        ...

    def delete(self, txn: WriteTxn, obj: Mapping[str, Any]) -> None:
        """Remove ``obj``."""
        ...


class ManifestError(InputError):
    """A manifest file cannot be read or parsed, or one object in it is malformed.

    ``obj`` (and ``path``) is the file, ``field`` where in it (``line 3, column 5``,
    ``object 2 (line 14)``; may be empty), ``message`` what is wrong.
    """

    def __init__(self, path: Path | str, message: str, *, field: str = "") -> None:
        super().__init__(message, obj=str(path), field=field)
        self.path = str(path)


@dataclass(frozen=True, slots=True)
class ManifestObject:
    """One document of a manifest file (or one item of a ``List``), as parsed.

    ``value`` is whatever the document holds (it may not even be a mapping);
    ``index`` is its position among the file's objects, ``line`` the 1-based line
    it starts on (0 when unknown, e.g. in JSON)."""

    index: int
    line: int
    value: Any

    @property
    def where(self) -> str:
        """``object N`` or ``object N (line L)``, for messages."""
        return f"object {self.index} (line {self.line})" if self.line else f"object {self.index}"


@dataclass(slots=True)
class SyncResult:
    """What one `ManifestSource.sync` did.

    ``applied``: files whose objects were (at least partly) written; ``removed``:
    files that disappeared and whose objects were deleted; ``failed``: the current
    errors (key -> message, as in `ManifestSource.errors`) of the files looked at;
    ``ignored``: objects of `IGNORED_KINDS` in the files looked at."""

    applied: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    ignored: int = 0

    @property
    def changed(self) -> bool:
        """True when some file was applied or removed."""
        return bool(self.applied or self.removed)


@dataclass(slots=True)
class _FileState:
    """A file as last read: its digest, how many of its objects were ignored, and how many
    objects it held (-1: it could not be parsed; its earlier objects stay applied)."""

    digest: str
    ignored: int
    objects: int = 0


# ----- parsing -------------------------------------------------------------------------------
def _mark_text(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


def describe_yaml_error(e: yaml.YAMLError) -> tuple[str, str]:
    """(where, what) of a YAML error: ``line 3, column 5`` ("" when unknown) and
    ``cannot parse YAML: <problem> (<context> at line 2, column 1)``.

    PyYAML's own message names ``"<unicode string>"`` and spans several lines; the
    caller puts the file name in front of these."""
    if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        problem = e.problem or "invalid YAML"
        if e.context:
            problem += f" ({e.context}"
            if e.context_mark is not None:
                problem += f" at {_mark_text(e.context_mark)}"
            problem += ")"
        return _mark_text(e.problem_mark), f"cannot parse YAML: {problem}"
    return "", f"cannot parse YAML: {' '.join(str(e).split())}"


def _list_item_lines(node: yaml.Node, count: int) -> list[int]:
    """1-based start lines of the ``items`` of a ``List`` document node (0s if not found)."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if getattr(key, "value", None) == "items" and isinstance(value, yaml.SequenceNode):
                lines = [item.start_mark.line + 1 for item in value.value]
                if len(lines) == count:
                    return lines
    return [0] * count


def _is_list(doc: Mapping[str, Any]) -> bool:
    kind = doc.get("kind")
    return kind == "List" or (isinstance(kind, str) and kind.endswith("List") and "items" in doc)


def _yaml_documents(text: str, loader_class: Any) -> list[tuple[int, Any, yaml.Node | None]]:
    """Every YAML document of ``text`` as (first line, data, node)."""
    docs: list[tuple[int, Any, yaml.Node | None]] = []
    loader = loader_class(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                break
            docs.append((node.start_mark.line + 1, loader.construct_document(node), node))
    finally:
        loader.dispose()
    return docs


def parse_manifest_objects(text: str, path: Path | str = "<text>") -> list[ManifestObject]:
    """Parse a manifest file's text into its objects (``List`` items flattened).

    Raise `ManifestError` naming the file, line and column when the text is not
    valid YAML/JSON or a ``List``'s ``items`` is not a list: nothing in such a file
    can be trusted. Documents that are not objects are returned as they are (the
    caller reports them one by one); empty documents are skipped."""
    p = str(path)
    docs: list[tuple[int, Any, yaml.Node | None]] = []
    if p.endswith(".json"):
        try:
            data = json.loads(text) if text.strip() else None
        except json.JSONDecodeError as e:
            raise ManifestError(
                path, f"cannot parse JSON: {e.msg}", field=f"line {e.lineno}, column {e.colno}"
            ) from None
        docs = [(0, d, None) for d in (data if isinstance(data, list) else [data])]
    else:
        try:
            docs = _yaml_documents(text, _SafeLoader)
        except yaml.YAMLError as fast_error:
            # libyaml and PyYAML word errors differently; report PyYAML's wording (what
            # the project documents) by parsing the broken file once more with it.
            error = fast_error
            try:
                _yaml_documents(text, yaml.SafeLoader)
            except yaml.YAMLError as e:
                error = e
            where, what = describe_yaml_error(error)
            raise ManifestError(path, what, field=where) from None
    out: list[ManifestObject] = []
    for i, (line, doc, node) in enumerate(docs):
        if doc is None:
            continue
        if isinstance(doc, Mapping) and _is_list(doc):
            items = doc.get("items") or []
            if not isinstance(items, list):
                where = f"document {i} (line {line})" if line else f"document {i}"
                raise ManifestError(path, "expected a list", field=f"{where}: items")
            lines = _list_item_lines(node, len(items)) if node is not None else [0] * len(items)
            for item, item_line in zip(items, lines, strict=True):
                out.append(ManifestObject(len(out), item_line, item))
            continue
        out.append(ManifestObject(len(out), line, doc))
    return out


def parse_manifest_text(text: str, path: Path | str = "<text>") -> list[Mapping[str, Any]]:
    """Parse a manifest file's text into its objects; raise ManifestError naming the file
    (and the object) for a syntax error or a document that is not an object."""
    out: list[Mapping[str, Any]] = []
    for o in parse_manifest_objects(text, path):
        if not isinstance(o.value, Mapping):
            raise ManifestError(
                path, f"expected an object, got {type(o.value).__name__}", field=o.where
            )
        out.append(o.value)
    return out


# ----- the source ---------------------------------------------------------------------------
@dataclass(slots=True)
class _Checked:
    """A parsed file sorted out: the objects to apply, the ignored ones, the errors."""

    desired: dict[ObjectKey, Mapping[str, Any]] = field(default_factory=dict)
    #: Objects of the file that are invalid: their applied version (if any) must stay.
    invalid: set[ObjectKey] = field(default_factory=set)
    errors: dict[str, str] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)
    #: The line each object to apply starts on (0 when unknown: JSON).
    lines: dict[ObjectKey, int] = field(default_factory=dict)
    #: Some error depends on another file (an object already defined there).
    retry: bool = False


class ManifestSource:
    """Keeps the LB tables equal to the objects in a set of manifest files and directories."""

    def __init__(
        self,
        writer: LBWriter,
        paths: Iterable[str | Path],
        *,
        interval: float = 1.0,
        converter: K8sConverter | None = None,
        on_error: Callable[[str, str], None] | None = None,
    ) -> None:
        self.writer = writer
        self.paths = [Path(p) for p in paths]
        if interval <= 0:
            raise ValueError(f"manifest source: interval must be > 0, got {interval}")
        self.interval = interval
        self.converter = converter if converter is not None else K8sConverter(writer)
        #: Called with (key, message) when an error appears or its message changes.
        self.on_error = on_error
        self.synced = False
        self._errors: dict[str, str] = {}
        #: A copy of ``_errors`` replaced whole after each change, so that readers in other
        #: threads (the agent's health while `sync` runs in a worker thread) never iterate
        #: a dict that is being changed.
        self._errors_view: dict[str, str] = {}
        #: Per file, the keys of its entries in _errors.
        self._error_keys: dict[str, set[str]] = {}
        #: Files to look at again on the next poll even if unchanged: their errors may go
        #: away without the file changing (a conflict with another file, an unreadable file).
        #: Errors in the file's own content (syntax, conversion) wait for it to change.
        self._retry: set[str] = set()
        self._present: list[str] = []
        self._files: dict[str, _FileState] = {}
        self._stats: dict[str, tuple[int, int]] = {}
        #: Applied objects: key -> (file, object as applied).
        self._applied: dict[ObjectKey, tuple[str, Mapping[str, Any]]] = {}
        #: Per file, the keys of the applied objects it owns.
        self._owned: dict[str, set[ObjectKey]] = {}
        self._init_done: Callable[[WriteTxn], None] | None = None
        self._missing: list[str] = []
        #: Further kinds -> their handler (`add_kind_handler`).
        self._handlers: dict[str, KindHandler] = {}
        self._after_sync: list[Callable[[], None]] = []
        #: The line each applied object's origin names (`_record_moved`).
        self._lines: dict[ObjectKey, int] = {}

    def add_kind_handler(
        self, handler: KindHandler, on_synced: Callable[[], None] | None = None
    ) -> None:
        """Apply the objects of ``handler.kinds`` through ``handler`` from the next poll on.
        Every file is read again then, so objects skipped before are applied; ``on_synced``
        is called once that poll is done (the handler's tables hold the files' objects)."""
        for kind in handler.kinds:
            self._handlers[kind] = handler
        self._retry.update(self._files)
        if on_synced is not None:
            self._after_sync.append(on_synced)

    # ----- read-only views --------------------------------------------------------------------
    @property
    def files(self) -> list[str]:
        """The manifest files found by the last poll (the files the source follows), sorted."""
        return list(self._present)

    @property
    def errors(self) -> Mapping[str, str]:
        """Current errors: file path or ``path#Kind/namespace/name`` -> full message."""
        return types.MappingProxyType(self._errors_view)

    @property
    def missing(self) -> list[str]:
        """Configured paths that did not exist at the last poll (a typo, or a directory not
        created yet): nothing is read from them until they appear."""
        return list(self._missing)

    @property
    def supported_kinds(self) -> list[str]:
        """The kinds this source applies: the LB kinds, then those of the kind handlers
        (NetworkPolicy, CiliumNetworkPolicy, Namespace... as the agent registers them)."""
        return list(_KIND_ORDER) + sorted(k for k in self._handlers if k not in _KIND_ORDER)

    @property
    def empty(self) -> list[str]:
        """Followed files that held no object at all when last parsed (empty, or only
        comments): easy to miss, since they apply nothing (or delete what they held)."""
        return sorted(p for p, f in self._files.items() if f.objects == 0)

    @property
    def ignored(self) -> int:
        """Objects of `IGNORED_KINDS` in the followed files (as last parsed)."""
        return sum(f.ignored for f in self._files.values())

    # ----- discovery ----------------------------------------------------------------------
    def discover(self) -> list[Path]:
        """The manifest files currently present (directories scanned recursively), sorted;
        dangling links with a manifest suffix are included, so that they are reported."""
        found: set[Path] = set()
        for p in self.paths:
            if p.is_dir():
                for f in p.rglob("*"):
                    rel = f.relative_to(p)
                    if any(part.startswith(".") for part in rel.parts):
                        continue
                    if f.suffix not in MANIFEST_SUFFIXES:
                        continue
                    # a broken link (or a loop) is kept: reading it fails and is reported
                    if f.is_file() or (f.is_symlink() and not f.exists()):
                        found.add(f)
            elif p.is_file():
                found.add(p)
        return sorted(found)

    # ----- initialization -----------------------------------------------------------------
    def register_initializer(self, txn: WriteTxn) -> None:
        """Keep the LB tables uninitialized until the first `sync` has run."""
        self._init_done = self.writer.register_initializer(txn, "manifests")

    # ----- polling ------------------------------------------------------------------------------
    def sync(self) -> SyncResult:
        """Poll once: apply new/changed files, remove deleted ones; return what happened."""
        result = SyncResult()
        missing = [str(p) for p in self.paths if not p.exists()]
        for name in sorted(set(missing) - set(self._missing)):
            log.warning("manifest source: %s does not exist; nothing is read from it", name)
        for name in sorted(set(self._missing) - set(missing)):
            log.info("manifest source: %s exists now", name)
        self._missing = missing
        present = {str(p): p for p in self.discover()}
        self._present = sorted(present)
        known = set(self._files) | set(self._stats) | set(self._owned) | set(self._error_keys)
        for key in sorted(known - set(present)):
            self._remove_file(key, result)
        for key, path in present.items():
            retry = key in self._retry
            try:
                st = path.stat()
                stat_key = (st.st_mtime_ns, st.st_size)
                if self._stats.get(key) == stat_key and not retry:
                    continue
                data = path.read_bytes()
            except OSError as e:
                err = ManifestError(key, f"cannot read: {e.strerror or e}")
                self._file_failed(key, err, result)
                self._retry.add(key)
                continue
            digest = hashlib.sha256(data).hexdigest()
            prev = self._files.get(key)
            if prev is None or prev.digest != digest or retry:
                self._apply_file(key, data, digest, result)
            # Recorded only now: a bug raising out of _apply_file leaves the file to retry.
            self._stats[key] = stat_key
        if not self.synced:
            self.synced = True
            if self._init_done is not None:
                with self.writer.write_txn() as txn:
                    self._init_done(txn)
                self._init_done = None
        callbacks, self._after_sync = self._after_sync, []
        for cb in callbacks:
            cb()
        return result

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Poll forever, every ``interval`` seconds (cancel the task to stop). Each poll runs
        in a worker thread: reading and parsing large files never holds up the event loop
        (the writer's changes go through statedb write transactions, safe from any thread)."""
        await anyio.to_thread.run_sync(self.sync)
        task_status.started()
        while True:
            await anyio.sleep(self.interval)
            await anyio.to_thread.run_sync(self.sync)

    # ----- errors ---------------------------------------------------------------------------------
    def _set_errors(self, path: str, errors: Mapping[str, str], result: SyncResult) -> None:
        """Make ``errors`` the complete set of ``path``'s errors (log the new ones)."""
        for key in sorted(self._error_keys.pop(path, set()) - errors.keys()):
            del self._errors[key]
            log.info("manifest source: %s: resolved", key)
        for key, message in errors.items():
            if self._errors.get(key) != message:
                log.error("manifest source: %s", message)
                if self.on_error is not None:
                    self.on_error(key, message)
            self._errors[key] = message
        if errors:
            self._error_keys[path] = set(errors)
        self._errors_view = dict(self._errors)
        result.failed.update(errors)

    def _file_failed(self, path: str, err: InputError, result: SyncResult) -> None:
        """The whole file is unusable: one error for it; its applied objects stay."""
        self._set_errors(path, {path: str(err)}, result)

    # ----- applying ------------------------------------------------------------------------------
    def _check(self, path: str, objects: Sequence[ManifestObject]) -> _Checked:
        """Sort a file's objects into those to apply, ignored ones, and errors."""
        out = _Checked()
        seen: set[ObjectKey] = set()
        for o in objects:
            value = o.value
            if not isinstance(value, Mapping):
                err = ManifestError(
                    path, f"expected an object, got {type(value).__name__}", field=o.where
                )
                out.errors[f"{path}#{o.index}"] = str(err)
                continue
            kind = object_kind(value)
            if not kind:
                err = ManifestError(path, "kind: missing or not a string", field=o.where)
                out.errors[f"{path}#{o.index}"] = str(err)
                continue
            try:
                name = namespaced_name(value)
            except ConversionError as e:
                out.errors[f"{path}#{o.index}"] = f"{path}: {o.where}: {e}"
                continue
            okey = (kind, name)
            ref = f"{kind} {name}"
            if kind in IGNORED_KINDS and kind not in self._handlers:
                out.ignored.append(ref)
                continue
            if kind not in _KIND_ORDER and kind not in self._handlers:
                out.errors[_error_key(path, okey)] = (
                    f"{path}: {ref}: kind: unknown kind {kind!r} "
                    f"(supported: {', '.join(self.supported_kinds)}; ignored: well-known kinds "
                    "such as "
                    "Deployment or ConfigMap)"
                )
                continue
            if okey in seen:
                out.errors[_error_key(path, okey)] = (
                    f"{path}: {ref}: defined more than once in the file"
                )
                out.invalid.add(okey)
                out.desired.pop(okey, None)
                continue
            seen.add(okey)
            applied = self._applied.get(okey)
            if applied is not None and applied[0] != path:
                out.retry = True
                out.errors[_error_key(path, okey)] = (
                    f"{path}: {ref}: already defined in {applied[0]}"
                )
                continue
            out.desired[okey] = value
            out.lines[okey] = o.line
        return out

    def _apply_file(self, path: str, data: bytes, digest: str, result: SyncResult) -> None:
        try:
            try:
                text = data.decode()
            except UnicodeDecodeError as e:
                raise ManifestError(path, f"not UTF-8 text (at byte offset {e.start})") from None
            objects = parse_manifest_objects(text, path)
        except ManifestError as e:
            self._file_failed(path, e, result)
            self._retry.discard(path)
            # Remember the bad content's digest: going back to the last good content is a
            # change that is applied again, and clears the error.
            prev = self._files.get(path)
            self._files[path] = _FileState(digest, prev.ignored if prev else 0, -1)
            return
        checked = self._check(path, objects)
        prev = self._files.get(path)
        ignored = checked.ignored
        if ignored and (prev is None or prev.digest != digest):
            log.info(
                "manifest source: %s: ignoring %d object(s) of kinds the agent does not use: %s",
                path,
                len(ignored),
                ", ".join(ignored[:5]) + (", ..." if len(ignored) > 5 else ""),
            )
        result.ignored += len(checked.ignored)

        desired = checked.desired
        owned = self._owned.get(path, set())
        deletes = [k for k in owned if k not in desired and k not in checked.invalid]
        upserts = [k for k in desired if k not in owned or self._applied[k][1] != desired[k]]
        failed = self._apply_objects(deletes, upserts, desired, (path, checked.lines))
        self._record_moved(path, checked.lines, upserts, failed)

        applied_any = False
        for okey in deletes:
            if okey not in failed:
                self._applied.pop(okey, None)
                owned.discard(okey)
                applied_any = True
        for okey in upserts:
            if okey not in failed:
                self._applied[okey] = (path, desired[okey])
                owned.add(okey)
                applied_any = True
        self._files[path] = _FileState(digest, len(checked.ignored), len(objects))
        if owned:
            self._owned[path] = owned
        else:
            self._owned.pop(path, None)
        errors = dict(checked.errors)
        for okey, err in failed.items():
            verb = "removing: " if okey in deletes else ""
            errors[_error_key(path, okey)] = f"{path}: {verb}{_object_message(okey, err)}"
        self._set_errors(path, errors, result)
        # A conversion error is in the object itself; anything else (a frontend conflict, a
        # refused write) may go away when other objects change.
        if checked.retry or any(not isinstance(e, ConversionError) for e in failed.values()):
            self._retry.add(path)
        else:
            self._retry.discard(path)
        if applied_any:
            result.applied.append(path)

    def _remove_file(self, path: str, result: SyncResult) -> None:
        """The file is gone: delete its objects, forget it."""
        self._stats.pop(path, None)
        self._files.pop(path, None)
        self._retry.discard(path)
        owned = self._owned.pop(path, set())
        failed = self._apply_objects(sorted(owned), [], {})
        for okey in owned:
            if okey in failed:
                self._owned.setdefault(path, set()).add(okey)
            else:
                self._applied.pop(okey, None)
        errors = {
            _error_key(path, k): f"{path}: removing: {_object_message(k, e)}"
            for k, e in failed.items()
        }
        self._set_errors(path, errors, result)
        if owned and not failed:
            result.removed.append(path)

    def _record_moved(
        self, path: str, lines: Mapping[ObjectKey, int], upserts: Sequence[ObjectKey],
        failed: Mapping[ObjectKey, InputError],
    ) -> None:
        """Refresh the origins of applied objects that only moved within their file (the
        lines above them changed): their rows are unchanged, their line is not."""
        origins = self.writer.origins
        changed = set(upserts)
        moved = [
            k for k, line in lines.items()
            if k not in changed and k not in failed and self._lines.get(k, line) != line
            and self._applied.get(k, ("",))[0] == path
        ]
        if origins is None or not moved:
            return
        recorder = OriginRecorder(origins)
        with self.writer.db.write_txn(origins) as txn:
            for k in moved:
                recorder.record(txn, self._applied[k][1], SOURCE_MANIFESTS, file=path,
                                line=lines[k])
                self._lines[k] = lines[k]
            txn.commit()

    def _apply_objects(
        self,
        deletes: Sequence[ObjectKey],
        upserts: Sequence[ObjectKey],
        desired: Mapping[ObjectKey, Mapping[str, Any]],
        where: tuple[str, Mapping[ObjectKey, int]] = ("", {}),
    ) -> dict[ObjectKey, InputError]:
        """Delete and upsert objects in one write txn; return the objects that failed.

        An object raising `InputError` is left out and the rest retried; when the
        first attempt fails, every remaining upsert is first converted without
        writing, so that all the conversion errors cost one more attempt, not one
        each."""
        failed: dict[ObjectKey, InputError] = {}
        validated = False
        while True:
            dels = _ordered([k for k in deletes if k not in failed], reverse=True)
            ups = _ordered([k for k in upserts if k not in failed])
            if not dels and not ups:
                return failed
            bad = self._try_apply(dels, ups, desired, where)
            if bad is None:
                return failed
            failed[bad[0]] = bad[1]
            if not validated:
                validated = True
                for okey in ups:
                    if okey not in failed:
                        try:
                            handler = self._handlers.get(okey[0])
                            if handler is not None:
                                handler.check(desired[okey])
                            else:
                                self.converter.check(desired[okey])
                        except InputError as e:
                            failed[okey] = e

    def _try_apply(
        self,
        deletes: Sequence[ObjectKey],
        upserts: Sequence[ObjectKey],
        desired: Mapping[ObjectKey, Mapping[str, Any]],
        where: tuple[str, Mapping[ObjectKey, int]] = ("", {}),
    ) -> tuple[ObjectKey, InputError] | None:
        """Apply all in one txn and commit; on an InputError roll back and return it.
        Each object's origin (``where``: its file and line) is written with it."""
        conv = self.converter
        recorder = None if self.writer.origins is None else OriginRecorder(self.writer.origins)
        path, lines = where
        checkpoint = conv.checkpoint()
        extra = {t for h in self._handlers.values() for t in h.tables}
        txn = self.writer.db.write_txn(*self.writer.txn_tables, *extra) if extra else (
            self.writer.write_txn()
        )
        okey: ObjectKey | None = None
        try:
            for okey in deletes:
                handler = self._handlers.get(okey[0])
                (handler or conv).delete(txn, self._applied[okey][1])
                if recorder is not None:
                    recorder.forget(txn, self._applied[okey][1])
            for okey in upserts:
                handler = self._handlers.get(okey[0])
                (handler or conv).upsert(txn, desired[okey])
                if recorder is not None:
                    recorder.record(txn, desired[okey], SOURCE_MANIFESTS, file=path,
                                    line=lines.get(okey, 0))
        except InputError as e:
            txn.abort()
            conv.rollback(checkpoint)
            assert okey is not None
            return okey, e
        except BaseException:
            txn.abort()
            conv.rollback(checkpoint)
            raise
        txn.commit()
        for okey in deletes:
            self._lines.pop(okey, None)
        for okey in upserts:
            self._lines[okey] = lines.get(okey, 0)
        return None


def _error_key(path: str, okey: ObjectKey) -> str:
    return f"{path}#{okey[0]}/{okey[1]}"


def _object_message(okey: ObjectKey, err: InputError) -> str:
    """``Kind ns/name: <error>``, without repeating the object when the error names it."""
    ref = f"{okey[0]} {okey[1]}"
    if err.obj.lower() == ref.lower():
        return str(err)
    return f"{ref}: {err}"


def _ordered(keys: Sequence[ObjectKey], reverse: bool = False) -> list[ObjectKey]:
    """Services before EndpointSlices before Pods before other kinds (reversed for
    deletions)."""
    return sorted(keys, key=lambda k: (_KIND_ORDER.get(k[0], 9), k[1]), reverse=reverse)
