"""The load client: one shared keep-alive connection pool and the kit's own SSE framing.

Built so that the client is not what is measured (peers' pitfalls, see
``shared/notes/benchmark-metrics.md``): one connection pool (:mod:`kimi_deploy.bench.http`)
for the whole sweep, sized to at least the concurrency (aiohttp's and httpx's default cap is
100), keep-alive connections reused across requests, request bodies serialized before the
clock starts, no per-request session, no openai SDK. The response body is framed into SSE
events here with no line-length limit (peers' 64-128 KiB line buffers break on long chunks),
JSON decoded with ``orjson`` when installed. Every event read in one ``recv`` shares that
``recv``'s timestamp.

Stream grammar handled (OpenAI Chat Completions streaming; SSE per the WHATWG HTML spec):
events separated by a blank line (``\\n\\n`` or ``\\r\\n\\r\\n``), ``data:`` lines joined with
``\\n``, comment lines (``:``) and other fields ignored, ``data: [DONE]`` ends the stream,
a JSON object with an ``error`` key is an error frame.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from kimi_deploy.bench.http import Pool
from kimi_deploy.bench.metrics import RequestRecord
from kimi_deploy.errors import UnreachableError

import orjson

_loads = orjson.loads
JSON_LIB = f"orjson {orjson.__version__}"

_DONE = b"[DONE]"

#: Seconds a control-plane call (``/server_info``, ``/v1/models``, ``/flush_cache``) may take at most;
#: a smaller ``request_timeout`` bounds it too. Each answers in milliseconds on an idle SGLang server.
CONTROL_TIMEOUT_S = 30.0


def _finite_or_null(name: str) -> None:
    """``parse_constant`` hook: a server's ``NaN``/``Infinity`` (Python's json emits them) read as ``null``."""
    return None


def _event_data(event: bytes) -> bytes | None:
    """The ``data`` of one SSE event with several lines or fields; ``None`` when it has none."""
    parts = [line[5:].removeprefix(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(parts) if parts else None


class SSESink:
    """Turns one streamed chat response into a :class:`RequestRecord` as the bytes arrive.

    ``done`` resolves when the response ended, failed or timed out. ``stale`` is set when a
    reused keep-alive connection closed before answering (the caller retries once).
    """

    __slots__ = ("rec", "done", "pending", "status", "error_body", "stale", "chars", "last")

    def __init__(self, done: asyncio.Future) -> None:
        self.rec = RequestRecord(t_sent=time.perf_counter())
        self.done = done
        self.pending = b""
        self.status = 0
        self.error_body: bytearray | None = None
        self.stale = False
        self.chars = 0
        self.last = 0.0

    def on_head(self, status: int, headers: dict[str, str], now: float) -> None:
        self.rec.status = self.status = status
        if status != 200:
            self.error_body = bytearray()
        elif "text/event-stream" not in headers.get("content-type", ""):
            self.error_body = bytearray()
            self.rec.error = f"not a stream: content-type {headers.get('content-type', '')!r}"

    def on_body(self, data: bytes, now: float) -> None:
        if self.error_body is not None:
            if len(self.error_body) < 4096:
                self.error_body += data
            return
        self.last = now
        rec = self.rec
        if self.pending:
            data = self.pending + data
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        events = data.split(b"\n\n")
        self.pending = events.pop()
        mark = rec.chunk_times.append
        loads = _loads
        chars = 0
        for event in events:
            # hot path, once per streamed chunk: keep it to a few C calls
            if event[:6] == b"data: " and b"\n" not in event:
                payload = event[6:]
            else:
                payload = _event_data(event)
                if payload is None:
                    continue
            if payload == _DONE:
                rec.t_end = now
                continue
            try:
                obj = loads(payload)
                choices = obj.get("choices")
            except ValueError as exc:
                if rec.error is None:
                    rec.error = f"bad frame: {exc}: {payload[:80]!r}"
                    rec.t_end = now
                continue
            except AttributeError:  # valid JSON but not an object
                continue
            if choices:
                delta = choices[0].get("delta")
                if delta:
                    c = delta.get("content")
                    if c:
                        mark(now)
                        chars += len(c)
                    else:
                        r = delta.get("reasoning_content") or delta.get("reasoning")
                        if r:
                            mark(now)
                            chars += len(r)
            usage = obj.get("usage")
            if usage:
                rec.output_tokens = usage.get("completion_tokens")
                rec.prompt_tokens = usage.get("prompt_tokens")
            elif "error" in obj and rec.error is None:
                err = obj["error"]
                msg = err.get("message", err) if isinstance(err, dict) else err
                rec.error = f"error frame: {msg}"[:300]
                rec.t_end = now
        self.chars += chars

    def on_end(self, now: float) -> None:
        rec = self.rec
        rec.text_chars = self.chars
        if self.error_body is not None and self.status != 200:
            rec.error = f"http {self.status}: {bytes(self.error_body[:300]).decode('utf-8', 'replace')}"
        if rec.t_end is None:
            rec.t_end = self.last or now  # no [DONE]: E2E to the last byte
        if not self.done.done():
            self.done.set_result(None)

    def on_error(self, reason: str, now: float) -> None:
        rec = self.rec
        rec.text_chars = self.chars
        if reason == "stale keep-alive connection":
            self.stale = True
        elif rec.error is None:
            rec.error = f"disconnected: {reason}"[:300]
        if not self.done.done():
            self.done.set_result(None)

    def expire(self) -> None:
        """The request ran past its timeout."""
        if not self.done.done():
            self.rec.error = "timeout"
            self.rec.text_chars = self.chars
            self.done.set_result(None)


class _BufferSink:
    """Collects a whole small response (control-plane calls)."""

    def __init__(self, done: asyncio.Future) -> None:
        self.done = done
        self.status = 0
        self.body = bytearray()
        self.error: str | None = None

    def on_head(self, status: int, headers: dict[str, str], now: float) -> None:
        self.status = status

    def on_body(self, data: bytes, now: float) -> None:
        self.body += data

    def on_end(self, now: float) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def on_error(self, reason: str, now: float) -> None:
        self.error = reason
        if not self.done.done():
            self.done.set_result(None)


class StreamClient:
    """An async client holding one connection pool for a whole benchmark.

    Args:
        base_url: ``http(s)://HOST:PORT`` (a ``/v1`` suffix is accepted and dropped).
        pool_size: connection pool limit; at least the highest concurrency (0: no limit).
        api_key: sent as ``Authorization: Bearer`` when given.
        request_timeout: seconds one streamed request may take end to end; past it the
            request is recorded with ``error="timeout"`` and its connection closed. It also
            bounds every new connection (TCP connect + TLS handshake) and each control-plane
            call (:data:`CONTROL_TIMEOUT_S` at most).

    Use as ``async with StreamClient(...) as client``.

    Raises:
        UsageError: the base URL is not ``http(s)://HOST[:PORT]``.
    """

    def __init__(self, base_url: str, *, pool_size: int = 0, api_key: str | None = None,
                 request_timeout: float = 600.0) -> None:
        base = base_url.rstrip("/")
        self.base_url = base[:-3] if base.endswith("/v1") else base
        self.pool = Pool(self.base_url, pool_size, connect_timeout=request_timeout)
        self.request_timeout = request_timeout
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream",
                        "User-Agent": "kimi-deploy-bench"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        head = self.pool.request_bytes("POST", "/v1/chat/completions", b"", self.headers)
        # everything up to the Content-Length value, which differs per body
        marker = b"Content-Length: 0\r\n"
        i = head.index(marker)
        self._chat_head = head[:i] + b"Content-Length: "
        self._chat_rest = b"\r\n" + head[i + len(marker):]

    async def __aenter__(self) -> StreamClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.pool.close()

    async def stream(self, body: bytes) -> RequestRecord:
        """POST one serialized chat request (``stream: true``); return its event timeline.

        Never raises for a server or network failure: the record's ``error`` says what
        happened (``http <status>: <body>``, ``error frame: <message>``, ``timeout``,
        ``disconnected: <reason>``, ``bad frame: <reason>``, ``not a stream: ...``).
        """
        loop = asyncio.get_running_loop()
        data = self._chat_head + str(len(body)).encode() + self._chat_rest + body
        sink = SSESink(loop.create_future())
        timer = loop.call_later(self.request_timeout, sink.expire)
        try:
            for attempt in (0, 1):
                try:
                    conn = await self.pool.acquire()
                except OSError as exc:
                    sink.rec.error = f"disconnected: cannot connect: {exc}"[:300]
                    return sink.rec
                conn.send(data, sink)
                await sink.done
                self.pool.release(conn)  # closed if the response did not end (timeout)
                if sink.stale and attempt == 0:
                    sink.stale = False
                    sink.done = loop.create_future()
                    continue
                break
            return sink.rec
        finally:
            timer.cancel()

    async def get_json(self, path: str) -> tuple[int, Any]:
        """``GET base_url + path``: ``(status, parsed JSON or text)``.

        Raises:
            UnreachableError: the server does not answer at all.
        """
        return await self._call("GET", path)

    async def post(self, path: str) -> tuple[int, Any]:
        """``POST base_url + path`` with an empty body: ``(status, parsed JSON or text)``.

        Raises:
            UnreachableError: the server does not answer at all.
        """
        return await self._call("POST", path)

    async def _call(self, method: str, path: str) -> tuple[int, Any]:
        """One control-plane request, bounded by ``min(CONTROL_TIMEOUT_S, request_timeout)`` after connecting."""
        loop = asyncio.get_running_loop()
        headers = {k: v for k, v in self.headers.items() if k != "Accept"}
        reason = None
        limit = min(CONTROL_TIMEOUT_S, self.request_timeout)
        for _ in (0, 1):
            sink = _BufferSink(loop.create_future())
            try:
                conn = await self.pool.acquire(timeout=limit)
            except OSError as exc:
                reason = f"{type(exc).__name__}: {exc}"
                break
            conn.send(self.pool.request_bytes(method, path, b"", headers), sink)
            try:
                async with asyncio.timeout(limit):
                    await sink.done
            except TimeoutError:
                sink.error = f"no answer within {limit:g} s (--request-timeout)"
                conn.close()
            self.pool.release(conn)
            if sink.error == "stale keep-alive connection":
                continue
            if sink.error is None:
                raw = bytes(sink.body)
                try:
                    return sink.status, json.loads(raw, parse_constant=_finite_or_null)
                except ValueError:
                    return sink.status, raw.decode("utf-8", "replace")
            reason = sink.error
            break
        raise UnreachableError(f"the server at {self.base_url} did not answer {method} {path}", value=reason,
                               hint="check --base-url and that the server is up (`curl BASE_URL/v1/models`)")
