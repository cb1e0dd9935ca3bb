"""The host's memory from ``/proc/meminfo``: a pure parser (tested on a recorded file) and its one probe.

Format (proc(5), "/proc/meminfo"): one ``Field:   value kB`` line per field; a field without a unit
(``HugePages_Total``) is a count. ``MemAvailable`` (Linux >= 3.14) is "an estimate of how much memory is available
for starting new applications, without swapping", page cache that can be dropped included.
"""

from __future__ import annotations

import re
from pathlib import Path

MEMINFO = Path("/proc/meminfo")

_LINE = re.compile(r"(\w+(?:\(\w+\))?):\s+(\d+)(\s+kB)?\s*")


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` text -> ``{field: bytes}`` (counts, such as ``HugePages_Total``, as they are); lines
    that do not match the format are ignored."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = _LINE.fullmatch(line)
        if m:
            out[m.group(1)] = int(m.group(2)) * (1024 if m.group(3) else 1)
    return out


def read_meminfo(path: Path = MEMINFO) -> dict[str, int] | None:
    """:func:`parse_meminfo` of ``path``, or ``None`` when it cannot be read."""
    try:
        return parse_meminfo(path.read_text())
    except (OSError, UnicodeDecodeError):
        return None
