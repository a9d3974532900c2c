"""``statewright run``: the main job started by ``make run``.

Until the agent runtime exists this runs `statewright.demo`: a statedb table
reconciled into a real BPF map (kernel when permitted, in memory otherwise).
"""

from __future__ import annotations

import argparse
from typing import Any


def add_commands(subparsers: Any) -> None:
    """Register ``run``."""
    run = subparsers.add_parser("run", help="run the main job (currently the demo)")
    run.add_argument(
        "--backend", choices=("auto", "kernel", "memory"), default="auto",
        help="BPF map backend (auto: kernel maps when the machine allows)",
    )
    run.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    """Run the demo and return its exit code."""
    from statewright import demo

    return demo.main(args.backend)
