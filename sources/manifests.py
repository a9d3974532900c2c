"""The manifest source: Kubernetes objects from YAML/JSON files, kept in the LB tables.

Point it at directories and/or files. Each ``.yaml``/``.yml``/``.json`` file may
hold several objects (multi-document YAML, a JSON array, or a ``List`` with
``items``). Services, EndpointSlices and Pods are converted by
`sources.k8s_convert.K8sConverter`; other kinds are ignored (counted in
`SyncResult.ignored`).

`ManifestSource.sync` polls once: files that appeared, changed (size, mtime or
content) or disappeared are applied file by file, each in one write
transaction, so a file's objects change together. A file that cannot be read,
parsed or converted — or whose objects conflict with another file's or
another service's frontends — is rejected as a whole: its error (naming the
file, the object and the field) is kept in `ManifestSource.errors` and logged,
and the tables keep that file's previous objects; other files are applied
normally. Fixing the file clears the error on the next poll.

`ManifestSource.run` polls every ``interval`` seconds (anyio task); this is the
agent's embedded default source.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
from statedb import WriteTxn
from tables.lb_writer import LBWriter

log = logging.getLogger(__name__)

#: File name suffixes read by the source.
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")

#: Order in which kinds are applied (services before their endpoints).
_KIND_ORDER = {KIND_SERVICE: 0, KIND_ENDPOINT_SLICE: 1, KIND_POD: 2}

#: (kind, namespace/name) of an object.
ObjectKey = tuple[str, str]


class ManifestError(ValueError):
    """A manifest file cannot be applied; the message names the file (and object and field)."""

    def __init__(self, path: Path | str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = str(path)
        self.detail = message


@dataclass(slots=True)
class SyncResult:
    """What one `ManifestSource.sync` did."""

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
    digest: str
    objects: dict[ObjectKey, Mapping[str, Any]]


def parse_manifest_text(text: str, path: Path | str = "<text>") -> list[Mapping[str, Any]]:
    """Parse a manifest file's text into its objects; raise ManifestError naming the file."""
    p = str(path)
    docs: list[Any]
    try:
        if p.endswith(".json"):
            data = json.loads(text) if text.strip() else None
            docs = data if isinstance(data, list) else [data]
        else:
            docs = list(yaml.safe_load_all(text))
    except (yaml.YAMLError, json.JSONDecodeError) as e:
        raise ManifestError(path, f"cannot parse: {e}") from None
    out: list[Mapping[str, Any]] = []
    for i, doc in enumerate(docs):
        if doc is None:
            continue
        if not isinstance(doc, Mapping):
            raise ManifestError(path, f"document {i}: expected an object, got {type(doc).__name__}")
        if doc.get("kind") == "List" or (
            isinstance(doc.get("kind"), str) and doc["kind"].endswith("List") and "items" in doc
        ):
            items = doc.get("items") or []
            if not isinstance(items, list):
                raise ManifestError(path, f"document {i}: field items: expected a list")
            for j, item in enumerate(items):
                if not isinstance(item, Mapping):
                    raise ManifestError(path, f"document {i}: items[{j}]: expected an object")
                out.append(item)
            continue
        out.append(doc)
    return out


