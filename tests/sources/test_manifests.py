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


def _key(path: Path, kind: str, name: str) -> str:
    return f"{path}#{kind}/{name}"


def test_invalid_object_is_reported_alone_and_recovers(tmp_path: Path) -> None:
    db, w, src = _new([tmp_path])
    good = tmp_path / "a.yaml"
    _write(good, service(), eps())
    src.sync()
    before = _state(db, w)
    bad_svc = service(clusterIP="10.96.50.105", clusterIPs=["10.96.50.105"])
    bad_svc["spec"]["ports"][0]["port"] = 0
    _write(good, bad_svc, eps(endpoints=[endpoint("10.244.1.7")]),
           service(name="new", clusterIP="10.96.0.8", clusterIPs=["10.96.0.8"]))
    other = tmp_path / "b.yaml"
    _write(other, service(name="b", clusterIP="10.96.0.9", clusterIPs=["10.96.0.9"]))
    errors: list[tuple[str, str]] = []
    src.on_error = lambda path, msg: errors.append((path, msg))
    res = src.sync()
    key = _key(good, "Service", "test/echo")
    msg = res.failed[key]
    assert msg == f"{good}: Service test/echo: spec.ports[0].port: port 0 is not allowed"
    assert dict(src.errors) == {key: msg} and errors == [(key, msg)]
    assert sorted(res.applied) == [str(good), str(other)]
    # The bad Service kept its previous version (frontend); the file's other objects (the
    # slice change, a new Service) and the other file applied.
    after = _state(db, w)
    assert after["services"] == ["test/b", "test/echo", "test/new"]
    assert after["frontends"] == sorted(before["frontends"] + ["10.96.0.8:80/TCP",
                                                               "10.96.0.9:80/TCP"])
    assert after["backends"] == ["10.244.1.7:80/TCP"]
    # A repeated poll does not report the same error again.
    src.sync()
    assert len(errors) == 1
    # Fixing the object clears its error on the next poll.
    _write(good, service(clusterIP="10.96.50.105", clusterIPs=["10.96.50.105"]),
           eps(endpoints=[endpoint("10.244.1.7")]))
    res = src.sync()
    assert not res.failed and not src.errors
    assert _state(db, w)["frontends"] == ["10.96.0.9:80/TCP", "10.96.50.105:80/TCP"]
    assert _state(db, w)["services"] == ["test/b", "test/echo"]


def test_invalid_new_object_is_not_applied_and_its_error_goes_with_it(tmp_path: Path) -> None:
    db, w, src = _new([tmp_path])
    bad = eps(name="big", endpoints=[endpoint(f"10.1.{i // 256}.{i % 256}") for i in range(1001)])
    _write(tmp_path / "a.yaml", service(), bad)
    res = src.sync()
    key = _key(tmp_path / "a.yaml", "EndpointSlice", "test/big")
    assert list(res.failed) == [key]
    assert "EndpointSlice test/big: endpoints: at most 1000 endpoints, got 1001" in res.failed[key]
    assert _state(db, w) == {"services": ["test/echo"], "frontends": ["10.96.50.104:80/TCP"],
                             "backends": []}
    # Removing the object from the file removes its error.
    _write(tmp_path / "a.yaml", service())
    assert not src.sync().failed and not src.errors


def test_many_invalid_objects_each_reported(tmp_path: Path) -> None:
    db, w, src = _new([tmp_path])
    objs: list[object] = []
    for i in range(20):
        svc = service(name=f"s{i}", clusterIP=f"10.96.1.{i}", clusterIPs=[f"10.96.1.{i}"])
        if i % 2:
            svc["spec"]["ports"][0]["protocol"] = "XTP"
        objs.append(svc)
    _write(tmp_path / "a.yaml", *objs)
    res = src.sync()
    assert sorted(res.failed) == sorted(_key(tmp_path / "a.yaml", "Service", f"test/s{i}")
                                        for i in range(1, 20, 2))
    assert _state(db, w)["services"] == sorted(f"test/s{i}" for i in range(0, 20, 2))


