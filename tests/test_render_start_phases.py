"""Cold-start phases from SGLang 0.5.23's own log lines (kimi_deploy.host.phases): the recorded start in
tests/data/sglang-log/start-k25-eagle3.txt, the fragments matched against the installed SGLang source, the last
measured start kept on the host and render's TimeoutStartSec= warning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from install_fakes import STARTUP_JOURNAL
from kimi_deploy import engine as target
from kimi_deploy.cli import cli
from kimi_deploy.host import phases
from kimi_deploy.paths import HostLayout

LOG = Path(__file__).parent / "data" / "sglang-log" / "start-k25-eagle3.txt"
PRESET = "kimi-k25-rtx-pro-6000-x8"


def recorded() -> list[str]:
    return LOG.read_text().splitlines()


def test_recorded_start_has_every_phase_with_durations():
    start = phases.parse_start(recorded(), source="recorded")
    assert start.ready and start.current is None
    assert [(p.name, p.seconds) for p in start.phases] == [
        ("weights", 271.52), ("kv_cache", 6.0), ("draft", 10.87), ("cuda_graphs", 186.0), ("ready", 32.0)]
    assert start.total_seconds == 540.0 and start.started == "2026-12-01 08:00:02"
    assert start.kv_tokens == 226002  # SGLang's own count (the plan of test_validate_sizing.py: 226,002)
    by = {p.name: p for p in start.phases}
    assert by["weights"].detail == "64/64 shards (100%), KimiK25ForConditionalGeneration, 71.16 GB"
    assert by["kv_cache"].detail == "226002 tokens, 14.79 GB, torch.bfloat16"
    assert by["draft"].detail.endswith("Eagle3DeepseekV2ForCausalLM, 0.75 GB")
    assert by["cuda_graphs"].detail == "target verify, draft decode"


def test_unfinished_start_shows_the_running_phase_and_progress():
    start = phases.parse_start(recorded()[:4])
    assert not start.ready and start.current == "weights" and start.total_seconds is None
    assert start.progress == "32/64 shards (50%)"
    assert start.lines() == ["  weights      running  (32/64 shards (50%))"]
    graphs = phases.parse_start(recorded()[:14])  # the draft graphs are being captured
    assert graphs.current == "cuda_graphs"


def test_older_format_without_graph_end_lines():
    start = phases.parse_start(STARTUP_JOURNAL)
    assert [(p.name, p.seconds) for p in start.phases] == [
        ("weights", 262.1), ("kv_cache", 7.0), ("cuda_graphs", 231.0), ("ready", 28.0)]


@pytest.mark.sglang
def test_fragments_are_in_sglangs_source(sglang_python):
    root = Path(target.probe(sglang_python).sglang_location)
    for fragment, where in phases.SOURCES.items():
        text = (root / where).read_text()
        assert fragment in text, (fragment, where)


def test_last_start_kept_and_render_warns_about_a_short_timeout(cli_runner, tmp_path):
    state = HostLayout(tmp_path).state_dir("kimi-k25")
    start = phases.parse_start(recorded())
    assert phases.save_last(state, start) == state / "start-phases.json"
    assert phases.load_last(state) == start
    assert phases.save_last(state, phases.parse_start(recorded()[:4])) is None  # unfinished: nothing measured
    assert phases.timeout_warning("kimi-k25", 1200, state) is None
    warning = phases.timeout_warning("kimi-k25", 300, state)
    assert warning == ("[service] timeout_start_sec = 300 s is shorter than the last measured start of kimi-k25 "
                       "(540 s on 2026-12-01 08:00:02, slowest phase weights 272 s): systemd would stop the next "
                       "start of that length; set timeout_start_sec = 840")
    data = json.loads((state / "start-phases.json").read_text())
    data["total_seconds"] = 1500.0
    (state / "start-phases.json").write_text(json.dumps(data))
    result = cli_runner.invoke(cli, ["render", "--preset", PRESET, "--root", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    assert any("timeout_start_sec = 1200 s is shorter than the last measured start of kimi-k25 (1500 s" in w
               for w in json.loads(result.stdout)["warnings"])
    plain = cli_runner.invoke(cli, ["render", "--preset", PRESET, "--root", str(tmp_path / "elsewhere"), "--json"])
    assert not any("timeout_start_sec" in w for w in json.loads(plain.stdout)["warnings"])
