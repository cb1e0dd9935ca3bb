"""The rendered Prometheus files: promtool accepts them, and `promtool test rules` proves each server and
gateway alert fires on a series that should fire it and stays silent on one that should not.

The check textfile's alerts are proven on the real check's textfile in test_monitoring_check_alerts.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kimi_deploy.targets.prometheus import alerts, rules_doc, settings, to_yaml
from monitoring_helpers import GATEWAY_MONITORING as GATEWAY
from kimi_deploy.catalog.presets import get_preset
from kimi_deploy.profile import parse_profile
from monitoring_helpers import PRESET, expand, preset_profile, promtool, rule_test_doc, write_monitoring


@pytest.mark.parametrize("monitoring", [{}, GATEWAY], ids=["preset", "gateway-labels-e2e"])
def test_promtool_accepts_config_and_rules(tmp_path, monitoring):
    files = write_monitoring(preset_profile(**monitoring), tmp_path)
    assert sorted(files) == ["kimi-k25.dashboard.json", "kimi-k25.rules.yml", "prometheus.yml"]
    done = promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    done = promtool("check", "rules", "kimi-k25.rules.yml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_scrape_config_needs_no_credentials_and_carries_labels(tmp_path):
    profile = preset_profile(**GATEWAY)
    text = write_monitoring(profile, tmp_path)["prometheus.yml"].read_text()
    config = "\n".join(line for line in text.lower().splitlines() if not line.startswith("#"))
    for secret in ("authorization", "bearer", "basic_auth", "api-key", "api_key", "password", "credentials", "oauth"):
        assert secret not in config
    assert '"10.0.0.5:30000"' in text and '"[::1]:30001"' in text and '"127.0.0.1:29000"' in text
    assert text.count('cluster: "gpu-a"') == 3  # server, check, gateway jobs



def test_check_job_keeps_only_its_own_services_textfile():
    """Two services on one host (one node_exporter): each check job honours the textfile's ``service`` label
    and keeps only its own service's series; the rules and the dashboard select by that label too."""
    from monitoring_helpers import all_queries
    from kimi_deploy.targets.prometheus import scrape_configs

    profile = preset_profile()
    st = settings(profile)
    check = next(j for j in scrape_configs(st) if j["job_name"] == "kimi-k25-check")
    assert check["honor_labels"] is True and check["static_configs"][0]["labels"]["service"] == "kimi-k25"
    assert {"source_labels": ["service"], "regex": "kimi-k25", "action": "keep"} in check["metric_relabel_configs"]
    assert not any("honor_labels" in j for j in scrape_configs(st) if j["job_name"] != "kimi-k25-check")
    dotted = settings(parse_profile({**get_preset(PRESET).data, "service": {"name": "kimi.k25"}}))
    keep = next(j for j in scrape_configs(dotted) if "honor_labels" in j)["metric_relabel_configs"][-1]
    assert keep["regex"] == "kimi\\.k25"  # "." matches itself only
    reads_check = [e for e in [*(a.expr for a in alerts(st)), *all_queries(profile)] if "kimi_deploy_check_" in e]
    assert len(reads_check) >= 7
    assert all('{job="kimi-k25-check", service="kimi-k25"' in e for e in reads_check), reads_check


@dataclasses.dataclass
class Case:
    """One promtool alert test: input series, when to evaluate, and whether ``alert`` fires there."""

    alert: str
    fires: bool
    series: list[tuple[str, str]]
    eval_time: str
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    value: float = 0.0
    interval: str = "1m"


S = 'job="kimi-k25",instance="10.0.0.5:30000",service="kimi-k25"'
G = 'job="kimi-k25-gateway",instance="127.0.0.1:29000",service="kimi-k25"'
INSTANCE = {"job": "kimi-k25", "instance": "10.0.0.5:30000", "service": "kimi-k25"}
SCHED = 'model_name="moonshotai/Kimi-K2.5",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"'


