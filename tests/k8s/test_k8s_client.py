"""Client configuration: the three ways to reach an API server, token files, rate limits."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sources.k8s_client import (
    ClientSettings,
    K8sClient,
    K8sConfigError,
    RateLimiter,
    TokenFile,
    build_connection,
)
from sources.k8s_http import Connection

from .fake_apiserver import FakeAPIServer


def _bearer(conn: Connection) -> str:
    return "" if conn.authorization is None else conn.authorization()


def test_kubeconfig_with_relative_token_file_and_server_override(
    apiserver: FakeAPIServer, tmp_path: Path
) -> None:
    (tmp_path / "tok").write_text("first\n")
    kc = apiserver.write_kubeconfig(tmp_path / "kc", token_file="tok")
    cfg, where = build_connection(ClientSettings(kubeconfig=kc))
    assert cfg.server == apiserver.url and "kubeconfig" in where
    assert _bearer(cfg) == "Bearer first"
    (tmp_path / "tok").write_text("second-token\n")  # rotated (another size)
    assert _bearer(cfg) == "Bearer second-token"
    cfg, _ = build_connection(ClientSettings(kubeconfig=kc, api_server="https://10.0.0.1:6443/"))
    assert cfg.server == "https://10.0.0.1:6443"


def test_api_server_alone_uses_service_account_files_when_present(tmp_path: Path) -> None:
    cfg, where = build_connection(
        ClientSettings(
            api_server="https://10.0.0.1:6443",
            token_file=str(tmp_path / "none"),
            ca_file=str(tmp_path / "none.crt"),
        )
    )
    assert where == "https://10.0.0.1:6443" and cfg.authorization is None and not cfg.ca_file
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "ca.crt").write_text("pem")
    cfg, _ = build_connection(
        ClientSettings(
            api_server="https://10.0.0.1:6443",
            token_file=str(tmp_path / "token"),
            ca_file=str(tmp_path / "ca.crt"),
        )
    )
    assert _bearer(cfg) == "Bearer sa-token" and cfg.ca_file == str(tmp_path / "ca.crt")


def test_in_cluster_needs_its_environment_and_files(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(K8sConfigError, match="KUBERNETES_SERVICE_HOST"):
        K8sClient(ClientSettings(in_cluster=True, environ={}))
    with pytest.raises(K8sConfigError, match="no service account token"):
        build_connection(
            ClientSettings(in_cluster=True, environ=env, token_file=str(tmp_path / "x"))
        )
    (tmp_path / "token").write_text("t")
    (tmp_path / "ca.crt").write_text("pem")
    cfg, where = build_connection(
        ClientSettings(
            in_cluster=True,
            environ=env,
            token_file=str(tmp_path / "token"),
            ca_file=str(tmp_path / "ca.crt"),
        )
    )
    assert cfg.server == "https://[fd00::1]:443" and "in-cluster" in where
    assert _bearer(cfg) == "Bearer t" and cfg.ca_file == str(tmp_path / "ca.crt")


def test_nothing_configured_and_bad_kubeconfig(tmp_path: Path) -> None:
    assert not ClientSettings().enabled
    with pytest.raises(K8sConfigError, match="none of"):
        build_connection(ClientSettings())
    with pytest.raises(K8sConfigError, match="k8s-kubeconfig"):
        build_connection(ClientSettings(kubeconfig=str(tmp_path / "missing")))
    with pytest.raises(K8sConfigError, match="k8s-qps"):
        ClientSettings(qps=0)
    with pytest.raises(K8sConfigError, match="k8s-burst"):
        ClientSettings(burst=0)


def test_token_file_keeps_the_last_good_token(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("one")
    tf = TokenFile(str(path))
    assert tf.current() == "one" and tf.current() == "one" and tf.reads == 1
    os.unlink(path)
    assert tf.current() == "one"  # briefly missing during an atomic replace
    path.write_text("")
    assert tf.current() == "one"  # empty: not a token
    path.write_text("three")
    assert tf.current() == "three"


def test_rate_limiter_token_bucket() -> None:
    now = [0.0]
    rl = RateLimiter(qps=10, burst=2, clock=lambda: now[0])
    assert [rl.reserve() for _ in range(3)] == [0.0, 0.0, pytest.approx(0.1)]
    now[0] = 1.0  # refilled up to the burst, not beyond
    assert [rl.reserve() for _ in range(3)] == [0.0, 0.0, pytest.approx(0.1)]


def test_agent_config_keys(tmp_path: Path) -> None:
    from statewright.agent.components.kubernetes import (
        KubernetesComponent,
        KubernetesConfig,
        client_settings,
    )
    from statewright.agent.config import ConfigError, load

    path = tmp_path / "agent.yaml"
    path.write_text(
        "k8s-kubeconfig: /etc/kc\nk8s-api-server: https://10.0.0.1:6443\nk8s-qps: 5\nk8s-burst: 7\n"
    )
    config = load(str(path))
    s = client_settings(config)
    assert (s.kubeconfig, s.api_server, s.in_cluster, s.qps, s.burst) == (
        "/etc/kc",
        "https://10.0.0.1:6443",
        False,
        5.0,
        7,
    )
    assert KubernetesComponent(KubernetesConfig.from_agent_config(config)).enabled
    # the default: manifests only
    assert not KubernetesComponent(KubernetesConfig.from_agent_config(load(None))).enabled
    for bad, why in [
        ("k8s-qps: 0", "k8s-qps"),
        ("k8s-burst: 0", "k8s-burst"),
        ("k8s-api-server: 10.0.0.1:6443", "k8s-api-server"),
        ("k8s-in-cluster: yes please", "k8s-in-cluster"),
    ]:
        path.write_text(bad + "\n")
        with pytest.raises(ConfigError, match=why):
            load(str(path))
