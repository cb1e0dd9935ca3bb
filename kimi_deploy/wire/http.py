"""The HTTP manners of every kit client: one ``Authorization`` header, identity encoding only, capped reads.

Used by ``check``'s client, the readiness probes, ``status``, ``restart``'s idle wait and the gateway client; a
server (or a gateway) is hostile input, so a body is read only up to a cap and never decoded from gzip
(docs/reference/limits.md).
"""

from __future__ import annotations

import http
from typing import Any

import httpx

from kimi_deploy.wire.bounded import Deadline, Watch, bounded_transport
from kimi_deploy.wire.limits import DEFAULT_MAX_BODY_BYTES, LimitExceeded, Refused, parse_json


def auth_headers(api_key: str | None) -> dict[str, str]:
    """``Authorization: Bearer KEY`` for SGLang and smg (``{}`` without a key): the one spelling of the kit's
    clients (readiness, status, restart's idle wait, the gateway client, check's HTTP client)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def control_client(*, timeout: float, base_url: str = "", api_key: str | None = None) -> httpx.Client:
    """The ``httpx.Client`` of every control-plane request (readiness, status, restart's idle wait, the gateway's
    worker API): ``Authorization`` from :func:`auth_headers`, no proxy from the environment, and each request
    bounded in wall-clock time at the socket (:mod:`kimi_deploy.wire.bounded`) by its read timeout
    (``timeout`` seconds unless the call passes its own), however the server paces its bytes.

    Past that bound the request raises ``httpx.ReadTimeout``: a server that sends ``100 Continue`` heads, a head
    one byte a second or an endless body no longer holds ``status`` or ``restart --wait`` forever.
    """
    watch = Watch(Deadline(None))

    def begin(request: httpx.Request) -> None:
        timeouts = request.extensions.get("timeout") or {}
        watch.begin(timeouts.get("read") or timeout)

    return httpx.Client(base_url=base_url, timeout=timeout, headers=auth_headers(api_key), trust_env=False,
                        transport=bounded_transport(watch), event_hooks={"request": [begin]})


def status_label(status: int) -> str:
    """``HTTP 501 Not Implemented``: the status and its RFC 9110 reason phrase (``HTTP 599`` when unregistered).

    The ``openai`` client's exception class names are no label: it raises ``InternalServerError``
    for every status >= 500 (501, 502, 503 ...) and a bare ``APIStatusError`` for unmapped ones.
    """
    try:
        return f"HTTP {status} {http.HTTPStatus(status).phrase}"
    except ValueError:
        return f"HTTP {status}"


#: Sent on every control-plane request: an answer in another ``Content-Encoding`` is not decoded.
IDENTITY = {"Accept-Encoding": "identity"}


def request_capped(client: httpx.Client, method: str, path: str, *, read_body: bool = True,
                   max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, **kw: Any) -> tuple[int, Any]:
    """``(status, body)`` of one request of the kit's control-plane clients (status, restart, the gateway's
    worker API), read as ``check`` reads a server (docs/reference/limits.md).

    ``body``: the parsed JSON (any JSON type), ``None`` when not asked (``read_body`` False: the status
    alone counts) or when the body is not JSON (also nested too deep for the parser), or a
    :class:`kimi_deploy.wire.limits.Refused` when it was refused unread: a ``Content-Encoding`` other than
    identity (a 500 KB gzip body of 512 MB once cost ``status`` 1 GB of RSS) or more than
    ``max_body_bytes`` (declared or read).

    Raises:
        httpx.HTTPError: no answer, or the exchange broke.
    """
    headers = {**IDENTITY, **kw.pop("headers", {})}
    with client.stream(method, path, headers=headers, **kw) as response:
        if not read_body:
            return response.status_code, None
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            return response.status_code, Refused(f"Content-Encoding {encoding} was not asked for; not decoded")
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_body_bytes:
            return response.status_code, LimitExceeded("the body", max_body_bytes, None, int(declared))
        body = bytearray()
        for piece in response.iter_raw():
            body += piece
            if len(body) > max_body_bytes:
                return response.status_code, LimitExceeded("the body", max_body_bytes, None, len(body))
    try:
        return response.status_code, parse_json(body)
    except ValueError:
        return response.status_code, None
