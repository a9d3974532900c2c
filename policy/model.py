"""The policy model: what NetworkPolicy and CiliumNetworkPolicy objects say, normalised.

A `Policy` (one Kubernetes object) is a list of `Rule`s. A rule:

* selects its subjects, the local endpoints it applies to (``subject``, a `Selector`
  over identity labels, already restricted to the policy's namespace);
* has a direction (``egress``) and an action (``deny``: Cilium's ``ingressDeny`` /
  ``egressDeny``; allow otherwise);
* names its peers: ``None`` for any identity (the wildcard, identity 0), else a tuple of
  selectors (each selecting identities; an empty tuple selects nothing);
* names its ports: a tuple of `PortRule` (protocol, first and last port, or a port
  name), empty for every protocol and port.

A named port (``port: http``) is a container port's name. It resolves to the port
numbers that name has (`PortNames`): in an egress rule, on the peer (the ports of that
name of the pods with the peer's identity, also when the rule allows any peer); in an
ingress rule, on the endpoint itself. A name nothing has matches nothing (addresses
outside the cluster have no named ports).

A direction is enforced for an endpoint as soon as one rule of that direction selects it
(Cilium's default deny for selected endpoints); then traffic is allowed when an allow rule
matches and no deny rule does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from policy.selector import Selector

PROTO_TCP = 6
PROTO_UDP = 17
PROTO_SCTP = 132
PROTOCOLS = {"TCP": PROTO_TCP, "UDP": PROTO_UDP, "SCTP": PROTO_SCTP}
PROTOCOL_NAMES = {v: k for k, v in PROTOCOLS.items()}

#: Named ports: (port name, protocol) -> the port numbers it names.
PortNames = Mapping[tuple[str, int], frozenset[int]]
NO_PORT_NAMES: PortNames = MappingProxyType({})


@dataclass(frozen=True, slots=True, order=True)
class PortRule:
    """Traffic of ``protocol`` to ports ``port``..``end_port`` (both 0: every port), or
    to the port named ``name`` (then ``port`` and ``end_port`` are 0)."""

    protocol: int
    port: int = 0
    end_port: int = 0
    name: str = ""

    def matches(self, protocol: int, port: int, names: PortNames = NO_PORT_NAMES) -> bool:
        """Whether traffic of ``protocol`` to ``port`` is covered (a named port: when
        ``names`` gives it that number)."""
        if protocol != self.protocol:
            return False
        if self.name:
            return port in names.get((self.name, protocol), ())
        if self.port == 0:
            return True
        return self.port <= port <= self.end_port

    def text(self) -> str:
        """``80/TCP``, ``8000-8080/TCP``, ``any/UDP``, ``http/TCP``."""
        proto = PROTOCOL_NAMES.get(self.protocol, str(self.protocol))
        if self.name:
            return f"{self.name}/{proto}"
        if self.port == 0:
            return f"any/{proto}"
        if self.end_port != self.port:
            return f"{self.port}-{self.end_port}/{proto}"
        return f"{self.port}/{proto}"


@dataclass(frozen=True, slots=True)
class Rule:
    """One normalised rule (see the module doc)."""

    policy: str  # "namespace/name" of the policy object
    subject: Selector
    egress: bool
    deny: bool
    peers: tuple[Selector, ...] | None
    ports: tuple[PortRule, ...]

    def port_matches(self, protocol: int, port: int, names: PortNames = NO_PORT_NAMES) -> bool:
        """Whether the rule's ports cover the traffic (no ports: everything); a named
        port resolves through ``names``."""
        return not self.ports or any(p.matches(protocol, port, names) for p in self.ports)

    @property
    def named(self) -> bool:
        """Whether a port of the rule is named (its entries depend on the pods' ports)."""
        return any(p.name for p in self.ports)

    def to_json(self) -> dict[str, Any]:
        """JSON form (``policy get``)."""
        return {
            "policy": self.policy,
            "subject": self.subject.text(),
            "direction": "egress" if self.egress else "ingress",
            "action": "deny" if self.deny else "allow",
            "peers": None if self.peers is None else [p.text() for p in self.peers],
            "ports": [p.text() for p in self.ports],
        }


@dataclass(frozen=True, slots=True)
class Policy:
    """One policy object: its kind, ``namespace/name`` and rules."""

    kind: str
    name: str
    rules: tuple[Rule, ...]
    #: Where the object came from (``k8s``, ``manifests``) and which revision of it: the
    #: API server's resourceVersion, or a digest of a manifest object's content. Not part
    #: of equality: a new revision with the same rules changes no entry.
    source: str = field(default="", compare=False)
    source_revision: str = field(default="", compare=False)

    @property
    def key(self) -> str:
        """``Kind/namespace/name``: unique among all policy objects."""
        return f"{self.kind}/{self.name}"

    def selectors(self) -> set[Selector]:
        """Every selector the rules use (subjects and peers)."""
        out: set[Selector] = set()
        for r in self.rules:
            out.add(r.subject)
            if r.peers:
                out.update(r.peers)
        return out

    def to_json(self) -> dict[str, Any]:
        """JSON form (``policy get``)."""
        return {
            "kind": self.kind,
            "name": self.name,
            "source": self.source,
            "source-revision": self.source_revision,
            "rules": [r.to_json() for r in self.rules],
        }

    @staticmethod
    def table_header() -> list[str]:
        """Columns of ``db show policies``."""
        return ["Kind", "Name", "Rules"]

    def table_row(self) -> list[str]:
        """Cells of ``db show policies``."""
        return [self.kind, self.name, str(len(self.rules))]