@pytest.mark.parametrize(
    "text, suffix, key, match",
    [("a: [1", ".yaml", "", "line 1, column 6: cannot parse YAML: expected ',' or ']'"),
     ("a: b\n c: d: e\n", ".yaml", "", "line 2, column 3: cannot parse YAML: mapping values"),
     ("- 1\n", ".yaml", "#0", "object 0 (line 1): expected an object, got list"),
     ("{", ".json", "", "line 1, column 2: cannot parse JSON"),
     ("kind: List\nitems: 3\n", ".yaml", "", "document 0 (line 1): items: expected a list"),
     ("kind: Service\n", ".yaml", "#0", "object 0 (line 1): Service ?/?: metadata: missing"),
     ("kind: ConfigMap\nmetadata: {name: c}\n---\nmetadata: {name: x}\n", ".yaml", "#1",
      "object 1 (line 4): kind: missing or not a string")],
)
def test_malformed_files(tmp_path: Path, text: str, suffix: str, key: str, match: str) -> None:
    db, w, src = _new([tmp_path])
    path = tmp_path / f"x{suffix}"
    path.write_text(text)
    res = src.sync()
    assert list(res.failed) == [f"{path}{key}"]
    message = res.failed[f"{path}{key}"]
    assert message.startswith(f"{path}: ") and match in message
    assert "<unicode string>" not in message and "\n" not in message
    assert _state(db, w) == {"services": [], "frontends": [], "backends": []}


def test_unreadable_or_unparsable_file_keeps_its_objects(tmp_path: Path) -> None:
    db, w, src = _new([tmp_path])
    path = tmp_path / "a.yaml"
    _write(path, service(), eps())
    src.sync()
    before = _state(db, w)
    path.write_bytes(b"kind: Service\nmetadata: {name: \xff}\n")
    res = src.sync()
    assert res.failed == {str(path): f"{path}: not UTF-8 text (at byte offset 31)"}
    path.write_text("kind: [")
    assert "cannot parse YAML" in src.sync().failed[str(path)]
    assert _state(db, w) == before
    _write(path, service())
    assert not src.sync().failed and not src.errors
    assert _state(db, w)["backends"] == []


def test_conflicts_between_files(tmp_path: Path) -> None:
    db, w, src = _new([tmp_path])
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    _write(a, service())
    src.sync()
    # Same object in a second file: an error of the second file; the first keeps it.
    _write(b, service(clusterIP="10.96.0.7", clusterIPs=["10.96.0.7"]))
    res = src.sync()
    assert res.failed == {_key(b, "Service", "test/echo"):
                          f"{b}: Service test/echo: already defined in {a}"}
    assert _state(db, w)["frontends"] == ["10.96.50.104:80/TCP"]
    # Another service claiming the same frontend: that service is rejected, the file's
    # other objects apply.
    _write(b, eps(svc="other"), service(name="other"))
    res = src.sync()
    assert list(res.failed) == [_key(b, "Service", "test/other")]
    assert res.failed[_key(b, "Service", "test/other")] == (
        f"{b}: service test/other: frontend 10.96.50.104:80/TCP conflicts with service "
        "test/echo, which already owns it")
    assert _state(db, w)["services"] == ["test/echo"]
    assert src.converter.known_objects("EndpointSlice") == ["test/echo-1"]
    # Once a.yaml goes away, the rejected service applies on the next poll.
    a.unlink()
    res = src.sync()
    assert res.removed == [str(a)] and res.applied == [str(b)] and not src.errors
    assert _state(db, w)["services"] == ["test/other"]
    assert _state(db, w)["frontends"] == ["10.96.50.104:80/TCP"]


def test_object_defined_twice_in_a_file_keeps_its_previous_version(tmp_path: Path) -> None:
    db, w, src = _new([tmp_path])
    path = tmp_path / "a.yaml"
    _write(path, service(), eps())
    src.sync()
    _write(path, service(clusterIP="10.96.0.1", clusterIPs=["10.96.0.1"]),
           service(clusterIP="10.96.0.2", clusterIPs=["10.96.0.2"]))
    res = src.sync()
    assert res.failed == {_key(path, "Service", "test/echo"):
                          f"{path}: Service test/echo: defined more than once in the file"}
    assert _state(db, w) == {"services": ["test/echo"], "frontends": ["10.96.50.104:80/TCP"],
                             "backends": []}


