"""Tests of statedb.show: column choice, value conversion and the three output formats."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import ipaddress
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from statedb import DB, Index, Table, TableNotRegisteredError, keys, show
from tests.statedb.helpers import OBJ1, OBJ2, Obj, new_db


class Color(enum.Enum):
    """An enum with str values (shown by value)."""

    RED = "red"
    BLUE = "blue"


class Mode(enum.Enum):
    """An enum with non-str values (shown by name)."""

    FAST = (1, 2)


@dataclass(frozen=True, slots=True)
class Inner:
    """A nested dataclass."""

    a: int
    b: str


@dataclass(frozen=True, slots=True)
class Rich:
    """A row with one field of every specially handled type and no show hooks."""

    name: str
    addr: ipaddress.IPv4Address | ipaddress.IPv6Address
    net: ipaddress.IPv6Network
    color: Color
    mode: Mode
    labels: frozenset[str]
    when: datetime.datetime
    raw: bytes
    inner: Inner
    extra: dict[str, int] = field(default_factory=dict)
    note: str | None = None
    flag: bool = False


RICH = Rich(
    name="n1",
    addr=ipaddress.ip_address("2001:db8::1"),
    net=ipaddress.IPv6Network("2001:db8::/64"),
    color=Color.RED,
    mode=Mode.FAST,
    labels=frozenset({"z", "a"}),
    when=datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.UTC),
    raw=b"\x01\xff",
    inner=Inner(1, "x"),
    extra={"k": 2},
)

RICH_PLAIN: dict[str, Any] = {
    "name": "n1",
    "addr": "2001:db8::1",
    "net": "2001:db8::/64",
    "color": "red",
    "mode": "FAST",
    "labels": ["a", "z"],
    "when": "2024-05-06T07:08:09+00:00",
    "raw": "01ff",
    "inner": {"a": 1, "b": "x"},
    "extra": {"k": 2},
    "note": None,
    "flag": False,
}


def test_to_plain_converts_agent_field_types() -> None:
    """Addresses, enums, sets, times, bytes and nested dataclasses become plain data."""
    assert show.to_plain(RICH) == RICH_PLAIN
    assert show.to_plain(frozenset({3, "a"})) == [3, "a"]  # mixed types still sort
    assert show.to_plain((1, ipaddress.ip_network("10.0.0.0/8"))) == [1, "10.0.0.0/8"]
    assert show.to_plain(datetime.timedelta(seconds=1.5)) == 1.5


def test_default_columns_are_dataclass_fields() -> None:
    """Without table_header/table_row, every dataclass field is a column."""
    text = show.format_rows([RICH], "table")
    header, row = text.splitlines()
    assert header.split() == list(RICH_PLAIN)
    assert "2001:db8::1" in row and "a, z" in row and "k=2" in row and "false" in row
    assert show.format_rows([RICH], "table", columns=["name", "color"]) == (
        "name   color\nn1     red\n"
    )


def test_alignment_three_space_gap_and_no_trailing_blanks() -> None:
    """Columns are padded to the widest cell plus three spaces; the last is not padded."""

    @dataclass(frozen=True)
    class Pair:
        left: str
        right: str

    rows = [Pair("a", ""), Pair("longer", "x"), Pair("", "")]
    assert show.format_rows(rows) == "left     right\na\nlonger   x\n\n"
    assert show.format_rows(rows, columns=["right", "left"]) == (
        "right   left\n        a\nx       longer\n\n"
    )


def test_table_header_may_be_an_instance_method() -> None:
    """A table_header that needs an instance is called on the first row."""

    @dataclass(frozen=True)
    class Row:
        v: int

        def table_header(self) -> list[str]:
            return ["Value"]

        def table_row(self) -> list[str]:
            return [f"<{self.v}>"]

    assert show.format_rows([Row(1), Row(22)]) == "Value\n<1>\n<22>\n"
    with pytest.raises(TypeError):
        show.format_rows([], row_type=Row)


def test_table_row_must_match_header() -> None:
    """A table_row with the wrong number of cells is reported, not misaligned."""

    @dataclass(frozen=True)
    class Bad:
        v: int

        @staticmethod
        def table_header() -> list[str]:
            return ["A", "B"]

        def table_row(self) -> list[str]:
            return ["only one"]

    with pytest.raises(ValueError, match="1 cells for 2 columns"):
        show.format_rows([Bad(1)])


def test_rows_of_unknown_type_are_refused() -> None:
    """A row that is neither a dataclass nor defines table_header cannot be tabulated."""
    with pytest.raises(TypeError, match="table_header"):
        show.format_rows([object()])
    # JSON and YAML still work, through str().
    assert show.format_rows([1, "x"], "json") == '1\n"x"\n'


def test_bad_format_and_columns() -> None:
    """Unknown formats and columns name the valid choices; columns only for tables."""
    with pytest.raises(ValueError, match="table, json, yaml"):
        show.format_rows([OBJ1], "xml")
    with pytest.raises(ValueError, match="columns are: ID, Key, Prefix, Tags"):
        show.format_rows([OBJ1], "table", columns=["Nope"])
    with pytest.raises(ValueError, match="only be chosen for the table format"):
        show.format_rows([OBJ1], "json", columns=["ID"])


def test_json_and_yaml_round_trip() -> None:
    """JSON objects follow each other; YAML documents are separated by ---; both parse back."""
    rows = [RICH, dataclasses.replace(RICH, name="n2")]
    text = show.format_rows(rows, "json")
    decoder = json.JSONDecoder()
    parsed: list[Any] = []
    pos = 0
    while pos < len(text):
        value, end = decoder.raw_decode(text, pos)
        parsed.append(value)
        pos = end + 1  # the newline after each object
    assert parsed == [RICH_PLAIN, {**RICH_PLAIN, "name": "n2"}]
    ytext = show.format_rows(rows, "yaml")
    assert ytext.count("\n---\n") == 1
    assert list(yaml.safe_load_all(ytext)) == parsed
    assert "labels:\n    - a\n    - z\n" in ytext


def test_empty_rows() -> None:
    """No rows: a header only (when the type is known), and empty JSON/YAML."""
    assert show.format_rows([], "table", row_type=Obj) == "ID   Key   Prefix   Tags\n"
    assert show.format_rows([], "table") == ""
    assert show.format_rows([], "json") == ""
    assert show.format_rows([], "yaml") == ""


def test_show_table_finds_the_row_type() -> None:
    """The header of an empty table comes from Table[Row], the row_type argument, or nothing."""

    @dataclass(frozen=True)
    class Row:
        key: str
        value: int

    idx: Index[Row, str] = Index("key", key=lambda r: r.key)
    typed = Table[Row]("typed", idx)
    untyped: Table[Row] = Table("untyped", idx)
    tagged = Table("tagged", idx, row_type=Row)
    db = DB(typed, untyped, tagged)
    assert show.show_table(db, "typed") == "key   value\n"
    assert show.show_table(db, "tagged") == "key   value\n"
    assert show.show_table(db, "untyped") == ""
    with db.write_txn(untyped) as txn:
        untyped.insert(txn, Row("k", 1))
    assert show.show_table(db, "untyped") == "key   value\nk     1\n"
    with pytest.raises(TableNotRegisteredError):
        show.show_table(db, "nope")


def test_show_table_reads_the_given_snapshot() -> None:
    """show_table shows the snapshot it is given, not later commits."""
    db, (t1,) = new_db("t1")
    with db.write_txn(t1) as txn:
        t1.insert(txn, OBJ1)
    old = db.read_txn()
    with db.write_txn(t1) as txn:
        t1.insert(txn, OBJ2)
    assert show.show_table(db, "t1", columns=["ID"], txn=old) == "ID\n1\n"
    assert show.show_table(db, "t1", columns=["ID"]) == "ID\n1\n2\n"


def test_dump_json_is_valid_json() -> None:
    """dump_json gives one JSON document of every table, empty ones included."""
    db, (t1, _) = new_db("a", "b")
    with db.write_txn(t1) as txn:
        t1.insert(txn, OBJ1)
        t1.insert(txn, OBJ2)
    doc = json.loads(show.dump_json(db))
    assert doc == {"a": [OBJ1.to_json(), OBJ2.to_json()], "b": []}
    assert show.dump_json(DB()) == "{}\n"


def test_cells_are_single_line() -> None:
    """Newlines and tabs in values cannot break the table layout."""

    @dataclass(frozen=True)
    class Text:
        t: str

    assert show.format_rows([Text("a\tb\nc")]) == "t\na b c\n"


def test_ip_keys_and_show_agree() -> None:
    """The prefix column shows the network the key encodes (IPv4 and IPv6)."""
    for text in ["10.0.0.0/8", "2001:db8::/32"]:
        net = ipaddress.ip_network(text)
        assert len(keys.ip_network(net)) == 17
        assert show.format_cell(net) == text