def histogram(metric: str, low: float, high: float, busy: bool) -> list[tuple[str, str]]:
    """Buckets ``le=low``, ``le=high``, ``+Inf``: 60 observations a minute land in (low, high] when ``busy``,
    else under ``low``; the p99 is then ``low + (high - low) * 0.99`` or ``low * 0.99``."""
    inside, below = ("0+0x40", "0+60x40") if busy else ("0+60x40", "0+60x40")
    return [(f'sglang:{metric}_bucket{{{S},{SCHED},le="{low:g}"}}', inside),
            (f'sglang:{metric}_bucket{{{S},{SCHED},le="{high:g}"}}', below),
            (f'sglang:{metric}_bucket{{{S},{SCHED},le="+Inf"}}', below)]


def server_cases() -> list[Case]:
    up = [(f"up{{{S}}}", "1x40"), (f"sglang:num_running_reqs{{{S},{SCHED}}}", "3x40")]
    job = {"job": "kimi-k25"}
    cases = [
        Case("KimiServerDown", True, [(f"up{{{S}}}", "0x10")], "5m", INSTANCE),
        Case("KimiServerDown", False, [(f"up{{{S}}}", "1x10")], "5m"),
        Case("KimiServerNotReady", True, [(f"up{{{S}}}", "1x40")], "25m", INSTANCE),
        Case("KimiServerNotReady", False, up, "25m"),
        Case("KimiTTFTOverSLO", True, histogram("time_to_first_token_seconds", 1, 4, True), "30m", job,
             1 + 3 * 0.99),
        Case("KimiTTFTOverSLO", False, histogram("time_to_first_token_seconds", 1, 4, False), "30m"),
        Case("KimiITLOverSLO", True, histogram("inter_token_latency_seconds", 0.1, 0.4, True), "30m", job,
             0.1 + 0.3 * 0.99),
        Case("KimiITLOverSLO", False, histogram("inter_token_latency_seconds", 0.1, 0.4, False), "30m"),
        Case("KimiQueueGrowingAtLimit", True,
             [(f"sglang:num_queue_reqs{{{S},{SCHED}}}", "0+2x40"), (f"sglang:num_running_reqs{{{S},{SCHED}}}", "48x40")],
             "30m", INSTANCE),
        Case("KimiQueueGrowingAtLimit", False,  # the queue grows, but below the running limit
             [(f"sglang:num_queue_reqs{{{S},{SCHED}}}", "0+2x40"), (f"sglang:num_running_reqs{{{S},{SCHED}}}", "20x40")],
             "30m"),
        Case("KimiQueueGrowingAtLimit", False,  # at the limit, but the queue is flat
             [(f"sglang:num_queue_reqs{{{S},{SCHED}}}", "5x40"), (f"sglang:num_running_reqs{{{S},{SCHED}}}", "48x40")],
             "30m"),
        Case("KimiRequestsAborted", True,
             [(f'sglang:num_requests_total{{{S},model_name="m",is_streaming="true"}}', "0+100x40"),
              (f'sglang:num_aborted_requests_total{{{S},model_name="m"}}', "0+10x40")], "30m", job),
        Case("KimiRequestsAborted", False,
             [(f'sglang:num_requests_total{{{S},model_name="m",is_streaming="true"}}', "0+100x40"),
              (f'sglang:num_aborted_requests_total{{{S},model_name="m"}}', "0+1x40")], "30m"),
        Case("KimiSpecAcceptLengthCollapsed", True,
             [(f"sglang:spec_accept_length{{{S},{SCHED}}}", "1.2x40"),
              (f'sglang:num_requests_total{{{S},model_name="m",is_streaming="true"}}', "0+100x40")],
             "30m", INSTANCE, 1.2),
        Case("KimiSpecAcceptLengthCollapsed", False,
             [(f"sglang:spec_accept_length{{{S},{SCHED}}}", "3.1x40"),
              (f'sglang:num_requests_total{{{S},model_name="m",is_streaming="true"}}', "0+100x40")], "30m"),
        Case("KimiSpecAcceptLengthCollapsed", False,  # a low gauge left over while idle
             [(f"sglang:spec_accept_length{{{S},{SCHED}}}", "1.2x40"),
              (f'sglang:num_requests_total{{{S},model_name="m",is_streaming="true"}}', "100x40")], "30m"),
        Case("KimiE2EOverSLO", True, histogram("e2e_request_latency_seconds", 30, 90, True), "30m", job,
             30 + 60 * 0.99),
        Case("KimiE2EOverSLO", False, histogram("e2e_request_latency_seconds", 30, 90, False), "30m"),
    ]
    gw = {"job": "kimi-k25-gateway", "instance": "127.0.0.1:29000", "service": "kimi-k25"}
    w = 'worker="http://10.0.0.5:30000"'
    cases += [
        Case("KimiGatewayDown", True, [(f"up{{{G}}}", "0x10")], "5m", gw),
        Case("KimiGatewayDown", False, [(f"up{{{G}}}", "1x10")], "5m"),
        Case("KimiGatewayWorkerUnhealthy", True, [(f"smg_worker_health{{{G},{w}}}", "0x10")], "5m",
             {**gw, "worker": "http://10.0.0.5:30000"}),
        Case("KimiGatewayWorkerUnhealthy", False, [(f"smg_worker_health{{{G},{w}}}", "1x10")], "5m"),
        Case("KimiGatewayWorkerUnhealthy", False, [(f"smg_worker_health{{{G},{w}}}", "-1x10")], "5m"),  # removed
        Case("KimiGatewayCircuitOpen", True, [(f"smg_worker_cb_state{{{G},{w}}}", "1x10")], "5m",
             {**gw, "worker": "http://10.0.0.5:30000"}),
        Case("KimiGatewayCircuitOpen", False, [(f"smg_worker_cb_state{{{G},{w}}}", "2x10")], "5m"),  # half-open
    ]
    return cases


