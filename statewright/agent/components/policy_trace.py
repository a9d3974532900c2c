"""``policy trace`` by pod or endpoint: the two sides of a trace as the agent knows them.

A side is given by labels (``from``/``to``, see statewright/agent/components/policy.py), by
a pod (``from-pod``/``to-pod``: ``NAMESPACE/NAME``) or by an endpoint id
(``from-endpoint``/``to-endpoint``). A pod or endpoint is one of this node's endpoints:
the trace then uses its identity's real labels and its named ports (for the rules' named
ports), and says whether this node's datapath enforces each direction:

* egress of the source: the socket program, when the source is a local endpoint whose
  network namespace the agent identified (its netns cookie) and the policy maps exist;
* ingress of the destination: the tc program on the pod's veth (the ``endpoint-datapath``
  component), when the destination is a local endpoint and that component is healthy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from policy.errors import PolicyTraceError
from policy.model import PortNames
from tables.endpoints import Endpoint


@dataclass(frozen=True)
class TraceSide:
    """One side of a trace: its labels, named ports and, for an endpoint, the endpoint."""

    labels: tuple[str, ...]
    ports: PortNames = field(default_factory=dict)
    endpoint: Endpoint | None = None

    def describe(self) -> dict[str, Any] | None:
        """The endpoint's id, pod and identity (None for labels)."""
        ep = self.endpoint
        if ep is None:
            return None
        pod = f"{ep.pod_namespace}/{ep.pod_name}" if ep.pod_name else ""
        return {"id": ep.id, "pod": pod, "identity": ep.identity}


def endpoint_side(manager: Any, ref: str, what: str) -> TraceSide:
    """The side of the local endpoint ``ref`` (``NAMESPACE/NAME`` of a pod, or an id);
    PolicyTraceError when there is no such endpoint."""
    key = f"pod-name:{ref}" if "/" in ref else ref
    try:
        ep = manager.resolve(key)
    except ValueError as e:
        raise PolicyTraceError(str(e), obj="policy trace", field=what) from None
    if ep is None:
        raise PolicyTraceError(f"{ref}: no such endpoint on this node", obj="policy trace",
                               field=what)
    return TraceSide(ep.identity_labels(), ep.port_names(), ep)


def datapath_notes(
    src: TraceSide, dst: TraceSide, egress_maps: bool, ingress_datapath: str | None
) -> tuple[str, str]:
    """Whether this node's datapath enforces the source's egress and the destination's
    ingress (``ingress_datapath``: None when the tc programs run, else why not)."""
    if src.endpoint is None:
        egress = "not enforced by this node: the source is not one of its endpoints"
    elif not src.endpoint.netns_cookie:
        egress = "not enforced by this node: the source's network namespace is not identified"
    elif not egress_maps:
        egress = "not enforced by this node: no policy maps"
    else:
        egress = "enforced by this node (socket program)"
    if dst.endpoint is None:
        ingress = "not enforced by this node: the destination is not one of its endpoints"
    elif ingress_datapath is not None:
        ingress = f"not enforced by this node: {ingress_datapath}"
    else:
        ingress = "enforced by this node (tc program on the pod's veth)"
    return egress, ingress
