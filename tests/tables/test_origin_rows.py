"""tables.origins.Origin: a compact row with the value semantics of its ten fields."""

from __future__ import annotations

import dataclasses
import pickle
import re
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from statedb import DB
from tables.origins import (
    Origin,
    OriginRecorder,
    new_origins_table,
    origin,
    origin_key_index,
    origin_of,
    origins_of,
)

FIELDS = ("kind", "namespace", "name", "source", "uid", "resource_version", "file", "line",
          "owner", "addresses")

safe = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
ipv4 = st.ip_addresses(v=4).map(str)
ipv6 = st.ip_addresses(v=6).map(str)
addresses = st.one_of(
    st.just(""),
    st.lists(ipv4, min_size=1, max_size=12).map(",".join),
    st.lists(ipv6, min_size=1, max_size=6).map(",".join),
    st.lists(st.one_of(ipv4, ipv6), min_size=1, max_size=6).map(",".join),
    safe,
)
uids = st.one_of(st.uuids().map(str), st.uuids().map(lambda u: str(u).upper()), safe)


@settings(max_examples=200, deadline=None)
@given(
    kind=safe,
    namespace=safe,
    name=safe,
    source=safe,
    uid=uids,
    rv=safe,
    file=safe,
    line=st.integers(0, 10**6),
    owner=safe,
    addrs=addresses,
)
def test_fields_read_back_as_given(
    kind: str, namespace: str, name: str, source: str, uid: str, rv: str, file: str,
    line: int, owner: str, addrs: str,
) -> None:
    values = (kind, namespace, name, source, uid, rv, file, line, owner, addrs)
    o = Origin(*values)
    assert tuple(getattr(o, f) for f in FIELDS) == values
    assert o.key == f"{kind}/{namespace}/{name}"
    assert o.key_bytes == o.key.encode()
    same = Origin(kind, namespace, name, source, uid=uid, resource_version=rv, file=file,
                  line=line, owner=owner, addresses=addrs)
    assert same == o and hash(same) == hash(o) and repr(same) == repr(o)
    assert pickle.loads(pickle.dumps(o)) == o
    assert dataclasses.asdict(o) == dict(zip(FIELDS, values))
    assert [f.name for f in dataclasses.fields(o)] == list(FIELDS)
    other = dataclasses.replace(o, line=line + 1)
    assert other != o and other.line == line + 1


def test_canonical_uids_are_packed_others_kept() -> None:
    uid = "d9279668-d9fb-404c-87a8-d0fe6cfb2891"
    o = Origin("EndpointSlice", "ns", "s-1", "k8s", uid=uid, addresses="10.0.0.1,10.0.0.2")
    assert type(o._uid) is int and o.uid == uid
    assert o.lists("10.0.0.2") and not o.lists("10.0.0.3")
    for odd in (uid.upper(), "{" + uid + "}", uid.replace("-", ""), "x" * 36,
                "d9279668-d9fb-404c-87a8-d0fe6cfb289g", "00000000-0000-0000-0000-000000000000"):
        assert Origin("Service", "ns", "s", "k8s", uid=odd).uid == odd


def test_only_canonical_uids_are_packed() -> None:
    """Packed: exactly the lower-case hyphenated form (what int() also accepts, a sign, a
    0x prefix, underscores, blanks, is kept as the string)."""
    uid = "d9279668-d9fb-404c-87a8-d0fe6cfb2891"
    assert Origin("Service", "ns", "s", "k8s", uid=uid)._uid == int(uid.replace("-", ""), 16)
    for odd in ("0x279668-d9fb-404c-87a8-d0fe6cfb2891", "d9279668-d9fb-404c-87a8-d0fe_cfb2891",
                "+9279668-d9fb-404c-87a8-d0fe6cfb2891", " 9279668-d9fb-404c-87a8-d0fe6cfb2891",
                "d9279668-d9fb-404c-87a8-d0fe6cfb289\u0663",
                "d9279668-d9fb-404c-87a8-d0fe6cfb28-1"):
        o = Origin("Service", "ns", "s", "k8s", uid=odd)
        assert type(o._uid) is str and o.uid == odd


