"""IPAM: excluded addresses, allocate/release, errors, persistence, and a hypothesis state
machine of allocate/release/restart sequences (no address is ever held twice)."""

from __future__ import annotations

import glob
import ipaddress
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from statedb import DB
from statedb.errors import StatewrightError
from tables.ipam import (
    IPAM,
    ROUTER_OWNER,
    AddressInUseError,
    IPAMConfig,
    IPAMError,
    IPAMRequestError,
    NotAllocatedError,
    PoolExhaustedError,
    pod_cidrs_of_node,
)
from tables.state_dir import StateDirError


def make_ipam(state_dir: str | None, *cidrs: str, router: bool = True) -> IPAM:
    ipam = IPAM(DB(), IPAMConfig.parse(cidrs, state_dir, reserve_router=router))
    ipam.restore()
    return ipam


def test_ipv4_excludes_network_broadcast_and_router(tmp_path: Path) -> None:
    ipam = make_ipam(str(tmp_path), "10.0.0.0/29")
    txn = ipam.db.read_txn()
    assert ipam.router(txn, 4) == ipaddress.ip_address("10.0.0.1")
    got = [ipam.allocate_next(4, f"pod{i}") for i in range(5)]
    assert [str(ip) for ip in got] == [f"10.0.0.{i}" for i in range(2, 7)]
    with pytest.raises(PoolExhaustedError, match=r"no free IPv4 address in 10\.0\.0\.0/29"):
        ipam.allocate_next(4, "pod9")
    for bad in ("10.0.0.0", "10.0.0.7"):
        with pytest.raises(IPAMRequestError, match="never handed out"):
            ipam.allocate(bad, "x")


def test_ipv6_excludes_network_only_and_limits_range(tmp_path: Path) -> None:
    ipam = make_ipam(str(tmp_path), "fd00::/126", router=False)
    got = [str(ipam.allocate_next(6, f"p{i}")) for i in range(3)]
    assert got == ["fd00::1", "fd00::2", "fd00::3"]
    with pytest.raises(IPAMRequestError):
        ipam.allocate("fd00::", "x")
    big = make_ipam(None, "fd01::/64", router=False)
    with pytest.raises(IPAMRequestError, match="never handed out"):
        big.allocate("fd01::1:0", "x")  # the 65,537th address
    assert str(big.allocate("fd01::ffff", "x")) == "fd01::ffff"


def test_requested_address_owner_and_release(tmp_path: Path) -> None:
    ipam = make_ipam(str(tmp_path), "10.1.0.0/24", "fd00:1::/112")
    assert str(ipam.allocate("10.1.0.50", "a")) == "10.1.0.50"
    assert str(ipam.allocate("10.1.0.50", "a")) == "10.1.0.50"  # idempotent for the owner
    with pytest.raises(AddressInUseError, match="already allocated to 'a'") as ei:
        ipam.allocate("10.1.0.50", "b")
    assert ei.value.http_status == 409
    v6 = ipam.allocate_next(6, "a")
    assert {str(x.ip) for x in ipam.by_owner("a")} == {"10.1.0.50", str(v6)}
    with pytest.raises(NotAllocatedError, match="allocated to 'a', not 'b'"):
        ipam.release("10.1.0.50", owner="b")
    ipam.release("10.1.0.50", owner="a")
    with pytest.raises(NotAllocatedError, match=r"10\.1\.0\.50 is not allocated"):
        ipam.release("10.1.0.50")
    assert [str(a.ip) for a in ipam.release_owner("a")] == [str(v6)]
    assert ipam.release_owner("a") == []


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda i: i.allocate("192.168.0.1", "x"), "not in this node's pod CIDRs"),
        (lambda i: i.allocate("nope", "x"), "is not an IP address"),
        (lambda i: i.allocate_next(6, "x"), "IPv6 has no pod CIDR"),
        (lambda i: i.allocate_next(5, "x"), "family must be 4 or 6"),
        (lambda i: i.allocate_next(4, ""), "owner must be a non-empty string"),
    ],
)
def test_bad_requests_change_nothing(tmp_path: Path, call: object, match: str) -> None:
    ipam = make_ipam(str(tmp_path), "10.2.0.0/24")
    before = ipam.allocations()
    with pytest.raises(IPAMRequestError, match=match) as ei:
        call(ipam)  # type: ignore[operator]
    assert isinstance(ei.value, StatewrightError) and ei.value.http_status == 400
    assert ipam.allocations() == before


def test_bad_config() -> None:
    with pytest.raises(IPAMRequestError, match="overlap"):
        IPAMConfig.parse(["10.0.0.0/16", "10.0.1.0/24"])
    with pytest.raises(IPAMRequestError, match="host bits set"):
        IPAMConfig.parse(["10.0.0.1/24"])
    with pytest.raises(IPAMRequestError, match="too small"):
        IPAMConfig.parse(["10.0.0.0/31"])


