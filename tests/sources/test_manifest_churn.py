"""Property: after any sequence of manifest file writes, rewrites and deletions (some of them
invalid or conflicting), once every file is valid again the tables equal those of a fresh
source reading the final files (an invalid object keeps its last valid version meanwhile,
so the comparison is made after the invalid objects are fixed; files that still conflict
with each other at the end are excluded, since which one wins depends on history)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sources.manifests import ManifestSource
from statedb import DB
from tables.lb_writer import LBWriter

from .test_k8s_convert import endpoint, eps, service

FILES = ["a.yaml", "b.yaml", "c.json"]


def _objects(svc_idx: int, ip_idx: int, n_eps: int, bad: bool) -> list[dict[str, Any]]:
    name = f"s{svc_idx}"
    ip = f"10.96.0.{ip_idx}"
    svc = service(name=name, clusterIP=ip, clusterIPs=[ip])
    if bad:
        svc["spec"]["ports"][0]["port"] = 0
    slice_ = eps(f"{name}-1", svc=name,
                 endpoints=[endpoint(f"10.244.{svc_idx}.{i}") for i in range(1, n_eps + 1)])
    return [svc, slice_]


op_st = st.tuples(
    st.sampled_from(FILES),
    st.one_of(
        st.none(),  # delete the file
        st.tuples(st.integers(0, 2), st.integers(1, 3), st.integers(0, 3), st.booleans()),
    ),
)


def _snapshot(db: DB, w: LBWriter) -> list[list[tuple[str, ...]]]:
    r = db.read_txn()
    return [
        [(s.name,) for s in w.services.all(r)],
        [(str(f.address), f.service_name, *map(str, (b.address for b in f.backends)))
         for f in w.frontends.all(r)],
        [(str(b.address), b.instances_text()) for b in w.backends.all(r)],
    ]


def _write(path: Path, objs: list[dict[str, Any]], gen: int) -> None:
    if path.suffix == ".json":
        import json

        path.write_text(json.dumps(objs))
    else:
        path.write_text(yaml.safe_dump_all(objs))
    os.utime(path, ns=(gen * 1_000_000_000, gen * 1_000_000_000))


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(op_st, min_size=1, max_size=3), min_size=1, max_size=6))
def test_churn_converges_to_fresh_load(rounds: list[list[tuple[str, Any]]]) -> None:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        db = DB()
        w = LBWriter.create(db)
        src = ManifestSource(w, [root], interval=1.0)
        gen = 1
        final: dict[str, tuple[int, int, int, bool] | None] = {}
        for ops in rounds:
            for fname, spec in ops:
                gen += 1
                path = root / fname
                final[fname] = spec
                if spec is None:
                    path.unlink(missing_ok=True)
                else:
                    _write(path, _objects(*spec), gen)
            src.sync()
        # Fix the invalid files.
        for fname, spec in final.items():
            if spec is not None and spec[3]:
                gen += 1
                _write(root / fname, _objects(*spec[:3], False), gen)
        # Settle: objects rejected only because of another file may apply now.
        for _ in range(len(FILES)):
            src.sync()
        db2 = DB()
        w2 = LBWriter.create(db2)
        fresh = ManifestSource(w2, [root], interval=1.0)
        for _ in range(len(FILES) + 1):
            fresh.sync()
        event(f"compared={not fresh.errors}")
        if not fresh.errors:
            assert not src.errors
            assert _snapshot(db, w) == _snapshot(db2, w2)
