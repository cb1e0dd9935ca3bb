"""Local validation of tool-call arguments that names the JSON Schema feature a failure involves.

JSON Schema 2020-12 through ``jsonschema`` (``Draft202012Validator``, as SGLang's own serving_chat.py imports
it) with format checking on: the library's checkers (date, email, ipv4, ipv6, uuid, regex ...) plus
``date-time`` (RFC 3339 section 5.6), which ``jsonschema`` checks only with an optional package installed.
"""

from __future__ import annotations

import datetime as _dt
import re
from typing import Any

import jsonschema
from jsonschema.exceptions import ValidationError, best_match

from kimi_deploy.check.schemas import compile_schema, iter_errors

#: RFC 3339 section 5.6 ``date-time`` (``T``/``t`` separator, ``Z``/``z`` or a numeric offset).
_DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")

FORMAT_CHECKER = jsonschema.FormatChecker(formats=list(jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers))


@FORMAT_CHECKER.checks("date-time", raises=ValueError)
def _date_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    if not _DATE_TIME.match(value):
        return False
    _dt.datetime.fromisoformat(value.upper().replace("Z", "+00:00"))  # raises on a 31 February
    return True


#: The keywords that name a schema feature when they appear on the path to a failing keyword.
FEATURE_KEYWORDS = frozenset({
    "$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "if", "then", "else", "prefixItems", "items",
    "additionalProperties", "patternProperties", "dependentRequired", "dependentSchemas", "properties",
})


def _resolve(root: dict[str, Any], ref: str) -> Any:
    """A local ``$ref`` (``#/$defs/name``, a JSON pointer into ``root``); ``None`` for any other."""
    if not ref.startswith("#"):
        return None
    node: Any = root
    for part in filter(None, ref[1:].split("/")):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _schema_steps(root: dict[str, Any], path: list[Any]) -> list[str]:
    """The keywords of ``path`` (a validation error's absolute schema path), with ``$ref`` put in wherever
    validation went through a reference (``jsonschema`` leaves those out of the path)."""
    steps: list[str] = []
    node: Any = root
    for key in path:
        while isinstance(node, dict) and key not in node and isinstance(node.get("$ref"), str):
            steps.append("$ref")
            node = _resolve(root, node["$ref"])
        if isinstance(key, str):
            steps.append(key)
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and isinstance(key, int) and key < len(node):
            node = node[key]
        else:
            node = None
    return steps


def feature_path(error: ValidationError, schema: dict[str, Any] | None = None) -> str:
    """The schema features on the way to ``error``'s failing keyword, outermost first, the keyword last with
    its value when short: ``$ref > additionalProperties``, ``anyOf > minimum (1)``, ``format (email)``.
    ``properties``/``items`` steps are left out unless they are the failing keyword (they are on every path);
    ``$ref`` steps are found by walking ``schema`` (the root the error came from) when it is given."""
    path = list(error.absolute_schema_path)
    keys = _schema_steps(schema, path) if schema is not None else [k for k in path if isinstance(k, str)]
    keys = keys[:-1] if keys and keys[-1] == error.validator else keys
    steps: list[str] = []
    for k in keys:
        if k in FEATURE_KEYWORDS and k not in ("properties", "items") and (not steps or steps[-1] != k):
            steps.append(k)
    value = error.validator_value
    keyword = str(error.validator)
    shown = f"{keyword} ({value})" if isinstance(value, (str, int, float)) and not isinstance(value, bool) \
        and len(str(value)) <= 40 else keyword
    return " > ".join([*steps, shown])


def violation(arguments: Any, schema: dict[str, Any]) -> tuple[str, str, str] | None:
    """The most telling violation of ``schema`` by ``arguments`` (a parsed JSON value) as ``(feature path,
    where, message)`` (``where``: a JSON pointer into the arguments, ``/`` for the root), ``None`` when valid.

    Raises:
        kimi_deploy.check.schemas.Unjudgeable: ``schema`` itself cannot be judged (not valid under its draft,
            a ``$ref`` outside it, a regex that backtracks without end).
    """
    validator = compile_schema(schema, format_checker=FORMAT_CHECKER)
    error = best_match(iter_errors(validator, arguments))
    if error is None:
        return None
    where = "/" + "/".join(str(p) for p in error.absolute_path)
    return feature_path(error, schema), where, error.message
