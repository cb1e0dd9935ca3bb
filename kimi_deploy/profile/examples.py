"""Example values that must not reach a host or a cluster: ``render`` and ``install`` refuse a profile holding one.

``kimi-deploy init --fleet`` / ``--kubernetes`` write live keys with values nobody can deploy by mistake:

- addresses from the documentation ranges, reserved so that they are never a real host's: RFC 5737
  (192.0.2.0/24 TEST-NET-1, 198.51.100.0/24 TEST-NET-2, 203.0.113.0/24 TEST-NET-3) and RFC 3849
  (2001:db8::/32);
- image references under a registry in the ``.example`` or ``.invalid`` top-level domain, which RFC 2606
  section 2 reserves so that they never resolve (:data:`EXAMPLE_REGISTRY`).

:func:`example_values` walks every string of a profile (addresses, ``HOST:PORT``, URLs, image references) and
returns where each example value is; :func:`refuse_example_values` raises on any. A profile parses with them
(``validate`` still reads it), so the example keys are live where ``init`` writes them, and refused where they
would reach a host or a cluster.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from kimi_deploy.errors import ProfileError

if TYPE_CHECKING:
    from kimi_deploy.profile.model import Profile

#: The registry of the example images ``init`` writes (``.example``: RFC 2606, never resolves).
EXAMPLE_REGISTRY = "registry.example"

#: The documentation address ranges (RFC 5737 section 3, RFC 3849 section 2).
DOCUMENTATION_NETWORKS = tuple(ipaddress.ip_network(n) for n in
                               ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32"))

#: Top-level domains reserved so that they never resolve (RFC 2606 section 2).
EXAMPLE_TLDS = ("example", "invalid")

#: A dotted DNS name (RFC 1123 letters, digits, hyphens), optionally ending in a dot.
HOST_NAME = re.compile(r"(?:[A-Za-z0-9-]+\.)+[A-Za-z0-9-]+\.?")


def _is_documentation_address(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return any(address in network for network in DOCUMENTATION_NETWORKS)


def _is_example_name(host: str) -> bool:
    return HOST_NAME.fullmatch(host) is not None and host.rstrip(".").rsplit(".", 1)[-1].lower() in EXAMPLE_TLDS


def _hosts(value: str) -> Iterator[str]:
    """Every host name or address ``value`` may name: itself, a ``HOST:PORT``'s host, a URL's host, an image
    reference's registry (the part before the first ``/``)."""
    yield value
    if "://" in value:
        try:
            host = urlsplit(value).hostname
        except ValueError:
            host = None
        if host:
            yield host
        return
    first = value.split("/", 1)[0]
    yield first
    if first.startswith("[") and "]" in first:
        yield first[1:first.index("]")]
    elif first.count(":") == 1:
        yield first.split(":", 1)[0]


def is_example_value(value: str) -> bool:
    """Whether ``value`` (an address, ``HOST:PORT``, URL or image reference) names a documentation address or a
    host in a reserved example domain. Prose (a value with white space: a description) is none."""
    if not value or any(c.isspace() for c in value):
        return False
    return any(_is_documentation_address(h) or _is_example_name(h) for h in _hosts(value))


def _strings(data: Any, where: str) -> Iterator[tuple[str, str]]:
    if isinstance(data, str):
        yield where, data
    elif isinstance(data, dict):
        for key, item in data.items():
            yield from _strings(item, f"{where}.{key}" if where else str(key))
    elif isinstance(data, (list, tuple)):
        for index, item in enumerate(data):
            yield from _strings(item, f"{where}[{index}]")


def example_values(profile: Profile) -> list[tuple[str, str]]:
    """``(key path, value)`` of every example value in ``profile`` (``fleet.replicas[0].nodes[0]``), in
    profile order."""
    return [(where, value) for where, value in _strings(profile.model_dump(mode="json"), "")
            if is_example_value(value)]


def refuse_example_values(profile: Profile) -> None:
    """Refuse a profile that still holds an example value ``init`` wrote.

    Raises:
        ProfileError: one problem line per example value (exit 2).
    """
    found = example_values(profile)
    if found:
        raise ProfileError(
            "the profile still holds example values, which name no real host or image",
            problems=[f"{where}: {value!r}" for where, value in found],
            hint="replace the example value with your own (your hosts' addresses, your registry's images), then "
                 "render again")
