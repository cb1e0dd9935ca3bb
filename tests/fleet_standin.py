"""A stand-in for one host of a fleet, for tests that need a server at a fixed address (in a network namespace).

Run as a script with the kit's interpreter (no SGLang needed)::

    python tests/fleet_standin.py sglang --host 10.77.0.11 --port 30000
    python tests/fleet_standin.py textfile --host 10.77.0.10 --port 9100 --file DIR/check.prom

``sglang``: what SGLang 0.5.23's HTTP rank 0 answers that a gateway and a scraper ask for: ``/health`` 200,
``/metrics`` with SGLang's scheduler gauges (names and labels of ``metrics_collector.py``), ``/get_model_info``,
``/get_server_info``, ``/v1/models`` (SGLang's shapes, the fields smg reads), anything else 404. It serves no
model: a check against it fails its contract tier, which is what the tests want from a worker report.
``textfile``: node_exporter's textfile collector in miniature: ``/metrics`` answers the file's current text.

Prints ``LISTENING`` once it serves; ends on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MODEL = "moonshotai/Kimi-K2.5"
SCHED = 'model_name="moonshotai/Kimi-K2.5",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"'


def sglang_metrics() -> str:
    return ("# HELP sglang:num_running_reqs The number of running requests.\n# TYPE sglang:num_running_reqs gauge\n"
            f"sglang:num_running_reqs{{{SCHED}}} 0.0\n"
            "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.\n"
            "# TYPE sglang:num_queue_reqs gauge\n"
            f"sglang:num_queue_reqs{{{SCHED}}} 0.0\n")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("sglang", "textfile"))
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--file", type=Path)
    opts = parser.parse_args(argv)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def _send(self, status: int, body: str, ctype: str = "application/json") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's spelling)
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                text = sglang_metrics() if opts.mode == "sglang" else (
                    opts.file.read_text() if opts.file and opts.file.exists() else "")
                self._send(200, text, "text/plain; version=0.0.4")
            elif opts.mode == "textfile":
                self._send(404, "{}")
            elif path in ("/health", "/health_generate"):
                self._send(200, "")
            elif path in ("/get_model_info", "/model_info"):
                self._send(200, json.dumps({"model_path": MODEL, "tokenizer_path": MODEL, "is_generation": True}))
            elif path in ("/get_server_info", "/server_info"):
                self._send(200, json.dumps({"model_path": MODEL, "served_model_name": MODEL, "tp_size": 8,
                                            "dp_size": 1, "version": "0.5.23"}))
            elif path == "/v1/models":
                self._send(200, json.dumps({"object": "list", "data": [
                    {"id": MODEL, "object": "model", "owned_by": "sglang", "root": MODEL}]}))
            else:
                self._send(404, json.dumps({"error": "not found"}))

    server = ThreadingHTTPServer((opts.host, opts.port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("LISTENING", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
