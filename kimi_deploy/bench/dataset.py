"""Benchmark prompts: the kit's natural prompts, or any JSONL file of chat messages.

Format (one JSON object per line, blank lines ignored)::

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
from kimi_deploy.wire.limits import parse_json

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


def load_dataset(path: Path | None = None) -> Dataset:
    """Load ``path`` (default: the kit's prompts) and check every line.

    Raises:
        UsageError: the file is missing or unreadable, not UTF-8, a line is not JSON or has no valid
            ``messages`` list (the message names the line), or the file holds no prompt.
    """
    source = Path(path) if path is not None else paths.bench_prompts_file()
    try:
        raw = source.read_bytes()
    except OSError as exc:
        raise UsageError("cannot read the dataset", value=str(source),
                         hint="pass --dataset FILE.jsonl with one {\"messages\": [...]} object per line") from exc
    try:  # a leading BOM (an editor's "UTF-8 with BOM") is dropped, as RFC 8259 allows a JSON reader to
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:  # was decoded with "replace": prompts silently sent with U+FFFD in them
        line = raw.count(b"\n", 0, exc.start) + 1
        raise UsageError(f"the dataset is not UTF-8 text: byte 0x{raw[exc.start]:02x} on line {line}",
                         value=f"{source}:{line}", hint="save it as UTF-8 (e.g. `iconv -f LATIN1 -t UTF-8 FILE`)") from None
    conversations = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        conversations.append(_parse_line(line, number, source))
    if not conversations:
        raise UsageError("the dataset holds no prompt", value=str(source),
                         hint="add lines like {\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}")
    name = "kimi-deploy natural prompts" if path is None else source.name
    return Dataset(name=name, path=str(source), sha256=hashlib.sha256(raw).hexdigest(),
                   conversations=tuple(conversations))


def _parse_line(line: str, number: int, source: Path) -> tuple[dict[str, Any], ...]:
    where = f"{source}:{number}"
    fix = 'each line must be {"messages": [{"role": "user", "content": "..."}]}'
    try:
        obj = parse_json(line)
    except ValueError as exc:
        raise UsageError(f"dataset line {number} is not JSON ({exc})", value=where, hint=fix) from None
    messages = obj.get("messages") if isinstance(obj, dict) else None
    if not isinstance(messages, list) or not messages:
        raise UsageError(f"dataset line {number} has no non-empty \"messages\" list", value=where, hint=fix)
    out = []
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), (str, list)):
            raise UsageError(f"dataset line {number} has a message without a known role and a content",
                             value=f"{where}: {json.dumps(m)[:120]}",
                             hint=f"{fix}; roles: {', '.join(sorted(ROLES))}")
        out.append({"role": m["role"], "content": m["content"]})
    return tuple(out)
