"""A loopback server that writes raw bytes: HTTP answers no ``http.server`` handler can write (issue #30).

``RawServer(answer)`` serves ``127.0.0.1:<free port>`` from daemon threads; for every request it reads the
request line, the headers and a ``Content-Length`` body, then calls ``answer(method, path, body, out)``
where ``out.write(bytes)`` sends (and flushes) bytes and raises ``OSError`` once the client hung up. The
answer decides everything: endless ``100 Continue`` heads, a body one byte at a time, an HTTP/0.9-style
answer with no status line, a head that never ends. A handler that returns closes the connection.

:func:`ordinary` answers the GETs a check sends the way a small OpenAI-compatible server does (no SGLang
routes), so a test can make only the POSTs hostile.
"""

from __future__ import annotations

import json
import socketserver
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO


#: One interim answer (RFC 9110 15.2.1): httpcore reads it and waits for the final one.
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class Out:
    """The client's side of one connection: :meth:`write` sends and flushes."""

    def __init__(self, wfile: BinaryIO) -> None:
        self._wfile = wfile

    def write(self, data: bytes) -> None:
        self._wfile.write(data)
        self._wfile.flush()


Answer = Callable[[str, str, bytes, Out], None]


def http(status: int, body: bytes | Any, ctype: str = "application/json") -> bytes:
    """One whole HTTP/1.1 answer (``Connection: close``)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return (f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n"
            .encode() + data)


def ordinary(method: str, path: str, out: Out) -> None:
    """A plain server's answers to the check's GETs: 200 ``/health``, one model, 404 for the rest."""
    if path.endswith("/v1/models"):
        out.write(http(200, {"object": "list", "data": [{"id": "m", "object": "model"}]}))
    elif path.endswith("/health") or path.endswith("/health_generate"):
        out.write(http(200, b""))
    else:
        out.write(http(404, {"detail": "Not Found"}))


def forever(out: Out, piece: bytes, every_s: float, for_s: float = 120.0) -> None:
    """Write ``piece`` every ``every_s`` seconds for ``for_s`` seconds, or until the client hangs up."""
    end = time.monotonic() + for_s
    try:
        while time.monotonic() < end:
            out.write(piece)
            time.sleep(every_s)
    except OSError:
        pass


class RawServer:
    """``answer`` served on a free loopback port (``url``); a context manager that stops it on exit."""

    def __init__(self, answer: Answer) -> None:
        outer = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                try:
                    line = self.rfile.readline(65536)
                    if not line:
                        return
                    method, path, _ = line.decode("latin-1").split(" ", 2)
                    length = 0
                    while True:
                        header = self.rfile.readline(65536)
                        if header in (b"\r\n", b"\n", b""):
                            break
                        name, _, value = header.decode("latin-1").partition(":")
                        if name.strip().lower() == "content-length":
                            length = int(value)
                    body = self.rfile.read(length) if length else b""
                    outer.requests.append((method, path))
                    answer(method, path, body, Out(self.wfile))
                except OSError:
                    pass

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            block_on_close = False
            allow_reuse_address = True

        self.requests: list[tuple[str, str]] = []
        self._server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def __enter__(self) -> "RawServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
