"""No product function is longer than 120 lines (the developers' guide asks for about 80:
a function a reader can hold on one screen). Nested functions count on their own and
within their parent; tests, benchmarks and examples are not product code."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("statedb", "reconciler", "tables", "bpf", "bpfops", "sources", "policy", "statewright")
MAX_LINES = 120


def long_functions(root: Path = ROOT, limit: int = MAX_LINES) -> list[str]:
    """``path:line name (N lines)`` of every function under the product packages longer
    than ``limit`` lines, decorators left out."""
    found = []
    for package in PRODUCT:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    assert node.end_lineno is not None
                    lines = node.end_lineno - node.lineno + 1
                    if lines > limit:
                        where = path.relative_to(root)
                        found.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_product_function_is_over_120_lines() -> None:
    assert long_functions() == []


def test_the_check_counts_a_long_function(tmp_path: Path) -> None:
    (tmp_path / "tables").mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES))
    (tmp_path / "tables" / "long.py").write_text(f"def short():\n    pass\n\n\ndef long():\n{body}")
    assert long_functions(tmp_path) == [f"tables/long.py:5 long ({MAX_LINES + 1} lines)"]
