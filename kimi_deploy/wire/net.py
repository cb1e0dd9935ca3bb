"""Host names as the profile compares them: loopback, one host however spelt, one host per name.

The profile (:mod:`kimi_deploy.profile`, which exports these names) and the clients (:mod:`kimi_deploy.wire.apikey`)
share them.
"""

from __future__ import annotations

import ipaddress
import socket


def is_loopback(host: str) -> bool:
    """True when ``host`` (a name or an IP literal, IPv6 without brackets) means this machine only:
    ``localhost`` in any case, 127.0.0.0/8, ``::1``, IPv4-mapped loopback (``::ffff:127.0.0.1``). Not a name
    under ``.localhost``: RFC 6761 asks resolvers to answer those with loopback, but glibc with ``hosts: files
    dns`` sends ``x.localhost`` to the DNS server, whose answer may be this host's public address. Pure:
    nothing is resolved."""
    name = host.lower().rstrip(".")
    if name == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def host_key(host: str) -> str:
    """The identity of a profile host: an IP address in its compressed lower-case form (``fd00:0::11`` and
    ``FD00::11`` are one host), a name in lower case (DNS names are case-insensitive). Pure."""
    try:
        return ipaddress.ip_address(host).compressed
    except ValueError:
        return host.lower()


def not_one_host(host: str) -> str | None:
    """Why ``host`` cannot name one machine (``0.0.0.0``/``::`` mean every address, a multicast address a group,
    255.255.255.255 the broadcast), or None: a worker URL, a rendezvous address or a host folder needs one."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if ip.is_unspecified:
        return "it means every address of whichever host binds it"
    if ip.is_multicast:
        return "a multicast address"
    if ip.version == 4 and ip == ipaddress.IPv4Address("255.255.255.255"):
        return "the broadcast address"
    return None


def binds_locally(ip: str) -> bool:
    """True when ``ip`` (an IP literal, IPv6 without brackets, a link-local one with its ``%zone``) is one of
    this host's own addresses: a socket can bind to it (EADDRNOTAVAIL otherwise). No packet is sent; names are
    not resolved (the caller decides whether a name may be). Never raises."""
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return False
    if addr.is_multicast or addr.is_unspecified:
        return False
    family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((ip, 0))
    except OSError:
        return False
    return True
