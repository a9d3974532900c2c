"""Introspection: render the rows of a table (or of any query) as a text table, JSON or YAML.

This is what ``statewright db show TABLE`` prints, so an operator can look at the
live state of a node agent without a debugger. Three formats:

``table``
    One header line and one line per row; every column but the last is padded to
    its widest cell plus a gap of three spaces, trailing blanks are dropped. A row
    type chooses its columns by defining ``table_header() -> list[str]`` (callable
    on the class, or else on a row) and ``table_row() -> list[str]``; otherwise the
    dataclass fields are the columns. ``columns`` picks and orders a subset.
``json``
    One indented JSON object per row, one after another (not a JSON array), so the
    output of a long table can be streamed and grepped. A row type may define
    ``to_json()`` to choose what is shown; otherwise its dataclass fields are used.
``yaml``
    One YAML document per row, documents separated by ``---``, block style with
    sequences indented under their key. ``to_yaml()`` plays the part of
    ``to_json()``.

Values are converted for display by `to_plain`: IP addresses and networks as
text, enum members by value (when it is a str or int) else by name, sets sorted,
datetimes in ISO 8601, bytes in hex, nested dataclasses as mappings.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import functools
import ipaddress
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, get_args

if TYPE_CHECKING:
    from statedb.db import DB
    from statedb.table import Table
    from statedb.txn import ReadTxn

Format = Literal["table", "json", "yaml"]
FORMATS: tuple[str, ...] = get_args(Format)

#: Spaces between two columns of the text table.
COLUMN_GAP = 3

_IP_TYPES = (
    ipaddress.IPv4Address,
    ipaddress.IPv6Address,
    ipaddress.IPv4Network,
    ipaddress.IPv6Network,
    ipaddress.IPv4Interface,
    ipaddress.IPv6Interface,
)


# ----- value conversion ---------------------------------------------------------
def _sorted_items(values: Iterable[Any]) -> list[Any]:
    """Sort a set's converted members; mixed types fall back to their text order."""
    items = [to_plain(v) for v in values]
    try:
        return sorted(items)
    except TypeError:
        return sorted(items, key=lambda v: (type(v).__name__, str(v)))


def to_plain(value: Any) -> Any:
    """Convert ``value`` into JSON/YAML-ready data (dict, list, str, int, float, bool, None).

    Rows are arbitrary Python objects; serializers only know the plain types, so the
    common field types of agent state (addresses, enums, sets, times) are mapped to
    their natural text form here, in one place, for every format.
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, enum.Enum):
        v = value.value
        return v if isinstance(v, str | int) and not isinstance(v, bool) else value.name
    if isinstance(value, str | int | float):
        return value
    if isinstance(value, _IP_TYPES):
        return str(value)
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(to_plain(k)): to_plain(v) for k, v in value.items()}
    if isinstance(value, set | frozenset):
        return _sorted_items(value)
    if isinstance(value, Sequence):
        return [to_plain(v) for v in value]
    if isinstance(value, Iterable):
        return [to_plain(v) for v in value]
    return str(value)


def format_cell(value: Any) -> str:
    """Render one value as the text of a table cell (collections joined with ", ")."""
    plain = to_plain(value)
    if plain is None:
        return ""
    if isinstance(plain, bool):
        return "true" if plain else "false"
    if isinstance(plain, list):
        return ", ".join(format_cell(v) for v in plain)
    if isinstance(plain, dict):
        return ", ".join(f"{k}={format_cell(v)}" for k, v in plain.items())
    # A cell is one line; tabs and newlines would break the column layout.
    return str(plain).replace("\t", " ").replace("\n", " ")


# ----- text tables ----------------------------------------------------------------
def header_of(row_type: type | None, rows: Sequence[Any]) -> list[str]:
    """Column names of ``row_type``: its ``table_header()`` or its dataclass fields."""
    if row_type is None and rows:
        row_type = type(rows[0])
    if row_type is None:
        return []
    header_fn = getattr(row_type, "table_header", None)
    if header_fn is not None:
        try:
            return list(header_fn())
        except TypeError:
            # An instance method: it needs a row to be called on.
            if rows:
                return list(rows[0].table_header())
            raise
    if dataclasses.is_dataclass(row_type):
        return [f.name for f in dataclasses.fields(row_type)]
    raise TypeError(
        f"cannot show rows of type {row_type.__name__}: define table_header()/table_row() "
        "or make it a dataclass"
    )


def _cells_of(row: Any, header: list[str]) -> list[str]:
    """The cells of one row, in header order."""
    row_fn = getattr(row, "table_row", None)
    if row_fn is not None:
        cells = [format_cell(c) if not isinstance(c, str) else c for c in row_fn()]
        if len(cells) != len(header):
            raise ValueError(
                f"{type(row).__name__}.table_row() gave {len(cells)} cells for "
                f"{len(header)} columns {header}"
            )
        return [c.replace("\t", " ").replace("\n", " ") for c in cells]
    return [format_cell(getattr(row, name)) for name in header]


def _select(header: list[str], columns: Sequence[str] | None) -> list[int]:
    """Positions of ``columns`` in ``header`` (all columns when None)."""
    if columns is None:
        return list(range(len(header)))
    positions: list[int] = []
    for name in columns:
        if name not in header:
            raise ValueError(f"unknown column {name!r}; columns are: {', '.join(header)}")
        positions.append(header.index(name))
    return positions


def format_table(
    rows: Iterable[Any],
    columns: Sequence[str] | None = None,
    row_type: type | None = None,
) -> str:
    """Render rows as an aligned text table (header line first, one line per row).

    ``row_type`` gives the header when there are no rows; without it the first
    row's type is used.
    """
    items = list(rows)
    header = header_of(row_type, items)
    pick = _select(header, columns)
    lines = [[header[i] for i in pick]]
    for row in items:
        cells = _cells_of(row, header)
        lines.append([cells[i] for i in pick])
    if not pick:
        return ""
    widths = [max(len(line[c]) for line in lines) for c in range(len(pick))]
    out: list[str] = []
    for line in lines:
        parts = [cell.ljust(widths[c] + COLUMN_GAP) for c, cell in enumerate(line[:-1])]
        parts.append(line[-1])
        out.append("".join(parts).rstrip() + "\n")
    return "".join(out)


# ----- JSON and YAML --------------------------------------------------------------
def _document(row: Any, hook: str) -> Any:
    """The data shown for one row: the row's own ``hook()`` when it has one."""
    fn = getattr(row, hook, None)
    return to_plain(fn() if fn is not None else row)


