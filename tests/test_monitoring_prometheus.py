"""A real Prometheus (Debian's package) on loopback, configured by the rendered prometheus.yml and rules, scrapes
a synthetic SGLang server whose /metrics carries SGLang 0.5.23's metric names (read from the SGLang test
environment's ``metrics_collector.py``) and a synthetic node_exporter serving the check textfile: the targets
come up, the recording rules produce series, an alert fires on the textfile, and every rule and dashboard
expression evaluates. Prometheus' HTTP API is polled with a generous deadline, never a fixed sleep."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from loopback import Loopback, QuietHandler, free_port
from monitoring_helpers import GATEWAY_MONITORING, all_exprs, all_queries, preset_profile, tool, write_monitoring

GOLDEN_PROM = Path(__file__).parent / "golden" / "check" / "check.prom"
DEADLINE_S = 180.0

#: ``Gauge(name="sglang:x"`` and the like in SGLang's metrics_collector.py.
DECLARED = re.compile(r'\b(Gauge|Counter|Histogram)\(\s*name="(sglang:[A-Za-z0-9_:]+)"')


def sglang_metric_types(sglang_python: str) -> dict[str, str]:
    """SGLang metric name -> Gauge/Counter/Histogram, read from the test environment's package source (the
    package is found without importing it: importing sglang takes half a minute on this machine)."""
    where = subprocess.run([sglang_python, "-c", "import importlib.util; "
                            "print(importlib.util.find_spec('sglang').submodule_search_locations[0])"],
                           capture_output=True, text=True, check=True, timeout=120).stdout.strip()
    source = (Path(where) / "srt" / "observability" / "metrics_collector.py").read_text()
    return {name: kind for kind, name in DECLARED.findall(source)}


SCHED = {"model_name": "moonshotai/Kimi-K2.5", "engine_type": "unified", "tp_rank": "0", "pp_rank": "0",
         "moe_ep_rank": "0"}
TOKENIZER = {"model_name": "moonshotai/Kimi-K2.5", "engine_type": "unified"}
#: Metrics the synthetic server exposes: name -> (labels, gauge value or counter/histogram step per scrape).
EXPOSED = {
    "sglang:num_running_reqs": (SCHED, 12.0), "sglang:num_queue_reqs": (SCHED, 0.0),
    "sglang:token_usage": (SCHED, 0.42), "sglang:gen_throughput": (SCHED, 850.0),
    "sglang:spec_accept_length": (SCHED, 2.9), "sglang:spec_accept_rate": (SCHED, 0.63),
    "sglang:cache_hit_rate": (SCHED, 0.3),
    "sglang:num_requests_total": ({**TOKENIZER, "is_streaming": "true"}, 5.0),
    "sglang:num_aborted_requests_total": (TOKENIZER, 0.0),
    "sglang:prompt_tokens_total": ({**TOKENIZER, "is_streaming": "true"}, 4000.0),
    "sglang:generation_tokens_total": ({**TOKENIZER, "is_streaming": "true"}, 2000.0),
    "sglang:time_to_first_token_seconds": ({**TOKENIZER, "is_streaming": "true"}, 0.35),
    "sglang:inter_token_latency_seconds": (TOKENIZER, 0.02),
    "sglang:e2e_request_latency_seconds": ({**TOKENIZER, "is_streaming": "true"}, 9.0),
}
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def _labels(labels: dict[str, str], **more: str) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in {**labels, **more}.items()) + "}"


def exposition(types: dict[str, str], scrape: int) -> str:
    """Text exposition of :data:`EXPOSED` at the ``scrape``-th scrape: counters and histograms grow each time."""
    lines = []
    for name, (labels, value) in EXPOSED.items():
        kind = types[name]
        lines.append(f"# TYPE {name.removesuffix('_total') if kind == 'Counter' else name} {kind.lower()}")
        if kind == "Gauge":
            lines.append(f"{name}{_labels(labels)} {value}")
        elif kind == "Counter":
            lines.append(f"{name}{_labels(labels)} {value * scrape}")
        else:  # 10 observations of ``value`` per scrape
            for le in BUCKETS:
                lines.append(f"{name}_bucket{_labels(labels, le=str(le))} {10 * scrape if value <= le else 0}")
            lines.append(f'{name}_bucket{_labels(labels, le="+Inf")} {10 * scrape}')
            lines.append(f"{name}_sum{_labels(labels)} {10 * scrape * value}")
            lines.append(f"{name}_count{_labels(labels)} {10 * scrape}")
    return "\n".join(lines) + "\n"


class Exporter(Loopback):
    """A loopback HTTP server answering /metrics with ``body(scrape_number)``; stopped by :meth:`close`."""

    def __init__(self, body) -> None:
        self.scrapes = 0
        outer = self

        class Handler(QuietHandler):
            def do_GET(self):  # noqa: N802 (http.server's spelling)
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                outer.scrapes += 1
                self._send(200, body(outer.scrapes).encode(), "text/plain; version=0.0.4")

        super().__init__(Handler)


def api(base: str, path: str, **params: str) -> dict:
    url = f"{base}{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def poll(what: str, probe, deadline: float, log: Path):
    """``probe()`` until it returns something truthy; fails with Prometheus' log after ``deadline``."""
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except OSError as exc:  # not listening yet
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.5)
    pytest.fail(f"{what} not seen before the deadline; last answer {last!r}; prometheus log:\n"
                f"{log.read_text()[-3000:]}")


