"""A serving-speed model over the launch flags ``tune`` varies: the replay server's timing, and the benchmark's truth.

Standard library only: the replay server (SGLang's interpreter) and benchmarks/tune_search.py (the kit's) both
import it. The numbers are made up, in the proportions the field reports for 8 x SM120 over PCIe (the all-reduce
path and the decode batch matter most; docs/design.md#tune); what matters to the tests is that the model has an
interior optimum with interactions, noise, a configuration that does not fit, and a planted fast configuration
that breaks tool calls.

- ``--max-running-requests M``: requests decoding at once (the rest queue: their wait is TTFT); each decode step
  slows with the batch (``STEP_MS`` x (1 + running / ``BATCH_KNEE``));
- ``--chunked-prefill-size C``: TTFT = ``PREFILL_MS`` x prefill factor; big chunks stall decodes (step factor);
- ``SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1``: the decode step x 0.7 (the all-reduce path);
- ``--mem-fraction-static F``: a little more KV cache, a little faster (the memory plan prunes what cannot fit);
- :data:`PLANTED`: the fastest step of all, and tool-call ids come back sanitised (``functions_NAME_N``): the
  contract gate must reject it.

:func:`expected_goodput` is the closed-form goodput of a closed loop at concurrency ``c`` (the benchmark's truth).
"""

from __future__ import annotations

import random
import shlex

PREFILL_MS = 30.0
STEP_MS = 6.0
BATCH_KNEE = 6.0
PREFILL_FACTOR = {4096: 1.3, 8192: 1.0, 16384: 0.8}
STEP_FACTOR_CHUNK = {4096: 0.8, 8192: 1.0, 16384: 1.15}
MEM_FACTOR = {0.8: 1.04, 0.85: 1.0, 0.88: 0.98, 0.9: 0.97}
#: The setting that is fastest and breaks tool calls: (flag, value).
PLANTED = ("--chunked-prefill-size", "2048")
PLANTED_STEP = 0.5
#: Relative noise on each request's timing (uniform +-).
JITTER = 0.08


def flags_of(unit_text: str, env_text: str = "") -> dict[str, str]:
    """``--flag value`` pairs of a unit's ``ExecStart=`` (continuation lines joined) and ``KEY=VALUE`` lines of its
    environment file, as one dict (switches map to ``""``)."""
    joined = unit_text.replace("\\\n", " ")
    line = next((ln for ln in joined.splitlines() if ln.startswith("ExecStart=")), "")
    words = shlex.split(line.partition("=")[2]) if line else []
    out: dict[str, str] = {}
    for i, word in enumerate(words):
        if word.startswith("--"):
            nxt = words[i + 1] if i + 1 < len(words) else ""
            out[word] = "" if nxt.startswith("--") else nxt
    for ln in env_text.splitlines():
        key, sep, value = ln.partition("=")
        if sep and not ln.lstrip().startswith("#"):
            out[key.strip()] = value.strip().strip('"')
    return out


class Speed:
    """The timing of one configuration (milliseconds)."""

    def __init__(self, flags: dict[str, str]) -> None:
        self.planted = flags.get(PLANTED[0]) == PLANTED[1]
        self.max_running = int(flags.get("--max-running-requests") or 48)
        chunk = int(flags.get("--chunked-prefill-size") or 8192)
        mem = float(flags.get("--mem-fraction-static") or 0.85)
        self.ttft_ms = PREFILL_MS * PREFILL_FACTOR.get(chunk, 0.6 if self.planted else 1.0)
        step = STEP_MS * STEP_FACTOR_CHUNK.get(chunk, 1.0) * MEM_FACTOR.get(mem, 1.0)
        if flags.get("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE") == "1":
            step *= 0.7
        if self.planted:
            step *= PLANTED_STEP
        self.step_ms = step

    def step(self, running: int) -> float:
        """Milliseconds of one decode step with ``running`` requests in the batch."""
        return self.step_ms * (1 + running / BATCH_KNEE)

    def jitter(self, rng: random.Random) -> float:
        return 1 + rng.uniform(-JITTER, JITTER)


def expected_goodput(flags: dict[str, str], concurrency: int, chunks: int, slo_ttft_ms: float,
                     slo_step_ms: float) -> float:
    """Requests/s meeting the SLO in a closed loop of ``concurrency`` clients, ``chunks`` decode steps a request:
    ``running`` = min(concurrency, M) decode together; each request takes ``ttft + chunks x step``; a request that
    queued waited for one batch to finish (TTFT grows by that). A request meets the SLO when its TTFT and its
    per-step time are within ``slo_ttft_ms``/``slo_step_ms``."""
    s = Speed(flags)
    running = min(concurrency, s.max_running)
    step = s.step(running)
    service = s.ttft_ms + chunks * step
    rate = running / service * 1000.0
    queued = concurrency > running
    ttft = s.ttft_ms + (service if queued else 0.0)
    ok_step = step <= slo_step_ms
    ok_ttft_first = s.ttft_ms <= slo_ttft_ms
    if not ok_step or not ok_ttft_first:
        return 0.0
    if queued and ttft > slo_ttft_ms:
        return rate * (running / concurrency) if concurrency else 0.0
    return rate


def flags_for(values: dict[str, object]) -> dict[str, str]:
    """The flags a profile's tuned ``[sglang]`` values become (the benchmark's stand-in for the rendered unit)."""
    out: dict[str, str] = {}
    for key, value in values.items():
        if value is None or value is False:
            continue
        if key == "enable_pcie_ipc_allreduce":
            out["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] = "1"
            continue
        out["--" + key.replace("_", "-")] = "" if value is True else str(value)
    return out


def sample_goodput(flags: dict[str, str], rng: random.Random, noise: float = 0.04, **kw: float) -> float:
    """:func:`expected_goodput` with run-to-run noise (relative, Gaussian ``noise``): one bench run's figure."""
    truth = expected_goodput(flags, **kw)
    return max(0.0, truth * (1 + rng.gauss(0, noise)))


__all__ = ["Speed", "flags_of", "expected_goodput", "flags_for", "sample_goodput", "PLANTED"]
