"""Tool-call request bodies for ``quality.accuracy``: K2VV's format, or the kit's own agentic samples.

Format (K2 Vendor Verifier, ``MoonshotAI/K2-Vendor-Verifier`` ``tool_calls_eval.py``): a JSONL file, one
chat-completion request body per line, blank lines ignored. Each body has ``messages`` (a non-empty list of
message objects with a ``role``) and usually ``tools`` (OpenAI function tools whose ``parameters`` is a JSON
schema); any other key (``tool_choice``, ``temperature``, ``max_tokens``, ``stream`` ...) is sent as it is but
``model``, which is the run's. K2VV's ``_input`` role is sent as ``system``, as K2VV does.

Datasets come from third parties, so reading one is bounded and a bad line is that line's fault (issue #38):

- the file is a regular file (:func:`kimi_deploy.wire.inputs.open_regular`) of at most ``max_file_bytes``, read
  one ``\\n``-terminated line at a time (:func:`kimi_deploy.wire.inputs.iter_lines`), each at most
  ``max_line_bytes``;
- a line that is not one judgeable request (over the line cap, not UTF-8, not strict JSON — ``NaN`` — a lone
  surrogate, no ``messages``, a tool whose ``parameters`` its own draft does not accept, a ``$ref`` outside it:
  :mod:`kimi_deploy.check.schemas`) is a :class:`Invalid` case, reported as ``dataset_invalid`` with its line
  and left out of the sample; the run goes on with the others;
- the sample is drawn by index (a seeded reservoir of ``n`` line offsets, Vitter's algorithm R) in the reading
  pass, and each body is read again (``pread``), checked against the digest of the first pass and parsed only
  when its request is sent: memory follows ``--sample`` x the line cap's share in flight, not the file.

The kit ships ``samples.jsonl`` next to this module: 24 agentic requests written for the kit (a coding agent
with file and shell tools, an operations assistant with web, calendar, mail, SQL, ticket and kubectl tools;
single and multi-turn, with tool results in the history), Apache-2.0 like the kit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kimi_deploy.check import schemas
from kimi_deploy.errors import UsageError
from kimi_deploy.wire import inputs
from kimi_deploy.wire.limits import human, parse_json

KIT_SAMPLES = Path(__file__).with_name("samples.jsonl")

#: Seed of the sample drawn from a dataset larger than ``--sample`` (fixed: two runs send the same requests).
SAMPLE_SEED = 27

#: Invalid cases a report lists by line (all are counted).
MAX_LISTED_INVALID = 20

FIX = ('each line must be a chat-completion request body: {"messages": [{"role": "user", "content": "..."}], '
       '"tools": [{"type": "function", "function": {"name": "...", "parameters": {...}}}]}')
HINT = f"pass --dataset FILE.jsonl (a regular file); {FIX}"


class CaseError(Exception):
    """One line is not a request the kit can send and judge; ``str(exc)`` says why (no line number)."""


@dataclasses.dataclass(frozen=True)
class Invalid:
    """A line left out of the sample: its 1-based ``line`` and why (``detail``)."""

    line: int
    detail: str


@dataclasses.dataclass(frozen=True)
class Case:
    """A request of the sample: its ``line``, byte ``offset`` and ``length`` in the file, the ``digest`` of its
    bytes in the reading pass (the send pass refuses a line that changed)."""

    line: int
    offset: int
    length: int
    digest: bytes


@dataclasses.dataclass(frozen=True)
class Request:
    """A case ready to send: ``body`` (``model`` removed, ``_input`` sent as ``system``) and ``validators``
    (tool name -> a bounded validator of its ``parameters``, :func:`kimi_deploy.check.schemas.compile_schema`)."""

    case: Case
    body: dict[str, Any]
    validators: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A dataset after its reading pass: ``requests`` valid lines, ``invalid_count`` invalid ones (the first
    :data:`MAX_LISTED_INVALID` in ``invalid``), ``sha256`` of the file bytes (recorded in the report so two runs
    can be matched), ``drawn``: the cases of a seeded sample of ``sample_size`` (every valid line when fewer)."""

    name: str
    path: str
    sha256: str
    requests: int
    invalid_count: int
    invalid: tuple[Invalid, ...]
    drawn: tuple[Case, ...]
    sample_size: int
    max_line_bytes: int

    def sample(self, n: int | None = None) -> list[Case]:
        """``n`` cases (default: the size drawn): a seeded random choice without repetition, in file order, when
        the file holds more valid lines; else every valid line in file order, cycled until ``n``."""
        n = self.sample_size if n is None else n
        if n > self.sample_size and self.requests > self.sample_size:
            raise ValueError(f"drawn for a sample of {self.sample_size}, asked for {n}")
        if self.requests >= n:
            return list(self.drawn[:n]) if n == len(self.drawn) else sorted(
                random.Random(SAMPLE_SEED).sample(self.drawn, n), key=lambda c: c.offset)
        return [self.drawn[i % len(self.drawn)] for i in range(n)]

    @contextlib.contextmanager
    def reader(self) -> Iterator[Reader]:
        """The file opened again for the send pass (:meth:`Reader.request`).

        Raises:
            UsageError: it is no longer a readable regular file (exit 2).
        """
        fh = inputs.open_regular(self.path, "the dataset", HINT)
        try:
            yield Reader(fh.fileno(), self.max_line_bytes)
        finally:
            fh.close()

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "sha256": self.sha256, "requests": self.requests,
                "invalid": self.invalid_count}


