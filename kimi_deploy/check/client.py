"""HTTP plumbing of the check: httpx for server endpoints, the official ``openai`` client for chat.

The ``openai`` client is what agents use, so its errors are what agents see; it is given an
httpx transport that keeps a copy of the raw response bytes, so that the stream-shape
validator can see the SSE framing (``[DONE]``, error frames) the client hides. Retries are
off (``max_retries=0``): a check reports what one request got.

Hostile answers (issue #11) stop at the transport, before httpx or openai buffer or decode them:
``Accept-Encoding: identity`` is sent and any other ``Content-Encoding`` is refused unread; a body
(declared or read) over ``--max-body-bytes`` and an SSE line or event over ``--max-line-bytes``
(framed by :class:`kimi_deploy.wire.sse.Framer` as the bytes arrive) are refused at the cap. A refusal
is a :class:`ResponseRefused`, which both ``except httpx.TransportError`` and ``except
openai.OpenAIError`` catch; :func:`transport_finding` and :func:`openai_finding` turn it into a
failed row of kind :data:`REFUSED_KIND` with the evidence.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import httpx
import openai

from kimi_deploy.check.results import clip, clip_body
from kimi_deploy.check.completion_rules import Finding
from kimi_deploy.wire.bounded import Deadline, Watch, bounded_transport, overdue_of
from kimi_deploy.wire.limits import LimitExceeded, Limits, human
from kimi_deploy.wire.http import IDENTITY, auth_headers, status_label
from kimi_deploy.wire.printable import printable
from kimi_deploy.wire.sse import Framer

#: The failure kind of an answer the check refused to read (too large, or encoded): the kind of every
#: answer the check cannot use (docs/reference/failure-kinds.md).
REFUSED_KIND = "invalid_response"

#: Contract requests may wait this many times ``--timeout`` for the answer: a non-streamed answer
#: arrives only when the whole generation is done, and a thinking model writing an 8 KiB argument
#: (~2,500 tokens) needs tens of seconds. Connecting still has to succeed within ``--timeout``.
GENERATION_TIMEOUT_FACTOR = 6


#: httpcore's message when a connection closed before a whole status line (``httpcore/_sync/http11.py``): no
#: answer when nothing came, an answer that is not HTTP/1.x when bytes did (:attr:`Watch.received`).
NOT_HTTP = "without sending a response"


class ResponseRefused(httpx.TransportError, openai.APIError):
    """An answer the check stopped reading (too large, or in an encoding it did not ask for) or cannot read
    as HTTP/1.x at all.

    Caught as ``httpx.TransportError`` around ``httpx`` calls and as ``openai.OpenAIError`` around
    ``openai`` ones (``openai`` wraps it in ``APIConnectionError`` when raised while sending).
    ``detail``: what was refused and why (names the flag that raises a cap); ``evidence``: the
    header or the first bytes of what was read.
    """

    def __init__(self, detail: str, evidence: str, request: httpx.Request) -> None:
        Exception.__init__(self, detail)
        self.request = request
        self.message = detail
        self.body = None
        self.code = self.param = self.type = None
        self.detail = detail
        self.evidence = evidence


def _what(request: httpx.Request) -> str:
    return f"{request.method} {request.url.path}"


class _Tee(httpx.SyncByteStream):
    """The raw body as it arrives: copied into ``sink`` up to the body cap, counted, SSE-framed when
    it is an event stream (for the line cap), the run's deadline checked after every read."""

    def __init__(self, inner: httpx.SyncByteStream, sink: bytearray, deadline: Deadline,
                 request: httpx.Request, limits: Limits, framer: Framer | None) -> None:
        self._inner = inner
        self._sink = sink
        self._deadline = deadline
        self._request = request
        self._limits = limits
        self._framer = framer
        self._seen = 0

    def __iter__(self):
        cap = self._limits.max_body_bytes
        for chunk in self._inner:
            self._seen += len(chunk)
            if cap is not None and self._seen > cap:
                self._sink.extend(chunk[:max(0, cap - len(self._sink))])
                self._refuse(LimitExceeded("the body", cap, "--max-body-bytes", self._seen))
            self._sink.extend(chunk)
            if self._framer is not None:
                try:
                    self._framer.feed(chunk)
                except LimitExceeded as exc:
                    self._refuse(exc)
            self._deadline.check(self._request)
            yield chunk

    def _refuse(self, exc: LimitExceeded) -> None:
        self.close()
        head = "".join(c if c.isprintable() else f"\\x{ord(c):02x}"  # no control byte reaches a report
                       for c in bytes(self._sink[:120]).decode("utf-8", "replace"))
        raise ResponseRefused(f"the answer to {_what(self._request)} was refused: {exc}",
                              clip(f"{exc.what} over {human(exc.limit)}; first bytes: {head}"),
                              self._request) from None

    def close(self) -> None:
        self._inner.close()


