"""``quality.preflight.*``: the Kimi pre-flight checks every vendor passes before benchmarks (Kimi Vendor Verifier).

- ``thinking_on`` / ``thinking_off``: ``chat_template_kwargs: {"thinking": true|false}`` (the switch of
  open-source deployments, Kimi Vendor Verifier ``verify_params.py`` ``get_thinking_extra_body``) gives reasoning,
  and none; a server that ignores the switch fails with ``thinking_switch``. Skipped where no reasoning parser is
  expected (as ``contract.reasoning_*``).
- ``sampling.thinking`` / ``sampling.instant``: the server's default sampling (what a request without
  ``temperature``/``top_p`` gets) against the model's recommended values: temperature 1.0 thinking / 0.6 instant,
  top_p 0.95 (Kimi Vendor Verifier ``verify_params.py`` ``IMMUTABLE_PARAMS``),
  the thinking-mode values taken from the model's own ``generation_config.json`` when ``--model-dir`` has one.
  The server's default is read from what SGLang reports in ``/server_info``: ``sampling_defaults`` (``model``:
  the checkpoint's ``generation_config.json`` fills what a request leaves out; anything else: the framework's
  temperature 1.0, top_p 1.0) and ``preferred_sampling_params`` (a JSON object that overrides both). SGLang has one
  default for both modes, so in instant mode a server default equal to the thinking-mode recommendation passes (the
  client sends 0.6); any other value fails with ``sampling_defaults``. Skipped on servers that do not report their
  defaults (vLLM, proxies).
- ``prompt_tokens``: ``usage.prompt_tokens`` of known requests (one plain, one with a tool declaration) equals the
  count of the model's own tokenizer and chat template, computed in SGLang's interpreter the way SGLang 0.5.23's
  serving_chat.py renders a request (tools as ``[tool.model_dump()]`` through SGLang's own request model, the
  OpenAI wrapper included; the flat ``function`` objects if the template refuses those), through
  :func:`kimi_deploy.engine.run_script`;
  an off-by-N count fails with ``prompt_tokens_mismatch``. Skipped with the reason when the model's files or the
  interpreter are not on this host.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import openai

from kimi_deploy import engine as target
from kimi_deploy.catalog.models import identify
from kimi_deploy.check.context import Context
from kimi_deploy.check.contract import GET_WEATHER, REPLY_TOKENS
from kimi_deploy.check.outcome import Outcome, chat_once, openai_failure, unreadable
from kimi_deploy.check.results import clip
from kimi_deploy.check.completion_rules import Finding, message_from_completion
from kimi_deploy.errors import KimiDeployError
from kimi_deploy.wire.inputs import read_regular

CHECK_IDS = ("quality.preflight.thinking_on", "quality.preflight.thinking_off", "quality.preflight.sampling.thinking",
             "quality.preflight.sampling.instant", "quality.preflight.sampling.required", "quality.preflight.prompt_tokens")

#: Sampling outside what a model's own API accepts, sent by ``sampling.required`` to see whether the server refuses it.
OUTSIDE_SAMPLING = {"temperature": 0.3, "top_p": 0.5}

#: The model's recommended sampling per mode (Kimi Vendor Verifier verify_params.py, IMMUTABLE_PARAMS).
RECOMMENDED: dict[str, dict[str, float]] = {"thinking": {"temperature": 1.0, "top_p": 0.95},
                                            "instant": {"temperature": 0.6, "top_p": 0.95}}
#: SGLang's own defaults when neither the model nor --preferred-sampling-params gives one (SamplingParams).
FRAMEWORK_DEFAULTS = {"temperature": 1.0, "top_p": 1.0}

QUESTION = "Is 17 a prime number? Answer yes or no."

#: The known requests of ``prompt_tokens``: a plain one and one with a tool declaration (where a template or
#: tool rendering that differs from the model's shows first).
KNOWN_REQUESTS: tuple[dict[str, Any], ...] = (
    {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                  {"role": "user", "content": "Say hello in one short sentence."}]},
    {"messages": [{"role": "user", "content": "What is the weather in Paris, France?"}], "tools": [GET_WEATHER]},
)

#: Runs in SGLang's interpreter. argv[1]: the model directory; argv[2]: JSON list of request bodies.
PROMPT_TOKENS_SCRIPT = r"""
import json, sys
from transformers import AutoTokenizer
model_dir, bodies = sys.argv[1], json.loads(sys.argv[2])
tok = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=True)
try:
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
except Exception:
    ChatCompletionRequest = None
