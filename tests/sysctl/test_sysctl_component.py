"""The ``sysctl`` component's configuration and its health where it changes nothing:
disabled (``sysctl: false``, the default under $STATEWRIGHT_SYSCTL=off), or a damaged
record of original values (nothing is changed: an original would be lost)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from statewright.agent.components.statedb import StateDBComponent
from statewright.agent.components.sysctl import SysctlComponent, SysctlConfig
from statewright.agent.config import AgentConfig, ConfigError, load, sysctl_default
from statewright.cli import build_parser
from statewright.cli.agent_commands import _overrides
from statewright.component import Hive
from statewright.sysctl_ops import ORIGINALS_FILE


def test_configuration_keys_flags_and_the_environment_default(tmp_path: Path) -> None:
    assert sysctl_default({}) is True
    for off in ("off", "0", "false", "No"):
        assert sysctl_default({"STATEWRIGHT_SYSCTL": off}) is False
    assert AgentConfig().sysctl is False  # the suite's environment (tests/conftest.py)
    cfg = tmp_path / "a.yaml"
    cfg.write_text("sysctl: true\nsysctl-netns: node1\n")
    got = load(str(cfg))
    assert got.sysctl is True and got.sysctl_netns == "node1"
    cfg.write_text("sysctl: maybe\n")
    with pytest.raises(ConfigError, match="field sysctl: expected true or false"):
        load(str(cfg))
    args = build_parser().parse_args(["agent", "--no-sysctl", "--sysctl-netns", "/run/netns/x"])
    assert load(None, _overrides(args)).sysctl_netns == "/run/netns/x"
    assert load(None, _overrides(args)).sysctl is False
    args = build_parser().parse_args(["agent", "--sysctl"])
    assert load(None, _overrides(args)).sysctl is True
    conf = SysctlConfig.from_agent_config(AgentConfig(pod_cidrs=("10.1.0.0/24",)))
    assert conf.families == (4,) and conf.procsys().root == "/proc/sys"
    args = build_parser().parse_args(["agent", "--procfs", "/host/proc"])
    conf = SysctlConfig.from_agent_config(load(None, _overrides(args)))
    assert conf.procsys().root == "/host/proc/sys"
    with pytest.raises(ConfigError, match="procfs: 'proc' is not an absolute path"):
        AgentConfig(procfs="proc")
    assert SysctlConfig.from_agent_config(
        AgentConfig(k8s_api_server="https://127.0.0.1:6443")).families == (4, 6)


def started_health(comp: SysctlComponent) -> list[tuple[str, str, str]]:
    async def main() -> list[tuple[str, str, str]]:
        hive = Hive([StateDBComponent(), comp])
        async with anyio.create_task_group() as tg:
            await hive.start(tg)
            try:
                return [(h.name, h.state, h.message) for h in hive.health() if h.name == "sysctl"]
            finally:
                await hive.stop()
                tg.cancel_scope.cancel()

    return anyio.run(main)


def test_disabled_says_what_the_pods_need(tmp_path: Path) -> None:
    comp = SysctlComponent(SysctlConfig(False, "", str(tmp_path)))
    health = started_health(comp)
    assert health[0][:2] == ("sysctl", "Disabled")
    assert "net.ipv4.ip_forward=1" in health[0][2]
    # the table is there (`db show sysctls` answers), empty
    assert comp.table is not None and comp.db is not None
    assert comp.table.count(comp.db.read_txn()) == 0


def test_a_damaged_record_changes_nothing_and_says_so(tmp_path: Path) -> None:
    record = tmp_path / ORIGINALS_FILE
    record.write_text("{\"settings\": ")
    comp = SysctlComponent(SysctlConfig(True, "/nonexistent/netns", str(tmp_path)))
    health = started_health(comp)
    assert health[0][1] == "Degraded"
    assert str(record) in health[0][2] and "no setting is changed" in health[0][2]
    assert comp.reconciler is None and comp.ops is None
    assert record.read_text() == "{\"settings\": "
    with pytest.raises(OSError, match="cannot read the recorded sysctl values"):
        comp.cleanup()
    assert record.exists()


def test_not_root_is_disabled_and_tries_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("statewright.agent.components.sysctl.running_as_root", lambda: False)
    comp = SysctlComponent(SysctlConfig(True, "/nonexistent/netns", str(tmp_path)))
    health = started_health(comp)
    assert health[0][1] == "Disabled" and health[0][2].startswith("not root:")
    assert comp.ops is None and not (tmp_path / ORIGINALS_FILE).exists()
