"""LBConfig: Cilium flag spellings, harness defaults, errors, unsupported flags."""

from __future__ import annotations

import pytest

from tables.lb_config import FlagError, LBConfig, default_node_name, parse_duration
from tests.conformance.lb_system import HARNESS_DEFAULTS, harness_config


def test_defaults_are_cilium_defaults() -> None:
    c = LBConfig()
    assert (c.algorithm, c.maglev_table_size, c.enable_wildcard_entries) == ("random", 16381, True)
    assert c.service_map_max == 65536 and c.in_node_port_range(30000)
    assert not c.in_node_port_range(32768)


def test_corpus_flag_spellings() -> None:
    c = LBConfig.from_flags([
        "--enable-experimental-lb", "--lb-test-fault-probability=0.0",
        "--bpf-lb-enable-wildcard-entries=false", "--bpf-lb-algorithm=maglev",
        "--bpf-lb-external-clusterip", "--bpf-lb-mode=hybrid", "--bpf-lb-algorithm-annotation",
        "--node-port-range", "31000-31999", "--lb-retry-backoff-min=10ms",
        "--bpf-lb-source-range-all-types=true", "--enable-external-ips=false",
    ])
    assert c.enable_experimental_lb and c.external_clusterip and c.algorithm_annotation
    assert not c.enable_wildcard_entries and not c.enable_external_ips
    assert c.algorithm == "maglev" and c.mode == "hybrid" and c.source_range_all_types
    assert (c.node_port_min, c.node_port_max) == (31000, 31999)
    assert c.retry_backoff_min == pytest.approx(0.01) and c.test_fault_probability == 0.0
    assert LBConfig.from_flags(["--node-port-algorithm=maglev"]).algorithm == "maglev"


def test_harness_defaults_then_overrides() -> None:
    c = harness_config(["--lb-test-fault-probability=0.0"])
    assert c.maglev_table_size == 1021 and c.test_fault_probability == 0.0
    assert c.retry_backoff_max == pytest.approx(0.01)
    assert harness_config().test_fault_probability == pytest.approx(0.1)
    assert harness_config().node_name == "testnode"
    assert len(HARNESS_DEFAULTS) == 6


def test_product_defaults_are_not_the_harness(monkeypatch: pytest.MonkeyPatch) -> None:
    """The product's node name is this node's ($NODE_NAME, else the host name); no faults."""
    import socket

    monkeypatch.delenv("NODE_NAME", raising=False)
    assert LBConfig().node_name == socket.gethostname() == default_node_name()
    monkeypatch.setenv("NODE_NAME", "worker-7")
    assert LBConfig().node_name == "worker-7"
    assert LBConfig().test_fault_probability == 0.0
    assert LBConfig.unsupported_flags(["--lb-test-fault-probability=0.1"]) == [
        "--lb-test-fault-probability=0.1"
    ]


@pytest.mark.parametrize(
    "flags, match",
    [(["--no-such-flag"], "unknown flag --no-such-flag"),
     (["--bpf-lb-algorithm=best"], "bpf-lb-algorithm"),
     (["--bpf-lb-maglev-table-size=-1"], "negative"),
     (["--bpf-lb-enable-wildcard-entries=maybe"], "boolean"),
     (["--lb-retry-backoff-min=10parsecs"], "duration"),
     (["--bpf-lb-maglev-table-size"], "needs a value"),
     (["positional"], "unexpected argument"),
     (["--node-port-range=5-1"], "port range")],
)
def test_bad_flags(flags: list[str], match: str) -> None:
    with pytest.raises(FlagError, match=match):
        LBConfig.from_flags(flags)


def test_non_strict_skips_unknown() -> None:
    assert LBConfig.from_flags(["--whatever=1", "--bpf-lb-algorithm=maglev"],
                               strict=False).algorithm == "maglev"


def test_unsupported_flags_reported() -> None:
    flags = ["--lb-state-file=$WORK/state.yaml", "--bpf-lb-algorithm=maglev", "--bogus",
             "--bpf-lb-dsr-dispatch=geneve", "--enable-scale-to-zero"]
    assert LBConfig.unsupported_flags(flags) == [
        "--lb-state-file=$WORK/state.yaml", "--bogus", "--bpf-lb-dsr-dispatch=geneve"]


@pytest.mark.parametrize("text, secs", [("10ms", 0.01), ("1m30s", 90.0), ("0", 0.0),
                                        ("2h", 7200.0), ("100us", 1e-4)])
def test_parse_duration(text: str, secs: float) -> None:
    assert parse_duration(text) == pytest.approx(secs)


def test_unsupported_flags_with_caller_extensions() -> None:
    flags = ["--bpf-lb-dsr-dispatch=geneve", "--bogus"]
    assert LBConfig.unsupported_flags(flags, also_supported=["bpf-lb-dsr-dispatch", "bogus"]) == [
        "--bogus"]
