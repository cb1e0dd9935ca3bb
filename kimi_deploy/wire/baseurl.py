"""The ``--base-url`` of ``check`` and ``bench``: one rule for what a server root may look like.

A base URL is ``http(s)://HOST[:PORT][/PREFIX]`` (an IPv6 host in brackets, ``http://[::1]:30000``;
a ``/v1`` suffix and trailing slashes are fine: the clients strip them). Refused, each with the URL
and a fix (exit 2, before anything is sent or written):

- a control character, a space or DEL anywhere in it (httpx raised ``InvalidURL``, a traceback: issue #38);
- another scheme, or none (``127.0.0.1:30000``);
- no host, a host that does not parse (``http://[::1:30000``), a port that is not 1-65535;
- credentials in the URL (``http://user:pass@host``): every report and result records the base URL,
  so they would be written to disk; keys go in ``--api-key-file``;
- a query or fragment (``?x=1``, ``#a``): no endpoint the kit calls takes one;
- an endpoint pasted instead of the root (``.../v1/chat/completions``, ``.../v1/models``,
  ``.../health``): the kit appends the paths itself.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from kimi_deploy.errors import UsageError

#: Paths the kit appends to the root itself: a base URL ending in one was pasted from a request.
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/chat/completions", "/completions",
             "/models", "/health", "/health_generate", "/server_info", "/model_info")

_EXAMPLE = "e.g. --base-url http://127.0.0.1:30000 (IPv6: http://[::1]:30000)"


#: A host name: letters, digits, dots, dashes and underscores (RFC 1123 names; underscores occur in
#: container and Kubernetes names). ``%zz`` or ``a b`` is none: httpx refused them with a traceback, or the
#: run called the server unreachable (issue #30 item 12).
_NAME = re.compile(r"[A-Za-z0-9._-]+")


def _host_ok(host: str, *, bracketed: bool) -> bool:
    """Whether ``host`` (``urlsplit().hostname``) is a host name or an IP address; in brackets an IPv6 one,
    with an optional ``%zone``."""
    if bracketed:
        try:
            ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            return False
        return True
    return bool(_NAME.fullmatch(host))


def check_base_url(url: str, *, option: str = "--base-url") -> str:
    """``url`` without surrounding whitespace, once it names a server root by the module's rule.

    Raises:
        UsageError: the first rule it breaks, with the URL and a fix (exit 2).
    """
    url = url.strip()
    bad = next((i for i, ch in enumerate(url) if ord(ch) < 0x21 or ord(ch) == 0x7F), None)
    if bad is not None:
        raise UsageError(f"{option} holds U+{ord(url[bad]):04X} (a control character or a space) at character "
                         f"{bad + 1}, which no URL carries unencoded", value=ascii(url),
                         hint=f"percent-encode it (a space is %20) or remove it; {_EXAMPLE}")
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError for "abc" or 99999
        host = parts.hostname
    except ValueError as exc:
        raise UsageError(f"{option} is not a valid URL ({exc})", value=url, hint=_EXAMPLE) from None
    if parts.scheme.lower() not in ("http", "https"):
        raise UsageError(f"{option} must start with http:// or https://", value=url, hint=_EXAMPLE)
    if not host:
        raise UsageError(f"{option} has no host", value=url, hint=_EXAMPLE)
    if not _host_ok(host, bracketed="[" in parts.netloc):
        raise UsageError(f"{option} has a host that is neither a name nor an IP address ({host!r})", value=url,
                         hint=_EXAMPLE)
    if port == 0:
        raise UsageError(f"{option} has port 0, which no server listens on", value=url, hint=_EXAMPLE)
    if parts.username is not None or parts.password is not None:
        shown = parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1]).geturl()
        raise UsageError(f"{option} carries credentials (user:password@), which every report and result would "
                         "record", value=shown,
                         hint=f"give {shown} and pass the key with --api-key-file FILE (a Bearer token)")
    if parts.query or parts.fragment:
        root = parts._replace(query="", fragment="").geturl()
        raise UsageError(f"{option} has a query or fragment, which no endpoint the kit calls takes", value=url,
                         hint=f"give the server root: {option} {root}")
    path = parts.path.rstrip("/")
    endpoint = next((e for e in ENDPOINTS if path.endswith(e)), None)
    if endpoint is not None:
        root = parts._replace(path=path[: -len(endpoint)]).geturl()
        raise UsageError(f"{option} names an endpoint ({endpoint}), not the server root", value=url,
                         hint=f"give the root, the kit adds the paths: {option} {root}")
    return url


__all__ = ["check_base_url", "ENDPOINTS"]
