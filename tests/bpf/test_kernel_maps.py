"""Kernel-only behaviour: pins seen from other processes, restarts, bpftool interop, the CLI,
and the privilege diagnostics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from bpf import endpoints, ipcache, lb
from bpf.factory import BackendConfig, MapFactory
from bpf.kernel_map import KernelMap
from bpf.pinning import open_or_create, pin_path
from bpf.typed_map import TypedMap

from .helpers import SPECS, backend4, closing, ip4, tool

pytestmark = pytest.mark.kernel

REPO = Path(__file__).resolve().parents[2]


def run_python(code: str, *args: str, env: dict[str, str] | None = None) -> str:
    """Run ``code`` in a fresh interpreter (a new process) and return its stdout."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


WRITER = """
    import sys
    from bpf import catalog
    from bpf.factory import BackendConfig, MapFactory
    from tests.bpf.helpers import backend4
    factory = MapFactory(BackendConfig(backend="kernel", pin_dir=sys.argv[1]))
    m = factory.open_typed(catalog.all_specs()["lb4_backends"].resized(int(sys.argv[2])))
    m.update_batch(range(100), [backend4(i) for i in range(100)])
    print(factory.kind)
"""

READER = """
    import json, sys
    from bpf import catalog
    from bpf.factory import BackendConfig, MapFactory
    factory = MapFactory(BackendConfig(backend="kernel", pin_dir=sys.argv[1]))
    m = factory.open_typed(catalog.all_specs()["lb4_backends"].resized(int(sys.argv[2])))
    print(json.dumps({k: m.spec.value.to_json(v) for k, v in m.dump()}))
"""


def test_reopen_from_new_process(kernel_pin_dir: str) -> None:
    """Entries written here are read by another process through the pin."""
    spec = SPECS["lb4_services"].resized(64)
    m = TypedMap(spec, open_or_create(KernelMap, spec, kernel_pin_dir))
    with m:
        expected = {}
        for i in range(10):
            key = lb.Service4Key(ip4(f"10.96.0.{i}"), 80 + i, 0, 6)
            value = lb.ServiceValue(count=i, rev_nat_index=i + 1)
            m.update(key, value)
            expected[spec.key.encode(key).hex()] = spec.value.encode(value).hex()
    out = run_python(
        """
        import json, sys
        from bpf import catalog
        from bpf.kernel_map import KernelMap
        spec = catalog.all_specs()["lb4_services"].resized(64)
        with KernelMap.open_pinned(sys.argv[1], spec) as m:
            print(json.dumps({k.hex(): v.hex() for k, v in m.dump()}))
        """,
        pin_path(kernel_pin_dir, spec.name),
    )
    assert json.loads(out) == expected


def test_restart_survival(kernel_pin_dir: str) -> None:
    """A process writes and exits; the next one (a 'restart') finds the same entries."""
    assert run_python(WRITER, kernel_pin_dir, "256").strip() == "kernel"
    after_restart = json.loads(run_python(READER, kernel_pin_dir, "256"))
    spec = SPECS["lb4_backends"]
    assert after_restart == {str(i): spec.value.to_json(backend4(i)) for i in range(100)}


def test_layout_change_after_restart(kernel_pin_dir: str, caplog: pytest.LogCaptureFixture) -> None:
    """A restart with a new capacity recreates the pinned map and says so."""
    run_python(WRITER, kernel_pin_dir, "256")
    factory = MapFactory(BackendConfig(backend="kernel", pin_dir=kernel_pin_dir))
    with caplog.at_level("WARNING", logger="statewright.bpf"):
        m = factory.open_typed(SPECS["lb4_backends"].resized(512))
    with m:
        assert m.count() == 0
        assert m.backend.info().max_entries == 512
    assert "pinned map lb4_backends" in caplog.text
    assert "max_entries 256 (want 512)" in caplog.text


