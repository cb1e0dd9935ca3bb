"""Benchmark prompts: the kit's natural prompts, or any JSONL file of chat messages.

Format (one JSON object per line, lines split on ``\\n`` only, blank lines ignored)::

    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."}]}

``role`` is one of system/user/assistant/developer/tool and ``content`` a string or an
OpenAI content-part list (Chat Completions API). Other keys on a line are kept out of the
request. The kit ships ``kimi_deploy/bench/data/prompts.jsonl`` (written for the kit,
Apache-2.0 like the kit; see ``data/README.md``): natural prompts, because random-token
prompts give unrealistic EAGLE acceptance.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from pathlib import Path
from typing import Any

from kimi_deploy import paths
from kimi_deploy.errors import UsageError
from kimi_deploy.wire import inputs
from kimi_deploy.wire.limits import human, parse_json

ROLES = {"system", "user", "assistant", "developer", "tool"}


@dataclasses.dataclass(frozen=True)
class Dataset:
    """Prompts loaded from a JSONL file.

    ``conversations``: each a list of chat messages (dicts with ``role`` and ``content``).
    ``sha256``: hex digest of the file bytes (recorded in results so runs can be matched).
    """

    name: str
    path: str
    sha256: str
    conversations: tuple[tuple[dict[str, Any], ...], ...]

    def sample(self, n: int, seed: int) -> list[list[dict[str, Any]]]:
        """``n`` conversations in a seeded random order, cycling through the file when ``n`` exceeds it."""
        order = list(range(len(self.conversations)))
        random.Random(seed).shuffle(order)
        return [list(self.conversations[order[i % len(order)]]) for i in range(n)]

    def describe(self) -> dict[str, Any]:
        """``{"name", "path", "sha256", "conversations"}`` for the result JSON."""
        return {"name": self.name, "path": self.path, "sha256": self.sha256,
                "conversations": len(self.conversations)}


def load_dataset(path: Path | None = None, *, max_line_bytes: int = inputs.DATASET_LINE_BYTES,
                 max_file_bytes: int = inputs.BENCH_DATASET_FILE_BYTES) -> Dataset:
    """Load ``path`` (default: the kit's prompts) and check every line: a regular file of at most
    ``max_file_bytes`` (:func:`kimi_deploy.wire.inputs.open_regular`), read a ``\\n``-terminated line at a time,
    each at most ``max_line_bytes`` (``bench`` keeps the prompts it sends, so the file cap bounds its memory).

    Raises:
        UsageError: the file is missing, unreadable, not a regular file (a FIFO, ``/dev/zero``) or over its cap,
            a line is over its cap, not UTF-8, not strict JSON (``NaN``), or has no valid ``messages`` list (the
            message names the line), or the file holds no prompt (exit 2).
    """
    source = Path(path) if path is not None else paths.bench_prompts_file()
    where = str(source)
    hint = "pass --dataset FILE.jsonl (a regular file) with one {\"messages\": [...]} object per line"
    whole = hashlib.sha256()
    conversations = []
    with inputs.open_regular(source, "the dataset", hint, max_bytes=max_file_bytes, reader="bench",
                             cap_flag="--max-dataset-bytes") as fh:
        for line in inputs.iter_lines(fh, max_line_bytes=max_line_bytes, max_file_bytes=max_file_bytes,
                                      what="the dataset", where=where, flag="--max-dataset-bytes", hasher=whole):
            if line.data is None:
                raise UsageError(f"dataset line {line.number} is {human(line.length)}, over the "
                                 f"{human(max_line_bytes)} cap on a line", value=f"{where}:{line.number}",
                                 hint="raise it with --max-dataset-line-bytes N")
            try:  # a leading BOM (an editor's "UTF-8 with BOM") is dropped, as RFC 8259 allows a JSON reader to
                text = line.data.decode("utf-8-sig" if line.offset == 0 else "utf-8")
            except UnicodeDecodeError as exc:  # was decoded with "replace": prompts sent with U+FFFD in them
                raise UsageError(f"the dataset is not UTF-8 text: byte 0x{line.data[exc.start]:02x} on line "
                                 f"{line.number}", value=f"{where}:{line.number}",
                                 hint="save it as UTF-8 (e.g. `iconv -f LATIN1 -t UTF-8 FILE`)") from None
            if text.strip():
                conversations.append(_parse_line(text, line.number, source))
    if not conversations:
        raise UsageError("the dataset holds no prompt", value=str(source),
                         hint="add lines like {\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}")
    name = "kimi-deploy natural prompts" if path is None else source.name
    return Dataset(name=name, path=str(source), sha256=whole.hexdigest(), conversations=tuple(conversations))


def _parse_line(line: str, number: int, source: Path) -> tuple[dict[str, Any], ...]:
    where = f"{source}:{number}"
    fix = 'each line must be {"messages": [{"role": "user", "content": "..."}]}'
    try:
        obj = parse_json(line, parse_constant=inputs.refuse_constant, parse_float=inputs.finite_float)
    except ValueError as exc:
        raise UsageError(f"dataset line {number} is not JSON ({exc})", value=where, hint=fix) from None
    messages = obj.get("messages") if isinstance(obj, dict) else None
    if not isinstance(messages, list) or not messages:
        raise UsageError(f"dataset line {number} has no non-empty \"messages\" list", value=where, hint=fix)
    bad = inputs.lone_surrogate(messages)
    if bad is not None:
        raise UsageError(f"dataset line {number} holds a lone surrogate ({ascii(bad[:40])}): no UTF-8 request can "
                         "carry it", value=where, hint="write the character whole, or drop it")
    out = []
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), (str, list)):
            raise UsageError(f"dataset line {number} has a message without a known role and a content",
                             value=f"{where}: {json.dumps(m)[:120]}",
                             hint=f"{fix}; roles: {', '.join(sorted(ROLES))}")
        out.append({"role": m["role"], "content": m["content"]})
    return tuple(out)