@dataclasses.dataclass(frozen=True)
class Reader:
    """Reads cases of an open dataset (``fd``) for the send pass; safe from several threads (``pread``)."""

    fd: int
    max_line_bytes: int

    def request(self, case: Case) -> Request:
        """The case's body and validators.

        Raises:
            CaseError: the line changed since the reading pass, or cannot be judged (the same checks).
        """
        try:
            data = inputs.read_at(self.fd, case.offset, case.length)
        except OSError as exc:
            raise CaseError(f"cannot read it again ({exc.strerror or exc})") from None
        if _digest(data) != case.digest:
            raise CaseError("it changed since the run first read the dataset")
        return _request(case, data)


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def load(path: Path | str | None = None, *, sample: int = 1, max_line_bytes: int = inputs.DATASET_LINE_BYTES,
         max_file_bytes: int = inputs.DATASET_FILE_BYTES) -> Dataset:
    """Read ``path`` (default: the kit's samples) once: check every line, draw ``sample`` cases.

    Raises:
        UsageError: not a readable regular file, over ``max_file_bytes``, or holding no valid request (the
            message names the first invalid lines), exit 2.
    """
    source = Path(path) if path is not None else KIT_SAMPLES
    where = str(source)
    try:
        st = os.stat(source)
        key = (where, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, sample, max_line_bytes, max_file_bytes)
    except OSError:
        key = None  # open_regular says why
    if key is not None and _LAST.get("key") == key:
        return _LAST["dataset"]  # the tier's prepare() read it a moment ago: one reading pass per run
    whole = hashlib.sha256()
    rng = random.Random(SAMPLE_SEED)
    drawn: list[Case] = []
    invalid: list[Invalid] = []
    valid = invalid_count = 0
    with inputs.open_regular(source, "the dataset", HINT, max_bytes=max_file_bytes,
                             cap_flag="--max-dataset-bytes") as fh:
        for line in inputs.iter_lines(fh, max_line_bytes=max_line_bytes, max_file_bytes=max_file_bytes,
                                      what="the dataset", where=where, flag="--max-dataset-bytes",
                                      hasher=whole):
            if line.data is not None and not line.data.removeprefix(b"\xef\xbb\xbf").strip():
                continue  # a blank line (K2VV files end with one)
            try:
                if line.data is None:
                    raise CaseError(f"it is {human(line.length)}, over the {human(max_line_bytes)} cap on a line "
                                    "(raise it with --max-dataset-line-bytes N)")
                case = Case(line.number, line.offset, line.length, _digest(line.data))
                _request(case, line.data)
            except CaseError as exc:
                invalid_count += 1
                if len(invalid) < MAX_LISTED_INVALID:
                    invalid.append(Invalid(line.number, str(exc)))
                continue
            valid += 1  # algorithm R: keep the first `sample`, then replace one with probability sample/valid
            if len(drawn) < sample:
                drawn.append(case)
            else:
                j = rng.randrange(valid)
                if j < sample:
                    drawn[j] = case
    if not valid:
        shown = "; ".join(f"line {i.line}: {i.detail}" for i in invalid[:3])
        raise UsageError("the dataset holds no request" + (f" the kit can send and judge ({shown})" if shown else ""),
                         value=where, hint=FIX)
    drawn.sort(key=lambda c: c.offset)
    name = "kimi-deploy agentic samples" if path is None else source.name
    data = Dataset(name, where, whole.hexdigest(), valid, invalid_count, tuple(invalid), tuple(drawn), sample,
                   max_line_bytes)
    _LAST.update(key=key, dataset=data)
    return data


