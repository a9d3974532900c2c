"""Kubernetes objects for the tests, as an API server holds them."""

from __future__ import annotations

from typing import Any

SERVICE_NAME_LABEL = "kubernetes.io/service-name"


def service(name: str, ip: str, *, ns: str = "default", port: int = 80) -> dict[str, Any]:
    """A ClusterIP Service with one TCP port."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": ip,
            "clusterIPs": [ip],
            "ports": [{"name": "http", "port": port, "protocol": "TCP", "targetPort": 8080}],
        },
    }


def endpoint_slice(
    service_name: str, addresses: list[str], *, ns: str = "default", suffix: str = "abcde"
) -> dict[str, Any]:
    """The EndpointSlice of ``service_name`` with ready endpoints on port 8080."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{service_name}-{suffix}",
            "namespace": ns,
            "labels": {SERVICE_NAME_LABEL: service_name},
        },
        "addressType": "IPv4",
        "endpoints": [
            {"addresses": [a], "conditions": {"ready": True, "serving": True}} for a in addresses
        ],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }


def pod(name: str, node: str, ip: str, host_port: int, *, ns: str = "default") -> dict[str, Any]:
    """A running Pod on ``node`` with one container port exposed as ``host_port``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}"},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "c",
                    "ports": [{"containerPort": 8080, "hostPort": host_port, "protocol": "TCP"}],
                }
            ],
        },
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
    }


def node(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Node with ``labels``."""
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}}}
