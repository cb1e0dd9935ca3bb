"""An HTTP/1.1 client on ``asyncio.Protocol``: one keep-alive connection pool, callbacks per read.

Why not aiohttp or httpx: at 256 streams on 2 cores both spend more CPU per streamed chunk
(a ``StreamReader``, a future and a wake-up per read) than the whole budget of a faithful
measurement; measured with ``benchmarks/calibrate.py`` (docs/design.md#benchmark-calibration). Here a
read costs one ``data_received`` call that timestamps the bytes on arrival, feeds them to the
response parser and hands the decoded body to the request's sink synchronously, and a request
is written with one ``transport.write`` right after its send time is taken.

What the library does: response parsing (status line, headers, ``Transfer-Encoding: chunked``
with extensions and trailers, ``Content-Length``, the keep-alive decision) is httptools'
``HttpResponseParser`` (the llhttp bindings uvicorn uses). What stays ours: the pool, the
request bytes (one formatted write), the per-read timestamp and one joined ``on_body`` per
read, the end of a close-delimited body (httptools does not expose ``llhttp_finish``), and the
stale keep-alive detection the caller retries on.

Scope (RFC 9112): ``http``/``https`` URLs, requests with a ``Content-Length`` body,
responses framed by ``Transfer-Encoding: chunked``, ``Content-Length`` or connection close;
keep-alive unless the response says ``Connection: close`` or is HTTP/1.0; no pipelining,
no redirects, no compression (the client sends ``Accept-Encoding: identity`` and its sinks refuse
any other ``Content-Encoding``). A sink may refuse the rest of a response by raising
:class:`kimi_deploy.wire.limits.Refused` (a body or line over its cap): the connection is closed and
the sink hears ``on_error``. A response head (status line and headers) over :data:`MAX_HEAD_BYTES`
is a bad response.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
import time
from typing import Protocol
from urllib.parse import urlsplit

import httptools

from kimi_deploy.errors import UsageError
from kimi_deploy.wire.limits import Refused


PARSER = f"httptools {httptools.__version__} (llhttp)"

#: Bytes of header names and values one response may carry: 64 KiB (llhttp sets no limit of its own;
#: SGLang's heads are a few hundred bytes). Also the bound on what is read before a head is complete (plus
#: 1 KiB for the status line and line ends), so a header that never ends costs 64 KiB, not the whole
#: ``--request-timeout`` of bytes (359 MiB at 60 s before, issue #30 item 11).
MAX_HEAD_BYTES = 64 << 10


class Sink(Protocol):
    """What a connection calls while a response arrives (``now``: ``time.perf_counter()`` of the read)."""

    def on_head(self, status: int, headers: dict[str, str], now: float) -> None: ...
    def on_body(self, data: bytes, now: float) -> None: ...
    def on_end(self, now: float) -> None: ...
    def on_error(self, reason: str, now: float) -> None: ...


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection carrying one request at a time.

    Each request gets a fresh ``httptools.HttpResponseParser`` whose callbacks only record
    (head, body pieces, end); after every ``feed_data`` the connection hands the sink, in this
    order, the head, the read's body pieces joined into one ``on_body`` call and the end, all
    stamped with the time of the read. No sink code runs inside a parser callback.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.sink: Sink | None = None
        self.parser: httptools.HttpResponseParser | None = None
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.head = False        # headers complete, not yet handed to the sink
        self.complete = False    # the parser saw the end of the response
        self.eof_body = False    # body delimited by the connection closing (RFC 9112 §6.3 rule 8)
        self.keep_alive = True
        self.got_bytes = False
        self.head_bytes = 0
        self.head_done = False   # the parser saw the end of the head (on_headers_complete)
        self.read_bytes = 0      # bytes fed to the parser for this response
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
        self.parser = httptools.HttpResponseParser(self)
        self.headers = {}
        self.body = []
        self.head = self.complete = self.eof_body = self.got_bytes = self.head_done = False
        self.head_bytes = self.read_bytes = 0
        self.used += 1
        self.transport.write(data)  # type: ignore[union-attr]

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()
            self.transport = None

    # httptools callbacks: record only
    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_bytes += len(name) + len(value)
        if self.head_bytes <= MAX_HEAD_BYTES:
            self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if self.complete:  # a second response in the same read: nobody asked for it
            self.keep_alive = False
            return
        self.head = self.head_done = True
        self.keep_alive = self.parser.should_keep_alive()  # type: ignore[union-attr]
        h = self.headers
        self.eof_body = "content-length" not in h and "chunked" not in h.get("transfer-encoding", "").lower()

    def on_body(self, body: bytes) -> None:
        if not self.complete:
            self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True

    def _finish(self, now: float) -> None:
        sink, self.sink, self.parser = self.sink, None, None
        if not self.keep_alive:
            self.close()
        sink.on_end(now)  # type: ignore[union-attr]

    def _fail(self, reason: str, now: float) -> None:
        sink, self.sink, self.parser = self.sink, None, None
        self.close()
        if sink is not None:
            sink.on_error(reason, now)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if self.sink is None:  # bytes nobody asked for: the connection is out of step
            self.close()
            return
        self.got_bytes = True
        try:
            self.parser.feed_data(data)  # type: ignore[union-attr]
        except httptools.HttpParserError as exc:
            self._fail(f"bad response: {exc}", now)
            return
        self.read_bytes += len(data)
        # a head that never ends (one header value or status line without its line end) is held by the parser
        # and never reaches on_header: bound the bytes read before the head is complete, not only the headers
        if self.head_bytes > MAX_HEAD_BYTES or (not self.head_done and self.read_bytes > MAX_HEAD_BYTES + 1024):
            self._fail(f"bad response: headers over {MAX_HEAD_BYTES} bytes", now)
            return
        try:
            self._deliver(now)
        except Refused as exc:  # the sink will not read more of this response
            self._fail(str(exc), now)

    def _deliver(self, now: float) -> None:
        if self.head:
            self.head = False
            self.sink.on_head(self.parser.get_status_code(), self.headers, now)  # type: ignore[union-attr]
        body = self.body
        if body and self.sink is not None:
            self.sink.on_body(body[0] if len(body) == 1 else b"".join(body), now)
            body.clear()
        if self.complete and self.sink is not None:
            self._finish(now)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.sink is None:
            return
        now = time.perf_counter()
        if self.eof_body and not self.complete:
            self.complete = True
            try:
                self._deliver(now)
            except Refused as exc:
                self._fail(str(exc), now)
        elif not self.got_bytes and self.used > 1:
            sink, self.sink, self.parser = self.sink, None, None
            sink.on_error("stale keep-alive connection", now)
        else:
            self._fail(f"connection lost: {exc or 'closed by the server'}", now)


class Pool:
    """Keep-alive connections to one origin, at most ``limit`` open (0: no limit).

    ``connect_timeout``: seconds one new connection may take, TCP connect and TLS handshake
    together (asyncio's own TLS handshake limit is 60 s: ``https://`` against a plain-HTTP
    port would wait that long).

    Raises on :meth:`acquire`:
        OSError: the TCP (or TLS) connection cannot be opened; ``TimeoutError`` (an OSError)
            when it is not open within ``connect_timeout``.
    """

    def __init__(self, base_url: str, limit: int = 0, connect_timeout: float = 30.0) -> None:
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
        self.connect_timeout = connect_timeout
        self.idle: list[Connection] = []
        self.open = 0
        self.waiters: collections.deque[asyncio.Future] = collections.deque()

    async def acquire(self, timeout: float | None = None) -> Connection:
        """An idle live connection, else a new one (waits when ``limit`` connections are busy).

        ``timeout``: seconds a new connection may take when below ``connect_timeout``.
        """
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
        limit = min(self.connect_timeout, timeout) if timeout else self.connect_timeout
        try:
            async with asyncio.timeout(limit):
                _, conn = await asyncio.get_running_loop().create_connection(
                    Connection, self.host, self.port, ssl=self.ssl,
                    ssl_handshake_timeout=limit if self.ssl else None)
        except TimeoutError:
            self.open -= 1
            self._wake(None)
            raise TimeoutError(f"{self.host}:{self.port}: no connection within {limit:g} s "
                               f"(TCP connect{' + TLS handshake' if self.ssl else ''})"
                               + (" - is the server plain http://?" if self.ssl else "")) from None
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
