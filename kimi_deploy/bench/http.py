"""A minimal HTTP/1.1 client on ``asyncio.Protocol``: one keep-alive connection pool, callbacks per read.

Why not aiohttp or httpx: at 256 streams on 2 cores both spend more CPU per streamed chunk
(a ``StreamReader``, a future and a wake-up per read) than the whole budget of a faithful
measurement; measured with ``benchmarks/calibrate.py`` (production.md, "Benchmark"). Here a
read costs one ``data_received`` call that timestamps the bytes on arrival and hands the
decoded body to the request's sink synchronously, and a request is written with one
``transport.write`` right after its send time is taken.

Scope (RFC 9112): ``http``/``https`` URLs, requests with a ``Content-Length`` body,
responses framed by ``Transfer-Encoding: chunked``, ``Content-Length`` or connection close;
keep-alive unless the response says ``Connection: close`` or is HTTP/1.0; no pipelining,
no redirects, no compression (``Accept-Encoding`` is not sent).
"""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
import time
from typing import Protocol
from urllib.parse import urlsplit

from kimi_deploy.errors import UsageError


class Sink(Protocol):
    """What a connection calls while a response arrives (``now``: ``time.perf_counter()`` of the read)."""

    def on_head(self, status: int, headers: dict[str, str], now: float) -> None: ...
    def on_body(self, data: bytes, now: float) -> None: ...
    def on_end(self, now: float) -> None: ...
    def on_error(self, reason: str, now: float) -> None: ...


class ConnectionLost(Exception):
    """A reused keep-alive connection closed before any byte of the response (safe to retry once)."""


_HEAD, _CHUNKED, _LENGTH, _EOF, _IDLE = range(5)


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection carrying one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.sink: Sink | None = None
        self.state = _IDLE
        self.buf = b""
        self.left = 0          # bytes left in the current chunk (chunked) or body (length)
        self.skip = 0          # CRLF bytes to skip after a chunk's data
        self.trailer = False   # reading the trailer section after the last chunk
        self.keep_alive = True
        self.got_bytes = False
        self.used = 0

    @property
    def alive(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, data: bytes, sink: Sink) -> None:
        """Write one whole request; the response goes to ``sink``."""
        self.sink = sink
        self.state = _HEAD
        self.buf = b""
        self.trailer = False
        self.got_bytes = False
        self.used += 1
        self.transport.write(data)  # type: ignore[union-attr]

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()
            self.transport = None

    def _finish(self, now: float) -> None:
        sink, self.sink, self.state = self.sink, None, _IDLE
        if not self.keep_alive:
            self.close()
        sink.on_end(now)  # type: ignore[union-attr]

    def _fail(self, reason: str, now: float) -> None:
        sink, self.sink, self.state = self.sink, None, _IDLE
        self.close()
        if sink is not None:
            sink.on_error(reason, now)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if self.sink is None:  # bytes nobody asked for: the connection is out of step
            self.close()
            return
        self.got_bytes = True
        if self.state == _HEAD:
            data = self.buf + data if self.buf else data
            end = data.find(b"\r\n\r\n")
            if end < 0:
                self.buf = data
                return
            self.buf = b""
            if not self._head(data[:end], now):
                return
            data = data[end + 4:]
            if self.state == _LENGTH and self.left == 0:
                self._finish(now)
                return
            if not data:
                return
        state = self.state
        if state == _CHUNKED:
            self._chunked(data, now)
        elif state == _LENGTH:
            take = data[:self.left]
            self.left -= len(take)
            self.sink.on_body(take, now)
            if self.left == 0 and self.sink is not None:
                self._finish(now)
        elif state == _EOF:
            self.sink.on_body(data, now)

    def _head(self, head: bytes, now: float) -> bool:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        try:
            status = int(parts[1])
        except (IndexError, ValueError):
            self._fail(f"bad status line {lines[0][:80]!r}", now)
            return False
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        self.keep_alive = parts[0] == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.state, self.left, self.skip = _CHUNKED, 0, 0
        elif "content-length" in headers:
            self.state, self.left = _LENGTH, int(headers["content-length"])
        else:
            self.state, self.keep_alive = _EOF, False
        self.sink.on_head(status, headers, now)  # type: ignore[union-attr]
        return self.sink is not None

    def _chunked(self, data: bytes, now: float) -> None:
        buf = self.buf + data if self.buf else data
        self.buf = b""
        pos, n = 0, len(buf)
        out: list[bytes] = []
        append, find = out.append, buf.find
        left, skip, trailer = self.left, self.skip, self.trailer
        done = False
        while pos < n:
            if left:  # inside a chunk that started in an earlier read
                take = min(left, n - pos)
                append(buf[pos:pos + take])
                pos += take
                left -= take
                if not left:
                    skip = 2
                continue
            if skip:  # the CRLF after a chunk's data
                take = min(skip, n - pos)
                pos += take
                skip -= take
                continue
            eol = find(b"\r\n", pos)
            if eol < 0:
                self.buf = buf[pos:]
                break
            if trailer:
                if eol == pos:
                    done = True
                    break
                pos = eol + 2
                continue
            try:
                size = int(buf[pos:eol], 16)
            except ValueError:
                try:
                    size = int(buf[pos:eol].split(b";", 1)[0], 16)  # chunk extensions
                except ValueError:
                    self._fail(f"bad chunk size line {buf[pos:eol][:40]!r}", now)
                    return
            pos = eol + 2
            if size == 0:
                trailer = True
                continue
            end = pos + size
            if end + 2 <= n:  # the common case: the whole chunk and its CRLF are in this read
                append(buf[pos:end])
                pos = end + 2
            else:
                left = size
        self.left, self.skip, self.trailer = left, skip, trailer
        if out:
            self.sink.on_body(out[0] if len(out) == 1 else b"".join(out), now)  # type: ignore[union-attr]
        if done and self.sink is not None:
            self._finish(now)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.sink is None:
            return
        now = time.perf_counter()
        if self.state == _EOF:
            self._finish(now)
        elif not self.got_bytes and self.used > 1:
            sink, self.sink, self.state = self.sink, None, _IDLE
            sink.on_error("stale keep-alive connection", now)
        else:
            self._fail(f"connection lost: {exc or 'closed by the server'}", now)


