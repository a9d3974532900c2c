"""The ``db`` script commands: inspect and change statedb tables from a script.

They work on ``state.harness.db`` (a statedb.DB). Columns come from the row type's
``table_header()``/``table_row()`` (else its dataclass fields), the same source as
``statedb.show``. ``db/cmp`` compares the way the upstream command does: the
expected file's header chooses the columns (case-insensitively) and fixes their
character positions; each expected line is cut at those positions and compared
cell by cell with the table's rows, in primary-key order, until they match or
the timeout passes.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Sequence
from typing import Any

import anyio
import yaml

from statedb import DB, Table, show
from tests.conformance.engine import (
    Command,
    CommandError,
    State,
    expand,
    go_regex,
    parse_duration,
    parse_flags,
)

#: Default db/cmp timeout, the one of Cilium's script-test harness.
CMP_TIMEOUT = 5.0


def _db(state: State) -> DB:
    db = getattr(state.harness, "db", None)
    if db is None:
        raise CommandError("no database: the hive was not started")
    assert isinstance(db, DB)
    return db


def _table(state: State, name: str) -> Table[Any]:
    db = _db(state)
    try:
        return db.table(name)
    except Exception:
        names = ", ".join(t.name for t in db.tables)
        raise CommandError(f"table {name!r} not found (tables: {names})") from None


def table_header(table: Table[Any], rows: Sequence[Any] = ()) -> list[str]:
    """The column names of ``table``'s rows (as ``db show`` prints them)."""
    row_type = show.row_type_of(table)
    if row_type is None and not rows:
        raise CommandError(f"table {table.name!r}: row type unknown, cannot show columns")
    try:
        return show.header_of(row_type, rows)
    except TypeError as err:
        raise CommandError(f"table {table.name!r}: {err}") from err


def table_cells(row: Any, header: Sequence[str]) -> list[str]:
    """The cells of one row, in header order."""
    fn = getattr(row, "table_row", None)
    if fn is not None:
        return [c if isinstance(c, str) else show.format_cell(c) for c in fn()]
    return [show.format_cell(getattr(row, name)) for name in header]


def column_indexes(names: Iterable[str], header: Sequence[str]) -> list[int]:
    """Positions of ``names`` in ``header`` (case-insensitive)."""
    lowered = [h.lower() for h in header]
    out: list[int] = []
    for name in names:
        try:
            out.append(lowered.index(name.lower()))
        except ValueError:
            raise CommandError(f"column {name!r} not part of {list(header)}") from None
    return out


def split_header(line: str) -> tuple[list[str], list[int]]:
    """Column names of a header line and the character position where each starts."""
    names: list[str] = []
    positions: list[int] = []
    start = -1
    for i, ch in enumerate(line):
        if ch in " \t":
            if start >= 0:
                names.append(line[start:i])
                positions.append(start)
                start = -1
        elif start < 0:
            start = i
    if start >= 0:
        names.append(line[start:])
        positions.append(start)
    return names, positions


def split_by_positions(line: str, positions: Sequence[int]) -> list[str]:
    """Cut ``line`` at ``positions`` (from split_header), trimming blanks on the right."""
    out: list[str] = []
    start = 0
    for pos in positions[1:]:
        if start >= len(line):
            out.append("")
            start = len(line)
            continue
        out.append(line[start : min(pos, len(line))].rstrip(" \t"))
        start = pos
    out.append(line[min(start, len(line)) :].rstrip(" \t"))
    return out


def join_by_positions(cells: Sequence[str], positions: Sequence[int]) -> str:
    """Lay ``cells`` out at ``positions`` (for diffs)."""
    out: list[str] = []
    prev = 0
    for cell, pos in zip(cells, positions):
        out.append(" " * max(pos - prev, 1 if out else 0))
        out.append(cell)
        prev = pos + len(cell) if pos >= prev else prev + len(cell) + 1
    return "".join(out)


def tabwrite(lines: Sequence[Sequence[str]]) -> str:
    """Align cells like Go's tabwriter (min width 5, padding 3); the last cell is unpadded."""
    if not lines:
        return ""
    ncols = max(len(line) for line in lines)
    widths = [0] * ncols
    for line in lines:
        for c, cell in enumerate(line[:-1]):
            widths[c] = max(widths[c], len(cell) + 3, 5)
    out: list[str] = []
    for line in lines:
        parts = [cell.ljust(widths[c]) for c, cell in enumerate(line[:-1])]
        if line:
            parts.append(line[-1])
        out.append("".join(parts) + "\n")
    return "".join(out)


