"""Cluster benchmark: a simulated cluster seen by one agent through the fake API server;
prints one JSON object.

The fake API server (tests/k8s/fake_apiserver.py) runs in a child process, populated with
``--nodes`` Nodes (an InternalIP on one underlay /16 each, a /24 pod CIDR), ``--endpoints``
CiliumEndpoints spread evenly over them (one IPv4 address of the node's pod CIDR, the
node's address, an identity drawn from the ``--identities`` CiliumIdentities). The agent
side is what the agent runs for them: the Node reflector into the nodes table
(sources/k8s_nodes.py) with the nodes' ipcache entries (`EntryTables.set_nodes`) and the
native routes derived from it (`tables.node_routes.desired_routes`, against a connected
underlay /16: the rows the route reconciler would write; no kernel route is written), the
CiliumIdentity watch into the cluster identity allocator (sources/k8s_identities.py) and
the CiliumEndpoint watch into the ipcache table (sources/k8s_endpoints.py,
tables/remote_endpoints.py), whose reconciler writes the ipcache map (kernel when the
machine allows, else the memory map; ``maps`` says which).

Keys:

- initial_sync_s: from starting the reflectors until every ipcache entry (endpoints and
  nodes) is Done in the map and the routes are derived; ipcache_entries, routes: how many.
- initial_sync_lists_s: until the three initial lists (Nodes, CiliumIdentities,
  CiliumEndpoints) are in the tables; initial_sync_maps_after_lists_s: the rest, until
  the map holds every entry; initial_sync_cpu_s: the CPU time of this process (all its
  threads) during the sync: what the sync costs whatever the machine's load (the server's
  encoding is another process).
- remote_endpoint_change_p50_ms / p99_ms: the server changes one CiliumEndpoint's
  identity (``--changes`` of them, 50 per second); from the server's write until the
  entry is Done in the map with the new identity (the table polled every millisecond).
- identity_agree_p50_ms / p99_ms: two more agents (their own database, allocator and
  client) take a new label set at the same moment (``--races`` times): from then until
  both use one number and every object created for the label set is in both caches (the
  agreement is final). identity_agree_objects_avg: objects created per race (1: one
  agent saw the other's before creating its own).
- change_profile_<stage>_ms_p50|p99: the change latency in three stages, per change:
  ``emit_to_delivered`` (the server's write, the watch stream, decoding, up to the
  reflector's delivery), ``delivered_to_committed`` (the worker thread's write transaction
  on the ipcache table) and ``committed_to_done`` (the ipcache reconciler's round and map
  write, and this benchmark's 1 ms polling).
- rss_mb: the agent process' resident memory after the sync and changes (the server is
  another process).

``--quick``: 200 nodes, 10,000 endpoints, 1,000 identities, 100 changes, 10 races
(well under 60 s).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import gc
import ipaddress
import json
import multiprocessing
import multiprocessing.connection
import os
import random
import tempfile
import time
from typing import Any

import anyio

from bpf.catalog import ipcache_spec
from bpf.factory import BackendConfig, MapFactory
from bpf.probe import kernel_support
from bpfops.ipcache_ops import IPCacheOps
from reconciler import Config, Reconciler, status_field_accessors
from reconciler.status import StatusKind
from sources.k8s_client import ClientSettings, K8sClient
from sources.k8s_endpoints import CiliumEndpoints
from sources.k8s_identities import ClusterIdentities
from sources.k8s_nodes import NodesK8sSource
from statedb import DB
from statedb.gc_tuning import collect_young_periodically, freeze_loaded, steady_gc, tune_gc
from tables.cluster_identities import ClusterIdentityAllocator, identity_object
from tables.endpoint_entries import EntryTables, ipcache_prefix_index
from tables.endpoints import new_endpoints_table
from tables.identities import identity_labels_index
from tables.node_routes import desired_routes
from tables.nodes import new_nodes_table
from tables.remote_endpoints import RemoteEndpointEntries

LOCAL = "bench-node"
UNDERLAY = ipaddress.ip_network("172.30.0.0/16")


def node_obj(i: int) -> dict[str, Any]:
    """Node ``i``: InternalIP 172.30.x.y, pod CIDR 10.(i>>8).(i&255).0/24 + 10.128/9."""
    ip = UNDERLAY.network_address + 1 + i
    return {
        "kind": "Node",
        "metadata": {"name": f"node-{i}"},
        "spec": {"podCIDRs": [f"10.{128 + (i >> 8)}.{i & 255}.0/24"]},
        "status": {"addresses": [{"type": "InternalIP", "address": str(ip)}]},
    }


def cep_obj(k: int, nodes: int, identities: int, identity: int | None = None) -> dict[str, Any]:
    """CiliumEndpoint ``k`` on node ``k % nodes``."""
    i = k % nodes
    slot = k // nodes + 2
    ip = f"10.{128 + (i >> 8)}.{i & 255}.{slot}"
    num = identity if identity is not None else 256 + (k * 7919) % identities
    return {
        "kind": "CiliumEndpoint",
        "metadata": {"name": f"pod-{k}", "namespace": f"ns-{k % 20}"},
        "status": {
            "id": 1 + k // nodes,
            "identity": {"id": num, "labels": [f"k8s:app=a{num}"]},
            "networking": {"addressing": [{"ipv4": ip}],
                           "node": str(UNDERLAY.network_address + 1 + i)},
            "state": "ready",
        },
    }


def _server(conn: multiprocessing.connection.Connection, kubeconfig: str) -> None:
    """Child process: serve; obey ("populate", n, e, i), ("change", k, id), ("stop",)."""
    from tests.k8s.fake_apiserver import FakeAPIServer

    srv = FakeAPIServer(bookmark_interval=5.0, history_limit=20_000).start()
    try:
        srv.write_kubeconfig(kubeconfig)
        conn.send(("ready",))
        while True:
            cmd = conn.recv()
            if cmd[0] == "populate":
                _, n, e, ids = cmd
                for i in range(n):
                    srv.upsert(node_obj(i))
                for num in range(256, 256 + ids):
                    srv.upsert(identity_object(num, (f"k8s:app=a{num}",)))
                for k in range(e):
                    srv.upsert(cep_obj(k, n, ids))
                gc.collect()
                gc.freeze()
                conn.send(("ok",))
            elif cmd[0] == "change":
                _, k, n, ids, num = cmd
                srv.upsert(cep_obj(k, n, ids, num))
                conn.send(("changed", time.monotonic()))
            else:
                break
    finally:
        srv.stop()


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 2)


class Agent:
    """One agent's cluster side (module doc)."""

    def __init__(self, kubeconfig: str, backend: str, seed: int) -> None:
        self.db = DB()
        self.entries = EntryTables()
        self.db.register(self.entries.ipcache)
        self.nodes = new_nodes_table()
        self.db.register(self.nodes)
        self.alloc = ClusterIdentityAllocator(self.db, rng=random.Random(seed))
        self.client = K8sClient(ClientSettings(kubeconfig=kubeconfig, qps=100, burst=200))
        self.node_source = NodesK8sSource(self.db, self.nodes, self.client)
        self.identities = ClusterIdentities(self.alloc, self.client, self._apply,
                                            retry_interval=0.5)
        endpoints = new_endpoints_table()
        self.db.register(endpoints)
        self.ceps = CiliumEndpoints(
            self.db, self.client, endpoints=endpoints, identities=self.alloc.table,
            entries=RemoteEndpointEntries(self.entries.ipcache), pod_uid_of=lambda _n, _p: None,
            node_ip=lambda: ipaddress.ip_address("192.0.2.254"),
        )
        self.maps: Any = None
        self.reconciler: Reconciler[Any] | None = None
        self.backend = backend

    def _apply(self, change: Any) -> list[int]:
        with self.db.write_txn(self.alloc.table) as txn:
            change(txn)
        return []

    def open_map(self) -> str:
        factory = MapFactory(BackendConfig(backend=self.backend, pin=False))  # type: ignore[arg-type]
        self.maps = factory.open_typed(ipcache_spec())
        get, put = status_field_accessors()
        self.reconciler = Reconciler(self.db, Config(
            table=self.entries.ipcache, operations=IPCacheOps(self.maps),
            get_object_status=get, set_object_status=put, name="ipcache",
            prune_interval=None))
        return factory.kind

    def close(self) -> None:
        self.client.close()
        if self.maps is not None:
            self.maps.close()


