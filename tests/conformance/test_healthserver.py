"""The service health-check server through the corpus runner, with scripts of our own.

healthserver.txtar stops early at a comparison that contradicts the rest of the corpus
(KNOWN_CONFLICTS in test_corpus.py); these scripts check what follows it there and a
bit more: the HTTP answers (200 with local endpoints, 503 without), moving the port,
traffic policy Cluster and a removed port stopping the listener, the synthetic
``:healthserver`` service on the LoadBalancer VIP, and the health rows. The server binds
the harness' loopback address ``$HEALTHADDR`` only.
"""

from __future__ import annotations

from pathlib import Path

from statewright.lb_healthserver import HealthResponse
from tests.conformance.corpus import make_engine, run_file
from tests.conformance.lbcmds import health_server_address

SCRIPT = """\
#! --lb-test-fault-probability=0.0 --bpf-lb-enable-wildcard-entries=false

db/insert node-addresses node.yaml
hive start
db/initialized

db/cmp --grep=^loadbalancer.healthserver health idle.table
k8s/add slice.yaml svc.yaml
db/cmp frontends frontends.table
db/cmp --grep=^loadbalancer.healthserver health serving.table

# A retry re-runs its section (from the last blank line): only the request.
* http/get http://$HEALTHADDR:41000 got.txt
cmp ok.expected got.txt

# A new port: the old one stops answering.
replace 'healthCheckNodePort: 41000' 'healthCheckNodePort: 41001' svc.yaml
k8s/update svc.yaml
* http/get http://$HEALTHADDR:41001 got.txt
cmp ok.expected got.txt
!* http/get http://$HEALTHADDR:41000 got.txt

# No local endpoint left: 503.
replace 'nodeName: testnode' 'nodeName: elsewhere' slice.yaml
k8s/update slice.yaml
* http/get http://$HEALTHADDR:41001 got.txt
* cmp unavailable.expected got.txt

# Cluster traffic policy: no health server, no :healthserver service.
replace 'externalTrafficPolicy: Local' 'externalTrafficPolicy: Cluster' svc.yaml
replace 'internalTrafficPolicy: Local' 'internalTrafficPolicy: Cluster' svc.yaml
k8s/update svc.yaml
!* http/get http://$HEALTHADDR:41001 got.txt
db/cmp frontends frontends-cluster.table
db/cmp --grep=^loadbalancer.healthserver health idle.table

# Deleting everything leaves nothing behind.
k8s/delete svc.yaml slice.yaml
* db/empty services frontends backends
* lb/maps-empty

-- node.yaml --
addr: 1.1.1.1
nodeport: true
primary: true
devicename: test

-- idle.table --
Module                      Component           Level   Message
loadbalancer.healthserver   job-control-loop    OK      0 health servers running

-- serving.table --
Module                      Component           Level   Message
loadbalancer.healthserver   job-control-loop    OK      1 health servers running
loadbalancer.healthserver   job-listener-41000  OK      Running

-- frontends.table --
Address              Type         ServiceName         Backends
10.96.7.7:80/TCP     ClusterIP    ns/web              10.244.7.1:80/TCP, 10.244.7.2:80/TCP
172.16.7.7:80/TCP    LoadBalancer ns/web              10.244.7.1:80/TCP, 10.244.7.2:80/TCP
172.16.7.7:41000/TCP LoadBalancer ns/web:healthserver 1.1.1.1:41000/TCP/i

-- frontends-cluster.table --
Address              Type         ServiceName         Backends
10.96.7.7:80/TCP     ClusterIP    ns/web              10.244.7.1:80/TCP, 10.244.7.2:80/TCP
172.16.7.7:80/TCP    LoadBalancer ns/web              10.244.7.1:80/TCP, 10.244.7.2:80/TCP

-- ok.expected --
200 OK
Content-Length=63
Content-Type=application/json
Date=<omitted>
X-Content-Type-Options=nosniff
X-Load-Balancing-Endpoint-Weight=2
---
{"service":{"namespace":"ns","name":"web"},"localEndpoints":2}
-- unavailable.expected --
503 Service Unavailable
Content-Length=63
Content-Type=application/json
Date=<omitted>
X-Content-Type-Options=nosniff
X-Load-Balancing-Endpoint-Weight=0
---
{"service":{"namespace":"ns","name":"web"},"localEndpoints":0}
-- svc.yaml --
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: ns
spec:
  clusterIP: 10.96.7.7
  externalTrafficPolicy: Local
  internalTrafficPolicy: Local
  healthCheckNodePort: 41000
  allocateLoadBalancerNodePorts: false
  ports:
  - name: http
    port: 80
    protocol: TCP
  type: LoadBalancer
status:
  loadBalancer:
    ingress:
    - ip: 172.16.7.7

-- slice.yaml --
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: ns
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
endpoints:
- addresses:
  - 10.244.7.1
  nodeName: testnode
- addresses:
  - 10.244.7.2
  nodeName: testnode
ports:
- name: http
  port: 80
  protocol: TCP
"""



def test_health_server_script(tmp_path: Path, memory_root: str) -> None:
    """Listeners follow the services; answers count local active endpoints."""
    path = tmp_path / "health.txtar"
    path.write_text(SCRIPT)
    result = run_file(path, "memory", memory_root, make_engine())
    assert result.passed, result.describe()


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
