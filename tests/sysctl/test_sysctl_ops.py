"""SysctlOps against the in-memory /proc/sys twin (statewright/sysctl_ops.py): the
original is recorded before the write and persisted, put back only where the agent's
value still holds, a missing setting is an error naming it (never a crash), and a
hypothesis state machine (wants, unwants, foreign writes, vanishing interfaces,
restarts, prunes and cleanups in any order) checks the record and the settings."""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from statewright.sysctl_ops import (
    ORIGINALS_FILE,
    MemoryProcSys,
    OriginalValues,
    Recorded,
    SysctlError,
    SysctlOps,
    SysctlStateError,
    restore_recorded,
)
from tables.sysctls import Sysctl

FWD = "net/ipv4/ip_forward"
FWD6 = "net/ipv6/conf/all/forwarding"


def new_ops(tmp: Path, settings_: dict[str, str]) -> tuple[MemoryProcSys, SysctlOps]:
    procfs = MemoryProcSys(settings_)
    return procfs, SysctlOps(procfs, OriginalValues(str(tmp / ORIGINALS_FILE)))


def test_apply_records_the_original_before_writing_and_persists_it(tmp_path: Path) -> None:
    procfs, ops = new_ops(tmp_path, {FWD: "0"})
    ops.apply(Sysctl(FWD, "1"))
    assert procfs.settings[FWD] == "1"
    doc = json.loads((tmp_path / ORIGINALS_FILE).read_text())
    assert doc["settings"] == {FWD: {"original": "0", "ours": "1"}}
    assert doc["netns"] == "memory"
    # a restarted agent (a new record object from the file) still knows the original
    again = SysctlOps(procfs, OriginalValues.load(str(tmp_path / ORIGINALS_FILE)))
    again.apply(Sysctl(FWD, "1"))
    assert again.originals.get(FWD) == Recorded("0", "1")
    assert procfs.writes == 1  # nothing rewritten when the value is right


def test_a_missing_setting_is_an_error_naming_it_and_records_nothing(tmp_path: Path) -> None:
    _, ops = new_ops(tmp_path, {FWD: "0"})
    with pytest.raises(SysctlError) as e:
        ops.apply(Sysctl(FWD6, "1"))
    assert e.value.errno == errno.ENOENT
    assert "net.ipv6.conf.all.forwarding" in str(e.value) and "ENOENT" in str(e.value)
    assert "cannot set 1" in str(e.value)
    assert ops.originals.paths() == []


def test_a_refused_write_names_the_setting_value_and_errno(tmp_path: Path) -> None:
    procfs, ops = new_ops(tmp_path, {FWD: "0"})
    procfs.read_only.add(FWD)
    want = r"net\.ipv4\.ip_forward \(/proc/sys/net/ipv4/ip_forward\): cannot set 1: EACCES"
    with pytest.raises(SysctlError, match=want):
        ops.apply(Sysctl(FWD, "1"))
    # the original is recorded (before the write); releasing it changes nothing
    ops.release(FWD)
    assert procfs.settings[FWD] == "0" and ops.originals.paths() == []


def test_a_value_the_kernel_does_not_keep_is_an_error(tmp_path: Path) -> None:
    class Clamping(MemoryProcSys):
        def write(self, path: str, value: str) -> None:
            super().write(path, "1")

    procfs = Clamping({FWD: "0"})
    ops = SysctlOps(procfs, OriginalValues(None))
    with pytest.raises(SysctlError, match="the kernel kept '1'"):
        ops.apply(Sysctl(FWD, "2"))


def test_release_restores_only_where_the_agents_value_still_holds(tmp_path: Path) -> None:
    procfs, ops = new_ops(tmp_path, {FWD: "0", FWD6: "0"})
    ops.apply(Sysctl(FWD, "1"))
    ops.apply(Sysctl(FWD6, "1"))
    procfs.settings[FWD6] = "2"  # someone else's since
    ops.release_unwanted([])
    assert procfs.settings == {FWD: "0", FWD6: "2"}
    assert ops.left_alone == [FWD6]
    assert ops.originals.paths() == []
    assert json.loads((tmp_path / ORIGINALS_FILE).read_text())["settings"] == {}


def test_rows_without_restore_are_not_recorded(tmp_path: Path) -> None:
    lxc = "net/ipv4/conf/lxc1/rp_filter"
    procfs, ops = new_ops(tmp_path, {lxc: "1"})
    ops.apply(Sysctl(lxc, "0", restore=False))
    assert procfs.settings[lxc] == "0" and ops.originals.paths() == []


def test_cleanup_restores_and_refuses_records_of_another_namespace(tmp_path: Path) -> None:
    procfs, ops = new_ops(tmp_path, {FWD: "0"})
    ops.apply(Sysctl(FWD, "1"))
    other = MemoryProcSys({FWD: "1"})
    other.netns_id = lambda: "net:[1]"  # type: ignore[method-assign]
    with pytest.raises(SysctlStateError, match="network namespace memory, not of net:\\[1\\]"):
        restore_recorded(other, OriginalValues.load(str(tmp_path / ORIGINALS_FILE)))
    assert other.settings[FWD] == "1"
    done, errors = restore_recorded(procfs, OriginalValues.load(str(tmp_path / ORIGINALS_FILE)))
    assert errors == [] and done == ["sysctl net.ipv4.ip_forward = 0 (restored)"]
    assert procfs.settings[FWD] == "0"