counts = []
for body in bodies:
    tools = None
    if body.get("tools") and body.get("tool_choice") != "none":
        if ChatCompletionRequest is not None:
            req = ChatCompletionRequest(model="m", **body)
            tools = [item.model_dump() for item in req.tools]
        else:
            tools = [dict(t) for t in body["tools"]]
    kwargs = body.get("chat_template_kwargs") or {}
    def render(tools):
        ids = tok.apply_chat_template(body["messages"], tokenize=True, add_generation_prompt=True, tools=tools,
                                      **kwargs)
        return ids["input_ids"] if hasattr(ids, "keys") else ids
    try:
        ids = render(tools)
    except Exception:  # as serving_chat.py: some templates want the flat function-only form
        ids = render([t["function"] if "function" in t else t for t in tools] if tools else None)
    counts.append(len(ids))
print(json.dumps({"counts": counts}))
"""


def check_ids() -> list[str]:
    return list(CHECK_IDS)


def _chat(ctx: Context, **kwargs: Any) -> tuple[Any, Finding | None]:
    """One non-streamed request; ``(completion dict, None)`` or ``(None, finding)``."""
    return chat_once(ctx, **kwargs)


def thinking(ctx: Context, on: bool) -> Outcome:
    """``thinking_on``/``thinking_off`` (module docstring)."""
    if not ctx.reasoning_parser:
        return Outcome.skipped("no reasoning parser expected (profile) or reported (/model_info): the switch "
                               "cannot be told from the answer")
    data, finding = _chat(ctx, messages=[{"role": "user", "content": QUESTION}], max_tokens=REPLY_TOKENS,
                          extra_body={"chat_template_kwargs": {"thinking": on}})
    if finding is not None:
        return Outcome.failed(finding)
    msg = message_from_completion(data)
    reasoning = (msg.reasoning or "").strip()
    content = (msg.content or "").strip()
    if on and not reasoning:
        inline = " (a <think> block is in content: the reasoning parser did not separate it)" \
            if "<think>" in content or "</think>" in content else ""
        return Outcome.failed(Finding("thinking_switch", f"chat_template_kwargs.thinking=true gave no reasoning "
                                                         f"(reasoning_content/reasoning empty){inline}", clip(content)))
    if not on and reasoning:
        return Outcome.failed(Finding("thinking_switch", "chat_template_kwargs.thinking=false still gave reasoning "
                                                         f"({len(reasoning)} characters)", clip(reasoning)))
    if not on and not content:
        return Outcome.failed(Finding("thinking_switch", "chat_template_kwargs.thinking=false gave no content "
                                                         f"(finish_reason {msg.finish_reason!r})",
                                      clip(f"content={msg.content!r}"), ))
    return Outcome.passed(f"thinking={'true' if on else 'false'}: reasoning {len(reasoning)} characters, content "
                          f"{clip(content, 40)!r}")


def generation_config(model_dir: str | None) -> dict[str, float] | None:
    """``temperature``/``top_p`` of ``model_dir``'s ``generation_config.json`` (those it sets); ``None`` when the
    file is absent or unreadable."""
    if not model_dir:
        return None
    try:
        data = json.loads(read_regular(Path(model_dir) / "generation_config.json"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    return {k: float(data[k]) for k in ("temperature", "top_p")
            if isinstance(data.get(k), (int, float)) and not isinstance(data.get(k), bool)}


def server_defaults(ctx: Context, model_config: dict[str, float] | None) -> tuple[dict[str, float] | None, str]:
    """The server's default ``temperature``/``top_p`` and where they come from, or ``(None, why not)``."""
    ctx.load_facts()
    info = ctx.server_info
    if ctx.identify() != "sglang" or not isinstance(info, dict):
        return None, "the server does not report its default sampling (SGLang's /server_info does)"
    mode = info.get("sampling_defaults", "model")
    preferred = info.get("preferred_sampling_params")
    if isinstance(preferred, str):
        try:
            preferred = json.loads(preferred)
        except ValueError:
            preferred = None
    preferred = {k: float(v) for k, v in (preferred or {}).items() if k in FRAMEWORK_DEFAULTS
                 and isinstance(v, (int, float)) and not isinstance(v, bool)} if isinstance(preferred, dict) else {}
    out = dict(FRAMEWORK_DEFAULTS)
    source = f"sampling_defaults={mode}"
    if mode == "model":
        if model_config is None and set(preferred) != set(FRAMEWORK_DEFAULTS):
            return None, ("SGLang takes its defaults from the model's generation_config.json (sampling_defaults="
                          "model), which is not on this host: pass --model-dir DIR (or a profile whose model_path "
                          "is a directory here)")
        out.update(model_config or {})
        source += " (generation_config.json)"
    if preferred:
        out.update(preferred)
        source += f", preferred_sampling_params {json.dumps(preferred)}"
    return out, source


