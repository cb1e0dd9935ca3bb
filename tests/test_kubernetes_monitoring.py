"""Watched in a cluster: the Prometheus Operator objects render = the systemd target's rules and jobs, validate
against the operator's CRDs (tests/data/crds, 0.93.0), the rules load in promtool, and the nightly check's result
reaches an alert through a real Pushgateway (Debian's prometheus-pushgateway) scraped by a real Prometheus."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest
import yaml

from helpers import run_cli, write_profile
from kube_helpers import operator_errors, validate_document
from kimi_deploy.targets import kubernetes
from kimi_deploy.targets import prometheus as monitoring
from kimi_deploy.profile import parse_profile
from loopback import free_port
from monitoring_helpers import promtool, tool
from test_kubernetes import CASES, _with, profile_text

STANDIN = Path(__file__).resolve().parent / "fleet_standin.py"
DEADLINE_S = 180.0


def _render(case: str, **k8s: str):
    text = _with(profile_text(case), "kubernetes", **k8s) if k8s else profile_text(case)
    profile = parse_profile(tomllib.loads(text))
    return profile, kubernetes.render(profile)


def _docs(manifests, name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(manifests.files[name]) if d]


@pytest.mark.parametrize("case", sorted(CASES))
def test_operator_objects_validate_against_their_crds(case):
    profile, manifests = _render(case)
    kinds = {d["kind"] for f in manifests.files if f.startswith("monitoring-") for d in _docs(manifests, f)}
    assert kinds == ({"PodMonitor", "PrometheusRule", "ServiceMonitor"} if profile.gateway else
                     {"PodMonitor", "PrometheusRule"})
    for name in manifests.files:
        if name.startswith("monitoring-"):
            for document in _docs(manifests, name):
                assert validate_document(document) == [], name
    # the validator sees mistakes: a misspelt field and a wrong type are errors
    (monitor,) = _docs(manifests, "monitoring-podmonitor.yaml")
    bad = copy.deepcopy(monitor)
    bad["spec"]["podMetricsEndpoints"][0]["portt"] = bad["spec"]["podMetricsEndpoints"][0].pop("port")
    bad["spec"]["podMetricsEndpoints"][0]["interval"] = 15
    assert len(operator_errors(bad)) == 2, operator_errors(bad)


def test_the_rules_are_the_systemd_targets_and_the_jobs_match_them(tmp_path):
    profile, manifests = _render("two-node-groups-gateway")
    (rule,) = _docs(manifests, "monitoring-rules.yaml")
    st = monitoring.settings(profile)
    systemd = monitoring.rules_doc(profile.model_copy(update={"monitoring": profile.monitoring.model_copy(
        update={"gateway": "gw:29000"})}))
    assert rule["spec"] == json.loads(json.dumps(systemd)), "the PrometheusRule is not the systemd target's rules"
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert {"KimiServerDown", "KimiNightlyCheckFailed", "KimiGatewayDown", "KimiGatewayWorkerUnhealthy"} <= alerts
    (rules_file := tmp_path / "rules.yml").write_text(yaml.safe_dump(rule["spec"]))
    done = promtool("check", "rules", str(rules_file), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    (pod,) = _docs(manifests, "monitoring-podmonitor.yaml")
    (svc,) = _docs(manifests, "monitoring-servicemonitor.yaml")
    relabeled = {r["targetLabel"]: r["replacement"] for r in pod["spec"]["podMetricsEndpoints"][0]["relabelings"]}
    assert relabeled == {"job": st.job, "service": "kimi-k25"}
    assert {r["targetLabel"]: r["replacement"] for r in svc["spec"]["endpoints"][0]["relabelings"]}["job"] == \
        "kimi-k25-gateway"
    for document in (pod, svc, rule):
        assert document["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # what the objects select is what the manifests run: leader pods with a port named http, the gateway
    # Service with a port named metrics that targets the container port smg serves its metrics on
    (service,) = _docs(manifests, "gateway-service.yaml")
    (deployment,) = _docs(manifests, "gateway-deployment.yaml")
    assert svc["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {"name": "metrics", "port": 29000, "targetPort": "metrics", "protocol": "TCP"} in service["spec"]["ports"]
    smg = deployment["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "metrics", "containerPort": 29000, "protocol": "TCP"} in smg["ports"]
    args = smg["args"]
    assert args[args.index("--prometheus-host") + 1] == "0.0.0.0"
    (lws,) = _docs(manifests, "server-leaderworkerset.yaml")
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    assert pod["spec"]["selector"]["matchLabels"].items() <= leader["metadata"]["labels"].items()
    assert leader["spec"]["containers"][0]["ports"][0]["name"] == "http"


def test_annotations_instead_of_operator_objects_and_none():
    _, manifests = _render("two-node-groups-gateway", scrape='"annotations"')
    assert not [f for f in manifests.files if f.startswith("monitoring-")]
    (lws,) = _docs(manifests, "server-leaderworkerset.yaml")
    annotations = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"]["annotations"]
    assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": "30000",
                           "prometheus.io/path": "/metrics"}
    assert "annotations" not in lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]
    _, manifests = _render("two-node-groups-gateway", scrape='"none"')
    (deployment,) = _docs(manifests, "gateway-deployment.yaml")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--prometheus-host") + 1] == "127.0.0.1"


def test_scrape_without_metrics_is_refused_and_no_pushgateway_is_a_warning():
    from kimi_deploy.errors import ProfileError

    text = _with(profile_text("single-host-replicas"), "sglang", enable_metrics="false")
    with pytest.raises(ProfileError) as raised:
        kubernetes.render(parse_profile(tomllib.loads(text)))
    assert any(p.startswith("kubernetes.scrape:") for p in raised.value.problems)
    _, manifests = _render("single-host-replicas")
    assert any(w.startswith("kubernetes.pushgateway: not set") for w in manifests.warnings)
    _, manifests = _render("two-node-groups-gateway")
    (cronjob,) = _docs(manifests, "check-cronjob.yaml")
    command = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[-4:] == ["--prom", "/reports/check.prom", "--pushgateway",
                            "http://prometheus-pushgateway.monitoring.svc:9091"]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def _poll(what, probe, deadline, log: Path):
    last = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except OSError as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.5)
    pytest.fail(f"{what} not seen before the deadline; last {last!r}\n{log.read_text()[-3000:]}")


def test_the_nightly_checks_result_reaches_an_alert_through_a_real_pushgateway(tmp_path):
    """The CronJob's command (its --pushgateway), run against a stand-in server, pushes to Debian's
    prometheus-pushgateway; a real Prometheus scraping it with honor_labels and loaded with the PrometheusRule's
    rules fires KimiNightlyCheckFailed for this service's check job."""
    pushgateway, prometheus = tool("prometheus-pushgateway"), tool("prometheus")
    push_port, server_port, prom_port = free_port(), free_port(), free_port()
    profile, manifests = _render("two-node-groups-gateway", pushgateway=f'"http://127.0.0.1:{push_port}"')
    (rule,) = _docs(manifests, "monitoring-rules.yaml")
    (cronjob,) = _docs(manifests, "check-cronjob.yaml")
    command = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["command"]
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "rules.yml").write_text(yaml.safe_dump(rule["spec"]))
    (etc / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": ["rules.yml"],
        "scrape_configs": [{"job_name": "pushgateway", "honor_labels": True,
                            "static_configs": [{"targets": [f"127.0.0.1:{push_port}"]}]}]}))
    log = tmp_path / "services.log"
    procs = []
    try:
        with log.open("w") as out:
            procs.append(subprocess.Popen([pushgateway, f"--web.listen-address=127.0.0.1:{push_port}"],
                                          stdout=out, stderr=out))
            procs.append(subprocess.Popen([sys.executable, str(STANDIN), "sglang", "--host", "127.0.0.1",
                                           "--port", str(server_port)], stdout=out, stderr=out))
            procs.append(subprocess.Popen([prometheus, f"--config.file={etc / 'prometheus.yml'}",
                                           f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                           f"--web.listen-address=127.0.0.1:{prom_port}"], stdout=out, stderr=out))
        deadline = time.monotonic() + DEADLINE_S
        _poll("the pushgateway", lambda: _get(f"http://127.0.0.1:{push_port}/-/ready") is not None, deadline, log)
        # the CronJob's check, its options kept (--pushgateway from the profile), against one server directly
        args = command[2:]
        args = args[:args.index("--base-url")] + args[args.index("--base-url") + 2:]
        args = [a for a in args if a != "--each-worker"]
        keep = []
        skip_next = False
        for i, arg in enumerate(args):  # the pod's paths become the test's
            if skip_next:
                skip_next = False
                continue
            if arg in ("--profile", "--json", "--prom", "--api-key-file"):
                skip_next = True
                continue
            if arg == "--insecure":
                continue
            keep.append(arg)
        profile_path = write_profile(tmp_path, profile_text("two-node-groups-gateway").replace(
            'api_key_file = "/etc/kimi-deploy/kimi-k25.api-key"\n', "allow_unauthenticated = true\n"))
        result = run_cli(["check", "--profile", str(profile_path), "--base-url", f"http://127.0.0.1:{server_port}",
                          "--only", "health.*,contract.*", "--prom", str(tmp_path / "check.prom"), *keep])
        assert "--pushgateway" in keep and result.exit_code == 1, result.stdout + result.stderr
        assert f"pushed to http://127.0.0.1:{push_port}/metrics/job/kimi-k25-check/service/kimi-k25" in result.stderr
        pushed = _get(f"http://127.0.0.1:{push_port}/metrics")
        assert 'kimi_deploy_check_exit_code{instance="",job="kimi-k25-check",service="kimi-k25"} 1' in pushed, pushed

        def firing():
            alerts = json.loads(_get(f"http://127.0.0.1:{prom_port}/api/v1/alerts"))["data"]["alerts"]
            return [a for a in alerts if a["labels"]["alertname"] == "KimiNightlyCheckFailed"
                    and a["state"] == "firing"] or None

        (alert,) = _poll("KimiNightlyCheckFailed firing", firing, deadline, log)
        assert alert["labels"]["job"] == "kimi-k25-check" and alert["labels"]["service"] == "kimi-k25"
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def test_a_push_that_fails_is_said_and_is_not_exit_0(tmp_path):
    server_port, dead = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, str(STANDIN), "sglang", "--host", "127.0.0.1", "--port",
                             str(server_port)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "LISTENING"
        result = run_cli(["check", "--base-url", f"http://127.0.0.1:{server_port}", "--only", "health.live",
                          "--pushgateway", f"http://127.0.0.1:{dead}"])
        assert result.exit_code != 0
        assert "did not reach the Pushgateway, so no alert can read it" in result.stderr
        bad = run_cli(["check", "--base-url", f"http://127.0.0.1:{server_port}", "--pushgateway", "pushgw:9091"])
        assert bad.exit_code == 2 and "not an http(s) URL" in bad.stderr
    finally:
        proc.terminate()
        proc.wait(30)
