"""The LB state file source (--lb-state-file): replace, drop, clear, invalid, run loop."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
import yaml

from sources.state_file import StateFileError, StateFileSource, parse_state_file
from statedb import DB
from tables.lb_writer import LBWriter

from .test_k8s_convert import eps, service


def _lb_service() -> dict[str, object]:
    obj = service(type="LoadBalancer", status={"loadBalancer": {"ingress": [{"ip": "172.16.1.1"}]}})
    del obj["kind"], obj["apiVersion"]
    spec = obj["spec"]
    assert isinstance(spec, dict)
    del spec["clusterIP"], spec["clusterIPs"]
    return obj


def _state(db: DB, w: LBWriter) -> tuple[list[str], list[str], list[str]]:
    r = db.read_txn()
    return ([f"{s.name} {s.source}" for s in w.services.all(r)],
            [str(f.address) for f in w.frontends.all(r)],
            [b.instances_text() + " " + str(b.address) for b in w.backends.all(r)])


def test_state_file_lifecycle(tmp_path: Path) -> None:
    db = DB()
    w = LBWriter.create(db)
    path = tmp_path / "state.yaml"
    src = StateFileSource(w, path, interval=0.01)
    src.sync()  # missing file: empty state
    assert src.error == "" and _state(db, w) == ([], [], [])
    assert not src.sync()
    slice_ = eps(endpoints=[{"addresses": ["2.2.2.2"]}])
    del slice_["kind"]
    path.write_text(yaml.safe_dump({"services": [_lb_service()], "endpoints": [slice_]}))
    assert src.sync()
    assert _state(db, w) == (["test/echo api"], ["172.16.1.1:80/TCP"],
                             ["test/echo (http) 2.2.2.2:80/TCP"])
    (b,) = list(w.backends.all(db.read_txn()))
    assert b.instance("test/echo") is not None and b.instance("test/echo").source == "api"  # type: ignore[union-attr]
    assert not src.sync()  # unchanged
    path.write_text(yaml.safe_dump({"services": [_lb_service()], "not-endpoints": [slice_]}))
    assert src.sync()
    assert _state(db, w)[2] == []
    bad = _lb_service()
    bad["spec"]["ports"][0]["port"] = 0  # type: ignore[index]
    path.write_text(yaml.safe_dump({"services": [bad]}))
    assert not src.sync()
    assert "spec.ports[0].port" in src.error and str(path) in src.error
    assert _state(db, w)[0] == ["test/echo api"]
    path.write_text("")
    assert src.sync() and src.error == ""
    assert _state(db, w) == ([], [], [])


@pytest.mark.parametrize("text, match", [("[1]", "mapping"), ("services: 3", "services"),
                                         ("services: [1]", r"services\[0\]"), ("a: [", "parse"),
                                         ("endpoints: [{kind: Service}]", "kind")])
def test_parse_errors(text: str, match: str) -> None:
    with pytest.raises(StateFileError, match=match):
        parse_state_file(text, "s.yaml")


def test_errors_name_the_file_and_position(tmp_path: Path) -> None:
    db = DB()
    w = LBWriter.create(db)
    path = tmp_path / "state.yaml"
    src = StateFileSource(w, path, interval=0.01)
    path.write_text("services:\n  - metadata: {name: [x}\n")
    assert not src.sync()
    assert src.error.startswith(f"{path}: line 2, column ") and "cannot parse YAML" in src.error
    assert "<unicode string>" not in src.error and "\n" not in src.error
    path.write_bytes(b"services: \xff\n")
    assert not src.sync() and src.error == f"{path}: not UTF-8 text (at byte offset 10)"
    path.write_text(yaml.safe_dump({"endpoints": [{"kind": "Service"}]}))
    assert not src.sync() and src.error == f"{path}: endpoints[0].kind: expected EndpointSlice"
    with pytest.raises(StateFileError) as e:
        parse_state_file("services: 3", "s.yaml")
    err = e.value
    assert (err.obj, err.field, err.message) == ("s.yaml", "services", "expected a list")


def test_a_bug_is_not_reported_as_a_bad_state_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sources.k8s_convert as k8s_convert

    db = DB()
    w = LBWriter.create(db)
    path = tmp_path / "state.yaml"
    src = StateFileSource(w, path, interval=0.01)
    path.write_text(yaml.safe_dump({"services": [_lb_service()]}))

    def broken(*args: object, **kwargs: object) -> object:
        raise TypeError("a bug in the converter")

    # The Service's frontends fail to be made: a function the converter calls through its
    # module's namespace (compiled with mypyc, the converter calls its own functions, such
    # as `convert_service`, directly: patching those does not reach it).
    monkeypatch.setattr(k8s_convert, "new_frontend_params", broken)
    with pytest.raises(TypeError, match="a bug in the converter"):
        src.sync()
    assert src.error == "" and _state(db, w) == ([], [], [])
    monkeypatch.undo()
    assert src.sync() and _state(db, w)[0] == ["test/echo api"]


def test_run_loop(tmp_path: Path) -> None:
    db = DB()
    w = LBWriter.create(db)
    path = tmp_path / "state.yaml"
    src = StateFileSource(w, path, interval=0.01)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(src.run)
            path.write_text(yaml.safe_dump({"services": [_lb_service()]}))
            with anyio.fail_after(10):
                while w.services.count(db.read_txn()) == 0:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()

    anyio.run(main)
    with pytest.raises(ValueError, match="interval"):
        StateFileSource(w, path, interval=0)
