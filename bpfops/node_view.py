"""NodeView: what the LB Ops need to know about the node, and StaticNodeView, a fixed one.

The agent's view reads the node-addresses and frontends tables (``bpfops.adapter.
TablesNodeView``); tests and tools use `StaticNodeView`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from bpfops.model import Addr, IPAddress
from statedb import ReadTxn


class NodeView(Protocol):
    """What the ops need to know about the node (from the node-addresses/frontends tables)."""

    def nodeport_addresses(self, txn: ReadTxn, v6: bool) -> list[IPAddress]:
        """Node addresses NodePort/HostPort frontends of family ``v6`` are expanded over."""
        ...

    def is_local_address(self, txn: ReadTxn, ip: IPAddress) -> bool:
        """Whether ``ip`` is one of the node's addresses (no wildcard entry for it)."""
        ...

    def is_primary_frontend(self, txn: ReadTxn, addr: Addr) -> bool:
        """Whether a non-expansion frontend (LB, ExternalIP...) owns ``addr``."""
        ...

    # Optional: ``backend_referenced(txn, be_addr, other_than) -> bool``, whether another
    # frontend of the snapshot selects the backend (keeps its entry and id alive while
    # that frontend is still to be written).
    # Optional: ``frontend_type(txn, addr) -> str | None``, the type of the frontend the
    # snapshot has at ``addr`` (None: none). A deletion of a frontend whose address the
    # snapshot holds again (replaced by another service's frontend in the same batch)
    # then keeps the address's entries and ids for the update that follows.


class StaticNodeView:
    """A NodeView over a fixed list of NodePort addresses (tests, tools)."""

    def __init__(self, nodeport: Iterable[IPAddress] = (), local: Iterable[IPAddress] = ()):
        self.nodeport = list(nodeport)
        self.local = set(local) | set(self.nodeport)
        self.primary: set[Addr] = set()
        self.referenced: set[Addr] = set()
        #: Frontends "in the snapshot" (address -> type), for `frontend_type`.
        self.present: dict[Addr, str] = {}

    def nodeport_addresses(self, txn: ReadTxn, v6: bool) -> list[IPAddress]:
        """The configured addresses of the family."""
        return [ip for ip in self.nodeport if (ip.version == 6) == v6]

    def is_local_address(self, txn: ReadTxn, ip: IPAddress) -> bool:
        """Membership in the configured local addresses."""
        return ip in self.local

    def is_primary_frontend(self, txn: ReadTxn, addr: Addr) -> bool:
        """Membership in ``primary``."""
        return addr in self.primary

    def backend_referenced(self, txn: ReadTxn, be_addr: Addr, other_than: Addr) -> bool:
        """Membership in ``referenced``."""
        return be_addr in self.referenced

    def frontend_type(self, txn: ReadTxn, addr: Addr) -> str | None:
        """The type recorded in ``present``."""
        return self.present.get(addr)
