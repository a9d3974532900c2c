"""Helpers for the netlink tests: change a namespace with ``ip``, poll with a deadline, skip or
fail (CI=true) when the machine cannot run kernel tests."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable

import anyio
import pytest


def unavailable(reason: str) -> None:
    """Skip (or fail under CI=true) a kernel test that cannot run here."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true requires kernel tests to run)", pytrace=False)
    pytest.skip(reason)


def netns_names() -> set[str]:
    """The names listed by ``ip netns list``."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


_DUMMY_KIND: list[str] = []


async def ip(ns: str, *args: str, stdin: str | None = None) -> str:
    """Run ``ip -n NS ARGS`` (or ``ip -n NS -batch -`` with ``stdin``); raise with stderr."""
    cmd = ["ip", "-n", ns, *args]
    try:
        r = await anyio.run_process(cmd, input=stdin.encode() if stdin is not None else None)
    except subprocess.CalledProcessError as e:
        raise AssertionError(
            f"{' '.join(cmd)} failed ({e.returncode}): {e.stderr.decode().strip()}"
        ) from None
    return r.stdout.decode()


async def add_dummy(ns: str, name: str) -> str:
    """Create a dummy device; kernels without the dummy driver get an ifb device (also a
    peerless, always-up software device). Returns the kind used."""
    if not _DUMMY_KIND:
        try:
            await ip(ns, "link", "add", name, "type", "dummy")
            _DUMMY_KIND.append("dummy")
            return "dummy"
        except AssertionError as e:
            if "Unknown device type" not in str(e) and "not supported" not in str(e):
                raise
            _DUMMY_KIND.append("ifb")
        await ip(ns, "link", "add", name, "type", "ifb")
        return "ifb"
    await ip(ns, "link", "add", name, "type", _DUMMY_KIND[0])
    return _DUMMY_KIND[0]


async def eventually(check: Callable[[], None], timeout: float = 10.0,
                     interval: float = 0.02) -> None:
    """Call ``check`` until it stops raising AssertionError; after ``timeout`` seconds
    re-raise its last failure (the bounded wait of every kernel assertion)."""
    deadline = anyio.current_time() + timeout
    while True:
        try:
            check()
            return
        except AssertionError:
            if anyio.current_time() >= deadline:
                raise
        await anyio.sleep(interval)
