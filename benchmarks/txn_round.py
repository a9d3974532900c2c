"""The fixed cost of a write transaction + reconciler round (issue #33); prints one JSON object.

The agent's load balancer (`statewright.loadbalancer.LoadBalancer`, its reconciler and
health-check server, as `benchmarks/k8s.py` builds it) holds ``--services`` Services
with an EndpointSlice of 10 endpoints each. Then, for each batch size k of ``--sizes``
(default 1, 4, 16), ``--changes`` EndpointSlice changes (one endpoint address replaced)
are written k per write transaction through the Kubernetes converter, and after each
transaction the benchmark waits until the load balancer is idle (every change in the
maps, the health server caught up): what the agent does when events arrive one
transaction at a time.

Keys: ``us_per_change_<k>``: CPU time of the process (all threads) per change at k
changes per transaction; ``us_per_txn_<k>`` the same per transaction. The difference
between the k=1 and the larger batches is the fixed cost per transaction + round.

``--maps memory`` (default) or ``kernel``. Under callgrind, whose instruction counts a
loaded machine does not distort, run it twice with two ``--changes`` counts and one size
(``--sizes 1``) and divide the difference of the totals by the difference of changes::

    valgrind --tool=callgrind --callgrind-out-file=/tmp/a.out \\
        .venv/bin/python benchmarks/txn_round.py --services 300 --sizes 1 --changes 100
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import ipaddress
import json
import os
import sys
import time
from typing import Any

import anyio

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.lb import BACKENDS_PER_SERVICE, service_obj, slice_obj
from statedb.gc_tuning import freeze_loaded, tune_gc
from statewright.loadbalancer import LoadBalancer, MapsPlacement
from tables.lb_config import LBConfig

NODE = "bench-node"
LOAD_TXN_OBJECTS = 20


async def _wait_idle(lb: LoadBalancer) -> None:
    """Wait until every change is reconciled. (The health server follows the table at
    most every 0.1 s, as in the agent: its passes run meanwhile, their cost shared by
    the changes of that time.)"""
    rec = lb.reconciler
    assert rec is not None
    rev = lb.frontends.revision(lb.db.read_txn())
    await rec.wait_until_reconciled(rev)


async def _run(
    n: int, sizes: list[int], changes: int, maps: str, profile: str = ""
) -> dict[str, Any]:
    entries = 1 << max(16, (n * (BACKENDS_PER_SERVICE + 1) * 2).bit_length())
    cfg = LBConfig.from_flags([f"--bpf-lb-map-max={entries}"], LBConfig(node_name=NODE))
    lb = LoadBalancer(cfg, MapsPlacement(backend=maps, pin_dir=""))
    lb.open_maps()
    lb.build_reconciler()
    conv = lb.converter
    writer = lb.writer
    out: dict[str, Any] = {"maps": lb.maps_kind, "services": n, "changes": changes}
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(lb.run)
            for start in range(0, n, LOAD_TXN_OBJECTS // 2):
                with writer.write_txn() as txn:
                    for i in range(start, min(n, start + LOAD_TXN_OBJECTS // 2)):
                        conv.upsert(txn, service_obj(i))
                        conv.upsert(txn, slice_obj(i))
                del txn
                await anyio.sleep(0)
            await _wait_idle(lb)
            gc.collect()
            freeze_loaded()
            generation = 0
            for k in sizes:
                # The slices are built before the clock starts: the input is not the agent's.
                batches = []
                for _ in range(max(1, changes // k)):
                    batch = []
                    for _ in range(k):
                        generation += 1
                        batch.append(slice_obj((generation * 7919) % n, generation))
                    batches.append(batch)
                prof = cProfile.Profile(time.thread_time) if profile else None
                if prof is not None:
                    prof.enable()
                c0 = time.process_time()
                for batch in batches:
                    with writer.write_txn() as txn:
                        for obj in batch:
                            conv.upsert(txn, obj)
                    del txn
                    await _wait_idle(lb)
                cpu = time.process_time() - c0
                if prof is not None:
                    prof.disable()
                    prof.dump_stats(f"{profile}.{k}")
                done = len(batches) * k
                out[f"us_per_change_{k}"] = round(cpu * 1e6 / done, 1)
                out[f"us_per_txn_{k}"] = round(cpu * 1e6 / len(batches), 1)
            want = ipaddress.ip_address(int(ipaddress.ip_address("10.200.0.0")) + generation)
            if not any(b.address.address == want for b in lb.backends.all(lb.db.read_txn())):
                raise RuntimeError(f"the last change ({want}) is not in the backends table")
            tg.cancel_scope.cancel()
    finally:
        lb.close_maps()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--services", type=int, default=2000)
    p.add_argument("--changes", type=int, default=2000, help="changes per batch size")
    p.add_argument("--sizes", default="1,4,16", help="changes per transaction, comma-separated")
    p.add_argument("--maps", choices=("memory", "kernel"), default="memory")
    p.add_argument(
        "--profile",
        default="",
        metavar="PREFIX",
        help="cProfile the changes of each size into PREFIX.<size> (pstats; slows them)",
    )
    args = p.parse_args(argv)
    tune_gc()
    sizes = [int(s) for s in args.sizes.split(",")]
    out = anyio.run(_run, args.services, sizes, args.changes, args.maps, args.profile)
    out["load_average"] = list(os.getloadavg())
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
