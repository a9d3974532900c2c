"""Command line: run the LB conformance corpus and print per-file results.

    python -m tests.conformance [--corpus DIR] [--json FILE] [--backend memory|kernel|both]
                                [-k SUBSTRING] [-v]

The last line is always ``conformance: N passed, M failed``. The exit status is 0
when every file passed, 1 otherwise (2 for usage errors, or when the corpus is
missing). The default backend is ``kernel`` when CI=true, else ``memory``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from tests.conformance.corpus import corpus_dir, corpus_files, make_engine, pin_root, run_file
from tests.conformance.runner import FileResult


def main(argv: list[str] | None = None) -> int:
    """Run the corpus; see the module docstring."""
    ap = argparse.ArgumentParser(prog="python -m tests.conformance", description=__doc__)
    ap.add_argument("--corpus", help="directory of .txtar files (default: $STATEWRIGHT_LB_CORPUS "
                    "or ../shared/conformance/cilium-lb)")
    ap.add_argument("--json", help="write per-file results to this JSON file")
    default_backend = "kernel" if os.environ.get("CI", "").lower() == "true" else "memory"
    ap.add_argument("--backend", choices=("memory", "kernel", "both"), default=default_backend)
    ap.add_argument("-k", dest="filter", default="", help="only files whose name contains this")
    ap.add_argument("-v", "--verbose", action="store_true", help="print diffs of failures")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)

    directory = corpus_dir(args.corpus)
    if not directory.is_dir():
        print(f"conformance: corpus directory {directory} not found (set --corpus or "
              "$STATEWRIGHT_LB_CORPUS)")
        print("conformance: 0 passed, 0 failed")
        return 2
    files = [p for p in corpus_files(directory) if args.filter in p.name]
    backends = ["memory", "kernel"] if args.backend == "both" else [args.backend]
    results: list[tuple[str, FileResult]] = []
    engine = make_engine()
    for backend in backends:
        started = time.monotonic()
        with pin_root(backend) as root:
            for path in files:
                r = run_file(path, backend, root, engine)
                results.append((backend, r))
                if r.passed:
                    print(f"PASS [{backend}] {r.file} ({r.seconds:.2f}s)")
                else:
                    where = f"line {r.line}: {r.command}: " if r.line else ""
                    print(f"FAIL [{backend}] {r.file} ({r.seconds:.2f}s): {where}"
                          f"{r.reason.splitlines()[0] if r.reason else ''}")
                    if args.verbose and r.diff:
                        print("    " + r.diff.rstrip("\n").replace("\n", "\n    "))
                sys.stdout.flush()
        took = time.monotonic() - started
        passed = sum(1 for b, r in results if b == backend and r.passed)
        print(f"[{backend}] {passed}/{len(files)} passed in {took:.1f}s")
    if args.json:
        payload = {
            "corpus": str(directory),
            "results": [{"backend": b, **r.to_json()} for b, r in results],
        }
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
    differ: list[str] = []
    if len(backends) == 2:
        by_file: dict[str, set[str]] = {}
        for _, r in results:
            by_file.setdefault(r.file, set()).add(r.status)
        differ = sorted(f for f, statuses in by_file.items() if len(statuses) > 1)
        print("backends agree on every file" if not differ
              else f"backends differ on: {', '.join(differ)}")
    n_pass = sum(1 for _, r in results if r.passed)
    n_fail = len(results) - n_pass
    print(f"conformance: {n_pass} passed, {n_fail} failed")
    return 0 if n_fail == 0 and not differ else 1


if __name__ == "__main__":
    sys.exit(main())
