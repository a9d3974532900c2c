"""Tests of the txtar parser, the script engine and the db commands on our own scripts
(tests/conformance/testdata), independent of the load balancer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from statedb import DB, Index, Table, WriteTxn
from tests.conformance import txtar
from tests.conformance.dbcmds import db_commands, split_by_positions, split_header
from tests.conformance.engine import (
    CommandError,
    Engine,
    ScriptFailure,
    State,
    Unsupported,
    expand_args,
    parse_duration,
    parse_line,
)
from tests.conformance.runner import run_archive, shebang_flags

TESTDATA = Path(__file__).parent / "testdata"


# ----- txtar ------------------------------------------------------------------------
def test_txtar_splits_comment_and_files() -> None:
    """The comment ends at the first marker; files keep their bytes."""
    a = txtar.parse("#! --x\nhive start\n-- a.txt --\none\ntwo\n-- b --\n-- c.yaml --\nk: v")
    assert a.comment == "#! --x\nhive start\n"
    assert a.files == {"a.txt": "one\ntwo\n", "b": "", "c.yaml": "k: v"}


def test_txtar_extract_rejects_escaping_names(tmp_path: Path) -> None:
    """A file name cannot leave the work directory."""
    with pytest.raises(ValueError, match="outside"):
        txtar.extract(txtar.parse("-- ../x --\nbad\n"), tmp_path)


def test_shebang_flags_replace_work(tmp_path: Path) -> None:
    """Flags come from the first line only, with $WORK replaced."""
    assert shebang_flags("#! --a=1 --f=$WORK/s.yaml\n#! --b\n", tmp_path) == [
        "--a=1",
        f"--f={tmp_path}/s.yaml",
    ]
    assert shebang_flags("#! \nx\n", tmp_path) == []
    assert shebang_flags("# comment\n", tmp_path) == []


# ----- line parsing -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "want", "conds", "name", "args"),
    [
        ("* cmp a b", "*", [], "cmp", ["a", "b"]),
        ("!* http/get x", "!*", [], "http/get", ["x"]),
        ("[privileged] stop", "", [(True, "privileged")], "stop", []),
        ("[!privileged] ! grep x f", "!", [(False, "privileged")], "grep", ["x", "f"]),
        ("replace '$X' 'a b' f # note", "", [], "replace", ["$X", "a b", "f"]),
        ("echo 'it''s' ''", "", [], "echo", ["it's", ""]),
        ('grep "quoted" f', "", [], "grep", ['"quoted"', "f"]),
        ("echo $V-${V}x '$V'", "", [], "echo", ["v-vx", "$V"]),
    ],
)
def test_parse_line(
    text: str, want: str, conds: list[tuple[bool, str]], name: str, args: list[str]
) -> None:
    """Prefixes, conditions, quoting, comments and expansion follow the script language."""
    line = parse_line(1, text)
    assert line is not None
    assert (line.want, line.conds, line.name) == (want, conds, name)
    assert expand_args(line, {"V": "v"}) == args


def test_parse_line_errors() -> None:
    """Blank lines are skipped; broken quoting and bare prefixes are errors."""
    assert parse_line(1, "   # only a comment") is None
    with pytest.raises(CommandError, match="unterminated"):
        parse_line(1, "echo 'open")
    with pytest.raises(CommandError, match="missing command"):
        parse_line(1, "* ")


def test_parse_duration() -> None:
    """Go durations."""
    assert parse_duration("100ms") == pytest.approx(0.1)
    assert parse_duration("1m30s") == pytest.approx(90)
    assert parse_duration("0.1s") == pytest.approx(0.1)
    with pytest.raises(CommandError):
        parse_duration("5 s")


def test_header_positions() -> None:
    """Header names and their start columns cut expected rows."""
    names, pos = split_header("Name    Zone Up")
    assert (names, pos) == (["Name", "Zone", "Up"], [0, 8, 13])
    assert split_by_positions("alpha   eu   true  ", pos) == ["alpha", "eu", "true"]
    assert split_by_positions("alpha", pos) == ["alpha", "", ""]


# ----- a toy table for the db commands ---------------------------------------------------
@dataclass(frozen=True, slots=True)
class Host:
    """A row of the toy table."""

    name: str
    zone: str
    up: bool = False

    @staticmethod
    def table_header() -> list[str]:
        """Columns."""
        return ["Name", "Zone", "Up"]

    def table_row(self) -> list[str]:
        """Cells."""
        return [self.name, self.zone, "true" if self.up else "false"]


class ToyHarness:
    """Just a DB with one table; rows are written from YAML."""

    def __init__(self) -> None:
        self.hosts: Table[Host] = Table(
            "hosts",
            Index("name", key=lambda h: h.name),
            Index("zone", key=lambda h: h.zone, unique=False),
        )
        self.db = DB(self.hosts)

    def decode_row(self, table: str, doc: dict[str, Any]) -> Host:
        """YAML mapping -> Host."""
        return Host(str(doc["name"]), str(doc.get("zone", "")), bool(doc.get("up", False)))

    async def write_rows(self, table: Table[Any], rows: list[Any], insert: bool) -> None:
        """Insert or delete in one transaction."""
        txn: WriteTxn
        with self.db.write_txn(table) as txn:
            for row in rows:
                if insert:
                    table.insert(txn, row)
                else:
                    table.delete(txn, row)


@asynccontextmanager
async def toy_harness(flags: list[str], workdir: Path) -> AsyncIterator[ToyHarness]:
    """Factory for run_archive."""
    yield ToyHarness()


def _engine(**kw: Any) -> Engine:
    return Engine(db_commands(), retry_timeout=2.0, **kw)


def test_generic_script_passes() -> None:
    """Every generic command on our own script."""
    result = run_archive(TESTDATA / "generic.txtar", _engine())
    assert result.passed, result.describe()


def test_tables_script_passes() -> None:
    """db/insert, db/cmp (positions, grep, blank lines), db/show, db/list, db/prefix, db/delete."""
    result = run_archive(TESTDATA / "tables.txtar", _engine(), toy_harness)
    assert result.passed, result.describe()


def test_failure_names_line_and_diff() -> None:
    """A failing command stops the script; the report has the line number and a diff."""
    result = run_archive(TESTDATA / "failing.txtar", _engine())
    assert not result.passed
    assert result.line == 5
    assert result.command == "cmp a.txt b.txt"
    assert "-one" in result.diff and "+two" in result.diff


def _run_script(script: str, engine: Engine, tmp_path: Path) -> State:
    state = State(workdir=tmp_path)
    anyio.run(engine.execute, state, script)
    return state


def test_retry_reruns_the_section(tmp_path: Path) -> None:
    """`*` re-runs the section's earlier commands too, until the retried one succeeds."""
    calls: list[str] = []

    async def produce(state: State, args: list[str]) -> None:
        calls.append("produce")
        state.write("out.txt", "ready\n" if len(calls) >= 5 else "not yet\n")

    engine = _engine()
    engine.commands["produce"] = produce
    _run_script("# section\nproduce\n* grep ready out.txt\n", engine, tmp_path)
    assert calls.count("produce") >= 3


