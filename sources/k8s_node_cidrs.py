"""IPAM's pod CIDRs from this node's Node object (``spec.podCIDRs``).

Issue #12: IPAM takes "the pod CIDRs of this node (configuration, or the Node's
spec.podCIDRs from the Kubernetes source)". `NodePodCIDRs` follows the Node through
`sources.k8s_source.K8sSource.wait_node` and, in one of two modes:

* **from the Node** (no ``pod-cidrs`` configured and the Kubernetes source runs): IPAM
  starts pending and hands out nothing until the Node's initial list has been applied
  and the Node has valid pod CIDRs; then `tables.ipam.IPAM.set_pod_cidrs` gives them to
  it. A later change of the Node's pod CIDRs is taken over for new allocations, while
  existing allocations outside the new CIDRs are kept (their pods still use them),
  logged, and reported in health until they are released. A Node that disappears, or
  whose pod CIDRs become invalid, leaves IPAM with the CIDRs it has (reported).
* **configured** (``pod-cidrs`` given): the configuration wins; the Node's pod CIDRs
  are only compared with it, and a mismatch is logged and reported in health.

IPAM writes its state file (fsync) when it reserves router addresses, so the IPAM calls
run in a worker thread.
"""

from __future__ import annotations

import ipaddress
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import anyio
import anyio.abc

from statedb.errors import StatewrightError
from tables.ipam import IPAM, IPAMRequestError, pod_cidrs_of_node

log = logging.getLogger("statewright.k8s.pod-cidrs")

#: Seconds between attempts when IPAM could not take the Node's pod CIDRs.
RETRY_INTERVAL = 5.0


class NodeSource(Protocol):
    """What `NodePodCIDRs` needs of the Kubernetes source (`K8sSource`)."""

    node_name: str

    async def wait_node(self, after: int = 0) -> tuple[int, Mapping[str, Any] | None]:
        """See `sources.k8s_source.K8sSource.wait_node`."""
        ...


class NodePodCIDRs:
    """Keeps IPAM's pod CIDRs following the Node (see the module docstring)."""

    def __init__(
        self,
        ipam: IPAM,
        source: NodeSource,
        configured: Sequence[str] = (),
        on_change: Callable[[], object] | None = None,
    ) -> None:
        self.ipam = ipam
        self.source = source
        #: The configured pod CIDRs (empty: IPAM takes the Node's).
        self.configured = tuple(configured)
        #: Called (in a worker thread) after IPAM took new CIDRs (router addresses may
        #: have been reserved: the endpoints component rewrites the host entries).
        self.on_change = on_change
        #: The Node's pod CIDRs as last seen (empty: none seen, or none valid).
        self.node_cidrs: tuple[str, ...] = ()
        #: Why the Node's pod CIDRs could not be used ("" when they could).
        self.problem = ""
        #: How many times IPAM took the Node's pod CIDRs.
        self.changes = 0
        #: True while IPAM failed to take them (tried again every `RETRY_INTERVAL`).
        self.failed = False

    @property
    def from_node(self) -> bool:
        """True when IPAM takes its pod CIDRs from the Node (nothing configured)."""
        return not self.configured

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Follow the Node until cancelled."""
        task_status.started()
        generation = 0
        node: Mapping[str, Any] | None = None
        while True:
            # After a failure IPAM could not take (its state file), try again later even
            # if the Node does not change.
            with anyio.move_on_after(RETRY_INTERVAL if self.failed else math.inf):
                generation, node = await self.source.wait_node(generation)
            await anyio.to_thread.run_sync(self.apply, node)

    def apply(self, node: Mapping[str, Any] | None) -> None:
        """Take (or compare with) the pod CIDRs of ``node`` (None: there is no such Node)."""
        name = self.source.node_name
        if node is None:
            self._set_problem(f"the API server has no Node {name!r}")
            self.node_cidrs = ()
            return
        try:
            cidrs = pod_cidrs_of_node(node)
        except IPAMRequestError as e:
            self._set_problem(str(e))
            self.node_cidrs = ()
            return
        # The health problem is set before the CIDRs are published (in `finally`): a reader
        # in another thread that sees the new CIDRs also sees what was concluded of them.
        try:
            if not self.from_node:
                if _same(cidrs, self.configured):
                    self._set_problem("")
                else:
                    self._set_problem(
                        f"configured pod CIDRs {', '.join(self.configured)} differ from Node "
                        f"{name}'s spec.podCIDRs {', '.join(cidrs)}; using the configuration"
                    )
                return
            current = tuple(str(c) for c in self.ipam.config.pod_cidrs)
            if not self.ipam.pending and _same(cidrs, current):
                self._set_problem("")
                return
            try:
                self.ipam.set_pod_cidrs(cidrs)
            except IPAMRequestError as e:  # e.g. two overlapping CIDRs
                self._set_problem(f"Node {name}: spec.podCIDRs {', '.join(cidrs)}: {e}")
                return
            except StatewrightError as e:  # IPAM could not persist: nothing changed
                # The problem first: a reader in another thread that sees ``failed`` also
                # sees why.
                self._set_problem(f"IPAM could not take {', '.join(cidrs)}: {e}")
                self.failed = True
                return
            self.failed = False
            self._set_problem("")
            self.node_cidrs = cidrs
            # Last: a reader that sees the count move sees the health that goes with it.
            self.changes += 1
            if self.on_change is not None:
                self.on_change()
        finally:
            self.node_cidrs = cidrs

    def _set_problem(self, problem: str) -> None:
        if problem and problem != self.problem:
            log.warning("pod CIDRs: %s", problem)
        self.problem = problem

    def health(self) -> tuple[bool, str]:
        """(ok, message): where IPAM's pod CIDRs come from, and what is wrong."""
        name = self.source.node_name
        if not self.from_node:
            where = f"configured: {', '.join(self.configured)}"
            return (not self.problem, self.problem or f"{where} (Node {name} agrees)")
        if self.ipam.pending:
            why = f": {self.problem}" if self.problem else ""
            return (False, f"waiting for Node {name}'s spec.podCIDRs{why}")
        current = ", ".join(str(c) for c in self.ipam.config.pod_cidrs)
        msg = f"from Node {name}'s spec.podCIDRs: {current}"
        ok = not self.problem
        if self.problem:
            msg += f"; {self.problem}"
        kept = self.ipam.outside_pod_cidrs()
        if kept:
            ok = False
            example = ", ".join(f"{a.ip} ({a.owner})" for a in kept[:3])
            msg += (
                f"; {len(kept)} allocation(s) outside them kept until released, e.g. {example}"
            )
        return (ok, msg)


def _same(a: Sequence[str], b: Sequence[str]) -> bool:
    """Equal as sets of networks (order and spelling do not matter)."""
    try:
        return {ipaddress.ip_network(x) for x in a} == {ipaddress.ip_network(x) for x in b}
    except ValueError:
        return False
