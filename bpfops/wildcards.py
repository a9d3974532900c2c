"""WildcardEntries: the ``<vip>:0/ANY`` entries (service id 0) of ClusterIP and LoadBalancer
VIPs in the services map, which make the datapath drop traffic to a VIP's ports that no
frontend serves.

One entry per VIP (address and scope), shared by the VIP's frontends: ``refs`` holds the
ids of the frontends referencing each (one id, or a set of them), under the VIP's key
(`vip_key`: 17 bytes read from the frontend address, no ``ipaddress`` object per VIP).
The first reference writes the entry (or finds it written by the round's batch), the
last one gone deletes it. A VIP gets none when wildcard entries are disabled, when it is
one of the node's own addresses, or when its load-balancer class is not one this agent
manages.
"""

from __future__ import annotations

from bpf import lb
from bpfops import flags as svcflags
from bpfops.frontend_state import FrontendState, IsLocal, PendingFrontend, ref_ids
from bpfops.lb_maps import LBMaps, delete_quiet
from bpfops.model import CLUSTER_IP, LOAD_BALANCER, Addr, FrontendSpec, LBOpsConfig

#: A VIP's key in ``WildcardEntries.refs``: the address' 16 key bytes (IPv4 mapped)
#: and its scope.
VipKey = bytes


def vip_key(addr: Addr) -> VipKey:
    """The key of ``addr``'s VIP (address and scope; any port and protocol)."""
    return addr[:16] + addr[19:20]


#: The 16 key bytes of 0.0.0.0 (IPv4 mapped) and of ::: the unspecified VIPs.
_UNSPECIFIED4 = bytes(10) + b"\xff\xff" + bytes(4)
_UNSPECIFIED6 = bytes(16)
#: Each byte value as a bytes object.
_BYTE = tuple(bytes((i,)) for i in range(256))
#: What follows the IP in a wildcard entry's key, by scope: port, slot and protocol 0,
#: the scope, two bytes of padding.
_KEY_TAILS = tuple(bytes(5) + bytes((i,)) + bytes(2) for i in range(256))

#: `entry_value` by frontend type.
_VALUES: dict[str, bytes] = {}


def entry_value(fe_type: str) -> bytes:
    """The encoded value of a wildcard entry for a VIP of frontend type ``fe_type``: no
    backends, id 0, the type's flags."""
    value = _VALUES.get(fe_type)
    if value is None:
        f1, f2 = svcflags.split(svcflags.service_flags(svcflags.FlagParams(fe_type)))
        value = _VALUES[fe_type] = lb.SERVICE_VALUE_STRUCT.pack(0, 0, 0, f1, f2, 0)
    return value


