"""The ``sysctl`` component against the kernel, only ever inside a network namespace the
test creates (the ``net.*`` settings are per namespace; `KernelProcSys` enters it in a
thread of its own): forwarding and rp_filter set there with their originals recorded, a
pod interface's settings, a missing interface named in the health, a restarted agent
that still knows the originals, ``agent --cleanup`` putting them back, and a cleanup run
from another namespace refusing to touch anything. The machine's own settings never
change (tests/conftest.py checks every test)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from statewright.agent.components.endpoints import (
    ENDPOINTS,
    EndpointsComponent,
    EndpointsConfig,
)
from statewright.agent.components.statedb import StateDBComponent
from statewright.agent.components.sysctl import SysctlComponent, SysctlConfig
from statewright.agent.config import AgentConfig
from statewright.agent.runtime import cleanup
from statewright.component import Hive
from statewright.sysctl_ops import ORIGINALS_FILE, KernelProcSys, SysctlStateError
from tables.endpoints import EndpointChange
from tests.endpoints.helpers import new_pin_dir, remove_pins
from tests.netlink.helpers import netns_names, unavailable

PROC_FWD = "/proc/sys/net/ipv4/ip_forward"


@pytest.fixture
def netns() -> Iterator[str]:
    """A fresh network namespace (forwarding off, as a new one has it), deleted after."""
    if shutil.which("ip") is None:
        unavailable("the ip tool (iproute2) is not installed")
    name = f"swsysctl-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if r.returncode != 0:
        unavailable(f"cannot create a network namespace: {r.stderr.strip()}")
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, text=True)
        assert name not in netns_names(), f"network namespace {name} was left behind"


def in_ns(ns: str, path: str) -> str:
    """A setting as a process inside ``ns`` reads it (independent of KernelProcSys)."""
    return subprocess.run(["ip", "netns", "exec", ns, "cat", f"/proc/sys/{path}"],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_kernel_procsys_writes_the_namespaces_settings_only(netns: str) -> None:
    procfs = KernelProcSys(netns)
    assert procfs.read("net/ipv4/ip_forward").strip() == "0"
    host = Path(PROC_FWD).read_text()
    procfs.write("net/ipv4/ip_forward", "1")
    assert in_ns(netns, "net/ipv4/ip_forward") == "1"
    assert Path(PROC_FWD).read_text() == host
    assert procfs.netns_id() != KernelProcSys().netns_id()
    with pytest.raises(FileNotFoundError):
        procfs.read("net/ipv4/conf/nosuchif/rp_filter")
    # a namespace that is not there is not a missing setting
    with pytest.raises(SysctlStateError, match="network namespace /var/run/netns/nope-"):
        KernelProcSys(f"nope-{netns}").read("net/ipv4/ip_forward")


def hive_of(state: str, pin_dir: str, netns: str) -> tuple[Hive, SysctlComponent]:
    comp = SysctlComponent(SysctlConfig(True, netns, state, (4, 6), refresh_interval=None))
    hive = Hive([StateDBComponent(),
                 EndpointsComponent(EndpointsConfig(("10.66.0.0/24", "fd00:66::/112"), state,
                                                    "memory", pin_dir)),
                 comp])
    return hive, comp


async def until(check: Any, what: str, timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while True:
            last = check()
            if last:
                return
            await anyio.sleep(0.02)


def test_agent_sets_restores_and_reports(netns: str) -> None:
    state = tempfile.mkdtemp(prefix=f"sw-sysctl-{os.getpid()}-")
    pin_dir = new_pin_dir("memory")
    try:
        subprocess.run(["ip", "-n", netns, "link", "add", "lxcsw1", "type", "veth", "peer",
                        "name", "lxcsw1p"], check=True)
        subprocess.run(["ip", "netns", "exec", netns, "sysctl", "-qw",
                        "net.ipv4.conf.all.rp_filter=1"], check=True)
        anyio.run(run_agent_twice, state, pin_dir, netns)
        record = json.loads((Path(state) / ORIGINALS_FILE).read_text())
        assert record["settings"]["net/ipv4/ip_forward"] == {"original": "0", "ours": "1"}
        # a cleanup from the machine's own namespace refuses: the record is of another
        cfg = AgentConfig(backend="memory", pin_dir=pin_dir, state_dir=state, sysctl=True,
                          api_socket=os.path.join(state, "agent.sock"))
        removed, errors = cleanup(cfg)
        assert any("sysctl" in e and "--sysctl-netns" in e for e in errors), errors
        assert (Path(state) / ORIGINALS_FILE).exists()
        # ... and in the namespace it puts every original back, then removes the record
        removed, errors = cleanup(AgentConfig(backend="memory", pin_dir=pin_dir,
                                              state_dir=state, sysctl_netns=netns,
                                              api_socket=os.path.join(state, "agent.sock")))
        assert errors == []
        assert "sysctl net.ipv4.ip_forward = 0 (restored)" in removed
        assert in_ns(netns, "net/ipv4/ip_forward") == "0"
        assert in_ns(netns, "net/ipv4/conf/all/rp_filter") == "1"
        assert in_ns(netns, "net/ipv6/conf/all/forwarding") == "0"
        assert not (Path(state) / ORIGINALS_FILE).exists()
    finally:
        remove_pins("memory", pin_dir)
        shutil.rmtree(state, ignore_errors=True)


async def run_agent_twice(state: str, pin_dir: str, netns: str) -> None:
    hive, comp = hive_of(state, pin_dir, netns)
    async with anyio.create_task_group() as tg:
        await hive.start(tg)
        try:
            await until(lambda: comp.health()[0].message == f"3 settings held in netns {netns}",
                        "node settings")
            assert in_ns(netns, "net/ipv4/ip_forward") == "1"
            assert in_ns(netns, "net/ipv4/conf/all/rp_filter") == "0"
            assert in_ns(netns, "net/ipv6/conf/all/forwarding") == "1"
            manager = hive.lookup(ENDPOINTS)
            for ctr, iface in (("c1", "lxcsw1"), ("c2", "lxcgone")):
                change = EndpointChange.parse({"container-id": ctr, "interface-name": iface})
                await anyio.to_thread.run_sync(manager.create, "0", change)
            await until(lambda: in_ns(netns, "net/ipv4/conf/lxcsw1/rp_filter") == "0", "lxc")
            assert in_ns(netns, "net/ipv4/conf/lxcsw1/forwarding") == "1"
            await until(lambda: comp.health()[0].state == "Degraded", "health")
            msg = comp.health()[0].message
            assert ("net.ipv4.conf.lxcgone.forwarding (/proc/sys/net/ipv4/conf/lxcgone/"
                    "forwarding): cannot set 1: ENOENT") in msg, msg
            assert "lxcsw1" not in msg
        finally:
            await hive.stop()
            tg.cancel_scope.cancel()
    # stopping changes nothing; a restarted agent still knows the originals
    assert in_ns(netns, "net/ipv4/ip_forward") == "1"
    hive, comp = hive_of(state, pin_dir, netns)
    async with anyio.create_task_group() as tg:
        await hive.start(tg)
        try:
            assert comp.table is not None and comp.db is not None
            await until(lambda: comp.health()[0].state != "Degraded"
                        or "lxcgone" in comp.health()[0].message, "restart")
            table, db = comp.table, comp.db

            def original() -> str | None:
                rows = {r.path: r for r in table.all(db.read_txn())}
                row = rows.get("net/ipv4/ip_forward")
                return row.original if row is not None and str(row.status) == "Done" else None

            await until(lambda: original() == "0", "original")
        finally:
            await hive.stop()
            tg.cancel_scope.cancel()
