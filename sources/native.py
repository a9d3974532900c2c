"""Which Kubernetes converter is imported: the mypyc-compiled one or its Python source.

`sources.k8s_convert` can be compiled with mypyc (`python -m sources.native_build`, run
by `make setup`) into ``build/native/sources/`` beside the repository's packages. The
compiled module is the same source, about a fifth faster; the source stays the fallback.
`package_path` (called by the package's ``__init__``) puts the build directory first on
the package's ``__path__`` only when the build is current: its stamp names the files it
was compiled from (the converter and every project module its types came from) and
their digest, which must equal the digest of those files now in the tree, and the
extension's file name must fit this interpreter. A stale, partial or foreign build is
never imported; ``STATEWRIGHT_PURE_PYTHON=1`` forces the source.

`converter()` says which one a process runs (the agent's startup log and status, the
benchmark's JSON); it reads the imported module's file, so it is true also when the
package was imported some other way.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path

#: Set to a non-empty value other than ``0``: the converter's source, whatever is built.
PURE_ENV = "STATEWRIGHT_PURE_PYTHON"
#: The module compiled, and the package it belongs to.
MODULE = "sources.k8s_convert"
#: The build's output relative to the repository root: the package's directory of
#: extension modules, and the stamp written after a build succeeded.
BUILD_DIR = Path("build") / "native"
STAMP_NAME = "stamp.json"

#: Why the last `package_path` call chose what it chose (for `converter`).
_choice = "pure: sources not yet imported"


def repo_root() -> Path:
    """The directory that holds the ``sources`` package (the repository, or site-packages)."""
    return Path(__file__).resolve().parent.parent


def files_digest(root: Path, files: Iterable[str]) -> str:
    """SHA-256 over each file's relative path and contents, in the order given.

    A missing file digests as absent, so a stamp naming it never matches again.
    """
    digest = hashlib.sha256()
    for name in files:
        digest.update(name.encode() + b"\0")
        try:
            digest.update((root / name).read_bytes())
        except OSError:
            digest.update(b"\1missing")
        digest.update(b"\0")
    return digest.hexdigest()


def pure_forced(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """True when the environment asks for the converter's source."""
    return environ.get(PURE_ENV, "") not in ("", "0")


def current_build(root: Path) -> tuple[Path | None, str]:
    """The build's package directory if it is current for the tree at `root`, and why.

    Current means: a stamp that parses, the extension files it names present (the
    module's for this interpreter), and the digest of the stamped files equal to the stamp's.
    """
    build = root / BUILD_DIR
    try:
        stamp = json.loads((build / STAMP_NAME).read_text())
        files = [str(name) for name in stamp["files"]]
        extensions = [str(name) for name in stamp["extensions"]]
        digest = str(stamp["digest"])
    except (OSError, ValueError, KeyError, TypeError):
        return None, "no compiled build (run `make setup`)"
    package = build / MODULE.split(".")[0]
    stem = MODULE.rsplit(".", 1)[1]
    if not any(stem + suffix in extensions for suffix in importlib.machinery.EXTENSION_SUFFIXES):
        return None, f"the compiled build ({', '.join(extensions)}) is not for this interpreter"
    missing = [name for name in extensions if not (package / name).is_file()]
    if missing:
        return None, f"the compiled build's {', '.join(missing)} is missing"
    if files_digest(root, files) != digest:
        return None, "the compiled build is stale (its sources changed since; `make setup`)"
    return package, "compiled: built from the sources now in the tree"


def package_path(path: list[str], root: Path | None = None) -> list[str]:
    """The ``sources`` package's ``__path__``: the current build's directory first, if any.

    The build's directory holds only the extension module, so it shadows nothing else.
    """
    global _choice
    if pure_forced():
        _choice = f"pure: {PURE_ENV} is set"
        return list(path)
    package, why = current_build(repo_root() if root is None else root)
    if package is None:
        _choice = f"pure: {why}"
        return list(path)
    _choice = why
    return [str(package), *(entry for entry in path if entry != str(package))]


def converter() -> str:
    """``compiled`` or ``pure``: which converter this process imported (or will import)."""
    module = sys.modules.get(MODULE)
    if module is None:
        return _choice.split(":", 1)[0]
    return "pure" if str(getattr(module, "__file__", "")).endswith(".py") else "compiled"


def describe() -> str:
    """One line for logs: which converter, and why."""
    kind = converter()
    if kind == _choice.split(":", 1)[0]:
        return _choice
    return f"{kind}: imported before the build check ran"
