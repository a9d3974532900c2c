"""The load-balancer harness and its script commands (hive/*, k8s/*, lb/*, test/*).

`LBHarness` plays the part of the upstream test hive: it holds the fake
Kubernetes store (which outlives ``hive/recreate``), the current
`tests.conformance.lb_system.LBSystem`, and the pin location of its maps. Flags of
the ``#!`` line (and of ``hive/recreate``) that Statewright does not implement
fail ``hive start`` with ``unsupported: flag ...`` instead of being ignored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import os
import time
import urllib.parse
from collections.abc import Hashable
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
import yaml

from statedb import Table
from tests.conformance.engine import (
    Command,
    CommandError,
    ScriptFailure,
    State,
    Unsupported,
    parse_flags,
)
from tests.conformance.lb_system import (
    FakeKubernetes,
    LBSystem,
    LBSystemError,
    MapsLocation,
    SystemOptions,
    key_of,
    source_resource,
)

#: How long lb/prune and test/init-wait wait for the system.
WAIT_TIMEOUT = 5.0
#: How long http/get waits for an answer.
HTTP_TIMEOUT = 2.0


def health_server_address(pid: int | None = None) -> str:
    """The loopback address the health-check server binds in tests (``$HEALTHADDR``).

    As upstream's harness, one address per process (127.x.y.z from the process id), so
    test processes running side by side never compete for the health ports; the whole of
    127.0.0.0/8 is loopback on Linux, so nothing listens on the machine's interfaces."""
    pid = os.getpid() if pid is None else pid
    return f"127.{1 | (pid >> 16 & 0xFF)}.{pid >> 8 & 0xFF}.{1 | (pid & 0xFF)}"


class LBHarness:
    """The hive of one script: builds, starts, stops and recreates an LBSystem."""

    def __init__(self, flags: list[str], maps: MapsLocation) -> None:
        self.flags = flags
        self.maps = maps
        self.k8s = FakeKubernetes()
        self._system: LBSystem | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._tg_cm: Any = None
        self.snapshot: dict[str, Any] | None = None
        self.health_address = health_server_address()
        #: Objects a ``k8s/delete`` left for the ``k8s/add`` right after it, which writes
        #: both to the API server and lets them reach the system as one batch.
        self.pending_deletes: list[dict[str, Any]] = []

    def script_env(self) -> dict[str, str]:
        """Variables a script sees from the start: ``$HEALTHADDR``, where the health-check
        server listens."""
        return {"HEALTHADDR": self.health_address}

    # ----- async context manager ---------------------------------------------------------
    async def __aenter__(self) -> LBHarness:
        bad = LBSystem.unsupported_flags(self.flags)
        if bad:
            # Upstream builds the hive from these flags before the script runs.
            line = "#! " + " ".join(self.flags)
            raise ScriptFailure(1, line, "unsupported: flag " + " ".join(bad))
        self._tg_cm = anyio.create_task_group()
        self._tg = await self._tg_cm.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._system is not None:
                with anyio.CancelScope(shield=True):
                    await self._system.stop()
        finally:
            assert self._tg is not None
            self._tg.cancel_scope.cancel()
            await self._tg_cm.__aexit__(exc_type, exc, tb)
            self.maps.cleanup()
            self.k8s.close()

    # ----- the system ------------------------------------------------------------------
    def _build(self, flags: list[str]) -> LBSystem:
        bad = LBSystem.unsupported_flags(flags)
        if bad:
            raise Unsupported("flag " + " ".join(bad))
        try:
            return LBSystem(
                flags,
                SystemOptions(
                    maps=self.maps, harness_defaults=True, health_address=self.health_address
                ),
                self.k8s,
            )
        except ValueError as e:
            raise CommandError(f"bad flags: {e}") from None

    @property
    def system(self) -> LBSystem:
        """The current system (built on first use from the ``#!`` flags)."""
        if self._system is None:
            self._system = self._build(self.flags)
        return self._system

    @property
    def db(self) -> Any:
        """The current system's database."""
        return self.system.db

    async def start(self) -> None:
        """``hive start``."""
        assert self._tg is not None
        try:
            await self.system.start(self._tg)
        except Unsupported:
            raise
        except Exception as e:
            raise CommandError(f"hive start failed: {type(e).__name__}: {e}") from None

    async def stop(self) -> None:
        """``hive stop``."""
        await self.system.stop()

    def recreate(self, extra: list[str]) -> None:
        """``hive/recreate [flags]``: new system, same k8s store and pinned maps."""
        if self._system is not None and self._system.running:
            raise CommandError("hive/recreate: stop the hive first")
        bad = LBSystem.unsupported_flags(extra)
        if bad:
            raise Unsupported("flag " + " ".join(bad))
        self.flags = [*self.flags, *extra]
        self._system = self._build(self.flags)

    async def quiescence(self, state: State) -> Hashable | None:
        """A token of the system's state when nothing is in flight, else None."""
        sys = self._system
        if sys is None:
            return ("not built", self.k8s.version)
        if not sys.idle():
            return None
        txn = sys.db.read_txn()
        return (
            self.k8s.version,
            tuple(t.revision(txn) for t in sys.db.tables),
            sys.prune_count(),
            sys.running,
        )

    # ----- db/insert and db/delete -----------------------------------------------------------
    def decode_row(self, table: str, doc: dict[str, Any]) -> Any:
        """A row of ``table`` from YAML (only node-addresses can be written this way)."""
        if table == "node-addresses":
            from tables.node_addresses import NodeAddress

            return NodeAddress.from_dict(doc)
        raise Unsupported(f"db/insert into table {table}")

    async def write_rows(self, table: Table[Any], rows: list[Any], insert: bool) -> None:
        """Write node addresses through the LB writer (so frontends are refreshed)."""
        self.system.upsert_node_addresses(rows, insert)


