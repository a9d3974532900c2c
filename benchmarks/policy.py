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
- rss_mb: resident memory after the run. load_avg_1m_before/after: the machine is shared.

``--quick``: 200 identity changes and 50 policy changes instead of 2,000 and 200 (same
sizes; well under 60 s).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from policy.source import PolicyObjects, new_policies_table
from policy.writer import PolicyWriter
from statedb import DB
from statedb.gc_tuning import tune_gc
from tables.endpoints import Endpoint, new_endpoints_table
from tables.identities import Identity, new_identities_table, pod_identity_labels
from tables.policy_entries import new_policy_endpoints_table, new_policy_entries_table

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


def run(identity_changes: int, policy_changes: int) -> dict[str, Any]:
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
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer changes (< 60 s)")
    args = ap.parse_args()
    tune_gc()
    load_before = os.getloadavg()[0]
    result = run(200 if args.quick else 2000, 50 if args.quick else 200)
    result["rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    result["load_avg_1m_before"] = round(load_before, 2)
    result["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    result["quick"] = args.quick
    print(json.dumps(result))


if __name__ == "__main__":
    main()
