"""Profile -> Prometheus scrape configuration, recording and alert rules (and, via :mod:`kimi_deploy.targets.dashboard`,
a Grafana dashboard) for one deployment.

Everything here is pure and deterministic, like :mod:`kimi_deploy.targets.systemd`. Metric names are SGLang 0.5.23's
(``sglang/srt/observability/metrics_collector.py``: ``SchedulerMetricsCollector`` labels ``model_name``,
``engine_type``, ``tp_rank``, ``pp_rank``, ``moe_ep_rank``; its scheduler gauges come from attention-TP rank 0
only; ``TokenizerMetricsCollector`` histograms and counters from the HTTP rank), the check textfile's
(:func:`kimi_deploy.check.reports.to_prometheus`) and SGLang's gateway ``smg``'s (``smg_worker_health`` 1 ready,
0 not ready, -1 removed; ``smg_worker_cb_state`` 0 closed, 1 open, 2 half-open; label ``worker``). SGLang serves
``/metrics`` without the API key (``srt/utils/auth.py``: ``/health``, ``/ready``, ``/metrics`` are always
allowed), so the scrape configuration carries no credentials.

The YAML is written by :func:`to_yaml` (block style; every string a JSON string, which is a YAML double-quoted
scalar), so the kit needs no YAML library.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from kimi_deploy import paths
from kimi_deploy.deployment import resolve
from kimi_deploy.errors import ExitCode
from kimi_deploy.names import url_host
from kimi_deploy.profile import Profile, host_key, is_loopback

#: Default running-request limit of SGLang with EAGLE/EAGLE3 and no --max-running-requests (options.py comment).
EAGLE_RUNNING_DEFAULT = 48
#: Default ``spec_accept_length_min``: below it, most steps accept only the verified token itself.
SPEC_ACCEPT_MIN_DEFAULT = 1.5
#: The check's exit status when a signal stopped it (``kimi_deploy.errors.ExitCode.INTERRUPTED``): its own
#: warning (KimiNightlyCheckInterrupted), never the failure page.
INTERRUPTED_EXIT = int(ExitCode.INTERRUPTED)
#: Window of every rate and quantile in the rules.
WINDOW = "5m"


@dataclasses.dataclass(frozen=True)
class Settings:
    """``[monitoring]`` with every default resolved against the rest of the profile."""

    service: str
    job: str
    targets: tuple[str, ...]
    check_job: str
    node_exporters: tuple[str, ...]
    gateway: str | None
    gateway_job: str | None
    scrape_interval_s: int
    labels: Mapping[str, str]
    slo_ms: Mapping[str, float]
    slo_for_minutes: int
    check_max_age_hours: int
    running_limit: int | None
    aborted_ratio: float
    spec_accept_length_min: float | None
    runbook_url: str
    start_minutes: int
    #: The nightly check runs the quality tier (``[quality] nightly``): its recording rule, alert and panel exist.
    quality: bool = False


def _port_of(target: str) -> int:
    return int(target.rsplit(":", 1)[1])


def check_hosts(profile: Profile) -> tuple[str, ...]:
    """The hosts whose nightly check writes a textfile: rank 0 of each replica (the server check) and the gateway's
    host (``check --each-worker --prom``); ``()`` without ``[fleet]``/``[gateway]`` (the one local host)."""
    hosts = [nodes[0] for nodes in profile.replicas]
    if profile.gateway is not None:
        hosts.append(profile.gateway.host)
    seen: dict[str, str] = {}
    for host in hosts:
        seen.setdefault(host_key(host), host)
    return tuple(seen.values())


def _gateway_target(profile: Profile) -> tuple[str | None, str | None]:
    """(``HOST:PORT`` of smg's metrics for a Prometheus on another host, or None; a note when it cannot be known).

    ``[monitoring] gateway`` wins. Else from ``[gateway]``: smg's ``--prometheus-host`` on a wildcard listens on
    every address of the gateway host, so ``<gateway host>:<prometheus_port>``; on one address, that one; on
    loopback (the default) nothing outside the gateway host can scrape it, and the render says so instead of
    writing a loopback target that would be another host's."""
    m, gw = profile.monitoring, profile.gateway
    if m.gateway or gw is None:
        return m.gateway, None
    bind = gw.prometheus_host
    if bind in ("0.0.0.0", "::"):
        return f"{url_host(gw.host)}:{gw.prometheus_port}", None
    if not is_loopback(bind):
        return f"{url_host(bind)}:{gw.prometheus_port}", None
    return None, (f"monitoring.gateway: smg's metrics listen on {bind}:{gw.prometheus_port} of the gateway host "
                  f"{gw.host} only ([gateway] prometheus_host), which a Prometheus on another host cannot scrape, so "
                  "no gateway job is rendered; set [gateway] prometheus_host = \"0.0.0.0\" (and keep the port "
                  "on a trusted network), or [monitoring] gateway = \"HOST:PORT\" with the address your "
                  "Prometheus reaches it at")


def scrape_notes(profile: Profile) -> list[str]:
    """What the rendered scrape configuration could not know, one ``key: problem; fix`` line each (render warns
    them and writes them into prometheus.yml)."""
    return [note for note in (_gateway_target(profile)[1],) if note]


def settings(profile: Profile) -> Settings:
    """Resolve ``[monitoring]``: default job names from the service name, the target from host/port, the
    running limit from ``max_running_requests`` (48 with EAGLE, SGLang's pick), the accept-length floor
    (1.5) only with speculative decoding."""
    m, s, name = profile.monitoring, profile.sglang, profile.service.name
    deployment = resolve(profile, launches=False)  # the servers' scrape targets and the gateway's name
    running = m.running_limit or s.max_running_requests
    if running is None and s.speculative_algorithm in ("EAGLE", "EAGLE3"):
        running = EAGLE_RUNNING_DEFAULT
    spec_min = m.spec_accept_length_min
    if spec_min is None and s.speculative_algorithm is not None:
        spec_min = SPEC_ACCEPT_MIN_DEFAULT
    slo = {k: v for k, v in m.slo.model_dump().items() if v is not None}
    # node_exporter (at [monitoring] node_exporter's port) on every host that writes a check textfile
    hosts = check_hosts(profile)
    exporters = (tuple(f"{url_host(h)}:{_port_of(m.node_exporter)}" for h in hosts)
                 if hosts and is_loopback(m.node_exporter.rsplit(":", 1)[0].strip("[]")) else (m.node_exporter,))
    gateway, _ = _gateway_target(profile)
    return Settings(
        service=name, job=m.job or name, targets=tuple(m.targets) or deployment.metrics_targets,
        check_job=m.check_job or f"{name}-check", node_exporters=exporters, gateway=gateway,
        gateway_job=(m.gateway_job or deployment.units.gateway_name) if gateway else None,
        scrape_interval_s=m.scrape_interval_s, labels=dict(m.labels), slo_ms=slo,
        slo_for_minutes=m.slo_for_minutes, check_max_age_hours=m.check_max_age_hours, running_limit=running,
        aborted_ratio=m.aborted_ratio, spec_accept_length_min=spec_min, runbook_url=m.runbook_url,
        start_minutes=-(-profile.service.timeout_start_sec // 60),
        quality=profile.quality is not None and profile.quality.nightly,
    )


# ---------------------------------------------------------------- YAML


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))


