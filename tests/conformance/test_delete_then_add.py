"""``k8s/delete`` then ``k8s/add`` on consecutive lines reach the system as one batch.

Upstream's harness writes both to the fake clientset back to back and the reflector's
buffer coalesces them per object key, so a Pod recreated under its name with a new UID
(its HostPort service name includes the UID) is one upsert: the new service takes over
the frontend in one transaction, and the maps keep every id. A command between the two
lines lets the deletion reach the maps first, and the frontend comes back renumbered.
The script is our own (no corpus file); it runs on memory maps and, marked ``kernel``,
on pinned kernel maps.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance.corpus import make_engine, run_file

POD = """apiVersion: v1
kind: Pod
metadata:
  name: my-app
  namespace: default
  uid: {uid}
spec:
  nodeName: testnode
  containers:
  - name: my-app
    ports:
    - containerPort: 80
      hostPort: 4444
      protocol: TCP
status:
  phase: Running
  podIP: 10.244.1.113
  podIPs:
  - ip: 10.244.1.113
"""

FRONTENDS = """Address           Type      Status  ServiceName                          Backends
0.0.0.0:4444/TCP  HostPort  Done    default/my-app:host-port:4444:{uid}  10.244.1.113:80/TCP
"""

SCRIPT = """#! --lb-test-fault-probability=0.0
db/insert node-addresses addrv4.yaml
hive start
k8s/add pod1.yaml
db/cmp frontends frontends1.table
lb/maps-dump maps1.actual

# Consecutive lines (a comment between them changes nothing): one batch, same ids.
k8s/delete pod1.yaml
# the same pod, recreated
k8s/add pod2.yaml
db/cmp frontends frontends2.table
lb/maps-dump maps2.actual
cmp maps1.actual maps2.actual

# A command between them: the deletion is reconciled first, ids are renumbered.
k8s/delete pod2.yaml
db/empty frontends
k8s/add pod1.yaml
db/cmp frontends frontends1.table
lb/maps-dump maps3.actual
! cmp maps1.actual maps3.actual
grep 'REV: ID=3 ADDR=0.0.0.0:4444' maps3.actual
grep 'BE: ID=2 ADDR=10.244.1.113:80/TCP' maps3.actual

# Once more from the renumbered ids: the pair keeps them.
k8s/delete pod1.yaml
k8s/add pod2.yaml
* db/cmp frontends frontends2.table
lb/maps-dump maps4.actual
cmp maps3.actual maps4.actual

-- addrv4.yaml --
addr: 1.1.1.1
nodeport: true
primary: true
devicename: test
"""


def _archive(tmp_path: Path) -> Path:
    files = {
        "pod1.yaml": POD.format(uid="uid-1"),
        "pod2.yaml": POD.format(uid="uid-2"),
        "frontends1.table": FRONTENDS.format(uid="uid-1"),
        "frontends2.table": FRONTENDS.format(uid="uid-2"),
    }
    text = SCRIPT + "".join(f"\n-- {name} --\n{body}" for name, body in files.items())
    path = tmp_path / "delete-then-add.txtar"
    path.write_text(text)
    return path


def test_delete_then_add_memory(memory_root: str, tmp_path: Path) -> None:
    """One batch keeps the ids; a command between the lines renumbers (memory maps)."""
    result = run_file(_archive(tmp_path), "memory", memory_root, make_engine())
    assert result.passed, result.describe()


@pytest.mark.kernel
def test_delete_then_add_kernel(kernel_root: str, tmp_path: Path) -> None:
    """The same on pinned kernel maps."""
    result = run_file(_archive(tmp_path), "kernel", kernel_root, make_engine())
    assert result.passed, result.describe()
