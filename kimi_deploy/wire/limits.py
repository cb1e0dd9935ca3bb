"""Byte caps on what ``check`` and ``bench`` read from a server (issue #11): every body, every SSE line.

A hostile or broken server must not cost the kit more memory than these caps (docs/reference/limits.md,
measured in docs/design.md#limits-measurements). Both verbs take ``--max-body-bytes`` and
``--max-line-bytes`` to raise them.

- :data:`DEFAULT_MAX_BODY_BYTES` (16 MiB) bounds one HTTP body that is kept or parsed: every body
  of ``check`` (JSON answers and the check's own short streams, which ask for at most a few
  thousand tokens) and ``bench``'s control-plane bodies (``/server_info``, ``/v1/models``,
  ``/flush_cache``) and error bodies. The largest legitimate ones are SGLang 0.5.23's
  ``/server_info`` (tens of KiB) and a check answer of a few KiB, so 16 MiB leaves over 100x headroom
  while a body at the cap costs tens of MiB of RSS, not GiB. ``bench``'s streamed answers are not
  kept (each event is parsed and dropped), so their memory does not grow with their length and
  only the line cap applies to them; a stream that never ends is bounded by ``--request-timeout``.
- :data:`DEFAULT_MAX_LINE_BYTES` (2 MiB) bounds one SSE line and the data of one event (several
  ``data:`` lines joined). Twice the 1 MiB single chunk the bench client has promised to read since
  it was written (peers' 64-128 KiB line buffers break on long chunks; ``tests/test_bench_client.py``
  reads a 1 MiB line); the largest chunk SGLang sends in practice is a whole tool call's arguments
  in one delta, a few KiB to a few hundred KiB. A stream holds at most one partial line, so ``bench``
  at concurrency C holds at most C x 2 MiB of partial lines.

Sources: WHATWG HTML "Server-sent events" (no line limit of its own); SGLang 0.5.23
``http_server.py`` (one ``data:`` line per streamed chunk).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

#: 16 MiB: the cap on one HTTP body ``check`` or ``bench`` keeps or parses (see the module docstring).
DEFAULT_MAX_BODY_BYTES = 16 << 20

#: 2 MiB: the cap on one SSE line and on one event's data (see the module docstring).
DEFAULT_MAX_LINE_BYTES = 2 << 20

#: The smallest cap a flag accepts: 1 KiB (a smaller one would refuse every real answer).
MIN_CAP_BYTES = 1024


def human(n: int) -> str:
    """``16 MiB``, ``1.5 KiB``, ``900 B``: a byte count for a message."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{value:g} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} B"


class Refused(Exception):
    """The kit stops reading a response it will not accept (too large, or in an encoding not asked for).

    ``str(exc)`` says why, for a report or an error record.
    """


class LimitExceeded(Refused):
    """What the server sent ran past a cap; nothing more of it is read.

    ``what``: the thing capped (``an SSE line``, ``the body``); ``limit``: the cap in bytes;
    ``flag``: the option that raises it (``None`` in verbs that have none: status, restart, the gateway's
    client, whose caps are fixed); ``seen``: bytes read of it when it was refused (at least ``limit + 1``, or a
    declared ``Content-Length``).
    """

    def __init__(self, what: str, limit: int, flag: str | None, seen: int) -> None:
        self.what = what
        self.limit = limit
        self.flag = flag
        self.seen = seen
        if flag is None:  # no flag to name: a verb must not suggest one it does not have
            super().__init__(f"{what} exceeded the {human(limit)} the kit reads of a control-plane answer; refused "
                             f"after {seen} bytes (no SGLang answer is that large: is this SGLang?)")
            return
        super().__init__(f"{what} exceeded {flag} {limit} ({human(limit)}); refused after {seen} bytes "
                         f"(raise it with {flag} N)")


@dataclasses.dataclass(frozen=True)
class Limits:
    """The caps of one run, in bytes (``None``: no cap; only tests and benchmarks pass it)."""

    max_body_bytes: int | None = DEFAULT_MAX_BODY_BYTES
    max_line_bytes: int | None = DEFAULT_MAX_LINE_BYTES


def parse_json(text: str | bytes, **kw: Any) -> Any:
    """``json.loads(text, **kw)`` for text from outside the kit (a server, a shared results file, a model's
    weights, a command-line value): JSON nested past Python's recursion limit (``[`` 100,000 deep) raises
    :class:`ValueError` like any other unparseable text, not :class:`RecursionError`, which no caller
    expects. Raises ValueError (``json.JSONDecodeError`` and ``UnicodeDecodeError`` are ValueErrors).
    """
    try:
        return json.loads(text, **kw)
    except RecursionError:
        raise ValueError("JSON nested too deep to parse") from None