_CANONICAL_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_uid_chars = st.sampled_from("0123456789abcdefABCDEFxX-+_ \t\u0663g")


def _mutated_uid(u: str, i: int, c: str) -> str:
    return u[:i % 36] + c + u[i % 36 + 1:]


@settings(max_examples=300, deadline=None)
@given(uid=st.one_of(
    st.uuids().map(str),
    st.builds(_mutated_uid, st.uuids().map(str), st.integers(0, 35), _uid_chars),
    st.text(_uid_chars, min_size=30, max_size=40),
    safe,
))
def test_a_uid_is_packed_exactly_when_canonical_and_reads_back(uid: str) -> None:
    """A uid is kept as its int exactly in the lower-case hyphenated form, as the string
    otherwise; either way the row gives it back."""
    o = Origin("Service", "ns", "s", "k8s", uid=uid)
    assert (type(o._uid) is int) == bool(_CANONICAL_UID.fullmatch(uid))
    assert o.uid == uid


def test_non_ascii_kind_and_namespace_keep_the_name() -> None:
    o = Origin("Kïnd", "nämespace", "nåme", "manifests", file="a.yaml", line=3)
    assert (o.kind, o.namespace, o.name) == ("Kïnd", "nämespace", "nåme")
    assert o.where() == "a.yaml:3"


def test_the_row_key_is_the_table_key() -> None:
    db = DB()
    table = new_origins_table()
    db.register(table)
    svc = {"kind": "Service", "metadata": {"name": "web", "namespace": "default",
                                           "uid": "u-1", "resourceVersion": "7"}}
    o = origin_of(svc, "k8s")
    assert o is not None
    with db.write_txn(table) as txn:
        table.insert(txn, o)
    rtxn = db.read_txn()
    assert origin(rtxn, table, "Service", "default", "web") is o
    assert table.get(rtxn, origin_key_index.query("Service/default/web")) is o
    assert list(table.prefix(rtxn, origin_key_index.query("Service/"))) == [o]
    # The stored key is the row's own bytes object: no second one per row.
    stored = table.state(rtxn).rows[o.key_bytes]
    assert stored[2] is o.key_bytes
    assert sys.getsizeof(o) <= 96


def _slice(endpoints: object) -> dict[str, object]:
    return {"kind": "EndpointSlice",
            "metadata": {"name": "s-1", "namespace": "ns",
                         "labels": {"kubernetes.io/service-name": "svc"}},
            "endpoints": endpoints}


def test_a_slice_origin_lists_its_endpoint_addresses_whatever_their_shape() -> None:
    """The usual slice's addresses are joined in one step; odd endpoints (not mappings,
    addresses not a list, not strings) give what the endpoint-by-endpoint walk gives."""
    usual = _slice([{"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.2", "fd00::1"]}])
    o = origin_of(usual, "k8s")
    assert o is not None and o.addresses == "10.0.0.1,10.0.0.2,fd00::1"
    assert o.lists("fd00::1") and not o.lists("10.0.0.3")
    odd = _slice([{"addresses": ["10.0.0.1"]}, "junk", {"addresses": "10.0.0.9"},
                  {"addresses": [7, "10.0.0.2"]}, {}, None])
    o = origin_of(odd, "k8s")
    assert o is not None and o.addresses == "10.0.0.1,7,10.0.0.2"
    for endpoints in ([], None, "junk"):
        o = origin_of(_slice(endpoints), "k8s")
        assert o is not None and o.addresses == ""


