"""Is the server ready: the one verdict that ``status``, ``restart --wait`` and ``check``'s ``health.ready`` give.

Readiness is a real 1-token generation, asked in this order:

1. ``GET /health_generate`` (SGLang 0.5.23 ``srt/entrypoints/http_server.py`` ``health_generate``: it runs a
   1-token generation through the scheduler and answers 200 with an empty body once it serves, 503 while it
   cannot). A 2xx that is not a web page (:func:`web_page`) is ready; a 5xx, a 401 or a 403 is not ready.
2. Any other answer there (a 404 or 405 from a server without that path: vLLM, LiteLLM, an OpenAI-compatible
   proxy in front of SGLang forwarding ``/v1`` and ``/health`` only; a redirect; a catch-all web page) gets the
   same proof another way: ``POST /v1/chat/completions`` with ``max_tokens: 1`` to the served model. A 2xx
   ``chat.completion`` (a JSON object whose ``choices[0]`` has a ``message`` object, OpenAI API) is ready;
   anything else is not.

``/model_info`` and ``/health`` decide nothing: a server can answer ``/health`` 200 long before it generates
(SGLang's ``/health`` is a liveness answer), and a server without ``/model_info`` (not SGLang, or SGLang behind
a proxy) can serve. What server it is is :mod:`kimi_deploy.check.context`'s question, not readiness's.

The verdict (:class:`Readiness`): ``ready``, ``not_ready`` (the server answered, or accepted the connection, and
is not serving) or ``unreachable`` (no connection: nothing listens there, or the name does not resolve), with the
URL whose answer decided and the reason. :attr:`Readiness.words` is how every verb prints it, e.g.
``NOT READY (GET http://127.0.0.1:30000/health_generate: HTTP 503 Service Unavailable)``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import httpx

from kimi_deploy.wire.http import IDENTITY, control_client, status_label
from kimi_deploy.wire.limits import DEFAULT_MAX_BODY_BYTES, parse_json
from kimi_deploy.wire.printable import printable

READY, NOT_READY, UNREACHABLE = "ready", "not_ready", "unreachable"
#: How :attr:`Readiness.words` names each state (``status``'s ``health`` line, restart's summary, check's row).
WORDS = {READY: "ready", NOT_READY: "NOT READY", UNREACHABLE: "UNREACHABLE"}

GENERATE = "/health_generate"
COMPLETION = "/v1/chat/completions"
#: The 1-token request of step 2 (the model is added): what ``check`` has always sent for it.
ONE_TOKEN = {"messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 1, "temperature": 0}


def web_page(body: object) -> bool:
    """Whether a 2xx ``body`` (text, or parsed JSON) is markup, HTML or XML: a catch-all web server's page
    (nginx's welcome page), never SGLang's health answers (an empty body; ``/v1/models`` is JSON)."""
    return isinstance(body, str) and body.lstrip().startswith("<")


def is_completion(data: object) -> bool:
    """Whether ``data`` is a ``chat.completion`` a client can read: a JSON object whose ``choices`` is a non-empty
    array whose first item has a ``message`` object (the rule of :func:`kimi_deploy.check.completion_rules.completion_problem`,
    which also says what is wrong)."""
    choices = data.get("choices") if isinstance(data, dict) else None
    return isinstance(choices, list) and bool(choices) and isinstance(choices[0], dict) \
        and isinstance(choices[0].get("message"), dict)


@dataclasses.dataclass(frozen=True)
class Readiness:
    """One readiness verdict (see the module docstring).

    ``state``: :data:`READY`, :data:`NOT_READY` or :data:`UNREACHABLE`. ``method`` and ``url``: the request whose
    answer (or failure) decided. ``http_status``: its status (None: no answer). ``reason``: why, in words
    (``HTTP 200 OK, a 1-token generation``). ``model_missing``: step 2 was due and there was no model name to ask.
    ``body`` (the decisive answer's text, or its parsed JSON) and ``error`` (the exception when there was no
    answer) are for a caller that grades evidence (``check``); they are not part of the verdict's equality.
    """

    state: str
    method: str
    url: str
    http_status: int | None
    reason: str
    model_missing: bool = False
    body: Any = dataclasses.field(default=None, compare=False, repr=False)
    error: BaseException | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def ready(self) -> bool:
        return self.state == READY

    @property
    def path(self) -> str:
        """The path asked (``/health_generate``, ``/v1/chat/completions``), ``""`` when nothing was asked."""
        return httpx.URL(self.url).path if self.url else ""

    @property
    def words(self) -> str:
        """``ready (GET http://HOST:PORT/health_generate: HTTP 200 OK, a 1-token generation)``: the verdict as
        ``status``, ``restart`` and ``check`` print it."""
        where = f"{self.method} {self.url}: " if self.url else ""
        return f"{WORDS[self.state]} ({where}{self.reason})"

    def to_dict(self) -> dict[str, Any]:
        """The verdict for a JSON report: ``state``, ``ready``, ``method``, ``url``, ``http_status``, ``reason``,
        ``words``."""
        return {"state": self.state, "ready": self.ready, "method": self.method, "url": self.url,
                "http_status": self.http_status, "reason": self.reason, "words": self.words}


def not_served(reason: str) -> Readiness:
    """The verdict where nothing is asked because nothing serves HTTP here (a rank >= 1 of a multi-node group)."""
    return Readiness(NOT_READY, "", "", None, reason)


def _exchange(client: httpx.Client, method: str, path: str, timeout: Any, **kw: Any) -> tuple[int, Any]:
    """``(status, body)``: ``body`` is the parsed JSON when the answer is JSON, else its text (a redirect's:
    ``redirect to LOCATION``), read up to :data:`DEFAULT_MAX_BODY_BYTES` (past it, or in an encoding not asked
    for, ``""``: such an answer is no ready server's).

    Raises:
        httpx.HTTPError: no answer, or the exchange broke.
    """
    headers = {**IDENTITY, **kw.pop("headers", {})}
    with client.stream(method, path, headers=headers, timeout=timeout, follow_redirects=False, **kw) as response:
        if response.is_redirect:
            location = response.headers.get("location")
            return response.status_code, f"redirect to {location}" if location else "redirect without a Location header"
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        declared = response.headers.get("content-length", "")
        if encoding not in ("", "identity") or (declared.isdigit() and int(declared) > DEFAULT_MAX_BODY_BYTES):
            return response.status_code, ""
        data = bytearray()
        for piece in response.iter_raw():
            data += piece
            if len(data) > DEFAULT_MAX_BODY_BYTES:
                return response.status_code, ""
    text = data.decode("utf-8", "replace")
    try:
        return response.status_code, parse_json(bytes(data))
    except (ValueError, RecursionError, json.JSONDecodeError):
        return response.status_code, text


def _failed(method: str, url: str, exc: httpx.HTTPError) -> Readiness:
    """No answer: ``unreachable`` when no connection was made (nothing listens, the name does not resolve), else
    ``not_ready`` (connected, then no answer in time, or one that broke or was refused unread: a server too busy,
    or not one that serves this)."""
    name = type(exc).__name__
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol)):
        return Readiness(UNREACHABLE, method, url, None, f"no connection ({name}: {printable(str(exc))})"[:200], error=exc)
    if isinstance(exc, httpx.TimeoutException):
        return Readiness(NOT_READY, method, url, None, f"no answer in time ({name})", error=exc)
    return Readiness(NOT_READY, method, url, None, f"no usable answer ({name}: {printable(str(exc))})"[:200], error=exc)


def probe(client: httpx.Client, model: str | Callable[[], str | None] | None = None, *,
          timeout: Any = 10.0, generation_timeout: Any = None) -> Readiness:
    """The readiness verdict of the server ``client`` talks to (its ``base_url`` is the server root, its headers
    carry the key; the verdict's URL is written without a ``user:password@``). Never raises for what the server
    does.

    Args:
        model: the served model name for step 2's 1-token completion, or a function that finds it (called only
            when step 2 is due: ``check`` asks ``/v1/models`` then). None: step 2 is not ready, ``model_missing``.
        timeout: of ``GET /health_generate`` (seconds, or an ``httpx.Timeout``).
        generation_timeout: of the 1-token completion (default ``timeout``).
    """
    root = str(client.base_url.copy_with(userinfo=b"")).rstrip("/")  # a password in the URL is never printed
    url = root + GENERATE
    try:
        status, body = _exchange(client, "GET", GENERATE, timeout)
    except httpx.HTTPError as exc:
        return _failed("GET", url, exc)
    label = status_label(status)
    if 200 <= status < 300 and not web_page(body):
        return Readiness(READY, "GET", url, status, f"{label}, a 1-token generation", body=body)
    if status >= 500:
        return Readiness(NOT_READY, "GET", url, status, f"{label}: the server cannot generate yet", body=body)
    if status in (401, 403):
        return Readiness(NOT_READY, "GET", url, status, f"{label}: the API key is missing or refused", body=body)
    said = f"{label}{_aside(status, body)}"
    why = f"GET {GENERATE} answered {said}"
    name = model() if callable(model) else model
    if not name:
        return Readiness(NOT_READY, "GET", url, status, f"{said} and no model name to send a 1-token completion to",
                         model_missing=True, body=body)
    url = root + COMPLETION
    try:
        status, body = _exchange(client, "POST", COMPLETION, generation_timeout or timeout,
                                 json={"model": name, **ONE_TOKEN})
    except httpx.HTTPError as exc:
        failed = _failed("POST", url, exc)
        return dataclasses.replace(failed, reason=f"{failed.reason}; {why}")
    label = status_label(status)
    if 200 <= status < 300 and is_completion(body):
        return Readiness(READY, "POST", url, status, f"{label}, a 1-token chat completion ({why})", body=body)
    if 200 <= status < 300:
        return Readiness(NOT_READY, "POST", url, status, f"{label} but no chat.completion: another server on this "
                         f"port? ({why})", body=body)
    return Readiness(NOT_READY, "POST", url, status, f"{label}{_aside(status, body)} ({why})", body=body)


def _aside(status: int, body: object) -> str:
    """What a status alone does not say: ``, a web page`` (a 2xx page), ``, redirect to LOCATION`` (a 3xx, never
    followed: it can lead to another server)."""
    if 200 <= status < 300 and web_page(body):
        return ", a web page"
    if 300 <= status < 400 and isinstance(body, str):
        return f", {printable(body)[:200]}"
    return ""


def probe_url(base_url: str, api_key: str | None = None, model: str | None = None, *,
              timeout: float = 10.0) -> Readiness:
    """:func:`probe` of ``base_url`` (``http://HOST:PORT``) with a client of its own: ``Authorization: Bearer``
    when ``api_key`` is given, no proxy from the environment. The 1-token completion gets the same ``timeout``."""
    with control_client(base_url=base_url, timeout=timeout, api_key=api_key) as client:
        return probe(client, model, timeout=timeout)
