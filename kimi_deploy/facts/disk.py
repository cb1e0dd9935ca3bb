"""Free disk space where a path is (or will be): what ``doctor``'s ``disk`` check judges for the cache folder.

``statvfs(3)``: ``f_bavail * f_frsize`` is the space an unprivileged user may still write (root's reserve left
out), ``shutil.disk_usage`` the file system's size. A path that does not exist yet is measured on its nearest
existing ancestor. The result is a :class:`DiskSpace`, which the tests build directly as its recorded form.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class DiskSpace:
    """Free space for ``path``, measured on ``measured`` (its nearest existing ancestor), bytes."""

    path: str
    measured: str
    free_bytes: int
    total_bytes: int


def disk_space(path: str | Path) -> DiskSpace:
    """Free bytes (for an unprivileged user) on the file system that holds or will hold ``path``.

    Raises:
        OSError: the file system cannot be asked (its ``strerror`` says why).
    """
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    usage = shutil.disk_usage(probe)
    stat = os.statvfs(probe)
    return DiskSpace(str(path), str(probe), stat.f_bavail * stat.f_frsize, usage.total)
