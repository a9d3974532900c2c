"""``statewright agent --cleanup`` touches only what its own configuration's agent created:
run with another agent's pin, state and socket places (and a cgroup of its own), it leaves
the default demo namespace and the default cgroup of a running default agent alone; the
default agent's cleanup still removes them.

The "default" names are replaced by unique ones for the test (other engineers' agents may
be using the real ones); nothing here touches the machine's real default places."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from statewright.agent.components import node
from statewright.agent.config import AgentConfig
from statewright.agent.demo_netns import delete_netns, netns_exists
from statewright.agent.runtime import cleanup


@pytest.fixture
def default_things(monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """A namespace and a cgroup standing in for the running default agent's."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("needs root and iproute2 (ip netns, cgroups)")
        pytest.skip("needs root and iproute2 (ip netns, cgroups)")
    from bpf.datapath import cgroup2_mount

    tag = uuid.uuid4().hex[:8]
    netns, cg_name = f"swtest-default-demo-{tag}", f"swtest-default-cg-{tag}"
    cgroup = os.path.join(cgroup2_mount(), cg_name)
    monkeypatch.setattr(node, "DEMO_NETNS", netns)
    monkeypatch.setattr(node, "DEFAULT_CGROUP_NAME", cg_name)
    subprocess.run(["ip", "netns", "add", netns], check=True)
    os.makedirs(cgroup)
    try:
        yield netns, cgroup
    finally:
        delete_netns(netns)
        if os.path.isdir(cgroup):
            os.rmdir(cgroup)


def test_another_configurations_cleanup_leaves_the_default_agents_things(
    tmp_path: Path, default_things: tuple[str, str]
) -> None:
    netns, cgroup = default_things
    own_cgroup = cgroup + "-own"
    os.makedirs(own_cgroup)
    try:
        cfg = AgentConfig(pin_dir=str(tmp_path / "pins"), state_dir=str(tmp_path / "state"),
                          api_socket=str(tmp_path / "agent.sock"), cgroup=own_cgroup)
        removed, errors = cleanup(cfg)
        assert not errors
        assert netns_exists(netns), removed
        # Without --cgroup either: the default cgroup is the default agent's.
        removed, errors = cleanup(AgentConfig(pin_dir=str(tmp_path / "pins"),
                                              state_dir=str(tmp_path / "state"),
                                              api_socket=str(tmp_path / "agent.sock")))
        assert not errors
        assert netns_exists(netns) and os.path.isdir(cgroup), removed
    finally:
        os.rmdir(own_cgroup)


def test_the_default_agents_cleanup_removes_them(
    default_things: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from bpf.datapath import SockLB

    netns, cgroup = default_things
    cfg = AgentConfig()  # the machine-wide default places
    assert node.is_default_instance(cfg)
    demo = node.DemoComponent(node.DemoConfig.from_agent_config(cfg))
    assert demo.cleanup() == [f"netns {netns}"]
    assert not netns_exists(netns)
    # The datapath's cleanup would also detach the links pinned under the real default
    # pin directory (a default agent of someone else may run): only its cgroup part runs.
    pinned: list[str] = []
    monkeypatch.setattr(SockLB, "cleanup", staticmethod(lambda pin_dir: pinned.append(pin_dir)
                                                         or []))
    datapath = node.DatapathComponent(node.DatapathComponentConfig.from_agent_config(cfg))
    assert datapath.cleanup() == [cgroup]
    assert not os.path.isdir(cgroup) and pinned == [cfg.pin_dir]


def test_a_named_demo_namespace_is_cleaned_up_by_its_configuration(
    tmp_path: Path, default_things: tuple[str, str]
) -> None:
    netns, _ = default_things
    own = netns + "-own"
    subprocess.run(["ip", "netns", "add", own], check=True)
    try:
        cfg = AgentConfig(pin_dir=str(tmp_path / "pins"), state_dir=str(tmp_path / "state"),
                          demo_netns=own)
        demo = node.DemoComponent(node.DemoConfig.from_agent_config(cfg))
        assert demo.cleanup() == [f"netns {own}"]
        assert not netns_exists(own) and netns_exists(netns)
    finally:
        delete_netns(own)