class Pool:
    """Keep-alive connections to one origin, at most ``limit`` open (0: no limit).

    Raises on :meth:`acquire`:
        OSError: the TCP (or TLS) connection cannot be opened.
    """

    def __init__(self, base_url: str, limit: int = 0) -> None:
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise UsageError("the base URL must be http://HOST[:PORT] or https://...", value=base_url,
                             hint="e.g. --base-url http://127.0.0.1:30000")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if u.scheme == "https" else None
        self.host_header = u.netloc.rsplit("@", 1)[-1]
        self.prefix = u.path.rstrip("/")
        self.limit = limit
        self.idle: list[Connection] = []
        self.open = 0
        self.waiters: collections.deque[asyncio.Future] = collections.deque()

    async def acquire(self) -> Connection:
        """An idle live connection, else a new one (waits when ``limit`` connections are busy)."""
        while self.idle:
            conn = self.idle.pop()
            if conn.alive:
                return conn
            self.open -= 1
        if self.limit and self.open >= self.limit:
            fut = asyncio.get_running_loop().create_future()
            self.waiters.append(fut)
            conn = await fut
            if conn is not None:
                return conn
        self.open += 1
        try:
            _, conn = await asyncio.get_running_loop().create_connection(
                Connection, self.host, self.port, ssl=self.ssl)
        except BaseException:
            self.open -= 1
            self._wake(None)
            raise
        return conn

    def release(self, conn: Connection) -> None:
        """Return ``conn``: kept for reuse when still alive and idle, else closed and its slot freed."""
        if conn.alive and conn.sink is None:
            self._wake(conn)
        else:
            conn.sink = None
            conn.close()
            self.open -= 1
            self._wake(None)

    def _wake(self, conn: Connection | None) -> None:
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(conn)  # None: the waiter opens a new connection in the freed slot
                return
        if conn is not None:
            self.idle.append(conn)

    def close(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()
        self.open = 0

    def request_bytes(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
        """The bytes of one request to ``path`` (appended to the base URL's path)."""
        lines = [f"{method} {self.prefix}{path} HTTP/1.1", f"Host: {self.host_header}",
                 f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
