"""statewright.netns_cookie: the cookie of a namespace read from outside equals what a
process inside reads; the calling thread's namespace is untouched; errors name the path."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import uuid

import pytest

from statewright.netns_cookie import NetnsCookieError, netns_cookie, own_netns_cookie

INSIDE = """
import socket, sys
with socket.socket() as s:
    print(int.from_bytes(s.getsockopt(socket.SOL_SOCKET, 71, 8), sys.byteorder))
"""


@pytest.mark.kernel  # entering a namespace needs CAP_SYS_ADMIN
def test_cookie_of_a_namespace() -> None:
    name = f"swcookie-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        home = own_netns_cookie()
        cookie = netns_cookie(f"/var/run/netns/{name}")
        inside = subprocess.run(
            ["ip", "netns", "exec", name, sys.executable, "-c", INSIDE],
            check=True, capture_output=True, text=True,
        )
        assert cookie == int(inside.stdout) and cookie != home
        assert own_netns_cookie() == home
        assert netns_cookie(f"/var/run/netns/{name}") == cookie  # stable while it lives
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_errors_name_the_path() -> None:
    with pytest.raises(NetnsCookieError) as exc:
        netns_cookie(f"/nonexistent/netns-{os.getpid()}")
    assert exc.value.errno == errno.ENOENT and "/nonexistent/" in str(exc.value)
