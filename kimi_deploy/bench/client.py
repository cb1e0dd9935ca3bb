"""The load client: one shared keep-alive connection pool and the kit's SSE framer (:mod:`kimi_deploy.wire.sse`).

Built so that the client is not what is measured (peers' pitfalls: vLLM's ``benchmarks/benchmark_serving.py``,
SGLang's ``python/sglang/bench_serving.py``): one connection pool (:mod:`kimi_deploy.bench.http`)
for the whole sweep, sized to at least the concurrency (aiohttp's and httpx's default cap is
100), keep-alive connections reused across requests, request bodies serialized before the
clock starts, no per-request session, no openai SDK. The response body is framed into SSE
events by :class:`kimi_deploy.wire.sse.Framer` (WHATWG rules, a linear line buffer, one line or event
at most ``--max-line-bytes``; peers' 64-128 KiB line buffers break on long chunks), JSON decoded
with ``orjson``. Every event read in one ``recv`` shares that ``recv``'s timestamp.

Hostile answers (issue #11): ``Accept-Encoding: identity`` is sent and a ``Content-Encoding``
other than identity is an error, never decoded; a stream that ends without ``data: [DONE]`` is an
error (``no [DONE]``), not a success; a line or event over ``--max-line-bytes`` and a kept body
(control plane, error bodies) over ``--max-body-bytes`` end the request with a ``too large`` error
and close its connection; chunk times are bounded (:data:`kimi_deploy.bench.metrics.MAX_CHUNK_TIMES`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kimi_deploy.bench.http import Pool
from kimi_deploy.bench.metrics import RequestRecord
from kimi_deploy.errors import KimiDeployError, UnreachableError
from kimi_deploy.wire.limits import LimitExceeded, Limits, Refused, parse_json
from kimi_deploy.wire.sse import DONE as _DONE, Framer

import orjson

_loads = orjson.loads
JSON_LIB = f"orjson {orjson.__version__}"

#: Seconds a control-plane call (``/server_info``, ``/v1/models``, ``/flush_cache``) may take at most;
#: a smaller ``request_timeout`` bounds it too. Each answers in milliseconds on an idle SGLang server.
CONTROL_TIMEOUT_S = 30.0

#: Bytes of an error body kept for the record's ``error`` (the rest is read, up to the body cap, and dropped).
ERROR_BODY_KEPT = 4096


def _finite_or_null(name: str) -> None:
    """``parse_constant`` hook: a server's ``NaN``/``Infinity`` (Python's json emits them) read as ``null``."""
    return None


def _encoding_refusal(headers: dict[str, str]) -> str | None:
    """Why a response's ``Content-Encoding`` is refused (``None``: identity, or none)."""
    encoding = headers.get("content-encoding", "").strip().lower()
    if encoding in ("", "identity"):
        return None
    return f"content-encoding {encoding!r} not decoded (Accept-Encoding: identity was sent)"[:200]


class NotRead(str):
    """The body a control-plane call stands in for an answer it refused to read (too large, encoded)."""