def _reference_origin(obj: dict[str, object], source: str) -> Origin | None:
    """What origin_of gives, written field by field with every check spelled out (the
    shapes JSON decodes to): origin_of's fast paths must give the same row."""
    kind, meta = obj.get("kind"), obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    name = meta.get("name")
    if not isinstance(kind, str) or not kind or not isinstance(name, str) or not name:
        return None
    ns = meta.get("namespace")
    ns = "" if kind in ("Node", "Namespace", "CiliumClusterwideNetworkPolicy") else (
        ns if isinstance(ns, str) and ns else "default")
    uid, rv = meta.get("uid"), meta.get("resourceVersion")
    owner = addrs = ""
    if kind == "EndpointSlice":
        labels = meta.get("labels")
        svc = labels.get("kubernetes.io/service-name") if isinstance(labels, dict) else None
        owner = f"{ns}/{svc}" if isinstance(svc, str) and svc else ""
        out: list[str] = []
        eps = obj.get("endpoints")
        for ep in eps if isinstance(eps, list) else ():
            a = ep.get("addresses") if isinstance(ep, dict) else None
            out.extend(str(x) for x in a) if isinstance(a, list) else None
        addrs = ",".join(out)
    return Origin(kind, ns, name, source, str(uid) if uid else "", str(rv) if rv else "",
                  owner=owner, addresses=addrs)


json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), safe, ipv4)
endpoint = st.one_of(
    st.fixed_dictionaries({"addresses": st.lists(ipv4, max_size=3)}),
    st.fixed_dictionaries({"addresses": st.one_of(json_scalar, st.lists(json_scalar, max_size=3))}),
    st.dictionaries(safe, json_scalar, max_size=2),
    json_scalar,
)


@settings(max_examples=300, deadline=None)
@given(
    kind=st.one_of(st.sampled_from(["Service", "EndpointSlice", "Node"]), json_scalar),
    name=st.one_of(safe, json_scalar),
    namespace=json_scalar,
    uid=st.one_of(uids, json_scalar),
    rv=json_scalar,
    service=json_scalar,
    endpoints=st.one_of(st.lists(endpoint, max_size=4), json_scalar),
)
def test_origin_of_gives_the_row_its_fields_say(
    kind: object, name: object, namespace: object, uid: object, rv: object, service: object,
    endpoints: object,
) -> None:
    obj = {"kind": kind, "endpoints": endpoints,
           "metadata": {"name": name, "namespace": namespace, "uid": uid,
                        "resourceVersion": rv,
                        "labels": {"kubernetes.io/service-name": service}}}
    assert origin_of(obj, "k8s") == _reference_origin(obj, "k8s")


def _stored(o: Origin) -> tuple[object, ...]:
    """An origin's class and slots as stored (equal fields may be stored differently)."""
    return (type(o), *(getattr(o, slot) for slot in Origin.__slots__))


usual_rv = st.integers(0, 10**12).map(str)
usual_object = st.fixed_dictionaries({
    "kind": st.sampled_from(["Service", "EndpointSlice"]),
    "endpoints": st.lists(st.fixed_dictionaries({"addresses": st.lists(ipv4, max_size=2)}),
                          max_size=3),
    "metadata": st.fixed_dictionaries({
        "name": safe, "namespace": safe, "uid": uids, "resourceVersion": usual_rv,
        "labels": st.fixed_dictionaries({"kubernetes.io/service-name": safe}),
    }),
})
any_object = st.builds(
    lambda kind, name, namespace, uid, rv, service, endpoints: {
        "kind": kind, "endpoints": endpoints,
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": rv,
                     "labels": {"kubernetes.io/service-name": service}}},
    st.one_of(st.sampled_from(["Service", "EndpointSlice", "Node"]), json_scalar),
    st.one_of(safe, json_scalar), json_scalar, st.one_of(uids, json_scalar),
    st.one_of(usual_rv, json_scalar), json_scalar,
    st.one_of(st.lists(endpoint, max_size=4), json_scalar),
)


@settings(max_examples=300, deadline=None)
@given(objs=st.lists(st.one_of(usual_object, any_object), max_size=6))
def test_origins_of_a_batch_are_origin_of_each(objs: list[dict[str, object]]) -> None:
    """The batch loop (inline for the usual object) stores exactly what origin_of does,
    slot by slot, and leaves out the objects without an origin."""
    want = [o for o in (origin_of(obj, "k8s") for obj in objs) if o is not None]
    assert [_stored(o) for o in origins_of(objs, "k8s")] == [_stored(o) for o in want]