async def _sync(agent: Agent, tg: Any, n: int, e: int) -> tuple[float, int, int, dict[str, float]]:
    assert agent.reconciler is not None
    with agent.db.write_txn(agent.entries.ipcache, agent.nodes) as txn:
        agent.ceps.register_initializer(txn)
        agent.node_source.register_initializer(txn)
    del txn
    await tg.start(agent.reconciler.run)
    t0, cpu0 = time.perf_counter(), time.process_time()
    await tg.start(agent.node_source.run)
    await tg.start(agent.identities.run)
    await tg.start(agent.ceps.run)
    while not (agent.node_source.synced and agent.ceps.synced and agent.identities.synced):
        await anyio.sleep(0.01)
    lists = time.perf_counter() - t0
    nodes = list(agent.nodes.all(agent.db.read_txn()))
    with agent.db.write_txn(agent.entries.ipcache) as wtxn:
        agent.entries.set_nodes(wtxn, nodes, LOCAL, {})
    routes, _problems = desired_routes(nodes, LOCAL, [UNDERLAY])
    # Every entry written: the reconciler has processed the table up to its revision
    # (one wait, no scan of the table while it works).
    revision = agent.entries.ipcache.revision(agent.db.read_txn())
    await agent.reconciler.wait_until_reconciled(revision)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    rtxn = agent.db.read_txn()
    done = len([r for r in agent.entries.ipcache.all(rtxn) if r.status.kind is StatusKind.DONE])
    profile = {"initial_sync_lists_s": round(lists, 2), "initial_sync_cpu_s": round(cpu, 2),
               "initial_sync_maps_after_lists_s": round(elapsed - lists, 2)}
    return elapsed, done, len(routes), profile


