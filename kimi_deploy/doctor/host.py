"""Host probes that need no GPU: a port bind test, free disk, the installed unit versus a fresh render."""

from __future__ import annotations

import dataclasses
import difflib
import errno
import os
import shutil
import socket
from pathlib import Path

from kimi_deploy.paths import HostLayout
from kimi_deploy.targets.systemd import Rendered


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
    """Try to bind ``host:port`` (TCP, SO_REUSEADDR like uvicorn) and release it at once."""
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


@dataclasses.dataclass(frozen=True)
class DiskSpace:
    """Free space for ``path``, measured on ``measured`` (its nearest existing ancestor), bytes."""

    path: str
    measured: str
    free_bytes: int
    total_bytes: int


def disk_space(path: str | Path) -> DiskSpace:
    """Free bytes (for an unprivileged user) on the file system that holds or will hold ``path``."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    usage = shutil.disk_usage(probe)
    stat = os.statvfs(probe)
    return DiskSpace(str(path), str(probe), stat.f_bavail * stat.f_frsize, usage.total)


@dataclasses.dataclass(frozen=True)
class FileDrift:
    """One installed file against its fresh render: ``state`` is ``absent``, ``same`` or ``different``.

    ``added``/``removed``: line counts of the unified diff (installed -> fresh render);
    ``first``: the first changed line of the fresh render (or of the installed file); ``diff``: the
    unified diff text.
    """

    name: str
    path: str
    state: str
    added: int = 0
    removed: int = 0
    first: str = ""
    diff: str = ""


def compare_installed(rendered: Rendered, layout: HostLayout) -> list[FileDrift]:
    """Compare ``<root>/etc/systemd/system/<name>.service`` and ``<root>/etc/kimi-deploy/<name>.env``
    with ``rendered``."""
    out = []
    for name, directory in ((rendered.service_unit, layout.systemd_dir), (rendered.env_file, layout.config_dir)):
        path = directory / name
        fresh = rendered.files[name]
        try:
            installed = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            out.append(FileDrift(name, str(path), "absent"))
            continue
        except (OSError, UnicodeDecodeError) as exc:
            out.append(FileDrift(name, str(path), "different", first=f"unreadable: {exc}"))
            continue
        if installed == fresh:
            out.append(FileDrift(name, str(path), "same"))
            continue
        diff = list(difflib.unified_diff(installed.splitlines(), fresh.splitlines(),
                                         f"installed/{name}", f"rendered/{name}", lineterm=""))
        changes = [d for d in diff[2:] if d[:1] in "+-"]
        added = sum(1 for d in changes if d.startswith("+"))
        first = next((d for d in changes if d.startswith("+")), changes[0] if changes else "")
        first = f"{first[:1]} {first[1:].strip()}" if first else ""
        out.append(FileDrift(name, str(path), "different", added, len(changes) - added, first,
                             "\n".join(diff)))
    return out
