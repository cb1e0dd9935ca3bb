"""Can a server listen on ``HOST:PORT`` here: a bind test, released at once (what ``doctor``'s ``port`` check judges).

The probe binds as the server would (TCP, ``SO_REUSEADDR`` like uvicorn, the first address ``getaddrinfo`` gives
for a passive socket) and closes the socket before it returns; nothing listens, nothing is sent. Its result is a
:class:`PortProbe`, which the tests build directly as the recorded form of a probe's three outcomes.
"""

from __future__ import annotations

import dataclasses
import errno
import socket


@dataclasses.dataclass(frozen=True)
class PortProbe:
    """``state``: ``free``, ``in_use`` (EADDRINUSE) or ``unavailable`` (any other bind error); ``detail``: why."""

    host: str
    port: int
    state: str
    detail: str


def hostport(host: str, port: int) -> str:
    """``host:port`` for display; an IPv6 address in brackets (``[::]:30000``, RFC 3986 section 3.2.2)."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def probe_port(host: str, port: int) -> PortProbe:
    """Try to bind ``host:port`` (TCP, SO_REUSEADDR like uvicorn) and release it at once; never raises."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return PortProbe(host, port, "unavailable", f"cannot resolve {host}: {exc.strerror}")
    family, socktype, proto, _, addr = infos[0]
    sock = socket.socket(family, socktype, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as exc:
        state = "in_use" if exc.errno == errno.EADDRINUSE else "unavailable"
        return PortProbe(host, port, state, f"bind {hostport(host, port)}: {exc.strerror}")
    finally:
        sock.close()
    return PortProbe(host, port, "free", f"bind {hostport(host, port)} succeeded")
