"""nvidia-smi probes: command builders and pure parsers of their output.

Formats (NVIDIA driver R570/R580 ``nvidia-smi``):

- ``nvidia-smi --query-gpu=index,name,pci.bus_id,compute_cap,memory.total,driver_version --format=csv``:
  a header line ``index, name, pci.bus_id, compute_cap, memory.total [MiB], driver_version``
  then one comma-separated line per GPU (``97887 MiB``). Field names: ``nvidia-smi --help-query-gpu``.
- ``nvidia-smi topo -m``: a tab-separated matrix, header ``GPU0 GPU1 ... NIC0 ... CPU Affinity
  NUMA Affinity GPU NUMA ID``, one row per GPU/NIC, cells ``X`` (self), ``NV#``, ``PIX``, ``PXB``,
  ``PHB``, ``NODE``, ``SYS``; then a legend. Header cells may carry ANSI underline codes.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

#: Fields asked of ``--query-gpu``, in order.
QUERY_FIELDS = ("index", "name", "pci.bus_id", "compute_cap", "memory.total", "driver_version")

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def query_gpu_command() -> list[str]:
    """argv of the GPU inventory query (CSV with header and units)."""
    return ["nvidia-smi", f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv"]


def topology_command() -> list[str]:
    """argv of the GPU interconnect matrix."""
    return ["nvidia-smi", "topo", "-m"]


@dataclasses.dataclass(frozen=True)
class Gpu:
    """One GPU as nvidia-smi reports it. ``memory_mib``: total memory, MiB; ``compute_cap``: ``"12.0"``."""

    index: int
    name: str
    pci_bus_id: str
    compute_cap: str
    memory_mib: int
    driver_version: str

    @property
    def sm(self) -> str:
        """``sm_120`` for compute capability 12.0 (torch's arch-list spelling)."""
        major, _, minor = self.compute_cap.partition(".")
        return f"sm_{major}{minor or '0'}"


class ParseError(ValueError):
    """Output that does not have the documented shape; the message quotes the offending line."""


def parse_query_gpu(text: str) -> list[Gpu]:
    """Parse ``--query-gpu=... --format=csv`` output (header required) into GPUs, index order.

    Raises:
        ParseError: no header, a missing field, or a value that is not a number where one is due.
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = [re.sub(r"\s*\[.*\]$", "", h.strip()) for h in lines[0].split(",")]
    missing = [f for f in QUERY_FIELDS if f not in header]
    if missing:
        raise ParseError(f"nvidia-smi header lacks {', '.join(missing)}: {lines[0]!r}")
    pos = {name: header.index(name) for name in QUERY_FIELDS}
    gpus = []
    for line in lines[1:]:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(header):
            raise ParseError(f"nvidia-smi line has {len(cells)} fields, header has {len(header)}: {line!r}")
        try:
            memory = int(cells[pos["memory.total"]].split()[0])
            index = int(cells[pos["index"]])
        except (ValueError, IndexError):
            raise ParseError(f"nvidia-smi line has a non-numeric index or memory: {line!r}") from None
        gpus.append(Gpu(index=index, name=cells[pos["name"]], pci_bus_id=cells[pos["pci.bus_id"]],
                        compute_cap=cells[pos["compute_cap"]], memory_mib=memory,
                        driver_version=cells[pos["driver_version"]]))
    return sorted(gpus, key=lambda g: g.index)


#: nvidia-smi link types from closest to farthest, and the NCCL_P2P_LEVEL each needs
#: (NCCL docs, "NCCL_P2P_LEVEL": LOC, NVL, PIX, PXB, PHB, SYS). nvidia-smi's NODE (host
#: bridges within one NUMA node) is NCCL's PHB: the traffic crosses the CPU of one socket.
LINK_ORDER = ("NV", "PIX", "PXB", "PHB", "NODE", "SYS")
P2P_LEVEL_FOR_LINK = {"NV": "NVL", "PIX": "PIX", "PXB": "PXB", "PHB": "PHB", "NODE": "PHB", "SYS": "SYS"}
#: NCCL_P2P_LEVEL values from most to least restrictive.
P2P_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")


@dataclasses.dataclass(frozen=True)
class Topology:
    """GPU-to-GPU links from ``topo -m``: ``links[(i, j)]`` is the cell (``PIX``, ``SYS``, ``NV12``, ...)."""

    gpus: tuple[int, ...]
    links: dict[tuple[int, int], str]
    numa: dict[int, str]

    def worst_link(self, gpus: Sequence[int]) -> tuple[str, tuple[int, int]] | None:
        """The farthest link kind (``NV``, ``PIX``, ... ``SYS``) among ``gpus`` and one pair that has it."""
        worst: tuple[int, tuple[int, int]] | None = None
        for i in gpus:
            for j in gpus:
                if i >= j or (i, j) not in self.links:
                    continue
                kind = link_kind(self.links[(i, j)])
                rank = LINK_ORDER.index(kind)
                if worst is None or rank > worst[0]:
                    worst = (rank, (i, j))
        if worst is None:
            return None
        return LINK_ORDER[worst[0]], worst[1]


def link_kind(cell: str) -> str:
    """``NV`` for ``NV1``..``NV18``, else the cell itself (``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS``).

    Raises:
        ParseError: a cell nvidia-smi does not document.
    """
    cell = cell.strip()
    if re.fullmatch(r"NV\d+", cell):
        return "NV"
    if cell in LINK_ORDER:
        return cell
    raise ParseError(f"unknown link type {cell!r} in nvidia-smi topo -m")


def parse_topology(text: str) -> Topology:
    """Parse ``nvidia-smi topo -m`` into GPU-to-GPU links (NIC rows/columns and the legend ignored).

    Raises:
        ParseError: no ``GPU0`` header, or a row with an undocumented cell.
    """
    lines = [_ANSI.sub("", line).rstrip() for line in text.splitlines()]
    header_i = next((i for i, line in enumerate(lines) if re.match(r"^\s*GPU0(\s|$)", line)), None)
    if header_i is None:
        raise ParseError("no GPU0 column header in nvidia-smi topo -m output")
    header = [h.strip() for h in lines[header_i].strip("\t ").split("\t")]
    if len(header) == 1:
        header = lines[header_i].split()
    columns = [int(h[3:]) if re.fullmatch(r"GPU\d+", h) else None for h in header]
    links: dict[tuple[int, int], str] = {}
    numa: dict[int, str] = {}
    gpus: list[int] = []
    for line in lines[header_i + 1:]:
        m = re.match(r"^GPU(\d+)\s", line)
        if not m:
            if line.strip().startswith("Legend"):
                break
            continue
        row = int(m.group(1))
        gpus.append(row)
        cells = [c.strip() for c in line.split("\t")[1:]]
        for col, cell in zip(columns, cells):
            if col is None or col == row or cell == "X":
                continue
            link_kind(cell)
            links[(row, col)] = cell
        if "NUMA Affinity" in header and len(cells) > header.index("NUMA Affinity"):
            numa[row] = cells[header.index("NUMA Affinity")]
    for (i, j), cell in list(links.items()):
        links.setdefault((j, i), cell)
    return Topology(gpus=tuple(gpus), links=links, numa=numa)
