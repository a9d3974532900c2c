"""Which Kubernetes converter is imported (sources/native.py): the compiled build only
while it was built from the sources now in the tree, never with STATEWRIGHT_PURE_PYTHON."""

from __future__ import annotations

import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import sources.k8s_convert as k8s_convert
from sources import native, native_build

ROOT = Path(__file__).resolve().parents[2]
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _fake_build(root: Path, files: dict[str, str], *, digest: str | None = None,
                suffix: str = SUFFIX, present: bool = True) -> Path:
    """A tree at `root` with `files` and a build of the converter stamped with their
    digest (or `digest`); returns the build's package directory."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    package = root / native.BUILD_DIR / "sources"
    package.mkdir(parents=True)
    extensions = [f"k8s_convert{suffix}", f"k8s_convert__mypyc{suffix}"]
    if present:
        for name in extensions:
            (package / name).write_bytes(b"")
    stamp = {
        "module": native.MODULE,
        "extensions": extensions,
        "files": sorted(files),
        "digest": digest if digest is not None else native.files_digest(root, sorted(files)),
    }
    (root / native.BUILD_DIR / native.STAMP_NAME).write_text(json.dumps(stamp))
    return package


FILES = {"sources/k8s_convert.py": "x = 1\n", "tables/backends.py": "y = 2\n"}


def test_no_build_is_the_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(native.PURE_ENV, raising=False)
    assert native.current_build(tmp_path) == (None, "no compiled build (run `make setup`)")
    assert native.package_path(["/pkg"], tmp_path) == ["/pkg"]


def test_a_current_build_comes_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(native.PURE_ENV, raising=False)
    package = _fake_build(tmp_path, FILES)
    assert native.current_build(tmp_path)[0] == package
    assert native.package_path(["/pkg"], tmp_path) == [str(package), "/pkg"]


@pytest.mark.parametrize("changed", sorted(FILES))
def test_a_changed_source_makes_the_build_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, changed: str
) -> None:
    """Any file the build's types came from, not only the converter's own."""
    monkeypatch.delenv(native.PURE_ENV, raising=False)
    _fake_build(tmp_path, FILES)
    (tmp_path / changed).write_text(FILES[changed] + "# changed\n")
    package, why = native.current_build(tmp_path)
    assert package is None and "stale" in why
    assert native.package_path(["/pkg"], tmp_path) == ["/pkg"]


def test_a_deleted_source_makes_the_build_stale(tmp_path: Path) -> None:
    _fake_build(tmp_path, FILES)
    (tmp_path / "tables/backends.py").unlink()
    assert native.current_build(tmp_path)[0] is None


def test_a_wrong_digest_is_stale(tmp_path: Path) -> None:
    _fake_build(tmp_path, FILES, digest="0" * 64)
    assert "stale" in native.current_build(tmp_path)[1]


def test_a_partial_or_foreign_build_is_not_used(tmp_path: Path) -> None:
    _fake_build(tmp_path / "partial", FILES, present=False)
    assert "missing" in native.current_build(tmp_path / "partial")[1]
    _fake_build(tmp_path / "foreign", FILES, suffix=".cpython-27-foreign.so")
    assert "not for this interpreter" in native.current_build(tmp_path / "foreign")[1]
    (tmp_path / "garbled" / native.BUILD_DIR).mkdir(parents=True)
    (tmp_path / "garbled" / native.BUILD_DIR / native.STAMP_NAME).write_text("{")
    assert native.current_build(tmp_path / "garbled")[0] is None


@pytest.mark.parametrize(("value", "pure"), [("1", True), ("yes", True), ("0", False), ("", False)])
def test_the_environment_forces_the_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, pure: bool
) -> None:
    package = _fake_build(tmp_path, FILES)
    monkeypatch.setenv(native.PURE_ENV, value)
    assert native.pure_forced() is pure
    want = ["/pkg"] if pure else [str(package), "/pkg"]
    assert native.package_path(["/pkg"], tmp_path) == want


def test_converter_names_the_module_imported() -> None:
    compiled = not str(k8s_convert.__file__).endswith(".py")
    assert native.converter() == ("compiled" if compiled else "pure")
    assert native.describe().startswith(native.converter())


def _imported_in_a_fresh_process(pure: bool) -> tuple[str, str]:
    env = {k: v for k, v in os.environ.items() if k != native.PURE_ENV}
    env["PYTHONPATH"] = str(ROOT)
    if pure:
        env[native.PURE_ENV] = "1"
    code = (
        "import sources.k8s_convert as k, sources.native as n; "
        "print(k.__file__); print(n.describe())"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True).stdout.splitlines()
    return out[0], out[1]


def test_a_fresh_process_imports_the_current_build_or_the_source() -> None:
    path, why = _imported_in_a_fresh_process(pure=False)
    package, _ = native.current_build(ROOT)
    if package is None:
        assert path == str(ROOT / "sources" / "k8s_convert.py") and why.startswith("pure")
    else:
        assert Path(path).parent == package and why.startswith("compiled")
    path, why = _imported_in_a_fresh_process(pure=True)
    assert path == str(ROOT / "sources" / "k8s_convert.py")
    assert why == f"pure: {native.PURE_ENV} is set"


def test_the_build_depends_on_every_project_module_the_converter_imports() -> None:
    files = native_build.dependencies(ROOT)
    for name in ("sources/k8s_convert.py", "sources/k8s_converted.py", "tables/backends.py",
                 "tables/__init__.py", "statedb/__init__.py", "sources/__init__.py"):
        assert name in files
    assert not any(name.startswith(("statewright/", "bpfops/", "tests/")) for name in files)
    assert files == sorted(set(files))


def test_the_build_says_why_it_does_not_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(native.PURE_ENV, "1")
    assert native_build.build(tmp_path) == f"not built: {native.PURE_ENV} is set"
    monkeypatch.delenv(native.PURE_ENV)
    monkeypatch.setattr(native_build, "missing_tools", lambda: "no C compiler (cc)")
    (tmp_path / "sources").mkdir()
    (tmp_path / "sources" / "k8s_convert.py").write_text("x = 1\n")
    outcome = native_build.build(tmp_path)
    assert outcome.startswith("not built: no C compiler (cc)")
    assert not (tmp_path / native.BUILD_DIR).exists()


def test_the_source_needs_no_mypy_extensions() -> None:
    """An agent-only install has no mypy (nor its extensions): the source imports and
    converts without them."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{native.PURE_ENV: "1"})
    code = (
        "import sys; sys.modules['mypy_extensions'] = None\n"
        "import sources.k8s_convert as k\n"
        "from tests.sources.test_k8s_convert import service\n"
        "print(k.__file__); print(k.convert_service(service()).service.name)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=ROOT,
                         capture_output=True, text=True).stdout.splitlines()
    assert out == [str(ROOT / "sources" / "k8s_convert.py"), "test/echo"]
