"""The fault-injecting wrapper, the backend factory and the error messages."""

from __future__ import annotations

import errno
import logging
import pickle
from pathlib import Path

import pytest

from bpf.errors import BatchError, MapError
from bpf.factory import BackendConfig, MapFactory
from bpf.memory_map import MemoryMap
from bpf.pinning import MapOpener
from bpf.probe import kernel_support
from bpf.testing import FaultyMap
from bpf.typed_map import TypedMap

from .helpers import SPECS, backend4, closing

SPEC = SPECS["lb4_backends"].resized(64)


def _failures(seed: int, probability: float) -> list[bool]:
    with closing(MemoryMap.create(SPEC)) as inner:
        faulty = FaultyMap(inner, probability, errno.EIO, seed=seed)
        m = TypedMap(SPEC, faulty)
        out = []
        for i in range(40):
            try:
                m.update(i, backend4(i))
                out.append(False)
            except MapError as exc:
                assert exc.errno == errno.EIO
                assert str(exc) == "map lb4_backends: update: EIO (injected fault)"
                out.append(True)
        assert faulty.injected == sum(out)
        return out


def test_faults_are_seeded_and_probabilistic() -> None:
    """The same seed fails the same calls; probability 0 never fails, 1 always does."""
    assert _failures(7, 0.5) == _failures(7, 0.5)
    assert _failures(7, 0.5) != _failures(8, 0.5)
    assert 5 < sum(_failures(7, 0.5)) < 35
    assert not any(_failures(1, 0.0))
    assert all(_failures(1, 1.0))


def test_failed_calls_do_not_touch_the_map(opener: MapOpener) -> None:
    """An injected failure happens before the operation: nothing is written."""
    with closing(opener.create(SPEC)) as inner:
        faulty = FaultyMap(inner, 1.0, errno.ENOMEM, ops=frozenset({"update", "update_batch"}))
        m = TypedMap(SPEC, faulty)
        with pytest.raises(MapError):
            m.update(1, backend4(1))
        with pytest.raises(BatchError) as exc:
            m.update_batch([1, 2], [backend4(1), backend4(2)])
        assert exc.value.done == 0
        assert m.count() == 0
        assert m.lookup(1) is None  # lookups are not in ops


def test_probability_is_validated() -> None:
    """Nonsense probabilities are refused."""
    with closing(MemoryMap.create(SPEC)) as inner, pytest.raises(ValueError):
        FaultyMap(inner, 1.5)


def test_factory_memory_when_configured(
    memory_pin_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    """backend="memory" uses memory maps and says so."""
    with caplog.at_level(logging.INFO, logger="statewright.bpf"):
        factory = MapFactory(BackendConfig(backend="memory", pin_dir=memory_pin_dir))
    assert factory.kind == "memory"
    assert "bpf: using memory maps (configured)" in caplog.text
    with factory.open_typed(SPEC) as m:
        m.update(1, backend4(1))
    with factory.open_typed(SPEC) as again:
        assert again.lookup(1) == backend4(1)


def test_factory_auto_follows_the_probe(memory_pin_dir: str) -> None:
    """backend="auto" picks the kernel exactly when the probe allows it, unpinned here."""
    factory = MapFactory(BackendConfig(pin=False))
    assert factory.kind == ("kernel" if kernel_support().ok else "memory")
    with factory.open_typed(SPEC) as m:
        assert m.backend.pinned_path is None


def test_error_messages_and_pickling() -> None:
    """Errors name the map, the operation and the errno; they survive pickling."""
    err = MapError("lb4_services", "update", errno.E2BIG)
    assert str(err) == "map lb4_services: update: E2BIG (map full)"
    assert err.errno == errno.E2BIG and err.map_name == "lb4_services" and err.op == "update"
    perm = MapError("ipcache", "create", errno.EPERM)
    assert "CAP_BPF" in str(perm)
    again = pickle.loads(pickle.dumps(BatchError("x", "update_batch", errno.ENOENT, 3)))
    assert isinstance(again, BatchError) and again.done == 3 and again.errno == errno.ENOENT


@pytest.mark.kernel
def test_pin_dir_outside_bpffs_is_named_as_such(tmp_path: Path) -> None:
    """A pin directory that is not on bpffs, while bpffs is mounted elsewhere, is reported
    as that (not as bpffs missing, which sends the user to mount it again)."""
    if not kernel_support().ok:
        pytest.skip(f"kernel maps unavailable: {kernel_support().reason}")
    reason = kernel_support(str(tmp_path / "pins")).reason
    assert f"{tmp_path / 'pins'} is not on a bpffs mount" in reason
    assert "/sys/fs/bpf" in reason and "mount -t bpf" not in reason
