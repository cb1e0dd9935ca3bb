"""``quality.certify``: the verdict a providers' certifier gives, on the run's quality sample.

smg-project/providers-verifier certifies a provider on tool-trigger F1 >= 0.98, tool-schema accuracy >= 0.98 and a
think-leak rate of 0, each request's verdict the majority over its repeats. This check applies those bars (the
defaults; ``[quality] min_tool_trigger_f1``, ``certify_min_schema_accuracy``, ``max_think_leak_rate`` set others) to
the answers ``quality.accuracy`` collected (``--repeats K`` sends every request K times; alone it sends the sample
itself):

- per request, the majority over its repeats (a tie counts as the failing verdict): did it trigger a call (an
  answer with ``finish_reason`` ``tool_calls``, or a named choice's calls ending ``stop``), were the calls valid
  against the schema, did content leak reasoning (:mod:`kimi_deploy.check.integrity`); requests whose every
  repeat got no answer are left out;
- tool-trigger F1 against whether a call was due (:func:`kimi_deploy.check.quality.accuracy.expects_call`:
  the body's ``_expect_tool_call``, else ``tool_choice``), with a 95 % percentile bootstrap interval over the
  requests (:data:`BOOTSTRAP` resamples, seeded: the same sample gives the same interval); schema accuracy over
  the requests that triggered, with its Wilson interval (:mod:`.stats`); the think-leak rate over the requests.

Verdict, as the kit's other sampled verdicts: a metric fails only when its whole interval lies below its bar
(``tool_trigger_low``, ``schema_accuracy_low``); the think-leak rate fails above its bar (``think_leak``).
"""

from __future__ import annotations

import random
from typing import Any

from kimi_deploy.check.context import Context
from kimi_deploy.check.outcome import Outcome
from kimi_deploy.check.quality import accuracy
from kimi_deploy.check.quality.settings import QualitySettings
from kimi_deploy.check.quality.stats import Proportion
from kimi_deploy.check.completion_rules import Finding

CHECK_ID = "quality.certify"
#: Bootstrap resamples of the F1 interval, and their seed.
BOOTSTRAP = 2000
SEED = 41


def _majority(votes: list[bool]) -> bool:
    """True when more than half of ``votes`` are (a tie is not a majority)."""
    return sum(votes) * 2 > len(votes)