# ----- helpers --------------------------------------------------------------------------
def _harness(state: State) -> LBHarness:
    h = state.harness
    if not isinstance(h, LBHarness):
        raise CommandError("this command needs the load-balancer harness")
    return h


def _k8s_objects(state: State, names: list[str]) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = []
    for name in names:
        try:
            docs = list(yaml.safe_load_all(state.read(name)))
        except yaml.YAMLError as e:
            raise CommandError(f"{name}: invalid YAML: {e}") from None
        for doc in docs:
            if doc is None:
                continue
            if not isinstance(doc, dict) or "kind" not in doc:
                raise CommandError(f"{name}: not a Kubernetes object")
            if doc.get("kind") == "List":
                objs.extend(doc.get("items") or [])
            else:
                objs.append(doc)
    return objs


# ----- hive ----------------------------------------------------------------------------
async def cmd_hive(state: State, args: list[str]) -> None:
    """``hive start|stop``."""
    if args == ["start"]:
        await _harness(state).start()
    elif args == ["stop"]:
        await _harness(state).stop()
    else:
        raise CommandError("usage: hive start|stop")


async def cmd_hive_start(state: State, args: list[str]) -> None:
    """``hive/start``."""
    await _harness(state).start()


async def cmd_hive_stop(state: State, args: list[str]) -> None:
    """``hive/stop``."""
    await _harness(state).stop()


async def cmd_hive_recreate(state: State, args: list[str]) -> None:
    """``hive/recreate [flags...]``."""
    _harness(state).recreate([a.replace("$WORK", str(state.workdir)) for a in args])


# ----- k8s -------------------------------------------------------------------------------
#: How long a k8s/* command lets the running system catch up with the change it made.
CATCH_UP = 1.0


async def _catch_up(h: LBHarness) -> None:
    """Let the running system process the change just made before the next command.

    First the Kubernetes source must have processed the change (the reflector received it
    from the fake API server and the applier wrote it to the tables, or refused it):
    `LBSystem.wait_caught_up`, an error if it does not within its bound. Then the
    reconciler: upstream it runs in a goroutine beside the script and follows a change
    within microseconds; here it is a task of the same event loop and would not run until
    the script awaits, so back-to-back commands would always reach it as one batch.
    Waiting (at most `CATCH_UP`) until the system is idle gives the script the same view
    as upstream: each command's change is processed on its own.
    """
    sys = h._system
    if sys is None or not sys.running:
        return
    # The change reached the tables through the reflector and the source's applier.
    try:
        await sys.wait_caught_up()
    except LBSystemError as e:
        raise CommandError(str(e)) from None
    with anyio.move_on_after(CATCH_UP):
        while not sys.idle():
            await anyio.sleep(0.002)


