#!/usr/bin/env python3
"""Peak RSS of ``kimi-deploy check`` against hostile loopback servers (issue #11, item 9).

Serves, from this process, answers nobody should send: a 1 GiB body on ``/health`` (declared with
``Content-Length``, or chunked with no length), a 1 MiB gzip body that inflates to 1 GiB, a stream
of chat chunks that ends only after 1 GiB, and one SSE line of 200 MB. Each scenario runs
``python -m kimi_deploy check`` in a child process (whatever ``kimi_deploy`` is first on
``PYTHONPATH``: run it once per checkout to compare before and after) and reports the child's
peak RSS (``wait4``'s ``ru_maxrss``), its wall time, its exit status and the failed row's kind.

    PYTHONPATH=. python benchmarks/hostile_rss.py [--scenario NAME ...] [--json PATH]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

GIB = 1 << 30
PIECE = b" " * (1 << 20)
DELTA = (b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"'
         + b"a" * 65000 + b'"}}]}\n\n')
_BOMB: bytes | None = None


def bomb() -> bytes:
    """1 GiB of spaces, gzip-compressed (about 1 MiB on the wire)."""
    global _BOMB
    if _BOMB is None:
        c = gzip.zlib.compressobj(9, gzip.zlib.DEFLATED, 31)
        _BOMB = b"".join(c.compress(PIECE) for _ in range(1024)) + c.flush()
    return _BOMB


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _head(self, ctype: str, **headers: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        for k, v in headers.items():
            self.send_header(k.replace("_", "-"), v)
        self.end_headers()

    def _write(self, pieces) -> None:
        try:
            for p in pieces:
                self.wfile.write(p)
        except OSError:
            pass

    def _chunked(self, pieces) -> None:
        self._write(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
        self._write([b"0\r\n\r\n"])

    def do_GET(self):  # noqa: N802
        mode, _, path = self.path.lstrip("/").partition("/")
        self.close_connection = True
        if path == "health" and mode == "body-1g":
            self._head("application/json", Content_Length=str(GIB))
            self._write(PIECE for _ in range(1024))
        elif path == "health" and mode == "chunked-1g":
            self._head("application/json", Transfer_Encoding="chunked")
            self._chunked(PIECE for _ in range(1024))
        elif path == "health" and mode == "gzip-1m":
            body = bomb()
            self._head("application/json", Content_Encoding="gzip", Content_Length=str(len(body)))
            self._write([body])
        elif path == "v1/models":
            body = b'{"object": "list", "data": [{"id": "m", "object": "model"}]}'
            self._head("application/json", Content_Length=str(len(body)))
            self._write([body])
        else:
            self._head("application/json", Content_Length="2")
            self._write([b"{}"])

    def do_POST(self):  # noqa: N802
        mode, _, _ = self.path.lstrip("/").partition("/")
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.close_connection = True
        self._head("text/event-stream", Transfer_Encoding="chunked")
        if mode == "stream-1g":
            self._chunked(DELTA for _ in range(GIB // len(DELTA)))
        else:  # line-200m: one data line of 200 MB, in 1 MiB writes
            self._chunked([b'data: {"choices":[{"delta":{"content":"'] + [b"x" * (1 << 20)] * 200)


SCENARIOS = {
    "body-1g": ["--only", "health.live"],
    "chunked-1g": ["--only", "health.live"],
    "gzip-1m": ["--only", "health.live"],
    "stream-1g": ["--only", "contract.plain.stream", "--model", "m"],
    "line-200m": ["--only", "contract.plain.stream", "--model", "m"],
}


def run(url: str, name: str, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "r.json"
        argv = [sys.executable, "-m", "kimi_deploy", "check", "--base-url", f"{url}/{name}", *SCENARIOS[name],
                "--timeout", "120", "--deadline", "600", "--json", str(report), *extra]
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - t0
        stderr = proc.stderr.read().decode(errors="replace")[-300:]
        proc.stderr.close()
        row = None
        if report.exists():
            checks = json.loads(report.read_text())["checks"]
            row = {k: checks[0].get(k) for k in ("id", "status", "kind", "detail")} if checks else None
    return {"scenario": name, "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "wall_s": round(wall, 2),
            "exit": os.waitstatus_to_exitcode(status), "report": row, "stderr": stderr if row is None else ""}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", action="append", choices=sorted(SCENARIOS), help="default: all")
    p.add_argument("--json", dest="json_path")
    p.add_argument("extra", nargs="*", help="more check options (after --), e.g. -- --max-body-bytes 1G")
    ns = p.parse_args(argv)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    rows = []
    for name in ns.scenario or list(SCENARIOS):
        r = run(url, name, ns.extra)
        rows.append(r)
        rep = r["report"] or {}
        print(f"{name:<11} peak RSS {r['peak_rss_mib']:>8.1f} MiB  {r['wall_s']:>7.2f} s  exit {r['exit']}  "
              f"{rep.get('status')}/{rep.get('kind')}: {(rep.get('detail') or r['stderr'])[:110]}", flush=True)
    server.shutdown()
    if ns.json_path:
        Path(ns.json_path).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
