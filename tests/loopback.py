"""Loopback HTTP servers for tests: a handler base that logs nothing and answers in one call, a server on a free
127.0.0.1 port served from a daemon thread, and a free port for a server the test starts itself.

The servers are real ``http.server`` servers (no mock of a client library): the code under test talks HTTP to
them over loopback.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

JSON = "application/json"


def send(handler: BaseHTTPRequestHandler, status: int, body: bytes | Any, ctype: str = JSON,
         headers: dict[str, str] | None = None) -> None:
    """Write one whole response: ``status``, ``Content-Type: ctype``, the extra ``headers``,
    ``Content-Length`` and ``body`` (bytes as they are; anything else as its JSON text)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", ctype)
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that writes no access log and answers with :meth:`_send`.

    ``protocol_version`` stays http.server's ``HTTP/1.0`` unless a subclass sets ``"HTTP/1.1"``.
    """

    def log_message(self, *args: Any) -> None:  # keep pytest output quiet
        pass

    def _send(self, status: int, body: bytes | Any, ctype: str = JSON) -> None:
        send(self, status, body, ctype)


class Loopback:
    """``handler`` served on ``127.0.0.1:<free port>`` by a :class:`ThreadingHTTPServer` in a daemon thread.

    ``url`` is ``http://127.0.0.1:PORT``, ``address`` ``127.0.0.1:PORT``. Serving starts at once, or on
    ``__enter__`` with ``start=False``. :meth:`close` (or leaving the ``with`` block) stops it; it waits for
    handlers still running unless ``wait_on_close`` is False (a server whose handlers sleep on purpose).
    """

    def __init__(self, handler: Any, *, start: bool = True, wait_on_close: bool = True) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.httpd.block_on_close = wait_on_close
        self.port = self.httpd.server_address[1]
        self.address = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.address}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        if start:
            self._thread.start()

    def __enter__(self) -> "Loopback":
        if not self._thread.is_alive():
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._thread.ident is not None:  # shutdown() waits for serve_forever, which never ran otherwise
            self.httpd.shutdown()
        self.httpd.server_close()


def free_port() -> int:
    """A loopback TCP port nothing listened on a moment ago (for a server the test starts, or to refuse)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
