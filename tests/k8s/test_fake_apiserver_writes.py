"""The fake API server's writes (create, update, delete, the ownerReference cascade) and
its Cilium kinds, checked with independent clients: the kubernetes client's
CustomObjectsApi writes, kubectl reads what was written."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import kubernetes.client
import kubernetes.config
import pytest
from kubernetes.client.exceptions import ApiException

from .fake_apiserver import FakeAPIServer
from .objects import pod
from .test_fake_apiserver import _env, _kubectl, needs_kubectl


def identity(num: int, labels: dict[str, str]) -> dict[str, Any]:
    """A CiliumIdentity as an agent creates it."""
    return {
        "apiVersion": "cilium.io/v2",
        "kind": "CiliumIdentity",
        "metadata": {"name": str(num)},
        "security-labels": labels,
    }


def cep(name: str, ns: str, ip: str, owner_uid: str = "") -> dict[str, Any]:
    """A CiliumEndpoint (owned by the Pod of ``owner_uid`` when given)."""
    meta: dict[str, Any] = {"name": name, "namespace": ns}
    if owner_uid:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": owner_uid}
        ]
    return {
        "apiVersion": "cilium.io/v2",
        "kind": "CiliumEndpoint",
        "metadata": meta,
        "status": {"id": 7, "networking": {"addressing": [{"ipv4": ip}], "node": "192.0.2.1"}},
    }


def _create_identity(api: kubernetes.client.CustomObjectsApi, body: dict[str, Any]) -> Any:
    return api.create_cluster_custom_object("cilium.io", "v2", "ciliumidentities", body)


def test_create_conflicts_on_a_taken_name(
    apiserver: FakeAPIServer, custom: kubernetes.client.CustomObjectsApi
) -> None:
    got = _create_identity(custom, identity(300, {"k8s:app": "web"}))
    assert got["metadata"]["name"] == "300" and got["metadata"]["uid"]
    assert got["metadata"]["creationTimestamp"].endswith("Z")
    with pytest.raises(ApiException) as e:
        _create_identity(custom, identity(300, {"k8s:app": "db"}))
    assert e.value.status == 409
    assert json.loads(e.value.body)["reason"] == "AlreadyExists"
    # The first one stays.
    (stored,) = apiserver.objects("CiliumIdentity")
    assert stored["security-labels"] == {"k8s:app": "web"}
    assert [r.verb for r in apiserver.requests if r.resource == "ciliumidentities"] == [
        "create",
        "create",
    ]


def test_update_needs_the_current_resource_version(
    apiserver: FakeAPIServer, custom: kubernetes.client.CustomObjectsApi
) -> None:
    made = custom.create_namespaced_custom_object(
        "cilium.io", "v2", "shop", "ciliumendpoints", cep("web", "shop", "10.0.0.5")
    )
    fresh = dict(made, status={**made["status"], "state": "ready"})
    updated = custom.replace_namespaced_custom_object(
        "cilium.io", "v2", "shop", "ciliumendpoints", "web", fresh
    )
    assert int(updated["metadata"]["resourceVersion"]) > int(made["metadata"]["resourceVersion"])
    assert updated["metadata"]["uid"] == made["metadata"]["uid"]
    # Replaying the old version: 409 Conflict, nothing changes.
    stale = dict(made, status={**made["status"], "state": "disconnecting"})
    with pytest.raises(ApiException) as e:
        custom.replace_namespaced_custom_object(
            "cilium.io", "v2", "shop", "ciliumendpoints", "web", stale
        )
    assert e.value.status == 409 and json.loads(e.value.body)["reason"] == "Conflict"
    # Without a version: 422; a missing object: 404.
    unversioned = {**fresh, "metadata": {"name": "web", "namespace": "shop"}}
    with pytest.raises(ApiException) as e:
        custom.replace_namespaced_custom_object(
            "cilium.io", "v2", "shop", "ciliumendpoints", "web", unversioned
        )
    assert e.value.status == 422
    with pytest.raises(ApiException) as e:
        custom.replace_namespaced_custom_object(
            "cilium.io", "v2", "shop", "ciliumendpoints", "nope",
            {**fresh, "metadata": {**fresh["metadata"], "name": "nope"}},
        )
    assert e.value.status == 404
    (stored,) = apiserver.objects("CiliumEndpoint")
    assert stored["status"]["state"] == "ready"


def test_delete_and_watch_events(
    apiserver: FakeAPIServer, custom: kubernetes.client.CustomObjectsApi
) -> None:
    _create_identity(custom, identity(301, {"k8s:app": "web"}))
    listed = custom.list_cluster_custom_object("cilium.io", "v2", "ciliumidentities")
    rv = listed["metadata"]["resourceVersion"]
    custom.delete_cluster_custom_object("cilium.io", "v2", "ciliumidentities", "301")
    with pytest.raises(ApiException) as e:
        custom.delete_cluster_custom_object("cilium.io", "v2", "ciliumidentities", "301")
    assert e.value.status == 404
    resp = custom.list_cluster_custom_object(
        "cilium.io", "v2", "ciliumidentities", watch=True, resource_version="0",
        timeout_seconds=1, _preload_content=False,
    )
    assert resp.read() == b""  # nothing left: no synthetic ADDED
    resp = custom.list_cluster_custom_object(
        "cilium.io", "v2", "ciliumidentities", watch=True, resource_version=rv,
        timeout_seconds=1, _preload_content=False,
    )
    events = [json.loads(line) for line in resp.read().splitlines() if line.strip()]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("DELETED", "301")]
    assert {r.verb for r in apiserver.requests if r.resource == "ciliumidentities"} == {
        "create", "list", "delete", "watch"
    }


def test_deleting_a_pod_deletes_the_endpoints_it_owns(
    apiserver: FakeAPIServer, custom: kubernetes.client.CustomObjectsApi, kubeconfig: str
) -> None:
    p = apiserver.upsert(pod("web", "node-a", "10.0.0.5", 8080, ns="shop"))
    uid = p["metadata"]["uid"]
    custom.create_namespaced_custom_object(
        "cilium.io", "v2", "shop", "ciliumendpoints", cep("web", "shop", "10.0.0.5", uid)
    )
    custom.create_namespaced_custom_object(
        "cilium.io", "v2", "shop", "ciliumendpoints", cep("other", "shop", "10.0.0.6", "x")
    )
    # Through the API...
    cfg = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(
        config_file=kubeconfig, client_configuration=cfg, persist_config=False
    )
    with kubernetes.client.ApiClient(cfg) as client:
        kubernetes.client.CoreV1Api(client).delete_namespaced_pod("web", "shop")
    assert [o["metadata"]["name"] for o in apiserver.objects("CiliumEndpoint")] == ["other"]
    # ... and through the test helper.
    p2 = apiserver.upsert(pod("db", "node-a", "10.0.0.7", 8081, ns="shop"))
    custom.create_namespaced_custom_object(
        "cilium.io", "v2", "shop", "ciliumendpoints",
        cep("db", "shop", "10.0.0.7", p2["metadata"]["uid"]),
    )
    apiserver.delete("Pod", "shop", "db")
    assert [o["metadata"]["name"] for o in apiserver.objects("CiliumEndpoint")] == ["other"]


def test_bad_bodies_are_refused(
    apiserver: FakeAPIServer, custom: kubernetes.client.CustomObjectsApi
) -> None:
    with pytest.raises(ApiException) as e:
        _create_identity(custom, {"kind": "CiliumIdentity", "metadata": {}})
    assert e.value.status == 422
    with pytest.raises(ApiException) as e:
        _create_identity(custom, {"kind": "Pod", "metadata": {"name": "1"}})
    assert e.value.status == 400
    assert apiserver.objects("CiliumIdentity") == []


@needs_kubectl
def test_kubectl_lists_what_was_written(
    apiserver: FakeAPIServer,
    custom: kubernetes.client.CustomObjectsApi,
    kubeconfig: str,
    tmp_path: Path,
) -> None:
    _create_identity(custom, identity(302, {"k8s:app": "web"}))
    custom.create_namespaced_custom_object(
        "cilium.io", "v2", "shop", "ciliumendpoints", cep("web", "shop", "10.0.0.5")
    )

    def kubectl(*args: str) -> Any:
        out = subprocess.run(
            _kubectl(kubeconfig, tmp_path, "get", *args, "-o", "json"),
            capture_output=True, text=True, timeout=60, env=_env(tmp_path),
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["items"]

    ids = kubectl("ciliumidentities")
    assert [(i["metadata"]["name"], i["security-labels"]) for i in ids] == [
        ("302", {"k8s:app": "web"})
    ]
    ceps = kubectl("ciliumendpoints", "-A")
    assert [(c["metadata"]["namespace"], c["metadata"]["name"]) for c in ceps] == [("shop", "web")]
    assert kubectl("cep", "-n", "shop")[0]["status"]["networking"]["node"] == "192.0.2.1"