async def cmd_k8s_add(state: State, args: list[str]) -> None:
    """``k8s/add file...``: create (or replace) the objects, in the order given, each
    processed before the next is written.

    Upstream's reflector takes the objects in the order the script lists them. Here
    services and endpoint slices come on separate watches and the applier may take them
    in separate batches, so without the wait a reconciler round could fall between two
    objects or not, depending on timing, and with it the order frontends are given ids
    in (marshalling.txtar lists the IPv4 endpoints first for that order).

    Right after a ``k8s/delete`` the deletions and these objects reach the system as one
    batch instead (`_delete_then_add`).
    """
    h = _harness(state)
    pending, h.pending_deletes = h.pending_deletes, []
    try:
        objs = _k8s_objects(state, args)
    except CommandError:
        if pending:
            _delete_objects(state, h, pending)
            await _catch_up(h)
        raise
    if pending:
        await _delete_then_add(state, h, pending, objs)
        return
    for obj in objs:
        try:
            h.k8s.upsert(obj)
        except ValueError as e:
            raise CommandError(f"k8s/add: {e}") from None
        await _catch_up(h)


async def _delete_then_add(
    state: State, h: LBHarness, deletes: list[dict[str, Any]], adds: list[dict[str, Any]]
) -> None:
    """A ``k8s/delete`` line and the ``k8s/add`` line after it as one batch of the source.

    Upstream the two commands write to the fake clientset back to back and the
    reflector's buffer takes the events together, coalesced per object key (a Pod
    recreated under its name is one upsert). Here the source is held while the changes
    are written in the script's order, each one received by the source before the next
    is written (so the batch keeps that order across resources), and then applied in one
    write transaction."""
    sys = h._system
    try:
        with sys.holding() if sys is not None else contextlib.nullcontext():
            for obj, rv in _delete_objects(state, h, deletes):
                if sys is not None:
                    await sys.wait_received(obj, rv)
            for obj in adds:
                try:
                    rv = h.k8s.upsert(obj)
                except ValueError as e:
                    raise CommandError(f"k8s/add: {e}") from None
                if sys is not None:
                    await sys.wait_received(obj, rv)
    except LBSystemError as e:
        raise CommandError(str(e)) from None
    await _catch_up(h)


def _delete_objects(
    state: State, h: LBHarness, objs: list[dict[str, Any]]
) -> list[tuple[dict[str, Any], int]]:
    """Delete ``objs`` from the API server: each with the revision of its deletion (0 for
    one already gone, logged, not an error: a retried section deletes again, as upstream,
    whose scripts rely on it, e.g. a delete followed by `* lb/maps-empty`)."""
    out = []
    for obj in objs:
        try:
            rv = h.k8s.delete(obj)
        except ValueError as e:
            raise CommandError(f"k8s/delete: {e}") from None
        if not rv:
            state.log.append(f"({obj.get('kind')} {key_of(obj)} was already gone)")
        out.append((obj, rv))
    return out


async def cmd_k8s_delete(state: State, args: list[str]) -> None:
    """``k8s/delete file...``: delete the objects. Followed by ``k8s/add``, the deletions
    are written with that command's objects, as one batch (`_delete_then_add`)."""
    h = _harness(state)
    objs = _k8s_objects(state, args)
    if state.next_command == "k8s/add" and h._system is not None and h._system.running:
        for obj in objs:
            try:
                source_resource(obj)
                key_of(obj)
            except ValueError as e:
                raise CommandError(f"k8s/delete: {e}") from None
        h.pending_deletes.extend(objs)
        return
    _delete_objects(state, h, objs)
    await _catch_up(h)


