"""The pin directory's lock (`bpf.pinning.lock_pin_dir`): one agent per pin directory, the
holder named in the error, released when its holder ends however it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from bpf.pinning import PinDirLockedError, PinDirLockError, lock_pin_dir
from tests.pins import BPFFS, remove_pin_dir

#: A child that takes the lock of argv[1], says so, and waits to be killed.
HOLDER = (
    "import sys, time\n"
    "from bpf.pinning import lock_pin_dir\n"
    "lock_pin_dir(sys.argv[1])\n"
    "print('locked', flush=True)\n"
    "time.sleep(60)\n"
)
REPO = Path(__file__).resolve().parents[2]


def _holder(pin_dir: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, pin_dir], stdout=subprocess.PIPE,
                            text=True, cwd=REPO)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "locked":
        proc.kill()
        proc.wait()
        raise AssertionError("the holder did not take the lock")
    return proc


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()


def _check_lock(pin_dir: str) -> None:
    holder = _holder(pin_dir)
    try:
        with pytest.raises(PinDirLockedError) as exc:
            lock_pin_dir(pin_dir)
        assert str(exc.value) == (f"pin directory {pin_dir}: its maps are in use by another "
                                  f"agent (pid {holder.pid})")
    finally:
        # SIGKILL, as an agent that crashed: its lock goes with it
        _kill(holder)
    fd = lock_pin_dir(pin_dir)
    try:
        other = subprocess.run([sys.executable, "-c", HOLDER, pin_dir], capture_output=True,
                               text=True, cwd=REPO, timeout=30)
        assert other.returncode == 1
        assert f"in use by another agent (pid {os.getpid()})" in other.stderr
    finally:
        os.close(fd)
    _kill(_holder(pin_dir))  # released by close


def test_lock_is_exclusive_names_the_holder_and_dies_with_it(tmp_path: Path) -> None:
    pin_dir = str(tmp_path / "pins")
    _check_lock(pin_dir)
    assert os.path.isdir(pin_dir)
    assert os.listdir(pin_dir) == []  # the lock leaves nothing in the directory


@pytest.mark.kernel
def test_lock_on_bpffs() -> None:
    """bpffs holds no regular files: the lock is on the directory itself."""
    if not os.path.ismount(BPFFS):
        pytest.skip(f"no bpffs at {BPFFS}")
    pin_dir = os.path.join(BPFFS, f"swlock-test-{uuid.uuid4().hex[:8]}")
    try:
        _check_lock(pin_dir)
        assert os.listdir(pin_dir) == []
    finally:
        remove_pin_dir(pin_dir)


def test_a_directory_that_cannot_be_created_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(PinDirLockError, match="cannot open it to lock it") as exc:
        lock_pin_dir(str(tmp_path / "file" / "pins"))
    assert not isinstance(exc.value, PinDirLockedError)
