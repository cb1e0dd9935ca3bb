#!/usr/bin/env python3
"""A synthetic OpenAI-compatible streaming server whose timing is known: the truth for calibration.

``POST /v1/chat/completions`` answers every request with ``max_tokens`` (or
``max_completion_tokens``; ``--output-tokens`` overrides) output tokens, ``finish_reason``
``length``, as SGLang with ``ignore_eos`` does. ``--eos-tokens N`` plays a model that ends
its answer: at most N tokens, ``finish_reason`` ``stop`` when that is fewer than asked
(a request with ``"ignore_eos": true`` still gets them all). The tokens go out on a fixed
schedule measured from the moment the request is parsed:

- the first chunk carrying text leaves at ``--ttft-ms``;
- then one chunk every ``--gap-ms``, each carrying ``--tokens-per-chunk`` tokens (a
  speculative-decoding burst when > 1), ``--jitter-ms`` uniform noise on each step;
- the first ``--reasoning-tokens`` tokens go out as ``reasoning_content`` (SGLang's field);
- after the last text chunk, in the same write: a ``finish_reason`` chunk, the usage chunk
  (when the request asks ``stream_options.include_usage`` and ``--no-usage`` is not set),
  ``data: [DONE]``.

So for N tokens in chunks of k: TTFT = ttft, E2E = ttft + (ceil(N/k) - 1) * gap,
TPOT = (E2E - TTFT) / (N - 1). ``--gap-ms 0 --ttft-ms 0`` streams the whole answer
in one write as fast as the client can read it (a client-overhead test).

Single-threaded asyncio (uvloop when installed) with raw ``asyncio.Protocol``
handlers and a listen backlog of 4096: a threaded stdlib server cannot keep its
schedule at 256 streams on 2 cores, and its default backlog of 5 drops SYNs (the
retry adds 1-2 s to TTFT). HTTP/1.1 keep-alive, SSE framed one event per HTTP chunk
(``Transfer-Encoding: chunked``, as uvicorn sends SGLang's ``StreamingResponse``).

Also serves ``GET /server_info`` (the synthetic settings plus, with
``--spec-accept-length``, ``internal_states[0].avg_spec_accept_length`` as SGLang
0.5.23 reports it; ``chat_requests`` and ``completion_tokens_served`` count what was asked of it),
``GET|POST /flush_cache`` (404 with ``--no-flush-cache``),
``GET /v1/models``, ``GET /health``. ``--chat-status 500`` makes every chat request fail
with that status (a broken server whose control plane still answers). Prints ``listening on http://HOST:PORT`` on stdout
once bound (``--port 0`` picks a free port). Standard library only (uvloop optional).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import socket
import sys
import time

TOKEN_WORDS = [" the", " model", " answers", " with", " tokens", " that", " stream", " back", " to",
               " a", " client", " over", " HTTP", ",", " one", " chunk", " at", " time", "."]


class Settings:
    """Server behaviour (milliseconds, token counts); see the module docstring."""

    def __init__(self, ns: argparse.Namespace) -> None:
        self.ttft = ns.ttft_ms / 1000.0
        self.gap = ns.gap_ms / 1000.0
        self.jitter = ns.jitter_ms / 1000.0
        self.tokens_per_chunk = ns.tokens_per_chunk
        self.output_tokens = ns.output_tokens
        self.eos_tokens = ns.eos_tokens
        self.default_max_tokens = ns.default_max_tokens
        self.reasoning_tokens = ns.reasoning_tokens
        self.usage = not ns.no_usage
        self.flush_cache = not ns.no_flush_cache
        self.spec_accept_length = ns.spec_accept_length
        self.model = ns.model
        self.chat_status = ns.chat_status
        self.rng = random.Random(ns.seed)
        self.raw = {k: v for k, v in vars(ns).items() if k not in ("host", "port")}


STREAM_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
               b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n")


def _chunk(payload: bytes) -> bytes:
    """One SSE event as one HTTP/1.1 chunk."""
    event = b"data: " + payload + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(event), event)


class Stream:
    """The pre-rendered chunks of one streamed answer and its schedule."""

    def __init__(self, settings: Settings, request_id: str, n_tokens: int, prompt_tokens: int,
                 include_usage: bool, finish: str = "length") -> None:
        k = settings.tokens_per_chunk
        n_chunks = max(1, math.ceil(n_tokens / k))
        created = int(time.time())
        head = ('{"id":"%s","object":"chat.completion.chunk","created":%d,"model":%s,"choices":[{"index":0,'
                '"delta":' % (request_id, created, json.dumps(settings.model)))
        tail = ',"logprobs":null,"finish_reason":null}],"usage":null}'
        self.chunks: list[bytes] = []
        for i in range(n_chunks):
            first, last = i * k, min(n_tokens, (i + 1) * k)
            text = "".join(TOKEN_WORDS[t % len(TOKEN_WORDS)] for t in range(first, last))
            field = "reasoning_content" if first < settings.reasoning_tokens else "content"
            delta = {field: text}
            if i == 0:
                delta = {"role": "assistant", **delta}
            self.chunks.append(_chunk((head + json.dumps(delta, separators=(",", ":")) + tail).encode()))
        end = _chunk((head + '{},"logprobs":null,"finish_reason":"%s","matched_stop":null}],"usage":null}' % finish)
                     .encode())
        if include_usage:
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n_tokens,
                     "total_tokens": prompt_tokens + n_tokens}
            end += _chunk(('{"id":"%s","object":"chat.completion.chunk","created":%d,"model":%s,"choices":[],'
                           '"usage":%s}' % (request_id, created, json.dumps(settings.model),
                                            json.dumps(usage, separators=(",", ":")))).encode())
        end += _chunk(b"[DONE]") + b"0\r\n\r\n"
        self.chunks[-1] += end


class Handler(asyncio.Protocol):
    """One client connection: parses HTTP/1.1 requests one at a time and answers them."""

    counter = 0
    tokens = 0
    flushes = 0
    bodies: dict[tuple[int, int, bool, str], bytes] = {}

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.buf = bytearray()
        self.busy = False
        self.transport: asyncio.Transport | None = None
        self.close_after = False
        self.timers: list[asyncio.TimerHandle] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in self.timers:
            timer.cancel()
        self.timers.clear()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._next_request()

    def _next_request(self) -> None:
        if self.busy or self.transport is None:
            return
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        try:
            method, target, version = lines[0].split(" ", 2)
        except ValueError:
            self._respond(400, {"error": {"message": "bad request line"}}, close=True)
            return
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._respond(411, {"error": {"message": "send Content-Length"}}, close=True)
            return
        length = int(headers.get("content-length", "0") or 0)
        if len(self.buf) < end + 4 + length:
            return
        body = bytes(self.buf[end + 4:end + 4 + length])
        del self.buf[:end + 4 + length]
        self.close_after = headers.get("connection", "").lower() == "close" or version == "HTTP/1.0"
        self.busy = True
        self._dispatch(method, target.split("?", 1)[0], body)

    def _done(self) -> None:
        self.busy = False
        self.timers.clear()
        if self.close_after and self.transport is not None:
            self.transport.close()
            return
        self._next_request()

    def _respond(self, status: int, obj, *, close: bool = False) -> None:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 411: "Length Required"}.get(status, "Error")
        payload = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        if self.transport is not None:
            self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                                 % (status, reason.encode(), len(payload), payload))
        if close:
            self.close_after = True
        self._done()

    def _dispatch(self, method: str, path: str, body: bytes) -> None:
        s = self.settings
        if path == "/v1/chat/completions" and method == "POST":
            self._chat(body)
        elif path in ("/server_info", "/get_server_info") and method == "GET":
            info = {"synthetic": s.raw, "served_model_name": s.model, "version": "synthetic",
                    "flush_cache_count": Handler.flushes, "internal_states": [{}],
                    "chat_requests": Handler.counter, "completion_tokens_served": Handler.tokens}
            if s.spec_accept_length is not None:
                info["speculative_algorithm"] = "EAGLE3"
                info["internal_states"] = [{"avg_spec_accept_length": s.spec_accept_length}]
            self._respond(200, info)
        elif path == "/flush_cache" and s.flush_cache and method in ("GET", "POST"):
            Handler.flushes += 1
            self._respond(200, b"Cache flushed.")
        elif path == "/v1/models" and method == "GET":
            self._respond(200, {"object": "list", "data": [{"id": s.model, "object": "model"}]})
        elif path in ("/health", "/ready") and method == "GET":
            self._respond(200, b"")
        else:
            self._respond(404, {"detail": "Not Found"})

    def _chat(self, body: bytes) -> None:
        s = self.settings
        t0 = time.monotonic()
        if s.chat_status != 200:
            self._respond(s.chat_status, {"error": {"message": "synthetic failure", "code": s.chat_status}})
            return
        try:
            req = json.loads(body)
            n = int(req.get("max_tokens") or req.get("max_completion_tokens") or s.default_max_tokens)
        except (ValueError, TypeError, AttributeError) as exc:
            self._respond(400, {"error": {"message": f"bad request body: {exc}"}})
            return
        finish = "length"
        if s.output_tokens:
            n = s.output_tokens
        elif s.eos_tokens and s.eos_tokens < n and req.get("ignore_eos") is not True:
            n, finish = s.eos_tokens, "stop"
        Handler.counter += 1
        Handler.tokens += n
        request_id = f"chatcmpl-syn{Handler.counter}"
        prompt_tokens = max(1, len(body) // 4)
        if not req.get("stream"):
            self._unary(req, t0, n, prompt_tokens, request_id, finish)
            return
        include_usage = s.usage and bool((req.get("stream_options") or {}).get("include_usage"))
        self.transport.write(STREAM_HEAD)
        loop = asyncio.get_running_loop()
        if s.gap == 0 and s.jitter == 0:
            # as fast as possible: one write of a body rendered once per length (the server must not be
            # what limits a client-overhead test)
            key = (n, prompt_tokens, include_usage, finish)
            body = Handler.bodies.get(key)
            if body is None:
                body = Handler.bodies[key] = b"".join(Stream(s, "chatcmpl-syn", n, prompt_tokens, include_usage,
                                                             finish).chunks)
            if s.ttft == 0:
                self._write_all(body)
            else:
                self.timers.append(loop.call_at(t0 + s.ttft, self._write_all, body))
            return
        stream = Stream(s, request_id, n, prompt_tokens, include_usage, finish)
        when = t0 + s.ttft + (s.rng.uniform(-s.jitter, s.jitter) if s.jitter else 0.0)
        for i, chunk in enumerate(stream.chunks):
            if i:
                when += s.gap + (s.rng.uniform(-s.jitter, s.jitter) if s.jitter else 0.0)
            self.timers.append(loop.call_at(when, self._write, chunk, i == len(stream.chunks) - 1))

    def _write(self, chunk: bytes, last: bool) -> None:
        if self.transport is None:
            return
        self.transport.write(chunk)
        if last:
            self._done()

    def _write_all(self, body: bytes) -> None:
        if self.transport is None:
            return
        self.transport.write(body)
        self._done()

    def _unary(self, req: dict, t0: float, n: int, prompt_tokens: int, request_id: str, finish: str) -> None:
        s = self.settings
        text = "".join(TOKEN_WORDS[t % len(TOKEN_WORDS)] for t in range(n))
        resp = {"id": request_id, "object": "chat.completion", "created": int(time.time()), "model": s.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": finish}]}
        if s.usage:
            resp["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                             "total_tokens": prompt_tokens + n}
        delay = s.ttft + (max(1, math.ceil(n / s.tokens_per_chunk)) - 1) * s.gap
        loop = asyncio.get_running_loop()
        self.timers.append(loop.call_at(t0 + delay, self._respond, 200, resp))


def build_parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on stdout)")
    p.add_argument("--ttft-ms", type=float, default=200.0)
    p.add_argument("--gap-ms", type=float, default=20.0, help="time between text chunks")
    p.add_argument("--tokens-per-chunk", type=int, default=4)
    p.add_argument("--jitter-ms", type=float, default=0.0, help="uniform +/- noise on TTFT and each gap")
    p.add_argument("--output-tokens", type=int, default=0, help="answer length; 0 = the request's max_tokens")
    p.add_argument("--eos-tokens", type=int, default=0,
                   help="end answers after this many tokens (finish_reason stop) unless the request sends "
                        "ignore_eos; 0 = every answer runs to max_tokens")
    p.add_argument("--default-max-tokens", type=int, default=128, help="length when the request names none")
    p.add_argument("--reasoning-tokens", type=int, default=0, help="leading tokens sent as reasoning_content")
    p.add_argument("--no-usage", action="store_true", help="never send a usage block")
    p.add_argument("--no-flush-cache", action="store_true", help="answer /flush_cache with 404")
    p.add_argument("--spec-accept-length", type=float, default=None, help="report this in /server_info")
    p.add_argument("--model", default="synthetic")
    p.add_argument("--chat-status", type=int, default=200,
                   help="answer every chat request with this HTTP status and a JSON error (a failing server)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backlog", type=int, default=4096)
    p.add_argument("--loop", choices=["auto", "asyncio", "uvloop"], default="auto")
    return p


async def serve(ns: argparse.Namespace) -> None:
    """Bind, print the address, serve until cancelled."""
    settings = Settings(ns)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Handler(settings), ns.host, ns.port, backlog=ns.backlog,
                                      reuse_address=True)
    port = server.sockets[0].getsockname()[1]
    print(f"listening on http://{ns.host}:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    ns = build_parser().parse_args(argv)
    if ns.tokens_per_chunk < 1:
        sys.exit("--tokens-per-chunk must be >= 1")
    if ns.eos_tokens < 0:
        sys.exit("--eos-tokens must be >= 0")
    runner = asyncio.run
    if ns.loop in ("auto", "uvloop"):
        try:
            import uvloop
            runner = uvloop.run
        except ImportError:
            if ns.loop == "uvloop":
                sys.exit("uvloop is not installed")
    try:
        runner(serve(ns))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