def to_yaml(data: Any, indent: int = 0) -> str:
    """``data`` (dicts, lists, str, int, float, bool) as block-style YAML text ending in a newline."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(data, Mapping):
        for key, value in data.items():
            if isinstance(value, (Mapping, list, tuple)) and value:
                lines.append(f"{pad}{key}:")
                lines.append(to_yaml(value, indent + 2).rstrip("\n"))
            elif isinstance(value, (Mapping, list, tuple)):
                lines.append(f"{pad}{key}: {'{}' if isinstance(value, Mapping) else '[]'}")
            else:
                lines.append(f"{pad}{key}: {_scalar(value)}")
    elif isinstance(data, (list, tuple)):
        for item in data:
            if isinstance(item, (Mapping, list, tuple)) and item:
                text = to_yaml(item, indent + 2).rstrip("\n")
                lines.append(f"{pad}- " + text[indent + 2:])
            else:
                lines.append(f"{pad}- {_scalar(item)}")
    else:
        lines.append(pad + _scalar(data))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- scrape configuration


def rules_file(st: Settings) -> str:
    """File name of the rules: ``<name>.rules.yml``."""
    return f"{st.service}.rules.yml"


def scrape_configs(st: Settings) -> list[dict[str, Any]]:
    """The ``scrape_configs`` entries: the server(s), the check textfile via node_exporter, the gateway."""
    labels = dict(st.labels)
    jobs: list[dict[str, Any]] = [{
        "job_name": st.job,
        "scrape_interval": f"{st.scrape_interval_s}s",
        "metrics_path": "/metrics",
        "static_configs": [{"targets": list(st.targets), "labels": {"service": st.service, **labels}}],
    }, {
        "job_name": st.check_job,
        "scrape_interval": f"{st.scrape_interval_s}s",
        "metrics_path": "/metrics",
        # the textfile's own service label (check --profile writes it) wins over the target's, which fills it
        # in for a textfile written without a profile
        "honor_labels": True,
        "static_configs": [{"targets": list(st.node_exporters), "labels": {"service": st.service, **labels}}],
        # node_exporter's own series belong to the host's node job; keep only this service's check textfile
        # (another service's on the same node_exporter is its own check job's)
        "metric_relabel_configs": [
            {"source_labels": ["__name__"], "regex": "kimi_deploy_check_.*", "action": "keep"},
            # a service name is [A-Za-z0-9_.:-] (values.UNIT_STEM): "." is its one regex metacharacter
            {"source_labels": ["service"], "regex": st.service.replace(".", "\\."), "action": "keep"},
        ],
    }]
    if st.gateway:
        jobs.append({
            "job_name": st.gateway_job,
            "scrape_interval": f"{st.scrape_interval_s}s",
            "metrics_path": "/metrics",
            "static_configs": [{"targets": [st.gateway], "labels": {"service": st.service, **labels}}],
        })
    return jobs


def prometheus_config(profile: Profile, header: str) -> str:
    """A complete ``prometheus.yml`` for the deployment (``promtool check config`` accepts it).

    Merge its ``scrape_configs`` and ``rule_files`` into an existing Prometheus configuration; the
    ``global`` block only makes the file complete.
    """
    st = settings(profile)
    doc = {
        "global": {"scrape_interval": f"{st.scrape_interval_s}s",
                   "evaluation_interval": f"{st.scrape_interval_s}s"},
        "rule_files": [rules_file(st)],
        "scrape_configs": scrape_configs(st),
    }
    return (f"{header}\n"
            "# Prometheus scrape jobs and rule file for this deployment: merge scrape_configs and rule_files into\n"
            "# your prometheus.yml. No credentials: SGLang serves /metrics without the API key, so keep the\n"
            "# server port (and node_exporter's, smg's --prometheus-port) reachable only from a trusted network\n"
            "# (docs/runbook.md#monitoring).\n"
            + "".join(f"# NOTE {note}\n" for note in scrape_notes(profile)) + to_yaml(doc))


# ---------------------------------------------------------------- rules


@dataclasses.dataclass(frozen=True)
class Alert:
    """One alert rule: name, PromQL, ``for`` duration, severity, one-line summary, runbook anchor."""

    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str

    @property
    def anchor(self) -> str:
        """GitHub's anchor of the alert runbook's heading ``### `Name``` (docs/runbook.md): the name in lower case."""
        return self.name.lower()


