"""The netlink tests' fixture: a network namespace per test, always deleted.

Creating a namespace needs CAP_SYS_ADMIN/CAP_NET_ADMIN and the ``ip`` tool: without them
the kernel tests skip, and fail instead under CI=true, like the shared kernel hook.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from .helpers import netns_names, unavailable


@pytest.fixture
def netns() -> Iterator[str]:
    """A fresh, empty network namespace (only ``lo``, down), deleted afterwards."""
    if shutil.which("ip") is None:
        unavailable("the ip tool (iproute2) is not installed")
    name = f"swtest-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if r.returncode != 0:
        unavailable(f"cannot create a network namespace: {r.stderr.strip()}")
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, text=True)
        assert name not in netns_names(), f"network namespace {name} was left behind"

