"""Issue 27, the tier in operation: a profile's ``[quality]`` table puts the tier into the nightly unit with its
sample size and a grown time budget; the rendered rules carry a recording rule and an alert for a drop of schema
accuracy beyond its interval, proven with `promtool test rules` on textfiles the real `kimi-deploy check` wrote
against scripted loopback servers (tests/quality_server.py); the dashboard gets a panel with the trend."""

from __future__ import annotations

import json
import re
import time

import pytest

from helpers import run_cli
from kimi_deploy.targets import systemd as render_mod
from kimi_deploy.targets.prometheus import SCHEMA_ACCURACY_BEST_LOWER, rules_doc, to_yaml
from kimi_deploy.profile import parse_profile
from kimi_deploy.targets.systemd import render
from monitoring_helpers import PRESET, promtool, rule_test_doc, write_monitoring
from kimi_deploy.catalog.presets import get_preset
from quality_server import QualityServer

SCRAPE = {"job": "kimi-k25-check", "instance": "127.0.0.1:9100", "service": "kimi-k25"}
SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$")


def _profile(quality: dict | None):
    data = get_preset(PRESET).data
    return parse_profile({**data, **({"quality": quality} if quality is not None else {})})


def _check_unit(profile) -> str:
    files = render(profile).files
    return next(text for name, text in files.items() if name.startswith("kimi-deploy-check@") and
                name.endswith(".service"))


def test_no_quality_table_keeps_the_nightly_unit_and_its_digest():
    plain = _profile(None)
    unit = _check_unit(plain)
    assert "--sample" not in unit and "TimeoutStartSec=1560\n" in unit
    assert plain.digest() == parse_profile(get_preset(PRESET).data).digest()
    assert "KimiSchemaAccuracyDropped" not in json.dumps(rules_doc(plain))


def test_a_quality_table_runs_the_tier_nightly_with_its_budget():
    profile = _profile({"sample": 300, "deadline_s": 900.0})
    unit = _check_unit(profile)
    deadline = render_mod.CHECK_DEADLINE_S + render_mod.QUALITY_FIXED_S + 900
    assert f" --sample 300 --deadline {deadline} " in unit
    assert f"TimeoutStartSec={deadline + render_mod.CHECK_SLACK_S}\n" in unit
    off = _check_unit(_profile({"nightly": False}))
    assert "--sample" not in off and "TimeoutStartSec=1560\n" in off


def test_the_command_of_the_nightly_unit_parses_and_selects_the_tier(tmp_path):
    """The rendered ExecStart's arguments are accepted by the real CLI (--list: nothing is sent)."""
    unit = _check_unit(_profile({"sample": 50}))
    argv = next(line for line in unit.splitlines() if line.startswith("ExecStart=")).split()[1:]
    profile = tmp_path / "p.toml"
    from kimi_deploy.profile import dump_profile

    profile.write_text(dump_profile(_profile({"sample": 50})))
    argv = [a if not a.endswith(".toml") else str(profile) for a in argv]
    result = run_cli([*argv, "--list"])
    assert result.exit_code == 0, result.stderr
    assert "quality.accuracy" in result.stdout


def _textfile(tmp_path, name: str, invalid_rate: float, seed: int) -> str:
    prom = tmp_path / f"{name}.prom"
    profile = tmp_path / "p.toml"
    with QualityServer(invalid_rate=invalid_rate, seed=seed) as server:
        profile.write_text(f'[service]\nname = "kimi-k25"\n\n[sglang]\nmodel_path = "/models/k"\n'
                           f'port = {server.loop.port}\n\n[quality]\nsample = 150\nmin_schema_accuracy = 0.5\n')
        result = run_cli(["check", "--profile", str(profile), "--only", "quality.accuracy", "--sample", "150",
                          "--prom", str(prom)])
    assert result.exit_code == 0, result.stdout + result.stderr
    return prom.read_text()