async def cmd_k8s_resync(state: State, args: list[str]) -> None:
    """``k8s/resync resource [file...]``: replace the resource's objects, force a re-list."""
    if not args:
        raise CommandError("usage: k8s/resync resource [file...]")
    h = _harness(state)
    objs = _k8s_objects(state, args[1:])
    try:
        h.k8s.replace(args[0], objs)
    except ValueError as e:
        raise CommandError(f"k8s/resync: {e}") from None
    await _catch_up(h)


# ----- lb ---------------------------------------------------------------------------------
async def cmd_maps_dump(state: State, args: list[str]) -> str | None:
    """``lb/maps-dump [file]``."""
    text = _maps_call(state, lambda s: s.maps_dump())
    if args:
        state.write(args[0], text)
        return None
    return text


def _maps_call(state: State, fn: Any) -> Any:
    try:
        return fn(_harness(state).system)
    except CommandError:
        raise
    except Exception as e:
        raise CommandError(f"{type(e).__name__}: {e}") from None


async def cmd_scale_to_zero_dump(state: State, args: list[str]) -> str | None:
    """``lb/scale-to-zero-dump [file]``: the ids tracked in the scale-to-zero map."""
    if len(args) > 1:
        raise CommandError("usage: lb/scale-to-zero-dump [file]")
    text = _maps_call(state, lambda s: s.lb.scale_to_zero_dump())
    if args:
        state.write(args[0], text)
        return None
    return text


def http_get_text(url: str, timeout: float = HTTP_TIMEOUT) -> str:
    """GET ``url`` and render the answer as the corpus expects it: the status line
    (``200 OK``), the headers as ``Name=value`` sorted by name with the Date's value
    replaced by ``<omitted>``, a ``---`` line, then the body. Raises OSError (or
    http.client.HTTPException) when no answer comes."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"not an http URL: {url!r}")
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        conn.request("GET", parts.path or "/")
        resp = conn.getresponse()
        body = resp.read()
        headers: dict[str, list[str]] = {}
        for name, value in resp.getheaders():
            canon = "-".join(w.capitalize() for w in name.split("-"))
            headers.setdefault(canon, []).append("<omitted>" if canon == "Date" else value)
    finally:
        conn.close()
    lines = [f"{resp.status} {resp.reason}"]
    lines += [f"{name}={', '.join(headers[name])}" for name in sorted(headers)]
    lines.append("---")
    return "\n".join(lines) + "\n" + body.decode("utf-8", "replace")


async def cmd_http_get(state: State, args: list[str]) -> str | None:
    """``http/get URL [file]``: an HTTP GET; fails when nothing answers."""
    if len(args) not in (1, 2):
        raise CommandError("usage: http/get URL [file]")
    try:
        text = await anyio.to_thread.run_sync(http_get_text, args[0])
    except (OSError, http.client.HTTPException, ValueError) as e:
        raise CommandError(f"http/get {args[0]}: {type(e).__name__}: {e}") from None
    if len(args) == 2:
        state.write(args[1], text)
        return None
    return text


async def cmd_maps_empty(state: State, args: list[str]) -> None:
    """``lb/maps-empty``: no LB map entry may remain."""
    left = _maps_call(state, lambda s: s.maps_leftovers())
    if left:
        raise CommandError(f"{len(left)} map entries remain", "\n".join(left) + "\n")


async def cmd_prune(state: State, args: list[str]) -> None:
    """``lb/prune``: prune the maps and wait until the prune has run."""
    sys = _harness(state).system
    before = sys.prune_count()
    try:
        sys.request_prune()
    except Exception as e:
        raise CommandError(str(e)) from None
    with anyio.move_on_after(WAIT_TIMEOUT):
        while sys.prune_count() <= before:
            await anyio.sleep(0.005)
        return
    raise CommandError("lb/prune: the prune did not run")


async def cmd_init_wait(state: State, args: list[str]) -> None:
    """``test/init-wait``: wait until the tables are initialized and the maps reconciled."""
    sys = _harness(state).system
    with anyio.move_on_after(WAIT_TIMEOUT):
        while True:
            done, _ = sys.frontends.initialized(sys.db.read_txn())
            if done and sys.running and sys.idle() and sys.prune_count() > 0:
                return
            await anyio.sleep(0.005)
    raise CommandError("test/init-wait: not initialized in time")


async def cmd_set_node_labels(state: State, args: list[str]) -> None:
    """``test/set-node-labels k=v...``."""
    labels: dict[str, str] = {}
    for a in args:
        k, eq, v = a.partition("=")
        if not eq:
            raise CommandError(f"bad label {a!r}, want key=value")
        labels[k] = v
    _harness(state).system.set_node_labels(labels)


async def cmd_set_node_ip(state: State, args: list[str]) -> None:
    """``test/set-node-ip <ip>``: the local node's IP (proxy delegation)."""
    if len(args) != 1:
        raise CommandError("usage: test/set-node-ip ip")
    from tables.l3n4 import parse_ip

    try:
        ip = parse_ip(args[0])
    except ValueError as e:
        raise CommandError(str(e)) from None
    _harness(state).system.set_node_ip(ip)


