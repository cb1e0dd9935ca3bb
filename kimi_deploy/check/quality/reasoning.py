"""``quality.reasoning``: reasoning-integrity rates over the quality sample (:mod:`kimi_deploy.check.integrity`).

It judges the answers ``quality.accuracy`` collected in the same run (the same requests: one sample, two
verdicts); selected alone it sends the sample itself. Each rule's rate is compared with its bar (``[quality]
max_think_leak_rate``, ``max_empty_stop_rate``, ``max_missing_reasoning_rate``; 0 by default, the think-leak bar of
smg-project/providers-verifier). The report's ``quality.reasoning`` object holds every rate, its bar and the first
evidence.
"""

from __future__ import annotations

from kimi_deploy.check.context import Context
from kimi_deploy.check.outcome import Outcome
from kimi_deploy.check.quality import accuracy
from kimi_deploy.check.quality.settings import QualitySettings
from kimi_deploy.check.completion_rules import Finding

CHECK_ID = "quality.reasoning"

#: The failure kind of each rule over its bar, most telling first.
KINDS: dict[str, str] = {"think_leak": "think_leak", "empty_stop": "empty_answer",
                         "missing_reasoning": "missing_reasoning"}


def _percent(rate: float) -> str:
    return f"{100 * rate:.2f} %"


def outcome(rates: dict) -> Outcome:
    """The verdict on the report's ``reasoning`` object (:func:`kimi_deploy.check.integrity.rates`)."""
    if rates["verdict"] == "no_sample":
        return Outcome.skipped("no answer in the sample to judge (quality.accuracy got none)")
    parts = [f"{rule} {r['count']} of {r['of']} ({_percent(r['rate'])}, bar {_percent(r['bar'])})"
             for rule, r in rates["rules"].items()]
    text = f"{rates['answers']} answers: " + "; ".join(parts)
    for rule, kind in KINDS.items():
        r = rates["rules"][rule]
        if r["verdict"] == "fail":
            return Outcome.failed(Finding(kind, f"{text}: {rule} ({r['means']}) is over its bar", r["evidence"]))
    return Outcome.passed(text)


def run(ctx: Context) -> Outcome:
    """Run ``quality.reasoning`` on the run's sample (measured here when ``quality.accuracy`` did not run)."""
    if "reasoning" not in ctx.quality_results:
        settings = ctx.quality or QualitySettings()
        acc, samples = accuracy.measure(ctx, settings)
        accuracy.keep(ctx, acc, samples, settings)
    return outcome(ctx.quality_results["reasoning"])
