"""HTTP plumbing of the check: httpx for server endpoints, the official ``openai`` client for chat.

The ``openai`` client is what agents use, so its errors are what agents see; it is given an
httpx transport that keeps a copy of the raw response bytes, so that the stream-shape
validator can see the SSE framing (``[DONE]``, error frames) the client hides. Retries are
off (``max_retries=0``): a check reports what one request got.
"""

from __future__ import annotations

import dataclasses
import http
import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai

from kimi_deploy.check.results import clip, clip_body
from kimi_deploy.check.validate import Finding

#: Contract requests may wait this many times ``--timeout`` for the answer: a non-streamed answer
#: arrives only when the whole generation is done, and a thinking model writing an 8 KiB argument
#: (~2,500 tokens) needs tens of seconds. Connecting still has to succeed within ``--timeout``.
GENERATION_TIMEOUT_FACTOR = 6


#: Shortest timeout a request is given once the run's deadline is (nearly) reached, in seconds.
MIN_TIMEOUT_S = 0.05


class Deadline:
    """A point on the monotonic clock after which no request may still be waiting (``None``: no bound).

    ``bound(seconds)`` caps a per-request timeout by the time left; :meth:`check` raises
    ``httpx.ReadTimeout`` once the deadline has passed, so a body that trickles in byte by byte
    (each read within the read timeout) still ends at the deadline. ``clock`` (seconds, monotonic)
    is the run's time source: tests pass one they move themselves.
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


class _Tee(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, sink: bytearray, deadline: Deadline,
                 request: httpx.Request) -> None:
        self._inner = inner
        self._sink = sink
        self._deadline = deadline
        self._request = request

    def __iter__(self):
        for chunk in self._inner:
            self._sink.extend(chunk)
            self._deadline.check(self._request)
            yield chunk

    def close(self) -> None:
        self._inner.close()


class RecordingTransport(httpx.BaseTransport):
    """An httpx transport that keeps the raw body of the last response in :attr:`last_body`.

    Reading a body past ``deadline`` raises ``httpx.ReadTimeout`` (see :class:`Deadline`).
    """

    def __init__(self, deadline: Deadline | None = None) -> None:
        self._inner = httpx.HTTPTransport()
        self._deadline = deadline or Deadline(None)
        self.last_body = bytearray()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self._inner.handle_request(request)
        self.last_body = bytearray()
        return httpx.Response(status_code=response.status_code, headers=response.headers,
                              stream=_Tee(response.stream, self.last_body, self._deadline, request),
                              extensions=response.extensions)

    def close(self) -> None:
        self._inner.close()

    @property
    def last_text(self) -> str:
        return bytes(self.last_body).decode("utf-8", errors="replace")


@dataclasses.dataclass
class Clients:
    """The two clients of one run, sharing base URL, key, timeout and the run's deadline.

    ``root`` is the server root without ``/v1`` (``http://HOST:PORT``). Send requests through
    :meth:`get_json` and :meth:`chat`: they cap every timeout by the time left before ``deadline``.
    """

    root: str
    api_key: str | None
    timeout: float
    http: httpx.Client
    openai: openai.OpenAI
    recorder: RecordingTransport
    deadline: Deadline

    @classmethod
    def open(cls, base_url: str, api_key: str | None, timeout: float, deadline: Deadline | None = None) -> Clients:
        deadline = deadline or Deadline(None)
        root = base_url.rstrip("/")
        if root.endswith("/v1"):
            root = root[:-3]
        headers = {"Accept-Encoding": "identity"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        http_client = httpx.Client(base_url=root, headers=headers, timeout=timeout, follow_redirects=True,
                                   transport=RecordingTransport(deadline))
        recorder = RecordingTransport(deadline)
        generation = httpx.Timeout(timeout * GENERATION_TIMEOUT_FACTOR, connect=timeout)
        oa = openai.OpenAI(base_url=f"{root}/v1", api_key=api_key or "EMPTY", timeout=generation, max_retries=0,
                           http_client=httpx.Client(transport=recorder, headers={"Accept-Encoding": "identity"},
                                                    timeout=generation))
        return cls(root=root, api_key=api_key, timeout=timeout, http=http_client, openai=oa, recorder=recorder,
                   deadline=deadline)

    def chat(self, **kwargs: Any) -> Any:
        """``openai.chat.completions.create(**kwargs)`` with the generation timeout capped by the deadline.

        Raises:
            openai.OpenAIError: as the client raises it (map it with :func:`openai_finding`).
        """
        generation = httpx.Timeout(self.deadline.bound(self.timeout * GENERATION_TIMEOUT_FACTOR),
                                   connect=self.deadline.bound(self.timeout))
        return self.openai.chat.completions.create(timeout=generation, **kwargs)

    def close(self) -> None:
        self.http.close()
        self.openai.close()

    def get_json(self, path: str) -> tuple[int, Any]:
        """GET ``path``; returns (status, parsed JSON or the text when not JSON).

        Raises:
            httpx.TransportError: connection or timeout (callers map it with :func:`transport_finding`).
        """
        response = self.http.get(path, timeout=self.deadline.bound(self.timeout))
        try:
            return response.status_code, response.json()
        except (json.JSONDecodeError, ValueError):
            return response.status_code, response.text


def status_label(status: int) -> str:
    """``HTTP 501 Not Implemented``: the status and its RFC 9110 reason phrase (``HTTP 599`` when unregistered).

    The ``openai`` client's exception class names are no label: it raises ``InternalServerError``
    for every status >= 500 (501, 502, 503 ...) and a bare ``APIStatusError`` for unmapped ones.
    """
    try:
        return f"HTTP {status} {http.HTTPStatus(status).phrase}"
    except ValueError:
        return f"HTTP {status}"


def status_kind(status: int) -> str:
    """The failure kind of an unexpected HTTP status: ``server_error`` for 5xx (and above), else ``http_error``."""
    return "server_error" if status >= 500 else "http_error"


#: The fix for a 401/403: where the check gets its key.
AUTH_FIX = "pass --api-key-file FILE (with --profile, its [sglang] api_key_file is read by default)"


def auth_note(status: int, key_sent: bool) -> str | None:
    """What a 401/403 means for the check (``None`` for any other status).

    SGLang answers 401 to a request without the ``--api-key`` bearer token (0.5.23,
    ``http_server.py`` auth middleware); other servers use 401 or 403.
    """
    if status not in (401, 403):
        return None
    return "the API key was refused" if key_sent else "an API key is needed"


def status_finding(what: str, status: int, body: object, *, key_sent: bool) -> Finding:
    """The finding for ``what`` (``GET /health``) answering an unexpected HTTP ``status``.

    401/403: ``http_error``, evidence ``HTTP 401: an API key is needed`` and the fix in the detail;
    others: :func:`status_kind`, labelled by :func:`status_label`, the body as evidence (:func:`clip_body`).
    """
    note = auth_note(status, key_sent)
    if note:
        return Finding("http_error", f"{what} answered {status_label(status)}: {note}; fix: {AUTH_FIX}",
                       clip(f"HTTP {status}: {note}"))
    return Finding(status_kind(status), f"{what} answered {status_label(status)}", clip_body(body))


def _key_sent(request: httpx.Request | None) -> bool:
    """Whether ``request`` carried a real bearer token (the ``openai`` client sends ``EMPTY`` without one)."""
    auth = request.headers.get("authorization", "") if request is not None else ""
    return bool(auth) and auth != "Bearer EMPTY"


def transport_finding(exc: Exception, what: str) -> Finding:
    """``unreachable`` or ``timeout`` for an httpx transport error."""
    if isinstance(exc, httpx.TimeoutException):
        return Finding("timeout", f"{what}: no answer in time ({type(exc).__name__})", clip(exc))
    return Finding("unreachable", f"{what}: {type(exc).__name__}", clip(exc))


#: What a server without a tool-call parser answers a request with ``tools`` (HTTP 400): vLLM 0.33.0
#: ``renderers/online_renderer.py`` says ``"auto" tool choice requires --enable-auto-tool-choice and
#: --tool-call-parser to be set`` (auto) or ``tool_choice=... requires --tool-call-parser to be set``.
NO_TOOL_PARSER_MARKERS = ("--enable-auto-tool-choice", "requires --tool-call-parser")

#: The flags a server without a Kimi tool-call parser needs (vLLM's spelling; SGLang takes the last two).
TOOL_PARSER_FLAGS = "--enable-auto-tool-choice --tool-call-parser kimi_k2 --reasoning-parser kimi_k2"


def no_tool_parser_finding(status: int, body: str) -> Finding | None:
    """``config_mismatch`` when a 4xx ``body`` says the server runs without a tool-call parser; else None."""
    if not 400 <= status < 500 or not any(m in body for m in NO_TOOL_PARSER_MARKERS):
        return None
    return Finding("config_mismatch", f"{status_label(status)}: the server runs without a tool-call parser; "
                   f"relaunch it with {TOOL_PARSER_FLAGS} (vLLM; SGLang: --tool-call-parser kimi_k2 "
                   "--reasoning-parser kimi_k2)", clip_body(body))


def openai_finding(exc: Exception, *, streaming: bool, raw: str = "") -> Finding:
    """The failure kind for an exception the ``openai`` client raised.

    APITimeoutError → ``timeout``; APIConnectionError → ``unreachable``; a status error →
    :func:`status_kind` (5xx ``server_error``, others ``http_error``), labelled by
    :func:`status_label`, never by the client's class name (401/403: ``http_error`` with
    :func:`auth_note`; a 4xx saying the server lacks a tool-call parser: ``config_mismatch``,
    :func:`no_tool_parser_finding`); a generic
    APIError while streaming (openai-python raises it for an SSE ``{"error": ...}`` frame) →
    ``error_frame``; anything else (a body the client could not decode) → ``server_error``.
    """
    if isinstance(exc, openai.APITimeoutError):
        return Finding("timeout", f"no answer within the timeout ({type(exc).__name__})", clip(exc))
    if isinstance(exc, openai.APIConnectionError):
        return Finding("unreachable", f"connection failed: {exc}", clip(exc.__cause__ or exc))
    if isinstance(exc, openai.APIStatusError):
        body = exc.response.text if exc.response is not None else str(exc)
        note = auth_note(exc.status_code, _key_sent(exc.request))
        if note:
            return Finding("http_error", f"{status_label(exc.status_code)}: {note}; fix: {AUTH_FIX}",
                           clip(f"HTTP {exc.status_code}: {note}"))
        missing = no_tool_parser_finding(exc.status_code, body)
        if missing is not None:
            return missing
        return Finding(status_kind(exc.status_code), status_label(exc.status_code), clip_body(body))
    if isinstance(exc, openai.APIError) and streaming:
        return Finding("error_frame", f"the stream carried an error ({type(exc).__name__}: {exc.message})",
                       clip(exc.message))
    return Finding("server_error", f"the response could not be read ({type(exc).__name__})", clip(raw or exc))
