"""Which NVIDIA Linux driver a CUDA version needs: one table, with its source.

Source: NVIDIA CUDA Toolkit release notes, Table 3 "CUDA Toolkit and Corresponding
Driver Versions" (Linux x86_64 column, the GA release of each minor version), and
Table 2 "CUDA Toolkit and Minimum Required Driver Version for CUDA Minor Version
Compatibility" (12.x: >= 525.60.13; 13.x: >= 580, the R580 branch that introduced
CUDA 13.0). torch wheels carry their own CUDA runtime, so the CUDA version that
matters is ``torch.version.cuda`` of the SGLang interpreter, and the host needs only
the driver.

Reading: a driver at or above the minor's GA driver runs everything built with it; a
driver at or above the major's floor but below the minor's GA driver runs through minor
version compatibility (no PTX JIT of newer PTX: a warning); below the major's floor
nothing built for that CUDA runs (a failure).
"""

from __future__ import annotations

import dataclasses

#: (major, minor) -> minimum Linux x86_64 driver of that CUDA release's GA (Table 3).
MIN_DRIVER_GA: dict[tuple[int, int], str] = {
    (12, 0): "525.60.13",
    (12, 1): "530.30.02",
    (12, 2): "535.54.03",
    (12, 3): "545.23.06",
    (12, 4): "550.54.14",
    (12, 5): "555.42.02",
    (12, 6): "560.28.03",
    (12, 8): "570.26",
    (12, 9): "575.51.03",
    (13, 0): "580.65.06",
}
#: major -> minimum driver for CUDA minor version compatibility (Table 2).
MIN_DRIVER_MAJOR: dict[int, str] = {12: "525.60.13", 13: "580.65.06"}
SOURCE = "NVIDIA CUDA Toolkit release notes, tables 2 and 3 (Linux x86_64)"


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.strip().split(".") if p.isdigit())


def driver_at_least(driver: str, minimum: str) -> bool:
    """Compare dotted driver versions numerically (``575.57.08`` < ``580.65.06``)."""
    return _key(driver) >= _key(minimum)


@dataclasses.dataclass(frozen=True)
class DriverVerdict:
    """``status``: ``pass``/``warn``/``fail``; ``needed``: the driver the CUDA version asks for (or None)."""

    status: str
    needed: str | None
    reason: str


def judge_driver(driver: str, cuda: str) -> DriverVerdict:
    """Is Linux driver ``driver`` (``580.95.05``) enough for CUDA ``cuda`` (``13.0``)?

    A CUDA minor newer than the table knows is judged by the newest row of its major
    (warn: unknown minor), an unknown major fails closed as a warning.
    """
    parts = _key(cuda)
    if len(parts) < 2:
        return DriverVerdict("warn", None, f"cannot read CUDA version {cuda!r}")
    major, minor = parts[0], parts[1]
    floor = MIN_DRIVER_MAJOR.get(major)
    if floor is None:
        return DriverVerdict("warn", None, f"CUDA {major}.x is not in kimi-deploy's driver table ({SOURCE})")
    if not driver_at_least(driver, floor):
        return DriverVerdict("fail", floor, f"CUDA {major}.x needs driver >= {floor}")
    known = sorted(k for k in MIN_DRIVER_GA if k[0] == major and k <= (major, minor))
    ga = MIN_DRIVER_GA[known[-1]] if known else floor
    if (major, minor) not in MIN_DRIVER_GA:
        return DriverVerdict("warn", ga, f"CUDA {major}.{minor} is newer than the driver table; "
                                         f"{major}.{known[-1][1] if known else 0} needs >= {ga}")
    if not driver_at_least(driver, ga):
        return DriverVerdict("warn", ga, f"CUDA {major}.{minor} GA needs driver >= {ga}; below it only "
                                         "minor version compatibility applies (no JIT of newer PTX)")
    return DriverVerdict("pass", ga, f"CUDA {major}.{minor} needs driver >= {ga}")
