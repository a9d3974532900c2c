"""The service health-check server's pieces that healthserver.txtar does not show.

The corpus file drives the server end to end (answers, port moves, traffic policy, a
removed port); these tests pin the response format, the per-process loopback address the
harness binds (``$HEALTHADDR``) and the flags that enable the server.
"""

from __future__ import annotations

from statewright.lb_healthserver import HealthResponse
from tests.conformance.lbcmds import health_server_address


def test_response_format() -> None:
    """kube-proxy's body and headers; 503 without local endpoints."""
    ok = HealthResponse("ns/web", 2)
    assert ok.status == (200, "OK")
    assert ok.body() == b'{"service":{"namespace":"ns","name":"web"},"localEndpoints":2}\n'
    head = ok.http().split(b"\r\n\r\n", 1)[0].decode()
    assert "X-Load-Balancing-Endpoint-Weight: 2" in head
    assert f"Content-Length: {len(ok.body())}" in head
    assert HealthResponse("ns/web", 0).status == (503, "Service Unavailable")


def test_loopback_address_per_process() -> None:
    """The test address is loopback and differs between process ids."""
    a, b = health_server_address(1234), health_server_address(1234 + 256)
    assert a.startswith("127.") and b.startswith("127.") and a != b


def test_server_only_with_the_flag_and_kube_proxy_replacement() -> None:
    """As Cilium: --enable-health-check-nodeport (on by default) and kube-proxy replacement."""
    from statewright.loadbalancer import LoadBalancer
    from tables.lb_config import LBConfig

    def server(*flags: str) -> object:
        return LoadBalancer(LBConfig.from_flags(["--node-name=n", *flags])).health_server

    assert server() is not None
    assert server("--enable-health-check-nodeport=false") is None
    assert server("--kube-proxy-replacement=false") is None