class RecordingTransport(httpx.BaseTransport):
    """An httpx transport that keeps the raw body of the last response in :attr:`last_body`.

    Reading a body past ``deadline`` raises ``httpx.ReadTimeout`` (see :class:`Deadline`); a body or
    SSE line past ``limits``, or a ``Content-Encoding`` other than identity, raises
    :class:`ResponseRefused` (the connection is closed; :attr:`last_body` holds at most the body cap).
    """

    def __init__(self, deadline: Deadline | None = None, limits: Limits = Limits(), watch: Watch | None = None) -> None:
        self._deadline = deadline or Deadline(None)
        self.watch = watch or Watch(self._deadline)
        self._inner = bounded_transport(self.watch)
        self._limits = limits
        self.last_body = bytearray()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.headers["Accept-Encoding"] = "identity"
        self.watch.begin((request.extensions.get("timeout") or {}).get("read"))
        try:
            response = self._inner.handle_request(request)
        except httpx.RemoteProtocolError as exc:
            if self.watch.received and NOT_HTTP in str(exc):  # bytes came, never an HTTP/1.x status line
                head = printable(bytes(self.watch.head).decode("utf-8", "replace"))
                raise ResponseRefused(
                    f"the answer to {_what(request)} is not HTTP/1.x: {self.watch.received} bytes came back and "
                    "the connection closed without a status line (an HTTP/0.9-style answer, or another protocol "
                    "on this port)", clip(f"first bytes: {head}"), request) from None
            raise
        self.last_body = bytearray()
        encoding = response.headers.get("content-encoding", "").strip().lower()
        if encoding not in ("", "identity"):
            response.close()
            raise ResponseRefused(
                f"the answer to {_what(request)} (HTTP {response.status_code}) came with Content-Encoding: "
                f"{encoding}, which the check did not ask for (it sends Accept-Encoding: identity); not decoded",
                clip(f"HTTP {response.status_code} Content-Encoding: {encoding}"), request)
        cap = self._limits.max_body_bytes
        declared = response.headers.get("content-length", "").strip()
        if cap is not None and declared.isdigit() and int(declared) > cap:
            response.close()
            exc = LimitExceeded("the body", cap, "--max-body-bytes", int(declared))
            raise ResponseRefused(f"the answer to {_what(request)} was refused unread: Content-Length {declared} "
                                  f"is over {exc.flag} {cap} ({human(cap)})",
                                  clip(f"HTTP {response.status_code} Content-Length: {declared}"), request)
        framer = None
        if "text/event-stream" in response.headers.get("content-type", ""):
            framer = Framer(self._limits.max_line_bytes)
        return httpx.Response(status_code=response.status_code, headers=response.headers,
                              stream=_Tee(response.stream, self.last_body, self._deadline, request, self._limits,
                                          framer),
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
    #: The byte caps every answer is read under (kept so that more clients can be opened alike: the quality tier's
    #: concurrent requests each need their own recorder).
    limits: Limits = dataclasses.field(default_factory=Limits)

    @classmethod
    def open(cls, base_url: str, api_key: str | None, timeout: float, deadline: Deadline | None = None,
             limits: Limits = Limits()) -> Clients:
        """Both clients for ``base_url``; ``limits``: the byte caps every answer is read under."""
        deadline = deadline or Deadline(None)
        root = base_url.rstrip("/")
        if root.endswith("/v1"):
            root = root[:-3]
        headers = {**IDENTITY, **auth_headers(api_key)}
        # no redirect is followed: the openai client's POSTs follow none either, so a GET that did would read
        # /health and /server_info of another server (another port, another host) than the one checked
        watch = Watch(deadline)  # one request at a time in a run: one watch for both clients
        http_client = httpx.Client(base_url=root, headers=headers, timeout=timeout, follow_redirects=False,
                                   transport=RecordingTransport(deadline, limits, watch))
        recorder = RecordingTransport(deadline, limits, watch)
        generation = httpx.Timeout(timeout * GENERATION_TIMEOUT_FACTOR, connect=timeout)
        oa = openai.OpenAI(base_url=f"{root}/v1", api_key=api_key or "EMPTY", timeout=generation, max_retries=0,
                           http_client=httpx.Client(transport=recorder, headers={"Accept-Encoding": "identity"},
                                                    timeout=generation))
        return cls(root=root, api_key=api_key, timeout=timeout, http=http_client, openai=oa, recorder=recorder,
                   deadline=deadline, limits=limits)

    @property
    def answered(self) -> bool:
        """Whether the server sent any byte back to any request of the run (:attr:`Watch.answered`)."""
        return self.recorder.watch.answered

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
        """GET ``path``; returns (status, parsed JSON or the text when not JSON; for a redirect, which is not
        followed, :func:`redirect_text`).

        Raises:
            httpx.TransportError: connection, timeout, or an answer refused unread (:class:`ResponseRefused`);
                callers map it with :func:`transport_finding`.
        """
        response = self.http.get(path, timeout=self.deadline.bound(self.timeout))
        if response.is_redirect:  # followed by nothing: the body is the redirect's, where it points is the news
            return response.status_code, redirect_text(response)
        try:
            return response.status_code, response.json()
        except (json.JSONDecodeError, ValueError, RecursionError):  # not JSON, not UTF-8, or nested too deep
            return response.status_code, response.text


def status_kind(status: int) -> str:
    """The failure kind of an unexpected HTTP status: ``server_error`` for 5xx (and above), else ``http_error``."""
    return "server_error" if status >= 500 else "http_error"


#: The fix for a 3xx: the check follows no redirect (:meth:`Clients.open`).
REDIRECT_FIX = ("the check follows no redirect (a redirect can lead to another server than the one checked): give "
                "the server's own address as --base-url")


def redirect_text(response: httpx.Response) -> str:
    """``redirect to LOCATION`` (``redirect without a Location header``): the evidence of a 3xx answer."""
    location = response.headers.get("location")
    return f"redirect to {location}" if location else "redirect without a Location header"


def redirect_finding(what: str, status: int, evidence: str) -> Finding | None:
    """``http_error`` for a 3xx answer to ``what`` (``None`` for any other status): the detail says where it
    points (``evidence``, :func:`redirect_text`) and :data:`REDIRECT_FIX`."""
    if not 300 <= status < 400:
        return None
    return Finding("http_error", f"{what} answered {status_label(status)}, {evidence}; fix: {REDIRECT_FIX}",
                   clip(evidence))


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
    redirect = redirect_finding(what, status, str(body))
    if redirect is not None:
        return redirect
    return Finding(status_kind(status), f"{what} answered {status_label(status)}", clip_body(body))


def _key_sent(request: httpx.Request | None) -> bool:
    """Whether ``request`` carried a real bearer token (the ``openai`` client sends ``EMPTY`` without one)."""
    auth = request.headers.get("authorization", "") if request is not None else ""
    return bool(auth) and auth != "Bearer EMPTY"


def refused_finding(exc: BaseException | None) -> Finding | None:
    """The finding for an answer refused unread (:class:`ResponseRefused`, raised or as the cause of
    ``openai``'s ``APIConnectionError``): kind :data:`REFUSED_KIND`; ``None`` for anything else."""
    for e in (exc, getattr(exc, "__cause__", None)):
        if isinstance(e, ResponseRefused):
            return Finding(REFUSED_KIND, e.detail, e.evidence)
    return None


def transport_finding(exc: Exception, what: str) -> Finding:
    """``unreachable`` or ``timeout`` for an httpx transport error; :data:`REFUSED_KIND` for an answer
    refused unread (:class:`ResponseRefused`)."""
    refused = refused_finding(exc)
    if refused is not None:
        return refused
    if isinstance(exc, httpx.TimeoutException):
        overdue = overdue_of(exc)
        if overdue is not None:
            return Finding("timeout", f"{what}: {overdue.message}", clip(overdue.evidence))
        return Finding("timeout", f"{what}: no answer in time ({type(exc).__name__})", clip(exc))
    return Finding("unreachable", f"{what}: {type(exc).__name__}", clip(exc))


#: How servers launched without tool-call parsing refuse a request with ``tools`` (4xx, or llama.cpp's older
#: 500): ``(words in the body, server, the flags to add)``. vLLM 0.33.0 ``renderers/online_renderer.py``:
#: ``"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set`` (auto) and
#: ``tool_choice=... requires --tool-call-parser to be set`` (required, named); llama.cpp's server:
#: ``tools param requires --jinja flag`` (HTTP 400; 500 before build b4400). Each names the server's own flag,
#: so a 4xx about anything else (a validation error, a flag of another subject, a word like
#: ``tool-call-parser`` without its dashes) keeps its status kind. SGLang 0.5.23 never refuses: without
#: ``--tool-call-parser`` it renders the tools and Kimi's markup reaches ``content`` (``markup_leak``).
NO_TOOL_PARSER_REFUSALS: tuple[tuple[str, str, str], ...] = (
    ("--enable-auto-tool-choice", "vLLM", "--enable-auto-tool-choice --tool-call-parser kimi_k2 "
                                          "--reasoning-parser kimi_k2"),
    ("requires --tool-call-parser", "vLLM", "--enable-auto-tool-choice --tool-call-parser kimi_k2 "
                                            "--reasoning-parser kimi_k2"),
    ("requires --jinja", "llama.cpp", "--jinja"),
)


def no_tool_parser_finding(status: int, body: str) -> Finding | None:
    """``config_mismatch`` when a 4xx/5xx ``body`` refuses tools in the words of :data:`NO_TOOL_PARSER_REFUSALS`
    (matched case-insensitively); else None. Its detail names the server and the flags to add."""
    text = body.lower()
    match = next((r for r in NO_TOOL_PARSER_REFUSALS if r[0] in text), None) if status >= 400 else None
    if match is None:
        return None
    _, server, flags = match
    also = " (SGLang: --tool-call-parser kimi_k2 --reasoning-parser kimi_k2)" if server == "vLLM" else ""
    return Finding("config_mismatch", f"{status_label(status)}: the server runs without a tool-call parser "
                   f"({server}'s refusal); relaunch it with {flags}{also}", clip_body(body))


def openai_finding(exc: Exception, *, streaming: bool, raw: str = "") -> Finding:
    """The failure kind for an exception the ``openai`` client raised.

    APITimeoutError → ``timeout``; APIConnectionError → ``unreachable``; a status error →
    :func:`status_kind` (5xx ``server_error``, others ``http_error``), labelled by
    :func:`status_label`, never by the client's class name (401/403: ``http_error`` with
    :func:`auth_note`; a 4xx saying the server lacks a tool-call parser: ``config_mismatch``,
    :func:`no_tool_parser_finding`); a generic
    APIError while streaming (openai-python raises it for an SSE ``{"error": ...}`` frame) →
    ``error_frame``; anything else (a body the client could not decode) → ``server_error``.
    An answer refused unread (:class:`ResponseRefused`, over a cap or encoded) → :data:`REFUSED_KIND`.
    """
    refused = refused_finding(exc)
    if refused is not None:
        return refused
    if isinstance(exc, openai.APITimeoutError):
        overdue = overdue_of(exc)
        if overdue is not None:
            return Finding("timeout", overdue.message, clip(overdue.evidence))
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
        if exc.response is not None:
            redirect = redirect_finding(f"{exc.request.method} {exc.request.url.path}" if exc.request is not None
                                        else "the request", exc.status_code, redirect_text(exc.response))
            if redirect is not None:
                return redirect
        return Finding(status_kind(exc.status_code), status_label(exc.status_code), clip_body(body))
    if isinstance(exc, openai.APIError) and streaming:
        return Finding("error_frame", f"the stream carried an error ({type(exc).__name__}: {exc.message})",
                       clip(exc.message))
    return Finding("server_error", f"the response could not be read ({type(exc).__name__})", clip(raw or exc))