class WildcardEntries:
    """The wildcard entries of the VIPs and the frontends referencing each (see the module
    doc); every method keeps the map and ``refs`` in step."""

    def __init__(self, maps: LBMaps, config: LBOpsConfig) -> None:
        self.maps = maps
        self.config = config
        self.refs: dict[VipKey, int | set[int]] = {}

    def applies(self, fe: FrontendSpec) -> bool:
        """Whether the frontend's type and load-balancer class have a wildcard entry."""
        if fe.type not in (CLUSTER_IP, LOAD_BALANCER) or fe.addr.is_unspecified:
            return False
        cls = fe.service.load_balancer_class
        if cls is None:
            return self.config.default_lb_class_is_lbipam
        return cls in self.config.managed_lb_classes

    def new_entry(self, p: PendingFrontend) -> tuple[VipKey, bytes, bytes] | None:
        """The entry (refs key, map key, value) `sync` would create for the frontend, when
        its VIP has none yet; else None. (`applies` and `vip_key` inline: one slice of
        the address serves the unspecified test, the refs key and the map key.)"""
        fe = p.fe
        cfg = self.config
        fe_type = fe.type
        if not cfg.wildcard_entries or fe_type not in (CLUSTER_IP, LOAD_BALANCER):
            return None
        addr = fe.addr
        ip = addr[:16]
        v4 = addr[20] == 4
        if ip == (_UNSPECIFIED4 if v4 else _UNSPECIFIED6):
            return None
        cls = fe.service.load_balancer_class
        if not (cfg.default_lb_class_is_lbipam if cls is None else cls in cfg.managed_lb_classes):
            return None
        scope = addr[19]
        ref_key = ip + _BYTE[scope]  # vip_key
        # The VIP's entry exists (the usual case of an update): no need to ask whether
        # the address is the node's (a table lookup).
        if self.refs.get(ref_key) is not None:
            return None
        if p.is_local is not None and p.is_local(addr):
            return None
        # The key: the IP (network order), port, slot and protocol 0, the scope, padding
        # (SERVICE4_KEY_STRUCT / SERVICE6_KEY_STRUCT).
        key = (ip[12:] if v4 else ip) + _KEY_TAILS[scope]
        value = _VALUES.get(fe_type)
        return ref_key, key, value if value is not None else entry_value(fe_type)

    def written(self, fe: FrontendSpec, key: VipKey, state: FrontendState) -> None:
        """The round's batch wrote the entry `new_entry` gave (refs key ``key``) for the
        VIP of a frontend whose master it wrote: reference it (as `sync` would)."""
        if self.refs.get(key) is None:
            self.refs[key] = state.id
            state.wildcard = key
        else:
            self.upsert(fe, state, True)

    def sync(
        self,
        fe: FrontendSpec,
        state: FrontendState,
        is_local: IsLocal | None,
        written: bool = False,
    ) -> None:
        """Reference the VIP's entry for a frontend whose master was written, or drop the
        frontend's reference when it no longer has one (``written``: the round's batch
        wrote the entry)."""
        if self.applies(fe):
            if self.config.wildcard_entries and (is_local is None or not is_local(fe.addr)):
                self.upsert(fe, state, written)
            else:
                self.delete(fe.addr, state)
        elif state.wildcard is not None:
            # The address' type or load-balancer class no longer has a wildcard entry
            # (e.g. another service's frontend of another type took the address over).
            self.delete(fe.addr, state)

    def upsert(self, fe: FrontendSpec, state: FrontendState, written: bool = False) -> None:
        """Reference the VIP's wildcard entry, writing it with the first reference (unless
        ``written``: the round's batch wrote it)."""
        key = vip_key(fe.addr)
        if state.wildcard == key:
            key = state.wildcard  # the object the refs hold already
        refs = self.refs.get(key)
        if refs is not None and (
            state.id in refs if isinstance(refs, set) else refs == state.id
        ):
            return
        if refs is None and not written:
            cls = lb.Service6Key if fe.addr.is_v6 else lb.Service4Key
            f1, f2 = svcflags.split(svcflags.service_flags(svcflags.FlagParams(fe.type)))
            self.maps.services(fe.addr.is_v6).update(
                cls(fe.addr.packed, 0, 0, 0, fe.addr.scope), lb.ServiceValue(0, 0, 0, f1, f2, 0)
            )
        if refs is None:
            self.refs[key] = state.id
        elif isinstance(refs, int):
            self.refs[key] = {refs, state.id}
        else:
            refs.add(state.id)
        state.wildcard = key

    def delete(self, addr: Addr, state: FrontendState) -> None:
        """Drop the frontend's reference; the last one deletes the entry."""
        key = state.wildcard
        if key is None:
            return
        others = ref_ids(self.refs.get(key)) - {state.id}
        if others:
            self.refs[key] = others if len(others) > 1 else next(iter(others))
            state.wildcard = None
            return
        cls = lb.Service6Key if addr.is_v6 else lb.Service4Key
        packed = key[12:16] if not addr.is_v6 else key[:16]
        wkey = cls(packed, 0, 0, 0, key[16])
        delete_quiet(self.maps.services(addr.is_v6), wkey)
        self.refs.pop(key, None)
        state.wildcard = None
