"""Checking requests the fake API server logged against the ClusterRole in deploy/."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from .fake_apiserver import RequestRecord

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def cluster_role_rules(name: str = "clusterrole.yaml") -> list[Mapping[str, Any]]:
    """The rules of deploy/clusterrole.yaml (or another ClusterRole file of deploy/)."""
    doc = yaml.safe_load((DEPLOY / name).read_text())
    assert doc["kind"] == "ClusterRole"
    return list(doc["rules"])


def allows(rules: Iterable[Mapping[str, Any]], req: RequestRecord) -> bool:
    """Whether RBAC ``rules`` allow ``req`` (resource requests by group, resource and verb;
    non-resource paths by nonResourceURLs)."""
    for rule in rules:
        if not req.resource:
            if req.path in rule.get("nonResourceURLs", []) and (
                "get" in rule.get("verbs", []) or "*" in rule.get("verbs", [])
            ):
                return True
            continue
        groups = rule.get("apiGroups", [])
        resources = rule.get("resources", [])
        verbs = rule.get("verbs", [])
        if (
            (req.group in groups or "*" in groups)
            and (req.resource in resources or "*" in resources)
            and (req.verb in verbs or "*" in verbs)
        ):
            return True
    return False


def disallowed(
    requests: Iterable[RequestRecord], role: str = "clusterrole.yaml"
) -> list[str]:
    """The requests the deployed ClusterRole would refuse (empty when all are allowed)."""
    rules = cluster_role_rules(role)
    return [f"{r.verb or 'GET'} {r.path}?{r.query}" for r in requests if not allows(rules, r)]
