"""Profile -> a Grafana dashboard (JSON) of one deployment, built with grafana-foundation-sdk.

Grafana's own maintained, generated SDK (``grafana-foundation-sdk`` on PyPI, builders for the dashboard
schema) rather than hand-written JSON: the panel, target and field-config shapes come from Grafana's schema,
so a key Grafana renamed fails here, not silently in the browser. The panels read the recording rules of
:mod:`kimi_deploy.targets.prometheus` where there is one (the same series the alerts read) and the raw metrics
otherwise; :func:`panel_queries` lists every PromQL expression (tests parse them with promtool and evaluate
them on a real Prometheus). The datasource is a dashboard variable (``${datasource}``, type prometheus).
"""

from __future__ import annotations

import json

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus as gp
from grafana_foundation_sdk.builders import stat as gstat
from grafana_foundation_sdk.builders import timeseries as gts
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm

from kimi_deploy.targets.prometheus import WINDOW, Settings, check_selector, settings
from kimi_deploy.profile import Profile

DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")


def _sel(job: str) -> str:
    return "{" + f'job="{job}"' + "}"


def panel_queries(st: Settings, speculative: bool) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """``(row title, panel title, [(expr, legend)])`` of every panel, in dashboard order."""
    j, c = _sel(st.job), check_selector(st)
    latency = []
    for title, metric in (("TTFT", "time_to_first_token_seconds"), ("ITL (inter-token latency)",
                                                                      "inter_token_latency_seconds"),
                          ("E2E request latency", "e2e_request_latency_seconds")):
        latency.append(("Latency", title, [(f"job:sglang_{metric}:p{p}_{WINDOW}{j}", f"p{p}")
                                           for p in ("50", "90", "99")]))
    panels = latency + [
        ("Load", "Running and queued requests", [
            (f"instance:sglang_num_running_reqs:sum{j}", "running {{instance}}"),
            (f"instance:sglang_num_queue_reqs:sum{j}", "queued {{instance}}")]),
        ("Load", "Token usage (KV cache)", [(f"instance:sglang_token_usage:max{j}", "{{instance}}")]),
        ("Load", "Generation throughput (tokens/s)", [(f"instance:sglang_gen_throughput:sum{j}", "{{instance}}")]),
        ("Load", "Requests and aborts (per second)", [
            (f"job:sglang_num_requests:rate{WINDOW}{j}", "requests"),
            (f"job:sglang_num_aborted_requests:rate{WINDOW}{j}", "aborted")]),
    ]
    if speculative:
        panels.append(("Speculative decoding", "Accept length (tokens per step)", [
            (f"instance:sglang_spec_accept_length:avg{j}", "{{instance}}"),
            (f"avg by (job, instance) (sglang:spec_accept_rate{j})", "accept rate {{instance}}")]))
    panels += [
        ("Nightly check", "Last check result per check id (0 pass, 1 warn, 2 fail, 3 skip)",
         [(f"kimi_deploy_check_status{c}", "{{check}} {{kind}}")]),
        ("Nightly check", "Hours since the last check", [
            (f"(time() - kimi_deploy_check_last_run_timestamp_seconds{c}) / 3600", "{{instance}}")]),
        ("Nightly check", "Exit code of the last check", [(f"kimi_deploy_check_exit_code{c}", "{{instance}}")]),
    ]
    if st.quality:
        panels.append(("Nightly check", "Tool-call schema accuracy with its 95 % interval (K2VV's measure)", [
            (f"kimi_deploy_check_schema_accuracy_ratio{c}", "accuracy"),
            (f"kimi_deploy_check_schema_accuracy_lower_ratio{c}", "95 % interval, lower"),
            (f"kimi_deploy_check_schema_accuracy_upper_ratio{c}", "95 % interval, upper"),
            (f"kimi_deploy_check_schema_accuracy_threshold_ratio{c}", "threshold")]))
    if st.gateway_job:
        g = _sel(st.gateway_job)
        panels += [
            ("Gateway", "Worker health (1 ready, 0 not ready, -1 removed)",
             [(f"smg_worker_health{g}", "{{worker}}")]),
            ("Gateway", "Circuit breaker (0 closed, 1 open, 2 half-open)", [(f"smg_worker_cb_state{g}", "{{worker}}")]),
            ("Gateway", "Retries per second", [(f"sum by (worker) (rate(smg_worker_retries_total{g}[{WINDOW}]))",
                                                "{{worker}}")]),
        ]
    return panels


_UNITS = {"TTFT": "s", "ITL (inter-token latency)": "s", "E2E request latency": "s",
          "Token usage (KV cache)": "percentunit", "Requests and aborts (per second)": "reqps",
          "Hours since the last check": "h",
          "Tool-call schema accuracy with its 95 % interval (K2VV's measure)": "percentunit"}
_STATS = {"Last check result per check id (0 pass, 1 warn, 2 fail, 3 skip)", "Exit code of the last check",
          "Hours since the last check"}


def build(profile: Profile) -> dm.Dashboard:
    """The dashboard model (grafana-foundation-sdk), title ``kimi-deploy <name>``, uid ``kimi-deploy-<name>``."""
    st = settings(profile)
    slo_s = {"TTFT": st.slo_ms.get("ttft"), "ITL (inter-token latency)": st.slo_ms.get("tpot"),
             "E2E request latency": st.slo_ms.get("e2e")}
    board = (gd.Dashboard(f"kimi-deploy {st.service}")
             .uid(f"kimi-deploy-{st.service}"[:40])
             .description(f"SGLang serving {profile.sglang.served_model_name or profile.sglang.model_path}: "
                          "latency, load, speculative decoding, the nightly check, the gateway. Rendered by "
                          "kimi-deploy; change the profile, not this dashboard.")
             .tags(["kimi-deploy", "sglang", st.service])
             .refresh("1m")
             .time("now-6h", "now")
             .timezone("browser")
             .with_variable(gd.DatasourceVariable("datasource").label("Prometheus").type("prometheus")))
    row = None
    for row_title, title, queries in panel_queries(st, profile.sglang.speculative_algorithm is not None):
        if row_title != row:
            board = board.with_row(gd.Row(row_title))
            row = row_title
        panel = (gstat.Panel() if title in _STATS else gts.Panel()).title(title).datasource(DATASOURCE)
        panel = panel.span(24 if title.startswith(("Last check", "Tool-call schema")) else 8).height(8)
        if title in _UNITS:
            panel = panel.unit(_UNITS[title])
        limit = slo_s.get(title)
        if limit:
            panel = panel.description(f"p99 SLO: {limit:g} ms ([monitoring.slo]); the alert fires after "
                                      f"{st.slo_for_minutes} min above it.")
            panel = panel.thresholds(gd.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps([
                dm.Threshold(value=None, color="green"), dm.Threshold(value=limit / 1000, color="red")]))
        for ref, (expr, legend) in zip("ABCDEFGH", queries):
            panel = panel.with_target(gp.Dataquery().expr(expr).legend_format(legend).ref_id(ref))
        board = board.with_panel(panel)
    return board.build()


def dashboard_json(profile: Profile) -> str:
    """The dashboard as Grafana JSON (import it, or provision it from a file), sorted keys, trailing newline."""
    return json.dumps(build(profile), cls=JSONEncoder, sort_keys=True, indent=2) + "\n"

