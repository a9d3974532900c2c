"""``statewright run``: the small demo of statedb + reconciler + one BPF map (statewright/demo.py).

A statedb table of endpoints is reconciled into the endpoints BPF map (kernel when permitted,
in memory otherwise) with injected faults, retries and a prune. The main job, the node agent,
is ``statewright agent`` (statewright/cli/agent_commands.py).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from statewright.cli import Commands, SubParsers


def add_commands(subparsers: SubParsers, commands: Commands) -> None:
    """Register ``run``."""
    run = subparsers.add_parser(
        "run", help="small demo: a statedb table reconciled into one BPF map (not the agent)"
    )
    run.add_argument(
        "--backend", choices=("auto", "kernel", "memory"), default="auto",
        help="BPF map backend (auto: kernel maps when the machine allows)",
    )
    run.set_defaults(func=cmd_run)
    commands["run"] = run


def cmd_run(args: argparse.Namespace) -> int:
    """Run the demo and return its exit code."""
    from statewright import demo

    return demo.main(args.backend)
