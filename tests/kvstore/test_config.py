"""kvstore mode's configuration: the etcd config file and the agent's flags; bad input is
refused with the file (or flag) and the field named."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sources.kvstore.config import KVStoreConfigError, load_etcd_config, parse_kvstore_opts
from statewright.agent.config import AgentConfig, ConfigError, load
from tests.kvstore.tls_certs import make_tls_files


def test_etcd_config_file(tmp_path: Path) -> None:
    tls = make_tls_files(tmp_path / "pki")
    f = tmp_path / "etcd.config"
    f.write_text("endpoints:\n- https://10.0.0.1:2379\n- https://10.0.0.2:2379/\n"
                 f"trusted-ca-file: {tls.ca}\ncert-file: {tls.client.cert}\n"
                 f"key-file: {tls.client.key}\nusername: cilium\npassword: pw\n")
    cfg = load_etcd_config(f)
    assert cfg.endpoints == ("https://10.0.0.1:2379", "https://10.0.0.2:2379")
    assert cfg.tls and cfg.trusted_ca_file == str(tls.ca) and cfg.username == "cilium"
    assert cfg.source == str(f)


@pytest.mark.parametrize(("text", "message"), [
    ("endpoints: []\n", "endpoints: must be a non-empty list"),
    ("endpoints: [ftp://x:1]\n", "is not http(s)://host:port"),
    ("endpoints: [http://x]\n", "is not http(s)://host:port"),
    ("endpoints: [http://x:1]\ncert-file: /c\n", "cert-file and key-file go together"),
    ("endpoints: [http://x:1]\nusername: u\n", "username and password go together"),
    ("endpoints: [http://x:1]\nendpoint: y\n", "unknown field(s) endpoint"),
    ("- a\n", "must be a mapping"),
    ("endpoints: [\n", "not YAML"),
])
def test_bad_etcd_config_is_refused(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "etcd.config"
    f.write_text(text)
    with pytest.raises(KVStoreConfigError, match=re.escape(message)) as e:
        load_etcd_config(f)
    assert str(f) in str(e.value)


def test_kvstore_opts() -> None:
    with pytest.raises(KVStoreConfigError, match=r"etcd\.config=FILE is required"):
        parse_kvstore_opts({})
    with pytest.raises(KVStoreConfigError, match="unknown option"):
        parse_kvstore_opts({"etcd.bogus": "x"})
    with pytest.raises(KVStoreConfigError, match="cannot read"):
        parse_kvstore_opts({"etcd.config": "/nonexistent/etcd.config"})


def test_agent_flags(tmp_path: Path) -> None:
    assert AgentConfig().identity_allocation_mode == "crd"
    f = tmp_path / "etcd.config"
    f.write_text("endpoints: [http://127.0.0.1:2379]\n")
    cfg = load(None, {"identity_allocation_mode": "kvstore", "kvstore": "etcd",
                      "kvstore_opt": [f"etcd.config={f}"]})
    assert cfg.kvstore_opt == {"etcd.config": str(f)}
    with pytest.raises(ConfigError, match="needs kvstore: etcd"):
        load(None, {"identity_allocation_mode": "kvstore"})
    with pytest.raises(ConfigError, match=r"kvstore-opt: .*etcd\.config=FILE is required"):
        load(None, {"identity_allocation_mode": "kvstore", "kvstore": "etcd"})
    with pytest.raises(ConfigError, match="is not crd or kvstore"):
        load(None, {"identity_allocation_mode": "etcd"})
    with pytest.raises(ConfigError, match="kvstore-lease-ttl"):
        load(None, {"kvstore_lease_ttl": 0})


def test_operator_kvstore_flags_are_checked(tmp_path: Path) -> None:
    from statewright import cli

    assert cli.main(["operator", "--identity-allocation-mode", "kvstore"]) == 2
    assert cli.main(["operator", "--identity-allocation-mode", "kvstore", "--kvstore", "etcd",
                     "--kvstore-opt", f"etcd.config={tmp_path}/missing"]) == 2
    assert cli.main(["operator"]) == 2  # CRD mode needs an API server
