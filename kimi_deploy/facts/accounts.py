"""Accounts and device groups of this host (or of a ``--root`` tree): what ``install`` reads to plan the service
user and its groups.

:func:`existing_accounts`: which users or groups exist, by NSS (``getpwnam(3)``/``getgrnam(3)``) on the host, by the
tree's own ``/etc/passwd`` and ``/etc/group`` (first field of each line, passwd(5)/group(5)) under ``--root``;
:func:`gpu_device_groups`/:func:`gpu_group_members`: the groups owning a ``/dev/nvidia*`` node that is not
world-readable and -writable, and their members. The results are plain sets and mappings, which the tests build
directly as their recorded form (a tree's files are read as any host's).
"""

from __future__ import annotations

import glob
import grp
import os
import pwd
import stat
from pathlib import Path

from kimi_deploy.paths import HostLayout


def _names_in(file: Path) -> set[str]:
    """First fields of a passwd/group file (empty when missing)."""
    try:
        return {line.split(":", 1)[0] for line in file.read_text().splitlines() if line and ":" in line}
    except FileNotFoundError:
        return set()


def existing_accounts(layout: HostLayout, kind: str, names: set[str]) -> frozenset[str]:
    """Which of the user (``kind="user"``) or group ``names`` exist: NSS on the host, the tree's files under --root."""
    if not layout.is_host:
        return frozenset(names & _names_in(layout.passwd if kind == "user" else layout.group_file))
    found = set()
    for name in names:
        try:
            (pwd.getpwnam if kind == "user" else grp.getgrnam)(name)
            found.add(name)
        except KeyError:
            continue
    return frozenset(found)


def gpu_device_groups(device_glob: str = "/dev/nvidia*") -> dict[str, str]:
    """Groups the service user must join to open NVIDIA device nodes: ``{device: group}``.

    The NVIDIA driver creates ``/dev/nvidia*`` with mode 0666 by default (``NVreg_DeviceFileMode``),
    so this is usually empty; a device without world read/write needs its owning group
    (``video`` or ``render`` on distributions that tighten it).
    """
    out = {}
    for dev in sorted(glob.glob(device_glob)):
        try:
            st = os.stat(dev)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode) and (st.st_mode & 0o006) != 0o006 and st.st_gid != 0:
            try:
                out[dev] = grp.getgrgid(st.st_gid).gr_name
            except KeyError:
                continue
    return out


def gpu_group_members() -> dict[str, tuple[str, ...]]:
    """Group -> members for every group owning a restricted ``/dev/nvidia*`` node (:func:`gpu_device_groups`)."""
    out = {}
    for group in sorted(set(gpu_device_groups().values())):
        try:
            out[group] = tuple(grp.getgrnam(group).gr_mem)
        except KeyError:
            continue
    return out
