"""A reader that closed standard output early (``statewright ... | head``): end quietly.

Shared by the CLI and the CNI plugin, which must stay light (it imports nothing heavy):
the exit status a shell gives a process killed by SIGPIPE, and a way to stop the
interpreter's final flush from printing 'Exception ignored ... BrokenPipeError'.
"""

from __future__ import annotations

import os
import signal
import sys

EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE


def discard_stdout() -> None:
    """Point file descriptor 1 at /dev/null so that the interpreter's final flush of what is
    still buffered for the closed pipe does not print 'Exception ignored ... BrokenPipeError'."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by an object without a file
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)
