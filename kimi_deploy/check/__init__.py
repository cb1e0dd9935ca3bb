"""``kimi-deploy check``: health tiers and an API-contract suite for OpenAI-compatible servers.

Interface other modules call (stable)::

    from kimi_deploy.check import CheckOptions, run_checks
    report = run_checks(CheckOptions(base_url="http://127.0.0.1:30000", only=["health.*", "config.*"]))
    report.exit_code   # kimi_deploy.errors.ExitCode: OK, FAILED, UNREACHABLE
    report.results     # [CheckResult(id, status, kind, detail, evidence, duration_s), ...]
    report.to_json()   # the "kimi-deploy.check/1" document

Modules: :mod:`.check_ids` (ids, selection), :mod:`.outcome` (the verdict every check returns),
:mod:`.health` (health and config tiers),
:mod:`.contract` (chat-completion cases), :mod:`.completion_rules` / :mod:`.leaks` / :mod:`.stream`
(response validators), :mod:`.reports` (table, JSON, JUnit, Prometheus textfile),
:mod:`.runner` (:func:`run_checks`), :mod:`.quality` (the ``quality.*`` tier: schema corpus, accuracy with
its interval, Kimi pre-flight; off unless asked for).
"""

from kimi_deploy.check.results import (
    ALL_KINDS,
    FAILURE_KINDS,
    REPORT_SCHEMA,
    CheckOptions,
    CheckReport,
    CheckResult,
)
from kimi_deploy.check.runner import run_checks

__all__ = ["ALL_KINDS", "FAILURE_KINDS", "REPORT_SCHEMA", "CheckOptions", "CheckReport", "CheckResult",
           "run_checks"]