async def cmd_db(state: State, args: list[str]) -> str:
    """``db``: list the tables, their row counts and indexes."""
    db = _db(state)
    txn = db.read_txn()
    lines = [["Name", "Object count", "Indexes", "Initializers"]]
    for t in db.tables:
        lines.append(
            [
                t.name,
                str(t.count(txn)),
                ", ".join(i.name for i in t.indexes),
                str(t.pending_initializers(txn)),
            ]
        )
    return tabwrite(lines)


async def cmd_db_cmp(state: State, args: list[str]) -> None:
    """``db/cmp [--grep=re] [--timeout=d] table file``: the table must match the file."""
    flags, rest = parse_flags(args, {"grep": True, "timeout": True})
    if len(rest) != 2:
        raise CommandError("usage: db/cmp [--grep=re] [--timeout=dur] table file")
    table = _table(state, rest[0])
    timeout = parse_duration(flags["timeout"]) if "timeout" in flags else CMP_TIMEOUT
    grep = go_regex(flags["grep"]) if flags.get("grep") else None
    text = expand(state.read(rest[1]), state.env)
    lines = [ln for ln in text.split("\n") if ln.strip()]
    if not lines:
        raise CommandError(f"{rest[1]}: missing header line")
    names, positions = split_header(lines[0])
    expected = lines[1:]
    db = _db(state)
    deadline = min(time.monotonic() + timeout, state.deadline)
    probe = getattr(state.harness, "quiescence", None)
    quiet = 0
    while True:
        before = await probe(state) if probe is not None else None
        it, watch = table.all_watch(db.read_txn())
        rows = list(it)
        header = table_header(table, rows)
        idx = column_indexes(names, header)
        equal = True
        diff = ["  " + join_by_positions(names, positions)]
        remaining = list(expected)
        for row in rows:
            cells = table_cells(row, header)
            picked = [cells[i] for i in idx]
            shown = join_by_positions(picked, positions)
            if grep is not None and grep.search(shown) is None:
                continue
            if not remaining:
                equal = False
                diff.append("- " + shown)
                continue
            line = remaining.pop(0)
            if split_by_positions(line, positions) == picked:
                diff.append("  " + shown)
            else:
                equal = False
                diff.append("- " + shown)
                diff.append("+ " + line)
        for line in remaining:
            equal = False
            diff.append("+ " + line)
        if equal:
            return
        now = time.monotonic()
        if now >= deadline:
            raise CommandError(
                f"table {table.name} mismatch (- actual, + expected)", "\n".join(diff) + "\n"
            )
        after = await probe(state) if probe is not None else None
        quiet = quiet + 1 if before is not None and before == after else 0
        if quiet >= 3:
            raise CommandError(
                f"table {table.name} mismatch (- actual, + expected; system idle)",
                "\n".join(diff) + "\n",
            )
        with anyio.move_on_after(min(0.05 * (quiet + 1), deadline - now)):
            await watch.wait_async()
        if not watch.closed:
            await anyio.sleep(0)


async def cmd_db_empty(state: State, args: list[str]) -> None:
    """``db/empty table...``: the tables must have no rows."""
    db = _db(state)
    txn = db.read_txn()
    for name in args:
        table = _table(state, name)
        n = table.count(txn)
        if n:
            raise CommandError(
                f"table {name} not empty ({n} rows)",
                show.format_rows(table.all(txn), "table", None, show.row_type_of(table)),
            )


def _show_text(table: Table[Any], rows: list[Any], fmt: str, columns: list[str] | None) -> str:
    if fmt == "table":
        header = table_header(table, rows)
        idx = column_indexes(columns, header) if columns else list(range(len(header)))
        lines = [[header[i] for i in idx]]
        for row in rows:
            cells = table_cells(row, header)
            lines.append([cells[i] for i in idx])
        return tabwrite(lines)
    if columns:
        raise CommandError("--columns is only supported with the table format")
    if fmt == "json":
        return show.format_json(rows)
    if fmt == "yaml":
        return format_yaml_go(rows)
    raise CommandError(f"unknown format {fmt!r}")