def _sel(job: str, extra: str = "") -> str:
    return "{" + f'job="{job}"' + (f", {extra}" if extra else "") + "}"


def recording_rules(st: Settings) -> list[dict[str, str]]:
    """Recording rules: latency quantiles per job, queue/running per server, request and abort rates."""
    j = _sel(st.job)
    rules: list[dict[str, str]] = []
    for metric, short in (("time_to_first_token_seconds", "ttft"), ("inter_token_latency_seconds", "itl"),
                          ("e2e_request_latency_seconds", "e2e")):
        for q in ("0.5", "0.9", "0.99"):
            rules.append({
                "record": f"job:sglang_{metric}:p{q[2:].ljust(2, '0')}_{WINDOW}",
                "expr": f"histogram_quantile({q}, sum by (job, le) (rate(sglang:{metric}_bucket{j}[{WINDOW}])))",
            })
    rules += [
        {"record": "instance:sglang_num_running_reqs:sum", "expr": f"sum by (job, instance) (sglang:num_running_reqs{j})"},
        {"record": "instance:sglang_num_queue_reqs:sum", "expr": f"sum by (job, instance) (sglang:num_queue_reqs{j})"},
        {"record": "instance:sglang_token_usage:max", "expr": f"max by (job, instance) (sglang:token_usage{j})"},
        {"record": "instance:sglang_gen_throughput:sum", "expr": f"sum by (job, instance) (sglang:gen_throughput{j})"},
        {"record": f"job:sglang_num_requests:rate{WINDOW}",
         "expr": f"sum by (job) (rate(sglang:num_requests_total{j}[{WINDOW}]))"},
        {"record": f"job:sglang_num_aborted_requests:rate{WINDOW}",
         "expr": f"sum by (job) (rate(sglang:num_aborted_requests_total{j}[{WINDOW}]))"},
    ]
    if st.spec_accept_length_min is not None:
        rules.append({"record": "instance:sglang_spec_accept_length:avg",
                      "expr": f"avg by (job, instance) (sglang:spec_accept_length{j})"})
    if st.quality:
        rules.append({"record": SCHEMA_ACCURACY_BEST_LOWER,
                      "expr": f"max_over_time(kimi_deploy_check_schema_accuracy_lower_ratio{check_selector(st)}"
                              f"[{QUALITY_WINDOW}])"})
    return rules


