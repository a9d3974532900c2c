"""A pod endpoint's identity labels (issue #16): the request's labels, the namespace label
the agent adds, and the Kubernetes Pod object's labels, which follow the Pod."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import pytest

from statedb import DB
from statewright.cni import CNIError, Invocation
from tables.endpoint_entries import EntryTables
from tables.endpoint_manager import EndpointManager
from tables.endpoints import Endpoint, EndpointChange, EndpointRequestError, EndpointState
from tables.identities import (
    Identity,
    IdentityAllocator,
    LabelError,
    identity_id_index,
    identity_labels_index,
)
from tables.ipam import IPAM, IPAMConfig

CIDRS = ("10.33.0.0/28",)
NS = "k8s:io.kubernetes.pod.namespace"


def _in(namespace: str, *labels: str) -> tuple[str, ...]:
    """The identity labels of a pod of ``namespace`` whose labels are unknown: ``labels``,
    its namespace, its name as a namespace label and the marker saying the rest is
    unknown (tables/identities.py)."""
    return tuple(sorted((
        *labels, f"{NS}={namespace}",
        f"k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name={namespace}",
        "statewright:namespace-labels=unknown",
    )))


class FakePods:
    """What the Kubernetes source answers: labels per ``(namespace, name)``."""

    def __init__(self) -> None:
        self.labels: dict[tuple[str, str], dict[str, str]] = {}

    def __call__(self, namespace: str, name: str) -> dict[str, str] | None:
        return self.labels.get((namespace, name))


@pytest.fixture
def state_dir() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="statewright-podlabels-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _manager(state_dir: str, pods: FakePods | None = None) -> EndpointManager:
    db = DB()
    ipam = IPAM(db, IPAMConfig.parse(CIDRS, state_dir))
    ipam.restore(reserve_router=False)
    ipam.reserve_routers()
    return EndpointManager(
        db, ipam, IdentityAllocator(db), state_dir, entries=EntryTables(), pod_labels_of=pods
    )


def _pod(name: str, namespace: str = "web", labels: list[str] | None = None) -> EndpointChange:
    doc: dict[str, object] = {"k8s-pod-name": name, "k8s-namespace": namespace}
    if labels is not None:
        doc["labels"] = labels
    return EndpointChange.parse(doc)


def _identity_labels(mgr: EndpointManager, ep: Endpoint) -> tuple[str, ...]:
    ident = _identity(mgr, ep.identity)
    assert ident is not None
    return ident.labels


def _identity(mgr: EndpointManager, num: int) -> Identity | None:
    return mgr.identities.table.get(mgr.db.read_txn(), identity_id_index.query(num))


def test_identity_labels_of_an_endpoint() -> None:
    ep = Endpoint(1, pod_name="a", pod_namespace="web", labels=("k8s:app=x", "container:c=1"))
    assert ep.identity_labels() == _in("web", "container:c=1", "k8s:app=x")
    # the Pod object's labels replace request labels of the same key
    ep2 = Endpoint(1, pod_namespace="web", labels=("k8s:app=x",), pod_labels=("k8s:app=y",))
    assert ep2.identity_labels() == _in("web", "k8s:app=y")
    # a request cannot claim another namespace or namespace labels for a pod
    spoof = Endpoint(
        1,
        pod_namespace="web",
        labels=(f"{NS}=kube-system", "k8s:io.cilium.k8s.namespace.labels.team=ops"),
    )
    assert spoof.identity_labels() == _in("web")
    # not a pod: the request's labels as they are
    plain = Endpoint(1, labels=("k8s:app=x", f"{NS}=kube-system"))
    assert plain.identity_labels() == ("k8s:app=x", f"{NS}=kube-system")


def test_model_shows_pod_and_identity_labels_and_requests_cannot_set_them() -> None:
    ep = Endpoint(3, pod_name="a", pod_namespace="web", labels=("k8s:app=x",),
                  pod_labels=("k8s:tier=db",))
    doc = ep.to_json()
    assert doc["k8s-pod-labels"] == ["k8s:tier=db"]
    assert doc["identity-labels"] == list(_in("web", "k8s:app=x", "k8s:tier=db"))
    assert Endpoint.from_json(doc).pod_labels == ("k8s:tier=db",)  # the state file keeps them
    # read-only in requests: accepted and ignored
    assert "pod_labels" not in EndpointChange.parse({"k8s-pod-labels": ["k8s:x=y"]}).fields
    with pytest.raises(EndpointRequestError):
        Endpoint.from_json({**doc, "k8s-pod-labels": [""]})


def test_create_adds_the_namespace_label(state_dir: str) -> None:
    mgr = _manager(state_dir)
    ep = mgr.create("0", _pod("a", labels=["k8s:app=client"]))
    assert _identity_labels(mgr, ep) == _in("web", "k8s:app=client")
    same = mgr.create("0", _pod("b", labels=["k8s:app=client"]))
    other_ns = mgr.create("0", _pod("c", namespace="e2e", labels=["k8s:app=client"]))
    assert same.identity == ep.identity
    assert other_ns.identity != ep.identity
    # the identities table answers by the labels (what the selector cache reads)
    txn = mgr.db.read_txn()
    found = mgr.identities.table.get(txn, identity_labels_index.query(ep.identity_labels()))
    assert found is not None and found.id == ep.identity


def test_create_takes_the_pod_objects_labels(state_dir: str) -> None:
    pods = FakePods()
    pods.labels[("web", "a")] = {"app": "server", "tier": "db"}
    mgr = _manager(state_dir, pods)
    ep = mgr.create("0", _pod("a", labels=["k8s:app=client", "container:x=1"]))
    assert ep.pod_labels == ("k8s:app=server", "k8s:tier=db")
    assert _identity_labels(mgr, ep) == _in("web", "container:x=1", "k8s:app=server", "k8s:tier=db")
    # a Pod the source does not know: request labels only, until it appears
    ep_b = mgr.create("0", _pod("b", labels=["k8s:app=client"]))
    assert ep_b.pod_labels == ()


def test_pod_label_change_moves_the_endpoint_to_another_identity(state_dir: str) -> None:
    pods = FakePods()
    pods.labels[("web", "a")] = {"app": "server"}
    mgr = _manager(state_dir, pods)
    ep = mgr.create("0", _pod("a"))
    ep_b = mgr.create("0", _pod("b"))
    first = ep.identity
    assert mgr.sync_pod_labels() == []  # nothing changed

    pods.labels[("web", "a")] = {"app": "server", "version": "2"}
    pods.labels[("web", "b")] = {"app": "server"}  # appears after its endpoint
    assert sorted(mgr.sync_pod_labels()) == sorted([ep.id, ep_b.id])
    now = mgr.get(str(ep.id))
    assert _identity_labels(mgr, now) == _in("web", "k8s:app=server", "k8s:version=2")
    assert now.identity != first
    assert now.state is EndpointState.REGENERATING  # its ipcache entry carries the identity
    # b took a's old label set: the same identity number may be reused, with refcount 1
    b_now = mgr.get(str(ep_b.id))
    assert _identity_labels(mgr, b_now) == _in("web", "k8s:app=server")
    ident = _identity(mgr, b_now.identity)
    assert ident is not None and ident.refcount == 1

    # a Pod deleted while its endpoint lives on: labels kept (no identity churn)
    del pods.labels[("web", "a")]
    assert mgr.sync_pod_labels() == []
    assert mgr.get(str(ep.id)).identity == now.identity

    # labels that are not strings change nothing (and are logged)
    with pytest.raises(LabelError):
        mgr.set_pod_labels("web", "a", {"app": 1})  # type: ignore[dict-item]
    assert mgr.get(str(ep.id)) == now
    # ... also when they come from the source: that Pod is skipped, the others go on
    pods.labels[("web", "a")] = {"app": 1}  # type: ignore[dict-item]
    pods.labels[("web", "b")] = {"app": "server", "v": "3"}
    assert mgr.sync_pod_labels() == [ep_b.id]
    assert mgr.get(str(ep.id)) == now


def test_restore_keeps_pod_labels_and_identity(state_dir: str) -> None:
    pods = FakePods()
    pods.labels[("web", "a")] = {"app": "server"}
    mgr = _manager(state_dir, pods)
    ep = mgr.create("0", _pod("a"))
    again = _manager(state_dir)  # no Kubernetes source yet after the restart
    result = again.restore(lambda _ep: True)
    assert result.restored == [ep.id]
    back = again.get(str(ep.id))
    assert back.pod_labels == ("k8s:app=server",)
    assert back.identity == ep.identity
    assert _identity_labels(again, back) == _in("web", "k8s:app=server")


def _inv(config: dict[str, object]) -> Invocation:
    return Invocation("ADD", "c1", "/var/run/netns/x", "eth0", {}, config)


def test_cni_passes_args_cni_labels() -> None:
    labels = [{"key": "app", "value": "web"}, {"key": "app.kubernetes.io/part-of", "value": "x"}]
    inv = _inv({"args": {"cni": {"labels": labels}}})
    assert inv.labels == ["k8s:app=web", "k8s:app.kubernetes.io/part-of=x"]
    assert _inv({}).labels == []
    assert _inv({"args": {"other": 1}}).labels == []
    bads: list[object] = [
        "app=web",
        [{"value": "x"}],
        [{"key": "", "value": "x"}],
        [{"key": "a", "value": 1}],
        ["app"],
    ]
    for bad in bads:
        with pytest.raises(CNIError) as exc:
            _ = _inv({"args": {"cni": {"labels": bad}}}).labels
        assert exc.value.code == 7
