"""Checks of the numbers a benchmark is configured with: one validator per kind of value.

Every number that reaches a request, a percentile or the result JSON goes through one of these,
from the command line (the click types of ``kimi_deploy.cli.bench`` call them) and from
:class:`kimi_deploy.bench.loadgen.BenchConfig`: finite (``nan``/``inf`` would make every request
meet an SLO, or be written as invalid JSON), within its range, lists without empty items or
repeats (two identical points measure the same thing twice and read as two).

Each raises :class:`kimi_deploy.errors.UsageError` (exit 2) naming the option, the bad value
and an example of a good one.
"""

from __future__ import annotations

import math
from typing import Any

from kimi_deploy.errors import UsageError

#: SLO keys of ``--slo`` (milliseconds each), as in :data:`kimi_deploy.bench.metrics.SLO_KEYS`.
SLO_KEYS = ("ttft", "tpot", "e2e")
SLO_EXAMPLE = "--slo ttft=2000,tpot=50,e2e=30000"

#: The most requests one closed-loop point keeps in flight (``--concurrency``, open loop's cap). Each holds a
#: connection of its own, and Linux's default ephemeral port range (``net.ipv4.ip_local_port_range`` 32768-60999)
#: gives one client 28232 connections to one server; the default ``--num-prompts`` is 4 x this.
MAX_CONCURRENCY = 16384
#: The most requests one run or warm-up sends (``--num-prompts``, ``--warmup``): every request body is serialized
#: before the run starts. ``--concurrency 100000000`` (a typo) once meant 4e8 bodies: 22 GB before the first
#: request, killed by the OOM killer.
MAX_REQUESTS = 100_000
#: The most measured runs per point (``--runs``).
MAX_RUNS = 100


def _range_text(minimum: float | None, open_min: bool, maximum: float | None) -> str:
    parts = []
    if minimum is not None:
        parts.append(f"{'>' if open_min else '>='} {minimum:g}")
    if maximum is not None:
        parts.append(f"<= {maximum:g}")
    return " and ".join(parts) or "finite"


def number(value: Any, *, option: str, kind: type = float, minimum: float | None = None,
           open_min: bool = False, maximum: float | None = None, example: str = "", hint: str | None = None) -> Any:
    """One finite number of ``kind`` (``int`` or ``float``) within ``[minimum, maximum]`` (``(minimum`` if ``open_min``).

    ``value`` is text (from the command line) or a number (from a config object); ``nan``,
    ``inf`` and ``1e999`` are refused. ``hint`` replaces the fix built from ``example``.

    Raises:
        UsageError: not a number of that kind, not finite, or out of range.
    """
    fix = hint or (f"e.g. {option} {example}" if example
                   else f"give a number {_range_text(minimum, open_min, maximum)}")
    try:
        if isinstance(value, bool):
            raise ValueError
        if kind is int:
            if isinstance(value, float):
                raise ValueError
            out: Any = int(str(value).strip())
        else:
            out = float(str(value).strip().removesuffix("ms")) if isinstance(value, str) else float(value)
    except (TypeError, ValueError):
        what = "an integer" if kind is int else "a number"
        raise UsageError(f"{option} takes {what}", value=value, hint=fix) from None
    if not math.isfinite(out):
        raise UsageError(f"{option} must be a finite number", value=value, hint=fix)
    if minimum is not None and (out <= minimum if open_min else out < minimum) or (
            maximum is not None and out > maximum):
        raise UsageError(f"{option} must be {_range_text(minimum, open_min, maximum)}", value=value, hint=fix)
    return out


def number_list(value: Any, *, option: str, kind: type = float, minimum: float | None = None,
                open_min: bool = False, maximum: float | None = None, example: str = "") -> tuple:
    """Comma-separated numbers (text) or a sequence, each checked by :func:`number`; no empty item, no repeat.

    Raises:
        UsageError: empty, an empty item (``1,,2``), a bad item, or a value given twice.
    """
    fix = f"e.g. {option} {example}" if example else "comma-separated numbers, each once"
    items = value.split(",") if isinstance(value, str) else list(value)
    if not items or (isinstance(value, str) and not value.strip()):
        raise UsageError(f"{option} is empty", value=value, hint=fix)
    if isinstance(value, str) and any(not item.strip() for item in items):
        raise UsageError(f"{option} has an empty item", value=value, hint=f"{fix} (no empty items, no trailing comma)")
    out = tuple(number(item, option=option, kind=kind, minimum=minimum, open_min=open_min, maximum=maximum,
                       example=example) for item in items)
    repeated = sorted({v for v in out if out.count(v) > 1})
    if repeated:
        raise UsageError(f"{option} names a point more than once ({', '.join(f'{v:g}' for v in repeated)})",
                         value=value, hint=f"{fix}; use --runs K to measure a point K times")
    return out


def slo(value: Any) -> dict[str, float]:
    """``ttft=2000,tpot=50,e2e=30000`` (milliseconds, ``ms`` suffix allowed) or a dict → ``{key: ms}``.

    Each limit is a finite number > 0 (a limit of 0 or below no request can meet; ``nan`` every
    request would meet); each key once.

    Raises:
        UsageError: an item is not ``key=number``, an unknown key, a key given twice, a bad limit.
    """
    out: dict[str, float] = {}
    if isinstance(value, dict):
        items = [(str(k), v, f"{k}={v}") for k, v in value.items()]
    else:
        items = []
        for part in (value or "").split(","):
            if not part.strip():
                continue
            key, sep, num = part.partition("=")
            if not sep:
                raise UsageError("bad --slo item", value=part, hint=f"use KEY=MS with KEY ttft, tpot or e2e, "
                                                                    f"e.g. {SLO_EXAMPLE}")
            items.append((key, num, part))
    for key, num, part in items:
        key = key.strip().lower()
        if key not in SLO_KEYS:
            raise UsageError("bad --slo item: unknown key", value=part,
                             hint=f"the keys are {', '.join(SLO_KEYS)} (milliseconds), e.g. {SLO_EXAMPLE}")
        if key in out:
            raise UsageError(f"--slo gives {key} twice", value=value, hint=f"give each key once, e.g. {SLO_EXAMPLE}")
        out[key] = number(num, option=f"--slo {key}", minimum=0, open_min=True,
                          hint=f"a limit in milliseconds > 0, e.g. {SLO_EXAMPLE}")
    return out


__all__ = ["number", "number_list", "slo", "SLO_KEYS", "MAX_CONCURRENCY", "MAX_REQUESTS", "MAX_RUNS"]
