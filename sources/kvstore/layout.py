"""Cilium's key layout under ``cilium/state/`` and the values stored there.

* ``identities/v1/id/<id>`` -> the label set's key (``k8s:app=web;k8s:io...=default;``),
  written once by compare-and-swap on its creation, with no lease: the operator deletes
  it when no node references it any more;
* ``identities/v1/value/<labels key>/<node>`` -> the id: one reference per node using the
  identity, under that node's lease (a crashed node's references expire);
* ``ip/v1/<cluster>/<ip>`` -> JSON ``{"IP", "ID", "HostIP", "Key", "K8sNamespace",
  "K8sPodName"}`` (Cilium's IPIdentityPair), under the publishing node's lease;
* ``nodes/v1/<cluster>/<name>`` -> JSON ``{"Name", "Cluster", "IPAddresses": [{"Type",
  "IP"}], "IPv4AllocCIDR", "IPv6AllocCIDR"}`` (CIDRs as text), under the node's lease.

The base (``cilium/state/``) is a parameter so tests sharing one etcd keep apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from tables.identities import Labels

DEFAULT_BASE = "cilium/state/"
DEFAULT_CLUSTER = "default"


def labels_key(labels: Labels) -> str:
    """Cilium's key of a label set: each ``source:key=value`` followed by ``;``, sorted."""
    return "".join(f"{label};" for label in sorted(labels))


def labels_of_key(key: str) -> list[str]:
    """The labels of a `labels_key` (its inverse)."""
    return [part for part in key.split(";") if part]


@dataclass(frozen=True)
class KeyLayout:
    """The keys of one cluster under ``base``."""

    base: str = DEFAULT_BASE
    cluster: str = DEFAULT_CLUSTER

    @property
    def identity_ids(self) -> str:
        return f"{self.base}identities/v1/id/"

    @property
    def identity_values(self) -> str:
        return f"{self.base}identities/v1/value/"

    def identity_id(self, num: int) -> str:
        return f"{self.identity_ids}{num}"

    def identity_ref(self, labels: Labels, node: str) -> str:
        return f"{self.identity_values}{labels_key(labels)}/{node}"

    def split_identity_ref(self, key: str) -> tuple[str, str] | None:
        """(labels key, node) of a reference key, None when it is not one."""
        if not key.startswith(self.identity_values):
            return None
        rest = key[len(self.identity_values):]
        labels, sep, node = rest.rpartition("/")
        return (labels, node) if sep and labels and node else None

    @property
    def ips(self) -> str:
        return f"{self.base}ip/v1/{self.cluster}/"

    def ip(self, addr: str) -> str:
        return f"{self.ips}{addr}"

    @property
    def nodes(self) -> str:
        return f"{self.base}nodes/v1/{self.cluster}/"

    def node(self, name: str) -> str:
        return f"{self.nodes}{name}"
