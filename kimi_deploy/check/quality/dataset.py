"""Tool-call request bodies for ``quality.accuracy``: K2VV's format, or the kit's own agentic samples.

Format (K2 Vendor Verifier, ``MoonshotAI/K2-Vendor-Verifier`` ``tool_calls_eval.py``): a JSONL file, one
chat-completion request body per line, blank lines ignored. Each body has ``messages`` (a non-empty list of
message objects with a ``role``) and usually ``tools`` (OpenAI function tools whose ``parameters`` is a JSON
schema); any other key (``tool_choice``, ``temperature``, ``max_tokens``, ``stream`` ...) is sent as it is but
``model``, which is the run's. K2VV's ``_input`` role is sent as ``system``, as K2VV does.

The kit ships ``samples.jsonl`` next to this module: 24 agentic requests written for the kit (a coding agent
with file and shell tools, an operations assistant with web, calendar, mail, SQL, ticket and kubectl tools;
single and multi-turn, with tool results in the history), Apache-2.0 like the kit.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import random
from pathlib import Path
from typing import Any

import jsonschema

from kimi_deploy.errors import UsageError
from kimi_deploy.wire.limits import parse_json

KIT_SAMPLES = Path(__file__).with_name("samples.jsonl")

#: Seed of the sample drawn from a dataset larger than ``--sample`` (fixed: two runs send the same requests).
SAMPLE_SEED = 27

FIX = ('each line must be a chat-completion request body: {"messages": [{"role": "user", "content": "..."}], '
       '"tools": [{"type": "function", "function": {"name": "...", "parameters": {...}}}]}')


@dataclasses.dataclass(frozen=True)
class Dataset:
    """Request bodies from a JSONL file: ``bodies`` (dicts, ``model`` removed), ``name``, ``path``, ``sha256``
    of the file bytes (recorded in the report so two runs can be matched)."""

    name: str
    path: str
    sha256: str
    bodies: tuple[dict[str, Any], ...]

    def sample(self, n: int, seed: int = SAMPLE_SEED) -> list[dict[str, Any]]:
        """``n`` bodies: a seeded random choice without repetition when the file holds more, else every body
        in file order, cycled until ``n`` (deep copies: a request cannot change the dataset)."""
        if n <= len(self.bodies):
            order = sorted(random.Random(seed).sample(range(len(self.bodies)), n))
        else:
            order = [i % len(self.bodies) for i in range(n)]
        return [copy.deepcopy(self.bodies[i]) for i in order]

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "sha256": self.sha256, "requests": len(self.bodies)}


def load(path: Path | str | None = None) -> Dataset:
    """Load ``path`` (default: the kit's samples) and check every line.

    Raises:
        UsageError: the file is missing or unreadable, not UTF-8 (a leading BOM is dropped), a line is not a
            JSON object with a non-empty ``messages`` list, a tool is not an OpenAI function tool, or its
            ``parameters`` is not a valid JSON schema (the message names the line), or the file holds no
            request (exit 2).
    """
    source = Path(path) if path is not None else KIT_SAMPLES
    try:
        raw = source.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read the dataset ({exc.strerror or exc})", value=str(source),
                         hint=f"pass --dataset FILE.jsonl; {FIX}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise UsageError(f"the dataset is not UTF-8 text: byte 0x{raw[exc.start]:02x} on line {line}",
                         value=f"{source}:{line}", hint="save it as UTF-8 (e.g. `iconv -f LATIN1 -t UTF-8 FILE`)") \
            from None
    bodies = [_body(line, n, source) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not bodies:
        raise UsageError("the dataset holds no request", value=str(source), hint=FIX)
    name = "kimi-deploy agentic samples" if path is None else source.name
    return Dataset(name, str(source), hashlib.sha256(raw).hexdigest(), tuple(bodies))


def _body(line: str, number: int, source: Path) -> dict[str, Any]:
    where = f"{source}:{number}"
    try:
        body = parse_json(line)
    except ValueError as exc:
        raise UsageError(f"dataset line {number} is not JSON ({exc})", value=where, hint=FIX) from None
    if not isinstance(body, dict):
        raise UsageError(f"dataset line {number} is not a JSON object", value=where, hint=FIX)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise UsageError(f"dataset line {number} has no non-empty \"messages\" list of objects with a role",
                         value=where, hint=FIX)
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise UsageError(f"dataset line {number}: \"tools\" is not a list", value=where, hint=FIX)
        for tool in tools:
            fn = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise UsageError(f"dataset line {number} has a tool without function.name", value=where, hint=FIX)
            try:
                jsonschema.Draft202012Validator.check_schema(fn.get("parameters") or {"type": "object"})
            except jsonschema.SchemaError as exc:
                raise UsageError(f"dataset line {number}: the parameters of tool {fn['name']!r} are not a valid "
                                 f"JSON schema ({exc.message})", value=where,
                                 hint="fix the tool's schema: arguments cannot be judged against it") from None
    body = {k: v for k, v in body.items() if k != "model"}
    body["messages"] = [{**m, "role": "system"} if m.get("role") == "_input" else m for m in messages]
    return body
