"""Wall-clock bounds on HTTP requests, enforced at the socket: the one mechanism behind ``check --deadline`` /
``--timeout`` and every control-plane client of the kit (status, restart --wait, the readiness verdict, the
gateway's worker API: :func:`kimi_deploy.wire.http.control_client`).

httpx's timeouts bound each socket operation, not an answer: a server that keeps a request alive with bytes that
are never an answer (``HTTP/1.1 100 Continue`` heads, a head one byte a second, an endless body) holds such a
client forever (issue 30 item 7; status and restart --wait in the trial after it). Here every read and write of a
request waits at most the time left to the request and to the run (:class:`Watch`), and past it the request ends
with :class:`Overdue` (an ``httpcore.ReadTimeout``, which httpx raises as ``httpx.ReadTimeout``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpcore
import httpx

from kimi_deploy.wire.printable import printable


#: Shortest timeout a request is given once the run's deadline is (nearly) reached, in seconds.
MIN_TIMEOUT_S = 0.05


class Deadline:
    """A point on the monotonic clock after which no request may still be waiting (``None``: no bound).

    ``bound(seconds)`` caps a per-request timeout by the time left; :meth:`check` raises
    ``httpx.ReadTimeout`` once the deadline has passed, so a body that trickles in byte by byte
    (each read within the read timeout) still ends at the deadline. ``clock`` (seconds, monotonic)
    is the run's time source: tests pass one they move themselves. The socket layer enforces it too
    (:class:`Watch`): every read and write of every request waits at most the time left, whatever the
    server sends (an endless run of ``100 Continue`` heads never reaches the body).
    """

    def __init__(self, seconds: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self.clock = clock
        self.at = None if seconds is None else clock() + seconds

    def left(self) -> float | None:
        """Seconds left (may be negative), ``None`` without a deadline."""
        return None if self.at is None else self.at - self.clock()

    def passed(self) -> bool:
        left = self.left()
        return left is not None and left <= 0

    def bound(self, seconds: float) -> float:
        left = self.left()
        return seconds if left is None else max(MIN_TIMEOUT_S, min(seconds, left))

    def check(self, request: httpx.Request | None = None) -> None:
        if self.passed():
            raise httpx.ReadTimeout(f"the run's deadline of {self.seconds:g} s passed while reading the answer",
                                    request=request)


#: How many of an answer's first bytes :class:`Watch` keeps for the evidence of an answer it cut off.
HEAD_BYTES = 64


class Overdue(httpcore.ReadTimeout):
    """The request in flight ran past its own time (its read timeout, as one wall-clock bound) or the run's
    deadline, however the server paced its bytes. ``message``: which bound and how much had arrived;
    ``evidence``: the first bytes that arrived (or that none did); ``received``: bytes of the answer read by
    then (0: the server sent nothing)."""

    def __init__(self, message: str, evidence: str, received: int) -> None:
        super().__init__(message)
        self.message = message
        self.evidence = evidence
        self.received = received


class Watch:
    """The wall-clock bounds of the request in flight, enforced on every socket read and write.

    A request may take at most its read timeout in all (``--timeout``, x
    :data:`kimi_deploy.check.client.GENERATION_TIMEOUT_FACTOR`
    for chat completions), and nothing may run past the run's ``deadline``: a server that keeps a
    request alive with bytes that are never an answer (``HTTP/1.1 100 Continue`` heads, a body one byte
    per second, a head that never ends) is cut off there with :class:`Overdue`. It also counts what the
    server sent: ``received`` for the request in flight (its first :data:`HEAD_BYTES` in ``head``), and
    ``answered`` whether any request of the run got a byte back, which is what "the server answered" means.
    """

    def __init__(self, deadline: Deadline) -> None:
        self.deadline = deadline
        self.request_s: float | None = None
        self.request_at: float | None = None
        self.received = 0
        self.head = bytearray()
        self.answered = False

    def begin(self, seconds: float | None) -> None:
        """A request starts: it may take ``seconds`` in all (``None``: only the deadline bounds it)."""
        self.request_s = seconds
        self.request_at = None if seconds is None else self.deadline.clock() + seconds
        self.received = 0
        self.head = bytearray()

    def _overdue(self) -> Overdue:
        got = f"; {self.received} bytes had come back, no complete answer" if self.received else "; nothing came back"
        evidence = (f"first bytes: {printable(bytes(self.head).decode('utf-8', 'replace'))}" if self.received
                    else "no byte of an answer")
        if self.deadline.passed():
            return Overdue(f"the run's deadline (--deadline {self.deadline.seconds:g} s) passed during the request"
                           f"{got}", evidence, self.received)
        return Overdue(f"the request ran past its time of {self.request_s:g} s (--timeout; 6x for chat "
                       f"completions){got}", evidence, self.received)

    def bound(self, timeout: float | None) -> float:
        """``timeout`` capped by the time left to the request and to the run. Raises :class:`Overdue` when
        none is left."""
        now = self.deadline.clock()
        ends = [t for t in (self.request_at, self.deadline.at) if t is not None]
        if not ends:
            return timeout  # type: ignore[return-value]
        left = min(ends) - now
        if left <= 0:
            raise self._overdue()
        return left if timeout is None else min(timeout, left)

    def saw(self, data: bytes) -> None:
        self.received += len(data)
        self.answered = self.answered or bool(data)
        if len(self.head) < HEAD_BYTES:
            self.head.extend(data[:HEAD_BYTES - len(self.head)])

    def timed_out(self, exc: httpcore.TimeoutException) -> httpcore.TimeoutException:
        """:class:`Overdue` for a socket timeout the bounds caused, ``exc`` for one of the read timeout."""
        try:
            self.bound(None)
        except Overdue as overdue:
            return overdue
        return exc


class _BoundedStream(httpcore.NetworkStream):
    """One connection whose every read and write waits at most :meth:`Watch.bound`."""

    def __init__(self, inner: httpcore.NetworkStream, watch: Watch) -> None:
        self._inner = inner
        self._watch = watch

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            data = self._inner.read(max_bytes, self._watch.bound(timeout))
        except httpcore.TimeoutException as exc:
            raise self._watch.timed_out(exc) from None
        self._watch.saw(data)
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        try:
            self._inner.write(buffer, self._watch.bound(timeout))
        except httpcore.TimeoutException as exc:
            raise self._watch.timed_out(exc) from None

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None) -> httpcore.NetworkStream:
        return _BoundedStream(self._inner.start_tls(ssl_context, server_hostname, self._watch.bound(timeout)),
                              self._watch)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _BoundedBackend(httpcore.NetworkBackend):
    """httpcore's own sync sockets, each wrapped in :class:`_BoundedStream` (connecting is bounded too)."""

    def __init__(self, watch: Watch) -> None:
        self._inner = httpcore.SyncBackend()
        self._watch = watch

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        return _BoundedStream(self._inner.connect_tcp(host, port, self._watch.bound(timeout), local_address,
                                                      socket_options), self._watch)

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        return _BoundedStream(self._inner.connect_unix_socket(path, self._watch.bound(timeout), socket_options),
                              self._watch)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def bounded_transport(watch: Watch) -> httpx.HTTPTransport:
    """An ``httpx.HTTPTransport`` (HTTP/1.1, TLS verified, no proxy) whose sockets obey ``watch``.

    httpx 0.28 takes no network backend, so its connection pool is replaced by an equal one built with
    :class:`_BoundedBackend` (``tests/test_check_deadline.py`` fails if httpx stops using ``_pool``).
    """
    transport = httpx.HTTPTransport()
    transport._pool.close()
    transport._pool = httpcore.ConnectionPool(ssl_context=httpx.create_ssl_context(), http1=True, http2=False,
                                              network_backend=_BoundedBackend(watch))
    return transport


def overdue_of(exc: BaseException | None) -> Overdue | None:
    """The :class:`Overdue` behind ``exc`` (httpx and openai wrap it), else ``None``."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, Overdue):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None
