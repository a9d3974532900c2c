"""The NetworkPolicy truth-table model of Kubernetes' e2e tests (test/e2e/network/netpol),
written again for this project: namespaces x, y and z, pods a, b and c in each, every
ordered pair of distinct pods probed on ports 80 and 81 over TCP and UDP.

* Namespaces are labelled ``ns=<name>`` (and ``kubernetes.io/metadata.name``); ``y`` also
  ``env=prod``, so that ``Exists`` and ``DoesNotExist`` have something to tell apart.
* Pods are labelled ``pod=<name>`` and serve ports 80 and 81 over TCP and UDP, named as
  upstream names them: ``serve-80-tcp``, ``serve-81-tcp``, ``serve-80-udp``,
  ``serve-81-udp``.
* `Expect` is an expected matrix, built by hand for each case from the NetworkPolicy
  specification (`CASES`); `compare` checks a matrix of observed verdicts against it and
  prints both as upstream does (one grid per port and protocol, ``.`` allowed, ``X``
  denied, ``*`` where they differ).

A pod's traffic to itself is not probed (upstream allows it always; a pod's own address
is outside what policy decides here). The same cases run against the control plane
(tests/policy/test_netpol_matrix.py) and the datapath (tests/e2e/test_netpol_matrix.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

NAMESPACES = ("x", "y", "z")
PODS = ("a", "b", "c")
PORTS = (80, 81)
PROTOCOLS = ("TCP", "UDP")
NAMESPACE_LABELS: dict[str, dict[str, str]] = {
    "x": {"ns": "x"},
    "y": {"ns": "y", "env": "prod"},
    "z": {"ns": "z"},
}
ALL_PODS = tuple(f"{ns}/{p}" for ns in NAMESPACES for p in PODS)

#: (source pod, destination pod, port, protocol)
Cell = tuple[str, str, int, str]


def pod_labels(pod: str) -> dict[str, str]:
    """The labels of pod ``ns/name``."""
    return {"pod": pod.split("/")[1]}


def named_ports() -> list[dict[str, Any]]:
    """Every pod's container ports, as a Pod lists them."""
    return [
        {"name": f"serve-{port}-{proto.lower()}", "containerPort": port, "protocol": proto}
        for port in PORTS
        for proto in PROTOCOLS
    ]


def cells() -> list[Cell]:
    """Every probe: ordered pairs of distinct pods, each port and protocol."""
    return [
        (src, dst, port, proto)
        for src in ALL_PODS
        for dst in ALL_PODS
        if src != dst
        for port in PORTS
        for proto in PROTOCOLS
    ]


Pods = Iterable[str] | None


def pods(ns: str | None = None, pod: str | None = None) -> list[str]:
    """The pods of a namespace and/or with a name (None: any)."""
    return [p for p in ALL_PODS
            if (ns is None or p.startswith(ns + "/")) and (pod is None or p.endswith("/" + pod))]


