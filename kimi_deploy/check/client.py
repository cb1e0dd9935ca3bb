"""HTTP plumbing of the check: httpx for server endpoints, the official ``openai`` client for chat.

The ``openai`` client is what agents use, so its errors are what agents see; it is given an
httpx transport that keeps a copy of the raw response bytes, so that the stream-shape
validator can see the SSE framing (``[DONE]``, error frames) the client hides. Retries are
off (``max_retries=0``): a check reports what one request got.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import httpx
import openai

from kimi_deploy.check.results import clip
from kimi_deploy.check.validate import Finding

#: Contract requests may wait this many times ``--timeout`` for the answer: a non-streamed answer
#: arrives only when the whole generation is done, and a thinking model writing an 8 KiB argument
#: (~2,500 tokens) needs tens of seconds. Connecting still has to succeed within ``--timeout``.
GENERATION_TIMEOUT_FACTOR = 6


class _Tee(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, sink: bytearray) -> None:
        self._inner = inner
        self._sink = sink

    def __iter__(self):
        for chunk in self._inner:
            self._sink.extend(chunk)
            yield chunk

    def close(self) -> None:
        self._inner.close()


class RecordingTransport(httpx.BaseTransport):
    """An httpx transport that keeps the raw body of the last response in :attr:`last_body`."""

    def __init__(self) -> None:
        self._inner = httpx.HTTPTransport()
        self.last_body = bytearray()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self._inner.handle_request(request)
        self.last_body = bytearray()
        return httpx.Response(status_code=response.status_code, headers=response.headers,
                              stream=_Tee(response.stream, self.last_body), extensions=response.extensions)

    def close(self) -> None:
        self._inner.close()

    @property
    def last_text(self) -> str:
        return bytes(self.last_body).decode("utf-8", errors="replace")


@dataclasses.dataclass
class Clients:
    """The two clients of one run, sharing base URL, key and timeout.

    ``root`` is the server root without ``/v1`` (``http://HOST:PORT``).
    """

    root: str
    api_key: str | None
    timeout: float
    http: httpx.Client
    openai: openai.OpenAI
    recorder: RecordingTransport

    @classmethod
    def open(cls, base_url: str, api_key: str | None, timeout: float) -> Clients:
        root = base_url.rstrip("/")
        if root.endswith("/v1"):
            root = root[:-3]
        headers = {"Accept-Encoding": "identity"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        http = httpx.Client(base_url=root, headers=headers, timeout=timeout, follow_redirects=True)
        recorder = RecordingTransport()
        generation = httpx.Timeout(timeout * GENERATION_TIMEOUT_FACTOR, connect=timeout)
        oa = openai.OpenAI(base_url=f"{root}/v1", api_key=api_key or "EMPTY", timeout=generation, max_retries=0,
                           http_client=httpx.Client(transport=recorder, headers={"Accept-Encoding": "identity"},
                                                    timeout=generation))
        return cls(root=root, api_key=api_key, timeout=timeout, http=http, openai=oa, recorder=recorder)

    def close(self) -> None:
        self.http.close()
        self.openai.close()

    def get_json(self, path: str) -> tuple[int, Any]:
        """GET ``path``; returns (status, parsed JSON or the text when not JSON).

        Raises:
            httpx.TransportError: connection or timeout (callers map it with :func:`transport_finding`).
        """
        response = self.http.get(path)
        try:
            return response.status_code, response.json()
        except (json.JSONDecodeError, ValueError):
            return response.status_code, response.text


def transport_finding(exc: Exception, what: str) -> Finding:
    """``unreachable`` or ``timeout`` for an httpx transport error."""
    if isinstance(exc, httpx.TimeoutException):
        return Finding("timeout", f"{what}: no answer in time ({type(exc).__name__})", clip(exc))
    return Finding("unreachable", f"{what}: {type(exc).__name__}", clip(exc))


def openai_finding(exc: Exception, *, streaming: bool, raw: str = "") -> Finding:
    """The failure kind for an exception the ``openai`` client raised.

    APITimeoutError → ``timeout``; APIConnectionError → ``unreachable``; a status error 5xx
    or with a non-JSON body → ``server_error``, other statuses → ``http_error``; a generic
    APIError while streaming (openai-python raises it for an SSE ``{"error": ...}`` frame) →
    ``error_frame``; anything else (a body the client could not decode) → ``server_error``.
    """
    if isinstance(exc, openai.APITimeoutError):
        return Finding("timeout", f"no answer within the timeout ({type(exc).__name__})", clip(exc))
    if isinstance(exc, openai.APIConnectionError):
        return Finding("unreachable", f"connection failed: {exc}", clip(exc.__cause__ or exc))
    if isinstance(exc, openai.APIStatusError):
        body = exc.response.text if exc.response is not None else str(exc)
        status = exc.status_code
        if status >= 500:
            return Finding("server_error", f"HTTP {status} ({type(exc).__name__})", clip(body))
        return Finding("http_error", f"HTTP {status} ({type(exc).__name__})", clip(body))
    if isinstance(exc, openai.APIError) and streaming:
        return Finding("error_frame", f"the stream carried an error ({type(exc).__name__}: {exc.message})",
                       clip(exc.message))
    return Finding("server_error", f"the response could not be read ({type(exc).__name__})", clip(raw or exc))
