"""The manifest source: add/update/delete as files change, invalid files, examples, run loop."""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path

import anyio
import pytest
import yaml

from sources.manifests import ManifestError, ManifestSource, parse_manifest_text
from statedb import DB
from tables.lb_writer import LBWriter

from .test_k8s_convert import endpoint, eps, service

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "manifests"


def _write(path: Path, *objs: object) -> None:
    path.write_text(yaml.safe_dump_all(objs))
    # Bump mtime explicitly: two writes within the filesystem's timestamp
    # granularity must still be seen as a change (the content hash decides).
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def _new(paths: list[Path]) -> tuple[DB, LBWriter, ManifestSource]:
    db = DB()
    w = LBWriter.create(db)
    return db, w, ManifestSource(w, paths, interval=0.01)


def _state(db: DB, w: LBWriter) -> dict[str, list[str]]:
    r = db.read_txn()
    return {
        "services": [s.name for s in w.services.all(r)],
        "frontends": [str(f.address) for f in w.frontends.all(r)],
        "backends": [str(b.address) for b in w.backends.all(r)],
    }


def test_add_update_delete(tmp_path: Path) -> None:
    db, w, src = _new([tmp_path])
    _write(tmp_path / "echo.yaml", service(), eps())
    res = src.sync()
    assert res.applied == [str(tmp_path / "echo.yaml")] and not res.failed
    assert src.files == [str(tmp_path / "echo.yaml")]
    assert _state(db, w) == {"services": ["test/echo"], "frontends": ["10.96.50.104:80/TCP"],
                             "backends": ["10.244.1.1:80/TCP"]}
    # Nothing changed: nothing applied.
    assert not src.sync().changed
    # Update: move the backend, add a second file with another service.
    _write(tmp_path / "echo.yaml", service(), eps(endpoints=[endpoint("10.244.1.9")]))
    (tmp_path / "sub").mkdir()
    _write(tmp_path / "sub" / "two.yml",
           service(name="two", clusterIP="10.96.0.2", clusterIPs=["10.96.0.2"]))
    res = src.sync()
    assert sorted(res.applied) == [str(tmp_path / "echo.yaml"), str(tmp_path / "sub/two.yml")]
    assert _state(db, w)["backends"] == ["10.244.1.9:80/TCP"]
    assert _state(db, w)["services"] == ["test/echo", "test/two"]
    # Removing an object from a file deletes it.
    _write(tmp_path / "echo.yaml", service())
    src.sync()
    assert _state(db, w)["backends"] == []
    # Deleting a file deletes its objects.
    (tmp_path / "echo.yaml").unlink()
    res = src.sync()
    assert res.removed == [str(tmp_path / "echo.yaml")]
    assert _state(db, w) == {"services": ["test/two"], "frontends": ["10.96.0.2:80/TCP"],
                             "backends": []}


def test_invalid_file_changes_nothing_and_recovers(tmp_path: Path) -> None:
    db, w, src = _new([tmp_path])
    good = tmp_path / "a.yaml"
    _write(good, service(), eps())
    src.sync()
    before = _state(db, w)
    bad_svc = service()
    bad_svc["spec"]["ports"][0]["port"] = 0
    _write(good, bad_svc, eps(endpoints=[endpoint("10.244.1.7")]))
    other = tmp_path / "b.yaml"
    _write(other, service(name="b", clusterIP="10.96.0.9", clusterIPs=["10.96.0.9"]))
    errors: list[tuple[str, str]] = []
    src.on_error = lambda path, msg: errors.append((path, msg))
    res = src.sync()
    msg = res.failed[str(good)]
    assert str(good) in msg and "Service test/echo" in msg and "spec.ports[0].port" in msg
    assert src.errors == {str(good): msg} and errors == [(str(good), msg)]
    # The bad file kept its old objects (the slice change in it was not applied either);
    # the other file applied.
    after = _state(db, w)
    assert after["backends"] == before["backends"]
    assert after["services"] == ["test/b", "test/echo"]
    # A repeated poll does not report the same error again.
    src.sync()
    assert len(errors) == 1
    # Fixing the file clears the error.
    _write(good, service(), eps(endpoints=[endpoint("10.244.1.7")]))
    res = src.sync()
    assert not res.failed and not src.errors
    assert _state(db, w)["backends"] == ["10.244.1.7:80/TCP"]


