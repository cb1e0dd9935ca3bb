"""The schema corpus: tool ``parameters`` in the JSON Schema 2020-12 shapes that agents' tools use.

Written for the kit (after the Kimi Vendor Verifier's pre-flight idea: forced tool calls over a corpus of
schema shapes, streamed and not, arguments validated locally). Each :class:`Shape` has a name (the check id part),
the schema features it exercises (named as the keywords are: ``$defs``, ``$ref``, ``anyOf`` ...), the schema
and one argument object valid against it. The request directs the model to call the shape's tool with exactly
those arguments (the prompt contract.py's ``arguments.*`` cases use), so a valid answer is one an honest model
and server can always give, and any failure is the server's (grammar, parser) or the model's.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any


@dataclasses.dataclass(frozen=True)
class Shape:
    """One schema shape: ``name`` (``[a-z0-9_]``), ``features`` (keywords), ``schema`` (the tool's
    ``parameters``), ``example`` (arguments valid against it)."""

    name: str
    features: tuple[str, ...]
    schema: dict[str, Any]
    example: dict[str, Any]

    @property
    def tool_name(self) -> str:
        return f"shape_{self.name}"

    def tool(self) -> dict[str, Any]:
        """The OpenAI-shaped tool of this shape."""
        return {"type": "function", "function": {
            "name": self.tool_name,
            "description": f"Record a value (schema features: {', '.join(self.features)}).",
            "parameters": self.schema}}

    def directive(self) -> str:
        """The user message: call the tool with exactly :attr:`example`."""
        return (f"Call the tool `{self.tool_name}` with exactly these arguments: "
                + json.dumps(self.example, ensure_ascii=False))


def _obj(props: dict[str, Any], required: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            **extra}


SHAPES: tuple[Shape, ...] = (
    Shape("defs_ref", ("$defs", "$ref"), {
        "$defs": {"address": _obj({"street": {"type": "string"}, "city": {"type": "string"},
                                   "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                                  additionalProperties=False)},
        **_obj({"ship_to": {"$ref": "#/$defs/address"}, "bill_to": {"$ref": "#/$defs/address"}})},
        {"ship_to": {"street": "1 Main St", "city": "Springfield", "zip": "12345"},
         "bill_to": {"street": "9 Elm Rd", "city": "Shelbyville", "zip": "54321"}}),
    Shape("recursive_ref", ("$defs", "$ref", "recursion"), {
        "$defs": {"node": _obj({"name": {"type": "string"},
                                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                               required=["name"], additionalProperties=False)},
        **_obj({"tree": {"$ref": "#/$defs/node"}})},
        {"tree": {"name": "src", "children": [{"name": "main.py"}, {"name": "lib", "children": [{"name": "a.py"}]}]}}),
    Shape("any_of", ("anyOf",), _obj({"target": {"anyOf": [{"type": "integer", "minimum": 1},
                                                           {"type": "string", "pattern": "^#[0-9]+$"}]},
                                      "label": {"anyOf": [{"type": "string"}, {"type": "array",
                                                                               "items": {"type": "string"}}]}}),
          {"target": "#42", "label": ["bug", "p1"]}),
    Shape("one_of", ("oneOf", "const"), _obj({"action": {"oneOf": [
        _obj({"kind": {"const": "move"}, "dx": {"type": "integer"}, "dy": {"type": "integer"}},
             additionalProperties=False),
        _obj({"kind": {"const": "say"}, "text": {"type": "string"}}, additionalProperties=False)]}}),
          {"action": {"kind": "move", "dx": 3, "dy": -2}}),
    Shape("all_of", ("allOf",), {"allOf": [_obj({"id": {"type": "string"}}),
                                           _obj({"priority": {"type": "integer", "minimum": 0}})],
                                 "type": "object"},
          {"id": "T-7", "priority": 2}),
    Shape("enum_const", ("enum", "const"), _obj({"unit": {"enum": ["celsius", "fahrenheit"]},
                                                "version": {"const": 2},
                                                "mode": {"type": "string", "enum": ["fast", "exact"]}}),
          {"unit": "celsius", "version": 2, "mode": "exact"}),
    Shape("closed_nested", ("additionalProperties", "nested objects"), _obj({"user": _obj({
        "name": {"type": "string"}, "prefs": _obj({"theme": {"type": "string"}, "beta": {"type": "boolean"}},
                                                  additionalProperties=False)}, additionalProperties=False)},
        additionalProperties=False), {"user": {"name": "Ada", "prefs": {"theme": "dark", "beta": True}}}),
    Shape("arrays", ("items", "minItems", "maxItems", "uniqueItems", "nested arrays"), _obj({
        "matrix": {"type": "array", "minItems": 2, "maxItems": 3,
                   "items": {"type": "array", "minItems": 2, "items": {"type": "number"}}},
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True, "maxItems": 4}}),
          {"matrix": [[1, 2.5], [3, 4]], "tags": ["a", "b", "c"]}),
    Shape("prefix_items", ("prefixItems", "items false"), _obj({"point": {
        "type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}, {"type": "string"}],
        "items": False, "minItems": 3}}), {"point": [52.52, 13.405, "Berlin"]}),
    Shape("ranges", ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "integer"),
          _obj({"count": {"type": "integer", "minimum": 1, "maximum": 10},
                "ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
                "step": {"type": "number", "multipleOf": 0.25}}),
          {"count": 7, "ratio": 0.3, "step": 1.75}),
    Shape("strings", ("minLength", "maxLength", "pattern"), _obj({
        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
        "note": {"type": "string", "minLength": 3, "maxLength": 40}}),
          {"code": "ABC-2026", "note": "ship before friday"}),
    Shape("formats", ("format",), _obj({
        "email": {"type": "string", "format": "email"}, "day": {"type": "string", "format": "date"},
        "at": {"type": "string", "format": "date-time"}, "ip": {"type": "string", "format": "ipv4"},
        "ref": {"type": "string", "format": "uuid"}}),
          {"email": "ops@example.com", "day": "2026-12-02", "at": "2026-12-02T03:04:05Z", "ip": "10.0.0.7",
           "ref": "3f2b8c1e-9d4a-4c7e-8b1f-2a6d5e9c0b7a"}),
    Shape("nullable", ("nullable", "type list", "anyOf null"), _obj({
        "parent": {"type": ["string", "null"]}, "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "note": {"type": ["string", "null"]}}), {"parent": None, "limit": 5, "note": None}),
    Shape("dependent_required", ("dependentRequired", "optional properties"), {
        "type": "object", "properties": {"card": {"type": "string"}, "cvc": {"type": "string"},
                                         "amount": {"type": "integer"}},
        "required": ["amount"], "dependentRequired": {"card": ["cvc"]}},
          {"amount": 1200, "card": "4111111111111111", "cvc": "123"}),
    Shape("no_parameters", ("empty object", "additionalProperties"),
          {"type": "object", "properties": {}, "additionalProperties": False}, {}),
)


def shape(name: str) -> Shape:
    """The shape called ``name``.

    Raises:
        KeyError: no such shape.
    """
    for s in SHAPES:
        if s.name == name:
            return s
    raise KeyError(name)
