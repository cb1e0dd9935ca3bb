"""An interrupted nightly check is its own state: its own metric and a warning alert, never the failure page;
the failure alert explains every exit code; runbook links are absolute once [monitoring] runbook_url is a URL
(issue #30 item 3). Proven with ``promtool test rules`` on the textfile the check's own writer produces for an
interrupted run (a real SIGTERM run is tests/test_check_workers_reports.py's and test_interrupt.py's)."""

from __future__ import annotations

import datetime as dt

from kimi_deploy.check.reports import to_prometheus
from kimi_deploy.check.results import CheckReport, CheckResult
from kimi_deploy.targets.prometheus import alerts, rules_doc, settings, to_yaml
from monitoring_helpers import preset_profile, promtool, rule_test_doc, write_monitoring
from test_monitoring_check_alerts import SCRAPE, alert_test, series


def _textfile(*, interrupted: str | None, failed: bool = False) -> str:
    report = CheckReport(base_url="http://127.0.0.1:30000", model="m", service="kimi-k25",
                         started_at=dt.datetime(2026, 12, 2, 3, 0, tzinfo=dt.timezone.utc))
    report.results.append(CheckResult("health.live", "fail" if failed else "pass", "unreachable" if failed else None))
    if interrupted:
        report.interrupted, report.not_run = interrupted, ["health.ready"]
    return to_prometheus(report)


def test_an_interrupted_run_warns_with_its_own_alert_and_never_pages(tmp_path):
    profile = preset_profile()
    files = write_monitoring(profile, tmp_path)
    rules = {r["alert"]: r for g in rules_doc(profile)["groups"] for r in g["rules"] if "alert" in r}
    stopped, failed = _textfile(interrupted="SIGTERM"), _textfile(interrupted=None, failed=True)
    assert "kimi_deploy_check_exit_code{service=\"kimi-k25\"} 130" in stopped
    assert rules["KimiNightlyCheckInterrupted"]["labels"]["severity"] == "warning"
    tests = [
        alert_test(rules["KimiNightlyCheckFailed"], "an interrupted run does not page", series(stopped), "5m", []),
        alert_test(rules["KimiNightlyCheckInterrupted"], "an interrupted run warns", series(stopped), "5m",
                   [(SCRAPE, 1)]),
        alert_test(rules["KimiNightlyCheckFailed"], "a failed run pages", series(failed), "5m", [(SCRAPE, 3)]),
        alert_test(rules["KimiNightlyCheckInterrupted"], "a failed run is not interrupted", series(failed), "5m",
                   []),
    ]
    doc = rule_test_doc(profile, files["kimi-k25.rules.yml"].name, tests)
    (tmp_path / "t.yml").write_text(to_yaml(doc))
    done = promtool("test", "rules", "t.yml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]


def test_the_failure_alert_explains_every_exit_code_it_fires_on():
    failed = next(a for a in alerts(settings(preset_profile())) if a.name == "KimiNightlyCheckFailed")
    for code in ("Exit 1", "exit 2", "exit 3", "any other code", "Exit 130"):
        assert code in failed.description, code


def test_runbook_links_are_absolute_from_the_configured_base_url():
    base = "https://runbooks.example.com/kimi-deploy/docs/runbook.md"
    doc = rules_doc(preset_profile(runbook_url=base))
    links = [r["annotations"]["runbook_url"] for g in doc["groups"] for r in g["rules"] if "alert" in r]
    assert links and all(link.startswith(base + "#kimi") for link in links)
    assert f"{base}#kiminightlycheckinterrupted" in links
    default = rules_doc(preset_profile())  # the default stays the relative docs/runbook.md (no invented site)
    assert all(r["annotations"]["runbook_url"].startswith("docs/runbook.md#")
               for g in default["groups"] for r in g["rules"] if "alert" in r)

