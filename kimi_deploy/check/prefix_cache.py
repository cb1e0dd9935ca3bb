"""``contract.prefix_cache``: the same long prompt twice; the second must hit the prefix cache and, where the server
is deterministic, answer the same.

SGLang 0.5.21 made the Rust prefix cache the default (release notes): an upgrade can change cache behaviour, and a
cache that never hits, or that returns another answer for a cached prefix, passes every tool-call check. Two
identical non-streamed requests (:data:`PROMPT`, about :data:`PROMPT_TOKENS` tokens; ``max_tokens``
:data:`ANSWER_TOKENS`), the contract's sampling (temperature 0, or the model's required sampling):

- the second's ``usage.prompt_tokens_details.cached_tokens`` must be above 0 (SGLang reports it with
  ``--enable-cache-report``, vLLM with ``--enable-prompt-tokens-details``; a server that reports no
  ``prompt_tokens_details`` skips this half): ``prefix_cache_miss``;
- when the server runs deterministic inference (SGLang ``/server_info`` ``enable_deterministic_inference``) and the
  requests are greedy, the two answers' content must be equal: ``prefix_cache_mismatch``. Elsewhere temperature 0
  is not bit-exact across batches (batch-variant kernels), so a difference proves nothing: the detail says so.
"""

from __future__ import annotations

from typing import Any

from kimi_deploy.check.context import Context
from kimi_deploy.check.outcome import Outcome, chat_once
from kimi_deploy.check.results import clip
from kimi_deploy.check.completion_rules import Finding, message_from_completion

CHECK_ID = "contract.prefix_cache"
#: The prompt's approximate length in tokens: several KV pages at SGLang's page sizes (1 to 64 tokens), well past
#: any minimum a cache needs, small enough for a second of prefill.
PROMPT_TOKENS = 2000
ANSWER_TOKENS = 24
_LINE = "Record {0:04d}: the service on host node-{1:02d} answered {2} requests in {3} ms with status ok.\n"
#: About :data:`PROMPT_TOKENS` tokens of distinct lines (~20 tokens each), then the question.
PROMPT = "".join(_LINE.format(i, i % 17, 100 + 7 * i, 20 + i % 13) for i in range(PROMPT_TOKENS // 20)) + \
    "\nWhich record has the largest number of requests? Answer with its record number only."


def _ask(ctx: Context) -> tuple[dict[str, Any] | None, Finding | None]:
    return chat_once(ctx, messages=[{"role": "user", "content": PROMPT}], max_tokens=ANSWER_TOKENS, **ctx.sampling,
                     extra_body={"chat_template_kwargs": {"thinking": False}})


def cached_tokens(data: dict[str, Any]) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` (OpenAI API), ``None`` when the answer does not report it."""
    details = (data.get("usage") or {}).get("prompt_tokens_details")
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def run(ctx: Context) -> Outcome:
    """Run ``contract.prefix_cache`` (module docstring)."""
    first, finding = _ask(ctx)
    if finding is None:
        second, finding = _ask(ctx)
    if finding is not None:
        return Outcome.failed(finding)
    assert first is not None and second is not None
    cached = cached_tokens(second)
    prompt = (second.get("usage") or {}).get("prompt_tokens")
    a, b = message_from_completion(first), message_from_completion(second)
    deterministic = ctx.server_value("enable_deterministic_inference") is True and ctx.sampling.get("temperature") == 0
    if cached is not None and cached <= 0:
        return Outcome.failed(Finding("prefix_cache_miss", f"the same {prompt or '?'}-token prompt sent twice: the "
                                                           "second reports 0 cached tokens (the prefix cache did "
                                                           "not hit)",
                                      clip(f"prompt_tokens={prompt}; prompt_tokens_details="
                                           f"{(second.get('usage') or {}).get('prompt_tokens_details')}")))
    if deterministic and (a.content or "") != (b.content or ""):
        return Outcome.failed(Finding("prefix_cache_mismatch", "deterministic inference on, temperature 0: the "
                                                               "answer from the cached prefix differs from the first",
                                      clip(f"first {a.content!r}; second {b.content!r}")))
    hit = f"{cached} of {prompt} prompt tokens cached on the second" if cached is not None else \
        "cached tokens not reported (SGLang --enable-cache-report, vLLM --enable-prompt-tokens-details)"
    same = ("answers equal" if (a.content or "") == (b.content or "") else "answers differ") + \
        ("" if deterministic else " (not compared: the server does not report deterministic inference)")
    if cached is None and not deterministic:
        return Outcome.skipped(f"{hit}; {same}")
    return Outcome.passed(f"{hit}; {same}")