def test_retry_until_failure_and_timeout(tmp_path: Path) -> None:
    """`!*` waits for failure; a retry that never succeeds fails at the deadline."""
    engine = Engine(retry_timeout=0.2)
    (tmp_path / "f").write_text("x\n")
    _run_script("!* grep y f\n", engine, tmp_path)
    with pytest.raises(ScriptFailure, match="retry deadline"):
        _run_script("* grep y f\n", engine, tmp_path)


def test_script_deadline_bounds_retries(tmp_path: Path) -> None:
    """Retries stop at the script deadline even when the per-command timeout is longer."""
    engine = Engine(retry_timeout=60.0, script_timeout=0.3)
    (tmp_path / "f").write_text("x\n")
    with pytest.raises(ScriptFailure, match="retry deadline"):
        _run_script("* grep y f\n", engine, tmp_path)


def test_retry_gives_up_when_idle(tmp_path: Path) -> None:
    """With a quiescence probe reporting an idle system, retries stop early."""

    async def idle(state: State) -> str:
        return "idle"

    engine = Engine(retry_timeout=30.0, quiescence=idle)
    (tmp_path / "f").write_text("x\n")
    with pytest.raises(ScriptFailure, match="idle") as info:
        _run_script("* grep y f\n", engine, tmp_path)
    assert "retry deadline" not in str(info.value)


