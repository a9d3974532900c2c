"""The ``statewright`` command line: one argparse tree, each command group in its own module."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Any

# Command groups: module -> it exposes add_commands(subparsers). Groups whose module
# is not installed yet (later components) are simply absent from --help.
COMMAND_MODULES = (
    "statewright.cli_run",
    "statewright.cli_bpf",
    "statewright.cli_lb",
    "statewright.cli_agent",  # after cli_lb: it routes `lb list` through the agent
)


def build_parser() -> argparse.ArgumentParser:
    """Return the parser with every available command group registered."""
    parser = argparse.ArgumentParser(
        prog="statewright",
        description="Statewright: a state-reconciliation engine for Linux node agents.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        try:
            module: Any = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name != name:
                raise
            continue
        module.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen command; returns the process exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