@dataclass
class Expect:
    """An expected matrix: every cell ``default``, then `set` calls in order."""

    default: bool = True
    cells: dict[Cell, bool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.cells = {c: self.default for c in cells()}

    def set(
        self,
        allowed: bool,
        *,
        src: Pods = None,
        dst: Pods = None,
        ports: Iterable[int] = PORTS,
        protos: Iterable[str] = PROTOCOLS,
    ) -> Expect:
        """Cells from ``src`` to ``dst`` (None: every pod) on ``ports``/``protos``."""
        srcs = set(ALL_PODS if src is None else src)
        dsts = set(ALL_PODS if dst is None else dst)
        ports, protos = set(ports), set(protos)
        for c in self.cells:
            if c[0] in srcs and c[1] in dsts and c[2] in ports and c[3] in protos:
                self.cells[c] = allowed
        return self


def render(got: dict[Cell, bool], want: dict[Cell, bool] | None = None) -> str:
    """One grid per port and protocol: rows sources, columns destinations."""
    out = []
    for port in PORTS:
        for proto in PROTOCOLS:
            out.append(f"{port}/{proto}   " + " ".join(p.replace("/", "") for p in ALL_PODS))
            for src in ALL_PODS:
                row = []
                for dst in ALL_PODS:
                    c = (src, dst, port, proto)
                    if c not in got:
                        row.append(" - ")
                        continue
                    mark = "." if got[c] else "X"
                    if want is not None and want.get(c) != got[c]:
                        mark = "*"
                    row.append(f" {mark} ")
                out.append(f"{src.replace('/', ''):>9} " + "".join(row))
    return "\n".join(out)


def compare(name: str, got: dict[Cell, bool], want: Expect) -> None:
    """AssertionError with both matrices when ``got`` differs from ``want``."""
    wrong = sorted(c for c in want.cells if got.get(c) != want.cells[c])
    if wrong:
        raise AssertionError(
            f"{name}: {len(wrong)} of {len(want.cells)} probes differ, e.g. {wrong[:4]} "
            f"(want {[want.cells[c] for c in wrong[:4]]})\nexpected:\n"
            f"{render(want.cells)}\nobserved (* differs):\n{render(got, want.cells)}"
        )


# ----- the cases: policies written from the NetworkPolicy specification ----------------------
def netpol(ns: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}


def _expr(key: str, op: str, *values: str) -> dict[str, Any]:
    e: dict[str, Any] = {"key": key, "operator": op}
    if values:
        e["values"] = list(values)
    return e


def _ingress_to_xa(*peers: dict[str, Any], ports: list[dict[str, Any]] | None = None,
                   name: str = "to-xa") -> dict[str, Any]:
    rule: dict[str, Any] = {"from": list(peers)}
    if ports is not None:
        rule["ports"] = ports
    return netpol("x", name, {"podSelector": {"matchLabels": {"pod": "a"}},
                              "policyTypes": ["Ingress"], "ingress": [rule]})


def _only_from(srcs: list[str], dst: str = "x/a") -> Expect:
    return Expect().set(False, dst=[dst]).set(True, src=srcs, dst=[dst])


@dataclass(frozen=True)
class Case:
    """Policies and the matrix the specification says they give."""

    name: str
    policies: list[dict[str, Any]]
    expect: Callable[[], Expect]


CASES: list[Case] = [
    Case("default-deny-ingress", [
        netpol("x", "deny-ingress", {"podSelector": {}, "policyTypes": ["Ingress"]})],
        lambda: Expect().set(False, dst=pods("x"))),
    Case("default-deny-all", [
        netpol("x", "deny-all", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]})],
        lambda: Expect().set(False, src=pods("x")).set(False, dst=pods("x"))),
    Case("podSelector matchLabels", [
        _ingress_to_xa({"podSelector": {"matchLabels": {"pod": "b"}}})],
        lambda: _only_from(["x/b"])),
    Case("namespaceSelector In", [
        _ingress_to_xa({"namespaceSelector": {"matchExpressions": [_expr("ns", "In", "y")]}})],
        lambda: _only_from(pods("y"))),
    Case("namespaceSelector NotIn", [
        _ingress_to_xa({"namespaceSelector": {"matchExpressions": [_expr("ns", "NotIn", "y")]}})],
        lambda: _only_from(pods("x") + pods("z"))),
    Case("namespaceSelector Exists", [
        _ingress_to_xa({"namespaceSelector": {"matchExpressions": [_expr("env", "Exists")]}})],
        lambda: _only_from(pods("y"))),
    Case("namespaceSelector DoesNotExist", [
        _ingress_to_xa({"namespaceSelector": {"matchExpressions": [
            _expr("env", "DoesNotExist")]}})],
        lambda: _only_from(pods("x") + pods("z"))),
    Case("namespaceSelector metadata.name", [
        _ingress_to_xa({"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": "z"}}})],
        lambda: _only_from(pods("z"))),
    Case("namespace and pod selectors together (In)", [
        _ingress_to_xa({"namespaceSelector": {"matchLabels": {"ns": "z"}},
                        "podSelector": {"matchExpressions": [_expr("pod", "In", "a", "b")]}})],
        lambda: _only_from(["z/a", "z/b"])),
    Case("two peers (pod selector; namespace and pod NotIn)", [
        _ingress_to_xa({"podSelector": {"matchLabels": {"pod": "c"}}},
                       {"namespaceSelector": {"matchLabels": {"ns": "y"}},
                        "podSelector": {"matchExpressions": [_expr("pod", "NotIn", "a")]}})],
        lambda: _only_from(["x/c", "y/b", "y/c"])),
    Case("podSelector Exists in every namespace", [
        _ingress_to_xa({"namespaceSelector": {},
                        "podSelector": {"matchExpressions": [_expr("pod", "Exists")]}})],
        lambda: _only_from(list(ALL_PODS))),
    Case("podSelector DoesNotExist", [
        _ingress_to_xa({"namespaceSelector": {},
                        "podSelector": {"matchExpressions": [_expr("pod", "DoesNotExist")]}})],
        lambda: _only_from([])),
    Case("named port ingress", [
        _ingress_to_xa(ports=[{"port": "serve-80-tcp"}])],
        lambda: Expect().set(False, dst=["x/a"]).set(True, dst=["x/a"], ports=[80],
                                                     protos=["TCP"])),
    Case("named port egress (UDP)", [
        netpol("x", "from-xa", {
            "podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"],
            "egress": [{"ports": [{"port": "serve-81-udp", "protocol": "UDP"}]}]})],
        lambda: Expect().set(False, src=["x/a"]).set(True, src=["x/a"], ports=[81],
                                                     protos=["UDP"])),
    Case("named port of another protocol matches nothing", [
        _ingress_to_xa(ports=[{"port": "serve-80-udp"}])],  # protocol TCP by default
        lambda: _only_from([])),
    Case("stacked ingress policies add up", [
        _ingress_to_xa({"namespaceSelector": {"matchLabels": {"ns": "y"}}},
                       ports=[{"port": 80}], name="from-y"),
        _ingress_to_xa({"namespaceSelector": {"matchLabels": {"ns": "z"}}},
                       ports=[{"port": 81}], name="from-z")],
        lambda: Expect().set(False, dst=["x/a"])
        .set(True, src=pods("y"), dst=["x/a"], ports=[80], protos=["TCP"])
        .set(True, src=pods("z"), dst=["x/a"], ports=[81], protos=["TCP"])),
    Case("deny-all stacked with an allow-all for one pod", [
        netpol("x", "deny-ingress", {"podSelector": {}, "policyTypes": ["Ingress"]}),
        netpol("x", "allow-xb", {"podSelector": {"matchLabels": {"pod": "b"}},
                                 "ingress": [{}]})],
        lambda: Expect().set(False, dst=["x/a", "x/c"])),
    Case("ingress and egress together", [
        netpol("x", "xa", {
            "podSelector": {"matchLabels": {"pod": "a"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}],
            "egress": [{"to": [{"podSelector": {"matchLabels": {"pod": "b"}}}],
                        "ports": [{"port": 81, "protocol": "TCP"}]}]})],
        lambda: Expect().set(False, src=["x/a"])
        .set(True, src=["x/a"], dst=["x/b"], ports=[81], protos=["TCP"])
        .set(False, dst=["x/a"]).set(True, src=["x/b"], dst=["x/a"])),
    Case("egress to pod c of every namespace on 80/UDP", [
        netpol("y", "to-c", {
            "podSelector": {}, "policyTypes": ["Egress"],
            "egress": [{"to": [{"namespaceSelector": {},
                                "podSelector": {"matchLabels": {"pod": "c"}}}],
                        "ports": [{"port": 80, "protocol": "UDP"}]}]})],
        lambda: Expect().set(False, src=pods("y"))
        .set(True, src=pods("y"), dst=pods(pod="c"), ports=[80], protos=["UDP"])),
    Case("egress to namespaces NotIn y (the issue's example)", [
        netpol("x", "not-y", {
            "podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"],
            "egress": [{"to": [{"namespaceSelector": {"matchExpressions": [
                _expr("ns", "NotIn", "y")]}}]}]})],
        lambda: Expect().set(False, src=["x/a"], dst=pods("y"))),
]
