"""Fabric probes for peer-memory all-reduce: command builders / file paths and pure parsers of their output.

Why: FlashInfer all-reduce fusion, torch symmetric memory and SGLang's PCIe IPC all-reduce write into peer
GPU memory directly and ignore ``NCCL_P2P_DISABLE``/``NCCL_P2P_LEVEL``; a host that only works with NCCL
P2P off (ACS redirect, IOMMU translation) can hang with GPUs at 100% until reset (vLLM #33041,
NVIDIA/nccl #1999 and #2079). Formats:

- ``lspci -vvv`` (pciutils ``ls-caps.c``): a device block starts at column 0 with ``BB:DD.F description``
  (``DDDD:BB:DD.F`` with ``-D``); inside the block ``\\t\\tACSCtl:\\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+
  UpstreamFwd+ EgressCtrl- DirectTrans-`` is the ACS control register (``+`` set). Without root lspci
  prints ``\\tCapabilities: <access denied>`` instead of the capability list.
- ``/proc/cmdline``: the kernel command line (``intel_iommu=``, ``amd_iommu=``, ``iommu=``,
  ``iommu.passthrough=``; kernel-parameters.txt); ``/sys/class/iommu/``: one entry per active IOMMU
  (``dmar0``, ``ivhd0``); ``/sys/kernel/iommu_groups/*/type``: ``DMA``, ``DMA-FQ`` (translated) or
  ``identity`` (passthrough), Linux 5.11+.
- ``/sys/module/nvidia_uvm/parameters/uvm_disable_hmm``: a bool module parameter, ``Y``/``N`` (or
  ``1``/``0``); absent when nvidia_uvm is not loaded or too old to have it.
- ``nvidia-smi topo -p2p r`` / ``-p2p w``: an optional title line, then a tab-separated matrix (header
  ``GPU0 GPU1 ...``, possibly ANSI-underlined; rows `` GPU0 X OK CNS ...``), then a legend: ``X`` self,
  ``OK``, ``CNS`` chipset not supported, ``GNS`` GPU not supported, ``TNS`` topology not supported,
  ``NS`` not supported, ``DR`` disabled by regkey, ``U`` unknown. Read and write are asked separately
  (both are documented capabilities; a peer-memory all-reduce needs both).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Literal

from kimi_deploy.facts.nvidia import ParseError

CMDLINE = "/proc/cmdline"
IOMMU_CLASS = "/sys/class/iommu"
IOMMU_GROUPS = "/sys/kernel/iommu_groups"
UVM_DISABLE_HMM = "/sys/module/nvidia_uvm/parameters/uvm_disable_hmm"

#: ACS control bits that send peer-to-peer traffic up to the root complex instead of across the switch.
REDIRECT_BITS = ("ReqRedir", "CmpltRedir")
#: Legend of ``nvidia-smi topo -p2p``.
P2P_LEGEND = {"X": "self", "OK": "ok", "CNS": "chipset not supported", "GNS": "GPU not supported",
              "TNS": "topology not supported", "NS": "not supported", "DR": "disabled by regkey", "U": "unknown"}

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_DEVICE = re.compile(r"^((?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+(.*)$")


def lspci_command() -> list[str]:
    """argv of the verbose PCI listing (ACS control bits need root)."""
    return ["lspci", "-vvv"]


def p2p_command(capability: Literal["r", "w"]) -> list[str]:
    """argv of nvidia-smi's peer-to-peer status matrix for ``r`` (read) or ``w`` (write)."""
    return ["nvidia-smi", "topo", "-p2p", capability]


@dataclasses.dataclass(frozen=True)
class AcsPort:
    """A PCI function with an ACS capability: its address, description and ACSCtl bits (name -> set)."""

    bdf: str
    description: str
    control: dict[str, bool]

    @property
    def redirects(self) -> list[str]:
        """The P2P redirect bits set (``ReqRedir``, ``CmpltRedir``): peer traffic goes via the root complex."""
        return [b for b in REDIRECT_BITS if self.control.get(b)]


@dataclasses.dataclass(frozen=True)
class AcsReport:
    """What ``lspci -vvv`` showed: the ports with an ACS capability, and how many devices hid theirs."""

    ports: tuple[AcsPort, ...]
    devices: int
    denied: int

    @property
    def redirecting(self) -> list[AcsPort]:
        return [p for p in self.ports if p.redirects]


def parse_lspci_acs(text: str) -> AcsReport:
    """Parse ``lspci -vvv`` into the ACS control bits of every function that has them.

    Raises:
        ParseError: an ``ACSCtl:`` line before any device line, or one without ``Name+``/``Name-`` flags.
    """
    ports: list[AcsPort] = []
    devices = denied = 0
    current: tuple[str, str] | None = None
    for line in text.splitlines():
        m = _DEVICE.match(line)
        if m:
            current = (m.group(1), m.group(2).strip())
            devices += 1
            continue
        stripped = line.strip()
        if stripped.startswith("Capabilities: <access denied>"):
            denied += 1
        if not stripped.startswith("ACSCtl:"):
            continue
        if current is None:
            raise ParseError(f"lspci: ACSCtl line outside a device block: {line!r}")
        flags = re.findall(r"([A-Za-z]+)([+-])", stripped[len("ACSCtl:"):])
        if not flags:
            raise ParseError(f"lspci: ACSCtl line without flags: {line!r}")
        ports.append(AcsPort(current[0], current[1], {name: sign == "+" for name, sign in flags}))
    return AcsReport(tuple(ports), devices, denied)