def format_json(rows: Iterable[Any]) -> str:
    """Render rows as indented JSON objects, one after another."""
    return "".join(
        json.dumps(_document(row, "to_json"), indent=2, ensure_ascii=False) + "\n"
        for row in rows
    )


@functools.cache
def _dumper() -> type[Any]:
    """The YAML dumper class, built on first use: PyYAML is imported only when YAML is asked
    for, so statedb itself does not depend on it (it comes with the ``agent`` extra)."""
    import yaml

    class _Dumper(yaml.SafeDumper):
        """Block-style YAML with sequences indented under their key (``key:\\n    - item``)."""

        def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
            """Never emit indentless sequences."""
            super().increase_indent(flow, False)

    return _Dumper


def format_yaml(rows: Iterable[Any]) -> str:
    """Render rows as YAML documents separated by ``---`` (needs PyYAML)."""
    import yaml

    docs = [_document(row, "to_yaml") for row in rows]
    if not docs:
        return ""
    text: str = yaml.dump_all(
        docs,
        Dumper=_dumper(),
        indent=4,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
    )
    return text


def format_rows(
    rows: Iterable[Any],
    fmt: str = "table",
    columns: Sequence[str] | None = None,
    row_type: type | None = None,
) -> str:
    """Render the rows of a query (e.g. ``table.list(txn, q)``) in format ``fmt``.

    ``columns`` applies to the table format only; asking for it with JSON or YAML
    is an error rather than silently ignored.
    """
    if fmt == "table":
        return format_table(rows, columns, row_type)
    if columns is not None:
        raise ValueError(f"columns can only be chosen for the table format, not {fmt!r}")
    if fmt == "json":
        return format_json(rows)
    if fmt == "yaml":
        return format_yaml(rows)
    raise ValueError(f"unknown format {fmt!r}; use one of: {', '.join(FORMATS)}")


def row_type_of(table: Table[Any]) -> type | None:
    """The row type of ``table`` when known: its ``row_type``, or ``Table[Row](...)``'s."""
    if table.row_type is not None:
        return table.row_type
    orig = getattr(table, "__orig_class__", None)
    for arg in get_args(orig) if orig is not None else ():
        if isinstance(arg, type):
            return arg
    return None


def show_table(
    db: DB,
    table_name: str,
    fmt: str = "table",
    columns: Sequence[str] | None = None,
    txn: ReadTxn | None = None,
) -> str:
    """Render every row of the table called ``table_name`` (what ``db show TABLE`` prints).

    Reads a fresh snapshot unless ``txn`` is given; raises TableNotRegisteredError
    for an unknown table and ValueError for an unknown format or column.
    """
    table = db.table(table_name)
    snapshot = txn if txn is not None else db.read_txn()
    return format_rows(table.all(snapshot), fmt, columns, row_type_of(table))


def dump_json(db: DB, txn: ReadTxn | None = None) -> str:
    """Render every table as one JSON object: table name -> list of compact rows.

    Meant for bug reports: one self-contained document of the whole database.
    """
    snapshot = txn if txn is not None else db.read_txn()
    parts: list[str] = []
    for table in db.tables:
        rows = [
            "    " + json.dumps(_document(r, "to_json"), separators=(",", ":"), ensure_ascii=False)
            for r in table.all(snapshot)
        ]
        body = "[\n" + ",\n".join(rows) + "\n  ]" if rows else "[]"
        parts.append(f"  {json.dumps(table.name)}: {body}")
    if not parts:
        return "{}\n"
    return "{\n" + ",\n".join(parts) + "\n}\n"