@pytest.fixture(scope="module")
def textfiles(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("quality-prom")
    return {"good": _textfile(tmp, "good", 0.02, 1), "same": _textfile(tmp, "same", 0.02, 2),
            "bad": _textfile(tmp, "bad", 0.25, 3)}


def _values(text: str) -> dict[str, float]:
    return {m.group("name"): float(m.group("value")) for line in text.splitlines()
            if not line.startswith("#") and (m := SAMPLE.match(line))}


def _series(before: str, after: str) -> list[dict[str, str]]:
    """Hourly samples: 24 h of the ``before`` run's textfile, then 6 h of the ``after`` run's."""
    a, b = _values(before), _values(after)
    labels = ",".join(f'{k}="{v}"' for k, v in SCRAPE.items())
    return [{"series": f"{name}{{{labels}}}", "values": f"{a[name]:g}x23 {b[name]:g}x6"}
            for name in ("kimi_deploy_check_schema_accuracy_lower_ratio", "kimi_deploy_check_schema_accuracy_upper_ratio")]


def test_the_drop_alert_fires_on_a_drop_and_stays_silent_within_noise(textfiles, tmp_path):
    profile = _profile({"sample": 150})
    files = write_monitoring(profile, tmp_path)
    rules = {r.get("alert") or r.get("record"): r for g in rules_doc(profile)["groups"] for r in g["rules"]}
    alert = rules["KimiSchemaAccuracyDropped"]
    assert SCHEMA_ACCURACY_BEST_LOWER in rules
    upper = _values(textfiles["bad"])["kimi_deploy_check_schema_accuracy_upper_ratio"]
    good, bad, same = (_values(textfiles[k]) for k in ("good", "bad", "same"))
    # the scenario holds: the bad run's interval lies wholly under the good run's, the same-rate run's does not
    assert bad["kimi_deploy_check_schema_accuracy_upper_ratio"] < good["kimi_deploy_check_schema_accuracy_lower_ratio"]
    assert same["kimi_deploy_check_schema_accuracy_upper_ratio"] >= good["kimi_deploy_check_schema_accuracy_lower_ratio"]
    labels = {**SCRAPE, **alert["labels"]}
    annotations = {k: v.replace("{{ $value | humanizePercentage }}", f"{upper * 100:.4g}%")
                   for k, v in alert["annotations"].items()}
    tests = [
        {"name": "a drop beyond the interval fires", "interval": "1h", "input_series": _series(textfiles["good"],
                                                                                             textfiles["bad"]),
         "alert_rule_test": [{"eval_time": "26h", "alertname": alert["alert"],
                              "exp_alerts": [{"exp_labels": labels, "exp_annotations": annotations}]}]},
        {"name": "the same rate again is silent", "interval": "1h",
         "input_series": _series(textfiles["good"], textfiles["same"]),
         "alert_rule_test": [{"eval_time": "26h", "alertname": alert["alert"], "exp_alerts": []}]},
        {"name": "a rise is silent", "interval": "1h", "input_series": _series(textfiles["bad"], textfiles["good"]),
         "alert_rule_test": [{"eval_time": "26h", "alertname": alert["alert"], "exp_alerts": []}]},
    ]
    doc = rule_test_doc(profile, files["kimi-k25.rules.yml"].name, tests, "1h")
    (tmp_path / "quality.test.yml").write_text(to_yaml(doc))
    done = promtool("test", "rules", "quality.test.yml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    checked = promtool("check", "rules", files["kimi-k25.rules.yml"].name, cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_dashboard_shows_the_accuracy_with_its_interval():
    from kimi_deploy.targets.dashboard import panel_queries
    from kimi_deploy.targets.prometheus import settings

    profile = _profile({})
    panels = {title: queries for _, title, queries in panel_queries(settings(profile), True)}
    title = next(t for t in panels if t.startswith("Tool-call schema accuracy"))
    exprs = [e for e, _ in panels[title]]
    assert [e.split("{")[0] for e in exprs] == ["kimi_deploy_check_schema_accuracy_ratio",
                                                "kimi_deploy_check_schema_accuracy_lower_ratio",
                                                "kimi_deploy_check_schema_accuracy_upper_ratio",
                                                "kimi_deploy_check_schema_accuracy_threshold_ratio"]
    assert not any(t.startswith("Tool-call schema") for _, t, _ in panel_queries(settings(_profile(None)), True))


def test_measured_budget_of_the_tier_against_a_loopback_server(capsys):
    """The figures docs/design.md#the-quality-tier quotes: the tier as the nightly runs it (pre-flight, the 60-request corpus,
    200 samples at concurrency 4) against the scripted loopback server on this machine. Not a bound on a real
    model (one generation there takes seconds); it shows the kit's own overhead is small against the budget."""
    with QualityServer() as server:
        t0 = time.monotonic()
        result = run_cli(["check", "--base-url", server.url, "--only", "quality.*", "--sample", "200",
                          "--quality-concurrency", "4"])
        elapsed = time.monotonic() - t0
    assert result.exit_code == 0, result.stdout
    with capsys.disabled():
        print(f"\nquality tier against loopback: {len(server.requests)} requests in {elapsed:.1f} s")
    assert len(server.requests) == 5 + 60 + 200 - 3  # thinking x2, sampling/prompt-tokens send nothing (skipped)
    assert elapsed < render_mod.QUALITY_FIXED_S


def test_a_relative_dataset_in_the_profile_is_refused():
    from kimi_deploy.errors import ProfileError

    with pytest.raises(ProfileError) as info:
        _profile({"dataset": "samples.jsonl"})
    assert any("quality.dataset" in p and "absolute" in p for p in info.value.problems)


def test_cli_refuses_bad_quality_options_before_sending_anything(tmp_path):
    with QualityServer() as server:
        for args, words in ((["--sample", "0"], "--sample"), (["--dataset", str(tmp_path / "none.jsonl")],
                                                              "cannot read the dataset"),
                            (["--min-schema-accuracy", "1.5"], "--min-schema-accuracy"),
                            (["--quality-deadline", "nan"], "--quality-deadline")):
            result = run_cli(["check", "--base-url", server.url, *args])
            assert result.exit_code == 2 and words in result.stderr, (args, result.stderr)
    assert server.requests == []
