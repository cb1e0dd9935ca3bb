#!/usr/bin/env python3
"""The machine's floor: a closed-loop streaming client on raw sockets, no HTTP library, no JSON parsing.

One thread, one ``epoll`` loop, ``--concurrency`` keep-alive sockets. Each socket sends
a pre-built ``POST /v1/chat/completions`` (``stream: true``, ``stream_options.include_usage``)
and reads the SSE stream with byte searches only:

- TTFT: request written → first ``recv`` holding a non-empty ``"content":"`` or
  ``"reasoning_content":"`` field;
- E2E: request written → the ``recv`` holding ``data: [DONE]``;
- output tokens: the digits after ``"completion_tokens":`` in the usage chunk;
- TPOT = (E2E - TTFT) / (tokens - 1); output tokens/s = sum of tokens / measured window;
  chunks/s = text chunks / window (counted by non-empty text fields).

It assumes what the synthetic server (and uvicorn) sends: compact JSON, one SSE event
per HTTP chunk. It exists to tell how much of a measurement is the machine and how
much the client: whatever it reads is as close to the wire as Python gets. Prints one
JSON object with medians and throughputs on stdout.
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import statistics
import sys
import time
from urllib.parse import urlsplit

TEXT_FIELDS = (b'"content":"', b'"reasoning_content":"')
EMPTY_FIELDS = (b'"content":""', b'"reasoning_content":""')
DONE = b"data: [DONE]"
USAGE = b'"completion_tokens":'


class Conn:
    """One keep-alive socket and the state of the request it carries."""

    __slots__ = ("sock", "buf", "t_sent", "t_first", "t_done", "tokens", "chunks", "busy")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.busy = False
        self.t_sent = self.t_first = self.t_done = 0.0
        self.tokens = self.chunks = 0


def run(host: str, port: int, request: bytes, concurrency: int, n_requests: int) -> dict:
    """Run ``n_requests`` closed-loop over ``concurrency`` sockets; return raw per-request figures."""
    ep = select.epoll()
    conns: dict[int, Conn] = {}
    for _ in range(concurrency):
        s = socket.create_connection((host, port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        conns[s.fileno()] = Conn(s)
        ep.register(s.fileno(), select.EPOLLIN)
    results: list[tuple[float, float, float, int, int]] = []  # t_sent, ttft, e2e, tokens, chunks
    issued = 0
    perf = time.perf_counter

    def send(c: Conn) -> None:
        c.buf = b""
        c.t_first = c.t_done = 0.0
        c.tokens = c.chunks = 0
        c.busy = True
        c.t_sent = perf()
        c.sock.sendall(request)

    for c in conns.values():
        if issued < n_requests:
            send(c)
            issued += 1
    done = 0
    t_start = min(c.t_sent for c in conns.values() if c.busy)
    t_end = t_start
    while done < n_requests:
        for fd, _ in ep.poll():
            c = conns[fd]
            data = c.sock.recv(1 << 20)
            now = perf()
            if not data:
                sys.exit("server closed a connection")
            buf = c.buf + data
            cut = buf.rfind(b"\n\n") + 2  # scan complete events only
            if cut > 1:
                events, c.buf = buf[:cut], buf[cut:]
                n_text = events.count(TEXT_FIELDS[0]) + events.count(TEXT_FIELDS[1])
                n_text -= events.count(EMPTY_FIELDS[0]) + events.count(EMPTY_FIELDS[1])
                if n_text > 0:
                    if not c.t_first:
                        c.t_first = now
                    c.chunks += n_text
                i = events.find(USAGE)
                if i >= 0:
                    j = i + len(USAGE)
                    k = j
                    while events[k:k + 1].isdigit():
                        k += 1
                    c.tokens = int(events[j:k])
                if not c.t_done and DONE in events:
                    c.t_done = now
            else:
                c.buf = buf
            if c.t_done and c.buf.endswith(b"0\r\n\r\n"):
                results.append((c.t_sent, c.t_first - c.t_sent, c.t_done - c.t_sent, c.tokens, c.chunks))
                t_end = max(t_end, c.t_done)
                done += 1
                c.busy = False
                if issued < n_requests:
                    send(c)
                    issued += 1
    for c in conns.values():
        c.sock.close()
    ep.close()
    return {"results": results, "t_start": t_start, "t_end": t_end}


def summarize(raw: dict) -> dict:
    """Medians (ms) and throughputs of one window."""
    rs = raw["results"]
    window = raw["t_end"] - raw["t_start"]
    tokens = sum(r[3] for r in rs)
    tpots = [(r[2] - r[1]) / (r[3] - 1) for r in rs if r[3] > 1]
    return {
        "requests": len(rs),
        "window_s": window,
        "ttft_ms_p50": statistics.median(r[1] for r in rs) * 1000,
        "tpot_ms_p50": statistics.median(tpots) * 1000 if tpots else None,
        "e2e_ms_p50": statistics.median(r[2] for r in rs) * 1000,
        "output_tokens_per_s": tokens / window,
        "chunks_per_s": sum(r[4] for r in rs) / window,
        "requests_per_s": len(rs) / window,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", required=True, help="http://HOST:PORT")
    p.add_argument("--model", default="synthetic")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=64)
    ns = p.parse_args(argv)
    u = urlsplit(ns.base_url)
    host, port = u.hostname, u.port or 80
    body = json.dumps({"model": ns.model, "messages": [{"role": "user", "content": "Say something."}],
                       "max_tokens": ns.max_tokens, "stream": True, "stream_options": {"include_usage": True},
                       "temperature": 0.0}).encode()
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s:%d\r\ncontent-type: application/json\r\n"
               b"content-length: %d\r\n\r\n%s" % (host.encode(), port, len(body), body))
    if ns.warmup:
        run(host, port, request, min(ns.concurrency, ns.warmup), ns.warmup)
    out = summarize(run(host, port, request, ns.concurrency, ns.num_prompts))
    out["concurrency"] = ns.concurrency
    print(json.dumps(out))


if __name__ == "__main__":
    main()
