"""The check alerts, proven with `promtool test rules` on the textfile the real `kimi-deploy check` writes
against the replay server (SGLang 0.5.23's serving layer, tests/replay/server.py): a failing run (the
unpatched kimi_k2 parser drops sanitised tool-call ids: tool_call_dropped) fires the failure alerts, a passing
run keeps them silent; the timestamp alerts fire on a run 27 h old and on no textfile at all."""

from __future__ import annotations

import re

import pytest

from helpers import run_cli
from kimi_deploy.targets.prometheus import rules_doc, to_yaml
from monitoring_helpers import expand, preset_profile, promtool, rule_test_doc, write_monitoring
from test_check_replay import API_KEY, Replay, SERVER, key_file, profile_for  # noqa: F401

pytestmark = pytest.mark.sglang

SCRAPE = {"job": "kimi-k25-check", "instance": "127.0.0.1:9100", "service": "kimi-k25"}
SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@pytest.fixture(scope="module")
def textfiles(sglang_python, tmp_path_factory) -> dict[str, str]:
    """``{"pass": text, "fail": text}``: check.prom of two real check runs against one replay server."""
    tmp = tmp_path_factory.mktemp("check-prom")
    server = Replay(sglang_python, ["--api-key", API_KEY], tmp / "replay.log")
    try:
        url = server.url()
        profile, key = profile_for(tmp, url), key_file(tmp)
        out = {}
        for name, only, code in (("pass", "health.*", 0), ("fail", "contract.id_roundtrip.sanitised.*", 1)):
            prom = tmp / f"{name}.prom"
            result = run_cli(["check", "--profile", str(profile), "--api-key-file", str(key), "--only", only,
                              "--prom", str(prom)])
            assert result.exit_code == code, result.stdout + result.stderr
            out[name] = prom.read_text()
        return out
    finally:
        server.stop()


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """``(name, labels, value)`` of every sample of a Prometheus text exposition."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, line
        labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in LABEL.findall(m.group("labels") or "")}
        out.append((m.group("name"), labels, float(m.group("value"))))
    return out


def series(text: str, *, timestamp: float | None = None, count: int = 40) -> list[dict[str, str]]:
    """promtool input series of a textfile as Prometheus would scrape it through node_exporter (job/instance
    added); ``timestamp`` replaces the last-run time (promtool's clock starts at 0)."""
    out = []
    for name, labels, value in samples(text):
        if name == "kimi_deploy_check_last_run_timestamp_seconds" and timestamp is not None:
            value = timestamp
        spelled = ",".join(f'{k}="{v}"' for k, v in {**labels, **SCRAPE}.items())
        out.append({"series": f"{name}{{{spelled}}}", "values": f"{value:g}x{count}"})
    return out


def alert_test(rule: dict, name: str, inputs: list[dict], eval_time: str, fired: list[tuple[dict, float]],
               interval: str = "1m") -> dict:
    expected = []
    for labels, value in fired:
        labels = {**labels, **rule["labels"]}
        expected.append({"exp_labels": labels,
                         "exp_annotations": {k: expand(v, labels, value) for k, v in rule["annotations"].items()}})
    return {"name": name, "interval": interval, "input_series": inputs,
            "alert_rule_test": [{"eval_time": eval_time, "alertname": rule["alert"], "exp_alerts": expected}]}


def test_check_alerts_on_the_real_textfile(textfiles, tmp_path):
    profile = preset_profile()
    files = write_monitoring(profile, tmp_path)
    rules = {r["alert"]: r for g in rules_doc(profile)["groups"] for r in g["rules"] if "alert" in r}
    failing, passing = textfiles["fail"], textfiles["pass"]
    dropped = [(labels, value) for name, labels, value in samples(failing)
               if name == "kimi_deploy_check_status" and value == 2]
    assert dropped and {labels["kind"] for labels, _ in dropped} == {"tool_call_dropped"}
    assert all(labels["check"].startswith("contract.id_roundtrip.sanitised.") for labels, _ in dropped)
    tests = [
        alert_test(rules["KimiNightlyCheckFailed"], "failed run fires", series(failing), "5m", [(SCRAPE, 1)]),
        alert_test(rules["KimiNightlyCheckFailed"], "passing run is silent", series(passing), "5m", []),
        alert_test(rules["KimiToolCallContractBroken"], "dropped calls fire, one alert per check", series(failing),
                   "5m", [({**labels, **SCRAPE}, 2) for labels, _ in dropped]),
        alert_test(rules["KimiToolCallContractBroken"], "passing run is silent", series(passing), "5m", []),
        # promtool's clock starts at 0: a run at time 0 is 27 h old at 27h, 25 h old at 25h
        alert_test(rules["KimiNightlyCheckStale"], "a run 27 h old fires", series(passing, timestamp=0), "27h",
                   [(SCRAPE, 27 * 3600)], interval="1h"),
        alert_test(rules["KimiNightlyCheckStale"], "a run 25 h old is silent", series(passing, timestamp=0), "25h",
                   [], interval="1h"),
        alert_test(rules["KimiNightlyCheckMissing"], "no textfile for 27 h fires",
                   [{"series": 'up{job="kimi-k25",instance="x"}', "values": "1x30"}], "27h",
                   [({"job": "kimi-k25-check"}, 1)], interval="1h"),
        alert_test(rules["KimiNightlyCheckMissing"], "a scraped textfile is silent", series(passing, count=30),
                   "27h", [], interval="1h"),
    ]
    doc = rule_test_doc(profile, files["kimi-k25.rules.yml"].name, tests)
    (tmp_path / "check.test.yml").write_text(to_yaml(doc))
    done = promtool("test", "rules", "check.test.yml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]


def test_the_textfile_names_are_the_ones_the_rules_use(textfiles):
    """Every kimi_deploy_check_* metric a rule reads is one the real check writes (and no label is invented)."""
    from kimi_deploy.check.reports import START_GAUGES

    # the start-time gauges are written only once the host has start records (none here): the real writer's
    # series with records are proven in tests/test_start_history.py, whose KimiStartSlower test reads them
    written = {name for name, _, _ in samples(textfiles["fail"])} | {name for name, _ in START_GAUGES}
    profile = preset_profile()
    for group in rules_doc(profile)["groups"]:
        for rule in group["rules"]:
            for used in re.findall(r"kimi_deploy_check_\w+", rule["expr"]):
                assert used in written, (used, sorted(written))
    labels = {k for name, lab, _ in samples(textfiles["fail"]) if name == "kimi_deploy_check_status" for k in lab}
    assert labels == {"service", "check", "kind"}
    # every series names its service (the profile's [service] name), so two services' textfiles never collide
    assert {lab.get("service") for _, lab, _ in samples(textfiles["fail"])} == {"kimi-k25"}
