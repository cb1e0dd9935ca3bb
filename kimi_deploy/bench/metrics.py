"""Serving metrics that survive speculative decoding, computed from per-request event timelines.

Definitions (kimi-deploy's, printed in the docs and in every result JSON under ``definitions``;
reconciled from the public definitions of vLLM's ``benchmark_serving.py``, SGLang's ``bench_serving``,
GuideLLM, NVIDIA GenAI-Perf and LLMPerf):

- **TTFT**: request sent → first streamed chunk carrying content or reasoning text
  (``delta.content``, ``delta.reasoning_content`` or ``delta.reasoning``; a role-only or empty chunk
  does not count).
- **TPOT**: per request, ``(E2E - TTFT) / (output_tokens - 1)``, ``output_tokens`` from the server's
  ``usage.completion_tokens`` (reasoning tokens included, as the server counts them). Undefined for
  one output token; unknown (``None``, never guessed) when the stream had no usage block.
- **ITL**: the gaps between consecutive text-carrying chunks, pooled over requests. Under speculative
  decoding one chunk carries several tokens, so ITL is a jitter diagnostic, never a speed figure;
  **tokens per chunk** (``output_tokens / text chunks``) is reported beside it.
- **E2E**: request sent → end of the stream (``data: [DONE]``; a stream that ends without it is an
  error, ``no [DONE]``, never a success).
- **output tokens/s**: sum of ``completion_tokens`` of successful requests / wall time of the measured
  window (first request sent → last request finished, warmup excluded).
- **requests/s**: successful requests / window. **goodput**: successful requests meeting every SLO
  given (TTFT, TPOT, E2E) / window; a request whose TPOT is unknown (no usage) does not meet a TPOT SLO.
- Percentiles p50/p90/p99 by linear interpolation between closest ranks (numpy's default), and mean.

Times are ``time.perf_counter()`` seconds in records; summaries report milliseconds (``*_ms``)
and per-second rates.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

#: The definitions above, one line each, copied into every result JSON.
DEFINITIONS: dict[str, str] = {
    "ttft": "request sent -> first streamed chunk carrying content or reasoning text (ms)",
    "tpot": "per request (E2E - TTFT) / (output_tokens - 1), output_tokens = usage.completion_tokens "
            "(reasoning included); null when the stream had no usage block (ms)",
    "itl": "gaps between consecutive text-carrying chunks, pooled; a jitter diagnostic under "
           "speculative decoding, read with tokens_per_chunk (ms)",
    "tokens_per_chunk": "usage.completion_tokens / text-carrying chunks, per request",
    "e2e": "request sent -> end of stream (data: [DONE]) (ms)",
    "output_tokens_per_s": "sum of usage.completion_tokens of successful requests / measured window",
    "requests_per_s": "successful requests / measured window",
    "goodput_requests_per_s": "successful requests meeting every SLO given (ttft, tpot, e2e) / measured window; "
                              "unknown TPOT fails a TPOT SLO",
    "window": "first measured request sent -> last measured request finished (warmup excluded)",
    "percentiles": "p50/p90/p99 by linear interpolation between closest ranks (numpy default), plus mean",
}

SLO_KEYS = ("ttft", "tpot", "e2e")

#: Chunk arrival times kept per request: 65,536 (512 KiB of pointers; a 64k-token answer at one
#: token per chunk fits whole). An endless stream costs no more; see :class:`RequestRecord`.
MAX_CHUNK_TIMES = 1 << 16


@dataclasses.dataclass
class RequestRecord:
    """The event timeline of one streamed request, as the client saw it.

    Times are ``time.perf_counter()`` seconds. ``chunk_times`` holds the arrival time of
    every text-carrying chunk (several chunks read in one ``recv`` share a time), at most
    :data:`MAX_CHUNK_TIMES` of them (:meth:`add_chunks`): past that the first
    ``MAX_CHUNK_TIMES - 1`` stay, the last slot always holds the latest chunk's time, and
    ``chunks_dropped`` counts the times not kept, so TTFT, E2E, the chunk count and the window stay
    exact and ITL is read from the first ``MAX_CHUNK_TIMES - 1`` chunks of such a request.
    ``output_tokens``/``prompt_tokens`` come from the stream's ``usage`` block
    (``None``: no usage block). ``error``: ``None`` for success, else a short reason
    (``"http 500: ..."``, ``"error frame: ..."``, ``"timeout"``, ``"disconnected"``...).
    ``text_chars`` is the client-side cross-check (characters of text received).
    """

    t_sent: float
    t_end: float | None = None
    chunk_times: list[float] = dataclasses.field(default_factory=list, repr=False)
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    text_chars: int = 0
    error: str | None = None
    status: int | None = None
    chunks_dropped: int = 0

    def add_chunks(self, now: float, n: int = 1) -> None:
        """Record ``n`` text-carrying chunks that arrived at ``now`` (bounded: see the class docstring)."""
        times = self.chunk_times
        room = MAX_CHUNK_TIMES - len(times)
        if n <= room:
            if n == 1:
                times.append(now)
            else:
                times.extend([now] * n)
            return
        if room > 0:
            times.extend([now] * room)
            n -= room
        times[-1] = now
        self.chunks_dropped += n

    @property
    def chunks(self) -> int:
        """Text-carrying chunks received (kept times plus dropped ones)."""
        return len(self.chunk_times) + self.chunks_dropped

    @property
    def ok(self) -> bool:
        """Finished without error and received at least one text chunk."""
        return self.error is None and self.t_end is not None and bool(self.chunk_times)

    @property
    def usage_missing(self) -> bool:
        """True when the stream carried no ``usage`` block (tokens not known, not guessed)."""
        return self.output_tokens is None

    @property
    def ttft(self) -> float | None:
        """Seconds; ``None`` without a text chunk."""
        return self.chunk_times[0] - self.t_sent if self.chunk_times else None

    @property
    def e2e(self) -> float | None:
        """Seconds; ``None`` if the stream did not end."""
        return None if self.t_end is None else self.t_end - self.t_sent

    @property
    def tpot(self) -> float | None:
        """Seconds per output token after the first; ``None`` if unknown (no usage) or undefined (< 2 tokens)."""
        if not self.ok or self.output_tokens is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)  # type: ignore[operator]

    @property
    def itls(self) -> list[float]:
        """Seconds between consecutive text chunks (``len(chunk_times) - 1`` values; with chunks
        dropped, the gaps between the first ``MAX_CHUNK_TIMES - 1`` only)."""
        t = self.chunk_times if not self.chunks_dropped else self.chunk_times[:-1]
        return [t[i] - t[i - 1] for i in range(1, len(t))]

    @property
    def tokens_per_chunk(self) -> float | None:
        """``output_tokens / text chunks``; ``None`` without usage or chunks."""
        if self.output_tokens is None or not self.chunk_times:
            return None
        return self.output_tokens / self.chunks

    def meets(self, slo: dict[str, float]) -> bool:
        """True when successful and within every SLO in ``slo`` (keys ttft/tpot/e2e, milliseconds)."""
        if not self.ok:
            return False
        for key, limit_ms in slo.items():
            if key == "tpot":
                if self.output_tokens is None:
                    return False
                if self.output_tokens < 2:
                    continue
            value = getattr(self, key)
            if value is None or value * 1000.0 > limit_ms:
                return False
        return True

    def row(self) -> dict[str, Any]:
        """The per-request line of the result JSON (milliseconds, rounded to the microsecond)."""
        return {
            "ok": self.ok,
            "error": self.error,
            "ttft_ms": _ms(self.ttft),
            "tpot_ms": _ms(self.tpot),
            "e2e_ms": _ms(self.e2e),
            "output_tokens": self.output_tokens,
            "prompt_tokens": self.prompt_tokens,
            "usage_missing": self.usage_missing,
            "chunks": self.chunks,
            "chunk_times_dropped": self.chunks_dropped,
            "text_chars": self.text_chars,
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ascending ``sorted_values`` by linear interpolation.

    Same as ``numpy.percentile(values, q)`` (method ``linear``). Raises ValueError when empty.
    """
    if not sorted_values:
        raise ValueError("percentile of no values")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def distribution(values: Iterable[float | None], scale: float = 1.0) -> dict[str, float | None] | None:
    """``{"p50", "p90", "p99", "mean", "n"}`` of the non-``None`` values times ``scale``; ``None`` if none."""
    vals = sorted(v * scale for v in values if v is not None)
    if not vals:
        return None
    return {
        "p50": percentile(vals, 50),
        "p90": percentile(vals, 90),
        "p99": percentile(vals, 99),
        "mean": sum(vals) / len(vals),
        "n": len(vals),
    }