def sampling(ctx: Context, mode: str) -> Outcome:
    """``sampling.thinking`` / ``sampling.instant`` (module docstring)."""
    model_config = generation_config(ctx.quality.model_dir if ctx.quality else None)
    recommended = dict(RECOMMENDED[mode])
    origin = "Kimi Vendor Verifier's documented defaults"
    if mode == "thinking" and model_config:
        recommended.update(model_config)
        origin = "the model's generation_config.json"
    server, source = server_defaults(ctx, model_config)
    if server is None:
        return Outcome.skipped(source)
    wrong = []
    for key, want in recommended.items():
        got = server[key]
        also = RECOMMENDED["thinking"][key] if mode == "instant" and key == "temperature" else None
        if not (math.isclose(got, want, abs_tol=1e-6) or (also is not None and math.isclose(got, also, abs_tol=1e-6))):
            wrong.append(f"{key} {got:g} (recommended {want:g})")
    shown = ", ".join(f"{k} {v:g}" for k, v in server.items())
    if wrong:
        return Outcome.failed(Finding("sampling_defaults", f"{mode} mode: the server's default {'; '.join(wrong)}, "
                                                           f"from {source}; recommended by {origin}",
                                      clip(f"{source}: {shown}")))
    note = "; SGLang has one default for both modes: clients send temperature 0.6 with thinking off" \
        if mode == "instant" and not math.isclose(server["temperature"], 0.6, abs_tol=1e-6) else ""
    return Outcome.passed(f"{mode} mode: {shown} ({source}){note}")


def expected_prompt_tokens(python: str, model_dir: str, bodies: list[dict[str, Any]]) -> list[int]:
    """The prompt-token count of each body with the model's tokenizer and chat template, in SGLang's interpreter.

    Raises:
        KimiDeployError: the interpreter is missing or the script failed (``UsageError``/``ExternalCommandError``).
    """
    data = target.run_script(python, PROMPT_TOKENS_SCRIPT, [model_dir, json.dumps(bodies)], timeout=120,
                             label="prompt-tokens")
    return [int(n) for n in data["counts"]]


