"""``[monitoring]`` in the profile: every bad value is exit 2 naming the key, the value and a fix; the SLO keys
are ``bench --slo``'s; the option table turns metrics on in the preset and ``init``."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from helpers import MINIMAL, run_cli, write_profile
from kimi_deploy.bench.params import SLO_KEYS
from kimi_deploy.catalog.presets import get_preset
from kimi_deploy.profile import SLO, dump_profile, parse_profile

SPEC = ('speculative_algorithm = "EAGLE3"\nspeculative_draft_model_path = "/m/d"\nspeculative_num_steps = 3\n'
        "speculative_eagle_topk = 1\nspeculative_num_draft_tokens = 4\n")
MON = MINIMAL + "enable_metrics = true\n" + SPEC + "\n[monitoring]\n"

CASES = [
    ("unknown-key", MON + "jobb = \"x\"\n", ["monitoring.jobb: unknown key", "did you mean job?"]),
    ("unknown-slo-key", MON + "[monitoring.slo]\nttfb = 1.0\n", ["monitoring.slo.ttfb: unknown key",
                                                                  "did you mean ttft?"]),
    ("slo-negative", MON + "[monitoring.slo]\nttft = -5.0\n", ["monitoring.slo.ttft", "greater than 0"]),
    ("slo-nan", MON + "[monitoring.slo]\ntpot = nan\n", ["monitoring.slo.tpot", "finite"]),
    ("slo-string", MON + '[monitoring.slo]\ntpot = "50ms"\n', ["monitoring.slo.tpot", "'50ms'"]),
    ("bad-target", MON + 'targets = ["10.0.0.5"]\n', ["monitoring.targets", "HOST:PORT"]),
    ("bad-port", MON + 'targets = ["10.0.0.5:70000"]\n', ["monitoring.targets", "1-65535"]),
    ("bare-ipv6", MON + 'node_exporter = "::1:9100"\n', ["monitoring.node_exporter", "brackets"]),
    ("target-twice", MON + 'targets = ["a:1", "a:1"]\n', ["monitoring.targets", "twice"]),
    ("bad-job", MON + 'job = "kimi k25"\n', ["monitoring.job", "'kimi k25'"]),
    ("job-quote", MON + 'job = "a\\"b"\n', ["monitoring.job"]),
    ("same-jobs", MON + 'job = "x"\ncheck_job = "x"\n', ["jobs must differ"]),
    ("reserved-label", MON + 'labels = { instance = "a" }\n', ["monitoring.labels", "'instance' is set by the kit"]),
    ("bad-label-name", MON + 'labels = { "1x" = "a" }\n', ["monitoring.labels", "'1x'"]),
    ("template-label", MON + 'labels = { team = "{{ $value }}" }\n', ["monitoring.labels", "as a template"]),
    ("empty-label", MON + 'labels = { team = "" }\n', ["monitoring.labels", "1-255"]),
    ("interval-zero", MON + "scrape_interval_s = 0\n", ["monitoring.scrape_interval_s", "greater than or equal to 1"]),
    ("ratio-above-one", MON + "aborted_ratio = 1.5\n", ["monitoring.aborted_ratio", "less than or equal to 1"]),
    ("accept-above-draft", MON + "spec_accept_length_min = 5.0\n",
     ["monitoring.spec_accept_length_min: 5.0 is above speculative_num_draft_tokens = 4"]),
    ("accept-without-spec", MINIMAL + "enable_metrics = true\n\n[monitoring]\nspec_accept_length_min = 1.5\n",
     ["no speculative_algorithm is set"]),
    ("limit-above-max", MINIMAL + "max_running_requests = 16\n\n[monitoring]\nrunning_limit = 32\n",
     ["monitoring.running_limit: 32 is above sglang.max_running_requests = 16"]),
    ("gateway-job-alone", MON + 'gateway_job = "gw"\n', ["gateway_job: set without monitoring.gateway"]),
    ("runbook-hash", MON + 'runbook_url = "https://x/docs/runbook.md#a"\n', ["monitoring.runbook_url", "'#'"]),
    ("stale-hours", MON + "check_max_age_hours = 0\n", ["monitoring.check_max_age_hours"]),
]


@pytest.mark.parametrize("text,needles", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_monitoring_values_exit_2(tmp_path, text, needles):
    result = run_cli(["render", "--profile", str(write_profile(tmp_path, text)), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.stdout + result.stderr
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)
    assert not (tmp_path / "out").exists()


def test_slo_keys_are_bench_slo_keys():
    assert tuple(SLO.model_fields) == SLO_KEYS


def test_preset_and_init_turn_metrics_on(tmp_path):
    assert get_preset("kimi-k25-rtx-pro-6000-x8").profile().sglang.enable_metrics is True
    path = tmp_path / "p.toml"
    assert run_cli(["init", str(path)]).exit_code == 0
    data = tomllib.loads(path.read_text())
    assert data["sglang"]["enable_metrics"] is True
    result = run_cli(["render", "--profile", str(path), "--print-command"])
    assert "--enable-metrics" in result.stdout


def test_extra_args_may_not_set_enable_metrics(tmp_path):
    result = run_cli(["render", "--profile", str(write_profile(tmp_path, MINIMAL + 'extra_args = ["--enable-metrics"]\n'))])
    assert result.exit_code == 2 and "use [sglang] enable_metrics instead" in result.stderr


def test_metrics_off_renders_no_prometheus_files(tmp_path):
    result = run_cli(["render", "--profile", str(write_profile(tmp_path, MINIMAL)), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0
    assert not (tmp_path / "out" / "monitoring").exists()
    assert "enable_metrics is off" in result.stderr


def test_dumped_profile_keeps_monitoring():
    profile = parse_profile(tomllib.loads(MON + 'labels = { team = "inference" }\n[monitoring.slo]\ne2e = 9000.0\n'))
    again = parse_profile(tomllib.loads(dump_profile(profile)))
    assert again.digest() == profile.digest() and again.monitoring.slo.e2e == 9000.0


def test_render_writes_and_lists_the_monitoring_files(tmp_path):
    import json

    out = tmp_path / "out"
    result = run_cli(["render", "--preset", "kimi-k25-rtx-pro-6000-x8", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.stderr
    listed = json.loads(result.stdout)["monitoring"]
    assert sorted(listed) == ["kimi-k25.dashboard.json", "kimi-k25.rules.yml", "prometheus.yml"]
    assert all(Path(path).parent == out / "monitoring" and Path(path).is_file() for path in listed.values())
    assert sorted(p.name for p in out.iterdir() if p.is_file() and p.name != ".kimi-deploy-render.json") == sorted(
        # install's files stay as they were (render's record of the folder aside)
        ["kimi-k25.service", "kimi-k25.env", "kimi-deploy-check@kimi-k25.service", "kimi-deploy-check@kimi-k25.timer"])