#: How far back the schema-accuracy alert looks for a better run.
QUALITY_WINDOW = "7d"
#: The best lower bound of the schema accuracy's 95 % interval over :data:`QUALITY_WINDOW` (recording rule).
SCHEMA_ACCURACY_BEST_LOWER = f"service:kimi_deploy_check_schema_accuracy_lower_ratio:max_over_time{QUALITY_WINDOW}"


def _ms(value: float) -> str:
    return f"{value:g} ms"


def check_selector(st: Settings, extra: str = "") -> str:
    """The selector of this service's check textfile series: its check job and its ``service`` label (the
    textfile's own, :func:`kimi_deploy.check.reports.to_prometheus`), so the rules and the dashboard read this
    service's results even where one job scrapes several services' textfiles."""
    return _sel(st.check_job, f'service="{st.service}"' + (f", {extra}" if extra else ""))


def alerts(st: Settings) -> list[Alert]:
    """Every alert of the deployment, in the order the alert runbook (docs/runbook.md#alert-runbook) lists them."""
    j, c = _sel(st.job), check_selector(st)
    out = [
        Alert("KimiServerDown", f"up{j} == 0", "2m", "page",
              "SGLang server {{ $labels.instance }} does not answer /metrics",
              "Prometheus could not scrape {{ $labels.instance }} (job {{ $labels.job }}) for 2 minutes: the server "
              "is down, restarting, or the port is not reachable from Prometheus."),
        Alert("KimiServerNotReady", f"up{j} == 1 unless on (job, instance) sglang:num_running_reqs{j}",
              f"{st.start_minutes}m", "page",
              "SGLang server {{ $labels.instance }} answers but its scheduler reports nothing",
              f"/metrics answers but the scheduler has reported no gauge for longer than the unit's start timeout "
              f"({st.start_minutes} min): the model never finished loading."),
        Alert("KimiNightlyCheckFailed",
              f"kimi_deploy_check_exit_code{c} != 0 and kimi_deploy_check_exit_code{c} != {INTERRUPTED_EXIT}",
              "0m", "page", "The last kimi-deploy check failed (exit {{ $value }})",
              "Exit 1: a check failed; exit 2: the check could not run as configured (a profile, key file or URL "
              "it refused; on a gateway host also a worker URL or key rule); exit 3: the server did not answer; "
              "any other code: the check itself crashed (journalctl -u the check unit). Exit 130 (interrupted) is "
              "KimiNightlyCheckInterrupted, not this alert. The JSON report in "
              f"{paths.service_check_report(st.service)} names each failing check and its evidence."),
        Alert("KimiNightlyCheckInterrupted", f"kimi_deploy_check_interrupted{c} == 1", "0m", "warning",
              "The last kimi-deploy check was interrupted before it finished",
              "A signal stopped the run (systemctl stop, a shutdown, or the unit's TimeoutStartSec=): exit 130. "
              "The report holds the checks that finished and lists the others under interrupted.not_run; no "
              "finished check failed, or KimiNightlyCheckFailed would say so next run. Once: a stop or reboot. "
              "Every night: the run outlasts TimeoutStartSec= (lower --deadline or raise the timeout)."),
        Alert("KimiNightlyCheckStale",
              f"time() - kimi_deploy_check_last_run_timestamp_seconds{c} > {st.check_max_age_hours * 3600}",
              "0m", "ticket", f"The last kimi-deploy check ran more than {st.check_max_age_hours} h ago",
              "The nightly check timer did not run, or the check could not write its textfile."),
        Alert("KimiNightlyCheckMissing", f"absent(kimi_deploy_check_last_run_timestamp_seconds{c})",
              f"{st.check_max_age_hours}h", "ticket",
              f"No kimi-deploy check result has been scraped for {st.check_max_age_hours} h",
              "node_exporter does not read check.prom (textfile directory, permissions) or the check never ran."),
        Alert("KimiToolCallContractBroken",
              "kimi_deploy_check_status" + check_selector(st, 'check=~"(parser|contract)[.].+"') + " == 2",
              "0m", "page", "{{ $labels.check }} failed: {{ $labels.kind }}",
              "The nightly check found the API contract broken ({{ $labels.kind }}): clients get raw tool-call "
              "markup, dropped or wrong tool calls. Every request of that shape fails until it is fixed."),
        # the budget is the median of the starts before the last one times [startup] budget_factor, or the
        # profile's fixed budget_sec (kimi_deploy.host.start_history.budgets); both series come from one textfile
        Alert("KimiStartSlower",
              f"kimi_deploy_check_start_phase_seconds{c} > on (job, instance, service, phase) "
              f"kimi_deploy_check_start_phase_budget_seconds{c}", "0m", "ticket",
              "The last start's {{ $labels.phase }} phase took {{ $value | humanizeDuration }}, over its budget",
              "Starts are growing slower: this phase of the last recorded start is over its budget ([startup] "
              "budget_sec, else budget_factor x the median of the starts before it). weights: the page cache was "
              "cold (the prefetch skipped or stopped: journalctl -u the server unit | grep prefetch:) or the disk "
              "is slower; cuda_graphs: the JIT caches were rebuilt (a new SGLang, driver or cache key). `kimi-deploy "
              "status` lists the recorded starts."),
    ]
    if st.quality:
        # a drop beyond the interval: this run's whole 95 % interval lies under the lower bound of a run of the
        # last week, so the two intervals do not overlap (a conservative test: noise alone does not fire it)
        out.append(Alert(
            "KimiSchemaAccuracyDropped",
            f"kimi_deploy_check_schema_accuracy_upper_ratio{c} < on (job, instance, service) "
            f"{SCHEMA_ACCURACY_BEST_LOWER}{c}", "0m", "ticket",
            "Tool-call schema accuracy dropped to {{ $value | humanizePercentage }} (upper bound of its 95 % "
            "interval)",
            f"The nightly quality sample's schema accuracy is below the range of a run of the last {QUALITY_WINDOW}: "
            "the upper bound of its 95 % interval is under that run's lower bound, a drop beyond sampling noise. "
            "Compare the two JSON reports with `kimi-deploy check compare`."))
    names = {"ttft": ("KimiTTFTOverSLO", "time_to_first_token_seconds", "time to first token"),
             "tpot": ("KimiITLOverSLO", "inter_token_latency_seconds", "inter-token latency"),
             "e2e": ("KimiE2EOverSLO", "e2e_request_latency_seconds", "end-to-end latency")}
    for key, limit in st.slo_ms.items():
        name, metric, what = names[key]
        out.append(Alert(
            name, f"job:sglang_{metric}:p99_{WINDOW}{j} > {limit / 1000:g}", f"{st.slo_for_minutes}m", "page",
            f"p99 {what} of {{{{ $labels.job }}}} is over the SLO of {_ms(limit)}",
            f"p99 {what} over {WINDOW} is {{{{ $value | humanizeDuration }}}}, above [monitoring.slo] {key} = "
            f"{limit:g} ms for {st.slo_for_minutes} min."))
    queue = f"instance:sglang_num_queue_reqs:sum{j}"
    growing = f"{queue} > 0 and deriv({queue}[10m]) > 0"
    if st.running_limit is not None:
        growing += f" and on (job, instance) instance:sglang_num_running_reqs:sum{j} >= {st.running_limit}"
    out += [
        Alert("KimiQueueGrowingAtLimit", growing, "10m", "page",
              "Requests queue up on {{ $labels.instance }}"
              + (f" while {st.running_limit} are running" if st.running_limit else ""),
              "The waiting queue has grown for 10 minutes"
              + (f" with running requests at the limit ({st.running_limit})" if st.running_limit else "")
              + ": offered load exceeds capacity; TTFT rises for everyone."),
        Alert("KimiRequestsAborted",
              f"job:sglang_num_aborted_requests:rate{WINDOW}{j} > {st.aborted_ratio:g} * "
              f"job:sglang_num_requests:rate{WINDOW}{j}", "10m", "ticket",
              f"More than {st.aborted_ratio:.0%} of requests to {{{{ $labels.job }}}} are aborted",
              "SGLang aborts requests that clients cancel, that time out, or that it cannot serve "
              "(context too long, out of memory)."),
    ]
    if st.spec_accept_length_min is not None:
        out.append(Alert(
            "KimiSpecAcceptLengthCollapsed",
            f"instance:sglang_spec_accept_length:avg{j} < {st.spec_accept_length_min:g} "
            f"and on (job) job:sglang_num_requests:rate{WINDOW}{j} > 0", "15m", "ticket",
            "Speculative decoding on {{ $labels.instance }} accepts {{ $value }} tokens per step",
            f"Mean accepted tokens per step stayed under {st.spec_accept_length_min:g} for 15 min while serving: "
            "a wrong or mismatched draft model, or a patch that broke the draft path. Decoding is slower than "
            "without speculation."))
    if st.gateway_job:
        g = _sel(st.gateway_job)
        out += [
            Alert("KimiGatewayDown", f"up{g} == 0", "2m", "page",
                  "SGLang gateway {{ $labels.instance }} does not answer /metrics",
                  "Prometheus could not scrape the gateway (smg) for 2 minutes."),
            Alert("KimiGatewayWorkerUnhealthy", f"smg_worker_health{g} == 0", "2m", "page",
                  "Gateway worker {{ $labels.worker }} is unhealthy",
                  "smg's health checks of this worker fail; it gets no traffic."),
            Alert("KimiGatewayCircuitOpen", f"smg_worker_cb_state{g} == 1", "1m", "page",
                  "Gateway circuit breaker of {{ $labels.worker }} is open",
                  "Requests to this worker failed repeatedly; smg stopped sending it traffic."),
        ]
    return out


