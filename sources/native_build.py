"""Builds the mypyc-compiled Kubernetes converter: ``python -m sources.native_build``.

`make setup` runs this. It compiles `sources.k8s_convert` with mypyc into
``build/native/sources/`` and writes the stamp `sources.native` checks at import: the
project files the build's types came from (the converter and, transitively, every
project module it imports) and their digest taken before compiling. It rebuilds only
when that digest differs from the stamp's (about 35 s of gcc), and builds nothing, saying
why, when mypyc, setuptools, a C compiler or the Python headers are missing, or when
``STATEWRIGHT_PURE_PYTHON`` is set: the converter then runs from its source, as after a
plain ``pip install``. A failed compilation exits non-zero (the source does not compile:
a bug to fix, not a reason to fall back silently).

The build runs setuptools from a scratch directory, so that setuptools does not read the
repository's pyproject.toml (setuptools older than 77 rejects its SPDX `license`).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sources import native
from statedb import rowbuild


def module_file(root: Path, module: str) -> Path | None:
    """The source file of a project module (a package's ``__init__.py``), if in the tree."""
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported(module: str, is_package: bool, tree: ast.Module) -> Iterator[str]:
    """Every module name an import statement of `tree` may load (absolute)."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            yield base
            # ``from package import submodule`` loads the submodule too.
            yield from (f"{base}.{alias.name}" for alias in node.names)


def dependencies(root: Path, module: str = native.MODULE) -> list[str]:
    """`module`'s file and every project file it imports, transitively, sorted.

    Each module's enclosing packages count too (importing one runs their ``__init__``).
    """
    seen: dict[str, Path] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for depth in range(1, len(parts) + 1):
            prefix = ".".join(parts[:depth])
            if prefix in seen:
                continue
            path = module_file(root, prefix)
            if path is None:
                continue
            seen[prefix] = path
            tree = ast.parse(path.read_bytes(), str(path))
            todo.extend(_imported(prefix, path.name == "__init__.py", tree))
    return sorted(str(path.relative_to(root)) for path in seen.values())


def missing_tools() -> str | None:
    """Why this machine cannot build the compiled converter, or None if it can."""
    try:
        import mypyc.build  # noqa: F401
        import setuptools  # noqa: F401
    except ImportError as err:
        return f"{err.name} is not installed (it comes with the `test` extra)"
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler})"
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.is_file():
        return f"no Python headers ({headers})"
    return None


@contextlib.contextmanager
def _cwd(path: str) -> Iterator[None]:
    previous = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


def compile_extension(root: Path, scratch: Path, quiet: bool) -> list[Path]:
    """Compiles the converter in `scratch`; returns the extension modules' paths.

    mypyc makes two: the module itself (a shim) and its code, ``<module>__mypyc``.
    """
    from mypyc.build import mypycify

    source = module_file(root, native.MODULE)
    assert source is not None, native.MODULE
    lib = scratch / "lib"
    with _cwd(str(scratch)):
        extensions = mypycify([str(source)], opt_level="3", target_dir=str(scratch / "c"))
        _build_ext("statewright-native", extensions, scratch, quiet)
    package = native.MODULE.rsplit(".", 1)[0]
    built = sorted(path for path in lib.rglob("*") if path.is_file())
    outside = [path for path in built if path.parent != lib / package.replace(".", "/")]
    if not built or outside:
        raise RuntimeError(f"mypyc built {built}: expected extension modules of {package} only")
    return built


def _build_ext(name: str, extensions: list[Any], scratch: Path, quiet: bool) -> None:
    """setuptools' ``build_ext`` of ``extensions`` (run inside `scratch`): the modules go
    to ``scratch/lib``, the objects to ``scratch/temp``."""
    from setuptools import setup

    setup(
        name=name,
        ext_modules=extensions,
        script_args=[
            *(["-q"] if quiet else []),
            "build_ext",
            "--build-lib",
            str(scratch / "lib"),
            "--build-temp",
            str(scratch / "temp"),
        ],
    )


def install(root: Path, extensions: list[Path], files: list[str], digest: str) -> None:
    """Moves `extensions` into the build directory, then writes the stamp naming them."""
    build = root / native.BUILD_DIR
    package = build / native.MODULE.split(".")[0]
    package.mkdir(parents=True, exist_ok=True)
    for old in package.iterdir():
        old.unlink()
    for extension in extensions:
        os.replace(extension, package / extension.name)
    names = [extension.name for extension in extensions]
    stamp = {"module": native.MODULE, "extensions": names, "files": files, "digest": digest}
    staged = build / (native.STAMP_NAME + ".tmp")
    staged.write_text(json.dumps(stamp, indent=1) + "\n")
    os.replace(staged, build / native.STAMP_NAME)


def build(root: Path, force: bool = False, quiet: bool = True) -> str:
    """Builds the compiled converter unless it is current; returns what was done."""
    if native.pure_forced():
        return f"not built: {native.PURE_ENV} is set"
    if not force and native.current_build(root)[0] is not None:
        return "up to date"
    why_not = missing_tools()
    if why_not is not None:
        return f"not built: {why_not}; the converter runs from its source"
    files = dependencies(root)
    digest = native.files_digest(root, files)
    # No stamp while the extension is replaced: nothing imports a half-written build.
    (root / native.BUILD_DIR / native.STAMP_NAME).unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="statewright-native-") as scratch:
        extensions = compile_extension(root, Path(scratch), quiet)
        install(root, extensions, files, digest)
    return f"built from {len(files)} files into {native.BUILD_DIR}"


def compile_row_builder(root: Path, scratch: Path, quiet: bool) -> Path:
    """Compiles ``statedb/_rowbuild.c`` (`statedb.rowbuild`'s helper) in `scratch`;
    returns the extension module's path."""
    from setuptools import Extension

    lib = scratch / "lib"
    extension = Extension(rowbuild.MODULE, [str(root / rowbuild.SOURCE)])
    with _cwd(str(scratch)):
        _build_ext("statewright-rowbuild", [extension], scratch, quiet)
    built = sorted(path for path in lib.rglob("*") if path.is_file())
    if len(built) != 1:
        raise RuntimeError(f"setuptools built {built}: expected one extension module")
    return built[0]


def build_row_builder(root: Path, force: bool = False, quiet: bool = True) -> str:
    """Builds `statedb.rowbuild`'s compiled helper unless it is current; returns what
    was done. Its stamp holds the C source's digest: no other file goes into it."""
    if native.pure_forced():
        return f"not built: {native.PURE_ENV} is set"
    if not force and rowbuild.current_extension(root)[0] is not None:
        return "up to date"
    why_not = missing_tools()
    if why_not is not None:
        return f"not built: {why_not}; rows are built in Python"
    digest = rowbuild.source_digest(root)
    stamp = root / rowbuild.STAMP
    stamp.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="statewright-rowbuild-") as scratch:
        built = compile_row_builder(root, Path(scratch), quiet)
        target = root / rowbuild.BUILD_DIR
        target.mkdir(parents=True, exist_ok=True)
        for old in target.iterdir():
            old.unlink()
        os.replace(built, target / built.name)
    staged = stamp.with_suffix(".tmp")
    staged.write_text(json.dumps({"extension": built.name, "digest": digest}, indent=1) + "\n")
    os.replace(staged, stamp)
    return f"built into {rowbuild.BUILD_DIR}"


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m sources.native_build [--force] [--verbose]``."""
    parser = argparse.ArgumentParser(prog="python -m sources.native_build", description=__doc__)
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    parser.add_argument("--verbose", action="store_true", help="show setuptools' output")
    parser.add_argument("--root", type=Path, default=native.repo_root(), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    root, quiet = args.root.resolve(), not args.verbose
    for what, step in (("row builder", build_row_builder), ("converter", build)):
        try:
            outcome = step(root, force=args.force, quiet=quiet)
        except (Exception, SystemExit) as err:  # mypy's and setuptools' failures exit
            print(f"setup: compiled {what}: build failed: {err!r}", file=sys.stderr)
            return 1
        print(f"setup: compiled {what}: {outcome}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