def _bpftool_entries(path: str) -> list[tuple[bytes, bytes]]:
    out = subprocess.run(
        [tool("bpftool"), "map", "dump", "pinned", path, "-j"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [
        (bytes(int(b, 16) for b in e["key"]), bytes(int(b, 16) for b in e["value"]))
        for e in json.loads(out)
    ]


@pytest.mark.parametrize("name", ["lb4_services", "lb6_backends", "endpoints", "ipcache"])
def test_bpftool_reads_what_we_wrote(kernel_pin_dir: str, name: str) -> None:
    """bpftool's JSON dump decodes, with our codecs, to exactly the entries written."""
    spec = SPECS[name].resized(64)
    entries: dict[Any, Any] = {}
    for i in range(8):
        if name == "lb4_services":
            entries[lb.Service4Key(ip4(f"10.0.0.{i}"), 443, i)] = lb.ServiceValue(i, 8, 3)
        elif name == "lb6_backends":
            entries[i] = lb.Backend6(bytes(15) + bytes([i]), 8443, 6, i % 4, 1, 2)
        elif name == "endpoints":
            entries[endpoints.EndpointKey.ipv4(ip4(f"10.1.0.{i}"))] = endpoints.EndpointInfo(
                ifindex=i + 10, lxc_id=i, flags=endpoints.ENDPOINT_F_ATHOSTNS, mac=i << 8
            )
        else:
            entries[ipcache.IPCacheKey.for_cidr(ip4(f"10.{i}.0.0"), 16)] = (
                ipcache.RemoteEndpointInfo(1000 + i, ip4("192.168.0.1") + bytes(12), 1, 2)
            )
    m = TypedMap(spec, open_or_create(KernelMap, spec, kernel_pin_dir))
    with m:
        m.update_batch(list(entries), list(entries.values()))
    decoded = {
        spec.key.decode(k): spec.value.decode(v)
        for k, v in _bpftool_entries(pin_path(kernel_pin_dir, name))
    }
    assert decoded == entries


def test_cli_from_another_process(kernel_pin_dir: str) -> None:
    """``statewright bpf maps`` / ``bpf dump`` read the pins of a process that has exited."""
    run_python(WRITER, kernel_pin_dir, "256")
    cli = [sys.executable, "-m", "statewright.cli.bpf_commands", "bpf"]
    listed = subprocess.run(
        [*cli, "maps", "--pin-dir", kernel_pin_dir, "-o", "json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    ).stdout
    assert json.loads(listed) == [
        {
            "name": "lb4_backends",
            "type": "hash",
            "entries": 100,
            "max": 256,
            "pinned": pin_path(kernel_pin_dir, "lb4_backends"),
        }
    ]
    dumped = subprocess.run(
        [*cli, "dump", "lb4_backends", "--pin-dir", kernel_pin_dir, "-o", "json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    ).stdout
    rows = {e["key"]: e["value"] for e in json.loads(dumped)}
    assert rows[7] == {
        "address": "10.0.0.7",
        "port": 8080,
        "proto": 6,
        "flags": 0,
        "cluster_id": 0,
        "zone": 0,
    }
    assert len(rows) == 100
    table = subprocess.run(
        [*cli, "dump", "lb4_backends", "--pin-dir", kernel_pin_dir],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    ).stdout
    assert "address=10.0.0.7 port=8080" in table


def _without_bpf_caps(code: str) -> subprocess.CompletedProcess[str]:
    setpriv = tool("setpriv")
    return subprocess.run(
        [
            setpriv,
            "--inh-caps=-all",
            "--bounding-set=-bpf,-sys_admin,-perfmon",
            sys.executable,
            "-c",
            textwrap.dedent(code),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


def test_probe_and_eperm_hint_without_privileges() -> None:
    """Without CAP_BPF the probe says why, and map creation fails with a privilege hint."""
    result = _without_bpf_caps(
        """
        from bpf import catalog
        from bpf.errors import MapError
        from bpf.factory import MapFactory
        from bpf.kernel_map import KernelMap
        from bpf.probe import kernel_support
        print(kernel_support().reason)
        print(MapFactory().kind)
        try:
            KernelMap.create(catalog.all_specs()["lb4_services"])
        except MapError as exc:
            print(exc)
        """
    )
    assert result.returncode == 0, result.stderr
    reason, kind, error = result.stdout.strip().splitlines()
    assert "without CAP_BPF" in reason
    assert kind == "memory"
    assert error.startswith("map lb4_services: create: EPERM (operation not permitted")
    assert "CAP_BPF" in error


def test_kernel_marker_skips_or_fails_without_privileges(tmp_path: Path) -> None:
    """The conftest hook: a kernel test skips with the probe's reason, or fails when CI=true."""
    (tmp_path / "conftest.py").write_text((REPO / "tests" / "conftest.py").read_text())
    (tmp_path / "test_k.py").write_text(
        "import pytest\n\n@pytest.mark.kernel\ndef test_needs_kernel():\n    pass\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    kernel: needs BPF\n")
    base = f"import sys; sys.path.insert(0, {str(REPO)!r}); import pytest; "
    # pytest.fail() in a setup hook is reported as an error: the run fails (exit code 1).
    for ci, want, code_want in (("", "1 skipped", 0), ("true", "1 error", 1)):
        code = base + (
            f"sys.exit(pytest.main(['-q', '-rs', '-p', 'no:cacheprovider', {str(tmp_path)!r}]))"
        )
        env_prefix = f"import os; os.environ['CI'] = {ci!r}; "
        result = _without_bpf_caps(env_prefix + code)
        assert want in result.stdout, result.stdout + result.stderr
        assert result.returncode == code_want
        assert "kernel BPF unavailable: root but without CAP_BPF" in result.stdout


def test_factory_uses_kernel_here(kernel_pin_dir: str) -> None:
    """With privileges, "auto" picks the kernel backend and pins under the configured dir."""
    factory = MapFactory(BackendConfig(pin_dir=kernel_pin_dir))
    assert factory.kind == "kernel"
    with closing(factory.open(SPECS["lb4_reverse_nat"].resized(8))) as m:
        assert m.pinned_path == os.path.join(kernel_pin_dir, "lb4_reverse_nat")
