"""``quality.schema.<shape>.<choice>.<mode>``: a forced tool call per schema shape, validated locally.

For every :data:`kimi_deploy.check.quality.corpus.SHAPES` entry, ``tool_choice`` ``required`` (the shape's tool
alone) and named (the shape's tool plus a decoy, the shape's named), each non-streamed and streamed: the
request is contract.py's (the official ``openai`` client, temperature 0, the leak scanner, the response and
stream-shape validators); the arguments are then validated against the shape's schema with format checking
(:func:`kimi_deploy.check.quality.schema.violation`), and a violation is ``schema_violation`` whose detail
starts with the schema feature involved (``schema feature $ref > pattern (^[0-9]{5}$) (shape defs_ref)``).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from kimi_deploy.check import contract
from kimi_deploy.check.context import Context
from kimi_deploy.check.outcome import Outcome
from kimi_deploy.check.quality.corpus import SHAPES, Shape, shape
from kimi_deploy.check.quality.schema import violation
from kimi_deploy.check.results import clip
from kimi_deploy.check.completion_rules import Expectation, Finding, Message

CHOICES = ("required", "named")
MODES = contract.MODES


def check_ids() -> list[str]:
    """``quality.schema.<shape>.<choice>.<mode>`` for every shape, choice and mode, in run order."""
    return [f"quality.schema.{s.name}.{c}.{m}" for s in SHAPES for c in CHOICES for m in MODES]


def case_for(s: Shape, choice: str) -> contract.Case:
    """The contract :class:`~kimi_deploy.check.contract.Case` of shape ``s`` under ``choice``."""
    tools: tuple[dict[str, Any], ...] = (s.tool(),)
    tool_choice: Any = "required"
    named = None
    if choice == "named":
        tools = (contract.GET_TIME, s.tool())  # a decoy first: the name, not the order, must decide
        tool_choice = {"type": "function", "function": {"name": s.tool_name}}
        named = s.tool_name
    return contract.Case(f"schema.{s.name}.{choice}", f"forced call, schema features {', '.join(s.features)}",
                         ({"role": "user", "content": s.directive()},), tools=tools, tool_choice=tool_choice,
                         call="some", named=named, max_tokens=contract.argument_budget(s.example))


def schema_findings(msg: Message, s: Shape) -> list[Finding]:
    """A ``schema_violation`` naming the feature for each call of ``s``'s tool whose arguments (a JSON object:
    anything else is already ``invalid_arguments``) break the shape's schema."""
    out = []
    for call in msg.tool_calls:
        if call.name != s.tool_name or not isinstance(call.arguments, str):
            continue
        try:
            args = json.loads(call.arguments)
        except ValueError:
            continue
        if not isinstance(args, dict):
            continue
        found = violation(args, s.schema)
        if found is not None:
            feature, where, message = found
            out.append(Finding("schema_violation", f"schema feature {feature} (shape {s.name}): arguments of "
                                                   f"{call.name} violate its schema at {where}: {message}",
                               clip(call.arguments)))
    return out


def run(ctx: Context, check_id: str, cache: dict[str, Message | None]) -> Outcome:
    """Run ``quality.schema.<shape>.<choice>.<mode>``; ``cache`` keeps the non-streamed message of each case so
    the streamed arguments are compared with it (stream-shape rule)."""
    _, _, name, choice, mode = check_id.split(".")
    s = shape(name)
    case = case_for(s, choice)
    exp = Expectation(tools=case.tools, call="some", choice=case.tool_choice, named=case.named,
                      id_parser=ctx.id_parser)
    key = f"quality:{case.name}"
    answer = contract._request(ctx, case, list(case.messages), stream=mode == "stream", exp=exp,  # noqa: SLF001
                               nonstream=cache.get(key))
    if mode == "nonstream":
        cache[key] = answer.message
    findings = answer.findings
    if answer.message is not None:  # the generic check has no format checker and names no feature: ours decides
        findings = [f for f in findings if f.kind != "schema_violation"] + schema_findings(answer.message, s)
    findings = [dataclasses.replace(f, kind="tool_choice_violation", detail=f"forced call ({choice}): {f.detail}")
                if f.kind == "model_declined" else f for f in findings]
    return Outcome.judged(findings, contract._summary(answer.message))  # noqa: SLF001
