"""The ``health.*`` and ``config.*`` tiers: is the server up, and is it the server the profile describes.

Endpoints (SGLang 0.5.23, ``sglang/srt/entrypoints/http_server.py``): ``/health`` (or ``/ready``) for
liveness; readiness is :func:`kimi_deploy.wire.readiness.probe`'s verdict, the one ``status`` and
``restart`` give (``/health_generate`` runs a real 1-token generation; other servers: a 1-token chat
completion instead); ``/v1/models`` lists the served name; ``/model_info`` reports
``tool_call_parser``/``reasoning_parser``; ``/server_info`` every resolved server argument
(``tp_size``, ``speculative_*``) plus ``version``. Servers without ``/model_info`` (vLLM, Exo,
LiteLLM) get ``skip`` for the config tier; a 401/403 there is ``fail``/``http_error`` (a key is
needed). Checks that need a model name fail as ``http_error`` when ``/v1/models`` does not answer
200 and none was given (:func:`no_model`): the server is not OpenAI-compatible, or needs the key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import httpx

from kimi_deploy.check.client import GENERATION_TIMEOUT_FACTOR, auth_note, status_finding, status_label
from kimi_deploy.check.context import Context
from kimi_deploy.check.outcome import Outcome, transport_failure
from kimi_deploy.check.results import clip, clip_body
from kimi_deploy.check.completion_rules import Finding, completion_problem
from kimi_deploy.wire import readiness
from kimi_deploy.wire.readiness import web_page

_ok, _skip, _fail = Outcome.passed, Outcome.skipped, Outcome.failed


def _status_finding(ctx: Context, path: str, status: int, body: object) -> Finding:
    return status_finding(f"GET {path}", status, body, key_sent=bool(ctx.clients.api_key))


#: Liveness endpoints, tried in this order until one answers 2xx.
LIVE_PATHS = ("/health", "/ready", "/v1/models")


def health_live(ctx: Context) -> Outcome:
    """``/health`` (SGLang, vLLM, LiteLLM), else ``/ready``, else ``/v1/models`` answers 2xx (an HTML page does
    not count: :func:`web_page`).

    A 5xx, a 401/403 or a redirect (3xx, not followed) stops at that endpoint; when none answers 2xx, the detail and the evidence
    name every endpoint tried with its status (``GET /health 404, GET /ready 404, ...``), then the
    last body, whitespace-collapsed.
    """
    tried: list[tuple[str, int]] = []
    pages = 0
    for path in LIVE_PATHS:
        try:
            status, body = ctx.clients.get_json(path)
        except httpx.TransportError as exc:
            return _fail(transport_failure(exc, f"GET {path}"))
        if 200 <= status < 300 and web_page(body):  # a catch-all web server answers every path with a page
            pages += 1
            tried.append((path, status))
            continue
        if 200 <= status < 300:
            return _ok(f"GET {path}: HTTP {status}")
        found = _status_finding(ctx, path, status, body)
        if status >= 500 or status in (401, 403) or 300 <= status < 400:  # a redirect: where it points is the news
            return _fail(found)
        tried.append((path, status))
    labels = "; ".join(f"GET {p}: {status_label(st)}{', an HTML page' if 200 <= st < 300 else ''}"
                       for p, st in tried)
    answered = "2xx with anything but a web page" if pages else "2xx"
    detail = f"no health endpoint answered {answered} ({labels}): not an SGLang or OpenAI-compatible server?"
    codes = ", ".join(f"GET {p} {st}" for p, st in tried)
    kind = "invalid_response" if pages else found.kind
    return _fail(Finding(kind, detail, clip(f"{codes}; last body: {clip_body(body)}")))


def health_ready(ctx: Context) -> Outcome:
    """The readiness verdict (:func:`kimi_deploy.wire.readiness.probe`, the one ``status`` and ``restart --wait``
    give, in the same words): ``GET /health_generate`` (SGLang: a 1-token generation), else a 1-token chat
    completion to ``--model`` or the first model ``/v1/models`` lists.

    Not ready: the row's kind grades the decisive answer (a transport error: :func:`transport_failure`; a 2xx that
    is no chat.completion: :func:`completion_problem`'s ``invalid_response``; a status: :func:`status_finding`),
    its detail is the verdict's words (and the status finding's fix). No model name to ask: ``skip``, or
    :func:`no_model`'s failure when ``/v1/models`` did not answer 200.
    """
    c = ctx.clients
    generation = httpx.Timeout(c.deadline.bound(c.timeout * GENERATION_TIMEOUT_FACTOR),
                               connect=c.deadline.bound(c.timeout))
    verdict = readiness.probe(c.http, lambda: ctx.model or ctx.served_model(), timeout=c.deadline.bound(c.timeout),
                              generation_timeout=generation)
    if verdict.ready:
        return _ok(verdict.words)
    what = f"{verdict.method} {verdict.path}"
    if verdict.error is not None:
        found = transport_failure(verdict.error, what)
        return _fail(dataclasses.replace(found, detail=f"{verdict.words}: {found.detail}"))
    if verdict.model_missing:
        outcome = no_model(ctx)
        if outcome.status == "skip":
            return _skip(f"cannot tell: {verdict.reason}; give --model NAME")
        return outcome
    status, body = verdict.http_status or 0, verdict.body
    if 200 <= status < 300:  # POST answered 2xx with something that is no chat.completion
        found = completion_problem(body, clip_body(body)) or Finding("invalid_response", "", clip_body(body))
        return _fail(dataclasses.replace(found, detail=f"{verdict.words}: {found.detail}"))
    found = _status_finding(ctx, verdict.path, status, body)
    fix = found.detail.partition("; fix: ")[2]
    return _fail(dataclasses.replace(found, detail=verdict.words + (f"; fix: {fix}" if fix else "")))


def no_model(ctx: Context) -> Outcome:
    """A check that needs a model name and has none: ``fail``/``http_error`` when ``/v1/models`` did not
    answer 200 (not an OpenAI-compatible server, or a key is needed), ``skip`` when it lists no model."""
    answer = ctx.models_answer
    if answer is None or answer[0] == 200:
        return _skip("no model name: give --model, or the server lists none")
    status, body = answer
    found = status_finding("GET /v1/models", status, body, key_sent=bool(ctx.clients.api_key))
    if auth_note(status, bool(ctx.clients.api_key)) is None and not 300 <= status < 400:  # a redirect says where
        found = Finding("http_error", f"no model to send chat completions to: GET /v1/models answered "
                        f"{status_label(status)}, so this is not an OpenAI-compatible server; fix: check --base-url, "
                        "or pass --model NAME if the server serves chat completions without a model list",
                        clip(f"GET /v1/models {status}: not an OpenAI-compatible server; body: {clip_body(body)}"))
    return _fail(found)


def health_models(ctx: Context) -> Outcome:
    """``/v1/models`` lists the expected served model name; with none expected, it lists at least one
    (an empty list is ``fail``/``config_mismatch``: the checks that need a model would all skip)."""
    try:
        status, body = ctx.clients.get_json("/v1/models")
    except httpx.TransportError as exc:
        return _fail(transport_failure(exc, "GET /v1/models"))
    if status != 200:
        return _fail(_status_finding(ctx, "/v1/models", status, body))
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        return _fail(Finding("invalid_response", "GET /v1/models did not return an OpenAI model list",
                             clip_body(body)))
    ids = [m.get("id") for m in body["data"] if isinstance(m, dict)]
    if not ids and not ctx.expected_model:  # nothing served: every check that needs a model would skip, exit 0
        return _fail(Finding("config_mismatch", "GET /v1/models lists no model: the server serves nothing, so no "
                             "chat completion can be checked; fix: check the server's launch (--model-path, "
                             "--served-model-name), or pass --model NAME if it serves one it does not list",
                             clip_body(body)))
    if not ctx.expected_model:
        return _skip(f"no expected model name (give --model or --profile); served: {', '.join(map(str, ids))}")
    if ctx.expected_model in ids:
        return _ok(f"{ctx.expected_model} is served")
    return _fail(Finding("config_mismatch", f"{ctx.expected_model} is not among the served models",
                         clip(", ".join(map(str, ids)))))


def unreadable_config(ctx: Context, what: str) -> str:
    """Why a config check skips on a server without SGLang's ``/model_info``/``/server_info``: which
    server it is (:meth:`Context.identify`) and what covers the setting instead."""
    kind = ctx.identify()
    if kind == "vllm":
        version = f" {ctx.server_version}" if ctx.server_version else ""
        return (f"vLLM{version} (/v1/models owned_by 'vllm') reports no server arguments (no /model_info or "
                f"/server_info): its {what} cannot be compared with the profile; the contract tier tests its effect")
    return (f"the server is not SGLang (no /model_info or /server_info): its {what} cannot be compared with the "
            "profile; the contract tier tests its effect")


def _config_compare(ctx: Context, what: str, pairs: list[tuple[str, object]]) -> Outcome:
    """Compare profile values with the server's (``pairs``: SGLang argument name, expected value)."""
    if ctx.profile is None:
        return _skip(f"no profile: nothing to compare the running {what} with")
    ctx.load_facts()
    if ctx.model_info is None and ctx.server_info is None:
        if ctx.facts_denied:  # 401/403: the facts exist but need the key; a profile expects them
            path, status = ctx.facts_denied
            return _fail(_status_finding(ctx, path, status, ""))
        if ctx.facts_refused:  # it answered, unreadably: a hostile or broken server is no reason to skip
            return _fail(ctx.facts_refused)
        return _skip(unreadable_config(ctx, what))
    mismatches, shown = [], []
    for name, expected in pairs:
        source = [s for s in (ctx.model_info, ctx.server_info) if s and name in s]
        if not source:
            return _skip(f"the server does not report {name}")
        actual = source[0][name]
        shown.append(f"{name}={actual}")
        if actual != expected:
            mismatches.append(f"{name}: running {actual!r}, profile {expected!r}")
    if mismatches:
        return _fail(Finding("config_mismatch", f"{what} differs from the profile: " + "; ".join(mismatches),
                             clip("; ".join(mismatches))))
    return _ok(", ".join(shown))


