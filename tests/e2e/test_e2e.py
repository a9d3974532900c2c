"""The agent end to end: manifests written to its directory, the agent on kernel maps with
the socket LB on the test's cgroup, and clients in the test's namespace and cgroup that
connect to ClusterIP and NodePort addresses and reach backend servers (see harness.py).

Time bounds asserted here are generous (10 s) upper bounds; the measured figures are
printed in the "e2e timings" summary.
"""

from __future__ import annotations

import errno
import threading
import time
from collections import Counter
from typing import Any

import pytest

from tests.e2e.conftest import need_machine, record
from tests.e2e.harness import (
    BACKENDS,
    CLIENT_SOURCES,
    TERMINATING,
    E2EEnv,
    e2e_env,
    ident,
    ids,
    leftovers,
    service_manifest,
)

pytestmark = pytest.mark.kernel

#: Upper bound for a manifest change to take effect in the datapath.
BOUND = 10.0


def _all_ok(results: list[dict[str, Any]]) -> bool:
    return all("id" in r for r in results)


def _publish(env: E2EEnv, name: str, vip: str, port: int = 80, **kw: Any) -> None:
    """Write a service manifest and wait until connections to it succeed."""
    backends = kw.pop("backends")
    since = env.write(name, service_manifest(name, vip, backends, port=port, **kw))
    env.converge(vip, port, _all_ok, since, timeout=BOUND)


def test_clusterip_reaches_only_the_selected_backends_evenly(env: E2EEnv) -> None:
    selected = BACKENDS[:3]
    _publish(env, "spread", "10.96.60.1", backends=selected)
    results = env.client.tcp("10.96.60.1", 80, count=300)
    seen = Counter(ids(results))
    assert set(seen) == {ident(b) for b in selected}, seen
    # 100 expected each; fewer than 30 (10 %) is far below 1e-9 for a fair random pick.
    assert min(seen.values()) >= 30, seen
    assert {tuple(r["peer"]) for r in results} == {("10.96.60.1", 80)}


def test_nodeport_on_loopback_and_clusterip(env: E2EEnv) -> None:
    selected = BACKENDS[3:5]
    _publish(env, "np", "10.96.60.2", backends=selected, node_port=30081)
    since = time.monotonic()
    env.converge("127.0.0.1", 30081, _all_ok, since, timeout=BOUND)
    for host, port in (("127.0.0.1", 30081), ("10.96.60.2", 80)):
        results = env.client.tcp(host, port, count=60)
        seen = Counter(ids(results))
        assert set(seen) == {ident(b) for b in selected}, (host, seen)
        assert min(seen.values()) >= 10, (host, seen)
        assert {tuple(r["peer"]) for r in results} == {(host, port)}


def test_maglev_keeps_a_client_on_one_backend(env: E2EEnv) -> None:
    _publish(env, "maglev", "10.96.60.3", backends=BACKENDS[:4],
             annotations={"service.cilium.io/lb-algorithm": "maglev"})
    chosen = {}
    for src in CLIENT_SOURCES:
        seen = set(ids(env.client.tcp("10.96.60.3", 80, count=5, bind=src)))
        assert len(seen) == 1, (src, seen)
        chosen[src] = seen.pop()
    assert set(chosen.values()) <= {ident(b) for b in BACKENDS[:4]}
    # Twelve clients over four backends: all on one backend would mean no hashing at all.
    assert len(set(chosen.values())) > 1, chosen


def test_session_affinity_holds_within_its_timeout(env: E2EEnv) -> None:
    _publish(env, "affinity", "10.96.60.4", backends=BACKENDS[:3], affinity_timeout=60)
    first = set(ids(env.client.tcp("10.96.60.4", 80, count=30)))
    assert len(first) == 1, first
    time.sleep(1.5)  # idle, but well within the 60 s timeout
    assert set(ids(env.client.tcp("10.96.60.4", 80, count=20))) == first
    # Without affinity the same service spreads (the selection above was not luck).
    _publish(env, "affinity", "10.96.60.4", backends=BACKENDS[:3])
    since = time.monotonic()
    env.converge("10.96.60.4", 80, lambda r: len(set(ids(r))) > 1, since, timeout=BOUND,
                 batch=20)


def test_session_affinity_expires_after_its_timeout(env: E2EEnv) -> None:
    # The datapath counts whole seconds and an entry holds while last_used + timeout > now:
    # with a 2 s timeout a burst stays on one backend and a 3.1 s pause always expires it.
    _publish(env, "expiry", "10.96.60.9", backends=BACKENDS, affinity_timeout=2)
    picks = []
    for _ in range(6):
        burst = set(ids(env.client.tcp("10.96.60.9", 80, count=10)))
        assert len(burst) == 1, burst
        picks.append(burst.pop())
        if len(set(picks)) > 1:
            break
        time.sleep(3.1)
    # Six fresh random picks over six backends all equal: p = 6**-5, about 1e-4.
    assert len(set(picks)) > 1, picks