def unit_test(profile, cases: list[Case], rules: str) -> dict:
    """The promtool unit-test document for ``cases`` against the rendered rule file ``rules``."""
    doc = rules_doc(profile)
    by_name = {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}
    tests = []
    for case in cases:
        rule = by_name[case.alert]
        expected = []
        if case.fires:
            labels = {**case.labels, **rule["labels"]}
            expected.append({
                "exp_labels": labels,
                "exp_annotations": {k: expand(v, labels, case.value) for k, v in rule["annotations"].items()},
            })
        tests.append({
            "name": f"{case.alert} {'fires' if case.fires else 'stays silent'}",
            "interval": case.interval,
            "input_series": [{"series": s, "values": v} for s, v in case.series],
            "alert_rule_test": [{"eval_time": case.eval_time, "alertname": case.alert, "exp_alerts": expected}],
        })
    return rule_test_doc(profile, rules, tests)


def run_unit_tests(directory: Path, doc: dict) -> None:
    path = directory / "alerts.test.yml"
    path.write_text(to_yaml(doc))
    done = promtool("test", "rules", path.name, cwd=directory)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]


def test_every_server_and_gateway_alert_fires_and_stays_silent(tmp_path):
    profile = preset_profile(**{k: v for k, v in GATEWAY.items() if k != "labels"})
    files = write_monitoring(profile, tmp_path)
    cases = server_cases()
    run_unit_tests(tmp_path, unit_test(profile, cases, files["kimi-k25.rules.yml"].name))
    server_alerts = {a.name for a in alerts(settings(profile))} - {
        "KimiNightlyCheckFailed", "KimiNightlyCheckStale", "KimiNightlyCheckMissing", "KimiToolCallContractBroken",
        "KimiNightlyCheckInterrupted",  # test_monitoring_interrupted.py
        "KimiStartSlower"}  # test_start_history.py, on the real check textfile
    assert {c.alert for c in cases if c.fires} == server_alerts
    assert {c.alert for c in cases if not c.fires} == server_alerts


