"""Port ranges as the policy map's port prefixes.

Cilium's policy map key carries a destination port and a prefix length over its 16 bits
(``port_prefix_len``): 16 is one port, 0 (with port 0) every port. A range
``port``..``end_port`` becomes the smallest set of aligned prefixes covering it exactly,
as CIDR blocks cover an address range.
"""

from __future__ import annotations

from policy.model import PortNames, PortRule, Rule

#: (protocol, port, prefix length) of one policy-map key.
PortKey = tuple[int, int, int]

ANY_PORT_KEY: PortKey = (0, 0, 0)


def range_to_prefixes(lo: int, hi: int) -> list[tuple[int, int]]:
    """(port, prefix length) blocks covering ``lo``..``hi`` exactly, in port order."""
    if not 0 <= lo <= hi <= 0xFFFF:
        raise ValueError(f"port range {lo}-{hi} is not within 0-65535")
    out: list[tuple[int, int]] = []
    while lo <= hi:
        size = lo & -lo if lo else 1 << 16  # largest block aligned at lo
        while size > hi - lo + 1:
            size >>= 1
        out.append((lo, 16 - (size.bit_length() - 1)))
        lo += size
    return out


def port_rule_keys(p: PortRule) -> list[PortKey]:
    """The keys of one port rule (every port of the protocol: port 0, prefix 0)."""
    if p.port == 0:
        return [(p.protocol, 0, 0)]
    return [(p.protocol, port, plen) for port, plen in range_to_prefixes(p.port, p.end_port)]


def rule_port_keys(rule: Rule) -> list[PortKey]:
    """The port keys of a rule's numeric ports: every protocol and port when it names no
    ports (its named ports: `named_port_keys`)."""
    if not rule.ports:
        return [ANY_PORT_KEY]
    out: list[PortKey] = []
    for p in rule.ports:
        if not p.name:
            out.extend(port_rule_keys(p))
    return sorted(set(out))


def named_port_keys(rule: Rule, names: PortNames) -> list[PortKey]:
    """The port keys a rule's named ports resolve to through ``names`` (one port each,
    prefix 16); none for a name ``names`` does not have."""
    out = {
        (p.protocol, port, 16)
        for p in rule.ports
        if p.name
        for port in names.get((p.name, p.protocol), ())
    }
    return sorted(out)


def port_key_matches(key: PortKey, protocol: int, port: int) -> bool:
    """Whether traffic of ``protocol`` to ``port`` falls under a key (the datapath's view)."""
    proto, kport, plen = key
    if proto and proto != protocol:
        return False
    shift = 16 - plen
    return (port >> shift) == (kport >> shift)