def _object_key(path: Path | str, index: int, obj: Mapping[str, Any]) -> ObjectKey:
    kind = object_kind(obj)
    if not kind:
        raise ManifestError(path, f"object {index}: field kind: missing or not a string")
    try:
        return kind, namespaced_name(obj)
    except ConversionError as e:
        raise ManifestError(path, str(e)) from None


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
        self.on_error = on_error
        #: Current error per file path (cleared when the file applies again or goes away).
        self.errors: dict[str, str] = {}
        self._files: dict[str, _FileState] = {}
        self._stats: dict[str, tuple[int, int]] = {}
        self._owner: dict[ObjectKey, str] = {}
        self._init_done: Callable[[WriteTxn], None] | None = None
        self.synced = False

    @property
    def files(self) -> list[str]:
        """The manifest files whose objects are currently applied, sorted."""
        return sorted(self._files)

    # ----- discovery ----------------------------------------------------------------------
    def discover(self) -> list[Path]:
        """The manifest files currently present (directories scanned recursively), sorted."""
        found: set[Path] = set()
        for p in self.paths:
            if p.is_dir():
                for f in p.rglob("*"):
                    rel = f.relative_to(p)
                    if any(part.startswith(".") for part in rel.parts):
                        continue
                    if f.is_file() and f.suffix in MANIFEST_SUFFIXES:
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
        present = {str(p): p for p in self.discover()}
        for key in sorted(set(self._files) | set(self.errors)):
            if key not in present:
                self._remove_file(key, result)
        for key, path in present.items():
            try:
                st = path.stat()
                stat_key = (st.st_mtime_ns, st.st_size)
            except OSError as e:
                self._fail(key, f"{key}: cannot read: {e.strerror or e}", result)
                continue
            if self._stats.get(key) == stat_key and key not in self.errors:
                continue
            try:
                data = path.read_bytes()
            except OSError as e:
                self._fail(key, f"{key}: cannot read: {e.strerror or e}", result)
                continue
            self._stats[key] = stat_key
            digest = hashlib.sha256(data).hexdigest()
            prev = self._files.get(key)
            if prev is not None and prev.digest == digest and key not in self.errors:
                continue
            self._apply_file(key, data, digest, result)
        if not self.synced:
            self.synced = True
            if self._init_done is not None:
                with self.writer.write_txn() as txn:
                    self._init_done(txn)
                self._init_done = None
        return result

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Poll forever, every ``interval`` seconds (cancel the task to stop)."""
        self.sync()
        task_status.started()
        while True:
            await anyio.sleep(self.interval)
            self.sync()

    # ----- applying ------------------------------------------------------------------------------
    def _fail(self, key: str, message: str, result: SyncResult) -> None:
        if self.errors.get(key) != message:
            log.error("manifest source: %s", message)
            if self.on_error is not None:
                self.on_error(key, message)
        self.errors[key] = message
        result.failed[key] = message

    def _parse(
        self, key: str, data: bytes, result: SyncResult
    ) -> dict[ObjectKey, Mapping[str, Any]]:
        try:
            text = data.decode()
        except UnicodeDecodeError:
            raise ManifestError(key, "not UTF-8 text") from None
        objs: dict[ObjectKey, Mapping[str, Any]] = {}
        for i, obj in enumerate(parse_manifest_text(text, key)):
            okey = _object_key(key, i, obj)
            if okey[0] not in _KIND_ORDER:
                result.ignored += 1
                continue
            if okey in objs:
                raise ManifestError(key, f"{okey[0]} {okey[1]} is defined twice")
            owner = self._owner.get(okey)
            if owner is not None and owner != key:
                raise ManifestError(key, f"{okey[0]} {okey[1]} is already defined in {owner}")
            objs[okey] = obj
        return objs

    def _apply_file(self, key: str, data: bytes, digest: str, result: SyncResult) -> None:
        try:
            objs = self._parse(key, data, result)
        except ManifestError as e:
            self._fail(key, str(e), result)
            return
        old = self._files.get(key)
        old_objs = old.objects if old is not None else {}
        try:
            self._apply_objects(key, old_objs, objs)
        except (ValueError, KeyError, TypeError) as e:
            self._fail(key, f"{key}: {e}", result)
            return
        for okey in old_objs:
            if okey not in objs:
                self._owner.pop(okey, None)
        for okey in objs:
            self._owner[okey] = key
        self._files[key] = _FileState(digest, objs)
        self.errors.pop(key, None)
        result.applied.append(key)

    def _remove_file(self, key: str, result: SyncResult) -> None:
        self.errors.pop(key, None)
        self._stats.pop(key, None)
        old = self._files.get(key)
        if old is None:
            return
        try:
            self._apply_objects(key, old.objects, {})
        except (ValueError, KeyError, TypeError) as e:
            self._fail(key, f"{key}: removing: {e}", result)
            return
        for okey in old.objects:
            self._owner.pop(okey, None)
        del self._files[key]
        result.removed.append(key)

    def _apply_objects(
        self,
        key: str,
        old: Mapping[ObjectKey, Mapping[str, Any]],
        new: Mapping[ObjectKey, Mapping[str, Any]],
    ) -> None:
        """Apply the difference old -> new in one write txn; on error roll everything back."""
        conv = self.converter
        checkpoint = conv.checkpoint()
        order = _ordered
        txn = self.writer.write_txn()
        try:
            for okey in order([k for k in old if k not in new], reverse=True):
                conv.delete(txn, old[okey])
            for okey in order([k for k in new if old.get(k) != new[k]]):
                conv.upsert(txn, new[okey])
        except BaseException:
            txn.abort()
            conv.rollback(checkpoint)
            raise
        txn.commit()


def _ordered(keys: Sequence[ObjectKey], reverse: bool = False) -> list[ObjectKey]:
    """Services before EndpointSlices before Pods (reversed for deletions)."""
    return sorted(keys, key=lambda k: (_KIND_ORDER.get(k[0], 9), k[1]), reverse=reverse)