class _Stages:
    """When each CiliumEndpoint change reached the agent (the reflector's delivery) and
    was committed to the ipcache table: the change latency's stages."""

    def __init__(self, agent: Agent) -> None:
        self.delivered: dict[str, float] = {}
        self.committed: dict[str, float] = {}
        reflector = agent.ceps.reflector
        deliver, apply = reflector.deliver, agent.ceps.apply

        async def traced_deliver(r: Any, deltas: list[Any], synced: bool) -> None:
            now = time.monotonic()
            for d in deltas:
                self.delivered[d.key] = now
            await deliver(r, deltas, synced)

        def traced_apply(deltas: list[Any], synced: bool) -> int:
            written = apply(deltas, synced)
            now = time.monotonic()
            for d in deltas:
                self.committed[d.key] = now
            return written

        reflector.deliver = traced_deliver
        agent.ceps.apply = traced_apply  # type: ignore[method-assign]


async def _changes(agent: Agent, conn: multiprocessing.connection.Connection, n: int, e: int,
                   ids: int, count: int) -> tuple[list[float], dict[str, list[float]]]:
    lat: list[float] = []
    stages: dict[str, list[float]] = {"emit_to_delivered": [], "delivered_to_committed": [],
                                      "committed_to_done": []}
    trace = _Stages(agent)
    rng = random.Random(5)
    for c in range(count):
        k = rng.randrange(e)
        num = 256 + (c * 31 + 1) % ids
        old = cep_obj(k, n, ids)["status"]["identity"]["id"]
        if num == old:
            num = 256 + (num - 256 + 1) % ids
        ip = ipaddress.ip_network(cep_obj(k, n, ids)["status"]["networking"]["addressing"][0]
                                  ["ipv4"])
        key = f"ns-{k % 20}/pod-{k}"
        trace.delivered.pop(key, None)
        trace.committed.pop(key, None)
        conn.send(("change", k, n, ids, num))
        _, at = conn.recv()
        while True:
            row = agent.entries.ipcache.get(agent.db.read_txn(), ipcache_prefix_index.query(ip))
            if row is not None and row.identity == num and row.status.kind is StatusKind.DONE:
                done = time.monotonic()
                lat.append((done - at) * 1000)
                got, com = trace.delivered.get(key), trace.committed.get(key)
                if got is not None and com is not None:
                    stages["emit_to_delivered"].append((got - at) * 1000)
                    stages["delivered_to_committed"].append((com - got) * 1000)
                    stages["committed_to_done"].append((done - com) * 1000)
                break
            await anyio.sleep(0.001)
        # the next change 20 ms later: 50 per second, and the entry stays as changed
        await anyio.sleep(0.02)
    return lat, stages


async def _races(kubeconfig: str, backend: str, races: int) -> tuple[list[float], float]:
    a, b = Agent(kubeconfig, backend, 11), Agent(kubeconfig, backend, 12)
    lat: list[float] = []
    made = 0
    check = K8sClient(ClientSettings(kubeconfig=kubeconfig, qps=1000, burst=1000))
    try:
        async with anyio.create_task_group() as tg:
            for ag in (a, b):
                await tg.start(ag.identities.run)
            while not (a.identities.synced and b.identities.synced):
                await anyio.sleep(0.01)
            for r in range(races):
                labels = (f"k8s:app=race-{r}-{os.getpid()}", "k8s:io.kubernetes.pod.namespace=x")
                t0 = time.monotonic()
                picks = []
                for ag in (a, b):
                    with ag.db.write_txn(ag.alloc.table) as txn:
                        picks.append(ag.alloc.acquire(txn, labels).id)
                while True:
                    ra, rb = (ag.alloc.table.get(ag.db.read_txn(),
                                                 identity_labels_index.query(labels))
                              for ag in (a, b))
                    if ra is not None and rb is not None and ra.id == rb.id:
                        exist = await anyio.to_thread.run_sync(_existing, check, picks)
                        if all(a.alloc.object_of(x) and b.alloc.object_of(x) for x in exist):
                            lat.append((time.monotonic() - t0) * 1000)
                            made += len(exist)
                            break
                    await anyio.sleep(0.002)
            tg.cancel_scope.cancel()
    finally:
        for ag in (a, b):
            ag.close()
        check.close()
    return lat, made / max(1, races)