async def cmd_update_backend_health(state: State, args: list[str]) -> None:
    """``test/update-backend-health ns/name ip:port/PROTO true|false``."""
    if len(args) != 3 or args[2] not in ("true", "false"):
        raise CommandError("usage: test/update-backend-health ns/name addr true|false")
    from tables.l3n4 import L3n4Addr

    sys = _harness(state).system
    try:
        addr = L3n4Addr.parse(args[1])
    except ValueError as e:
        raise CommandError(str(e)) from None
    with sys.writer.write_txn() as txn:
        changed = sys.writer.set_backend_health(txn, args[0], addr, args[2] == "true", time.time())
    if not changed:
        state.log.append("(backend health unchanged)")


async def cmd_maps_snapshot(state: State, args: list[str]) -> None:
    """``lb/maps-snapshot``: remember the maps' contents."""
    h = _harness(state)
    h.snapshot = _maps_call(state, lambda s: snapshot_maps(s.plain_maps))


async def cmd_maps_restore(state: State, args: list[str]) -> None:
    """``lb/maps-restore [--any-proto]``: write the snapshot back (without clearing)."""
    flags, _ = parse_flags(args, {"any-proto": False})
    h = _harness(state)
    if h.snapshot is None:
        raise CommandError("lb/maps-restore: no snapshot")
    snap = h.snapshot
    any_proto = flags.get("any-proto") == "true"
    _maps_call(state, lambda s: restore_maps(s.plain_maps, snap, any_proto))


def snapshot_maps(maps: Any) -> dict[str, Any]:
    """Every entry of every LB map (maglev as tables per rev-NAT id)."""
    from bpfops.lb_maps import CONTROL_MAP_NAMES, MAGLEV4, MAGLEV6

    out: dict[str, Any] = {}
    for name in CONTROL_MAP_NAMES:
        if name == MAGLEV4:
            out[name] = list(maps.maglev_tables(False))
        elif name == MAGLEV6:
            out[name] = list(maps.maglev_tables(True))
        else:
            out[name] = maps.maps[name].dump()
    return out


def restore_maps(maps: Any, snap: dict[str, Any], any_proto: bool) -> None:
    """Write a snapshot back; ``any_proto`` rewrites the protocol of service keys and
    backends to ANY (0), as entries written by older versions look."""
    from bpfops.lb_maps import BACKENDS4, BACKENDS6, MAGLEV4, MAGLEV6, SERVICES4, SERVICES6

    for name, entries in snap.items():
        if name in (MAGLEV4, MAGLEV6):
            for rev, table in entries:
                maps.set_maglev(rev, table, name == MAGLEV6)
            continue
        m = maps.maps[name]
        for key, value in entries:
            if any_proto and name in (SERVICES4, SERVICES6):
                key = dataclasses.replace(key, proto=0)
            if any_proto and name in (BACKENDS4, BACKENDS6):
                value = dataclasses.replace(value, proto=0)
            m.update(key, value)


