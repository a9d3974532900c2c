"""The ``statewright`` command line: one argparse tree, each command group in its own module
(``*_commands.py``); ``common.py`` holds what they share (the agent's socket and client,
the table format).

Every command group module (``COMMAND_MODULES``) exposes
``add_commands(subparsers, commands) -> None``: it adds its parsers under ``subparsers``,
sets ``func(args) -> int`` on each leaf and records each leaf parser in ``commands`` under
its path (``"lb list"``). A later module may look up a parser an earlier one recorded and
extend it (more arguments, another ``func``): that is how ``agent_commands`` sends ``lb list``
and ``bpf dump`` to the running agent. A module that cannot be imported is a bug and fails
``statewright`` at once; a missing dependency of the ``agent`` extra exits with a message
naming what to install (`statewright.missing_extra`).

`run` is the one place a command is executed: it also makes every command end quietly
when its standard output is closed early (``statewright db watch t | head``), as Unix
tools do, instead of printing a BrokenPipeError traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, Protocol

from statewright.broken_pipe import EXIT_BROKEN_PIPE, discard_stdout
from statewright.missing_extra import exit_for_missing_extra

try:
    from statewright.cli import (
        agent_commands,
        api_commands,
        bpf_commands,
        ct_commands,
        endpoint_commands,
        explain_commands,
        lb_commands,
        monitor_commands,
        nodeport_commands,
        operator_commands,
        plan_commands,
        policy_commands,
        run_commands,
    )
except ModuleNotFoundError as exc:  # installed without the agent extra: say what to install
    exit_for_missing_extra(exc)


class SubParsers(Protocol):
    """What ``ArgumentParser.add_subparsers()`` returns, as far as command modules use it."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        """Add and return the parser of sub-command ``name``."""
        ...


#: Leaf parsers by command path, e.g. ``"lb list"``; filled by the modules' add_commands.
Commands = dict[str, argparse.ArgumentParser]


class CommandModule(Protocol):
    """A command group module."""

    def add_commands(self, subparsers: SubParsers, commands: Commands) -> None:
        """Register this group's commands (see the module docstring)."""
        ...


#: In registration order: agent_commands comes after lb_commands and bpf_commands, whose
#: ``lb list`` and ``bpf dump`` it extends.
COMMAND_MODULES: tuple[CommandModule, ...] = (
    run_commands,
    bpf_commands,
    lb_commands,
    agent_commands,
    endpoint_commands,
    policy_commands,
    ct_commands,
    nodeport_commands,
    explain_commands,
    plan_commands,
    monitor_commands,
    api_commands,
    operator_commands,
)


def build_parser() -> argparse.ArgumentParser:
    """Return the parser with every command group registered."""
    return build_commands()[0]


def build_commands() -> tuple[argparse.ArgumentParser, Commands]:
    """The full parser and its leaf parsers by command path."""
    parser = argparse.ArgumentParser(
        prog="statewright",
        description="Statewright: a state-reconciliation engine for Linux node agents. "
        "The main job is `statewright agent` (`make run` runs `statewright agent --demo "
        "--status-line`); the other commands inspect a running agent or its pinned maps.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    commands: Commands = {}
    for module in COMMAND_MODULES:
        module.add_commands(sub, commands)
    return parser, commands


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen command; returns the process exit code."""
    return run(build_parser(), argv)


def run(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """Parse ``argv`` with ``parser``, set up logging and run ``args.func``; return its exit
    code, or `EXIT_BROKEN_PIPE` without a word when the reader closed standard output."""
    try:
        try:
            args = parser.parse_args(argv)
            logging.basicConfig(
                level=logging.DEBUG if getattr(args, "verbose", False) else logging.INFO,
                format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                stream=sys.stderr,
            )
            try:
                code: int = args.func(args)
            except ModuleNotFoundError as exc:  # a dependency a command imports on first use
                exit_for_missing_extra(exc)
            return code
        finally:
            # Inside the guard: a reader gone before the last buffered write ends quietly too
            # (also after --help, whose SystemExit passes through when the flush succeeds).
            sys.stdout.flush()
    except BrokenPipeError:
        discard_stdout()
        return EXIT_BROKEN_PIPE
    except BaseExceptionGroup as group:  # a command running a task group (agent --status-line)
        _, rest = group.split(BrokenPipeError)
        if rest is not None:
            raise
        discard_stdout()
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    raise SystemExit(main())