def per_request(samples: list[Any], repeats: int) -> list[dict[str, Any]]:
    """One verdict per request (the majority over its answered repeats): ``expected``, ``triggered``, ``valid``
    (``None`` when it did not trigger), ``leak``."""
    groups: dict[int, list[Any]] = {}
    for s in samples:
        if s.answered:
            groups.setdefault(s.index // max(1, repeats), []).append(s)
    out = []
    for _, group in sorted(groups.items()):
        triggered = _majority([s.valid is not None for s in group])
        valid = _majority([s.valid is True for s in group if s.valid is not None]) if triggered else None
        out.append({"expected": group[0].expect_call, "triggered": triggered, "valid": valid,
                    "leak": _majority([any(b.rule == "think_leak" for b in s.breaches) for s in group])})
    return out


def f1(rows: list[dict[str, Any]]) -> float | None:
    """Tool-trigger F1 = 2TP / (2TP + FP + FN) (``None`` when nothing was due and nothing triggered)."""
    tp = sum(1 for r in rows if r["expected"] and r["triggered"])
    fp = sum(1 for r in rows if not r["expected"] and r["triggered"])
    fn = sum(1 for r in rows if r["expected"] and not r["triggered"])
    return 2 * tp / (2 * tp + fp + fn) if 2 * tp + fp + fn else None


def f1_interval(rows: list[dict[str, Any]]) -> tuple[float, float] | None:
    """The 95 % percentile bootstrap interval of :func:`f1` over ``rows`` (seeded)."""
    if f1(rows) is None:
        return None
    rng = random.Random(SEED)
    values = sorted(v for v in (f1([rows[rng.randrange(len(rows))] for _ in rows]) for _ in range(BOOTSTRAP))
                    if v is not None)
    return values[int(0.025 * (len(values) - 1))], values[int(0.975 * (len(values) - 1))]


def measure(rows: list[dict[str, Any]], settings: QualitySettings, repeats: int) -> dict[str, Any]:
    """The report's ``certify`` object: each metric's estimate, interval, bar and verdict, and the overall one."""
    est, interval = f1(rows), f1_interval(rows)
    called = [r for r in rows if r["triggered"]]
    schema = Proportion(sum(1 for r in called if r["valid"]), len(called))
    leaks = sum(1 for r in rows if r["leak"])
    trigger_bar, schema_bar = settings.min_tool_trigger_f1, settings.certify_min_schema_accuracy
    leak_bar = settings.max_think_leak_rate
    metrics = {
        "tool_trigger_f1": {"estimate": est, "lower": interval[0] if interval else None,
                            "upper": interval[1] if interval else None, "bar": trigger_bar, "method": "bootstrap",
                            "verdict": "fail" if interval and interval[1] < trigger_bar else "pass"},
        "tool_schema_accuracy": {"estimate": schema.estimate, "lower": schema.interval[0] if schema.n else None,
                                 "upper": schema.interval[1] if schema.n else None, "bar": schema_bar,
                                 "method": "wilson-score-cc",
                                 # no call to judge: no verdict of its own (never a pass on nothing)
                                 "verdict": "no_sample" if not schema.n else "fail"
                                 if schema.interval[1] < schema_bar else "pass"},
        "think_leak_rate": {"estimate": leaks / len(rows) if rows else None, "bar": leak_bar,
                            "verdict": "fail" if rows and leaks / len(rows) > leak_bar else "pass"},
    }
    verdict = "no_sample" if not rows else "fail" if any(m["verdict"] == "fail" for m in metrics.values()) \
        else "pass"
    return {"requests": len(rows), "repeats": repeats, "majority": "more than half of a request's answered repeats",
            "source": "smg-project/providers-verifier bars", **metrics, "verdict": verdict}


def _text(m: dict[str, Any], name: str) -> str:
    if m["estimate"] is None:
        return f"{name} n/a (bar {m['bar']:g})"
    span = f" [{m['lower']:.4f}, {m['upper']:.4f}]" if m.get("lower") is not None else ""
    return f"{name} {m['estimate']:.4f}{span} (bar {m['bar']:g})"


def outcome(cert: dict[str, Any]) -> Outcome:
    """The verdict on the report's ``certify`` object."""
    if cert["verdict"] == "no_sample":
        return Outcome.skipped("no answered request in the sample to certify")
    f, s, t = cert["tool_trigger_f1"], cert["tool_schema_accuracy"], cert["think_leak_rate"]
    text = (f"{cert['requests']} requests x {cert['repeats']} (majority of repeats): "
            + "; ".join([_text(f, "tool-trigger F1 >="), _text(s, "schema accuracy >="),
                         f"think-leak rate {t['estimate']:.4f} (bar <= {t['bar']:g})"]))
    for metric, kind in KINDS.items():
        if cert[metric]["verdict"] == "fail":
            return Outcome.failed(Finding(kind, f"{text}: {metric} misses the certifier's bar", text))
    return Outcome.passed(text)


#: The failure kind of each of the certifier's metrics that misses its bar, in the order they are judged.
KINDS: dict[str, str] = {"tool_trigger_f1": "tool_trigger_low", "tool_schema_accuracy": "schema_accuracy_low",
                         "think_leak_rate": "think_leak"}


def run(ctx: Context) -> Outcome:
    """Run ``quality.certify`` on the run's sample (measured here when ``quality.accuracy`` did not run)."""
    settings = ctx.quality or QualitySettings()
    if not ctx.quality_samples and "accuracy" not in ctx.quality_results:
        acc, samples = accuracy.measure(ctx, settings)
        accuracy.keep(ctx, acc, samples, settings)
    repeats = (ctx.quality_results.get("accuracy") or {}).get("repeats", 1)
    cert = measure(per_request(ctx.quality_samples, repeats), settings, repeats)
    ctx.quality_results["certify"] = cert
    return outcome(cert)