@pytest.mark.parametrize(
    "text, suffix, match",
    [("a: [1", ".yaml", "cannot parse"),
     ("- 1\n", ".yaml", "expected an object"),
     ("{", ".json", "cannot parse"),
     ("kind: Service\n", ".yaml", "metadata"),
     ("metadata: {name: x}\n", ".yaml", "field kind")],
)
def test_malformed_files(tmp_path: Path, text: str, suffix: str, match: str) -> None:
    db, w, src = _new([tmp_path])
    (tmp_path / f"x{suffix}").write_text(text)
    res = src.sync()
    assert match in res.failed[str(tmp_path / f"x{suffix}")]
    assert _state(db, w) == {"services": [], "frontends": [], "backends": []}


def test_conflicts_between_files(tmp_path: Path) -> None:
    db, w, src = _new([tmp_path])
    _write(tmp_path / "a.yaml", service())
    src.sync()
    # Same object in a second file.
    _write(tmp_path / "b.yaml", service())
    assert "already defined in" in src.sync().failed[str(tmp_path / "b.yaml")]
    # Another service claiming the same frontend: rejected, nothing of b.yaml applied.
    _write(tmp_path / "b.yaml", eps(svc="other"), service(name="other"))
    res = src.sync()
    assert "conflicts with service test/echo" in res.failed[str(tmp_path / "b.yaml")]
    assert _state(db, w)["backends"] == []
    assert src.converter.known_objects("EndpointSlice") == []
    # Once a.yaml goes away, b.yaml applies on the next poll.
    (tmp_path / "a.yaml").unlink()
    res = src.sync()
    assert res.removed == [str(tmp_path / "a.yaml")] and res.applied == [str(tmp_path / "b.yaml")]
    assert _state(db, w)["services"] == ["test/other"]


def test_json_list_and_ignored_kinds(tmp_path: Path) -> None:
    db, w, src = _new([tmp_path / "objs.json"])
    doc = {"kind": "List", "items": [service(), eps(), {"kind": "ConfigMap",
                                                        "metadata": {"name": "c"}}]}
    (tmp_path / "objs.json").write_text(json.dumps(doc))
    res = src.sync()
    assert res.ignored == 1 and not res.failed
    assert _state(db, w)["backends"] == ["10.244.1.1:80/TCP"]
    assert parse_manifest_text(json.dumps([service()]), "x.json")[0]["kind"] == "Service"
    with pytest.raises(ManifestError, match="items"):
        parse_manifest_text("kind: List\nitems: 3\n", "x.yaml")


def test_examples_load_cleanly() -> None:
    db, w, src = _new([EXAMPLES])
    res = src.sync()
    assert not res.failed and len(res.applied) >= 2
    r = db.read_txn()
    assert w.services.count(r) >= 2 and w.backends.count(r) >= 4
    for f in w.frontends.all(r):
        assert f.service is not None
    for b in w.backends.all(r):
        assert b.address.address in ipaddress.ip_network("10.244.0.0/16")


def test_initializer_and_run_loop(tmp_path: Path) -> None:
    db, w, src = _new([tmp_path])
    with w.write_txn() as t:
        src.register_initializer(t)
    assert w.services.initialized(db.read_txn())[0] is False

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(src.run)
            assert w.services.initialized(db.read_txn())[0] is True
            _write(tmp_path / "e.yaml", service(), eps())
            with anyio.fail_after(10):
                while w.backends.count(db.read_txn()) == 0:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()

    anyio.run(main)
    with pytest.raises(ValueError, match="interval"):
        ManifestSource(w, [tmp_path], interval=0)