def test_a_damaged_record_is_an_error_naming_the_file(tmp_path: Path) -> None:
    f = tmp_path / ORIGINALS_FILE
    f.write_text("{not json")
    with pytest.raises(SysctlStateError, match=str(f)):
        OriginalValues.load(str(f))
    f.write_text('{"settings": {"a": 1}}')
    with pytest.raises(SysctlStateError, match="not a record"):
        OriginalValues.load(str(f))


# ----- the state machine ----------------------------------------------------------------------
#: The settings of the twin, whether their rows restore them (a pod interface's do not),
#: and one interface name holding a dot (rows keep the '/' form).
PATHS = {FWD: True, FWD6: True, "net/ipv4/conf/eth0.100/rp_filter": True,
         "net/ipv4/conf/lxc1/rp_filter": False}
VALUES = st.sampled_from(["0", "1", "2"])
PATH = st.sampled_from(sorted(PATHS))


class SysctlMachine(RuleBasedStateMachine):
    """The model: which settings are wanted, and per recorded setting the value found
    before the agent first changed it and the value it wrote."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="sw-sysctl-")
        self.file = os.path.join(self.dir, ORIGINALS_FILE)
        self.procfs = MemoryProcSys({p: "0" for p in PATHS})
        self.ops = SysctlOps(self.procfs, OriginalValues(self.file))
        self.wanted: dict[str, str] = {}
        self.records: dict[str, Recorded] = {}

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    # ----- the model's expectations -------------------------------------------------------
    def _apply(self, path: str, value: str) -> None:
        if path not in self.procfs.settings:
            with pytest.raises(SysctlError) as e:
                self.ops.apply(Sysctl(path, value, restore=PATHS[path]))
            assert e.value.errno == errno.ENOENT
            return
        before = self.procfs.settings[path]
        self.ops.apply(Sysctl(path, value, restore=PATHS[path]))
        if PATHS[path]:
            original = self.records[path].original if path in self.records else before
            self.records[path] = Recorded(original, value)
        assert self.procfs.settings[path] == value

    def _release(self, path: str) -> None:
        rec = self.records.pop(path, None)
        if rec is None or path not in self.procfs.settings:
            return
        if self.procfs.settings[path] == rec.ours:
            self.procfs.settings[path] = rec.original  # what the agent must put back

    # ----- rules ----------------------------------------------------------------------------
    @rule(path=PATH, value=VALUES)
    def want(self, path: str, value: str) -> None:
        self.wanted[path] = value
        self._apply(path, value)

    @rule(path=PATH)
    def unwant(self, path: str) -> None:
        """A row deleted: the reconciler's delete."""
        self.wanted.pop(path, None)
        expected = dict(self.procfs.settings)
        self.ops.release(path)
        self._release_expect(path, expected)

    def _release_expect(self, path: str, expected: dict[str, str]) -> None:
        saved = self.procfs.settings
        self.procfs.settings = expected
        self._release(path)
        self.procfs.settings = saved
        assert self.procfs.settings == expected

    @rule(path=PATH)
    def forget_wanted(self, path: str) -> None:
        """A row gone while the agent was down (a restart with another configuration):
        nothing happens until the next prune."""
        self.wanted.pop(path, None)

    @rule()
    def reconcile(self) -> None:
        """A round: every wanted row applied (missing ones fail), then the prune."""
        for path, value in sorted(self.wanted.items()):
            self._apply(path, value)
        expected = dict(self.procfs.settings)
        saved = self.procfs.settings
        self.procfs.settings = expected
        for path in sorted(self.records):
            if path not in self.wanted:
                self._release(path)
        self.procfs.settings = saved
        self.ops.release_unwanted(self.wanted)
        assert self.procfs.settings == expected

    @rule(path=PATH, value=VALUES)
    def foreign_write(self, path: str, value: str) -> None:
        if path in self.procfs.settings:
            self.procfs.settings[path] = value

    @rule(path=PATH)
    def vanish(self, path: str) -> None:
        """IPv6 disabled, or the interface gone."""
        self.procfs.settings.pop(path, None)

    @rule(path=PATH, value=VALUES)
    def appear(self, path: str, value: str) -> None:
        self.procfs.settings.setdefault(path, value)

    @rule()
    def restart(self) -> None:
        self.ops = SysctlOps(self.procfs, OriginalValues.load(self.file))

    @rule()
    def cleanup(self) -> None:
        """The agent stopped and ``agent --cleanup`` ran: every original back."""
        expected = dict(self.procfs.settings)
        saved = self.procfs.settings
        self.procfs.settings = expected
        for path in sorted(self.records):
            self._release(path)
        self.procfs.settings = saved
        _, errors = restore_recorded(self.procfs, OriginalValues.load(self.file))
        assert errors == []
        assert self.procfs.settings == expected
        self.wanted.clear()
        self.ops = SysctlOps(self.procfs, OriginalValues.load(self.file))

    # ----- invariants -----------------------------------------------------------------------
    @invariant()
    def the_record_is_the_models_and_is_persisted(self) -> None:
        assert dict(self.ops.originals.items()) == self.records
        if os.path.exists(self.file):
            assert dict(OriginalValues.load(self.file).items()) == self.records
        else:
            assert self.records == {}

    @invariant()
    def only_restored_settings_are_recorded(self) -> None:
        assert all(PATHS[p] for p in self.records)


SysctlMachine.TestCase.settings = settings(
    max_examples=120, stateful_step_count=30, deadline=2000, derandomize=True
)
TestSysctlMachine = SysctlMachine.TestCase
