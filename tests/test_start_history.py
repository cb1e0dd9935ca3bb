"""Start-time records and a budget (issue #42): each start's phases kept on the host across restarts (and
upgrades: the state directory is not the interpreter's), their medians in ``status``, a warning from
``restart --wait`` when a phase is over its budget, and the nightly check's textfile and ``KimiStartSlower``
alert (``promtool test rules`` on the textfile the check's own writer produces)."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import tomllib
from pathlib import Path

import pytest

from helpers import MINIMAL
from kimi_deploy.check.reports import to_prometheus
from kimi_deploy.check.results import CheckReport
from kimi_deploy.errors import ProfileError
from kimi_deploy.host import phases, start_history as sh
from kimi_deploy.host.restart import budget_check, phase_lines
from kimi_deploy.paths import HostLayout
from kimi_deploy.profile import parse_profile as _parse
from kimi_deploy.profile.startup import BUDGET_PHASES
from kimi_deploy.targets.prometheus import rules_doc, to_yaml
from monitoring_helpers import expand, preset_profile, promtool, rule_test_doc, write_monitoring

NAME = "kimi-k25"


def parse_profile(text: str):
    return _parse(tomllib.loads(text))


def _log(started: dt.datetime, weights: float, graphs: float = 60.0) -> list[str]:
    """An SGLang 0.5.23 log of one start (the fixed fragments kimi_deploy/host/phases.py reads, checked against the
    installed source by tests/test_render_start_phases.py): weights, KV cache, draft, CUDA graphs, ready."""
    def at(seconds: float) -> str:
        return (started + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%d %H:%M:%S")

    t1 = weights
    return [f"[{at(0)} TP0] Load weight begin. avail mem=94.50 GB",
            f"[{at(t1)} TP0] Load weight end. elapsed={weights:.2f} s, type=DeepseekV3ForCausalLM, "
            "avail mem=24.10 GB, mem usage=70.40 GB.",
            f"[{at(t1 + 5)} TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 480000, KV size: 15.00 GB",
            f"[{at(t1 + 6)} TP0] Memory pool end. avail mem=8.00 GB",
            f"[{at(t1 + 6)} TP0] Load weight begin. avail mem=8.00 GB",
            f"[{at(t1 + 10)} TP0] Load weight end. elapsed=4.00 s, type=LlamaForCausalLMEagle3, avail mem=7.00 GB, "
            "mem usage=1.00 GB.",
            f"[{at(t1 + 10)} TP0] Capture target decode CUDA graph begin. backend=full, bs=[1, 2, 4], avail mem=7.00 GB",
            f"[{at(t1 + 10 + graphs)} TP0] Capture target decode CUDA graph end. elapsed={graphs:.2f} s, "
            "mem usage=2.00 GB, avail mem=5.00 GB.",
            f"[{at(t1 + 20 + graphs)}] The server is fired up and ready to roll!"]


def _start(day: int, weights: float, graphs: float = 60.0) -> phases.StartPhases:
    start = phases.parse_start(_log(dt.datetime(2026, 12, day, 3, 0, 0), weights, graphs))
    assert start.ready and start.phases[0].name == "weights"
    return start


def test_the_budget_phases_are_the_phases_the_log_gives_and_total():
    assert BUDGET_PHASES == (*phases.PHASES, "total")


def test_records_keep_every_start_once_oldest_first_and_bounded(tmp_path):
    for day in (1, 2, 3):
        assert sh.record(tmp_path, _start(day, 300 + day)) is not None
    assert sh.record(tmp_path, _start(3, 303)) is None  # the same start again (status, a second restart --wait)
    history = sh.load(tmp_path)
    assert [r.started for r in history] == [f"2026-12-0{d} 03:00:00" for d in (1, 2, 3)]
    assert history[0].phases["weights"] == 301.0 and history[0].total > 301
    assert set(history[0].phases) == {"weights", "kv_cache", "draft", "cuda_graphs", "ready"}
    unfinished = phases.parse_start(_log(dt.datetime(2026, 12, 9), 300)[:3])
    assert sh.record(tmp_path, unfinished) is None  # a start that never reached ready measures nothing
    base = dt.datetime(2027, 1, 1)
    for i in range(sh.MAX_STARTS + 5):
        start = phases.parse_start(_log(base + dt.timedelta(hours=i), 300))
        sh.record(tmp_path, start)
    history = sh.load(tmp_path)
    assert len(history) == sh.MAX_STARTS and history[-1].started == "2027-01-05 08:00:00"


@pytest.mark.parametrize("text", [
    "{not json", "[]", '{"version": 2, "starts": []}', '{"version": 1, "starts": {}}',
    "[" * 100_000 + "]" * 100_000,
])
def test_a_hostile_history_reads_as_none_and_the_next_start_rewrites_it(tmp_path, text):
    sh.history_path(tmp_path).write_text(text)
    assert sh.load(tmp_path) == []
    assert sh.record(tmp_path, _start(1, 300)) is not None
    assert len(sh.load(tmp_path)) == 1


def test_entries_of_the_wrong_shape_are_left_out_one_by_one(tmp_path):
    good = {"started": "2026-12-01 03:00:00", "total": 400.0, "phases": {"weights": 300, "bogus": 1}}
    bad = [{"started": 1, "total": 1, "phases": {}}, {"started": "x", "total": float("nan"), "phases": {}},
           {"started": "x", "total": -1, "phases": {}}, {"started": "x", "total": True, "phases": {}}, "text",
           {"started": "x", "total": 5, "phases": {"weights": "300"}}]
    sh.history_path(tmp_path).write_text(json.dumps({"version": 1, "starts": [good, *bad]}).replace("NaN", "NaN"))
    history = sh.load(tmp_path)
    assert [(r.started, r.total, r.phases) for r in history] == [
        ("2026-12-01 03:00:00", 400.0, {"weights": 300.0}), ("x", 5.0, {})]
    sh.history_path(tmp_path).write_text("x" * (sh.MAX_FILE_BYTES + 1))
    assert sh.load(tmp_path) == []


def test_restart_warns_when_a_phase_is_over_the_median_times_the_factor(tmp_path):
    layout = HostLayout(tmp_path)
    profile = parse_profile(MINIMAL)
    directory = layout.state_dir(NAME)
    for day, weights in ((1, 300), (2, 310), (3, 290)):
        assert budget_check(profile, layout, _start(day, weights)) == {"over_budget": []}  # < 3 starts: no budget
    assert budget_check(profile, layout, _start(4, 440)) == {"over_budget": []}  # 440 <= 1.5 x 300
    slow = budget_check(profile, layout, _start(5, 700, graphs=200))
    assert slow["over_budget"] == [
        "weights took 700 s, over its budget of 458 s (1.5 x the median 305 s of the previous 4 starts)",
        "cuda_graphs took 200 s, over its budget of 90 s (1.5 x the median 60 s of the previous 4 starts)",
        f"total took {_start(5, 700, 200).total_seconds:.0f} s, over its budget of 578 s (1.5 x the median 385 s of "
        "the previous 4 starts)"]
    lines = phase_lines({**_start(5, 700, 200).to_dict(), **slow})
    assert "  warn   start phase over budget: weights took 700 s, over its budget of 458 s" in "\n".join(lines)
    assert len(sh.load(directory)) == 5  # the records keep the phases across restarts


def test_a_profile_budget_wins_over_the_median(tmp_path):
    layout = HostLayout(tmp_path)
    profile = parse_profile(MINIMAL + "\n[startup]\nbudget_factor = 2.0\n[startup.budget_sec]\nweights = 250\n")
    assert budget_check(profile, layout, _start(1, 260))["over_budget"] == [
        "weights took 260 s, over its budget of 250 s ([startup] budget_sec.weights = 250 s)"]
    assert budget_check(profile, layout, _start(2, 240)) == {"over_budget": []}


@pytest.mark.parametrize("table, says", [
    ("budget_sec = { weight = 300 }", "budget_sec has no phase 'weight'"),
    ("budget_sec = { weights = 0 }", "give seconds above 0"),
    ("budget_sec = { weights = inf }", "give seconds above 0"),
    ("budget_factor = 0.5", "greater than or equal to 1"),
])
def test_bad_budgets_are_refused(table, says):
    with pytest.raises(ProfileError) as raised:
        parse_profile(MINIMAL + f"\n[startup]\n{table}\n")
    assert any(says in p for p in raised.value.problems), raised.value.problems


def test_an_unwritable_state_directory_is_a_note_not_a_failure(tmp_path):
    layout = HostLayout(tmp_path)
    directory = layout.state_dir(NAME)
    directory.parent.mkdir(parents=True)
    directory.write_text("a file where the folder should be")
    got = budget_check(parse_profile(MINIMAL), layout, _start(1, 300))
    assert got["over_budget"] == [] and got["history_error"]


def test_status_shows_the_medians_and_what_was_over_budget(tmp_path):
    profile = parse_profile(MINIMAL)
    for day, weights in ((1, 300), (2, 310), (3, 290), (4, 900)):
        sh.record(tmp_path, _start(day, weights))
    data = sh.summary(profile.start, tmp_path)
    assert data["starts"] == 4 and data["last"]["phases"]["weights"] == 900.0
    assert data["medians"]["weights"] == {"median": 305.0, "starts": 4}
    assert data["last_budgets"]["weights"] == 450.0  # judged against the three before it
    lines = sh.summary_lines(data)
    assert lines[0].startswith("starts    4 recorded; median per phase: weights 305 s, kv_cache 6 s, draft 4 s, "
                               "cuda_graphs 60 s, ready 10 s, total 385 s")
    assert lines[1] == ("          over budget: weights took 900 s, over its budget of 450 s (1.5 x the median "
                        "300 s of the previous 3 starts)")
    assert sh.summary(profile.start, tmp_path / "none") is None and sh.summary_lines(None) == []


def test_the_nightly_check_reads_the_records_of_the_profiles_service(tmp_path):
    """``check --profile`` reads /var/lib/<service>/start-history.json (the nightly unit's StateDirectory=)."""
    name = f"kimi-test-history-{os.getpid()}"
    directory = Path("/var/lib") / name
    if not os.access("/var/lib", os.W_OK):
        pytest.skip("needs to write /var/lib/<a test service> (root)")
    profile = tmp_path / "p.toml"
    profile.write_text(MINIMAL.replace('name = "kimi-k25"', f'name = "{name}"'))
    try:
        for day in (1, 2):
            sh.record(directory, _start(day, 300))
        got = sh.recorded(profile)
        assert got is not None and got["starts"] == 2
    finally:
        for path in directory.glob("*"):
            path.unlink()
        if directory.exists():
            directory.rmdir()
    assert sh.recorded(profile) is None
    (tmp_path / "bad.toml").write_text("[service\n")
    assert sh.recorded(tmp_path / "bad.toml") is None


# -- the textfile and the alert --------------------------------------------------------------------------------------

SCRAPE = {"job": "kimi-k25-check", "instance": "127.0.0.1:9100"}
SAMPLE = re.compile(r'^(?P<name>\w+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$')


def _textfile(tmp_path: Path, weights: list[float]) -> str:
    profile = parse_profile(MINIMAL)
    folder = tmp_path / f"h{len(weights)}-{weights[-1]:g}"
    for day, w in enumerate(weights, start=1):
        sh.record(folder, _start(day, w))
    report = CheckReport(base_url="http://127.0.0.1:30000", model=None,
                         started_at=dt.datetime(2026, 12, 9, tzinfo=dt.timezone.utc), service=NAME,
                         starts=sh.summary(profile.start, folder))
    return to_prometheus(report)


def _series(text: str) -> list[dict[str, str]]:
    out = []
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and m.group("name").startswith("kimi_deploy_check_start_phase"):
            labels = f'{m.group("labels")},' + ",".join(f'{k}="{v}"' for k, v in SCRAPE.items())
            out.append({"series": f"{m.group('name')}{{{labels}}}", "values": f"{float(m.group('value')):g}x30"})
    return out


def test_the_textfile_exports_the_last_start_the_medians_and_the_budgets(tmp_path):
    text = _textfile(tmp_path, [300, 310, 290, 900])
    assert 'kimi_deploy_check_start_phase_seconds{service="kimi-k25",phase="weights"} 900.000' in text
    assert 'kimi_deploy_check_start_phase_median_seconds{service="kimi-k25",phase="weights"} 305.000' in text
    assert 'kimi_deploy_check_start_phase_budget_seconds{service="kimi-k25",phase="weights"} 450.000' in text
    assert "# TYPE kimi_deploy_check_last_start_timestamp_seconds gauge" in text
    plain = to_prometheus(CheckReport(base_url="http://x", model=None, started_at=dt.datetime.now(dt.timezone.utc)))
    assert "start_phase" not in plain  # no record: no series, not zeros


def test_kimi_start_slower_fires_on_a_slower_start_and_stays_silent_otherwise(tmp_path):
    profile = preset_profile()
    files = write_monitoring(profile, tmp_path)
    rule = next(r for g in rules_doc(profile)["groups"] for r in g["rules"] if r.get("alert") == "KimiStartSlower")
    slow = _textfile(tmp_path, [300, 310, 290, 900])
    usual = _textfile(tmp_path, [300, 310, 290, 320])
    weights = {"service": NAME, "phase": "weights", **SCRAPE, **rule["labels"]}
    total_value = next(float(m.group("value")) for m in map(SAMPLE.match, slow.splitlines())
                       if m and m.group("name") == "kimi_deploy_check_start_phase_seconds" and 'phase="total"' in line_of(m))
    total = {**weights, "phase": "total"}
    tests = [
        {"name": "a slower start fires per phase over budget", "interval": "1m", "input_series": _series(slow),
         "alert_rule_test": [{"eval_time": "10m", "alertname": "KimiStartSlower", "exp_alerts": [
             {"exp_labels": labels, "exp_annotations": {k: expand(v, labels, value)
                                                        for k, v in rule["annotations"].items()}}
             for labels, value in ((weights, 900.0), (total, total_value))]}]},
        {"name": "a start within budget is silent", "interval": "1m", "input_series": _series(usual),
         "alert_rule_test": [{"eval_time": "10m", "alertname": "KimiStartSlower", "exp_alerts": []}]},
    ]
    doc = rule_test_doc(profile, files["kimi-k25.rules.yml"].name, tests)
    (tmp_path / "start.test.yml").write_text(to_yaml(doc))
    done = promtool("test", "rules", "start.test.yml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]


def line_of(match: re.Match) -> str:
    return match.string


def test_every_start_gauge_is_written_once_there_are_records(tmp_path):
    from kimi_deploy.check.reports import START_GAUGES

    text = _textfile(tmp_path, [300, 310, 290, 900])
    assert {name for name, _ in START_GAUGES} <= {m.group("name") for m in map(SAMPLE.match, text.splitlines()) if m}