@dataclasses.dataclass
class WindowSummary:
    """Metrics of one or more measured windows (a point: all runs at one concurrency or rate).

    Latencies in milliseconds as :func:`distribution` dicts (``None`` when no request had
    the value); rates per second over ``window_s`` (the sum of the runs' windows).
    """

    requests: int
    completed: int
    errors: int
    error_kinds: dict[str, int]
    requests_without_usage: int
    window_s: float
    output_tokens: int
    chunks: int
    ttft_ms: dict | None
    tpot_ms: dict | None
    itl_ms: dict | None
    e2e_ms: dict | None
    tokens_per_chunk: dict | None
    output_tokens_per_s: float | None
    requests_per_s: float
    goodput_requests_per_s: float | None
    chunks_per_s: float
    slo: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def window_of(records: Sequence[RequestRecord]) -> float:
    """Seconds from the first request sent to the last request finished (ended or failed).

    A failed request without an end time counts up to its last chunk (or its send time).
    """
    if not records:
        return 0.0
    start = min(r.t_sent for r in records)
    end = max(r.t_end if r.t_end is not None else (r.chunk_times[-1] if r.chunk_times else r.t_sent)
              for r in records)
    return end - start


def summarize(windows: Sequence[Sequence[RequestRecord]], slo: dict[str, float] | None = None) -> WindowSummary:
    """Pool the requests of one or more measured windows into one :class:`WindowSummary`.

    Latency distributions pool every successful request; rates divide the totals by the
    summed window lengths (equal to the mean of per-run rates weighted by window length).
    ``output_tokens_per_s`` is ``None`` when no successful request carried usage; requests
    without usage add nothing to it and are counted in ``requests_without_usage``.
    """
    slo = dict(slo or {})
    records = [r for w in windows for r in w]
    window = sum(window_of(w) for w in windows)
    good = [r for r in records if r.ok]
    kinds = Counter(_kind(r) for r in records if not r.ok)
    with_usage = [r for r in good if r.output_tokens is not None]
    tokens = sum(r.output_tokens for r in with_usage)  # type: ignore[misc]
    chunks = sum(r.chunks for r in good)
    rate = (lambda n: n / window) if window > 0 else (lambda n: 0.0)
    return WindowSummary(
        requests=len(records),
        completed=len(good),
        errors=len(records) - len(good),
        error_kinds=dict(sorted(kinds.items())),
        requests_without_usage=sum(1 for r in good if r.output_tokens is None),
        window_s=window,
        output_tokens=tokens,
        chunks=chunks,
        ttft_ms=distribution((r.ttft for r in good), 1000.0),
        tpot_ms=distribution((r.tpot for r in good), 1000.0),
        itl_ms=distribution((x for r in good for x in r.itls), 1000.0),
        e2e_ms=distribution((r.e2e for r in good), 1000.0),
        tokens_per_chunk=distribution(r.tokens_per_chunk for r in good),
        output_tokens_per_s=rate(tokens) if with_usage else None,
        requests_per_s=rate(len(good)),
        goodput_requests_per_s=rate(sum(1 for r in good if r.meets(slo))) if slo else None,
        chunks_per_s=rate(chunks),
        slo=slo,
    )


def _kind(r: RequestRecord) -> str:
    if r.error is None:
        return "no text" if not r.chunk_times else "unfinished"
    return r.error.split(":", 1)[0]