def test_profile_labels_reach_every_alert(tmp_path):
    profile = preset_profile(**GATEWAY)
    for group in rules_doc(profile)["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                assert rule["labels"]["cluster"] == "gpu-a" and rule["labels"]["team"] == "inference"


def test_thresholds_follow_the_profile(tmp_path):
    profile = preset_profile(slo={"ttft": 750.0, "tpot": 40.0}, running_limit=32, aborted_ratio=0.2,
                             spec_accept_length_min=2.0, slo_for_minutes=3, check_max_age_hours=30,
                             job="kimi-prod", check_job="kimi-prod-nightly")
    exprs = {a.name: (a.expr, a.for_) for a in alerts(settings(profile))}
    assert exprs["KimiTTFTOverSLO"] == ('job:sglang_time_to_first_token_seconds:p99_5m{job="kimi-prod"} > 0.75', "3m")
    assert exprs["KimiITLOverSLO"][0].endswith("> 0.04")
    assert exprs["KimiQueueGrowingAtLimit"][0].endswith(">= 32")
    assert "> 0.2 *" in exprs["KimiRequestsAborted"][0]
    assert "< 2 and" in exprs["KimiSpecAcceptLengthCollapsed"][0]
    assert exprs["KimiNightlyCheckStale"][0].endswith("> 108000")
    assert 'job="kimi-prod-nightly"' in exprs["KimiNightlyCheckFailed"][0]
    assert "KimiE2EOverSLO" not in exprs and "KimiGatewayDown" not in exprs


def test_no_speculative_decoding_no_accept_length_alert():
    from kimi_deploy.catalog.presets import get_preset
    from kimi_deploy.profile import parse_profile

    data = get_preset("kimi-k25-rtx-pro-6000-x8").data
    sglang = {k: v for k, v in data["sglang"].items() if not k.startswith("speculative") and k != "enable_spec_v2"}
    profile = parse_profile({**data, "sglang": sglang})
    names = {a.name for a in alerts(settings(profile))}
    assert "KimiSpecAcceptLengthCollapsed" not in names
    assert "KimiQueueGrowingAtLimit" in names  # without a limit: the queue growing alone


def test_every_alert_links_to_its_runbook_entry(repo_root):
    """Each alert's runbook_url anchor is a heading of docs/runbook.md (GitHub's anchor of ``### `Name```)."""
    import re

    headings = {m.group(1).lower() for m in re.finditer(r"^#{3,4} `(\w+)`$", (repo_root / "docs" / "runbook.md").read_text(),
                                                          re.M)}
    profile = preset_profile(**GATEWAY)
    for a in alerts(settings(profile)):
        assert a.anchor in headings, f"docs/runbook.md has no '### `{a.name}`' runbook entry"


@pytest.mark.parametrize("monitoring", [{}, GATEWAY], ids=["preset", "gateway-labels-e2e"])
def test_every_dashboard_query_parses(tmp_path, monitoring):
    """promtool parses each dashboard expression as a recording rule (the dashboard has no Grafana-only macros)."""
    from monitoring_helpers import all_queries

    queries = all_queries(preset_profile(**monitoring))
    doc = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:query{i}", "expr": q}
                                                      for i, q in enumerate(queries)]}]}
    (tmp_path / "dashboard.rules.yml").write_text(to_yaml(doc))
    done = promtool("check", "rules", "dashboard.rules.yml", cwd=tmp_path)
    assert done.returncode == 0 and f"SUCCESS: {len(queries)} rules found" in done.stdout, done.stdout + done.stderr


def test_dashboard_shows_what_the_issue_asks(tmp_path):
    import json

    text = write_monitoring(preset_profile(**GATEWAY), tmp_path)["kimi-k25.dashboard.json"].read_text()
    board = json.loads(text)
    assert board["uid"] == "kimi-deploy-kimi-k25" and board["templating"]["list"][0]["type"] == "datasource"
    exprs = " ".join(t["expr"] for p in board["panels"] for t in p.get("targets", []))
    for needle in ("time_to_first_token_seconds:p99", "inter_token_latency_seconds:p99", "e2e_request_latency_seconds",
                   "gen_throughput", "num_queue_reqs", "num_running_reqs", "token_usage", "spec_accept_length",
                   "kimi_deploy_check_status", "smg_worker_health", "smg_worker_cb_state"):
        assert needle in exprs, needle
    ttft = next(p for p in board["panels"] if p.get("title") == "TTFT")
    assert ttft["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"] == 2.0  # [monitoring.slo] ttft, s
    assert all(p["datasource"]["uid"] == "${datasource}" for p in board["panels"] if p["type"] != "row")