def _ops(state: State) -> Any:
    ops = _harness(state).system.ops
    if ops is None:
        raise CommandError("the BPF ops are not running (hive not started)")
    return ops


async def cmd_bpfops_reset(state: State, args: list[str]) -> None:
    """``test/bpfops-reset``: forget the ops' state and restore it from the maps."""
    _ops(state).reset_and_restore()


async def cmd_bpfops_summary(state: State, args: list[str]) -> str:
    """``test/bpfops-summary``: print the ops' state summary."""
    return str(_ops(state).state_summary())


async def cmd_bpfops_state_empty(state: State, args: list[str]) -> None:
    """``test/bpfops-state-empty``: the ops must hold no state."""
    ops = _ops(state)
    if not ops.state_is_empty():
        raise CommandError("BPF ops state is not empty", str(ops.state_summary()))


_METRICS_FLAGS = {"sample": True, "out": True, "format": True}
_METRICS_ALIASES = {"s": "sample", "o": "out"}


async def cmd_metrics(state: State, args: list[str]) -> str | None:
    """``metrics [-s REGEX] [-o FILE] [pattern]``: the system's current metric samples whose
    name matches, as a ``Metric Labels Value`` table sorted by name."""
    import re

    flags, rest = parse_flags(args, _METRICS_FLAGS, _METRICS_ALIASES)
    fmt = flags.get("format", "table")
    if fmt != "table":
        raise Unsupported(f"metrics --format={fmt}")
    pattern = flags.get("sample") or (rest[0] if rest else "")
    try:
        regex = re.compile(pattern)
    except re.error as e:
        raise CommandError(f"metrics: bad pattern {pattern!r}: {e}") from None
    rows = [
        (name, ",".join(f"{k}={v}" for k, v in sorted(labels.items())), f"{value:g}")
        for name, labels, value in _harness(state).system.metric_samples()
        if regex.search(name)
    ]
    rows.sort()
    header = ("Metric", "Labels", "Value")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    text = "".join(
        f"{r[0]:<{widths[0]}}   {r[1]:<{widths[1]}}   {r[2]}\n" for r in [header, *rows]
    )
    out = flags.get("out")
    if out:
        state.write(out, text)
        return None
    return text


def lb_commands() -> dict[str, Command]:
    """The load-balancer commands."""
    return {
        "hive": cmd_hive,
        "hive/start": cmd_hive_start,
        "hive/stop": cmd_hive_stop,
        "hive/recreate": cmd_hive_recreate,
        "http/get": cmd_http_get,
        "k8s/add": cmd_k8s_add,
        "k8s/update": cmd_k8s_add,
        "k8s/delete": cmd_k8s_delete,
        "k8s/resync": cmd_k8s_resync,
        "lb/maps-dump": cmd_maps_dump,
        "lb/maps-empty": cmd_maps_empty,
        "lb/maps-snapshot": cmd_maps_snapshot,
        "lb/maps-restore": cmd_maps_restore,
        "lb/prune": cmd_prune,
        "lb/scale-to-zero-dump": cmd_scale_to_zero_dump,
        "metrics": cmd_metrics,
        "test/bpfops-reset": cmd_bpfops_reset,
        "test/bpfops-state-empty": cmd_bpfops_state_empty,
        "test/bpfops-summary": cmd_bpfops_summary,
        "test/init-wait": cmd_init_wait,
        "test/set-node-ip": cmd_set_node_ip,
        "test/set-node-labels": cmd_set_node_labels,
        "test/update-backend-health": cmd_update_backend_health,
    }


def harness_factory(backend: str, pin_root: str) -> Any:
    """A runner harness factory: each script gets its own pin directory under ``pin_root``."""
    counter = [0]

    def make(flags: list[str], workdir: Path) -> LBHarness:
        counter[0] += 1
        pin_dir = f"{pin_root.rstrip('/')}/{workdir.name}-{counter[0]}"
        return LBHarness(flags, MapsLocation(backend=backend, pin_dir=pin_dir))

    return make
