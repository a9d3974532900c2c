"""The LB state file source (Cilium's ``--lb-state-file``): one YAML file holding the complete
load-balancing state, re-read every ``--lb-state-file-interval``.

The file is a mapping with two optional lists::

    services:    # v1 Service objects (``kind``/``apiVersion`` may be omitted)
      - metadata: {name: echo, namespace: test}
        spec: {...}
        status: {...}
    endpoints:   # discovery.k8s.io/v1 EndpointSlice objects
      - metadata: {name: echo-1, namespace: test, labels: {kubernetes.io/service-name: echo}}
        addressType: IPv4
        endpoints: [...]
        ports: [...]

A missing or empty file means "no state". Every change replaces the whole
state of this source (source name ``api``) in one write transaction; a file
that cannot be read, parsed or converted is reported (`StateFileSource.error`,
naming the file, the line and column of a syntax error, or the object and
field) and changes nothing. Only `InputError` is reported this way: any other
exception is a bug and propagates out of `StateFileSource.sync`. Writers
should replace the file atomically (write elsewhere, then rename).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import yaml

from sources.k8s_convert import KIND_ENDPOINT_SLICE, KIND_SERVICE, K8sConverter
from sources.manifests import describe_yaml_error
from statedb import InputError, WriteTxn
from tables.lb_config import LBConfig
from tables.lb_writer import LBWriter

log = logging.getLogger(__name__)

#: The source name of rows from the state file.
STATE_FILE_SOURCE = "api"
#: Poll interval when ``--lb-state-file-interval`` is not given.
DEFAULT_INTERVAL = 1.0
#: The LB flags (tables.lb_config stores them) that a process running this source acts on.
STATE_FILE_FLAGS = ("lb-state-file", "lb-state-file-interval")


class StateFileError(InputError):
    """The state file cannot be read or parsed: ``obj`` is the file, ``field`` where in it
    (``services[2].kind``, ``line 3, column 5``; may be empty)."""


def parse_state_file(text: str, path: str = "<state>") -> tuple[list[dict[str, Any]], ...]:
    """Return (services, endpoint slices) from the state file's text, with ``kind`` set."""
    try:
        data = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as e:
        where, what = describe_yaml_error(e)
        raise StateFileError(what, obj=path, field=where) from None
    if data is None:
        return [], []
    if not isinstance(data, Mapping):
        raise StateFileError("expected a mapping with 'services' and 'endpoints'", obj=path)
    out: list[list[dict[str, Any]]] = []
    for key, kind in (("services", KIND_SERVICE), ("endpoints", KIND_ENDPOINT_SLICE)):
        items = data.get(key) or []
        if not isinstance(items, list):
            raise StateFileError("expected a list", obj=path, field=key)
        objs = []
        for i, item in enumerate(items):
            if not isinstance(item, Mapping):
                raise StateFileError("expected an object", obj=path, field=f"{key}[{i}]")
            obj = dict(item)
            obj.setdefault("kind", kind)
            if obj["kind"] != kind:
                raise StateFileError(f"expected {kind}", obj=path, field=f"{key}[{i}].kind")
            objs.append(obj)
        out.append(objs)
    return out[0], out[1]


class StateFileSource:
    """Keeps the LB tables' ``api`` rows equal to the contents of one state file."""

    def __init__(self, writer: LBWriter, path: str | Path, *, interval: float = 1.0) -> None:
        if interval <= 0:
            raise ValueError(f"state file source: interval must be > 0, got {interval}")
        self.writer = writer
        self.path = Path(path)
        self.interval = interval
        self.converter = K8sConverter(writer, source=STATE_FILE_SOURCE)
        #: The current error ("" when the last read applied).
        self.error = ""
        self._digest: str | None = None
        self._init_done: Callable[[WriteTxn], None] | None = None

    @classmethod
    def from_config(cls, writer: LBWriter, cfg: LBConfig) -> StateFileSource | None:
        """The source for ``--lb-state-file`` (None without it), its initializer registered
        on the LB tables so they stay uninitialized until the file was read once."""
        if not cfg.state_file:
            return None
        source = cls(writer, cfg.state_file, interval=cfg.state_file_interval or DEFAULT_INTERVAL)
        with writer.write_txn() as txn:
            source.register_initializer(txn)
        return source

    def register_initializer(self, txn: WriteTxn) -> None:
        """Keep the LB tables uninitialized until the file was read once (present, absent,
        or broken: a broken file is reported and the tables go on without it)."""
        self._init_done = self.writer.register_initializer(txn, "state-file")

    def _initialized(self) -> None:
        if self._init_done is not None:
            with self.writer.write_txn() as txn:
                self._init_done(txn)
            self._init_done = None

    def sync(self) -> bool:
        """Read the file once and apply it if it changed; return True when applied."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        except OSError as e:
            return self._fail(f"{self.path}: cannot read: {e.strerror or e}")
        digest = hashlib.sha256(data).hexdigest()
        if digest == self._digest:
            return False
        try:
            try:
                text = data.decode()
            except UnicodeDecodeError as e:
                raise StateFileError(
                    f"not UTF-8 text (at byte offset {e.start})", obj=str(self.path)
                ) from None
            services, slices = parse_state_file(text, str(self.path))
        except StateFileError as e:
            return self._fail(str(e))
        conv = self.converter
        checkpoint = conv.checkpoint()
        txn = self.writer.write_txn()
        try:
            conv.resync(txn, KIND_SERVICE, services)
            conv.resync(txn, KIND_ENDPOINT_SLICE, slices)
        except InputError as e:
            txn.abort()
            conv.rollback(checkpoint)
            return self._fail(f"{self.path}: {e}")
        except BaseException:
            txn.abort()
            conv.rollback(checkpoint)
            raise
        txn.commit()
        self._digest = digest
        self.error = ""
        return True

    def _fail(self, message: str) -> bool:
        if message != self.error:
            log.error("state file source: %s", message)
        self.error = message
        return False

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Poll forever, every ``interval`` seconds (cancel the task to stop)."""
        self.sync()
        self._initialized()
        task_status.started()
        while True:
            await anyio.sleep(self.interval)
            self.sync()