_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
_NUMBER = re.compile(
    r"^[-+]?(\.?[0-9][0-9_]*(\.[0-9_]*)?([eE][-+]?[0-9]+)?|0x[0-9a-fA-F_]+|0o[0-7_]+|"
    r"\.(inf|Inf|INF)|\.(nan|NaN|NAN))$"
)
_OTHER_TYPES = {"true", "false", "True", "False", "TRUE", "FALSE", "yes", "no", "Yes", "No",
                "YES", "NO", "on", "off", "On", "Off", "ON", "OFF", "y", "n", "Y", "N",
                "null", "Null", "NULL", "~"}


def _go_scalar(value: Any) -> str:
    """One scalar as Go's yaml.v3 writes it (quoting only where needed)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    text = str(value)
    if text == "" or text in _OTHER_TYPES or _NUMBER.match(text):
        return '"' + text + '"'
    if _TIMESTAMP.match(text):
        return text  # time values are written plain
    if "\n" in text or any(ord(c) < 32 for c in text):
        return json.dumps(text)
    if (
        text[0] in "-?:,[]{}#&*!|>'\"%@` "
        or text[-1] in ": "
        or ": " in text
        or " #" in text
    ):
        return "'" + text.replace("'", "''") + "'"
    return text


def _go_block(value: Any, indent: int, out: list[str], first_prefix: str | None = None) -> None:
    """Emit a mapping or sequence at logical ``indent``. ``first_prefix`` is the ``- `` line a
    mapping inside a sequence item starts on (its other keys go 2 columns in)."""
    if isinstance(value, dict):
        for n, (k, v) in enumerate(value.items()):
            if first_prefix is not None:
                lead = first_prefix if n == 0 else " " * (indent + 2)
            else:
                lead = " " * indent
            key = _go_scalar(k)
            if isinstance(v, dict | list) and v:
                out.append(f"{lead}{key}:")
                _go_block(v, indent + 4, out)
            elif isinstance(v, dict):
                out.append(f"{lead}{key}: {{}}")
            elif isinstance(v, list):
                out.append(f"{lead}{key}: []")
            else:
                out.append(f"{lead}{key}: {_go_scalar(v)}")
        return
    for item in value:
        dash = " " * indent + "- "
        if isinstance(item, dict) and item:
            _go_block(item, indent, out, first_prefix=dash)
        elif isinstance(item, list) and item:
            out.append(dash.rstrip())
            _go_block(item, indent + 4, out)
        elif isinstance(item, dict):
            out.append(dash + "{}")
        elif isinstance(item, list):
            out.append(dash + "[]")
        else:
            out.append(dash + _go_scalar(item))


def format_yaml_go(rows: Iterable[Any]) -> str:
    """Rows as YAML documents separated by ``---``, laid out and quoted like Go's yaml.v3
    with an indent of 4 (the upstream ``db/show -f yaml``); each row's ``to_yaml()`` when
    it has one."""
    docs: list[str] = []
    for row in rows:
        doc = show.to_plain(row.to_yaml() if hasattr(row, "to_yaml") else row)
        lines: list[str] = []
        if isinstance(doc, dict | list) and doc:
            _go_block(doc, 0, lines)
        else:
            lines.append(_go_scalar(doc))
        docs.append("\n".join(lines) + "\n")
    return "---\n".join(docs)


def _emit(state: State, out_file: str | None, text: str) -> str | None:
    if out_file:
        state.write(out_file, text)
        return None
    return text


_SHOW_FLAGS = {"format": True, "out": True, "columns": True}
_SHOW_ALIASES = {"f": "format", "o": "out"}


async def cmd_db_show(state: State, args: list[str]) -> str | None:
    """``db/show table [-f table|yaml|json] [-o file] [--columns=a,b]``."""
    flags, rest = parse_flags(args, _SHOW_FLAGS, _SHOW_ALIASES)
    if len(rest) != 1:
        raise CommandError("usage: db/show table [-f fmt] [-o file] [--columns=...]")
    table = _table(state, rest[0])
    rows = list(table.all(_db(state).read_txn()))
    cols = flags["columns"].split(",") if flags.get("columns") else None
    text = _show_text(table, rows, flags.get("format", "table"), cols)
    return _emit(state, flags.get("out"), text)


async def _query(state: State, args: list[str], prefix: bool) -> str | None:
    flags, rest = parse_flags(
        args, {**_SHOW_FLAGS, "index": True}, {**_SHOW_ALIASES, "i": "index"}
    )
    if len(rest) != 2:
        raise CommandError("usage: db/list|db/prefix [-i index] [-o file] [--columns] table key")
    table = _table(state, rest[0])
    key = rest[1]
    try:
        index = table.index(flags["index"]) if "index" in flags else table.primary
        query = index.query_bytes(b"") if key == "" else index.query_str(key)
    except CommandError:
        raise
    except Exception as e:
        raise CommandError(f"bad key {key!r} for {table.name}: {e}") from None
    txn = _db(state).read_txn()
    rows = list(table.prefix(txn, query) if prefix else table.list(txn, query))
    cols = flags["columns"].split(",") if flags.get("columns") else None
    text = _show_text(table, rows, flags.get("format", "table"), cols)
    return _emit(state, flags.get("out"), text)


async def cmd_db_list(state: State, args: list[str]) -> str | None:
    """``db/list [-i index] [-o file] [--columns=...] table key``: exact index query."""
    return await _query(state, args, prefix=False)


async def cmd_db_prefix(state: State, args: list[str]) -> str | None:
    """``db/prefix [-i index] [-o file] [--columns=...] table key``: prefix index query."""
    return await _query(state, args, prefix=True)


async def cmd_db_initialized(state: State, args: list[str]) -> None:
    """``db/initialized [--timeout=d] [table...]``: wait until the tables are initialized."""
    flags, rest = parse_flags(args, {"timeout": True})
    timeout = parse_duration(flags["timeout"]) if "timeout" in flags else CMP_TIMEOUT
    db = _db(state)
    tables = [_table(state, n) for n in rest] if rest else db.tables
    with anyio.move_on_after(timeout):
        for t in tables:
            while True:
                done, watch = t.initialized(db.read_txn())
                if done:
                    break
                with anyio.move_on_after(0.05):
                    await watch.wait_async()
        return
    pending = {t.name: t.pending_initializers(db.read_txn()) for t in tables}
    raise CommandError(f"timed out waiting for initialization: {pending}")


def _yaml_docs(state: State, names: list[str]) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    for name in names:
        try:
            docs = list(yaml.safe_load_all(state.read(name)))
        except yaml.YAMLError as e:
            raise CommandError(f"{name}: invalid YAML: {e}") from None
        for doc in docs:
            if doc is None:
                continue
            if not isinstance(doc, dict):
                raise CommandError(f"{name}: expected a mapping, got {type(doc).__name__}")
            out.append((name, doc))
    return out


async def _insert_or_delete(state: State, args: list[str], insert: bool) -> None:
    if len(args) < 2:
        raise CommandError("usage: db/insert|db/delete table file...")
    table = _table(state, args[0])
    decode = getattr(state.harness, "decode_row", None)
    if decode is None:
        raise CommandError(f"rows of table {table.name} cannot be written from YAML")
    rows = []
    for name, doc in _yaml_docs(state, args[1:]):
        try:
            rows.append(decode(table.name, doc))
        except CommandError:
            raise
        except Exception as e:
            raise CommandError(f"{name}: {e}") from None
    await state.harness.write_rows(table, rows, insert)


async def cmd_db_insert(state: State, args: list[str]) -> None:
    """``db/insert table file...``: insert rows given as YAML documents."""
    await _insert_or_delete(state, args, insert=True)


async def cmd_db_delete(state: State, args: list[str]) -> None:
    """``db/delete table file...``: delete rows given as YAML documents."""
    await _insert_or_delete(state, args, insert=False)


def db_commands() -> dict[str, Command]:
    """The statedb commands."""
    return {
        "db": cmd_db,
        "db/cmp": cmd_db_cmp,
        "db/delete": cmd_db_delete,
        "db/empty": cmd_db_empty,
        "db/initialized": cmd_db_initialized,
        "db/insert": cmd_db_insert,
        "db/list": cmd_db_list,
        "db/prefix": cmd_db_prefix,
        "db/show": cmd_db_show,
    }
