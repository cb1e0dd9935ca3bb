"""Cold-start phases of an SGLang server, read from its own log lines, and the last measured start per service.

:func:`parse_start` turns the log of one start (``journalctl -u UNIT -o cat``: SGLang's own ``[DATE TIME TPn]``
prefix, tqdm progress lines without it) into :class:`StartPhases`. The lines and where SGLang 0.5.23 writes them
(``sglang/srt/``; ``tests/test_start_phases.py`` checks each fixed fragment against the installed source):

=========================  ======================================================================  ==============
phase                      lines                                                                   source
=========================  ======================================================================  ==============
``weights``                ``Load weight begin. avail mem=X GB`` .. ``Load weight end. elapsed=S s``  ``model_executor/model_runner.py`` ``load_model``
(progress)                 ``Loading safetensors checkpoint shards:  50% Completed | 32/64 [...]``  ``model_loader/weight_utils.py`` (tqdm, ``utils/common.py`` ``BAR_FORMAT``)
``kv_cache``               ``KV Cache is allocated. dtype: D, #tokens: N, KV size: X GB``,          ``mem_cache/memory_pool.py`` ``_finalize_allocation_log``,
                           ``Memory pool end. avail mem=X GB``                                      ``mem_cache/kv_cache_configurator.py``
``draft``                  the second ``Load weight begin``/``end`` pair (the EAGLE draft model)    ``model_executor/model_runner.py``
``cuda_graphs``            ``Capture NAME CUDA graph begin.`` .. the last ``... end. ... elapsed=``  ``model_executor/model_runner_components/cuda_graph_setup.py``
``ready``                  ``The server is fired up and ready to roll!``                           ``entrypoints/http_server.py``
=========================  ======================================================================  ==============

``max_total_num_tokens=N, ...`` (``managers/scheduler.py``) also gives the KV token count. Durations come from
the timestamps (whole seconds); a phase's own ``elapsed=`` (weights, draft) wins where SGLang prints one.
The last complete start of a service is kept in ``/var/lib/<service>/start-phases.json`` (:func:`save_last`,
:func:`load_last`; under ``--root``); ``render`` compares ``TimeoutStartSec=`` with it (:func:`timeout_warning`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kimi_deploy import fsio

#: Phases in the order a start goes through them.
PHASES = ("weights", "kv_cache", "draft", "cuda_graphs", "ready")

_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:[ ,][^\]]*)?\]\s*")
_LOAD_BEGIN = re.compile(r"Load weight begin\. avail mem=([\d.]+) GB")
_LOAD_END = re.compile(r"Load weight end\. elapsed=([\d.]+) s(?:, type=([\w.]+))?.*?mem usage=([\d.]+) GB")
_PROGRESS = re.compile(r"(Loading safetensors checkpoint shards|Multi-thread loading shards):\s+(\d+)% Completed \| "
                       r"(\d+)/(\d+)")
_KV = re.compile(r"KV Cache is allocated\. dtype: ([\w.]+), #tokens: (\d+), KV size: ([\d.]+) GB")
_POOL_END = re.compile(r"Memory pool end\. avail mem=([\d.]+) GB")
_GRAPH = re.compile(r"Capture (.+?) (?:CUDA|CPU|NPU|XPU) graph (begin|end)\.(?:.*?elapsed=([\d.]+) s)?")
_TOTAL_TOKENS = re.compile(r"max_total_num_tokens=(\d+), ")
_READY = "The server is fired up and ready to roll!"

#: Where the fixed fragments above come from (checked against the installed SGLang by the tests).
SOURCES = {
    "Load weight begin. avail mem=": "srt/model_executor/model_runner.py",
    "Load weight end. ": "srt/model_executor/model_runner.py",
    "Loading safetensors checkpoint shards": "srt/model_loader/weight_utils.py",
    "% Completed | ": "srt/utils/common.py",
    "'is allocated'}. dtype: ": "srt/mem_cache/memory_pool.py",
    "#tokens: {num_tokens}, KV size: ": "srt/mem_cache/memory_pool.py",
    "Memory pool end. ": "srt/mem_cache/kv_cache_configurator.py",
    "CUDA graph begin. ": "srt/model_executor/model_runner_components/cuda_graph_setup.py",
    "CUDA graph end. ": "srt/model_executor/model_runner_components/cuda_graph_setup.py",
    '"cuda": "CUDA graph"': "srt/model_executor/model_runner_components/cuda_graph_setup.py",
    "max_total_num_tokens=": "srt/managers/scheduler.py",
    _READY: "srt/entrypoints/http_server.py",
}


@dataclasses.dataclass(frozen=True)
class Phase:
    """One phase of a start: ``start``/``end`` as ``YYYY-MM-DD HH:MM:SS`` (SGLang's log time; ``end`` ``None`` while
    it runs), ``seconds`` (``None`` while it runs), ``detail`` (tokens, shards, graph batch sizes)."""

    name: str
    start: str | None
    end: str | None
    seconds: float | None
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class StartPhases:
    """The phases seen in one start's log, in order; ``ready``: the ready line was seen; ``total_seconds``: first
    timestamped line to the ready line (``None`` before ready); ``kv_tokens``: SGLang's reported KV cache size;
    ``progress``: the last weight-loading progress (``"32/64 shards (50%)"``), ``source``: where the lines came from."""

    phases: tuple[Phase, ...]
    ready: bool
    total_seconds: float | None
    kv_tokens: int | None
    progress: str | None
    source: str = ""
    started: str | None = None

    @property
    def current(self) -> str | None:
        """The phase running now (the last one without an end), or ``None``."""
        running = [p.name for p in self.phases if p.end is None]
        return running[-1] if running else None

    def to_dict(self) -> dict[str, Any]:
        return {"phases": [dataclasses.asdict(p) for p in self.phases], "ready": self.ready,
                "total_seconds": self.total_seconds, "kv_tokens": self.kv_tokens, "progress": self.progress,
                "source": self.source, "started": self.started}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StartPhases:
        return cls(tuple(Phase(**p) for p in data["phases"]), bool(data["ready"]), data.get("total_seconds"),
                   data.get("kv_tokens"), data.get("progress"), str(data.get("source", "")), data.get("started"))

    def lines(self) -> list[str]:
        """One line per phase: ``weights      271.5 s  (64/64 shards ...)``; then the total."""
        out = []
        for p in self.phases:
            took = f"{p.seconds:7.1f} s" if p.seconds is not None else "running"
            out.append(f"  {p.name:<12} {took}" + (f"  ({p.detail})" if p.detail else ""))
        if self.total_seconds is not None:
            out.append(f"  {'total':<12} {self.total_seconds:7.1f} s (first log line to ready)")
        return out


def _time(stamp: str) -> dt.datetime:
    return dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S")


def _between(a: str | None, b: str | None) -> float | None:
    return (_time(b) - _time(a)).total_seconds() if a and b else None


def parse_start(lines: Iterable[str], *, source: str = "") -> StartPhases:
    """The phases of the start whose log is ``lines`` (one start: the journal since the unit's main process
    started). Lines that match nothing are skipped; an unfinished start has its running phase last."""
    loads: list[dict[str, Any]] = []  # {"begin", "end", "elapsed", "type", "usage"}
    graphs: list[tuple[str, str, str, float | None]] = []  # (stamp, name, begin|end, elapsed)
    first = last = kv_stamp = pool_stamp = ready = None
    kv_tokens: int | None = None
    kv_detail = ""
    progress = None
    stamps: list[str] = []  # every timestamp, in order: a phase without its end line ends at the next one
    graph_at = -1
    for raw in lines:
        line = raw.rstrip("\n")
        m = _STAMP.match(line)
        stamp = m.group(1) if m else None
        if stamp:
            first = first or stamp
            last = stamp
            stamps.append(stamp)
        if (hit := _PROGRESS.search(line)) is not None:
            progress = f"{hit.group(3)}/{hit.group(4)} shards ({hit.group(2)}%)"
            if loads:
                loads[-1]["progress"] = progress
        elif (hit := _LOAD_BEGIN.search(line)) is not None:
            loads.append({"begin": stamp or last, "end": None, "elapsed": None, "type": None, "progress": None,
                          "avail": float(hit.group(1))})
        elif (hit := _LOAD_END.search(line)) is not None and loads:
            loads[-1].update(end=stamp or last, elapsed=float(hit.group(1)), type=hit.group(2),
                             usage=float(hit.group(3)))
        elif (hit := _KV.search(line)) is not None:
            if kv_stamp is None:
                kv_stamp = stamp or last
                kv_tokens = int(hit.group(2))
                kv_detail = f"{kv_tokens} tokens, {hit.group(3)} GB, {hit.group(1)}"
        elif (hit := _POOL_END.search(line)) is not None:
            pool_stamp = pool_stamp or stamp or last
        elif (hit := _GRAPH.search(line)) is not None:
            graphs.append((stamp or last, hit.group(1), hit.group(2), float(hit.group(3)) if hit.group(3) else None))
            graph_at = len(stamps)
        elif (hit := _TOTAL_TOKENS.search(line)) is not None:
            kv_tokens = int(hit.group(1))
        elif _READY in line:
            ready = stamp or last
    phases: list[Phase] = []

    def load_phase(name: str, load: dict[str, Any]) -> Phase:
        bits = [b for b in (load.get("progress"), load.get("type"),
                            f"{load['usage']:.2f} GB" if load.get("usage") is not None else None) if b]
        seconds = load["elapsed"] if load["elapsed"] is not None else None
        return Phase(name, load["begin"], load["end"], seconds, ", ".join(bits))

    if loads:
        phases.append(load_phase("weights", loads[0]))
    if kv_stamp or pool_stamp:
        start = loads[0]["end"] if loads else None
        end = pool_stamp or kv_stamp
        phases.append(Phase("kv_cache", start, end, _between(start, end), kv_detail))
    if len(loads) > 1:
        phases.append(load_phase("draft", loads[1]))
    if graphs:
        begin = graphs[0][0]
        ends = [g for g in graphs if g[2] == "end"]
        done = len(ends) == len([g for g in graphs if g[2] == "begin"])
        end = ends[-1][0] if ends and done else None
        if end is None and ready and graph_at < len(stamps):
            end = stamps[graph_at]  # no end line (an older format): the graphs ended by the next logged line
        names = ", ".join(dict.fromkeys(g[1] for g in graphs))
        phases.append(Phase("cuda_graphs", begin, end, _between(begin, end), names))
    if ready:
        start = phases[-1].end if phases and phases[-1].end else first
        phases.append(Phase("ready", start, ready, _between(start, ready), "HTTP server up, warmup done"))
    elif phases and phases[-1].end is not None and first:
        phases.append(Phase("ready", phases[-1].end, None, None, "waiting for the ready line"))
    return StartPhases(tuple(phases), ready is not None, _between(first, ready), kv_tokens, progress, source, first)


def record_path(directory: str | Path) -> Path:
    """``<directory>/start-phases.json``: the last complete start; ``directory`` is the service's state directory
    (:meth:`kimi_deploy.paths.HostLayout.state_dir`, ``/var/lib/<service>``)."""
    return Path(directory) / "start-phases.json"


def save_last(directory: str | Path, start: StartPhases) -> Path | None:
    """Keep ``start`` as the last measured start when it reached ready (an unfinished one measures nothing);
    returns the file written, or ``None``.

    Raises:
        KimiDeployError: the state directory cannot be written (:mod:`kimi_deploy.fsio`).
    """
    if not start.ready:
        return None
    path = record_path(directory)
    fsio.mkdir(path.parent)
    fsio.write_atomic(path, json.dumps(start.to_dict(), indent=1) + "\n")
    return path


def load_last(directory: str | Path) -> StartPhases | None:
    """The last measured start kept in ``directory``, or ``None`` when none was kept (or it is unreadable)."""
    try:
        return StartPhases.from_dict(json.loads(record_path(directory).read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def timeout_warning(service: str, timeout_start_sec: int, directory: str | Path) -> str | None:
    """A warning when ``TimeoutStartSec=`` (``[service] timeout_start_sec``) is shorter than ``service``'s last
    measured start (systemd would kill the next start of the same length), with the value to set: the measured
    total plus half again, rounded up to a minute. ``None`` when it is long enough or nothing was measured."""
    last = load_last(directory)
    if last is None or last.total_seconds is None or timeout_start_sec >= last.total_seconds:
        return None
    suggested = int(math.ceil(last.total_seconds * 1.5 / 60) * 60)
    slowest = max((p for p in last.phases if p.seconds is not None), key=lambda p: p.seconds)
    return (f"[service] timeout_start_sec = {timeout_start_sec} s is shorter than the last measured start of "
            f"{service} ({last.total_seconds:.0f} s on {last.started}, slowest phase {slowest.name} "
            f"{slowest.seconds:.0f} s): systemd would stop the next start of that length; set timeout_start_sec = "
            f"{suggested}")
