"""The ``sysctls`` table (tables/sysctls.py): names, the rows the agent wants for its
pod families and endpoints, and the writer plus the reconciler with SysctlOps on the
in-memory /proc/sys twin (the row carries the original once Done; a deleted endpoint's
rows go; a setting no row wants any more is restored by the first prune)."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from reconciler import Config, Reconciler, StatusKind
from statedb import DB
from statewright.sysctl_ops import ORIGINALS_FILE, MemoryProcSys, OriginalValues, SysctlOps
from tables.endpoints import Endpoint, EndpointState, new_endpoints_table
from tables.sysctls import (
    Sysctl,
    SysctlNameError,
    SysctlWriter,
    desired_sysctls,
    new_sysctls_table,
    sysctl_path,
)


def run(test: Callable[[], Any]) -> None:
    async def main() -> None:
        with anyio.fail_after(20):
            await test()

    anyio.run(main)


def test_names_and_paths() -> None:
    assert sysctl_path("net.ipv4.ip_forward") == "net/ipv4/ip_forward"
    assert sysctl_path("net/ipv4/conf/eth0.100/rp_filter") == "net/ipv4/conf/eth0.100/rp_filter"
    for bad in ("", "net/../../etc/passwd", "/net/ipv4", "net..ipv4", "net/ipv4/a b", "a\nb"):
        with pytest.raises(SysctlNameError):
            sysctl_path(bad)
    with pytest.raises(SysctlNameError, match="rows keep the '/' form"):
        Sysctl("net.ipv4.ip_forward", "1")
    with pytest.raises(SysctlNameError, match="is not a value"):
        Sysctl("net/ipv4/ip_forward", "1\n0")
    row = Sysctl("net/ipv4/conf/eth0.100/rp_filter", "0", "why")
    assert row.name == "net.ipv4.conf.eth0.100.rp_filter"
    assert row.table_row() == [row.name, "0", "?", "why", "Pending"]
    assert row.to_json()["path"] == "/proc/sys/net/ipv4/conf/eth0.100/rp_filter"


def ep(id_: int, iface: str, v4: bool = True, v6: bool = True,
       state: EndpointState = EndpointState.READY) -> Endpoint:
    return Endpoint(id_, interface_name=iface,
                    ipv4=ipaddress.IPv4Address(f"10.0.0.{id_}") if v4 else None,
                    ipv6=ipaddress.IPv6Address(f"fd00::{id_}") if v6 else None, state=state)


def test_desired_rows_follow_the_families_and_endpoints() -> None:
    assert sorted(desired_sysctls([4], [])) == ["net/ipv4/conf/all/rp_filter",
                                                 "net/ipv4/ip_forward"]
    assert sorted(desired_sysctls([6], [])) == ["net/ipv6/conf/all/forwarding"]
    want = desired_sysctls([4, 6], [ep(1, "lxc1", v6=False), ep(2, "lxc2", v4=False),
                                    ep(3, "lxc3", state=EndpointState.DISCONNECTING),
                                    ep(4, "")])
    per_if = sorted(p for p in want if "/lxc" in p)
    assert per_if == ["net/ipv4/conf/lxc1/forwarding", "net/ipv4/conf/lxc1/rp_filter",
                      "net/ipv6/conf/lxc2/accept_dad", "net/ipv6/conf/lxc2/forwarding"]
    assert not any(want[p].restore for p in per_if)
    assert want["net/ipv4/ip_forward"].restore


def test_writer_and_reconciler_hold_the_settings(tmp_path: Path) -> None:
    procfs = MemoryProcSys({
        "net/ipv4/ip_forward": "0", "net/ipv4/conf/all/rp_filter": "1",
        "net/ipv4/conf/lxc1/forwarding": "0", "net/ipv4/conf/lxc1/rp_filter": "1",
    })  # no IPv6 at all: its settings are missing
    originals = OriginalValues(str(tmp_path / ORIGINALS_FILE))
    db = DB()
    table, eps = new_sysctls_table(), new_endpoints_table()
    db.register(table)
    db.register(eps)
    writer = SysctlWriter(db, table, [4, 6], eps)
    with db.write_txn(table) as txn:
        writer.register_initializer(txn)
    ops = SysctlOps(procfs, originals)

    def set_status(row: Sysctl, status: Any) -> Sysctl:
        from dataclasses import replace
        return replace(row, status=status, original=originals.original_of(row.path))

    rec = Reconciler(db, Config(table=table, operations=ops, get_object_status=lambda r: r.status,
                                set_object_status=set_status, name="sysctls",
                                retry_min_backoff=0.01, retry_max_backoff=0.05))

    async def body() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(rec.run)
            with db.write_txn(eps) as txn:
                eps.insert(txn, ep(1, "lxc1", v6=False))
            writer.sync()
            await rec.wait_until_reconciled()
            assert procfs.settings["net/ipv4/ip_forward"] == "1"
            assert procfs.settings["net/ipv4/conf/all/rp_filter"] == "0"
            assert procfs.settings["net/ipv4/conf/lxc1/rp_filter"] == "0"
            rows = {r.path: r for r in table.all(db.read_txn())}
            assert rows["net/ipv4/ip_forward"].original == "0"
            assert rows["net/ipv4/ip_forward"].status.kind is StatusKind.DONE
            v6 = rows["net/ipv6/conf/all/forwarding"]
            assert v6.status.kind is StatusKind.ERROR
            assert ("net.ipv6.conf.all.forwarding (/proc/sys/net/ipv6/conf/all/forwarding): "
                    "cannot set 1: ENOENT") in v6.status.error
            # the endpoint goes: its rows go (nothing to restore: its interface is ours)
            with db.write_txn(eps) as txn:
                eps.delete(txn, ep(1, "lxc1", v6=False))
            writer.sync()
            await rec.wait_until_reconciled()
            assert not any("lxc1" in r.path for r in table.all(db.read_txn()))
            # a setting no row wants any more (a restart with IPv4 pods no more) is put back
            writer.families = (6,)
            writer.sync()
            await rec.wait_until_reconciled()
            assert procfs.settings["net/ipv4/ip_forward"] == "0"
            assert procfs.settings["net/ipv4/conf/all/rp_filter"] == "1"
            assert originals.paths() == []
            tg.cancel_scope.cancel()

    run(body)