def test_persisted_and_restored(tmp_path: Path) -> None:
    ipam = make_ipam(str(tmp_path), "10.3.0.0/24")
    a = ipam.allocate_next(4, "a")
    doc = json.loads((tmp_path / "ipam.json").read_text())
    assert doc["allocations"] == {"10.3.0.1": ROUTER_OWNER, str(a): "a"}
    again = make_ipam(str(tmp_path), "10.3.0.0/24")
    assert [(str(x.ip), x.owner) for x in again.allocations()] == [
        ("10.3.0.1", ROUTER_OWNER),
        (str(a), "a"),
    ]
    # the router is not allocated a second time, and the cursor continues after `a`
    assert str(again.allocate_next(4, "b")) == "10.3.0.3"
    assert [p.name for p in tmp_path.iterdir()] == ["ipam.json"]  # no temporary left


def test_failed_persist_aborts_the_allocation(tmp_path: Path) -> None:
    state = tmp_path / "state"
    ipam = make_ipam(str(state), "10.4.0.0/24")
    before = ipam.allocations()
    shutil.rmtree(state)
    state.write_text("not a directory")  # the state directory can no longer be written
    with pytest.raises(StateDirError, match="state file"):
        ipam.allocate_next(4, "a")
    assert ipam.allocations() == before
    state.unlink()
    assert str(ipam.allocate_next(4, "a")) == "10.4.0.2"


def test_pod_cidrs_of_node() -> None:
    node = {"metadata": {"name": "n1"}, "spec": {"podCIDRs": ["10.6.0.0/24", "fd06::/112"]}}
    assert pod_cidrs_of_node(node) == ("10.6.0.0/24", "fd06::/112")
    assert pod_cidrs_of_node({"spec": {"podCIDR": "10.7.0.0/24"}}) == ("10.7.0.0/24",)
    with pytest.raises(IPAMRequestError, match=r"Node n1: spec\.podCIDRs: has no pod CIDRs"):
        pod_cidrs_of_node({"metadata": {"name": "n1"}, "spec": {}})
    with pytest.raises(IPAMRequestError, match=r"spec\.podCIDRs\[1\]"):
        pod_cidrs_of_node({"spec": {"podCIDRs": ["10.6.0.0/24", "10.6.0.1/24"]}})


def test_unknown_state_version(tmp_path: Path) -> None:
    (tmp_path / "ipam.json").write_text('{"version": 99}')
    with pytest.raises(IPAMError, match="version 99"):
        make_ipam(str(tmp_path), "10.5.0.0/24")


@pytest.fixture(autouse=True, scope="module")
def _remove_machine_dirs() -> Iterator[None]:
    """The state machine removes its directory in teardown; this also catches a run that
    ended before teardown (the directories carry this process's pid)."""
    yield
    for base in ("/dev/shm", tempfile.gettempdir()):
        for path in glob.glob(os.path.join(base, f"sw-ipam-{os.getpid()}-*")):
            shutil.rmtree(path, ignore_errors=True)


OWNERS = st.sampled_from(["a", "b", "c", "d"])


class IPAMMachine(RuleBasedStateMachine):
    """Random allocate / allocate-requested / release / release-owner / restart, against a
    dict model; a /29 and a /125 keep the pools small enough to run out."""

    CIDRS = ("10.9.0.0/29", "fd09::/125")

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix=f"sw-ipam-{os.getpid()}-")
        self.ipam = make_ipam(self.dir, *self.CIDRS)
        self.model = {str(a.ip): a.owner for a in self.ipam.allocations()}
        self.ever: set[str] = set(self.model)

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(family=st.sampled_from([4, 6]), owner=OWNERS)
    def allocate_next(self, family: int, owner: str) -> None:
        try:
            ip = str(self.ipam.allocate_next(family, owner))
        except PoolExhaustedError:
            free = [ip for ip in self._pool(family) if ip not in self.model]
            assert free == []
            return
        assert ip not in self.model, f"{ip} handed out twice"
        self.model[ip] = owner

    @rule(index=st.integers(0, 7), family=st.sampled_from([4, 6]), owner=OWNERS)
    def allocate_requested(self, index: int, family: int, owner: str) -> None:
        ip = (
            ["10.9.0.0", *self._pool(4), "10.9.0.7"] if family == 4 else ["fd09::", *self._pool(6)]
        )[index]
        try:
            self.ipam.allocate(ip, owner)
        except IPAMRequestError:
            assert ip in ("10.9.0.0", "10.9.0.7", "fd09::")
            return
        except AddressInUseError:
            assert self.model[ip] != owner
            return
        assert self.model.get(ip, owner) == owner
        self.model[ip] = owner

    @rule(owner=OWNERS)
    def release_owner(self, owner: str) -> None:
        self.ipam.release_owner(owner)
        self.model = {k: v for k, v in self.model.items() if v != owner}

    @rule(index=st.integers(0, 20))
    def release_one(self, index: int) -> None:
        held = sorted(k for k, v in self.model.items() if v != ROUTER_OWNER)
        if not held:
            return
        ip = held[index % len(held)]
        self.ipam.release(ip)
        del self.model[ip]

    @rule(family=st.sampled_from([4, 6]))
    def release_router_refused(self, family: int) -> None:
        router = self.ipam.router(self.ipam.db.read_txn(), family)
        assert router is not None
        with pytest.raises(IPAMRequestError, match="router address"):
            self.ipam.release(router)

    @rule()
    def restart(self) -> None:
        self.ipam = make_ipam(self.dir, *self.CIDRS)

    @invariant()
    def table_matches_model(self) -> None:
        got = {str(a.ip): a.owner for a in self.ipam.allocations()}
        assert got == self.model

    @staticmethod
    def _pool(family: int) -> list[str]:
        if family == 4:
            return [f"10.9.0.{i}" for i in range(1, 7)]
        return [f"fd09::{i:x}" for i in range(1, 8)]


IPAMMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestIPAMMachine = IPAMMachine.TestCase


def test_pending_ipam_hands_out_nothing_until_it_has_pod_cidrs(tmp_path: Path) -> None:
    """Without pod CIDRs yet (they come from the Node): restored allocations stay, nothing
    is handed out (503), then `set_pod_cidrs` reserves the router and serves; a change
    keeps what is held; a bad CIDR list changes nothing."""
    from tables.ipam import IPAMNotReadyError

    first = make_ipam(str(tmp_path), "10.1.0.0/24")
    pod = first.allocate_next(4, "pod")
    ipam = IPAM(DB(), IPAMConfig(state_dir=str(tmp_path), pending="the Node's spec.podCIDRs"))
    assert ipam.restore() == 2  # the router's and the pod's
    assert ipam.pending and ipam.status()["pending"] == "the Node's spec.podCIDRs"
    assert ipam.outside_pod_cidrs() == []  # nothing to compare with yet
    for call in (lambda: ipam.allocate_next(4, "x"), lambda: ipam.allocate("10.1.0.9", "x")):
        with pytest.raises(IPAMNotReadyError) as err:
            call()
        assert err.value.http_status == 503
    with pytest.raises(IPAMRequestError, match="overlap"):
        ipam.set_pod_cidrs(["10.1.0.0/24", "10.1.0.0/25"])
    assert ipam.pending
    assert ipam.set_pod_cidrs(["10.1.0.0/24"]) == []  # the same CIDR: nothing outside
    assert not ipam.pending and ipam.owner_of(ipam.db.read_txn(), pod) == "pod"
    assert ipam.router(ipam.db.read_txn(), 4) == ipaddress.ip_address("10.1.0.1")  # kept
    kept = ipam.set_pod_cidrs(["10.2.0.0/24", "fd00:2::/112"])
    assert [a.owner for a in kept] == ["pod"]
    assert {str(a.ip) for a in ipam.outside_pod_cidrs()} == {str(pod)}
    # The router addresses follow the CIDRs: IPv4's moves into the new CIDR (the old one
    # is released), IPv6 is new and gets one.
    txn = ipam.db.read_txn()
    assert (str(ipam.router(txn, 4)), str(ipam.router(txn, 6))) == ("10.2.0.1", "fd00:2::1")
    assert ipam.owner_of(txn, ipaddress.ip_address("10.1.0.1")) is None
    assert ipam.allocate_next(4, "new") in ipaddress.ip_network("10.2.0.0/24")


@pytest.mark.parametrize(
    "content",
    [
        '{"allocations": {"10.5.0.2": ',  # torn JSON
        "\x00\xff not json",
        '["a list"]',
        '{"version": 1, "allocations": {"10.5.0.999": "a"}}',
        '{"version": 1, "allocations": {"10.5.0.2": 7}}',
        '{"version": 1, "allocations": [], "cursors": {"10.5.0.0/24": "x"}}',
    ],
)
def test_corrupt_state_file_is_set_aside_and_reported(tmp_path: Path, content: str) -> None:
    """A state file that does not parse does not stop IPAM: its bytes are kept beside it
    (``ipam.json.corrupt-*``), IPAM starts empty (the endpoints' own state files give their
    addresses back) and `state_error` says what happened."""
    path = tmp_path / "ipam.json"
    path.write_bytes(content.encode("utf-8", "surrogateescape"))
    ipam = make_ipam(str(tmp_path), "10.5.0.0/24")
    assert "ipam.json" in ipam.state_error and "set aside" in ipam.state_error
    (kept,) = tmp_path.glob("ipam.json.corrupt-*")
    assert kept.read_bytes() == content.encode("utf-8", "surrogateescape")
    assert [(str(a.ip), a.owner) for a in ipam.allocations()] == [("10.5.0.1", ROUTER_OWNER)]
    assert json.loads(path.read_text())["allocations"] == {"10.5.0.1": ROUTER_OWNER}
    # a healthy restart reports nothing
    assert make_ipam(str(tmp_path), "10.5.0.0/24").state_error == ""


def test_state_file_that_cannot_be_read_stops_ipam_untouched(tmp_path: Path) -> None:
    """Only a file that does not parse is set aside; one the agent cannot read (here a
    directory in its place) is an error naming it, and nothing is renamed."""
    (tmp_path / "ipam.json").mkdir()
    with pytest.raises(StateDirError, match=r"ipam\.json: cannot read"):
        make_ipam(str(tmp_path), "10.5.0.0/24")
    assert [p.name for p in tmp_path.iterdir()] == ["ipam.json"]
