"""The agent's own API client (sources/k8s_http.py, sources/k8s_client.py) against the fake
API server: requests, the API's errors, and what an operator reads of them, compared with
the official ``kubernetes`` client's view of the same answers (a test dependency only)."""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from sources.k8s_client import ClientSettings, K8sClient, resource_path
from sources.k8s_http import K8sApiError, bypasses_proxy, describe_error, environment_proxy
from statedb.errors import StatewrightError

from .fake_apiserver import FakeAPIServer
from .test_fake_apiserver_writes import cep, identity

IDENTITIES = resource_path("cilium.io/v2", "ciliumidentities")


@pytest.fixture
def client(kubeconfig: str) -> Iterator[K8sClient]:
    c = K8sClient(ClientSettings(kubeconfig=kubeconfig))
    try:
        yield c
    finally:
        c.close()


def test_resource_paths() -> None:
    assert resource_path("v1", "services") == "/api/v1/services"
    assert resource_path("discovery.k8s.io/v1", "endpointslices") == (
        "/apis/discovery.k8s.io/v1/endpointslices"
    )
    assert resource_path("cilium.io/v2", "ciliumendpoints", "kube-system", "a/b") == (
        "/apis/cilium.io/v2/namespaces/kube-system/ciliumendpoints/a%2Fb"
    )
    assert resource_path("cilium.io/v2", "ciliumidentities", name="7") == (
        "/apis/cilium.io/v2/ciliumidentities/7"
    )


def test_create_replace_delete_and_their_errors(
    apiserver: FakeAPIServer, client: K8sClient
) -> None:
    got = client.create(IDENTITIES, identity(300, {"k8s:app": "web"}), timeout=10)
    assert got["metadata"]["name"] == "300" and got["metadata"]["resourceVersion"]
    with pytest.raises(K8sApiError) as e:
        client.create(IDENTITIES, identity(300, {"k8s:app": "db"}), timeout=10)
    err = e.value
    assert isinstance(err, StatewrightError)
    assert (err.verb, err.path, err.status, err.reason) == ("POST", IDENTITIES, 409, "Conflict")
    assert json.loads(err.body)["reason"] == "AlreadyExists" and "300" in err.message
    assert describe_error(err) == f"HTTP 409 Conflict: {err.message}"
    assert str(err) == f"POST {IDENTITIES}: HTTP 409 Conflict: {err.message}"
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.status, copy.message, str(copy)) == (409, err.message, str(err))

    ns_path = resource_path("cilium.io/v2", "ciliumendpoints", "default")
    made = client.create(ns_path, cep("web-1", "default", "10.0.0.1"), timeout=10)
    one = resource_path("cilium.io/v2", "ciliumendpoints", "default", "web-1")
    body = {**made, "status": {**made["status"], "id": 8}}
    replaced = client.replace(one, body, timeout=10)
    assert replaced["status"]["id"] == 8
    assert replaced["metadata"]["resourceVersion"] != made["metadata"]["resourceVersion"]
    with pytest.raises(K8sApiError) as e:
        client.replace(one, body, timeout=10)  # the version it names is gone: a conflict
    assert (e.value.verb, e.value.status) == ("PUT", 409)
    client.delete(one, timeout=10)
    with pytest.raises(K8sApiError) as e:
        client.delete(one, timeout=10)
    assert (e.value.verb, e.value.path, e.value.status) == ("DELETE", one, 404)
    assert [r.verb for r in apiserver.requests if r.resource == "ciliumendpoints"] == [
        "create", "update", "update", "delete", "delete"
    ]


def test_a_list_is_raw_json(apiserver: FakeAPIServer, client: K8sClient) -> None:
    client.create(IDENTITIES, identity(5, {"k8s:app": "a"}), timeout=10)
    doc = json.loads(client.get(IDENTITIES, query=[("limit", "1")], timeout=(5, 10)))
    assert [i["metadata"]["name"] for i in doc["items"]] == ["5"]
    (rec,) = [r for r in apiserver.requests if r.verb == "list"]
    assert rec.query == {"limit": "1"} and rec.token == apiserver.token


@pytest.mark.parametrize(
    ("status", "retry_after"), [(401, None), (403, None), (410, None), (429, 3), (503, 1)]
)
def test_errors_read_as_the_official_client_reads_them(
    apiserver: FakeAPIServer,
    client: K8sClient,
    custom: kubernetes.client.CustomObjectsApi,
    status: int,
    retry_after: int | None,
) -> None:
    """Status, reason, body and Retry-After of an error answer, as the official client
    reads them (what the agent showed operators before it had a client of its own)."""
    seen: list[Any] = []
    for call in (
        lambda: client.get(IDENTITIES, timeout=10),
        lambda: custom.list_cluster_custom_object("cilium.io", "v2", "ciliumidentities"),
    ):
        apiserver.fail_next(status, retry_after=retry_after, match="ciliumidentities")
        with pytest.raises((K8sApiError, ApiException)) as e:
            call()
        seen.append(e.value)
    ours, theirs = seen
    assert (ours.status, ours.reason) == (theirs.status, theirs.reason)
    assert json.loads(ours.body) == json.loads(theirs.body)
    assert ours.message == json.loads(theirs.body)["message"]
    assert ours.retry_after == (None if retry_after is None else float(retry_after))
    assert theirs.headers.get("Retry-After") == (
        None if retry_after is None else str(retry_after)
    )


def test_a_rotated_token_is_used_from_the_next_request(
    apiserver: FakeAPIServer, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text(apiserver.token)
    c = K8sClient(ClientSettings(kubeconfig=apiserver.write_kubeconfig(
        tmp_path / "kc", token_file="token")))
    try:
        c.get(IDENTITIES, timeout=10)
        new = apiserver.rotate_token()
        with pytest.raises(K8sApiError) as e:
            c.get(IDENTITIES, timeout=10)
        assert e.value.status == 401 and describe_error(e.value).startswith("HTTP 401")
        token.write_text(new + "\n")
        c.get(IDENTITIES, timeout=10)
    finally:
        c.close()
    assert [r.status for r in apiserver.requests] == [200, 401, 200]


def test_unreachable_server_is_a_transport_error(tmp_path: Path, apiserver: FakeAPIServer) -> None:
    kc = apiserver.write_kubeconfig(tmp_path / "kc", server="https://127.0.0.1:1")
    c = K8sClient(ClientSettings(kubeconfig=kc))
    try:
        with pytest.raises(urllib3.exceptions.MaxRetryError) as e:
            c.get(IDENTITIES, timeout=(2, 2))
    finally:
        c.close()
    assert describe_error(e.value).startswith("cannot connect: ")


def test_environment_proxy_and_no_proxy() -> None:
    env = {"HTTPS_PROXY": "http://proxy:3128", "no_proxy": "localhost,.cluster.local,10.0.0.0/8"}
    assert environment_proxy("https://api.example:6443", env) == "http://proxy:3128"
    for bypassed in ("https://localhost:6443", "https://api.cluster.local",
                     "https://10.1.2.3:443"):
        assert environment_proxy(bypassed, env) == "", bypassed
    assert environment_proxy("http://api:80", env) == ""  # no http proxy, no all_proxy
    assert environment_proxy("http://api:80", {"ALL_PROXY": "http://p:1"}) == "http://p:1"
    assert environment_proxy("https://api:6443", {}) == ""
    assert bypasses_proxy("https://[fd00::1]:443", "fd00::/64")
    assert bypasses_proxy("https://api:6443", "*")
    assert bypasses_proxy("https://api:6443", "api:6443")
    assert not bypasses_proxy("https://api:6443", "other, api:1")
