"""A watch's HTTP/1.1 chunked body, read by the event loop from its socket.

The API server sends every watch event as an HTTP chunk of its own, about one per
millisecond at 1,000 events/s. Read by a worker thread (`sources.k8s_reflector`'s
``_WatchPump``), each event woke that thread, which then had to take the interpreter
lock from the busy event loop and hand the data back: about 8 % of a core in that thread
and over a thousand involuntary context switches a second on the loop's thread, for about
2 us of actual reading. `SocketBody` reads the socket from the event loop instead, when
it is readable (non-blocking, so the loop never waits on the network) and takes whatever
has arrived, however many events; `ChunkedDecoder` strips the HTTP framing from it.
"""

from __future__ import annotations

import http.client
import re
import socket
import ssl
from typing import Any

import anyio

from statedb.errors import StatewrightError

#: Longest chunk-size line accepted (size, extensions and CRLF): a longer one is not HTTP.
MAX_SIZE_LINE = 4096
#: Most bytes one `SocketBody.take` reads (a backlog is decoded 128 events per loop turn
#: by the reflector whatever the size).
READ_SIZE = 256 * 1024

_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")


class ChunkedBodyError(StatewrightError):
    """A chunked body that breaks HTTP/1.1's framing, or ends before its last chunk."""


class ChunkedDecoder:
    """Strips HTTP/1.1 chunked framing (RFC 9112, section 7.1) from a body fed in pieces of
    any size; `finished` once the last (zero-size) chunk's size line is seen. Chunk
    extensions are ignored, and so is everything after that line (the trailer section:
    the watch's connection is closed after its body, never reused)."""

    __slots__ = ("_crlf", "_left", "_pending", "finished")

    def __init__(self) -> None:
        self._left = 0  # data bytes of the current chunk still to come
        self._crlf = False  # the CRLF after a chunk's data is due
        self._pending = b""  # an incomplete size line or CRLF, kept for the next piece
        self.finished = False

    def feed(self, data: bytes) -> bytes:
        """The payload in ``data`` (possibly empty); raises `ChunkedBodyError` at a framing
        error."""
        if self.finished:
            return b""
        if self._pending:
            data, self._pending = self._pending + data, b""
        out: list[bytes] = []
        pos, end = 0, len(data)
        while pos < end:
            if self._left:
                take = min(self._left, end - pos)
                out.append(data[pos : pos + take])
                pos += take
                self._left -= take
                self._crlf = not self._left
            elif self._crlf:
                if end - pos < 2:
                    break
                if data[pos : pos + 2] != b"\r\n":
                    raise ChunkedBodyError(
                        f"chunk data not followed by CRLF: {data[pos : pos + 2]!r}"
                    )
                pos += 2
                self._crlf = False
            else:
                eol = data.find(b"\r\n", pos, pos + MAX_SIZE_LINE)
                if eol < 0:
                    if end - pos >= MAX_SIZE_LINE:
                        raise ChunkedBodyError(
                            f"chunk-size line longer than {MAX_SIZE_LINE} bytes: "
                            f"{data[pos : pos + 40]!r}..."
                        )
                    break
                size = _chunk_size(data[pos:eol])
                pos = eol + 2
                if size == 0:
                    self.finished = True
                    break
                self._left = size
        if pos < end and not self.finished:
            self._pending = data[pos:]
        return out[0] if len(out) == 1 else b"".join(out)


def _chunk_size(line: bytes) -> int:
    """The size of a chunk-size line (without its CRLF); extensions after ';' ignored."""
    field = line.split(b";", 1)[0].strip(b" \t")
    if not _HEX.fullmatch(field):
        raise ChunkedBodyError(f"bad chunk-size line: {line[:80]!r}")
    return int(field, 16)


class SocketBody:
    """The payload of one watch's chunked body, read from its socket by the event loop.

    `take` returns what has arrived (after a wait, when nothing has, for the socket to
    become readable, at most ``stall_timeout`` seconds), the end of the body, or the error
    that ended it: the shape `sources.k8s_reflector`'s consumer takes from a pump. Build
    it with `socket_body`; the caller closes the response (and with it the socket)."""

    def __init__(self, sock: socket.socket, buffered: bytes, stall_timeout: float) -> None:
        self._sock = sock
        self._buffered = buffered
        self._stall = stall_timeout
        self._decoder = ChunkedDecoder()

    async def take(self) -> tuple[bytes, bool, BaseException | None]:
        """(payload, body ended, its error): payload non-empty unless the body ended."""
        try:
            while not self._decoder.finished:
                data = await self._receive()
                if not data:
                    raise ChunkedBodyError("the watch stream ended before its last chunk")
                payload = self._decoder.feed(data)
                if payload:
                    return payload, False, None
        except (OSError, ChunkedBodyError) as e:  # TimeoutError included: a stall
            return b"", True, e
        return b"", True, None

    async def _receive(self) -> bytes:
        """What the socket holds, up to `READ_SIZE` bytes (b"" at its end), waiting for it
        to become readable when it holds nothing. A backlog is taken in one piece, as many
        reads as it needs (a TLS read returns one record: often one event)."""
        if self._buffered:
            data, self._buffered = self._buffered, b""
            return data
        while True:
            try:
                data = self._sock.recv(READ_SIZE)
            except (BlockingIOError, ssl.SSLWantReadError):
                ready = anyio.wait_readable
            except ssl.SSLWantWriteError:  # a TLS renegotiation that must send first
                ready = anyio.wait_writable
            else:
                return self._more(data) if data else data
            with anyio.fail_after(self._stall):
                await ready(self._sock)

    def _more(self, data: bytes) -> bytes:
        """``data`` and what else the socket holds now, up to `READ_SIZE` bytes."""
        pieces, size = [data], len(data)
        while size < READ_SIZE:
            try:
                more = self._sock.recv(READ_SIZE - size)
            except OSError:  # nothing more now; an error is raised again by the next read
                break
            if not more:  # the end: seen by the next read
                break
            pieces.append(more)
            size += len(more)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def socket_body(resp: Any, stall_timeout: float) -> SocketBody | None:
    """A `SocketBody` for a streamed (``_preload_content=False``) urllib3 response whose
    body is chunked, uncompressed and not yet read from; None for any other (the caller
    then reads it with urllib3 in a thread). Puts the socket in non-blocking mode."""
    reader = _raw_chunked_reader(resp)
    sock = getattr(getattr(resp, "connection", None), "sock", None)
    if reader is None or not isinstance(sock, socket.socket):
        return None
    sock.setblocking(False)
    # The bytes that arrived with the headers wait in the reader's buffer: this read returns
    # them, or else (one non-blocking read) what the socket holds, or nothing.
    try:
        buffered = reader.read1(READ_SIZE) or b""
    except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
        buffered = b""
    return SocketBody(sock, buffered, stall_timeout)


def _raw_chunked_reader(resp: Any) -> Any:
    """The buffered socket reader under a urllib3 response whose body is chunked,
    uncompressed and untouched; None otherwise. urllib3 keeps the http.client response
    as ``_fp`` (read here, and only here, with a fallback when it is not there): the
    bytes that arrived with the headers are in that reader's buffer, so the socket alone
    would miss them."""
    original = getattr(resp, "_fp", None)
    if not isinstance(original, http.client.HTTPResponse):
        return None
    if not original.chunked or original.chunk_left is not None:
        return None
    encoding = (resp.headers.get("content-encoding") or "identity").strip().lower()
    if encoding != "identity":
        return None
    reader = original.fp
    return reader if reader is not None and hasattr(reader, "read1") else None