IommuState = Literal["off", "passthrough", "translated"]


@dataclasses.dataclass(frozen=True)
class IommuMode:
    """The IOMMU's effect on device DMA: ``off``, ``passthrough`` (identity) or ``translated``; why."""

    mode: IommuState
    evidence: str


def parse_iommu(cmdline: str, iommu_devices: Sequence[str], group_types: Sequence[str] = ()) -> IommuMode:
    """Decide the IOMMU mode from ``/proc/cmdline``, the entries of ``/sys/class/iommu`` and the
    ``/sys/kernel/iommu_groups/*/type`` values (empty when the kernel does not publish them).

    Group types win when present (the kernel's own answer); else an IOMMU with ``iommu=pt``,
    ``iommu.passthrough=1`` or ``amd_iommu=pt`` is passthrough and any other active IOMMU is
    translated (the kernel default, unless it was built with CONFIG_IOMMU_DEFAULT_PASSTHROUGH).
    """
    args = cmdline.split()
    params = {a.split("=", 1)[0]: a.split("=", 1)[1] if "=" in a else "" for a in args}
    iommu_args = " ".join(a for a in args if a.split("=", 1)[0] in
                          ("iommu", "intel_iommu", "amd_iommu", "iommu.passthrough", "iommu.strict")) or "no iommu parameter"
    devices = sorted(iommu_devices)
    if not devices:
        return IommuMode("off", f"no IOMMU registered ({IOMMU_CLASS} empty; kernel command line: {iommu_args})")
    listed = f"{IOMMU_CLASS}: {', '.join(devices[:4])}{' ...' if len(devices) > 4 else ''}"
    types = sorted(set(group_types))
    if types:
        translated = [t for t in types if t != "identity"]
        mode: IommuState = "translated" if translated else "passthrough"
        return IommuMode(mode, f"{listed}; iommu group types: {', '.join(types)}; kernel command line: {iommu_args}")
    passthrough = params.get("iommu") == "pt" or params.get("iommu.passthrough") in ("1", "y", "on") \
        or params.get("amd_iommu") == "pt"
    return IommuMode("passthrough" if passthrough else "translated", f"{listed}; kernel command line: {iommu_args}")


def parse_module_bool(text: str) -> bool:
    """A bool module parameter as sysfs shows it (``Y``/``N``, ``1``/``0``).

    Raises:
        ParseError: anything else.
    """
    value = text.strip()
    if value in ("Y", "y", "1"):
        return True
    if value in ("N", "n", "0"):
        return False
    raise ParseError(f"module parameter is not a bool: {value!r}")


@dataclasses.dataclass(frozen=True)
class P2pMatrix:
    """``nvidia-smi topo -p2p`` status per ordered GPU pair (``(0, 1) -> "OK"``)."""

    gpus: tuple[int, ...]
    status: dict[tuple[int, int], str]

    def failing(self, group: Sequence[int]) -> list[tuple[int, int, str]]:
        """Pairs within ``group`` (a < b) whose status is not ``OK`` in either direction."""
        out = []
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                bad = next((s for s in (self.status.get((a, b), "U"), self.status.get((b, a), "U")) if s != "OK"),
                           None)
                if bad is not None:
                    out.append((a, b, bad))
        return out


def parse_p2p(text: str) -> P2pMatrix:
    """Parse ``nvidia-smi topo -p2p r|w`` output.

    Raises:
        ParseError: no ``GPU0`` header, a row whose cell count differs from the header, or a cell that is
        not in the legend.
    """
    header: list[int] | None = None
    status: dict[tuple[int, int], str] = {}
    for raw in text.splitlines():
        line = _ANSI.sub("", raw)
        cells = line.split()
        if not cells or cells[0] == "Legend:":
            if header is not None and cells:
                break
            continue
        if header is None:
            if all(re.fullmatch(r"GPU\d+", c) for c in cells):
                header = [int(c[3:]) for c in cells]
            continue
        m = re.fullmatch(r"GPU(\d+)", cells[0])
        if not m:
            continue
        row = cells[1:]
        if len(row) != len(header):
            raise ParseError(f"nvidia-smi topo -p2p row has {len(row)} cells, header has {len(header)}: {raw!r}")
        for col, cell in zip(header, row):
            if cell not in P2P_LEGEND:
                raise ParseError(f"nvidia-smi topo -p2p cell {cell!r} is not in the legend: {raw!r}")
            status[(int(m.group(1)), col)] = cell
    if header is None:
        raise ParseError("nvidia-smi topo -p2p output has no GPU0 header")
    return P2pMatrix(tuple(header), status)
