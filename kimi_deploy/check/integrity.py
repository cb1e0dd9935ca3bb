"""Reasoning integrity: is the answer split right around the think tags? Rules and rates.

Kimi's templates pre-fill ``<think>``, so the model's output starts inside its reasoning; a server whose reasoning
parser is missing or wrong hands clients no opening tag, an empty ``content``, or the reasoning inside ``content``
(ktransformers issue 1820, smg issues 1873/1868, dynamo issue 11653; for K3, 127 of 700 answers had empty content
before sgl-project/sglang PR 33995). Three rules, per answer (:func:`judge`):

- ``think_leak``: ``content`` carries a think tag (``<think>``, ``</think>``), or repeats the reasoning verbatim
  (at least :data:`MIN_REPEAT` characters of it: a parser that returned the reasoning twice);
- ``empty_stop``: ``finish_reason`` ``stop``, no call, and no text in ``content`` where an answer was due;
- ``missing_reasoning``: thinking on (a reasoning parser is expected and the request did not switch it off) and
  no ``reasoning_content``/``reasoning``.

The contract tier judges each answer with bar 0 (one answer is enough: ``markup_leak``, ``empty_answer``,
``missing_reasoning``). Over a sample (``quality.reasoning``, :func:`rates`) each rule's rate is compared with its
bar; the default bar is 0 for each, as smg-project/providers-verifier requires of a think-leak rate.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from kimi_deploy.check.results import clip

#: The rules, in report order: ``name -> what it means`` (one line, for the report and the docs).
RULES: dict[str, str] = {
    "think_leak": "a think tag, or the reasoning itself, in content",
    "empty_stop": "finish_reason stop with neither content nor a call",
    "missing_reasoning": "thinking on but no reasoning_content/reasoning",
}

#: Characters of reasoning that, found again in ``content``, count as the reasoning leaked into it: long enough
#: that an answer quoting a short thought ("Yes.") is not one.
MIN_REPEAT = 40

_THINK_TAG = re.compile(r"</?think>")


@dataclasses.dataclass(frozen=True)
class Breach:
    """One rule an answer broke: ``rule`` (a key of :data:`RULES`) and the offending text, cut."""

    rule: str
    evidence: str


def judge(content: str | None, reasoning: str | None, *, finish_reason: str | None, has_calls: bool,
          thinking: bool | None) -> list[Breach]:
    """The rules one answer breaks (module docstring). ``thinking``: ``True`` when reasoning is due, ``False``
    or ``None`` when it is not checked."""
    out: list[Breach] = []
    text = content or ""
    tag = _THINK_TAG.search(text)
    thought = (reasoning or "").strip()
    if tag:
        out.append(Breach("think_leak", clip(text[max(0, tag.start() - 40):tag.start() + 80])))
    elif len(thought) >= MIN_REPEAT and thought[:MIN_REPEAT] in text:
        out.append(Breach("think_leak", clip(text[text.index(thought[:MIN_REPEAT]):])))
    if finish_reason == "stop" and not has_calls and not text.strip():
        out.append(Breach("empty_stop", clip(f"finish_reason=stop; content={content!r}; reasoning "
                                             f"{len(thought)} chars; no tool_calls")))
    if thinking is True and not thought:
        out.append(Breach("missing_reasoning", clip(f"content={clip(text, 80)!r}; no reasoning")))
    return out


def thinking_on(body: dict[str, Any], reasoning_expected: bool) -> bool | None:
    """Whether reasoning is due in the answer to ``body`` (a chat request): ``None`` when no reasoning parser is
    expected, else ``False`` when ``chat_template_kwargs`` switches thinking off (``thinking`` or
    ``enable_thinking`` false), ``True`` otherwise (Kimi's templates think by default)."""
    if not reasoning_expected:
        return None
    kwargs = body.get("chat_template_kwargs") or (body.get("extra_body") or {}).get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        return True
    return not any(kwargs.get(k) is False for k in ("thinking", "enable_thinking"))


def rates(breaches: list[list[Breach]], bars: dict[str, float], *, thinking_answers: int) -> dict[str, Any]:
    """The report's ``reasoning`` object over the answers' ``breaches`` (one list per answer): per rule the
    count, the answers it was judged on (``missing_reasoning``: only those with thinking on), the rate, its
    bar and the first evidence; ``verdict`` ``fail`` when any rate is over its bar, ``no_sample`` without
    answers, else ``pass``."""
    answers = len(breaches)
    out: dict[str, Any] = {"answers": answers, "rules": {}}
    failed = False
    for rule, meaning in RULES.items():
        hits = [b for found in breaches for b in found if b.rule == rule]
        base = thinking_answers if rule == "missing_reasoning" else answers
        rate = len(hits) / base if base else 0.0
        bar = bars.get(rule, 0.0)
        over = bool(base) and rate > bar
        failed = failed or over
        out["rules"][rule] = {"count": len(hits), "of": base, "rate": round(rate, 6), "bar": bar,
                              "verdict": "fail" if over else "pass", "means": meaning,
                              "evidence": hits[0].evidence if hits else ""}
    out["verdict"] = "no_sample" if not answers else "fail" if failed else "pass"
    return out
