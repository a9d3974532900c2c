"""deploy/: every manifest parses with the kubernetes client's models (and loses no field
on the way, so a misspelt field fails), the ConfigMap is a valid agent configuration that
enables the Kubernetes source, and the ClusterRole allows what the agent does and no more."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml

from statewright.agent.components.kubernetes import KubernetesComponent, KubernetesConfig
from statewright.agent.config import load

from .fake_apiserver import RequestRecord
from .rbac import DEPLOY, allows, cluster_role_rules

MANIFESTS = sorted(p for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")


def _docs() -> list[tuple[str, dict[str, Any]]]:
    return [
        (p.name, doc)
        for p in MANIFESTS
        for doc in yaml.safe_load_all(p.read_text())
        if doc is not None
    ]


def _model_name(doc: dict[str, Any]) -> str:
    version = doc["apiVersion"].split("/")[-1]
    return f"{version[0].upper()}{version[1:]}{doc['kind']}"


@pytest.mark.parametrize("name,doc", _docs(), ids=lambda x: x if isinstance(x, str) else "")
def test_manifest_parses_with_the_client_models(name: str, doc: dict[str, Any]) -> None:
    api = kubernetes.client.ApiClient()
    model = api.deserialize(json.dumps(doc), _model_name(doc), "application/json")
    assert type(model).__name__ == _model_name(doc)
    # A field the model does not know would be dropped: the round trip must be exact.
    assert api.sanitize_for_serialization(model) == doc, name


def test_every_manifest_is_listed_in_the_kustomization() -> None:
    kust = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert sorted(kust["resources"]) == [p.name for p in MANIFESTS]


def test_daemonset_essentials() -> None:
    ds = yaml.safe_load((DEPLOY / "daemonset.yaml").read_text())
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["serviceAccountName"] == "statewright"
    (agent,) = pod["containers"]
    env = {e["name"]: e for e in agent["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "BPF" in agent["securityContext"]["capabilities"]["add"]
    mounts = {m["mountPath"] for m in agent["volumeMounts"]}
    assert {"/sys/fs/bpf", "/etc/statewright", "/run/statewright/cgroupv2"} <= mounts
    assert "statewright status" in " ".join(agent["livenessProbe"]["exec"]["command"])
    assert agent["readinessProbe"]["exec"]["command"] == ["statewright", "status"]


def test_configmap_is_an_agent_config_enabling_kubernetes(tmp_path: Path) -> None:
    cm = yaml.safe_load((DEPLOY / "configmap.yaml").read_text())
    path = tmp_path / "config.yaml"
    path.write_text(cm["data"]["config.yaml"])
    config = load(str(path))
    assert config.k8s_in_cluster and config.manifests == ()
    assert KubernetesComponent(KubernetesConfig.from_agent_config(config)).enabled
    # No pod-cidrs: the endpoints' IPAM takes the Node's spec.podCIDRs.
    assert config.pod_cidrs_from_node
    # The kernel settings go under the host's /proc/sys/net, mounted read-write by the
    # DaemonSet (the container's own is read-only), their originals to a host directory.
    ds = yaml.safe_load((DEPLOY / "daemonset.yaml").read_text())
    pod = ds["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    net = mounts[f"{config.procfs}/sys/net"]
    assert not net.get("readOnly") and volumes[net["name"]]["hostPath"]["path"] == "/proc/sys/net"
    assert "sysctl: false" not in cm["data"]["config.yaml"]
    assert config.state_dir.startswith(mounts["/var/run/statewright"]["mountPath"])


def test_cluster_role_is_least_rights() -> None:
    rules = cluster_role_rules()
    granted = {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert granted == {
        (g, r, v)
        for g, r in [
            ("", "services"),
            ("", "pods"),
            ("", "nodes"),
            ("", "namespaces"),
            ("discovery.k8s.io", "endpointslices"),
            ("networking.k8s.io", "networkpolicies"),
            ("cilium.io", "ciliumnetworkpolicies"),
        ]
        for v in ("list", "watch")
    } | {
        ("cilium.io", r, v)
        for r in ("ciliumidentities", "ciliumendpoints")
        for v in ("list", "watch", "create", "update", "delete")
    }
    # The checker itself: a get or another resource is refused.
    assert not allows(
        rules, RequestRecord("GET", "/api/v1/secrets", {}, verb="list", resource="secrets")
    )
    assert not allows(rules, RequestRecord("GET", "/api", {}))


def test_operator_role_is_least_rights_and_its_deployment_one_replica() -> None:
    rules = cluster_role_rules("operator-clusterrole.yaml")
    granted = {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert granted == {
        ("cilium.io", "ciliumidentities", "list"),
        ("cilium.io", "ciliumidentities", "watch"),
        ("cilium.io", "ciliumidentities", "delete"),
        ("cilium.io", "ciliumendpoints", "list"),
        ("cilium.io", "ciliumendpoints", "watch"),
    }
    dep = yaml.safe_load((DEPLOY / "operator-deployment.yaml").read_text())
    assert dep["spec"]["replicas"] == 1
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "statewright-operator"
    assert pod["containers"][0]["command"][:3] == ["statewright", "operator", "--in-cluster"]


def test_crds_name_the_kinds_the_agents_write() -> None:
    crds = {
        doc["spec"]["names"]["kind"]: doc
        for p in DEPLOY.glob("crd-*.yaml")
        for doc in [yaml.safe_load(p.read_text())]
    }
    assert set(crds) == {"CiliumIdentity", "CiliumEndpoint"}
    assert crds["CiliumIdentity"]["spec"]["scope"] == "Cluster"
    assert crds["CiliumEndpoint"]["spec"]["scope"] == "Namespaced"
    schema = crds["CiliumEndpoint"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    status = schema["properties"]["status"]["properties"]
    assert set(status) >= {"id", "identity", "networking", "state"}
    ident = crds["CiliumIdentity"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert "security-labels" in ident["properties"]
