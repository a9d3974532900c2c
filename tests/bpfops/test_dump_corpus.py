"""The dump format against every map expectation of the corpus: parse each expected
line back into map entries, write them, dump, and compare byte for byte.

The corpus is read at test time (``STATEWRIGHT_LB_CORPUS`` or
``../shared/conformance/cilium-lb``); the test skips when it is absent.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Any

import pytest

from bpf import lb
from bpfops import flags as F
from bpfops.lb_maps import LBMaps
from bpfops.maglev import slot_counts
from bpfops.maps_dump import LB_ALG_NUMBERS, LB_ALG_SHIFT, dump_text
from bpfops.model import PROTO_NUMBERS, STATE_NUMBERS

CORPUS = Path(
    os.environ.get(
        "STATEWRIGHT_LB_CORPUS",
        str(Path(__file__).resolve().parents[3] / "shared" / "conformance" / "cilium-lb"),
    )
)
PREFIXES = ("SVC: ", "BE: ", "REV: ", "AFF: ", "MAGLEV: ", "SRCRANGE: ")
TABLE_SIZE = 1021

TYPE_BITS = {
    "ClusterIP": 0,
    "NodePort": F.NODE_PORT_FLAG,
    "ExternalIPs": F.EXTERNAL_IPS_FLAG,
    "HostPort": F.HOST_PORT_FLAG,
    "LoadBalancer": F.LOAD_BALANCER_FLAG,
    "LocalRedirect": F.LOCAL_REDIRECT_FLAG,
}
NAME_BITS = {
    "Local": F.EXT_LOCAL_SCOPE,
    "InternalLocal": F.INT_LOCAL_SCOPE,
    "two-scopes": F.TWO_SCOPES,
    "sessionAffinity": F.SESSION_AFFINITY,
    "check source-range": F.SOURCE_RANGE,
    "deny": F.SOURCE_RANGE_DENY,
    "46x64": F.NAT_46X64,
    "l7-load-balancer": F.L7_LOAD_BALANCER,
    "loopback": F.LOOPBACK,
    "delegate-if-local": F.LOOPBACK,
    "quarantined": F.QUARANTINED,
    "dsr": F.FWD_MODE_DSR,
}


def sections() -> list[tuple[str, str]]:
    """(file:section, text) of every corpus section made only of dump lines."""
    if not CORPUS.is_dir():
        return []
    out = []
    for path in sorted(CORPUS.glob("*.txtar")):
        parts = re.split(r"^-- (.+?) --$", path.read_text(), flags=re.M)
        for name, body in zip(parts[1::2], parts[2::2]):
            lines = [ln for ln in body.splitlines() if ln.strip()]
            if lines and all(ln.startswith(PREFIXES) for ln in lines):
                out.append((f"{path.name}:{name}", body))
    return out


def parse_addr(text: str) -> tuple[bytes, int, str, int]:
    scope = 0
    if text.endswith("/i"):
        text, scope = text[:-2], 1
    proto = "ANY"
    if "/" in text:
        text, _, proto = text.rpartition("/")
    host, _, port = text.rpartition(":")
    return ipaddress.ip_address(host.strip("[]")).packed, int(port), proto, scope


def fields(line: str) -> dict[str, str]:
    head, _, flags = line.partition(" FLAGS=")
    out = dict(kv.split("=", 1) for kv in head.split()[1:])
    if flags:
        out["FLAGS"] = flags
    return out


def write(maps: LBMaps, line: str) -> None:
    kind = line.split(":", 1)[0]
    if kind == "MAGLEV":
        m = re.match(r"MAGLEV: ID=(\d+) INNER=\[(.*)\]$", line)
        assert m, line
        table: list[int] = []
        for be, n in re.findall(r"(\d+)\((\d+)\)", m.group(2)):
            table += [int(be)] * int(n)
        assert len(table) == TABLE_SIZE, line
        # The family is not in the line; v4 is as good as v6 for the format.
        maps.set_maglev(int(m.group(1)), table, False)
        return
    f = fields(line)
    if kind == "SVC":
        raw, port, proto, scope = parse_addr(f["ADDR"])
        names = f["FLAGS"].split("+")
        word = TYPE_BITS[names[0]] | F.ROUTABLE
        for name in names[1:]:
            if name == "non-routable":
                word &= ~F.ROUTABLE
            else:
                word |= NAME_BITS[name]
        if "BEID" in f:
            head = int(f["BEID"])
        elif "L7Proxy" in f:
            head = int.from_bytes(int(f["L7Proxy"]).to_bytes(2, "big"), "little")
        else:
            head = (LB_ALG_NUMBERS[f["LBALG"]] << LB_ALG_SHIFT) | int(f["AFFTimeout"])
        f1, f2 = F.split(word)
        cls: Any = lb.Service6Key if len(raw) == 16 else lb.Service4Key
        maps.services(len(raw) == 16).update(
            cls(raw, port, int(f["SLOT"]), PROTO_NUMBERS[proto], scope),
            lb.ServiceValue(head, int(f["COUNT"]), int(f["ID"]), f1, f2, int(f["QCOUNT"])),
        )
    elif kind == "BE":
        raw, port, proto, _ = parse_addr(f["ADDR"])
        bcls: Any = lb.Backend6 if len(raw) == 16 else lb.Backend4
        maps.backends(len(raw) == 16).update(
            int(f["ID"]), bcls(raw, port, PROTO_NUMBERS[proto], STATE_NUMBERS[f["STATE"]])
        )
    elif kind == "REV":
        raw, port, _, _ = parse_addr(f["ADDR"])
        rcls: Any = lb.RevNat6 if len(raw) == 16 else lb.RevNat4
        maps.revnat(len(raw) == 16).update(int(f["ID"]), rcls(raw, port))
    elif kind == "AFF":
        maps.aff_match.update(lb.AffinityMatchKey(int(f["BEID"]), int(f["ID"])), 0)
    elif kind == "SRCRANGE":
        net = ipaddress.ip_network(f["CIDR"])
        scls: Any = lb.SourceRange6Key if net.version == 6 else lb.SourceRange4Key
        maps.source_ranges(net.version == 6).update(
            scls.for_cidr(int(f["ID"]), net.network_address.packed, net.prefixlen), 0
        )


SECTIONS = sections()


@pytest.mark.skipif(not SECTIONS, reason=f"corpus not found at {CORPUS}")
@pytest.mark.parametrize(("name", "body"), SECTIONS, ids=[n for n, _ in SECTIONS])
def test_dump_reproduces_corpus_expectation(name: str, body: str) -> None:
    maps = LBMaps.in_memory(max_entries=512, maglev_table_size=TABLE_SIZE)
    for line in body.splitlines():
        if line.strip():
            write(maps, line)
    want = "".join(ln + "\n" for ln in body.splitlines() if ln.strip())
    assert dump_text(maps) == want, name


def test_corpus_maglev_line_order() -> None:
    table = [3] * 500 + [1] * 500 + [2] * 21
    assert slot_counts(table) == [(1, 500), (3, 500), (2, 21)]