def test_unknown_kinds_are_errors_well_known_kinds_are_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db, w, src = _new([tmp_path])
    path = tmp_path / "a.yaml"
    typo = service()
    typo["kind"] = "Servce"
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "web", "namespace": "test"}}
    _write(path, typo, deployment, eps())
    with caplog.at_level("INFO", logger="sources.manifests"):
        res = src.sync()
    key = _key(path, "Servce", "test/echo")
    assert list(res.failed) == [key]
    assert res.failed[key].startswith(f"{path}: Servce test/echo: kind: unknown kind 'Servce'")
    assert res.ignored == 1 and src.ignored == 1
    assert _state(db, w)["backends"] == ["10.244.1.1:80/TCP"]
    logged = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert ("ERROR", f"manifest source: {res.failed[key]}") in logged
    assert ("INFO", f"manifest source: {path}: ignoring 1 object(s) of kinds the agent does "
                    "not use: Deployment test/web") in logged
    # The error is in the file's own content: an unchanged file is not looked at again, the
    # error stays, nothing is logged again.
    caplog.clear()
    with caplog.at_level("INFO", logger="sources.manifests"):
        res = src.sync()
    assert not res.failed and not res.changed and list(src.errors) == [key]
    assert not caplog.records
    # Fixing the kind applies the Service and clears the error.
    _write(path, service(), deployment, eps())
    res = src.sync()
    assert not res.failed and not src.errors
    assert _state(db, w)["services"] == ["test/echo"]


def test_a_bug_is_not_reported_as_a_bad_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sources.k8s_convert as k8s_convert

    db, w, src = _new([tmp_path])
    _write(tmp_path / "a.yaml", service(), eps())

    def broken(*args: object, **kwargs: object) -> object:
        raise TypeError("a bug in the converter")

    # The slice's backends fail to be made, by either of the converter's loops: functions
    # it calls through its module's namespace (compiled with mypyc, the converter calls its
    # own functions, such as `convert_endpoint_slice`, directly: patching those does not
    # reach it).
    monkeypatch.setattr(k8s_convert, "backend_params_of", broken)
    monkeypatch.setattr(k8s_convert, "new_backend_params_from", broken)
    with pytest.raises(TypeError, match="a bug in the converter"):
        src.sync()
    assert not src.errors
    # The write transaction was aborted: the Service written before the bug is not there.
    assert _state(db, w) == {"services": [], "frontends": [], "backends": []}
    monkeypatch.undo()
    assert not src.sync().failed
    assert _state(db, w)["backends"] == ["10.244.1.1:80/TCP"]


def test_files_and_errors_are_read_only_views(tmp_path: Path) -> None:
    _, _, src = _new([tmp_path])
    assert src.files == []
    _write(tmp_path / "b.yaml", service())
    (tmp_path / "a.yaml").write_text("a: [")
    (tmp_path / "notes.txt").write_text("not a manifest")
    src.sync()
    assert src.files == [str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml")]
    assert list(src.errors) == [str(tmp_path / "a.yaml")]
    with pytest.raises(TypeError):
        src.errors["x"] = "y"  # type: ignore[index]
    (tmp_path / "a.yaml").unlink()
    src.sync()
    assert src.files == [str(tmp_path / "b.yaml")] and not src.errors


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


def test_polls_run_off_the_event_loop(tmp_path: Path) -> None:
    """Reading and parsing large files must not hold up the event loop: every poll of
    `ManifestSource.run` runs in a worker thread, while the loop keeps answering."""
    import threading

    _, _, source = _new([tmp_path])
    loop_thread: list[threading.Thread] = []
    poll_threads: list[threading.Thread] = []
    real_sync = source.sync

    def sync() -> object:
        poll_threads.append(threading.current_thread())
        return real_sync()

    source.sync = sync  # type: ignore[method-assign]

    async def main() -> None:
        loop_thread.append(threading.current_thread())
        async with anyio.create_task_group() as tg:
            await tg.start(source.run)
            while len(poll_threads) < 3:
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()

    anyio.run(main)
    assert poll_threads and all(t is not loop_thread[0] for t in poll_threads)


def test_large_yaml_uses_the_fast_loader_and_keeps_pyyaml_error_wording(tmp_path: Path) -> None:
    """With libyaml, a 1,000-endpoint slice parses with it; a broken file still gets
    PyYAML's message (file, line, column)."""
    from sources import manifests

    if not yaml.__with_libyaml__:
        pytest.skip("PyYAML without libyaml: the pure-Python loader is the only one")
    assert manifests._SafeLoader is yaml.CSafeLoader
    ok = tmp_path / "ok.yaml"
    ok.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Service",
                                  "metadata": {"name": "a", "namespace": "x"}}))
    assert len(manifests.parse_manifest_objects(ok.read_text(), ok)) == 1
    with pytest.raises(ManifestError, match=r"line 1, column 6: cannot parse YAML: expected"):
        manifests.parse_manifest_objects("a: [1", tmp_path / "bad.yaml")


