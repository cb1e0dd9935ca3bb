"""The ``parser.*`` tier: the parsers the server runs, tested on raw Kimi output.

Independent of what the model chooses to say: raw Kimi K2.x outputs from a corpus shipped with the
kit (``kimi_deploy/check/data/parser_corpus.json``: the public sgl-project/sglang and vllm-project/vllm
issue reports on Kimi K2.x tool calls, and the attribution rule of the ``kimi-k2-tool-call-ids``
patch, docs/design.md#the-patch-series) are POSTed to SGLang's own parsers:

- ``parser.tool_calls.<case>``: ``POST /parse_function_call`` ``{"text", "tools",
  "tool_call_parser"}`` with the server's own ``tool_call_parser`` (``/model_info``); SGLang 0.5.23
  answers ``{"normal_text", "calls": [{"tool_index", "name", "parameters"}]}``;
- ``parser.reasoning.<case>``: ``POST /separate_reasoning`` ``{"text", "reasoning_parser"}``
  (answer ``{"reasoning_text", "text"}``); when the case expects calls, the returned text then goes
  through ``/parse_function_call`` as the serving layer hands it to the tool parser.

Each answer is judged against what the rule attributes: a call given to another tool of the request
is ``wrong_tool``, to a tool the request lacks ``unknown_tool``, a call the rule attributes but the
parser dropped ``tool_call_dropped``, other arguments than the model wrote ``invalid_arguments``,
markup left in the text or reasoning ``markup_leak``.

The corpus is Kimi K2 output: the tier runs where ``/model_info`` reports ``kimi_k2`` parsers. A
server without ``/model_info`` or ``/parse_function_call`` (vLLM, Exo, LiteLLM), or with another
parser, gets ONE ``skip`` row that says why (the first selected ``parser.*`` id); the other
``parser.*`` ids are then not reported (:func:`run` returns ``None``). A server whose reasoning
parser is not ``kimi_k2`` gets one such row for ``parser.reasoning.*``.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

import httpx

from kimi_deploy.check import leaks
from kimi_deploy.check.client import status_finding
from kimi_deploy.check.context import Context
from kimi_deploy.check.health import unreadable_config
from kimi_deploy.check.outcome import Outcome, transport_failure
from kimi_deploy.check.results import clip, clip_body
from kimi_deploy.check.completion_rules import Finding

CORPUS_FORMAT = "kimi-deploy.parser-corpus/1"
#: The parser the corpus is written for (SGLang ``--tool-call-parser``/``--reasoning-parser``).
PARSER = "kimi_k2"


@functools.cache
def corpus() -> dict[str, Any]:
    """The shipped corpus (``kimi-deploy.parser-corpus/1``): ``toolsets``, ``tool_calls``, ``reasoning``."""
    text = resources.files("kimi_deploy.check").joinpath("data", "parser_corpus.json").read_text(encoding="utf-8")
    data = json.loads(text)
    if data.get("format") != CORPUS_FORMAT:  # a packaging fault, never an operator's
        raise RuntimeError(f"parser_corpus.json is not {CORPUS_FORMAT}")
    return data


def check_ids() -> list[str]:
    """Every ``parser.*`` id in run order: tool-call cases, then reasoning cases."""
    data = corpus()
    return ([f"parser.tool_calls.{c['id']}" for c in data["tool_calls"]]
            + [f"parser.reasoning.{c['id']}" for c in data["reasoning"]])


def _post(ctx: Context, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    """POST JSON to ``path``: (status, parsed JSON or the text). Raises httpx.TransportError."""
    response = ctx.clients.http.post(path, json=body, timeout=ctx.clients.deadline.bound(ctx.clients.timeout))
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, response.text


#: Statuses of POST /parse_function_call that mean "no such endpoint" (http.server answers 501).
ABSENT = (404, 405, 501)


def _blocked(ctx: Context, group: str, cache: dict) -> tuple[str, Outcome] | None:
    """``(scope, verdict)`` (a ``skip`` with the reason, or a ``fail``) when the tier (scope ``parser``) or the reasoning group (scope
    ``parser.reasoning``) cannot run on this server; ``None`` when it can. Probed once per run."""
    if "parser:probe" not in cache:
        cache["parser:probe"] = _probe(ctx)
    if cache["parser:probe"] is not None:
        return "parser", cache["parser:probe"]
    if group == "reasoning":
        rp = ctx.server_value("reasoning_parser")
        if rp != PARSER:
            return "parser.reasoning", Outcome.skipped(f"the server runs reasoning_parser {rp!r}, not {PARSER} "
                                                       "(/model_info): the reasoning corpus is Kimi K2 output")
    return None


def _probe(ctx: Context) -> Outcome | None:
    """Can the corpus run here: ``/model_info`` names ``kimi_k2`` and ``/parse_function_call`` exists."""
    ctx.load_facts()
    if ctx.model_info is None:
        if ctx.facts_denied:
            path, status = ctx.facts_denied
            return Outcome.failed(status_finding(f"GET {path}", status, "", key_sent=bool(ctx.clients.api_key)))
        if ctx.facts_refused:
            return Outcome.failed(ctx.facts_refused)
        if ctx.identify() == "sglang":  # one notion of "what server is this" (Context.identify), in its words
            return Outcome.skipped("the server is SGLang (/server_info answered) but has no /model_info, which names "
                                   "its parsers: the parser corpus cannot pick them")
        return Outcome.skipped(unreadable_config(ctx, "parsers") + "; /parse_function_call and "
                               "/separate_reasoning are SGLang's")
    tcp = ctx.server_value("tool_call_parser")
    if tcp != PARSER:
        return Outcome.skipped(f"the server runs tool_call_parser {tcp!r}, not {PARSER} (/model_info): the parser "
                               "corpus is Kimi K2 output")
    what = "POST /parse_function_call"
    try:
        status, body = _post(ctx, "/parse_function_call", {"text": "", "tools": [], "tool_call_parser": tcp})
    except httpx.TransportError as exc:
        return Outcome.failed(transport_failure(exc, what))
    if status in ABSENT:
        return Outcome.skipped(f"{what} answered HTTP {status}: this server does not expose SGLang's parser "
                               "endpoints")
    if status != 200:
        return Outcome.failed(status_finding(what, status, body, key_sent=bool(ctx.clients.api_key)))
    return None


def _tools(name: str) -> list[dict[str, Any]]:
    return corpus()["toolsets"][name]


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _leaks(text: Any, field: str) -> list[Finding]:
    found = leaks.scan(text if isinstance(text, str) else None, field)
    if not found:
        return []
    leak = found[0]
    return [Finding("markup_leak", f"{leak.family} {leak.marker!r} left in the parser's {field}"
                    + (f" (+{len(found) - 1} more)" if len(found) > 1 else ""), clip(leak.excerpt(text)))]


def judge_calls(calls: Any, expected: list[list[Any]], tools: list[dict[str, Any]]) -> list[Finding]:
    """Findings for the parser's ``calls`` against the ``[name, arguments]`` the rule attributes.

    In order: a call to the expected tool with the expected arguments is right; one given to
    another tool of the request is ``wrong_tool``, to a tool not in the request ``unknown_tool``;
    expected calls not returned are ``tool_call_dropped``; other arguments ``invalid_arguments``.
    """
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        return [Finding("server_error", "the parser's calls are not a list of objects", clip_body(calls))]
    names = {t["function"]["name"] for t in tools}
    want = [(n, a) for n, a in expected]
    out: list[Finding] = []
    j = 0
    for call in calls:
        name, args = call.get("name"), _arguments(call.get("parameters"))
        later = [k for k in range(j, len(want)) if want[k][0] == name]
        if later:
            k = later[0]
            for missed in want[j:k]:
                out.append(_dropped(missed))
            if args != want[k][1] and not _same_decoded(args, want[k][1]):
                out.append(Finding("invalid_arguments", f"the call to {name} came back with other arguments than "
                                   "the model wrote", clip(f"{call.get('parameters')!r} vs {json.dumps(want[k][1])}")))
            j = k + 1
        elif name not in names:
            out.append(Finding("unknown_tool", f"the parser returned a call to {name!r}, not a tool of the request "
                               f"({', '.join(sorted(names))})", clip(json.dumps(call))))
        else:
            due = f"the rule attributes it to {want[j][0]}" if j < len(want) else "the rule drops it"
            out.append(Finding("wrong_tool", f"the parser gave the call to {name}, a tool the model did not name "
                               f"({due}): an agent would run a tool nobody asked for", clip(json.dumps(call))))
    out.extend(_dropped(m) for m in want[j:])
    return out


def _same_decoded(args: Any, want: Any) -> bool:
    """The model wrote its arguments as a JSON-encoded string (tool-call-failures.md item 5): a parser
    that passes the string through and one that decodes it to the object both keep the call."""
    return isinstance(want, str) and _arguments(want) == args


def _dropped(missed: tuple[str, Any]) -> Finding:
    return Finding("tool_call_dropped", f"the rule attributes a call to {missed[0]}; the parser dropped it",
                   clip(json.dumps(missed[1])))


def _parse(ctx: Context, text: str, tools: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, list[Finding]]:
    what = "POST /parse_function_call"
    try:
        status, body = _post(ctx, "/parse_function_call",
                             {"text": text, "tools": tools, "tool_call_parser": ctx.server_value("tool_call_parser")})
    except httpx.TransportError as exc:
        return None, [transport_failure(exc, what)]
    if status != 200:
        return None, [status_finding(what, status, body, key_sent=bool(ctx.clients.api_key))]
    if not isinstance(body, dict) or "calls" not in body:
        return None, [Finding("server_error", f"{what} did not answer {{normal_text, calls}}", clip_body(body))]
    return body, []


def run_tool_case(ctx: Context, case: dict[str, Any]) -> Outcome:
    tools = _tools(case["tools"])
    body, findings = _parse(ctx, case["text"], tools)
    if body is None:
        return Outcome.judged(findings)
    findings = _leaks(body.get("normal_text"), "normal_text") + judge_calls(body["calls"], case["calls"], tools)
    return Outcome.judged(findings, _summary(body["calls"]))


def run_reasoning_case(ctx: Context, case: dict[str, Any]) -> Outcome:
    what = "POST /separate_reasoning"
    try:
        status, body = _post(ctx, "/separate_reasoning",
                             {"text": case["text"], "reasoning_parser": ctx.server_value("reasoning_parser")})
    except httpx.TransportError as exc:
        return Outcome.failed(transport_failure(exc, what))
    if status != 200:
        return Outcome.failed(status_finding(what, status, body, key_sent=bool(ctx.clients.api_key)))
    if not isinstance(body, dict) or not isinstance(body.get("text"), str):
        return Outcome.failed(Finding("server_error", f"{what} did not answer {{reasoning_text, text}}",
                                      clip_body(body)))
    reasoning = body.get("reasoning_text") or ""
    findings = _leaks(reasoning, "reasoning")
    if reasoning.strip() != case["reasoning"].strip():
        kind = "missing_reasoning" if not reasoning.strip() else "reasoning_leak"
        findings.append(Finding(kind, "the reasoning parser returned other reasoning than the model wrote",
                                clip(f"{reasoning!r} vs {case['reasoning']!r}")))
    detail = f"reasoning {clip(reasoning, 40)!r}"
    if case.get("calls") is not None:
        tools = _tools(case["tools"])
        parsed, more = _parse(ctx, body["text"], tools)
        findings += more
        if parsed is not None:
            findings += _leaks(parsed.get("normal_text"), "normal_text")
            findings += judge_calls(parsed["calls"], case["calls"], tools)
            detail += "; " + _summary(parsed["calls"])
    else:
        findings += _leaks(body["text"], "text")
    return Outcome.judged(findings, detail)


def _summary(calls: Any) -> str:
    if not isinstance(calls, list) or not calls:
        return "no call"
    return "calls: " + ", ".join(str(c.get("name")) for c in calls if isinstance(c, dict))


def run(ctx: Context, check_id: str, cache: dict) -> Outcome | None:
    """Run ``parser.<group>.<case>`` (one of :func:`check_ids`).

    Returns ``None`` when the tier (or the reasoning group) cannot run on this server and an
    earlier id of the run already reported why: one ``skip`` row per server, not one per case.
    """
    _, group, name = check_id.split(".", 2)
    blocked = _blocked(ctx, group, cache)
    if blocked is not None:
        scope, verdict = blocked
        reported = cache.setdefault("parser:reported", set())
        if scope in reported or "parser" in reported:
            return None
        reported.add(scope)
        return verdict
    cases = corpus()["tool_calls" if group == "tool_calls" else "reasoning"]
    case = next(c for c in cases if c["id"] == name)
    return run_tool_case(ctx, case) if group == "tool_calls" else run_reasoning_case(ctx, case)