def rules_doc(profile: Profile, st: Settings | None = None) -> dict[str, Any]:
    """The rule file as a mapping (two groups: recording, alerts); ``st`` overrides :func:`settings` (the
    Kubernetes target knows its gateway job where the systemd render may not)."""
    st = st or settings(profile)
    alert_rules = []
    for a in alerts(st):
        rule: dict[str, Any] = {"alert": a.name, "expr": a.expr}
        if a.for_ != "0m":
            rule["for"] = a.for_
        rule["labels"] = {"severity": a.severity, "service": st.service, **st.labels}
        rule["annotations"] = {"summary": a.summary, "description": a.description,
                               "runbook_url": f"{st.runbook_url}#{a.anchor}"}
        alert_rules.append(rule)
    return {"groups": [
        {"name": f"kimi-deploy-{st.service}-recording", "interval": f"{st.scrape_interval_s}s",
         "rules": recording_rules(st)},
        {"name": f"kimi-deploy-{st.service}-alerts", "interval": f"{st.scrape_interval_s}s", "rules": alert_rules},
    ]}


def rules_text(profile: Profile, header: str) -> str:
    """The rule file (``promtool check rules`` accepts it)."""
    return (f"{header}\n# Recording and alert rules; each alert's runbook_url points into docs/runbook.md#alert-runbook.\n"
            + to_yaml(rules_doc(profile)))
