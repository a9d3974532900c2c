"""The folders are the architecture: no product module imports a higher layer, and none
takes another module's private names.

Layers, lowest first (docs/architecture.md): statedb; reconciler and bpf (both on statedb
alone); tables; sources and bpfops; policy; statewright (the agent and the CLI). Within
statewright, the runtime does not import the CLI (statewright/cli/ and ``python -m
statewright`` are the top).

Private names: ``from m import _x`` and ``m._x`` on an imported module ``m`` are refused
across modules (a module's own names, and dunders, are fine). Imports inside functions
count as well.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Each product package and the packages it may import.
ALLOWED: dict[str, frozenset[str]] = {
    "statedb": frozenset(),
    "reconciler": frozenset({"statedb"}),
    "bpf": frozenset({"statedb"}),
    "tables": frozenset({"statedb", "reconciler"}),
    "sources": frozenset({"statedb", "reconciler", "tables"}),
    "bpfops": frozenset({"statedb", "reconciler", "bpf", "tables"}),
    "policy": frozenset({"statedb", "reconciler", "tables", "sources"}),
    "statewright": frozenset(
        {"statedb", "reconciler", "bpf", "tables", "sources", "bpfops", "policy"}
    ),
}


#: The command line and ``python -m statewright``, which runs it.
CLI_ENTRIES = frozenset({"statewright.cli", "statewright.__main__"})


def _modules(root: Path) -> list[tuple[str, Path]]:
    out = []
    for package in ALLOWED:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out.append((name, path))
    return out


def _imports(tree: ast.AST) -> list[tuple[int, str, list[str], str]]:
    """(line, module, names imported from it, the name ``import`` binds or "") of every
    absolute import."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module, [a.name for a in node.names], ""))
        elif isinstance(node, ast.Import):
            found += [
                (node.lineno, a.name, [], a.asname or a.name.split(".")[0]) for a in node.names
            ]
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def layering_problems(root: Path = ROOT) -> list[str]:
    """Every upward import and every private name taken from another module under ``root``."""
    problems = []
    for name, path in _modules(root):
        package = name.split(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        where = path.relative_to(root)
        module_aliases: set[str] = set()
        for line, module, names, bound in _imports(tree):
            top = module.split(".")[0]
            if top in ALLOWED and top != package and top not in ALLOWED[package]:
                problems.append(f"{where}:{line}: {package} imports the higher layer {module}")
            in_cli = name in CLI_ENTRIES or name.startswith("statewright.cli.")
            if module.startswith("statewright.cli") and not in_cli:
                problems.append(f"{where}:{line}: the runtime imports the CLI ({module})")
            if top not in ALLOWED or module == name:
                continue
            problems += [
                f"{where}:{line}: takes the private name {n} of {module}"
                for n in names
                if _private(n)
            ]
            if bound:
                module_aliases.add(bound)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and _private(node.attr)
                and isinstance(node.value, ast.Name)
                and node.value.id in module_aliases
            ):
                problems.append(
                    f"{where}:{node.lineno}: takes the private name {node.attr} of "
                    f"{node.value.id}"
                )
    return problems


def test_no_upward_imports_and_no_private_names_of_other_modules() -> None:
    assert layering_problems() == []


def test_the_check_sees_what_it_refuses(tmp_path: Path) -> None:
    """The rules themselves, on a small tree: each kind of problem is reported, once."""
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "rows.py").write_text(
        "from statedb import Table\n"
        "from bpfops.model import Addr\n"
        "from tables.other import _hidden, __version__\n"
        "import tables.other as other\n"
        "x = other._also_hidden\n"
    )
    (tmp_path / "statewright" / "agent").mkdir(parents=True)
    (tmp_path / "statewright" / "agent" / "runtime.py").write_text(
        "def f():\n    from statewright.cli.lb_commands import format_list\n"
    )
    (tmp_path / "statewright" / "cli").mkdir()
    (tmp_path / "statewright" / "cli" / "common.py").write_text("from statewright.cli import x\n")
    assert layering_problems(tmp_path) == [
        "tables/rows.py:2: tables imports the higher layer bpfops.model",
        "tables/rows.py:3: takes the private name _hidden of tables.other",
        "tables/rows.py:5: takes the private name _also_hidden of other",
        "statewright/agent/runtime.py:2: the runtime imports the CLI "
        "(statewright.cli.lb_commands)",
    ]
