"""The script engine: runs the command lines of a Cilium-style script test.

It follows the semantics of the script language of Cilium's test harness
(described in HARNESS-NOTES.md of the corpus):

* a line is split into words at unquoted blanks; ``'...'`` quotes (``''`` inside
  quotes is one ``'``) keep blanks and disable ``$VAR``/``${VAR}`` expansion; an
  unquoted ``#`` ends the line; double quotes are ordinary characters;
* leading words ``[cond]``/``[!cond]`` guard the line, then one of ``!`` (must
  fail), ``?`` (may fail), ``*`` (retry until it succeeds) or ``!*`` (retry until it
  fails);
* a line starting with ``#`` starts a new *section*. When a retried command
  fails, the whole section up to and including it is run again (so a
  ``lb/maps-dump`` followed by ``* cmp`` dumps afresh on each attempt), with a
  backoff from 20 ms doubling up to 500 ms, until it succeeds or the retry
  deadline passes;
* ``stop`` ends the script successfully.

Commands are coroutine functions ``(state, args) -> stdout | None``; they raise
`CommandError` to fail. An unknown command fails the script with
``unsupported: <command>`` whatever the prefix says.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import time
import traceback
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio


class CommandError(Exception):
    """A command failed; ``diff`` (optional) shows expected versus actual."""

    def __init__(self, message: str, diff: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.diff = diff


class Unsupported(CommandError):
    """The script uses something this system does not implement (never retried)."""

    def __init__(self, what: str) -> None:
        super().__init__(f"unsupported: {what}")


class StopScript(Exception):
    """Raised by ``stop``: the script ends here, successfully."""


@dataclass
class ScriptFailure(Exception):
    """The script failed at ``lineno`` (1-based line in the archive)."""

    lineno: int
    line: str
    message: str
    diff: str = ""

    def __str__(self) -> str:
        text = f"line {self.lineno}: {self.line.strip()}: {self.message}"
        return text + ("\n" + self.diff if self.diff else "")


@dataclass
class Line:
    """One parsed command line."""

    lineno: int
    text: str
    conds: list[tuple[bool, str]]
    want: str
    name: str
    raw_args: list[list[tuple[str, bool]]]


_VAR = re.compile(r"\$(?:\{([A-Za-z0-9_]+)\}|([A-Za-z0-9_]+))")


def expand(text: str, env: dict[str, str]) -> str:
    """Replace ``$NAME`` and ``${NAME}`` by their values (unset: empty), as os.Expand does."""
    return _VAR.sub(lambda m: env.get(m.group(1) or m.group(2), ""), text)


def parse_line(lineno: int, text: str) -> Line | None:
    """Parse one script line; None for a blank or comment-only line.

    Raises CommandError for an unterminated quote or a prefix without a command.
    """
    line = Line(lineno, text, [], "", "", [])
    frags: list[tuple[str, bool]] = []
    start = -1
    quoted = False
    i = 0

    def flush() -> None:
        nonlocal frags
        if not frags:
            return
        word = frags
        frags = []
        if not line.name and len(word) == 1 and not word[0][1]:
            arg = word[0][0]
            if arg in ("!", "?", "*", "!*"):
                if line.want:
                    raise CommandError("duplicated '!', '?', '*' or '!*' token")
                line.want = arg
                return
            if arg.startswith("[") and arg.endswith("]"):
                cond = arg[1:-1].strip()
                want = True
                if cond.startswith("!"):
                    want, cond = False, cond[1:].strip()
                if not cond:
                    raise CommandError("empty condition")
                line.conds.append((want, cond))
                return
            line.name = arg
            return
        if not line.name:
            # A quoted command name: take it literally.
            line.name = "".join(s for s, _ in word)
            return
        line.raw_args.append(word)

    while True:
        at_end = i >= len(text)
        if not quoted and (at_end or text[i] in " \t\r\n#"):
            if start >= 0:
                frags.append((text[start:i], False))
                start = -1
            flush()
            if at_end or text[i] == "#":
                break
            i += 1
            continue
        if at_end:
            raise CommandError("unterminated quoted argument")
        if text[i] == "'":
            if not quoted:
                if start >= 0:
                    frags.append((text[start:i], False))
                start = i + 1
                quoted = True
            elif i + 1 < len(text) and text[i + 1] == "'":
                frags.append((text[start:i], True))
                start = i + 1
                i += 1
            else:
                frags.append((text[start:i], True))
                start = i + 1
                quoted = False
            i += 1
            continue
        if start < 0:
            start = i
        i += 1
    if not line.name:
        if line.want or line.conds or line.raw_args:
            raise CommandError("missing command")
        return None
    return line


def expand_args(line: Line, env: dict[str, str]) -> list[str]:
    """The words of ``line`` after ``$VAR`` expansion of their unquoted parts."""
    return ["".join(s if q else expand(s, env) for s, q in word) for word in line.raw_args]


@dataclass
class State:
    """What commands see: the work directory, environment, last output and the harness."""

    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    stdout: str = ""
    stderr: str = ""
    privileged: bool = False
    log: list[str] = field(default_factory=list)
    #: The object the domain commands work on (the LB harness); None for plain scripts.
    harness: Any = None
    #: time.monotonic() after which waiting commands stop waiting (the script deadline).
    deadline: float = float("inf")
    #: The name of the command the engine runs right after the current one ("" when
    #: none, or not known yet): ``k8s/delete`` followed by ``k8s/add`` delivers both
    #: together, as upstream's reflector buffer takes them.
    next_command: str = ""

    def path(self, name: str) -> Path:
        """The file ``name`` relative to the work directory."""
        p = Path(name)
        return p if p.is_absolute() else self.workdir / p

    def read(self, name: str) -> str:
        """Read a work file (``stdout``/``stderr`` name the last command's output)."""
        if name == "stdout":
            return self.stdout
        if name == "stderr":
            return self.stderr
        try:
            return self.path(name).read_text(encoding="utf-8")
        except OSError as e:
            raise CommandError(f"cannot read {name}: {e.strerror or e}") from None

    def write(self, name: str, data: str) -> None:
        """Write a work file."""
        target = self.path(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(data, encoding="utf-8")


Command = Callable[[State, list[str]], Awaitable[str | None]]
Condition = Callable[[State], bool]
#: Returns a token describing the system when it is idle (nothing in flight), else None.
#: Two equal tokens around a failed retry mean that waiting longer cannot help.
QuiescenceProbe = Callable[[State], Awaitable[Hashable | None]]


class Engine:
    """Runs scripts with a table of commands and conditions."""

    def __init__(
        self,
        commands: dict[str, Command] | None = None,
        conditions: dict[str, Condition] | None = None,
        retry_interval: float = 0.02,
        max_retry_interval: float = 0.5,
        retry_timeout: float = 10.0,
        script_timeout: float = 60.0,
        quiescence: QuiescenceProbe | None = None,
        quiet_attempts: int = 3,
    ) -> None:
        self.commands: dict[str, Command] = dict(generic_commands())
        self.commands.update(commands or {})
        self.conditions: dict[str, Condition] = {"privileged": lambda s: s.privileged}
        self.conditions.update(conditions or {})
        self.retry_interval = retry_interval
        self.max_retry_interval = max_retry_interval
        self.retry_timeout = retry_timeout
        self.script_timeout = script_timeout
        self.quiescence = quiescence
        self.quiet_attempts = quiet_attempts

    def _active(self, state: State, line: Line) -> bool:
        for want, tag in line.conds:
            cond = self.conditions.get(tag)
            if cond is None:
                raise Unsupported(f"condition [{tag}]")
            if cond(state) != want:
                return False
        return True

    async def _run(self, state: State, line: Line) -> None:
        """Run one command and check its outcome against the line's prefix."""
        impl = self.commands.get(line.name)
        if impl is None:
            raise Unsupported(line.name)
        args = expand_args(line, state.env)
        state.log.append(f"> {line.text.strip()}")
        try:
            out = await impl(state, args)
        except StopScript:
            raise
        except Unsupported:
            raise
        except CommandError as e:
            state.stdout, state.stderr = "", e.message
            if line.want in ("", "*"):
                raise
            state.log.append(f"[expected failure: {e.message}]")
            return
        except Exception as e:  # a bug or crash below the command: fail this file, clearly
            tb = traceback.format_exc(limit=-8)
            raise CommandError(f"internal error: {type(e).__name__}: {e}", tb) from None
        if out is not None:
            # Like upstream's engine: only a command that produces output replaces the
            # last output; checks (stdout, grep, cmp ...) and silent commands keep it, so
            # `* stdout a` followed by `stdout b` both read the same output.
            state.stdout, state.stderr = out, ""
        if out:
            state.log.append(out.rstrip("\n"))
        if line.want in ("!", "!*"):
            raise CommandError("unexpected command success")

    async def execute(self, state: State, script: str, first_lineno: int = 1) -> None:
        """Run ``script``; raise ScriptFailure at the first failing command.

        Returns normally at the end of the script or at ``stop``.
        """
        section: list[Line] = []
        state.deadline = time.monotonic() + self.script_timeout
        texts = script.splitlines()
        for offset, text in enumerate(texts):
            lineno = first_lineno + offset
            if text.startswith("#"):
                section = []
                continue
            try:
                line = parse_line(lineno, text)
            except CommandError as e:
                raise ScriptFailure(lineno, text, f"parse error: {e.message}") from None
            if line is None:
                continue
            try:
                if not self._active(state, line):
                    continue
                section.append(line)
                state.next_command = self._next_command(state, texts[offset + 1 :])
                try:
                    await self._run(state, line)
                except (Unsupported, StopScript):
                    raise
                except CommandError:
                    if line.want not in ("*", "!*"):
                        raise
                    await self._retry(state, section)
            except StopScript:
                return
            except CommandError as e:
                raise ScriptFailure(lineno, text, e.message, e.diff) from None

    def _next_command(self, state: State, rest: list[str]) -> str:
        """The name of the first command among the script lines ``rest`` that will run
        (comments, blank and inactive lines skipped); "" when none or not certain (a parse
        error or an unknown condition: that line fails the script when reached)."""
        for text in rest:
            if text.startswith("#"):
                continue
            try:
                line = parse_line(0, text)
                if line is None or not self._active(state, line):
                    continue
            except CommandError:
                return ""
            return line.name
        return ""

    async def _retry(self, state: State, section: list[Line]) -> None:
        """Re-run ``section`` with backoff until every command in it meets its prefix."""
        deadline = min(time.monotonic() + self.retry_timeout, state.deadline)
        interval = self.retry_interval
        quiet = 0
        while True:
            before = await self.quiescence(state) if self.quiescence is not None else None
            await anyio.sleep(interval)
            interval = min(interval * 2, self.max_retry_interval)
            try:
                for i, line in enumerate(section):
                    state.next_command = section[i + 1].name if i + 1 < len(section) else ""
                    await self._run(state, line)
                return
            except (Unsupported, StopScript):
                raise
            except CommandError as e:
                err = e
            after = await self.quiescence(state) if self.quiescence is not None else None
            if before is not None and before == after:
                quiet += 1
            else:
                quiet = 0
            if quiet >= self.quiet_attempts:
                err.message += " (system idle, giving up retrying)"
                raise err
            if time.monotonic() >= deadline:
                err.message += " (retry deadline passed)"
                raise err


# ----- flags -------------------------------------------------------------------------
def parse_flags(
    args: list[str], spec: dict[str, bool], aliases: dict[str, str] | None = None
) -> tuple[dict[str, str], list[str]]:
    """Parse pflag-style flags anywhere among ``args``.

    ``spec`` maps a flag name to whether it takes a value (``--name=v``, ``--name v``,
    ``-n v``); boolean flags accept ``--name``/``--name=true``. ``--`` ends the flags.
    Unknown flags are a CommandError.
    """
    aliases = aliases or {}
    flags: dict[str, str] = {}
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            rest.extend(args[i:])
            break
        if not arg.startswith("-") or arg == "-":
            rest.append(arg)
            continue
        name, eq, value = arg.lstrip("-").partition("=")
        name = aliases.get(name, name)
        if name not in spec:
            raise CommandError(f"unknown flag {arg!r}")
        if spec[name]:
            if not eq:
                if i >= len(args):
                    raise CommandError(f"flag {arg!r} needs a value")
                value = args[i]
                i += 1
            flags[name] = value
        else:
            flags[name] = value if eq else "true"
    return flags, rest


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Parse a Go duration (``100ms``, ``1.5s``, ``1m30s``) into seconds."""
    if text in ("0", ""):
        return 0.0
    pos = 0
    total = 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text):
        raise CommandError(f"invalid duration {text!r}")
    return total


def go_regex(pattern: str) -> re.Pattern[str]:
    """Compile a Go (RE2) regular expression in multi-line mode, as the script commands do."""
    try:
        return re.compile(pattern, re.MULTILINE)
    except re.error as e:
        raise CommandError(f"invalid regular expression {pattern!r}: {e}") from None


def go_replacement(repl: str) -> str:
    """Turn a Go replacement template (``$1``, ``${name}``) into Python's ``\\g<..>`` form."""
    out: list[str] = []
    i = 0
    while i < len(repl):
        c = repl[i]
        if c == "\\":
            out.append("\\\\")
        elif c == "$" and i + 1 < len(repl):
            if repl[i + 1] == "$":
                out.append("$")
                i += 2
                continue
            m = re.match(r"\{(\w+)\}|(\w+)", repl[i + 1 :])
            if m is not None:
                out.append(f"\\g<{m.group(1) or m.group(2)}>")
                i += 1 + m.end()
                continue
            out.append(c)
        else:
            out.append(c)
        i += 1
    return "".join(out)


def unified_diff(expected: str, actual: str, exp_name: str, act_name: str) -> str:
    """A unified diff of two texts (expected first), empty when equal."""
    return "".join(
        difflib.unified_diff(
            expected.splitlines(keepends=True),
            actual.splitlines(keepends=True),
            fromfile=exp_name,
            tofile=act_name,
        )
    )


# ----- generic commands ------------------------------------------------------------
def _nargs(args: list[str], n: int, usage: str) -> None:
    if len(args) != n:
        raise CommandError(f"usage: {usage}")


async def cmd_cmp(state: State, args: list[str]) -> None:
    """``cmp a b``: the two files (or stdout/stderr) must be identical."""
    _, args = parse_flags(args, {"q": False})
    _nargs(args, 2, "cmp file1 file2")
    a, b = state.read(args[0]), state.read(args[1])
    if a != b:
        raise CommandError(
            f"{args[0]} and {args[1]} differ", unified_diff(a, b, args[0], args[1])
        )


async def cmd_cp(state: State, args: list[str]) -> None:
    """``cp src... dst``: copy files (src may be stdout/stderr)."""
    if len(args) < 2:
        raise CommandError("usage: cp src... dst")
    dst = args[-1]
    for src in args[:-1]:
        target = state.path(dst)
        if target.is_dir():
            target = target / Path(src).name
        state.write(str(target), state.read(src))


async def cmd_mv(state: State, args: list[str]) -> None:
    """``mv src dst``: rename a file."""
    _nargs(args, 2, "mv src dst")
    try:
        os.replace(state.path(args[0]), state.path(args[1]))
    except OSError as e:
        raise CommandError(f"mv: {e}") from None


async def cmd_rm(state: State, args: list[str]) -> None:
    """``rm file...``: remove files or directories."""
    for name in args:
        p = state.path(name)
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


async def cmd_env(state: State, args: list[str]) -> str | None:
    """``env [K=V...] [K]``: set variables, or print them."""
    if not args:
        return "".join(f"{k}={v}\n" for k, v in sorted(state.env.items()))
    out: list[str] = []
    for arg in args:
        key, eq, value = arg.partition("=")
        if eq:
            state.env[key] = value
        else:
            out.append(f"{key}={state.env.get(key, '')}\n")
    return "".join(out) or None


async def cmd_echo(state: State, args: list[str]) -> str:
    """``echo words...``: print the words."""
    return " ".join(args) + "\n"


async def cmd_cat(state: State, args: list[str]) -> str:
    """``cat file...``: print files."""
    return "".join(state.read(a) for a in args)


async def cmd_exists(state: State, args: list[str]) -> None:
    """``exists file...``: the files must exist."""
    for a in args:
        if not state.path(a).exists():
            raise CommandError(f"{a} does not exist")


def _match(state: State, args: list[str], what: str, text: str | None) -> None:
    flags, rest = parse_flags(args, {"count": True, "q": False})
    if text is None:
        if len(rest) != 2:
            raise CommandError(f"usage: {what} [-count=N] pattern file")
        pattern, name = rest
        text = state.read(name)
    else:
        if len(rest) != 1:
            raise CommandError(f"usage: {what} [-count=N] pattern")
        pattern, name = rest[0], what
    rx = go_regex(pattern)
    if "count" in flags:
        want = int(flags["count"])
        got = len(rx.findall(text))
        if got != want:
            raise CommandError(f"{name}: found {got} matches for {pattern!r}, want {want}")
        return
    if rx.search(text) is None:
        raise CommandError(f"{name}: no match for {pattern!r}", text)


async def cmd_grep(state: State, args: list[str]) -> None:
    """``grep [-count=N] re file``: the file must contain a match."""
    _match(state, args, "grep", None)


async def cmd_stdout(state: State, args: list[str]) -> None:
    """``stdout re``: the previous command's stdout must match."""
    _match(state, args, "stdout", state.stdout)


async def cmd_stderr(state: State, args: list[str]) -> None:
    """``stderr re``: the previous command's stderr must match."""
    _match(state, args, "stderr", state.stderr)


async def cmd_sed(state: State, args: list[str]) -> None:
    """``sed re replacement file``: regular-expression substitution in place."""
    _nargs(args, 3, "sed pattern replacement file")
    rx = go_regex(args[0])
    text = state.read(args[2])
    state.write(args[2], rx.sub(go_replacement(args[1]), text))


async def cmd_replace(state: State, args: list[str]) -> None:
    """``replace old new file...``: literal substitution in place."""
    if len(args) < 3:
        raise CommandError("usage: replace old new file...")
    for name in args[2:]:
        state.write(name, state.read(name).replace(args[0], args[1]))


async def cmd_sleep(state: State, args: list[str]) -> None:
    """``sleep duration``: pause (Go duration syntax)."""
    _nargs(args, 1, "sleep duration")
    await anyio.sleep(parse_duration(args[0]))


async def cmd_empty(state: State, args: list[str]) -> None:
    """``empty file``: the file must be empty (or absent)."""
    _nargs(args, 1, "empty file")
    p = state.path(args[0])
    data = state.read(args[0]) if p.exists() or args[0] in ("stdout", "stderr") else ""
    if data:
        raise CommandError(f"{args[0]} is not empty", data)


async def cmd_stop(state: State, args: list[str]) -> None:
    """``stop [message]``: end the script successfully."""
    raise StopScript(" ".join(args))


def generic_commands() -> dict[str, Command]:
    """The commands every script gets, independent of the system under test."""
    return {
        "cat": cmd_cat,
        "cmp": cmd_cmp,
        "cp": cmd_cp,
        "echo": cmd_echo,
        "empty": cmd_empty,
        "env": cmd_env,
        "exists": cmd_exists,
        "grep": cmd_grep,
        "mv": cmd_mv,
        "replace": cmd_replace,
        "rm": cmd_rm,
        "sed": cmd_sed,
        "sleep": cmd_sleep,
        "stderr": cmd_stderr,
        "stdout": cmd_stdout,
        "stop": cmd_stop,
    }
