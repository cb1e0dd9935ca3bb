"""``[startup]``: how a start is made fast, and what it may cost (issue #42).

Part of :mod:`kimi_deploy.profile` (its ``__init__`` exports the public names). The table is optional: without
it every key has its default (the weights prefetch on) and the profile's digest is what it was before the table
existed (:data:`kimi_deploy.profile.model.DIGEST_OMITS_UNSET`).

The prefetch (``kimi-deploy prefetch``, :mod:`kimi_deploy.host.prefetch`) is the server unit's
``ExecStartPre=-`` step that reads the model's and the draft model's shards into the page cache before SGLang
starts, so SGLang's own reads come from memory (a 551 GB checkpoint: a start from 25-30 min to 2 min 36 s,
tokenspeed issue 833).
"""

from __future__ import annotations

import math

from pydantic import Field, field_validator

from kimi_deploy.profile.base import MAX_SPAN_SEC, Section

#: The phases of a start as :mod:`kimi_deploy.host.phases` reads them from SGLang's log (its ``PHASES``; a test keeps
#: the two equal), and ``total`` (first log line to ready): the keys ``budget_sec`` takes.
BUDGET_PHASES = ("weights", "kv_cache", "draft", "cuda_graphs", "ready", "total")

#: The most reader threads ``prefetch_threads`` accepts: past the NVMe queue depth a 16-core host can feed,
#: more threads only add seeks (benchmarks/prefetch_throughput.py measures 1..16).
MAX_PREFETCH_THREADS = 64


class Startup(Section):
    """``[startup]``: the weights prefetch before SGLang starts (:mod:`kimi_deploy.host.prefetch`)."""

    prefetch: bool = Field(True, description="ExecStartPre=- kimi-deploy prefetch: read the shards into the page "
                           "cache before SGLang starts")
    prefetch_threads: int = Field(8, ge=1, le=MAX_PREFETCH_THREADS,
                                  description="shards read at once, each sequentially")
    prefetch_timeout_sec: int = Field(600, ge=1, le=MAX_SPAN_SEC,
                                      description="seconds the prefetch may take (at most half TimeoutStartSec=); "
                                      "then it stops and SGLang starts")
    prefetch_reserve_gib: int = Field(32, ge=0, le=1 << 20,
                                      description="GiB of MemAvailable kept free beyond the shards to read; "
                                      "less free: the prefetch is skipped")
    prefetch_max_mib_s: int = Field(0, ge=0, le=1 << 30,
                                    description="read rate cap, MiB/s (0: none; shared storage)")
    budget_factor: float = Field(1.5, ge=1.0, le=100.0, allow_inf_nan=False,
                                 description="a phase over its median of the recorded starts times this warns "
                                 "(restart --wait, status, the KimiStartSlower alert)")
    budget_sec: dict[str, float] = Field(default_factory=dict, description="fixed budgets in seconds per phase "
                                         "(weights, kv_cache, draft, cuda_graphs, ready, total); instead of the median")

    def prefetch_deadline(self, timeout_start_sec: int) -> int:
        """Seconds the unit's prefetch step may take: ``prefetch_timeout_sec``, at most half of
        ``TimeoutStartSec=`` (which bounds every command before SGLang's exec: systemd.service(5),
        "TimeoutStartSec="; the other half is left for the other ``ExecStartPre=`` commands); at least 1."""
        return max(1, min(self.prefetch_timeout_sec, timeout_start_sec // 2))

    @field_validator("budget_sec")
    @classmethod
    def _budgets(cls, v: dict[str, float]) -> dict[str, float]:
        for key, seconds in v.items():
            if key not in BUDGET_PHASES:
                raise ValueError(f"budget_sec has no phase {key!r}; the phases are {', '.join(BUDGET_PHASES)}")
            if isinstance(seconds, bool) or not math.isfinite(seconds) or not 0 < seconds <= MAX_SPAN_SEC:
                raise ValueError(f"budget_sec.{key} = {seconds!r}: give seconds above 0, at most {MAX_SPAN_SEC}")
        return v
