"""``kimi-deploy check compare A.json B.json``: is B's schema accuracy different from A's beyond sampling noise?

Both files are ``kimi-deploy.check/1`` reports with a ``quality.accuracy`` measurement (``check --sample N
--json PATH``). The test is the pooled two-proportion z test
(:func:`kimi_deploy.check.quality.stats.two_proportion_test`) of valid / tool-call answers, two-sided at 5 %; a
significant drop is a failure (exit 1), anything else is not (exit 0); a side that measured nothing (no tool-call
answer: every ``quality.*`` request failed) leaves nothing to compare (exit 2, :func:`require_measurements`), so a
CI gate built on it never passes on no data. Also reported: each run's accuracy with its
95 % interval, whether the two samples came from the same dataset (its sha256) and the checks that passed in A and
fail in B.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

from kimi_deploy.check.quality.stats import Comparison, Proportion, two_proportion_test
from kimi_deploy.check.results import REPORT_SCHEMA
from kimi_deploy import paths
from kimi_deploy.errors import UsageError
from kimi_deploy.wire import inputs
from kimi_deploy.wire.printable import printable

#: The largest count a report's accuracy may hold: ``--sample``'s maximum (a run sends at most that many requests).
MAX_COUNT = 100_000


@dataclasses.dataclass(frozen=True)
class ReportAccuracy:
    """What ``compare`` reads of one report: its path, start time, accuracy counts, dataset digest, check rows."""

    path: str
    started_at: str
    proportion: Proportion
    dataset_sha256: str | None
    statuses: dict[str, str]


def load(path: Path) -> ReportAccuracy:
    """Read one report: a regular file of at most :data:`kimi_deploy.wire.inputs.REPORT_FILE_BYTES`, strict JSON
    (no ``NaN``/``Infinity``, no number past a double), valid against ``report.schema.json`` (types and ranges),
    with a ``quality.accuracy`` measurement whose counts are at most :data:`MAX_COUNT` and ``valid`` at most
    ``tool_call_answers``.

    Raises:
        UsageError: any of those fails; the message names the field (exit 2).
    """
    hint = "pass two reports written by `kimi-deploy check --sample N --json PATH` (the quality tier's accuracy)"
    doc = inputs.read_json(path, f"the report {path}", hint)
    if not isinstance(doc, dict) or doc.get("schema") != REPORT_SCHEMA:
        raise UsageError(f"{path} is not a {REPORT_SCHEMA} report", value=str(path), hint=hint)
    problem = inputs.shape_problem(doc, _report_schema())
    if problem:
        raise UsageError(f"{path} is not a report check wrote: {problem}", value=str(path), hint=hint)
    acc = (doc.get("quality") or {}).get("accuracy")
    if not isinstance(acc, dict):
        raise UsageError(f"{path} holds no quality.accuracy measurement", value=str(path), hint=hint)
    valid, n = acc["valid"], acc["tool_call_answers"]
    for name, value in (("valid", valid), ("tool_call_answers", n)):
        if value > MAX_COUNT:
            raise UsageError(f"{path}: quality.accuracy.{name}: {value if value < 10**12 else 'a number'} is over "
                             f"{MAX_COUNT:,}, the most requests a run sends", value=str(path), hint=hint)
    if valid > n:
        raise UsageError(f"{path}: quality.accuracy.valid: {valid} is more than tool_call_answers {n}",
                         value=str(path), hint=hint)
    statuses = {r["id"]: r["status"] for r in doc.get("checks") or [] if isinstance(r, dict)}
    dataset = acc.get("dataset") if isinstance(acc.get("dataset"), dict) else {}
    return ReportAccuracy(str(path), str(doc.get("started_at", "")), Proportion(valid, n),
                          dataset.get("sha256") if isinstance(dataset.get("sha256"), str) else None, statuses)


@functools.lru_cache(maxsize=1)
def _report_schema() -> dict[str, Any]:
    return json.loads(paths.check_report_schema().read_text(encoding="utf-8"))


@dataclasses.dataclass(frozen=True)
class CompareResult:
    """A (before) against B (after): the test, whether the datasets match, the checks newly failing."""

    a: ReportAccuracy
    b: ReportAccuracy
    test: Comparison
    same_dataset: bool | None
    newly_failing: list[str]

    @property
    def verdict(self) -> str:
        """``drop`` (significant, B lower), ``rise`` (significant, B higher), ``within_noise``."""
        if not self.test.significant:
            return "within_noise"
        return "drop" if self.test.drop else "rise"

    def to_dict(self) -> dict[str, Any]:
        def side(r: ReportAccuracy) -> dict[str, Any]:
            p = r.proportion
            return {"path": printable(r.path), "started_at": printable(r.started_at), "valid": p.successes,
                    "tool_call_answers": p.n, "estimate": p.estimate, "lower": p.lower, "upper": p.upper}

        return {"a": side(self.a), "b": side(self.b), "difference": self.test.difference, "z": self.test.z,
                "p_value": self.test.p_value, "alpha": self.test.alpha, "verdict": self.verdict,
                "same_dataset": self.same_dataset, "newly_failing": self.newly_failing}

    def lines(self) -> list[str]:
        out = [f"A {printable(self.a.path)}: {self.a.proportion.text()}",
               f"B {printable(self.b.path)}: {self.b.proportion.text()}"]
        diff = self.test.difference
        change = f"{100 * diff:+.2f} points" if diff is not None else "no difference to compute"
        words = {"drop": "a drop beyond sampling noise", "rise": "a rise beyond sampling noise",
                 "within_noise": "within sampling noise"}[self.verdict]
        out.append(f"B - A: {change}; two-proportion z test z = {self.test.z:.2f}, p = {self.test.p_value:.3g}: "
                   f"{words} (alpha {self.test.alpha:g})")
        if self.same_dataset is False:
            out.append("note: the two samples come from different datasets (sha256 differs): the comparison mixes "
                       "a change of server with a change of requests")
        if self.newly_failing:
            out.append("checks passing in A and failing in B: " + ", ".join(printable(i) for i in self.newly_failing))
        return out


def require_measurements(a: ReportAccuracy, b: ReportAccuracy) -> None:
    """The rule of "nothing to compare": each side must hold at least one tool-call answer.

    Raises:
        UsageError: either side counted no tool-call answer (exit 2), naming which.
    """
    empty = [r.path for r in (a, b) if r.proportion.n == 0]
    if empty:
        raise UsageError(
            "nothing to compare: " + " and ".join(printable(p) for p in empty)
            + " measured no tool-call answer (every quality request failed or no answer called a tool)",
            value=", ".join(printable(p) for p in empty),
            hint="read that report's quality.* failures, fix the server, and run `kimi-deploy check --sample N "
                 "--json PATH` again")


def compare(a_path: Path, b_path: Path, alpha: float = 0.05) -> CompareResult:
    """Compare the reports at ``a_path`` (before) and ``b_path`` (after).

    Raises:
        UsageError: either file is not a report with an accuracy measurement (:func:`load`), or either measured
            nothing (:func:`require_measurements`).
    """
    a, b = load(a_path), load(b_path)
    require_measurements(a, b)
    same = None if a.dataset_sha256 is None or b.dataset_sha256 is None else a.dataset_sha256 == b.dataset_sha256
    newly = sorted(i for i, s in b.statuses.items() if s == "fail" and a.statuses.get(i) == "pass")
    return CompareResult(a, b, two_proportion_test(a.proportion, b.proportion, alpha), same, newly)