def prompt_tokens(ctx: Context) -> Outcome:
    """``prompt_tokens`` (module docstring)."""
    settings = ctx.quality
    model_dir = settings.model_dir if settings else None
    python = settings.sglang_python if settings else None
    if not model_dir or not (Path(model_dir) / "tokenizer_config.json").is_file():
        return Outcome.skipped("the model's tokenizer files are not on this host: pass --model-dir DIR (the model "
                               "directory with tokenizer_config.json) to count prompt tokens")
    if not python:
        return Outcome.skipped("no SGLang interpreter to count prompt tokens in: pass --sglang-python or a profile")
    bodies = [dict(b) for b in KNOWN_REQUESTS]
    try:
        expected = expected_prompt_tokens(python, model_dir, bodies)
    except KimiDeployError as exc:
        return Outcome.skipped(f"the model's tokenizer could not count prompt tokens here: {clip(exc, 200)}")
    notes = []
    for body, want in zip(bodies, expected):
        data, finding = _chat(ctx, max_tokens=1, **body)
        if finding is not None:
            return Outcome.failed(finding)
        got = (data.get("usage") or {}).get("prompt_tokens")
        what = "the request with a tool declaration" if body.get("tools") else "the plain request"
        if got != want:
            off = f"off by {got - want:+d}" if isinstance(got, int) else "not a count"
            return Outcome.failed(Finding("prompt_tokens_mismatch", f"usage.prompt_tokens of {what} is {got!r}, the "
                                                                    f"model's tokenizer and chat template give {want} "
                                                                    f"({off})", clip(f"prompt_tokens={got!r}; "
                                                                                     f"expected {want}")))
        notes.append(str(got))
    return Outcome.passed(f"usage.prompt_tokens {', '.join(notes)} as the model's tokenizer and chat template count")


def sampling_required(ctx: Context) -> Outcome:
    """``sampling.required``: for a model whose own API refuses any sampling but its own
    (:meth:`kimi_deploy.catalog.models.Sampling.request`; K2.7-Code: temperature 1.0, top_p 0.95), send
    :data:`OUTSIDE_SAMPLING` once: a 4xx passes (the server refuses it too), an answer is ``sampling_not_enforced``
    (clients that send other sampling get answers the model's own API would never give). Skipped for other models."""
    names = (ctx.profile.sglang.model_path, ctx.profile.sglang.served_model_name) if ctx.profile is not None else ()
    model = identify(*names, ctx.model)
    required = model.sampling.request() if model is not None else None
    if model is None or not required:
        return Outcome.skipped(f"{model.name if model else ctx.model or 'the model'}: its own API accepts any "
                               "sampling (no rule in the model catalog)")
    shown = ", ".join(f"{k} {v:g}" for k, v in OUTSIDE_SAMPLING.items())
    rule = ", ".join(f"{k} {v:g}" for k, v in required.items())
    try:
        ctx.clients.chat(model=ctx.model, messages=[{"role": "user", "content": QUESTION}], max_tokens=16,
                         **OUTSIDE_SAMPLING)
    except openai.APIStatusError as exc:
        if 400 <= exc.status_code < 500 and exc.status_code not in (401, 403):
            return Outcome.passed(f"{shown} refused with HTTP {exc.status_code}, as {model.name}'s own API "
                                  f"refuses anything but {rule}")
        return Outcome.failed(openai_failure(exc, "POST /v1/chat/completions", streaming=False,
                                             raw=ctx.clients.recorder.last_text))
    except openai.OpenAIError as exc:
        return Outcome.failed(openai_failure(exc, "POST /v1/chat/completions", streaming=False,
                                             raw=ctx.clients.recorder.last_text))
    except (ValueError, TypeError, RecursionError) as exc:
        return Outcome.failed(unreadable(exc, "POST /v1/chat/completions", ctx.clients.recorder.last_body))
    return Outcome.failed(Finding("sampling_not_enforced", f"the server answered a request with {shown}, which "
                                                           f"{model.name}'s own API refuses (only {rule})",
                                  clip(ctx.clients.recorder.last_text)))


def run(ctx: Context, check_id: str) -> Outcome:
    """Run the pre-flight check ``check_id`` (one of :data:`CHECK_IDS`)."""
    name = check_id.removeprefix("quality.preflight.")
    if name in ("thinking_on", "thinking_off"):
        return thinking(ctx, name == "thinking_on")
    if name == "sampling.required":
        return sampling_required(ctx)
    if name.startswith("sampling."):
        return sampling(ctx, name.split(".", 1)[1])
    return prompt_tokens(ctx)
