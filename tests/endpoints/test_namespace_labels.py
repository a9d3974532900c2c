"""sources/k8s_namespaces.py without an API server: deliveries into the labels, and the
Pod labels the endpoint manager takes."""

from __future__ import annotations

from typing import Any

from sources.k8s_namespaces import NamespaceLabels, pod_identity_labels
from sources.k8s_reflector import Delta


def _ns(name: str, labels: Any) -> dict[str, Any]:
    return {"kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def test_deliveries_keep_each_namespaces_labels() -> None:
    nsl = NamespaceLabels(None)  # type: ignore[arg-type]  # the reflector is not run
    assert nsl.of("web") is None
    assert nsl.apply([Delta("upsert", "web", _ns("web", {"team": "a"}))], synced=True)
    assert nsl.synced and nsl.generation == 1 and nsl.of("web") == {"team": "a"}
    # the same labels again: no change, no new generation
    assert not nsl.apply([Delta("upsert", "web", _ns("web", {"team": "a"}))])
    assert nsl.generation == 1
    assert nsl.apply([Delta("upsert", "web", _ns("web", None))])
    assert nsl.of("web") == {}
    assert nsl.apply([Delta("delete", "web", _ns("web", None))])
    assert nsl.of("web") is None and nsl.generation == 3
    assert not nsl.apply([Delta("delete", "web", _ns("web", None))])


def test_pod_identity_labels_merge_the_namespace_labels() -> None:
    assert pod_identity_labels(None, {"team": "a"}) is None
    assert pod_identity_labels({"app": "x"}, None) == {"app": "x"}
    assert pod_identity_labels({"app": "x"}, {"team": "a"}) == {
        "app": "x",
        "io.cilium.k8s.namespace.labels.team": "a",
    }