class SSESink:
    """Turns one streamed chat response into a :class:`RequestRecord` as the bytes arrive.

    ``done`` resolves when the response ended, failed or timed out. ``stale`` is set when a
    reused keep-alive connection closed before answering (the caller retries once).
    ``limits``: the caps (:class:`kimi_deploy.wire.limits.Limits`); past one, :meth:`on_body` records
    the error and raises :class:`kimi_deploy.wire.limits.Refused` (the connection closes).
    """

    __slots__ = ("rec", "done", "framer", "status", "error_body", "error_seen", "max_body", "stale", "chars",
                 "last")

    def __init__(self, done: asyncio.Future, limits: Limits = Limits()) -> None:
        self.rec = RequestRecord(t_sent=time.perf_counter())
        self.done = done
        self.framer = Framer(limits.max_line_bytes)
        self.max_body = limits.max_body_bytes
        self.status = 0
        self.error_body: bytearray | None = None
        self.error_seen = 0
        self.stale = False
        self.chars = 0
        self.last = 0.0

    def on_head(self, status: int, headers: dict[str, str], now: float) -> None:
        self.rec.status = self.status = status
        refusal = _encoding_refusal(headers)
        if refusal is not None:
            self.error_body = bytearray()
            self.rec.error = refusal if status == 200 else f"http {status}: {refusal}"
            self.rec.t_end = now
            raise Refused(refusal)
        if status != 200:
            self.error_body = bytearray()
        elif "text/event-stream" not in headers.get("content-type", ""):
            self.error_body = bytearray()
            self.rec.error = f"not a stream: content-type {headers.get('content-type', '')!r}"

    def _error_body(self, data: bytes, now: float) -> None:
        if len(self.error_body) < ERROR_BODY_KEPT:  # type: ignore[arg-type]
            self.error_body += data[:ERROR_BODY_KEPT]  # type: ignore[operator]
        self.error_seen += len(data)
        if self.max_body is not None and self.error_seen > self.max_body:
            exc = LimitExceeded("the body", self.max_body, "--max-body-bytes", self.error_seen)
            if self.rec.error is None:
                self.rec.error = f"too large: http {self.status}: {exc}"[:300]
            self.rec.t_end = now
            raise exc

    def on_body(self, data: bytes, now: float) -> None:
        if self.error_body is not None:
            self._error_body(data, now)
            return
        self.last = now
        rec = self.rec
        try:
            events = self.framer.feed(data)
        except LimitExceeded as exc:
            if rec.error is None:
                rec.error = f"too large: {exc}"[:300]
                rec.t_end = now
            raise
        loads = _loads
        chars = 0
        n = 0
        for payload in events:
            # hot path, once per streamed chunk: keep it to a few C calls
            if payload == _DONE:
                rec.t_end = now
                continue
            try:
                obj = loads(payload)
                choices = obj.get("choices")
                if choices:
                    delta = choices[0].get("delta")
                    if delta:
                        c = delta.get("content")
                        if c:
                            chars += len(c)
                            n += 1
                        else:
                            r = delta.get("reasoning_content") or delta.get("reasoning")
                            if r:
                                chars += len(r)
                                n += 1
                usage = obj.get("usage")
                if usage:
                    tokens = usage.get("completion_tokens")
                    rec.output_tokens = tokens if type(tokens) is int and tokens >= 0 else None
                    tokens = usage.get("prompt_tokens")
                    rec.prompt_tokens = tokens if type(tokens) is int and tokens >= 0 else None
                elif "error" in obj and rec.error is None:
                    err = obj["error"]
                    msg = err.get("message", err) if isinstance(err, dict) else err
                    rec.error = f"error frame: {msg}"[:300]
                    rec.t_end = now
            except ValueError as exc:  # not JSON
                if rec.error is None:
                    rec.error = f"bad frame: {exc}: {payload[:80]!r}"
                    rec.t_end = now
            except (AttributeError, TypeError, IndexError):  # JSON of another shape: nothing to count
                pass
        if n:
            rec.add_chunks(now, n)
        self.chars += chars

    def on_end(self, now: float) -> None:
        rec = self.rec
        rec.text_chars = self.chars
        if self.error_body is not None and self.status != 200:
            if rec.error is None:
                rec.error = f"http {self.status}: {bytes(self.error_body[:300]).decode('utf-8', 'replace')}"
        elif rec.t_end is None:
            try:
                last = self.framer.end()  # "data: [DONE]" without its blank line still ends the stream
            except LimitExceeded:
                last = None
            if last == _DONE and rec.error is None:
                rec.t_end = self.last or now
            else:
                if rec.error is None and self.error_body is None:
                    rec.error = "no [DONE]: the stream ended without data: [DONE]"
                rec.t_end = self.last or now
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
    """Collects a whole small response (control-plane calls), at most ``max_body`` bytes."""

    def __init__(self, done: asyncio.Future, max_body: int | None) -> None:
        self.done = done
        self.status = 0
        self.body = bytearray()
        self.max_body = max_body
        self.error: str | None = None
        self.refused: str | None = None

    def on_head(self, status: int, headers: dict[str, str], now: float) -> None:
        self.status = status
        refusal = _encoding_refusal(headers)
        if refusal is not None:
            self.refused = refusal
            raise Refused(refusal)

    def on_body(self, data: bytes, now: float) -> None:
        self.body += data
        if self.max_body is not None and len(self.body) > self.max_body:
            exc = LimitExceeded("the body", self.max_body, "--max-body-bytes", len(self.body))
            self.refused = str(exc)
            self.body = bytearray()
            raise exc

    def on_end(self, now: float) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def on_error(self, reason: str, now: float) -> None:
        if self.error is None:
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
        limits: the byte caps (``--max-body-bytes``, ``--max-line-bytes``; :class:`kimi_deploy.wire.limits.Limits`).

    Use as ``async with StreamClient(...) as client``.

    Raises:
        UsageError: the base URL is not ``http(s)://HOST[:PORT]``.
    """

    def __init__(self, base_url: str, *, pool_size: int = 0, api_key: str | None = None,
                 request_timeout: float = 600.0, limits: Limits = Limits()) -> None:
        base = base_url.rstrip("/")
        self.base_url = base[:-3] if base.endswith("/v1") else base
        self.pool = Pool(self.base_url, pool_size, connect_timeout=request_timeout)
        self.request_timeout = request_timeout
        self.limits = limits
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream",
                        "Accept-Encoding": "identity", "User-Agent": "kimi-deploy-bench"}
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
        ``disconnected: <reason>``, ``bad frame: <reason>``, ``not a stream: ...``, ``no [DONE]: ...``,
        ``too large: ...``, ``content-encoding ...``).
        """
        loop = asyncio.get_running_loop()
        data = self._chat_head + str(len(body)).encode() + self._chat_rest + body
        sink = SSESink(loop.create_future(), self.limits)
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
        """``GET base_url + path``: ``(status, parsed JSON or text)``; a body refused (over
        ``--max-body-bytes``, or encoded) comes back as a :class:`NotRead` text saying why.

        Raises:
            UnreachableError: the server does not answer at all (exit 3).
            KimiDeployError: it sent bytes that are no usable HTTP answer: a head over the cap, a broken one, or
                no whole answer in time (exit 1).
        """
        return await self._call("GET", path)

    async def post(self, path: str) -> tuple[int, Any]:
        """``POST base_url + path`` with an empty body: ``(status, parsed JSON or text)``.

        Raises:
            UnreachableError: the server does not answer at all (exit 3).
            KimiDeployError: it sent bytes that are no usable HTTP answer: a head over the cap, a broken one, or
                no whole answer in time (exit 1).
        """
        return await self._call("POST", path)

    async def _call(self, method: str, path: str) -> tuple[int, Any]:
        """One control-plane request, bounded by ``min(CONTROL_TIMEOUT_S, request_timeout)`` after connecting."""
        loop = asyncio.get_running_loop()
        headers = {k: v for k, v in self.headers.items() if k != "Accept"}
        reason = None
        answered = False
        limit = min(CONTROL_TIMEOUT_S, self.request_timeout)
        for _ in (0, 1):
            sink = _BufferSink(loop.create_future(), self.limits.max_body_bytes)
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
                sink.error = (f"no whole answer within {limit:g} s (--request-timeout)" if conn.got_bytes
                              else f"no answer within {limit:g} s (--request-timeout)")
                conn.close()
            answered = conn.got_bytes
            self.pool.release(conn)
            if sink.refused is not None:
                return sink.status, NotRead(f"<not read: {sink.refused}>")
            if sink.error == "stale keep-alive connection":
                continue
            if sink.error is None:
                raw = bytes(sink.body)
                try:
                    return sink.status, parse_json(raw, parse_constant=_finite_or_null)
                except ValueError:  # not JSON (or invalid UTF-8), or nested past the stack
                    return sink.status, raw.decode("utf-8", "replace")
            reason = sink.error
            break
        if answered:  # bytes came back: the server is up, its answer is what failed (exit 1, not 3)
            raise KimiDeployError(f"the server at {self.base_url} answered {method} {path}, but not with a usable "
                                  "HTTP answer", value=reason,
                                  hint="is --base-url an OpenAI-compatible server (SGLang, vLLM)? `curl -i "
                                       "BASE_URL/v1/models` shows what it sends")
        raise UnreachableError(f"the server at {self.base_url} did not answer {method} {path}", value=reason,
                               hint="check --base-url and that the server is up (`curl BASE_URL/v1/models`)")