#: The last dataset read and the identity of its file (path, device, inode, size, mtime, the sample, the caps).
_LAST: dict[str, Any] = {}


def _request(case: Case, data: bytes) -> Request:
    """Parse and check one line.

    Raises:
        CaseError: why the line is not a request the kit can send and judge.
    """
    try:
        text = data.decode("utf-8-sig" if case.offset == 0 else "utf-8")
    except UnicodeDecodeError as exc:
        raise CaseError(f"byte 0x{data[exc.start]:02x} at column {exc.start + 1} is not UTF-8") from None
    try:
        body = parse_json(text, parse_constant=inputs.refuse_constant)
    except ValueError as exc:
        raise CaseError(f"not JSON ({str(exc)[:160]})") from None
    if not isinstance(body, dict):
        raise CaseError("not a JSON object")
    bad = inputs.lone_surrogate(body)
    if bad is not None:
        raise CaseError(f"a string holds a lone surrogate ({ascii(bad[:40])}): no UTF-8 request can carry it")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise CaseError('no non-empty "messages" list of objects with a role')
    tools = body.get("tools")
    validators: dict[str, Any] = {}
    if tools is not None:
        if not isinstance(tools, list):
            raise CaseError('"tools" is not a list')
        functions = [t.get("function") if isinstance(t, dict) else None for t in tools]
        if not all(isinstance(fn, dict) and isinstance(fn.get("name"), str) for fn in functions):
            raise CaseError("a tool has no function.name")
        prefer7 = any(schemas.uses_draft7_idioms(fn.get("parameters")) for fn in functions)
        for fn in functions:
            try:
                validators[fn["name"]] = _validator(_canonical(fn.get("parameters")), prefer7)
            except schemas.Unjudgeable as exc:
                raise CaseError(f"the parameters of tool {fn['name'][:60]!r} cannot be judged: {exc}") from None
    body = {k: v for k, v in body.items() if k != "model"}
    body["messages"] = [{**m, "role": "system"} if m.get("role") == "_input" else m for m in messages]
    return Request(case, body, validators)


def _canonical(parameters: Any) -> str:
    """A tool's ``parameters`` as written (absent or ``null``: ``{"type": "object"}``), as cache key text."""
    return json.dumps({"type": "object"} if parameters is None else parameters, sort_keys=True, ensure_ascii=True)


@functools.lru_cache(maxsize=512)
def _validator(text: str, prefer_draft7: bool) -> Any:
    """The validator of one schema (``text``: :func:`_canonical`); K2VV corpora repeat their tools on every line."""
    return schemas.compile_schema(json.loads(text), prefer_draft7=prefer_draft7)
