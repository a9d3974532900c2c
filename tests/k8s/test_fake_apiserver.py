"""The fake API server, checked with independent clients: kubectl and the kubernetes client.

kubectl (1.32, /usr/bin/kubectl on the project's machines) is the reference: if it lists
and watches what the fake holds, the fake's discovery, list and watch wire format are
those of a real API server. The Python client then checks the details the reflector
relies on: pagination, resourceVersion, bookmarks, 410 Gone, selectors, faults.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import kubernetes.config
import pytest
from kubernetes.client.exceptions import ApiException

from .fake_apiserver import RESOURCES, FakeAPIServer
from .objects import endpoint_slice, node, pod, service

KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(
    KUBECTL is None and os.environ.get("CI", "").lower() != "true",
    reason="kubectl not installed",
)


def _kubectl(kubeconfig: str, home: Path, *args: str) -> list[str]:
    assert KUBECTL is not None, "kubectl is required (CI=true)"
    return [KUBECTL, "--kubeconfig", kubeconfig, "--cache-dir", str(home / "cache"), *args]


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "HOME": str(home), "KUBECONFIG": ""}


def _events(resp: Any) -> Iterator[dict[str, Any]]:
    buf = b""
    for chunk in resp.stream(65536):
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)


# ----- kubectl ------------------------------------------------------------------------------
@needs_kubectl
def test_kubectl_lists_services(apiserver: FakeAPIServer, kubeconfig: str, tmp_path: Path) -> None:
    apiserver.upsert(service("echo", "10.96.0.10"))
    apiserver.upsert(service("web", "10.96.0.11", ns="shop"))
    out = subprocess.run(
        _kubectl(kubeconfig, tmp_path, "get", "services", "-A", "-o", "json"),
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    names = sorted((i["metadata"]["namespace"], i["metadata"]["name"]) for i in doc["items"])
    assert names == [("default", "echo"), ("shop", "web")]
    assert {i["spec"]["clusterIP"] for i in doc["items"]} == {"10.96.0.10", "10.96.0.11"}
    # kubectl found the resource through discovery, then listed with a page limit.
    paths = [r.path for r in apiserver.requests]
    assert "/api/v1" in paths
    assert any(r.path == "/api/v1/services" and r.verb == "list" for r in apiserver.requests)


@needs_kubectl
def test_kubectl_lists_endpointslices_by_discovery(
    apiserver: FakeAPIServer, kubeconfig: str, tmp_path: Path
) -> None:
    apiserver.upsert(endpoint_slice("echo", ["10.244.0.5"]))
    out = subprocess.run(
        _kubectl(kubeconfig, tmp_path, "get", "endpointslices", "-n", "default", "-o", "json"),
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    items = json.loads(out.stdout)["items"]
    assert [i["metadata"]["name"] for i in items] == ["echo-abcde"]
    assert items[0]["endpoints"][0]["addresses"] == ["10.244.0.5"]


@needs_kubectl
def test_kubectl_watch_sees_an_event(
    apiserver: FakeAPIServer, kubeconfig: str, tmp_path: Path
) -> None:
    apiserver.upsert(service("first", "10.96.0.10"))
    proc = subprocess.Popen(
        _kubectl(kubeconfig, tmp_path, "get", "services", "-A", "--watch", "-o", "name"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(tmp_path),
    )
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.strip())
            if line.strip() == "service/late":
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while apiserver.watch_count() == 0:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "kubectl never started watching"
            time.sleep(0.05)
        apiserver.upsert(service("late", "10.96.0.11"))
        assert seen.wait(60), f"kubectl printed {lines}"
        assert lines[0] == "service/first"
    finally:
        proc.kill()
        proc.wait()
        reader.join(timeout=10)
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                f.close()


# ----- the kubernetes client ---------------------------------------------------------------
def test_pagination_serves_a_consistent_snapshot(
    apiserver: FakeAPIServer, api: kubernetes.client.ApiClient
) -> None:
    for i in range(5):
        apiserver.upsert(service(f"s{i}", f"10.96.0.{i + 1}"))
    core = kubernetes.client.CoreV1Api(api)
    first = core.list_service_for_all_namespaces(limit=2)
    rv = first.metadata.resource_version
    assert [s.metadata.name for s in first.items] == ["s0", "s1"]
    assert first.metadata._continue and first.metadata.remaining_item_count == 3
    # A change after the first page does not show in the later pages.
    apiserver.upsert(service("s9", "10.96.0.99"))
    apiserver.delete("Service", "default", "s4")
    names = [s.metadata.name for s in first.items]
    cont = first.metadata._continue
    while cont:
        page = core.list_service_for_all_namespaces(limit=2, _continue=cont)
        assert page.metadata.resource_version == rv
        names += [s.metadata.name for s in page.items]
        cont = page.metadata._continue
    assert names == ["s0", "s1", "s2", "s3", "s4"]


def test_expired_continue_token_is_410(
    apiserver: FakeAPIServer, api: kubernetes.client.ApiClient
) -> None:
    for i in range(3):
        apiserver.upsert(service(f"s{i}", f"10.96.0.{i + 1}"))
    core = kubernetes.client.CoreV1Api(api)
    first = core.list_service_for_all_namespaces(limit=1)
    apiserver.expire()
    with pytest.raises(ApiException) as e:
        core.list_service_for_all_namespaces(limit=1, _continue=first.metadata._continue)
    assert e.value.status == 410
    assert json.loads(e.value.body)["reason"] == "Expired"


def test_watch_streams_events_and_bookmarks(
    apiserver: FakeAPIServer, api: kubernetes.client.ApiClient
) -> None:
    apiserver.upsert(service("a", "10.96.0.1"))
    core = kubernetes.client.CoreV1Api(api)
    rv = core.list_service_for_all_namespaces().metadata.resource_version
    resp = core.list_service_for_all_namespaces(
        watch=True,
        resource_version=rv,
        allow_watch_bookmarks=True,
        timeout_seconds=30,
        _preload_content=False,
        _request_timeout=(5, 10),
    )
    try:
        assert resp.headers["Transfer-Encoding"] == "chunked"
        events = _events(resp)
        apiserver.upsert(service("b", "10.96.0.2"))
        apiserver.upsert(service("b", "10.96.0.3"))
        apiserver.delete("Service", "default", "a")
        got: list[tuple[str, str]] = []
        bookmarks = 0
        for ev in events:
            if ev["type"] == "BOOKMARK":
                bookmarks += 1
                assert int(ev["object"]["metadata"]["resourceVersion"]) >= int(rv)
                if len(got) == 3:
                    break
                continue
            got.append((ev["type"], ev["object"]["metadata"]["name"]))
            assert ev["object"]["kind"] == "Service"
        assert got == [("ADDED", "b"), ("MODIFIED", "b"), ("DELETED", "a")]
        assert bookmarks >= 1
    finally:
        resp.close()


def test_a_bookmark_never_runs_ahead_of_an_event_not_sent_yet(apiserver: FakeAPIServer) -> None:
    """A bookmark tells the client it has every event up to its revision. While an event
    is queued for a watch and not sent, the watch gets no bookmark: sent with the current
    revision ahead of the event, a watch ending right after it would resume past the
    event and lose it."""
    res = next(r for r in RESOURCES if r.kind == "Service")
    w = apiserver.open_watch(res, "", lambda _o: True, str(apiserver.resource_version))
    try:
        mark = apiserver.bookmark(res, w)
        assert mark is not None
        assert mark["object"]["metadata"]["resourceVersion"] == str(apiserver.resource_version)
        apiserver.upsert(service("a", "10.96.0.1"))
        assert apiserver.bookmark(res, w) is None
        event = w.events.get_nowait()
        assert event is not None and event["type"] == "ADDED"
        mark = apiserver.bookmark(res, w)
        assert mark is not None
        assert mark["object"]["metadata"]["resourceVersion"] == str(apiserver.resource_version)
    finally:
        apiserver.close_watch(w)


def test_watch_from_expired_version_gets_error_410(
    apiserver: FakeAPIServer, api: kubernetes.client.ApiClient
) -> None:
    apiserver.upsert(service("a", "10.96.0.1"))
    core = kubernetes.client.CoreV1Api(api)
    rv = core.list_service_for_all_namespaces().metadata.resource_version
    apiserver.upsert(service("b", "10.96.0.2"))
    apiserver.expire()
    resp = core.list_service_for_all_namespaces(
        watch=True, resource_version=rv, _preload_content=False, _request_timeout=(5, 10)
    )
    try:
        events = list(_events(resp))
    finally:
        resp.close()
    assert [e["type"] for e in events] == ["ERROR"]
    assert events[0]["object"]["code"] == 410 and events[0]["object"]["reason"] == "Expired"


def test_watch_replays_history_and_ends_at_timeout(
    apiserver: FakeAPIServer, api: kubernetes.client.ApiClient
) -> None:
    rv = str(apiserver.resource_version)
    apiserver.upsert(service("a", "10.96.0.1"))
    core = kubernetes.client.CoreV1Api(api)
    resp = core.list_service_for_all_namespaces(
        watch=True, resource_version=rv, timeout_seconds=1, _preload_content=False
    )
    try:
        events = list(_events(resp))  # ends by itself after one second
    finally:
        resp.close()
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "a")]


def test_field_selectors(apiserver: FakeAPIServer, api: kubernetes.client.ApiClient) -> None:
    apiserver.upsert(pod("p1", "node-a", "10.244.0.1", 8081))
    apiserver.upsert(pod("p2", "node-b", "10.244.0.2", 8082))
    apiserver.upsert(node("node-a", {"zone": "a"}))
    apiserver.upsert(node("node-b"))
    core = kubernetes.client.CoreV1Api(api)
    pods = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=node-a")
    assert [p.metadata.name for p in pods.items] == ["p1"]
    nodes = core.list_node(field_selector="metadata.name=node-a")
    assert [(n.metadata.name, n.metadata.labels) for n in nodes.items] == [
        ("node-a", {"zone": "a"})
    ]
    with pytest.raises(ApiException) as e:
        core.list_pod_for_all_namespaces(field_selector="spec.bogus=x")
    assert e.value.status == 400


def test_auth_faults_and_token_rotation(
    apiserver: FakeAPIServer, api: kubernetes.client.ApiClient
) -> None:
    core = kubernetes.client.CoreV1Api(api)
    apiserver.fail_next(429, retry_after=3)
    with pytest.raises(ApiException) as e:
        core.list_node()
    assert e.value.status == 429 and e.value.headers["Retry-After"] == "3"
    apiserver.fail_next(500)
    with pytest.raises(ApiException) as e:
        core.list_node()
    assert e.value.status == 500
    core.list_node()  # faults are used up
    apiserver.rotate_token()
    with pytest.raises(ApiException) as e:
        core.list_node()
    assert e.value.status == 401
    assert [r.status for r in apiserver.requests] == [429, 500, 200, 401]
    assert [(r.verb, r.resource) for r in apiserver.requests] == [("list", "nodes")] * 4


def test_dropped_and_stalled_watches(
    apiserver: FakeAPIServer, api: kubernetes.client.ApiClient
) -> None:
    core = kubernetes.client.CoreV1Api(api)
    rv = str(apiserver.resource_version)
    resp = core.list_service_for_all_namespaces(
        watch=True, resource_version=rv, _preload_content=False, _request_timeout=(5, 10)
    )
    try:
        apiserver.upsert(service("a", "10.96.0.1"))
        events = _events(resp)
        assert next(events)["type"] == "ADDED"
        assert apiserver.drop_watches() == 1
        with pytest.raises(Exception, match=r"ended prematurely|Connection broken"):
            list(events)
    finally:
        resp.close()
    # A stalled watch sends nothing, bookmarks included: the client's read times out.
    apiserver.stall_watches(new_ones=True)
    resp = core.list_service_for_all_namespaces(
        watch=True,
        resource_version=rv,
        allow_watch_bookmarks=True,
        _preload_content=False,
        _request_timeout=(5, 0.5),
    )
    try:
        with pytest.raises(Exception, match="timed out"):
            list(_events(resp))
    finally:
        resp.close()


def test_history_limit_compacts_old_versions() -> None:
    with FakeAPIServer(history_limit=2) as srv:
        first = srv.resource_version
        for i in range(5):  # more than the limit: the oldest are compacted away
            srv.upsert(service(f"s{i}", f"10.96.0.{i + 1}"))
        w = srv.open_watch(srv_resource("services"), "", lambda o: True, str(first))
        assert w.events.get_nowait()["object"]["code"] == 410
        recent = srv.resource_version - 1
        w = srv.open_watch(srv_resource("services"), "", lambda o: True, str(recent))
        assert w.events.get_nowait()["object"]["metadata"]["name"] == "s4"
        srv.close_watch(w)


def srv_resource(plural: str) -> Any:
    from .fake_apiserver import RESOURCES

    return next(r for r in RESOURCES if r.plural == plural)
