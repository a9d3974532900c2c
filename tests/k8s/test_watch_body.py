"""A watch's chunked body read by the event loop (sources/k8s_watch_body.py): the
de-framed payload is the sent payload whatever the chunk sizes, extensions and read
boundaries; bad framing, a cut body and a stall are errors naming what was wrong; bodies
it does not read (compressed, not chunked) are left to urllib3."""

from __future__ import annotations

import gzip
import socket
import threading
import time

import anyio
import pytest
import urllib3
from hypothesis import given, settings
from hypothesis import strategies as st

from sources.k8s_watch_body import (
    MAX_SIZE_LINE,
    ChunkedBodyError,
    ChunkedDecoder,
    socket_body,
)

_chunks = st.lists(st.binary(min_size=1, max_size=300), max_size=12)
_extension = st.sampled_from([b"", b";a=b", b"; name=\"x;y\"", b" "])


def _encode(chunks: list[bytes], ext: bytes = b"", upper: bool = False) -> bytes:
    out = []
    for c in chunks:
        size = f"{len(c):X}" if upper else f"{len(c):x}"
        out.append(size.encode() + ext + b"\r\n" + c + b"\r\n")
    out.append(b"0" + ext + b"\r\n\r\n")
    return b"".join(out)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, start = [], 0
    for p in [*points, len(data)]:
        pieces.append(data[start:p])
        start = p
    return pieces


@settings(max_examples=300, deadline=None)
@given(_chunks, _extension, st.booleans(), st.lists(st.integers(0, 10_000), max_size=30))
def test_payload_survives_any_read_boundaries(
    chunks: list[bytes], ext: bytes, upper: bool, cuts: list[int]
) -> None:
    decoder = ChunkedDecoder()
    body = _encode(chunks, ext, upper)
    got = b"".join(decoder.feed(piece) for piece in _split(body, cuts))
    assert got == b"".join(chunks)
    assert decoder.finished


@settings(max_examples=100, deadline=None)
@given(_chunks, st.integers(1, 5000))
def test_not_finished_before_the_last_chunk(chunks: list[bytes], cut: int) -> None:
    body = _encode(chunks)
    last = body.rindex(b"0\r\n\r\n")
    decoder = ChunkedDecoder()
    got = decoder.feed(body[: min(cut, last)])
    assert not decoder.finished
    assert b"".join(chunks).startswith(got)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"zz\r\nab\r\n", "bad chunk-size line: b'zz'"),
        (b"-2\r\nab\r\n", "bad chunk-size line"),
        (b"0x2\r\nab\r\n", "bad chunk-size line"),
        (b"\r\n", "bad chunk-size line: b''"),
        (b"2\r\nabXY", "chunk data not followed by CRLF: b'XY'"),
        (b"1" * MAX_SIZE_LINE, "chunk-size line longer than"),
    ],
)
def test_bad_framing_is_an_error_naming_it(body: bytes, message: str) -> None:
    with pytest.raises(ChunkedBodyError, match=message.replace("(", r"\(")):
        ChunkedDecoder().feed(body)


def test_bytes_after_the_last_chunk_are_the_ignored_trailers() -> None:
    decoder = ChunkedDecoder()
    assert decoder.feed(b"3\r\nabc\r\n0\r\nX-Trailer: 1\r\n") == b"abc"
    assert decoder.finished
    assert decoder.feed(b"\r\n") == b""


class _OneShotServer:
    """An HTTP server on loopback that answers one request with ``response``, sent in
    ``pieces`` (each its own send, with a pause so that reads see them apart)."""

    def __init__(self, head: bytes, pieces: list[bytes], close_early: bool = False) -> None:
        self.head = head
        self.pieces = pieces
        self.close_early = close_early
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(self.head + self.pieces[0])
            for piece in self.pieces[1:]:
                time.sleep(0.02)
                conn.sendall(piece)
            if not self.close_early:
                conn.recv(1)  # until the client closes

    def get(self) -> urllib3.BaseHTTPResponse:
        pool = urllib3.PoolManager(retries=False)
        return pool.request("GET", f"http://127.0.0.1:{self.port}/watch",
                            preload_content=False, timeout=5.0)

    def close(self) -> None:
        self.listener.close()
        self.thread.join(5)


_CHUNKED_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def _read_all(
    resp: urllib3.BaseHTTPResponse, stall: float = 5.0
) -> tuple[list[bytes], BaseException | None]:
    """Every piece `SocketBody.take` returns, and the error that ended the body."""

    async def main() -> tuple[list[bytes], BaseException | None]:
        body = socket_body(resp, stall)
        assert body is not None
        pieces: list[bytes] = []
        while True:
            data, finished, error = await body.take()
            if data:
                pieces.append(data)
            if finished:
                return pieces, error

    try:
        return anyio.run(main)
    finally:
        resp.close()


def test_events_sent_together_arrive_in_one_piece() -> None:
    events = [b'{"type":"MODIFIED","n":%d}\n' % i for i in range(50)]
    body = _encode(events)
    # The first event arrives with the headers; the other 49 and the end in one send.
    first = body.index(b"\r\n", body.index(b"\r\n") + 2) + 2
    server = _OneShotServer(_CHUNKED_HEAD, [body[:first], body[first:]])
    try:
        pieces, error = _read_all(server.get())
    finally:
        server.close()
    assert error is None
    assert b"".join(pieces) == b"".join(events)
    assert len(pieces) <= 3  # not one per event (urllib3's stream() yields 50)


def test_a_body_cut_before_its_last_chunk_is_an_error() -> None:
    body = _encode([b"abc\n", b"def\n"])
    server = _OneShotServer(_CHUNKED_HEAD, [body[:-5]], close_early=True)
    try:
        pieces, error = _read_all(server.get())
    finally:
        server.close()
    assert isinstance(error, ChunkedBodyError)
    assert "ended before its last chunk" in str(error)
    assert b"".join(pieces) == b"abc\ndef\n"


def test_a_silent_stream_is_a_timeout_after_the_stall_limit() -> None:
    body = _encode([b"abc\n"])
    server = _OneShotServer(_CHUNKED_HEAD, [body[:-5]])  # then nothing, connection open
    try:
        pieces, error = _read_all(server.get(), stall=0.3)
    finally:
        server.close()
    assert isinstance(error, TimeoutError)
    assert pieces == [b"abc\n"]


@pytest.mark.parametrize("kind", ["gzip", "length"])
def test_other_bodies_are_left_to_urllib3(kind: str) -> None:
    payload = b'{"type":"ADDED"}\n' * 20
    if kind == "gzip":
        data = gzip.compress(payload)
        head = (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: "
                + str(len(data)).encode() + b"\r\n\r\n")
    else:
        data = payload
        head = b"HTTP/1.1 200 OK\r\nContent-Length: " + str(len(data)).encode() + b"\r\n\r\n"
    server = _OneShotServer(head, [data])
    try:
        resp = server.get()
        assert socket_body(resp, 5.0) is None
        assert resp.read() == payload
        resp.close()
    finally:
        server.close()
