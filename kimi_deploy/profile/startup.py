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

from pydantic import Field

from kimi_deploy.profile.base import MAX_SPAN_SEC, Section

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