def textfiles() -> str:
    """What node_exporter serves from a textfile directory holding two services' check.prom: the golden one
    (service kimi-k25, exit 1) and another service's (exit 0); node_exporter merges the families."""
    ours = GOLDEN_PROM.read_text()
    theirs = ours.replace('service="kimi-k25"', 'service="other-svc"').replace(
        'kimi_deploy_check_exit_code{service="other-svc"} 1', 'kimi_deploy_check_exit_code{service="other-svc"} 0')
    assert theirs != ours and 'exit_code{service="other-svc"} 0' in theirs
    families: dict[str, list[str]] = {}
    for text in (ours, theirs):
        name = ""
        for line in text.splitlines():
            if line.startswith("# HELP "):
                name = line.split()[2]
            families.setdefault(name, [])
            if not line.startswith("#") or line not in families[name]:
                families[name].append(line)
    return "\n".join(line for lines in families.values() for line in lines) + "\n"


@pytest.fixture
def prometheus_run(tmp_path, sglang_python):
    """Start the synthetic server, the textfile exporter and Prometheus; yield ``(base_url, profile, log)``."""
    types = sglang_metric_types(sglang_python)
    missing = sorted(set(EXPOSED) - set(types))
    assert not missing, f"SGLang 0.5.23 declares no {missing}"
    server = Exporter(lambda n: exposition(types, n))
    node = Exporter(lambda n: textfiles() + "# TYPE node_load1 gauge\nnode_load1 0.5\n")
    proc = None
    try:
        profile = preset_profile(targets=[server.address], node_exporter=node.address, scrape_interval_s=1)
        files = write_monitoring(profile, tmp_path / "etc")
        port, log = free_port(), tmp_path / "prometheus.log"
        proc = subprocess.Popen([tool("prometheus"), f"--config.file={files['prometheus.yml']}",
                                 f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=log.open("w"))
        yield f"http://127.0.0.1:{port}", profile, log
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        server.close()
        node.close()


def test_real_prometheus_scrapes_and_records(prometheus_run):
    base, profile, log = prometheus_run
    deadline = time.monotonic() + DEADLINE_S

    def targets_up():
        active = api(base, "/api/v1/targets")["data"]["activeTargets"]
        jobs = {t["labels"]["job"]: t["health"] for t in active}
        return jobs if jobs == {"kimi-k25": "up", "kimi-k25-check": "up"} else None

    poll("both targets up", targets_up, deadline, log)

    def series(query: str):
        def probe():
            result = api(base, "/api/v1/query", query=query)["data"]["result"]
            return result or None
        return probe

    for record in ("instance:sglang_num_running_reqs:sum", "instance:sglang_token_usage:max",
                   "job:sglang_time_to_first_token_seconds:p99_5m", "job:sglang_inter_token_latency_seconds:p99_5m",
                   "job:sglang_num_requests:rate5m", "instance:sglang_spec_accept_length:avg"):
        got = poll(f"recorded series {record}", series(record), deadline, log)
        assert got[0]["metric"]["job"] == "kimi-k25", got
    running = poll("running requests", series("instance:sglang_num_running_reqs:sum"), deadline, log)
    assert float(running[0]["value"][1]) == 12.0
    check = poll("the check textfile", series('kimi_deploy_check_exit_code{job="kimi-k25-check"}'), deadline, log)
    assert float(check[0]["value"][1]) == 1.0
    # the other service's textfile on the same node_exporter is not this job's; the textfile's label is kept as is
    assert [c["metric"] for c in check] == [{"__name__": "kimi_deploy_check_exit_code", "job": "kimi-k25-check",
                                             "instance": profile.monitoring.node_exporter, "service": "kimi-k25"}]
    assert not api(base, "/api/v1/query", query='{service="other-svc"}')["data"]["result"]
    assert not api(base, "/api/v1/query", query="node_load1")["data"]["result"]  # the check job keeps only the textfile

    def markup_leak_firing():
        alerts = api(base, "/api/v1/alerts")["data"]["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == "KimiToolCallContractBroken"
                and a["state"] == "firing"] or None

    firing = poll("KimiToolCallContractBroken firing", markup_leak_firing, deadline, log)
    assert firing[0]["labels"]["kind"] == "markup_leak"
    assert firing[0]["annotations"]["runbook_url"] == "docs/runbook.md#kimitoolcallcontractbroken"
    rules = api(base, "/api/v1/rules")["data"]["groups"]
    assert all(r["health"] == "ok" for g in rules for r in g["rules"]), rules
    empty = []
    for expr in all_queries(profile):  # every dashboard query evaluates; all but the gateway's have data
        answer = api(base, "/api/v1/query", query=expr)
        assert answer["status"] == "success", (expr, answer)
        if not answer["data"]["result"]:
            empty.append(expr)
    assert empty == [], empty


def test_every_sglang_name_used_is_declared_by_sglang(sglang_python):
    """Each sglang:* name in the rules and the dashboard is one SGLang 0.5.23 declares (histograms by their
    _bucket series, counters by their _total name)."""
    types = sglang_metric_types(sglang_python)
    profile = preset_profile(**GATEWAY_MONITORING)
    used = {name for expr in [*all_exprs(profile), *all_queries(profile)]
            for name in re.findall(r"sglang:[A-Za-z0-9_:]+", expr)}
    assert len(used) >= 10
    for name in used:
        base = name.removesuffix("_bucket")
        assert base in types, f"{name}: SGLang 0.5.23 declares no such metric"
        assert (types[base] == "Histogram") == name.endswith("_bucket"), (name, types[base])