def _existing(client: K8sClient, nums: list[int]) -> list[int]:
    from sources.k8s_client import resource_path
    from sources.k8s_http import K8sApiError

    out = []
    for num in set(nums):
        try:
            client.get(resource_path("cilium.io/v2", "ciliumidentities", name=str(num)),
                       timeout=10.0)
            out.append(num)
        except K8sApiError as e:
            if e.status != 404:
                raise
    return out


async def run(n: int, e: int, ids: int, changes: int, races: int) -> dict[str, Any]:
    """The benchmark; returns the figures."""
    out: dict[str, Any] = {"nodes": n, "cilium_endpoints": e, "identities": ids}
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    backend = "kernel" if kernel_support().ok else "memory"
    with tempfile.TemporaryDirectory(prefix=f"statewright-cluster-bench-{os.getpid()}-") as tmp:
        kubeconfig = str(Path(tmp) / "kubeconfig")
        proc = ctx.Process(target=_server, args=(child, kubeconfig), daemon=True)
        proc.start()
        agent: Agent | None = None
        try:
            assert parent.recv() == ("ready",)
            parent.send(("populate", n, e, ids))
            assert parent.recv() == ("ok",)
            agent = Agent(kubeconfig, backend, 1)
            out["maps"] = agent.open_map()
            async with anyio.create_task_group() as tg:
                sync_s, entries, routes, sync_profile = await _sync(agent, tg, n, e)
                out["initial_sync_s"] = round(sync_s, 2)
                out.update(sync_profile)
                out["ipcache_entries"] = entries
                out["routes"] = routes
                out["rss_mb_after_sync"] = round(_rss_mb(), 1)
                # As the agent once the initial state is in: the loaded objects out of the
                # collector's passes, the steady-state thresholds, timed young passes.
                freeze_loaded()
                steady_gc()
                tg.start_soon(collect_young_periodically)
                lat, stages = await _changes(agent, parent, n, e, ids, changes)
                for stage, xs in stages.items():
                    out[f"change_profile_{stage}_ms_p50"] = _pct(xs, 0.5)
                    out[f"change_profile_{stage}_ms_p99"] = _pct(xs, 0.99)
                out["remote_endpoint_change_p50_ms"] = _pct(lat, 0.5)
                out["remote_endpoint_change_p99_ms"] = _pct(lat, 0.99)
                out["remote_endpoint_change_max_ms"] = _pct(lat, 1.0)
                tg.cancel_scope.cancel()
            agree, objs = await _races(kubeconfig, backend, races)
            out["identity_agree_p50_ms"] = _pct(agree, 0.5)
            out["identity_agree_p99_ms"] = _pct(agree, 0.99)
            out["identity_agree_objects_avg"] = round(objs, 2)
            out["rss_mb"] = round(_rss_mb(), 1)
        finally:
            if agent is not None:
                agent.close()
            parent.send(("stop",))
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join()
    out["load_avg_1m"] = round(os.getloadavg()[0], 2)
    out["cpus"] = os.cpu_count()
    return out


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run, print the JSON object."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    p.add_argument("--quick", action="store_true", help="a smaller cluster (< 60 s)")
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--endpoints", type=int, default=50_000)
    p.add_argument("--identities", type=int, default=5000)
    p.add_argument("--changes", type=int, default=300)
    p.add_argument("--races", type=int, default=30)
    args = p.parse_args(argv)
    if args.quick:
        args.nodes, args.endpoints, args.identities = 200, 10_000, 1000
        args.changes, args.races = 100, 10
    t = time.monotonic()
    tune_gc()  # as `statewright agent` does at start
    result = anyio.run(run, args.nodes, args.endpoints, args.identities, args.changes,
                       args.races)
    result["elapsed_s"] = round(time.monotonic() - t, 1)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