def test_a_configured_path_that_does_not_exist_is_reported_until_it_does(
    tmp_path: Path,
) -> None:
    """A typo in ``--manifests`` must not look like an empty directory: the path is listed
    in `missing` (the agent's health says Degraded) until it appears, then read."""
    gone = tmp_path / "not-yet"
    db, w, src = _new([tmp_path / "present", gone])
    (tmp_path / "present").mkdir()
    src.sync()
    assert src.missing == [str(gone)]
    gone.mkdir()
    _write(gone / "echo.yaml", service(), eps())
    src.sync()
    assert src.missing == [] and _state(db, w)["services"] == ["test/echo"]


def test_manifests_component_health_names_a_missing_path(tmp_path: Path) -> None:
    from statewright.agent.components.sources import ManifestsComponent, ManifestsConfig

    gone = str(tmp_path / "typo")
    comp = ManifestsComponent(ManifestsConfig((gone,)))
    _db, _w, comp.source = _new([Path(gone)])
    comp.source.sync()
    (line,) = comp.health()
    assert line.state == "Degraded" and gone in line.message and "does not exist" in line.message


def test_a_dangling_symlink_in_the_directory_is_reported(tmp_path: Path) -> None:
    """A manifest that is a broken link (or a link loop) is an error naming it, not a file
    silently left out; once the link points at a file, the file is read."""
    mdir = tmp_path / "manifests"
    mdir.mkdir()
    db, w, src = _new([mdir])
    target = tmp_path / "elsewhere" / "echo.json"
    (mdir / "echo.yaml").symlink_to(target)
    (mdir / "loop.yaml").symlink_to(mdir / "loop.yaml")
    src.sync()
    assert set(src.errors) == {str(mdir / "echo.yaml"), str(mdir / "loop.yaml")}
    assert "cannot read" in src.errors[str(mdir / "echo.yaml")]
    target.parent.mkdir()
    _write(target, service(), eps())
    (mdir / "loop.yaml").unlink()
    src.sync()
    assert not src.errors and _state(db, w)["services"] == ["test/echo"]


def _bump(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def test_an_error_clears_when_the_file_returns_to_its_last_good_content(
    tmp_path: Path,
) -> None:
    """Append a broken line, then copy the original bytes back: the error goes, although
    the content hash equals the last one applied."""
    db, w, src = _new([tmp_path])
    path = tmp_path / "echo.yaml"
    _write(path, service(), eps())
    good = path.read_bytes()
    src.sync()
    path.write_bytes(good + b"  bad: [unclosed\n")
    _bump(path)
    assert src.sync().failed and list(src.errors) == [str(path)]
    assert _state(db, w)["services"] == ["test/echo"]  # the last good objects stay
    path.write_bytes(good)
    _bump(path)
    src.sync()
    assert src.errors == {}
    assert _state(db, w)["services"] == ["test/echo"]


def test_an_empty_file_is_named(tmp_path: Path) -> None:
    _, _, src = _new([tmp_path])
    _write(tmp_path / "echo.yaml", service(), eps())
    (tmp_path / "empty.yaml").write_text("# nothing here yet\n")
    src.sync()
    assert src.empty == [str(tmp_path / "empty.yaml")]
    _write(tmp_path / "empty.yaml", service(name="two", clusterIP="10.96.0.2",
                                            clusterIPs=["10.96.0.2"]))
    src.sync()
    assert src.empty == []


class _PolicyKinds:
    """A kind handler for the two policy kinds that applies nothing."""

    kinds = ("NetworkPolicy", "CiliumNetworkPolicy")
    tables: tuple[object, ...] = ()

    def check(self, obj: object) -> None:
        return None

    def upsert(self, txn: object, obj: object) -> None:
        return None

    def delete(self, txn: object, obj: object) -> None:
        return None


def test_the_unknown_kind_error_lists_the_handlers_kinds(tmp_path: Path) -> None:
    _, _, src = _new([tmp_path])
    src.add_kind_handler(_PolicyKinds())  # type: ignore[arg-type]
    _write(tmp_path / "x.yaml", {"apiVersion": "v1", "kind": "Servce",
                                 "metadata": {"name": "echo", "namespace": "test"}})
    (message,) = src.sync().failed.values()
    supported = message.split("(supported: ")[1].split(";")[0].split(", ")
    assert {"Service", "EndpointSlice", "NetworkPolicy", "CiliumNetworkPolicy"} <= set(supported)