def test_decimal_resource_versions_are_packed_others_kept() -> None:
    o = Origin("Service", "ns", "s", "k8s", uid="u", resource_version="1234567")
    assert o._rv == 1234567 and o.resource_version == "1234567"
    assert o.to_json()["resourceVersion"] == "1234567"
    assert o.where() == "uid u resourceVersion 1234567"
    for odd in ("", "0", "01234", "+12", " 12", "1_000", "12a", "\u0661\u0662", "-1"):
        o = Origin("Service", "ns", "s", "k8s", resource_version=odd)
        assert o._rv == odd and o.resource_version == odd
    # Two different versions never compare equal.
    assert (Origin("Service", "ns", "s", "k8s", resource_version="012")
            != Origin("Service", "ns", "s", "k8s", resource_version="12"))


@settings(max_examples=200, deadline=None)
@given(text=addresses, probe=st.one_of(ipv4, ipv6, safe,
                                       st.sampled_from(["010.0.0.1", "1.2.3", "0.0.0.0"])))
def test_a_slice_lists_exactly_the_addresses_of_its_text(text: str, probe: str) -> None:
    """IPv4 addresses are kept as 4 bytes each, anything else as the text: either way the
    text reads back and `lists` answers as the comma-separated text does."""
    o = Origin("EndpointSlice", "ns", "s-1", "k8s", addresses=text)
    assert o.addresses == text
    items = text.split(",") if text else []
    for addr in [*items, probe]:
        assert o.lists(addr) == (addr in items)


def test_ipv4_addresses_are_packed_others_kept_as_text() -> None:
    o = Origin("EndpointSlice", "ns", "s-1", "k8s", addresses="10.0.0.1,10.0.1.0")
    assert o._addrs == bytes([10, 0, 0, 1, 10, 0, 1, 0])
    assert not o.lists("0.1.10.0")  # bytes across two addresses are none of them
    for text in ("10.0.0.1,fd00::1", "010.0.0.1", "10.0.0.1,", "a.example"):
        assert Origin("EndpointSlice", "ns", "s-1", "k8s", addresses=text)._addrs == text


def _svc(name: str, rv: str) -> dict[str, object]:
    return {"kind": "Service", "metadata": {"name": name, "namespace": "ns",
                                            "uid": "u-" + name, "resourceVersion": rv}}


@settings(max_examples=100, deadline=None)
@given(
    before=st.lists(st.tuples(st.sampled_from("abcd"), st.sampled_from(["1", "2"])),
                    max_size=4),
    batch=st.lists(st.one_of(st.tuples(st.sampled_from("abcde"), st.sampled_from(["1", "2"])),
                             st.none()), max_size=6),
)
def test_record_many_writes_what_record_writes_one_by_one(
    before: list[tuple[str, str]], batch: list[tuple[str, str] | None]
) -> None:
    """A batch (new, equal, changed and repeated objects, and some with no name) leaves
    the same rows, and rewrites the same ones, as `record` called per object."""
    objs = [_svc(*b) if b is not None else {"kind": "Service", "metadata": {}} for b in batch]
    results = []
    for many in (False, True):
        db = DB()
        table = new_origins_table()
        db.register(table)
        rec = OriginRecorder(table)
        with db.write_txn(table) as txn:
            for name, rv in before:
                rec.record(txn, _svc(name, rv), "k8s")
        with db.write_txn(table) as txn:
            if many:
                rec.record_many(txn, objs, "k8s")
            else:
                for obj in objs:
                    rec.record(txn, obj, "k8s")
        rtxn = db.read_txn()
        # Each row with its revision: a row rewritten needlessly would have another one.
        rows = [table.get_revision(rtxn, o.key_bytes) for o in table.all(rtxn)]
        results.append((rows, table.revision(rtxn)))
    assert results[0] == results[1]
