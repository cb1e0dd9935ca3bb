"""JSON Schemas written by someone else, judged offline and in bounded time.

A tool's ``parameters`` comes from a dataset a third party wrote (K2VV corpora, a vendor's tool schemas) and the
arguments from a server: neither may make the kit fetch a URL, read a file, recurse without end or spend unbounded
time in one regular expression (issue #38). :func:`compile_schema` builds a validator under those rules and
raises :class:`Unjudgeable` (the dataset's fault, ``dataset_invalid``) for a schema it cannot judge;
:func:`iter_errors` validates an instance and raises :class:`Unjudgeable` for what only shows then.

- **Draft**: the schema's own ``$schema`` (draft-04, -06, -07, 2019-09, 2020-12); undeclared, draft-07 when the
  schema (or, with ``prefer_draft7``, its corpus) uses an idiom only draft-07 gives that meaning (an ``$id`` with a
  plain-name fragment such as ``"#user"``, ``definitions`` without ``$defs``, ``items`` as a list,
  ``additionalItems``, ``dependencies``), else 2020-12 (what SGLang 0.5.23's serving_chat.py validates with).
- **References**: only inside the document and the drafts' own meta-schemas (a ``referencing.Registry`` whose
  retrieve refuses every URI: ``jsonschema``'s deprecated default retriever calls ``urlopen`` with no timeout for
  ``http://`` and ``file://``). Every ``$ref`` is resolved once when the validator is built; a reference to
  anything else, or one that loops back to where it started without validating anything, is :class:`Unjudgeable`.
- **Regular expressions** (``pattern``, ``patternProperties``, and ``additionalProperties`` /
  ``unevaluatedProperties``, which run the ``patternProperties`` regexes): RE2 (``google-re2``: linear in the
  text, and closer to ECMA-262 than Python's ``re``: ``\\d`` is ASCII, ``$`` is the end of the text) when the
  pattern is RE2 syntax; else (lookaround, backreferences) the ``regex`` module with a per-match timeout of
  :data:`PATTERN_TIMEOUT_S`. A pattern that timed out once is not run again. ``jsonschema`` 4.x calls
  ``re.search`` in its keyword and utility modules; :func:`_install` points those modules' ``re`` at
  :class:`_BoundedRe` (tests/test_check_quality_hostile.py asserts ``search`` is the only ``re`` function they call).
- **Depth**: a schema nested deeper than :data:`MAX_SCHEMA_DEPTH` JSON levels, or arguments deeper than
  :data:`MAX_INSTANCE_DEPTH`, is not handed to the (recursive) validator.
- **Work**: applicators fan out (``allOf: [{$ref: a1}, {$ref: a1}]`` thirty times over is 2^30 evaluations of a
  33-line schema: 14 levels took 3.6 s, 16 levels 14 s). Every keyword of a validator built here first checks the
  wall-clock budget of the validation it belongs to (:data:`VALIDATION_BUDGET_S`, per thread), so one validation
  ends within the budget plus one keyword's own work, and past it the schema is :class:`Unjudgeable`.
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import jsonschema
import jsonschema.validators
import re2
import referencing
import referencing.exceptions
import referencing.jsonschema
import regex
from jsonschema.exceptions import SchemaError, ValidationError

#: Seconds one match of a non-RE2 pattern may run (``regex``'s own timeout, which overshoots by up to ~8x on a
#: loaded 2-core host: 0.05 s measured as 0.07-0.4 s, benchmarks/bench_dataset_bounds.py).
PATTERN_TIMEOUT_S = 0.05

#: JSON nesting levels of a schema the kit judges: the deepest tool schema of K2VV's corpus and of the kit's own
#: corpus is under 12 levels; ``jsonschema`` raised RecursionError on a schema nested 150 levels.
MAX_SCHEMA_DEPTH = 64

#: Wall-clock seconds one validation (a schema against its meta-schema, or arguments against a schema) may take:
#: the kit's corpus and K2VV's validate in milliseconds; 2 s is 1000x that on a loaded 2-core host.
VALIDATION_BUDGET_S = 2.0

#: JSON nesting levels of arguments the kit validates (deeper is the answer's fault: ``schema_violation``).
MAX_INSTANCE_DEPTH = 64

_DRAFTS: dict[str, type] = {
    "draft4": jsonschema.Draft4Validator, "draft6": jsonschema.Draft6Validator,
    "draft7": jsonschema.Draft7Validator, "draft2019-09": jsonschema.Draft201909Validator,
    "draft2020-12": jsonschema.Draft202012Validator,
}


class Unjudgeable(Exception):
    """A schema the kit cannot judge arguments against; ``str(exc)`` says why (one sentence, no traceback)."""


class PatternTimeout(Unjudgeable):
    """A ``pattern`` ran past :data:`PATTERN_TIMEOUT_S` (catastrophic backtracking)."""


class OverBudget(Unjudgeable):
    """A validation ran past :data:`VALIDATION_BUDGET_S` (applicators that fan out exponentially)."""


# -- bounded work ------------------------------------------------------------------------------------------------

_budget = threading.local()


@contextlib.contextmanager
def _within_budget(seconds: float = VALIDATION_BUDGET_S) -> Iterator[None]:
    """Bound the validations of this thread inside the block to ``seconds`` of wall-clock time (nested blocks keep
    the outer, earlier deadline)."""
    outer = getattr(_budget, "deadline", None)
    mine = time.monotonic() + seconds
    _budget.deadline = mine if outer is None else min(outer, mine)
    try:
        yield
    finally:
        _budget.deadline = outer


def _timed(keyword: Any) -> Any:
    """``keyword`` (a ``jsonschema`` keyword function) that first checks this thread's budget."""

    @functools.wraps(keyword)
    def checked(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        deadline = getattr(_budget, "deadline", None)
        if deadline is not None and time.monotonic() > deadline:
            raise OverBudget(f"validating ran over {VALIDATION_BUDGET_S:g} s: the schema's applicators ($ref, allOf, "
                             "anyOf, oneOf ...) fan out without bound; the schema cannot be judged in bounded time")
        return keyword(validator, value, instance, schema)

    return checked


@functools.lru_cache(maxsize=None)
def _bounded(cls: type) -> type:
    """``cls`` (a draft's validator class) with every keyword checking the budget (:func:`_timed`)."""
    return jsonschema.validators.extend(cls, {k: _timed(v) for k, v in cls.VALIDATORS.items()})


# -- bounded regular expressions ---------------------------------------------------------------------------------

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # an unsupported pattern is expected (lookaround), not an error line on stderr
_slow: set[str] = set()
_slow_lock = threading.Lock()


@functools.lru_cache(maxsize=2048)
def _compiled(pattern: str) -> tuple[str, Any]:
    """``("re2", compiled)`` when RE2 takes ``pattern``, else ``("regex", compiled)``.

    Raises:
        Unjudgeable: neither engine compiles it.
    """
    try:
        return "re2", re2.compile(pattern, _RE2_OPTIONS)
    except (re2.error, TypeError, ValueError, UnicodeError):
        pass
    try:
        return "regex", regex.compile(pattern)
    except (regex.error, TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise Unjudgeable(f"pattern {_short(pattern)} is not a regular expression ({exc})") from None


def search(pattern: str, text: str) -> bool:
    """Whether ``pattern`` matches somewhere in ``text`` (JSON Schema ``pattern`` semantics), in bounded time.

    Raises:
        PatternTimeout: the pattern needs RE2-incompatible features and ran past :data:`PATTERN_TIMEOUT_S`
            (or did so before).
        Unjudgeable: the pattern compiles in neither engine.
    """
    engine, compiled = _compiled(pattern)
    if engine == "re2":
        try:
            return compiled.search(text) is not None
        except UnicodeError:  # a lone surrogate cannot be UTF-8 for RE2: the same pattern in `regex`, bounded
            engine, compiled = "regex", _regex_only(pattern)
    if pattern in _slow:
        raise PatternTimeout(f"pattern {_short(pattern)} backtracks catastrophically (over {PATTERN_TIMEOUT_S} s "
                             "on an earlier value): the schema cannot be judged in bounded time")
    try:
        return compiled.search(text, timeout=PATTERN_TIMEOUT_S) is not None
    except TimeoutError:
        with _slow_lock:
            _slow.add(pattern)
        raise PatternTimeout(f"pattern {_short(pattern)} ran over {PATTERN_TIMEOUT_S} s on a {len(text)}-character "
                             "value (catastrophic backtracking): the schema cannot be judged in bounded time") \
            from None


@functools.lru_cache(maxsize=256)
def _regex_only(pattern: str) -> Any:
    try:
        return regex.compile(pattern)
    except (regex.error, TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise Unjudgeable(f"pattern {_short(pattern)} is not a regular expression ({exc})") from None


def _short(pattern: str) -> str:
    return repr(pattern if len(pattern) <= 60 else pattern[:57] + "...")


class _BoundedRe:
    """What ``jsonschema``'s keyword modules see as ``re``: :func:`search` bounded, everything else ``re``'s."""

    @staticmethod
    def search(pattern: str, string: str, flags: int = 0) -> bool | None:
        if flags:
            return re.search(pattern, string, flags)
        return True if search(pattern, string) else None

    def __getattr__(self, name: str) -> Any:
        return getattr(re, name)


def _install() -> None:
    from jsonschema import _keywords, _legacy_keywords, _utils

    for module in (_keywords, _legacy_keywords, _utils):
        if not isinstance(getattr(module, "re", None), _BoundedRe):
            module.re = _BoundedRe()


_install()


# -- offline references ------------------------------------------------------------------------------------------

def _refuse(uri: str) -> referencing.Resource:
    raise referencing.exceptions.NoSuchResource(ref=uri)


#: References resolve inside the document and the drafts' meta-schemas (bundled with ``jsonschema``), never
#: through a retriever: nothing is fetched, nothing is read from disk.
OFFLINE = referencing.Registry(retrieve=_refuse)


# -- draft --------------------------------------------------------------------------------------------------------

def uses_draft7_idioms(schema: Any) -> bool:
    """Whether ``schema`` (a parsed JSON value) uses an idiom only draft-07 and earlier give that meaning: an
    ``$id`` with a plain-name fragment (``"#user"``, ``"item.json#x"``), ``definitions`` without ``$defs``,
    ``items`` as a list, ``additionalItems``, ``dependencies``. Iterative; never raises."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            sid = node.get("$id")
            if isinstance(sid, str) and "#" in sid and sid.split("#", 1)[1] not in ("",) \
                    and not sid.split("#", 1)[1].startswith("/"):
                return True
            if ("definitions" in node and "$defs" not in node) or isinstance(node.get("items"), list) \
                    or "additionalItems" in node or isinstance(node.get("dependencies"), dict):
                return True
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def depth(value: Any, limit: int) -> int:
    """JSON nesting levels of ``value`` (a scalar is 0), counted iteratively up to ``limit + 1``."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, level)
            if deepest > limit:
                return deepest
            stack.extend((v, level + 1) for v in (node.values() if isinstance(node, dict) else node))
    return deepest


def draft_of(schema: Any, prefer_draft7: bool = False) -> type:
    """The validator class for ``schema``: its ``$schema``, else draft-07 for draft-07 idioms (or
    ``prefer_draft7``: the corpus uses them), else 2020-12.

    Raises:
        Unjudgeable: ``$schema`` names no draft ``jsonschema`` knows.
    """
    declared = schema.get("$schema") if isinstance(schema, dict) else None
    if declared is not None:
        cls = jsonschema.validators.validator_for(schema, default=None) if isinstance(declared, str) else None
        if cls is None:
            raise Unjudgeable(f"$schema {_short(str(declared))} names no JSON Schema draft the kit knows "
                              f"(draft-04, -06, -07, 2019-09, 2020-12)")
        return cls
    if prefer_draft7 or uses_draft7_idioms(schema):
        return jsonschema.Draft7Validator
    return jsonschema.Draft202012Validator


def draft_name(cls: type) -> str:
    """``draft-07``, ``2020-12`` ...: the draft of a validator class, for a message."""
    for name, known in _DRAFTS.items():
        if known is cls:
            return name.replace("draft2", "2").replace("draft", "draft-0")
    return cls.__name__


# -- building and running ---------------------------------------------------------------------------------------

def compile_schema(schema: Any, *, prefer_draft7: bool = False, format_checker: Any = None) -> Any:
    """A validator for ``schema`` (a tool's ``parameters`` as written: an object, or ``true``/``false``),
    checked against its draft's meta-schema, every ``$ref`` resolved offline.

    Raises:
        Unjudgeable: nested past :data:`MAX_SCHEMA_DEPTH`, not a schema of its draft (the message names the
            draft and the keyword), a ``$ref`` outside the document or one that loops, or a ``pattern`` neither
            engine compiles.
    """
    if not isinstance(schema, (dict, bool)):
        raise Unjudgeable(f"the schema is a JSON {type(schema).__name__}, not an object or a boolean")
    if depth(schema, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
        raise Unjudgeable(f"the schema is nested over {MAX_SCHEMA_DEPTH} levels deep: the kit does not judge it")
    cls = draft_of(schema, prefer_draft7)
    try:
        with _within_budget():
            _bounded(cls).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise Unjudgeable(f"not a valid {draft_name(cls)} schema at {where}: {exc.message[:200]}") from None
    except Unjudgeable:
        raise
    except Exception as exc:  # noqa: BLE001 - jsonschema/referencing on hostile input (RecursionError, a bad URI)
        raise Unjudgeable(f"not a valid {draft_name(cls)} schema ({_why(exc)})") from None
    try:
        validator = _bounded(cls)(schema, registry=OFFLINE, format_checker=format_checker)
        with _within_budget():
            _check_references(validator, schema)
    except Unjudgeable:
        raise
    except Exception as exc:  # noqa: BLE001 - as above: a schema the libraries cannot apply is the dataset's fault
        raise Unjudgeable(f"the schema cannot be applied ({_why(exc)})") from None
    return validator


def _why(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "it refers to itself without end, or nests too deep"
    if isinstance(exc, referencing.exceptions.Unresolvable):
        ref = getattr(exc, "ref", "")
        return (f"$ref {_short(str(ref))} points outside the tool's schema or to nothing in it (the kit resolves "
                "no URL and reads no file)")
    return f"{type(exc).__name__}: {str(exc)[:160]}"


def _check_references(validator: Any, schema: Any) -> None:
    """Resolve every ``$ref`` of ``schema`` once (offline), and validate ``{}`` to find a reference loop.

    Raises:
        Unjudgeable: a reference outside the document, or one that never ends.
    """
    resolver = validator._resolver  # jsonschema 4.18+: the referencing.Resolver rooted at the schema
    spec = referencing.jsonschema.specification_with(validator.META_SCHEMA.get("$schema", ""),
                                                     default=referencing.jsonschema.DRAFT202012)
    stack = [(spec.create_resource(schema), resolver)]
    seen = 0
    while stack:
        resource, res = stack.pop()
        seen += 1
        contents = resource.contents
        if isinstance(contents, dict):
            for key in ("$ref", "$dynamicRef", "$recursiveRef"):
                ref = contents.get(key)
                if isinstance(ref, str):
                    try:
                        res.lookup(ref)
                    except referencing.exceptions.Unresolvable as exc:
                        raise Unjudgeable(_why(exc)) from None
        try:
            subs = list(resource.subresources())
        except (TypeError, AttributeError):
            subs = []
        stack.extend((sub, res.in_subresource(sub)) for sub in subs)
    try:
        for _ in validator.iter_errors({}):
            pass
    except (RecursionError, referencing.exceptions.Unresolvable) as exc:
        raise Unjudgeable(f"the schema cannot be applied ({_why(exc)})") from None


def iter_errors(validator: Any, instance: Any) -> Iterator[ValidationError]:
    """``validator.iter_errors(instance)``, all of them, bounded.

    Raises:
        Unjudgeable: a ``pattern`` backtracks catastrophically, a ``$ref`` cannot be resolved, or the schema
            recurses without end (``instance`` within :data:`MAX_INSTANCE_DEPTH`, checked by the caller).
    """
    try:
        with _within_budget():
            return iter(list(validator.iter_errors(instance)))
    except Unjudgeable:
        raise
    except Exception as exc:  # noqa: BLE001 - RecursionError, Unresolvable, a library's surprise on hostile input
        raise Unjudgeable(f"the schema cannot be applied ({_why(exc)})") from None
