"""Which process answers on the service's port, and whether it is the service's: ``status`` asks before it calls
a health answer the service's health (any process on :30000 once passed as the server).

The facts come from the running kernel's ``/proc`` (proc(5)): the listening TCP sockets of ``/proc/net/tcp`` and
``/proc/net/tcp6`` (state ``0A``, TCP_LISTEN in include/net/tcp_states.h), the processes holding them (their
``/proc/PID/fd`` links ``socket:[INODE]``), and each one's control group (``/proc/PID/cgroup``: the cgroup v2
line ``0::PATH``, else v1's ``name=systemd`` hierarchy). systemd runs a unit's processes in the unit's control group
(systemctl show's ``ControlGroup=``, systemd.exec(5)), so a listener inside it, or inside a group below it, is the
unit's. Another user's file descriptors are readable by root only: without root the answer can be unknown, never a
guess. The parsers are pure and tested on recorded text; :func:`gather` is the only reader.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

#: The kernel's process file system (proc(5)).
PROC = Path("/proc")

#: ``st`` of a listening socket in /proc/net/tcp (TCP_LISTEN = 10, include/net/tcp_states.h).
TCP_LISTEN = "0A"

#: Processes whose fd folder ``gather`` reads at most (a GPU host runs a few thousand).
MAX_PROCESSES = 100_000


def parse_net_tcp(text: str, port: int) -> set[int]:
    """Socket inodes listening on TCP ``port`` in ``/proc/net/tcp`` or ``tcp6`` text (any local address).

    Columns (proc(5)): ``sl local_address rem_address st ... uid timeout inode``; the port is hex after the ``:``.
    Malformed lines are skipped."""
    inodes = set()
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != TCP_LISTEN:
            continue
        try:
            if int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(int(fields[9]))
        except (IndexError, ValueError):
            continue
    return inodes - {0}


def parse_cgroup(text: str) -> str | None:
    """The control group path of a ``/proc/PID/cgroup`` text: the cgroup v2 line (``0::/system.slice/x.service``),
    else the v1 ``name=systemd`` hierarchy's; None when neither is there."""
    v1 = None
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "" and path:
            return path
        if controllers == "name=systemd" and path:
            v1 = path
    return v1


def in_group(cgroup: str | None, unit_cgroup: str | None) -> bool | None:
    """Whether ``cgroup`` is ``unit_cgroup`` or below it; None when either is unknown."""
    if not cgroup or not unit_cgroup:
        return None
    return cgroup == unit_cgroup or cgroup.startswith(unit_cgroup.rstrip("/") + "/")


@dataclasses.dataclass(frozen=True)
class Listener:
    """One process holding a socket that listens on the port: its PID, name (``comm``) and control group."""

    pid: int
    comm: str
    cgroup: str | None

    def text(self) -> str:
        return f"PID {self.pid} ({self.comm or '?'}) in {self.cgroup or 'an unknown cgroup'}"


@dataclasses.dataclass(frozen=True)
class Answering:
    """Who listens on ``port``: ``listeners`` (empty: none found, ``detail`` says why), the unit's control group
    (``ControlGroup=``, else its main process's) and its main PID."""

    port: int
    listeners: tuple[Listener, ...]
    unit_cgroup: str | None
    main_pid: int | None
    detail: str = ""

    @property
    def ours(self) -> bool | None:
        """True: a listener is the unit's (its main PID, or in its control group); False: listeners were found
        and none is the unit's (or the unit has no main process); None: not known."""
        if not self.listeners:
            return None
        if self.main_pid is None:
            return False
        verdicts = [True if p.pid == self.main_pid else in_group(p.cgroup, self.unit_cgroup) for p in self.listeners]
        if any(v is True for v in verdicts):
            return True
        return False if all(v is False for v in verdicts) else None

    def to_dict(self) -> dict[str, Any]:
        return {"port": self.port, "listeners": [dataclasses.asdict(p) for p in self.listeners],
                "unit_cgroup": self.unit_cgroup, "main_pid": self.main_pid, "ours": self.ours,
                "detail": self.detail, "line": self.line()}

    def line(self) -> str:
        """``status``'s line: who answers, and whether it is the unit."""
        if not self.listeners:
            return f"no listener on :{self.port} found ({self.detail})"
        who = "; ".join(p.text() for p in self.listeners)
        verdict = {True: "the unit's", False: "NOT the unit's", None: "unknown whether it is the unit's"}[self.ours]
        return f":{self.port} held by {who}: {verdict}"


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def gather(port: int, unit_cgroup: str | None, main_pid: int | None, proc: Path = PROC) -> Answering:
    """Read ``proc`` for the processes listening on TCP ``port`` (never raises: what cannot be read is a
    ``detail``)."""
    inodes: set[int] = set()
    for name in ("tcp", "tcp6"):
        text = _read(proc / "net" / name)
        if text:
            inodes |= parse_net_tcp(text, port)
    if not unit_cgroup and main_pid:
        unit_cgroup = parse_cgroup(_read(proc / str(main_pid) / "cgroup") or "")
    if not inodes:
        return Answering(port, (), unit_cgroup, main_pid, "no listening socket in /proc/net/tcp*")
    wanted = {f"socket:[{i}]" for i in inodes}
    found, unreadable = [], 0
    try:
        pids = [int(e) for e in os.listdir(proc) if e.isdigit()][:MAX_PROCESSES]
    except OSError:
        pids = []
    for pid in pids:
        try:
            fds = os.listdir(proc / str(pid) / "fd")
        except OSError:
            unreadable += 1
            continue
        for fd in fds:
            try:
                if os.readlink(proc / str(pid) / "fd" / fd) in wanted:
                    comm = (_read(proc / str(pid) / "comm") or "").strip()
                    found.append(Listener(pid, comm, parse_cgroup(_read(proc / str(pid) / "cgroup") or "")))
                    break
            except OSError:
                continue
    detail = "" if found else (f"the socket's process is not readable here ({unreadable} processes' fds "
                               "unreadable: run status as root)" if unreadable else "its process has exited")
    return Answering(port, tuple(found), unit_cgroup, main_pid, detail)
