"""K8sSource's usual batch (no Pods or Nodes, one change per object), written item by item
without a pair per change, leaves exactly what the general path leaves: the tables, the
errors and conflicts, and the counts."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sources.k8s_convert import K8sConverter
from sources.k8s_reflector import Delta, object_key
from sources.k8s_source import K8sSource, _Item
from statedb import DB
from tables.lb_config import LBConfig
from tables.lb_writer import LBWriter
from tests.k8s.objects import endpoint_slice, service

NAMES = ("a", "b", "c")
#: Two Services on one address conflict; port 0 is refused by the converter.
IPS = ("10.96.0.1", "10.96.0.2")


class _General(K8sSource):
    """Writes every batch through the general path (`_write_batch`)."""

    def _write_usual(self, batch: list[_Item], all_synced: bool) -> set[int]:
        wanted = [(item.reflector, d) for item in batch for d in item.deltas]
        written, skip, refused = self._write_batch(wanted, {}, all_synced, False)
        assert written == wanted and skip == refused
        return refused


def _source(cls: type[K8sSource]) -> tuple[K8sSource, LBWriter, DB]:
    cfg = LBConfig()
    db = DB()
    writer = LBWriter.create(db, cfg)
    src = cls(writer, client=None, node_name="node",  # type: ignore[arg-type]
              converter=K8sConverter(writer, cfg))
    with writer.write_txn() as txn:
        src.register_initializer(txn)
    return src, writer, db


def _state(src: K8sSource, writer: LBWriter, db: DB) -> tuple[Any, ...]:
    txn = db.read_txn()
    tables = [writer.services, writer.frontends, writer.backends]
    if writer.origins is not None:
        tables.append(writer.origins)
    rows = tuple(tuple(_scrubbed(row) for row in t.all(txn)) for t in tables)
    return (rows, dict(src.errors), sorted(src._conflicts), src.applied, src.batches,
            dict(src.applied_rv), src.synced)


def _scrubbed(row: object) -> str:
    """A row's repr without its status' time and id (unique per status made)."""
    return _STATUS.sub(lambda m: _STAMP.sub("", m.group(0)), repr(row))


_STATUS = re.compile(r"status=Status\([^)]*\)")
_STAMP = re.compile(r"updated_at=[^,]*, |, id=\d+")


def _change(kind: str, op: str, name: str, ip: int, port: int, rv: int) -> Delta:
    if kind == "Service":
        obj = service(name, IPS[ip], port=port)
    else:
        obj = endpoint_slice(name, [f"10.128.0.{ip + 1}", f"10.128.0.{port % 7 + 10}"])
    obj["metadata"]["resourceVersion"] = str(rv)
    return Delta(op, object_key(obj), obj)


changes = st.builds(
    _change,
    st.sampled_from(["Service", "EndpointSlice"]),
    st.sampled_from(["upsert", "upsert", "delete"]),
    st.sampled_from(NAMES),
    st.integers(0, len(IPS) - 1),
    st.sampled_from([0, 80, 443]),
    st.integers(1, 10**6),
)
items = st.tuples(st.booleans(), st.lists(changes, min_size=1, max_size=5))


@settings(max_examples=150, deadline=None)
@given(batches=st.lists(st.lists(items, min_size=1, max_size=3), min_size=1, max_size=4))
def test_the_usual_batch_writes_what_the_general_path_writes(
    batches: list[list[tuple[bool, list[Delta]]]],
) -> None:
    """Services and EndpointSlices, upserted and deleted, some refused (a conflict, a
    bad port), delivered by their reflectors in one or several items per batch: both
    paths leave the same state after every batch."""
    got = _source(K8sSource)
    want = _source(_General)
    for batch in batches:
        for src, _, _ in (got, want):
            by_kind = {r.spec.kind: r for r in src.reflectors}
            src.apply_batch([
                _Item(by_kind[kind], [d for d in deltas if d.obj["kind"] == kind], synced, 0.0)
                for synced, deltas in batch
                for kind in ("Service", "EndpointSlice")
                if any(d.obj["kind"] == kind for d in deltas)
            ])
        assert _state(*got) == _state(*want)


def test_a_refused_change_leaves_the_items_others_written() -> None:
    """A Service refused in the middle of a delivery: the ones before and after it are
    written, its error is kept, and it is not counted as applied."""
    src, writer, db = _source(K8sSource)
    services = next(r for r in src.reflectors if r.spec.kind == "Service")
    objs = [service("a", IPS[0]), service("b", IPS[1], port=0), service("c", IPS[1])]
    src.apply_batch([_Item(services, [Delta("upsert", object_key(o), o) for o in objs],
                           False, 0.0)])
    names = sorted(str(s.name) for s in writer.services.all(db.read_txn()))
    assert names == ["default/a", "default/c"]
    assert list(src.errors) == ["Service default/b"]
    assert src.applied == 2
