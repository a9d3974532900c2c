"""Policy computation benchmark: identities, endpoints and policies in statedb to committed
``policy-entries`` rows; prints one JSON object.

The agent's path without the API: rows go into the ``identities``, ``endpoints`` and
``policies`` tables, and `policy.writer.PolicyWriter` (what the policy component runs)
computes and commits the ``policy-entries`` and ``policy-endpoints`` rows. Each step is
run synchronously here (the component runs the same step in a worker thread when a table
changes), so latencies exclude the event loop's wake-up.

Workload: 5,000 identities (250 apps in 10 namespaces, 20 label variants each), 1,000
local endpoints (4 variants of every app), 500 policies, two per app: a
CiliumNetworkPolicy (egress to two other apps in other namespaces on 80/TCP and
8000-8099/TCP, to world on 443/TCP) and a NetworkPolicy (ingress from a third app of the
namespace on 5432/TCP).

Keys:

- full_compute_s: from the writer's first step over the complete tables to its last row
  committed; entries: the rows it wrote; policy_entries_per_s = entries / full_compute_s.
  full_compute_cpu_s: the process's CPU time for it (on a loaded machine, wall time
  includes waiting for a core).
- identity_change_p99_ms / _p50_ms / _max_ms: a new identity (a new variant of an app) is
  committed, then the step that writes every affected entry row; from before the identity's
  commit to the entries' commit. rows_per_identity_change: rows written per change (only
  the endpoints whose policies select the identity get rows). Then the identity is deleted
  again (not timed) so every change starts from the same state.
- policy_change_p99_ms: one policy's ports change (and change back, not timed): the
  selected endpoints are recomputed; rows_per_policy_change.
- identity_change_to_maps_p99_ms / _p50_ms / _max_ms: the whole chain the issue's
  identity_change_p99_ms means, "a new identity to every affected map updated": the
  computed entries are written into per-endpoint policy maps by the ``policy-entries``
  reconciler (`bpfops.policy_ops.PolicyOps`, what the ``policy-maps`` component runs) on
  memory maps (``--kernel``: kernel maps, not pinned); once the full write is in the maps
  (maps_full_write_s), each change commits a new identity, runs the writer's step and
  waits until the reconciler has attempted every row up to that step's commit (with no
  retry pending: the rows are in the maps); from before the identity's commit to then.
  maps_writes_per_identity_change: map writes per change (PolicyOps.writes before and
  after). The writer's step runs on the event loop here (the component runs it in a
  worker thread), so the reconciler starts once the step has committed.
- rss_mb: resident memory after the run. load_avg_1m_before/after: the machine is shared.

``--quick``: 200 identity changes (100 for the whole chain) and 50 policy changes instead
of 2,000 (1,000) and 200 (same sizes; under 60 s on memory maps).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio

from bpf.catalog import policy_maps_spec
from bpf.kernel_map import KernelMap
from bpf.memory_map import MemoryMap
from bpf.pinning import MapOpener
from bpf.typed_map import TypedMap
from bpfops.policy_ops import PolicyMapSet, PolicyOps
from policy.source import PolicyObjects, new_policies_table
from policy.writer import PolicyWriter
from reconciler import Config, Reconciler
from statedb import DB, Table
from statedb.gc_tuning import tune_gc
from tables.endpoints import Endpoint, new_endpoints_table
from tables.identities import Identity, new_identities_table, pod_identity_labels
from tables.policy_entries import (
    PolicyEntry,
    new_policy_endpoints_table,
    new_policy_entries_table,
)

APPS = 250
NAMESPACES = 10
VARIANTS = 20  # identities per app: 5,000
LOCAL_VARIANTS = 4  # local endpoints per app: 1,000


def app_ns(app: int) -> str:
    return f"ns{app % NAMESPACES}"


def identity_labels(app: int, variant: int) -> tuple[str, ...]:
    return pod_identity_labels(
        {"app": f"app{app}", "variant": f"v{variant}"}, app_ns(app), {"team": f"t{app % 3}"}
    )


def cnp(app: int, ports: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    peers = [(app + 1) % APPS, (app + 7) % APPS]
    ports = ports or [
        {"port": "80", "protocol": "TCP"},
        {"port": "8000", "endPort": 8099, "protocol": "TCP"},
    ]
    return {
        "kind": "CiliumNetworkPolicy",
        "metadata": {"name": f"egress-app{app}", "namespace": app_ns(app)},
        "spec": {
            "endpointSelector": {"matchLabels": {"app": f"app{app}"}},
            "egress": [
                {
                    "toEndpoints": [
                        {
                            "matchLabels": {
                                "app": f"app{p}",
                                "k8s:io.kubernetes.pod.namespace": app_ns(p),
                            }
                        }
                        for p in peers
                    ],
                    "toPorts": [{"ports": ports}],
                },
                {
                    "toEntities": ["world"],
                    "toPorts": [{"ports": [{"port": "443", "protocol": "TCP"}]}],
                },
            ],
        },
    }


def network_policy(app: int) -> dict[str, Any]:
    peer = (app + NAMESPACES) % APPS  # same namespace
    return {
        "kind": "NetworkPolicy",
        "metadata": {"name": f"ingress-app{app}", "namespace": app_ns(app)},
        "spec": {
            "podSelector": {"matchLabels": {"app": f"app{app}"}},
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": {"app": f"app{peer}"}}}],
                    "ports": [{"port": 5432}],
                }
            ],
        },
    }


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


async def chain(
    db: DB,
    identities: Table[Identity],
    entries: Table[PolicyEntry],
    writer: PolicyWriter,
    opener: MapOpener,
    changes: int,
) -> dict[str, Any]:
    """The identity_change_to_maps_* keys (module doc): the entries reconciled into maps."""
    spec = policy_maps_spec(max_entries=4096, policy_max_entries=16384)
    outer = TypedMap(spec, opener.create(spec))
    maps = PolicyMapSet(outer, opener, None)
    ops = PolicyOps(entries, maps)
    rec = Reconciler(
        db,
        Config(
            table=entries,
            operations=ops,
            get_object_status=lambda r: r.status,
            set_object_status=lambda r, st: replace(r, status=st),
            name="policy-entries",
            rate_limit=None,
        ),
    )
    out: dict[str, Any] = {}
    lat: list[float] = []
    writes: list[int] = []
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(rec.run)
            t0 = time.perf_counter()
            pending = await rec.wait_until_reconciled(entries.revision(db.read_txn()), 900)
            out["maps_full_write_s"] = round(time.perf_counter() - t0, 3)
            if pending:
                raise RuntimeError(f"full write: {pending} entries waiting for a retry")
            next_num = 40_000
            for i in range(changes):
                app = (i * 41) % APPS
                ident = Identity(next_num + i, identity_labels(app, 10 * VARIANTS + i), 0)
                before = ops.writes
                t = time.perf_counter()
                with db.write_txn(identities) as txn:
                    identities.insert(txn, ident)
                writer.step()
                pending = await rec.wait_until_reconciled(entries.revision(db.read_txn()), 60)
                lat.append((time.perf_counter() - t) * 1000)
                writes.append(ops.writes - before)
                if pending:
                    raise RuntimeError(f"change {i}: {pending} entries waiting for a retry")
                with db.write_txn(identities) as txn:
                    identities.delete(txn, ident)
                writer.step()
                await rec.wait_until_reconciled(entries.revision(db.read_txn()), 60)
            tg.cancel_scope.cancel()
    finally:
        maps.close()
        outer.close()
    out["maps_backend"] = "kernel" if opener is KernelMap else "memory"
    out["identity_changes_to_maps"] = changes
    if lat:
        out["identity_change_to_maps_p50_ms"] = round(_pct(lat, 50), 3)
        out["identity_change_to_maps_p99_ms"] = round(_pct(lat, 99), 3)
        out["identity_change_to_maps_max_ms"] = round(max(lat), 3)
        out["maps_writes_per_identity_change"] = round(statistics.mean(writes), 1)
    return out


def run(
    identity_changes: int, policy_changes: int, chain_changes: int = 0, kernel: bool = False
) -> dict[str, Any]:
    db = DB()
    identities = new_identities_table()
    endpoints = new_endpoints_table()
    policies = new_policies_table()
    entries = new_policy_entries_table()
    pe = new_policy_endpoints_table()
    db.register(identities, endpoints, policies, entries, pe)
    objects = PolicyObjects(policies)

    with db.write_txn(identities, endpoints, policies) as txn:
        for num, name in ((1, "host"), (2, "world"), (9, "world-ipv4"), (10, "world-ipv6")):
            identities.insert(txn, Identity(num, (f"reserved:{name}",)))
        ep_id = 0
        for app in range(APPS):
            for v in range(VARIANTS):
                num = 256 + app * VARIANTS + v
                labels = identity_labels(app, v)
                local = v < LOCAL_VARIANTS
                identities.insert(txn, Identity(num, labels, 1 if local else 0))
                if local:
                    ep_id += 1
                    endpoints.insert(txn, Endpoint(ep_id, labels=labels, identity=num))
        for app in range(APPS):
            objects.upsert(txn, cnp(app))
            objects.upsert(txn, network_policy(app))
        n_policies = policies.count(txn)
        n_identities = identities.count(txn)
        n_endpoints = endpoints.count(txn)

    writer = PolicyWriter(
        db,
        identities=identities,
        endpoints=endpoints,
        policies=policies,
        entries=entries,
        policy_endpoints=pe,
    )
    t0, c0 = time.perf_counter(), time.process_time()
    writer.step()
    full_s = time.perf_counter() - t0
    full_cpu_s = time.process_time() - c0
    n_entries = entries.count(db.read_txn())

    id_lat: list[float] = []
    id_rows: list[int] = []
    next_num = 256 + APPS * VARIANTS
    for i in range(identity_changes):
        app = (i * 37) % APPS
        ident = Identity(next_num + i, identity_labels(app, VARIANTS + i), 0)
        t = time.perf_counter()
        with db.write_txn(identities) as txn:
            identities.insert(txn, ident)
        res, _ = writer.step()
        id_lat.append((time.perf_counter() - t) * 1000)
        id_rows.append(res.written)
        with db.write_txn(identities) as txn:
            identities.delete(txn, ident)
        writer.step()

    pol_lat: list[float] = []
    pol_rows: list[int] = []
    for i in range(policy_changes):
        app = (i * 53) % APPS
        changed = cnp(app, [{"port": "81", "protocol": "TCP"}])
        t = time.perf_counter()
        with db.write_txn(policies) as txn:
            objects.upsert(txn, changed)
        res, _ = writer.step()
        pol_lat.append((time.perf_counter() - t) * 1000)
        pol_rows.append(res.written)
        with db.write_txn(policies) as txn:
            objects.upsert(txn, cnp(app))
        writer.step()
    chained: dict[str, Any] = {}
    if chain_changes:
        opener: MapOpener = KernelMap if kernel else MemoryMap
        chained = anyio.run(chain, db, identities, entries, writer, opener, chain_changes)
    writer.close()

    return {
        "identities": n_identities,
        "endpoints": n_endpoints,
        "policies": n_policies,
        "entries": n_entries,
        "full_compute_s": round(full_s, 3),
        "full_compute_cpu_s": round(full_cpu_s, 3),
        "policy_entries_per_s": round(n_entries / full_s) if full_s else 0,
        "identity_changes": identity_changes,
        "identity_change_p50_ms": round(_pct(id_lat, 50), 3) if id_lat else None,
        "identity_change_p99_ms": round(_pct(id_lat, 99), 3) if id_lat else None,
        "identity_change_max_ms": round(max(id_lat), 3) if id_lat else None,
        "rows_per_identity_change": round(statistics.mean(id_rows), 1) if id_rows else None,
        "policy_changes": policy_changes,
        "policy_change_p50_ms": round(_pct(pol_lat, 50), 3) if pol_lat else None,
        "policy_change_p99_ms": round(_pct(pol_lat, 99), 3) if pol_lat else None,
        "rows_per_policy_change": round(statistics.mean(pol_rows), 1) if pol_rows else None,
        **chained,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer changes (< 60 s)")
    ap.add_argument("--kernel", action="store_true",
                    help="kernel maps for the whole chain (needs CAP_BPF; slower full write)")
    args = ap.parse_args()
    tune_gc()
    load_before = os.getloadavg()[0]
    result = run(
        200 if args.quick else 2000,
        50 if args.quick else 200,
        100 if args.quick else 1000,
        kernel=args.kernel,
    )
    result["rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    result["load_avg_1m_before"] = round(load_before, 2)
    result["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    result["quick"] = args.quick
    print(json.dumps(result))


if __name__ == "__main__":
    main()