def config_tool_call_parser(ctx: Context) -> Outcome:
    """The running ``--tool-call-parser`` (``/model_info``) equals the profile's (``None`` included)."""
    return _config_compare(ctx, "tool-call parser",
                           [("tool_call_parser", ctx.profile.sglang.tool_call_parser if ctx.profile else None)])


def config_reasoning_parser(ctx: Context) -> Outcome:
    """The running ``--reasoning-parser`` (``/model_info``) equals the profile's."""
    return _config_compare(ctx, "reasoning parser",
                           [("reasoning_parser", ctx.profile.sglang.reasoning_parser if ctx.profile else None)])


def config_speculative(ctx: Context) -> Outcome:
    """``speculative_algorithm`` and, when set, steps/topk/draft tokens (``/server_info``) equal the profile's."""
    if ctx.profile is None:
        return _skip("no profile: nothing to compare the running speculative settings with")
    s = ctx.profile.sglang
    pairs: list[tuple[str, object]] = [("speculative_algorithm", s.speculative_algorithm)]
    if s.speculative_algorithm:
        pairs += [("speculative_num_steps", s.speculative_num_steps),
                  ("speculative_eagle_topk", s.speculative_eagle_topk),
                  ("speculative_num_draft_tokens", s.speculative_num_draft_tokens)]
        pairs = [(k, v) for k, v in pairs if v is not None]
    return _config_compare(ctx, "speculative decoding", pairs)


def config_tp_size(ctx: Context) -> Outcome:
    """``tp_size`` (``/server_info``) equals the profile's."""
    return _config_compare(ctx, "tensor parallelism", [("tp_size", ctx.profile.sglang.tp_size if ctx.profile else None)])


CHECKS: dict[str, Callable[[Context], Outcome]] = {
    "health.live": health_live,
    "health.ready": health_ready,
    "health.models": health_models,
    "config.tool_call_parser": config_tool_call_parser,
    "config.reasoning_parser": config_reasoning_parser,
    "config.speculative": config_speculative,
    "config.tp_size": config_tp_size,
}