def test_unsupported_command_and_condition(tmp_path: Path) -> None:
    """Unknown commands and conditions are reported as unsupported, even under `!`."""
    with pytest.raises(ScriptFailure, match="unsupported: frobnicate"):
        _run_script("! frobnicate\n", Engine(), tmp_path)
    with pytest.raises(ScriptFailure, match=r"unsupported: condition \[linux\]"):
        _run_script("[linux] echo\n", Engine(), tmp_path)


def test_unexpected_success(tmp_path: Path) -> None:
    """`!` fails the script when the command succeeds."""
    with pytest.raises(ScriptFailure, match="unexpected command success"):
        _run_script("! echo hi\n", Engine(), tmp_path)


def test_privileged_condition(tmp_path: Path) -> None:
    """`[privileged] stop` ends the script only when privileged."""
    state = State(workdir=tmp_path, privileged=True)
    anyio.run(Engine().execute, state, "[privileged] stop\n! echo unreachable\n")
    with pytest.raises(ScriptFailure):
        _run_script("[privileged] stop\n! echo reached\n", Engine(), tmp_path)


def test_unsupported_is_a_command_error() -> None:
    """Unsupported is reported with the 'unsupported: <what>' text."""
    assert Unsupported("x").message == "unsupported: x"


def test_checks_and_silent_commands_keep_the_last_output(tmp_path: Path) -> None:
    """As upstream: only a command with output replaces it, so two stdout checks (or a
    silent command in between) read the same output."""
    (tmp_path / "f").write_text("x\n")
    _run_script(
        "echo alpha beta\n* stdout alpha\nstdout beta\ncp f g\nstdout beta\n",
        Engine(),
        tmp_path,
    )
    with pytest.raises(ScriptFailure, match="no match"):
        _run_script("echo alpha\necho beta\nstdout alpha\n", Engine(), tmp_path)


def test_commands_see_the_next_command(tmp_path: Path) -> None:
    """`State.next_command` names the command that runs right after the current one:
    blank, comment and inactive lines are skipped, "" after the last one; in a retried
    section, the next line of the section."""
    seen: list[tuple[str, str]] = []

    def note(tag: str) -> Any:
        async def cmd(state: State, args: list[str]) -> None:
            seen.append((tag, state.next_command))

        return cmd

    engine = _engine()
    engine.commands.update({"a": note("a"), "b": note("b"), "c": note("c")})
    _run_script("a\n\n# comment\n[privileged] c\nb\nc\n", engine, tmp_path)
    assert seen == [("a", "b"), ("b", "c"), ("c", "")]
    # A line that will fail to parse or names an unknown condition: not known.
    seen.clear()
    with pytest.raises(ScriptFailure):
        _run_script("a\n[nope] b\n", engine, tmp_path)
    assert seen == [("a", "")]

    seen.clear()
    (tmp_path / "f").write_text("x\n")
    tries = 0

    async def flaky(state: State, args: list[str]) -> None:
        nonlocal tries
        tries += 1
        seen.append(("flaky", state.next_command))
        if tries < 2:
            raise CommandError("not yet")

    engine.commands["flaky"] = flaky
    _run_script("# section\na\nb\n* flaky\nc\n", engine, tmp_path)
    assert seen == [
        ("a", "b"), ("b", "flaky"), ("flaky", "c"),  # first run
        ("a", "b"), ("b", "flaky"), ("flaky", ""),  # the section retried
        ("c", ""),
    ]
