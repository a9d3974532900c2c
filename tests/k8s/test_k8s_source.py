"""The Kubernetes source against the fake API server: sync, changes, relists, faults.

These run on the LB tables alone (no maps); tests/k8s/test_scenarios.py adds the maps.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
import trustme

from sources.k8s_client import ClientSettings
from sources.k8s_reflector import BACKING_OFF, WATCHING

from .fake_apiserver import FakeAPIServer
from .helpers import NODE, running_source, wait_for
from .objects import endpoint_slice, node, pod, service

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _populate(srv: FakeAPIServer, n: int = 5) -> None:
    for i in range(n):
        srv.upsert(service(f"s{i}", f"10.96.0.{i + 1}"))
        srv.upsert(endpoint_slice(f"s{i}", [f"10.244.0.{i + 1}"]))
    srv.upsert(node(NODE, {"topology.kubernetes.io/zone": "zone-a"}))


async def test_initial_sync_then_live_changes(apiserver: FakeAPIServer, kubeconfig: str) -> None:
    _populate(apiserver)
    apiserver.upsert(pod("hp", NODE, "10.244.9.9", 8081))
    apiserver.upsert(pod("elsewhere", "node-b", "10.244.9.8", 8082))
    async with running_source(ClientSettings(kubeconfig=kubeconfig)) as r:
        await wait_for(lambda: r.source.synced, "initial sync")
        assert r.initialized()
        assert r.services() == [
            "default/hp:host-port:8081:uid-hp",
            *[f"default/s{i}" for i in range(5)],
        ]
        assert r.backends("default/s3") == ["10.244.0.4:8080/TCP"]
        assert r.writer.node_labels == {"topology.kubernetes.io/zone": "zone-a"}
        # Every list was paginated (page size 2): services took three pages.
        pages = [q for q in apiserver.requests if q.resource == "services" and q.verb == "list"]
        assert len(pages) == 3 and "continue" in pages[1].query
        # Live changes.
        apiserver.upsert(service("new", "10.96.1.1"))
        apiserver.upsert(endpoint_slice("new", ["10.244.1.1", "10.244.1.2"]))
        apiserver.upsert(endpoint_slice("s0", ["10.244.0.99"]))
        apiserver.delete("Service", "default", "s1")
        apiserver.delete("Pod", "default", "hp")
        apiserver.upsert(node(NODE, {"topology.kubernetes.io/zone": "zone-b"}))
        await wait_for(
            lambda: (
                r.backends("default/new") == ["10.244.1.1:8080/TCP", "10.244.1.2:8080/TCP"]
                and "default/s1" not in r.services()
                and r.backends("default/s0") == ["10.244.0.99:8080/TCP"]
                and not any("host-port" in s for s in r.services())
                and r.writer.node_zone == "zone-b"
            ),
            "live changes",
        )
        assert all(ok for _, ok, _ in r.source.health())
        assert {h.state for h in (x.health for x in r.source.reflectors)} == {WATCHING}
        # Every watch asked for bookmarks and started from its list's version.
        watches = [q for q in apiserver.requests if q.verb == "watch"]
        assert watches and all(q.query.get("allowWatchBookmarks") == "true" for q in watches)
        assert all(q.query.get("resourceVersion") for q in watches)
        assert {q.query.get("fieldSelector") for q in watches if q.resource == "pods"} == {
            f"spec.nodeName={NODE}"
        }


async def test_initializer_waits_for_every_list(apiserver: FakeAPIServer, kubeconfig: str) -> None:
    _populate(apiserver, 2)
    apiserver.fail_next(500, count=10_000, match="/api/v1/nodes")
    async with running_source(ClientSettings(kubeconfig=kubeconfig)) as r:
        await wait_for(lambda: len(r.services()) == 2, "services applied")
        nodes = next(x for x in r.source.reflectors if x.name == "nodes")
        await wait_for(lambda: nodes.health.state == BACKING_OFF, "nodes backing off")
        # Services are in, but the node is not: pruning must not start yet.
        assert not r.initialized() and not r.source.synced
        health = dict((n, (ok, msg)) for n, ok, msg in r.source.health())
        assert health["nodes"][0] is False and "HTTP 500" in health["nodes"][1]
        apiserver.clear_faults()
        await wait_for(lambda: r.source.synced, "initial sync")
        assert r.initialized()


async def test_relist_after_410_applies_only_the_difference(
    apiserver: FakeAPIServer, kubeconfig: str
) -> None:
    _populate(apiserver)
    async with running_source(ClientSettings(kubeconfig=kubeconfig)) as r:
        await wait_for(lambda: r.source.synced, "initial sync")
        before = {f.service_name: rev for f, rev in r.writer.frontends.revisions(r.db.read_txn())}
        # The watches go down and stay down while the cluster changes and compacts.
        apiserver.fail_next(503, count=10_000, match="watch=true")
        apiserver.drop_watches()
        services = next(x for x in r.source.reflectors if x.name == "services")
        await wait_for(lambda: services.health.state == BACKING_OFF, "watch down")
        apiserver.delete("Service", "default", "s1")
        apiserver.upsert(service("s2", "10.96.2.2"))
        apiserver.expire()
        apiserver.clear_faults()
        await wait_for(
            lambda: "default/s1" not in r.services() and "10.96.2.2:80/TCP" in r.frontends(),
            "relist applied",
        )
        assert services.health.lists == 2
        after = {f.service_name: rev for f, rev in r.writer.frontends.revisions(r.db.read_txn())}
        # Unchanged services' frontends were not written again.
        for name in ("default/s0", "default/s3", "default/s4"):
            assert after[name] == before[name], name
        assert "default/s1" not in after
        # A relisting reflector never emptied the table: s0 stayed throughout (checked
        # by revision above, a row deleted and re-added would have a new one).


async def test_bad_object_gets_its_own_error(apiserver: FakeAPIServer, kubeconfig: str) -> None:
    _populate(apiserver, 3)
    bad = service("bad", "10.96.0.200")
    bad["spec"]["ports"][0]["port"] = 70000
    apiserver.upsert(bad)
    # The same frontend as s0 (listed after it): a conflict, refused for this one only.
    apiserver.upsert(service("zz-dup", "10.96.0.1"))
    async with running_source(ClientSettings(kubeconfig=kubeconfig)) as r:
        await wait_for(lambda: r.source.synced, "initial sync")
        assert r.services() == ["default/s0", "default/s1", "default/s2"]
        assert set(r.source.errors) == {"Service default/bad", "Service default/zz-dup"}
        assert "spec.ports[0].port" in r.source.errors["Service default/bad"]
        health = {n: (ok, msg) for n, ok, msg in r.source.health()}
        assert health["objects"][0] is False and "2 object(s) refused" in health["objects"][1]
        fixed = service("bad", "10.96.0.200")
        apiserver.upsert(fixed)
        await wait_for(lambda: "default/bad" in r.services(), "fixed object applied")
        assert set(r.source.errors) == {"Service default/zz-dup"}


async def test_retry_after_is_honoured(apiserver: FakeAPIServer, kubeconfig: str) -> None:
    _populate(apiserver, 1)
    apiserver.fail_next(429, retry_after=1, match="/api/v1/services")
    async with running_source(ClientSettings(kubeconfig=kubeconfig)) as r:
        await wait_for(lambda: r.source.synced, "initial sync")
        reqs = [q for q in apiserver.requests if q.resource == "services"]
        assert reqs[0].status == 429 and reqs[1].status == 200
        # The second request waited at least the Retry-After (a lower bound: cannot flake).
        assert reqs[1].time - reqs[0].time >= 1.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_unreachable_at_start_then_recovers(tmp_path: Path) -> None:
    ca = trustme.CA()
    port = _free_port()
    later = FakeAPIServer(ca=ca, port=port)  # bound, not serving yet
    later.stop()  # release the port: connections are refused
    srv = FakeAPIServer(ca=ca, port=port, token=later.token)
    kubeconfig = srv.write_kubeconfig(tmp_path / "kc")
    srv.stop()
    _populate(srv, 2)
    try:
        async with running_source(ClientSettings(kubeconfig=kubeconfig)) as r:
            services = next(x for x in r.source.reflectors if x.name == "services")
            await wait_for(lambda: services.health.state == BACKING_OFF, "backing off")
            health = {n: (ok, msg) for n, ok, msg in r.source.health()}
            ok, msg = health["services"]
            assert not ok and "not synced" in msg and "refused" in msg.lower()
            # Since when, and the last error, in the API's view too.
            assert "backing off (not synced); since " in msg
            assert services.health.error_since > 0 and services.health.last_error
            assert not r.initialized()
            srv = FakeAPIServer(ca=ca, port=port, token=later.token)
            _populate(srv, 2)
            srv.start()
            await wait_for(lambda: r.source.synced, "sync after the server came up")
            assert r.services() == ["default/s0", "default/s1"]
            assert all(ok for _, ok, _ in r.source.health())
    finally:
        srv.stop()


async def test_in_cluster_token_rotation(apiserver: FakeAPIServer, tmp_path: Path) -> None:
    _populate(apiserver, 1)
    token = tmp_path / "token"
    ca = tmp_path / "ca.crt"
    token.write_text(apiserver.token)
    ca.write_bytes(apiserver.ca_pem)
    settings = ClientSettings(
        in_cluster=True,
        token_file=str(token),
        ca_file=str(ca),
        environ={
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(apiserver.port),
        },
    )
    async with running_source(settings) as r:
        await wait_for(lambda: r.source.synced, "initial sync")
        # The server rotates the token; open watches are cut, new requests get 401 ...
        new = apiserver.rotate_token()
        apiserver.drop_watches()
        services = next(x for x in r.source.reflectors if x.name == "services")
        await wait_for(lambda: "401" in services.health.last_error, "401 seen")
        # ... until the kubelet writes the new token into the file.
        tmp = tmp_path / "token.new"
        tmp.write_text(new)
        tmp.replace(token)
        apiserver.upsert(service("after", "10.96.5.5"))
        await wait_for(lambda: "default/after" in r.services(), "changes after rotation")
        assert any(q.token == new and q.status == 200 for q in apiserver.requests)


async def test_stalled_watch_is_restarted(apiserver: FakeAPIServer, kubeconfig: str) -> None:
    _populate(apiserver, 1)
    async with running_source(ClientSettings(kubeconfig=kubeconfig)) as r:
        await wait_for(lambda: r.source.synced, "initial sync")
        services = next(x for x in r.source.reflectors if x.name == "services")
        watches = services.health.watches
        apiserver.stall_watches()
        apiserver.upsert(service("during", "10.96.6.6"))
        # Nothing arrives on the stalled stream (not even bookmarks); after the stall
        # timeout (1 s here) the reflector restarts the watch, which replays the change.
        await wait_for(lambda: "default/during" in r.services(), "change after restart")
        assert services.health.watches > watches
        assert services.health.lists == 1  # a restart, not a relist


async def test_refused_pod_leaves_nothing_behind(apiserver: FakeAPIServer, kubeconfig: str) -> None:
    _populate(apiserver, 1)
    apiserver.upsert(pod("a", NODE, "10.244.9.1", 8081))
    # Pod b's first host port is free, its second is pod a's: b is refused as a whole,
    # after its first host-port service was written (the batch is written again).
    b = pod("b", NODE, "10.244.9.2", 9000)
    b["spec"]["containers"][0]["ports"].append(
        {"containerPort": 8081, "hostPort": 8081, "protocol": "TCP"}
    )
    apiserver.upsert(b)
    async with running_source(ClientSettings(kubeconfig=kubeconfig)) as r:
        await wait_for(lambda: r.source.synced, "initial sync")
        assert r.services() == ["default/a:host-port:8081:uid-a", "default/s0"]
        assert set(r.source.errors) == {"Pod default/b"}
        assert "0.0.0.0:8081/TCP" in r.frontends() and "0.0.0.0:9000/TCP" not in r.frontends()


async def test_expired_continue_token_restarts_the_list(
    apiserver: FakeAPIServer, kubeconfig: str
) -> None:
    _populate(apiserver, 5)
    # The first continued page (services' or endpoint slices') finds its token expired.
    apiserver.fail_next(410, match="continue=")
    async with running_source(ClientSettings(kubeconfig=kubeconfig)) as r:
        await wait_for(lambda: r.source.synced, "initial sync")
        assert r.services() == [f"default/s{i}" for i in range(5)]
        lists = [
            (q.status, "continue" in q.query)
            for q in apiserver.requests
            if q.verb == "list" and q.resource in ("services", "endpointslices")
        ]
        assert (410, True) in lists
        services = next(x for x in r.source.reflectors if x.name == "services")
        slices = next(x for x in r.source.reflectors if x.name == "endpointslices")
        assert services.health.lists + slices.health.lists == 2  # each completed once


async def test_wait_applied_makes_changes_synchronous(
    apiserver: FakeAPIServer, kubeconfig: str
) -> None:
    """What a conformance runner needs: change the server, wait, look at the tables."""
    async with running_source(ClientSettings(kubeconfig=kubeconfig)) as r:
        await wait_for(lambda: r.source.synced, "initial sync")
        for i in range(5):
            stored = apiserver.upsert(service(f"w{i}", f"10.96.7.{i + 1}"))
            with anyio.fail_after(20):
                await r.source.wait_applied("services", stored["metadata"]["resourceVersion"])
            assert f"default/w{i}" in r.services()
        rv = apiserver.delete("Service", "default", "w0")
        with anyio.fail_after(20):
            await r.source.wait_applied("services", rv)
        assert "default/w0" not in r.services()


async def test_watch_refused_with_410_relists_without_spinning(
    apiserver: FakeAPIServer, kubeconfig: str
) -> None:
    _populate(apiserver, 1)
    # Every watch of services is refused with 410 (as a status, not an event) 3 times.
    apiserver.fail_next(410, count=3, match="/api/v1/services?allowWatchBookmarks")
    async with running_source(ClientSettings(kubeconfig=kubeconfig)) as r:
        await wait_for(lambda: r.source.synced, "initial sync")
        services = next(x for x in r.source.reflectors if x.name == "services")
        await wait_for(lambda: services.health.lists == 4, "relisted after each 410")
        await wait_for(lambda: services.health.state == WATCHING, "watching at last")
        reqs = [q for q in apiserver.requests if q.resource == "services"]
        # list, watch (410), list, watch (410), ...: a relist follows each refusal.
        refused = [q for q in reqs if q.verb == "watch" and q.status == 410]
        assert len(refused) == 3
        relists = [q for q in reqs if q.verb == "list"][1:]
        assert all(b.time > a.time for a, b in zip(refused, relists))


async def test_conflicting_service_applies_once_the_address_is_free(
    apiserver: FakeAPIServer, kubeconfig: str
) -> None:
    apiserver.upsert(service("a", "10.96.0.1"))
    apiserver.upsert(service("b", "10.96.0.1"))  # the same frontend: refused
    async with running_source(ClientSettings(kubeconfig=kubeconfig)) as r:
        await wait_for(lambda: r.source.synced, "initial sync")
        assert r.frontends() == {"10.96.0.1:80/TCP": "default/a"}
        assert set(r.source.errors) == {"Service default/b"}
        apiserver.delete("Service", "default", "a")
        await wait_for(
            lambda: r.frontends() == {"10.96.0.1:80/TCP": "default/b"}, "b takes the address"
        )
        assert not r.source.errors


async def test_watch_resumes_from_the_last_bookmark(
    apiserver: FakeAPIServer, kubeconfig: str
) -> None:
    """A bookmark moves the reflector's resourceVersion: a watch cut after it resumes from
    the bookmark's version (not the list's), without a relist."""
    _populate(apiserver, 1)
    async with running_source(ClientSettings(kubeconfig=kubeconfig)) as r:
        await wait_for(lambda: r.source.synced, "initial sync")
        pods = next(x for x in r.source.reflectors if x.name == "pods")
        await wait_for(lambda: pods.health.state == WATCHING, "watching")
        listed = int(pods.health.resource_version)
        # Changes the pods watch does not see (another node's pod, a service) move the
        # server's version; only a bookmark tells the pods reflector about it.
        apiserver.upsert(pod("elsewhere", "node-b", "10.244.9.8", 8082))
        apiserver.upsert(service("other", "10.96.7.7"))
        now = apiserver.resource_version
        assert now > listed
        apiserver.send_bookmarks()
        await wait_for(lambda: int(pods.health.resource_version) == now, "bookmark seen")
        apiserver.drop_watches()
        await wait_for(
            lambda: any(
                q.resource == "pods"
                and q.verb == "watch"
                and q.query.get("resourceVersion") == str(now)
                for q in apiserver.requests
            ),
            "a watch from the bookmark's version",
        )
        assert pods.health.lists == 1


def test_backoff_is_exponential_jittered_and_capped() -> None:
    """Delays double from backoff_initial up to backoff_max, each multiplied by a random
    factor in [1, 1 + jitter); a Retry-After replaces it (capped at max_retry_after)."""
    import random

    from sources.k8s_http import K8sApiError
    from sources.k8s_reflector import Reflector, ReflectorConfig
    from sources.k8s_source import resource_specs

    cfg = ReflectorConfig(backoff_initial=0.5, backoff_max=4.0, jitter=0.5, max_retry_after=10)

    async def deliver(*_: object) -> None:
        return None

    refl = Reflector(None, resource_specs(NODE)[0], deliver, cfg, rng=random.Random(7))  # type: ignore[arg-type]
    delays = [refl._backoff(OSError("refused")) for _ in range(6)]
    for d, base in zip(delays, [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]):
        assert base <= d < base * 1.5
    assert len({round(d / b, 6) for d, b in zip(delays[3:], [4.0] * 3)}) == 3  # jittered
    too_many = K8sApiError("GET", "/api/v1/services", 429, "Too Many Requests", retry_after=3)
    assert refl._backoff(too_many) == 3.0
    too_many.retry_after = 3600
    assert refl._backoff(too_many) == 10.0


async def test_batches_are_bounded_in_size_and_merge_deliveries(
    apiserver: FakeAPIServer, kubeconfig: str
) -> None:
    """A batch holds at most ``sync_batch_size`` changes during the initial sync (a
    delivery that crosses the bound, a list page of 2 here, is split across batches), and
    deliveries arriving within ``batch_delay`` of the first share one write transaction."""
    from sources.k8s_client import K8sClient
    from sources.k8s_source import K8sSource, SourceConfig
    from statedb import DB
    from tables.lb_writer import LBWriter

    from .helpers import FAST

    _populate(apiserver, 10)
    db = DB()
    writer = LBWriter.create(db)
    sizes: list[int] = []
    client = K8sClient(ClientSettings(kubeconfig=kubeconfig))
    source = K8sSource(
        writer,
        client,
        node_name=NODE,
        config=SourceConfig(batch_size=3, sync_batch_size=3, batch_delay=0.5, reflector=FAST),
        on_applied=lambda deltas, _t: sizes.append(len(deltas)),
    )
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(source.run)
            await wait_for(lambda: source.synced, "initial sync")
            tg.cancel_scope.cancel()
    finally:
        client.close()
    assert sum(sizes) == 21  # 10 services, 10 slices, the node
    assert max(sizes) <= 3
    assert max(sizes) > FAST.page_size  # deliveries were merged


def test_coalesce_keeps_the_last_change_per_object() -> None:
    """One change per object (resource and name): the last, in the place of the first;
    other objects keep their order; a deletion replaced by an upsert is remembered."""
    import random

    from sources.k8s_reflector import Delta, Reflector
    from sources.k8s_source import coalesce, resource_specs

    async def deliver(*_: object) -> None:
        return None

    services, slices = (
        Reflector(None, spec, deliver, rng=random.Random(1))  # type: ignore[arg-type]
        for spec in resource_specs(NODE)[:2]
    )
    a_del = Delta("delete", "default/a", service("a", "10.96.0.1"))
    b_add = Delta("upsert", "default/b", service("b", "10.96.0.1"))
    a_add = Delta("upsert", "default/a", service("a", "10.96.0.2"))
    a_slice = Delta("upsert", "default/a", endpoint_slice("a", ["10.244.0.1"]))
    c_add = Delta("upsert", "default/c", service("c", "10.96.0.3"))
    c_del = Delta("delete", "default/c", service("c", "10.96.0.3"))
    out, deleted = coalesce(
        [
            (services, a_del),
            (services, b_add),
            (slices, a_slice),  # another resource: another object
            (services, a_add),
            (services, c_add),
            (services, c_del),
        ]
    )
    assert [(r.name, d) for r, d in out] == [
        ("services", a_add),
        ("services", b_add),
        ("endpointslices", a_slice),
        ("services", c_del),
    ]
    assert deleted == {0: a_del}
    # delete, upsert, delete: the deletion stands and nothing falls back.
    out, deleted = coalesce([(services, a_del), (services, a_add), (services, a_del)])
    assert [d for _, d in out] == [a_del] and deleted == {}


async def test_delete_and_add_held_together_are_one_upsert(
    apiserver: FakeAPIServer, kubeconfig: str
) -> None:
    """A Pod recreated under its name (new UID, same host port) delivered together with
    its deletion: one batch, one change, and the new HostPort service owns the frontend
    with no error (its predecessor let go of it in the same transaction)."""
    first = pod("app", NODE, "10.244.9.1", 4444)
    apiserver.upsert(first)
    async with running_source(ClientSettings(kubeconfig=kubeconfig)) as r:
        await wait_for(lambda: r.source.synced, "initial sync")
        assert r.frontends() == {"0.0.0.0:4444/TCP": "default/app:host-port:4444:uid-app"}
        batches, applied = r.source.batches, r.source.applied
        second = pod("app", NODE, "10.244.9.1", 4444)
        second["metadata"]["uid"] = "uid-app-2"
        with r.source.holding():
            apiserver.delete("Pod", "default", "app")
            stored = apiserver.upsert(second)
            rv = stored["metadata"]["resourceVersion"]
            with anyio.fail_after(20):
                await r.source.wait_received("pods", rv)
            assert r.source.batches == batches  # held: nothing written yet
        with anyio.fail_after(20):
            await r.source.wait_applied("pods", rv)
        assert (r.source.batches, r.source.applied) == (batches + 1, applied + 1)
        assert r.frontends() == {"0.0.0.0:4444/TCP": "default/app:host-port:4444:uid-app-2"}
        assert r.services() == ["default/app:host-port:4444:uid-app-2"]
        assert r.backends("default/app:host-port:4444:uid-app-2") == ["10.244.9.1:8080/TCP"]
        assert not r.source.errors


async def test_refused_upsert_after_a_delete_still_deletes(
    apiserver: FakeAPIServer, kubeconfig: str
) -> None:
    """A Service deleted and re-created invalid in one batch: the new one is refused with
    its error, and the old one is gone all the same (the API server deleted it)."""
    apiserver.upsert(service("a", "10.96.0.1"))
    apiserver.upsert(service("b", "10.96.0.2"))
    async with running_source(ClientSettings(kubeconfig=kubeconfig)) as r:
        await wait_for(lambda: r.source.synced, "initial sync")
        with r.source.holding():
            apiserver.delete("Service", "default", "a")
            stored = apiserver.upsert(service("a", "10.96.0.300"))
            rv = stored["metadata"]["resourceVersion"]
            with anyio.fail_after(20):
                await r.source.wait_received("services", rv)
        with anyio.fail_after(20):
            await r.source.wait_applied("services", rv)
        assert r.services() == ["default/b"]
        assert set(r.source.errors) == {"Service default/a"}
        assert "10.96.0.300" in r.source.errors["Service default/a"]
        # Fixed: applies like any other change, and the error goes.
        stored = apiserver.upsert(service("a", "10.96.0.3"))
        with anyio.fail_after(20):
            await r.source.wait_applied("services", stored["metadata"]["resourceVersion"])
        assert r.services() == ["default/a", "default/b"] and not r.source.errors


def test_a_watch_backlog_is_decoded_and_delivered_in_bounded_batches() -> None:
    """Thousands of events read at once (a watch that fell behind) are decoded and
    delivered `DECODE_BATCH` at a time with the loop free in between, in order, and a bad
    line still ends the stream after everything before it was delivered."""
    import json as _json

    from sources.k8s_namespaces import namespace_resource_spec
    from sources.k8s_reflector import DECODE_BATCH, Reflector, StreamError

    batches: list[list[str]] = []

    async def deliver(_r: object, deltas: list, _synced: bool) -> None:
        batches.append([d.key for d in deltas])

    events = [
        _json.dumps(
            {
                "type": "ADDED",
                "object": {"metadata": {"name": f"ns-{i}", "resourceVersion": str(i + 1)}},
            }
        ).encode()
        for i in range(5 * DECODE_BATCH + 3)
    ]
    ticks = 0

    async def main() -> Exception | None:
        nonlocal ticks
        reflector = Reflector(None, namespace_resource_spec(), deliver)  # type: ignore[arg-type]

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await anyio.lowlevel.checkpoint()
                ticks += 1

        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            await anyio.lowlevel.checkpoint()
            bad = await reflector._decode_and_deliver([*events, b"not json", events[0]])
            tg.cancel_scope.cancel()
        return bad

    bad = anyio.run(main)
    assert isinstance(bad, StreamError)
    assert max(len(b) for b in batches) <= DECODE_BATCH
    assert [k for b in batches for k in b] == [f"ns-{i}" for i in range(len(events))]
    assert ticks >= 5  # the loop ran other tasks between the batches


async def test_initial_services_are_applied_after_their_endpoint_slices(
    apiserver: FakeAPIServer, kubeconfig: str
) -> None:
    """The first list of Services is delivered after the EndpointSlices' list (three pages
    each here), so each frontend is written once, with its backends, rather than first
    without them and again when its slice arrives."""
    _populate(apiserver)
    kinds: list[str] = []
    async with running_source(ClientSettings(kubeconfig=kubeconfig)) as r:
        r.source.on_applied = lambda deltas, _t: kinds.extend(d.obj["kind"] for d in deltas)
        await wait_for(lambda: r.source.synced, "initial sync")
        assert r.backends("default/s3") == ["10.244.0.4:8080/TCP"]
        txn = r.db.read_txn()
        # Each frontend was last written with its service row (and its backends): the
        # slices applied later would have written it again.
        service_rev = {s.name: rev for s, rev in r.writer.services.revisions(txn)}
        fronts = list(r.writer.frontends.revisions(txn))
        assert len(fronts) == 5
        assert all(rev == service_rev[f.service_name] and f.backends for f, rev in fronts)
    services = [i for i, k in enumerate(kinds) if k == "Service"]
    slices = [i for i, k in enumerate(kinds) if k == "EndpointSlice"]
    assert len(services) == len(slices) == 5
    assert max(slices) < min(services)


async def test_services_do_not_wait_for_a_failing_endpoint_slice_list(
    apiserver: FakeAPIServer, kubeconfig: str
) -> None:
    """The Services' list waits for the EndpointSlices' only while that one makes progress:
    a failing slice list (backing off) lets the Services in, and the slices follow."""
    _populate(apiserver, 2)
    apiserver.fail_next(500, count=10_000, match="endpointslices")
    async with running_source(ClientSettings(kubeconfig=kubeconfig)) as r:
        await wait_for(lambda: r.services() == ["default/s0", "default/s1"], "services")
        slices = next(x for x in r.source.reflectors if x.name == "endpointslices")
        # It alternates between listing and backing off: look until it is seen waiting.
        await wait_for(lambda: slices.health.state == BACKING_OFF, "slices backing off")
        assert not slices.health.synced and "injected fault 500" in slices.health.last_error
        apiserver.clear_faults()
        await wait_for(lambda: r.source.synced, "initial sync")
        assert r.backends("default/s1") == ["10.244.0.2:8080/TCP"]


def test_resource_versions_are_kept_as_numbers_when_they_are_ones() -> None:
    """The reflector's store keeps a decimal resourceVersion as an int (half the bytes);
    anything else as the string, so different versions never compare equal."""
    from sources.k8s_reflector import _version

    assert _version("12345") == 12345 and _version("0") == 0
    for opaque in ("0123", "12a", "", "\uff11\uff12", "-1", "1.0"):
        assert _version(opaque) == opaque
    assert _version("0123") != _version("123")


async def test_next_list_page_is_requested_while_a_page_is_applied(
    apiserver: FakeAPIServer, kubeconfig: str
) -> None:
    """A list's next page is requested before its current page is delivered, so the
    request overlaps the applier's work on the page: while the first page of slices is
    being applied (the applier held here in the event loop's thread), the server has
    already seen the request for the second. Pages as large as the applier's batch: the
    applier then writes a page at once, without yielding to wait for more."""
    _populate(apiserver)

    def slice_pages_requested() -> int:
        return sum(
            1
            for q in apiserver.requests
            if q.verb == "list" and q.resource == "endpointslices" and q.status == 200
        )

    seen_while_applying: list[int] = []

    def applied(deltas: list[Any], _t: float) -> None:
        if not seen_while_applying and deltas and deltas[0].obj["kind"] == "EndpointSlice":
            deadline = time.monotonic() + 10.0
            while slice_pages_requested() < 2 and time.monotonic() < deadline:
                time.sleep(0.01)  # blocks the event loop, as a long batch does
            seen_while_applying.append(slice_pages_requested())

    async with running_source(ClientSettings(kubeconfig=kubeconfig), sync_batch_size=2) as r:
        r.source.on_applied = applied
        await wait_for(lambda: r.source.synced, "initial sync")
        assert r.services() == [f"default/s{i}" for i in range(5)]
    assert seen_while_applying == [2]