def test_backend_changes_and_deletion_take_effect_within_a_bound(env: E2EEnv) -> None:
    vip, name = "10.96.60.5", "changes"
    a, b, c, d = BACKENDS[:4]
    _publish(env, name, vip, backends=[a, b, c])

    def only(allowed: set[str]) -> Any:
        names = {ident(x) for x in allowed}
        return lambda r: _all_ok(r) and set(ids(r)) <= names

    def check_steady(allowed: set[str], count: int = 40) -> None:
        seen = set(ids(env.client.tcp(vip, 80, count=count)))
        assert seen == {ident(x) for x in allowed}, seen

    # Scale up: the new backend gets connections.
    since = env.write(name, service_manifest(name, vip, [a, b, c, d]))
    record("scale up 3->4: first connection to the new backend",
           env.converge(vip, 80, lambda r: _all_ok(r) and ident(d) in ids(r), since,
                        timeout=BOUND))
    check_steady({a, b, c, d}, count=80)

    # Scale down: removed backends get no new connections.
    since = env.write(name, service_manifest(name, vip, [a, b]))
    record("scale down 4->2: only the remaining backends",
           env.converge(vip, 80, only({a, b}), since, timeout=BOUND, batch=20))
    check_steady({a, b})

    # Terminating endpoint: no new connections while active ones exist.
    since = env.write(name, service_manifest(name, vip, [a, (b, TERMINATING)]))
    record("endpoint terminating: only active backends",
           env.converge(vip, 80, only({a}), since, timeout=BOUND, batch=20))
    check_steady({a}, count=20)

    # No endpoints: refused, as a load balancer without backends does.
    since = env.write(name, service_manifest(name, vip, []))
    refused = lambda r: [x.get("errno") for x in r] == [errno.ECONNREFUSED] * len(r)  # noqa: E731
    record("scale to zero: connections refused",
           env.converge(vip, 80, refused, since, timeout=BOUND, batch=3))

    # Delete the service: the address is unknown again and has no route in the namespace.
    _publish(env, name, vip, backends=[c])
    since = env.remove(name)
    unreachable = lambda r: [x.get("errno") for x in r] == [errno.ENETUNREACH] * len(r)  # noqa: E731
    record("service deleted: address unreachable",
           env.converge(vip, 80, unreachable, since, timeout=BOUND, batch=3))


def test_udp_request_response_comes_from_the_service_address(env: E2EEnv) -> None:
    selected = BACKENDS[:3]
    vip = "10.96.60.6"
    since = env.write("udp", service_manifest("udp", vip, selected, port=53, proto="UDP"))
    while True:
        probe = env.client.udp(vip, 53)
        if "id" in probe[0]:
            break
        assert time.monotonic() - since < BOUND, probe
    record("UDP service: first reply", time.monotonic() - since)
    names = {ident(b) for b in selected}
    results = env.client.udp(vip, 53, count=60)
    assert set(ids(results)) == names
    assert {tuple(r["src"]) for r in results} == {(vip, 53)}
    connected = env.client.udp(vip, 53, count=10, connected=True)
    assert set(ids(connected)) <= names
    assert {tuple(r["peer"]) for r in connected} == {(vip, 53)}
    assert {tuple(r["src"]) for r in connected} == {(vip, 53)}


def test_agent_sigkill_and_restart_lose_no_connection(env: E2EEnv) -> None:
    vip, selected = "10.96.60.7", BACKENDS[1:4]
    _publish(env, "steady", vip, backends=selected, node_port=30082)
    _publish(env, "moving", "10.96.60.8", backends=[BACKENDS[0]])
    loader = env.new_client()
    stop = threading.Event()
    batches: list[tuple[float, list[dict[str, Any]]]] = []
    failure: list[BaseException] = []

    def keep_connecting() -> None:
        try:
            while not stop.is_set():
                for host, port in ((vip, 80), ("127.0.0.1", 30082)):
                    batches.append((time.monotonic(), loader.tcp(host, port, count=10)))
        except BaseException as exc:  # reported by the test below
            failure.append(exc)

    worker = threading.Thread(target=keep_connecting, daemon=True)
    worker.start()
    try:
        time.sleep(0.5)
        killed = time.monotonic()
        env.agent.kill()
        # While the agent is down the pinned datapath keeps serving; change another service.
        env.write("moving", service_manifest("moving", "10.96.60.8", [BACKENDS[5]]))
        time.sleep(1.0)
        env.agent.start()
        restarted = time.monotonic()
        record("agent restart after SIGKILL: API answering", restarted - killed)
        since = time.monotonic()
        record("change made while the agent was down: applied after restart",
               env.converge("10.96.60.8", 80,
                            lambda r: _all_ok(r) and set(ids(r)) == {ident(BACKENDS[5])},
                            since, timeout=BOUND))
        time.sleep(0.5)
    finally:
        stop.set()
        worker.join(timeout=30)
    assert not failure, failure
    results = [r for _, batch in batches for r in batch]
    during = sum(len(b) for t, b in batches if killed <= t <= restarted)
    failed = [r for r in results if "errno" in r]
    print(f"e2e: {len(results)} connections across the restart ({during} while the agent "
          f"was down), {len(failed)} failed")
    assert during > 0, "no connection was made while the agent was down"
    assert not failed, failed[:5]
    assert set(ids(results)) == {ident(b) for b in selected}
    assert "Traceback" not in env.agent.logs()


def test_everything_is_removed_afterwards_also_on_failure() -> None:
    need_machine()

    class Boom(Exception):
        pass

    created = None
    with pytest.raises(Boom), e2e_env() as e:
        created = e
        _publish(e, "doomed", "10.96.61.1", backends=BACKENDS[:2], node_port=30083)
        assert ids(e.client.tcp("10.96.61.1", 80, count=3))
        e.agent.kill()  # even with the agent gone, not stopped gracefully
        raise Boom
    assert created is not None
    assert leftovers(created) == []
