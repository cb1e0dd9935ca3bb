"""``tune``'s pure parts: the space and ``--space``, the search as a function of what was measured, the journal.

The search is driven here as kimi_deploy/tune/run.py drives it, over tests/replay/speed_model.py's closed form
(what benchmarks/tune_search.py measures with noise): no server, no restart.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

from install_fakes import write_profile
from kimi_deploy.cli.tune import parse_budget
from kimi_deploy.errors import UsageError
from kimi_deploy.profile import load_profile
from kimi_deploy.tune import journal as tj
from kimi_deploy.tune import search, space

sys.path.insert(0, str(Path(__file__).parent / "replay"))
import speed_model  # noqa: E402

DIMS = (
    space.Dimension("enable_pcie_ipc_allreduce", (False, True), False, ""),
    space.Dimension("max_running_requests", (48, 8, 16, 32), 48, ""),
    space.Dimension("chunked_prefill_size", (8192, 2048, 4096, 16384), 8192, ""),
)


def _space():
    cands = [space.Candidate(tuple(zip((d.key for d in DIMS), combo)))
             for combo in itertools.product(*(d.values for d in DIMS))]
    return cands, space.baseline(DIMS)


def truth(c: space.Candidate) -> float:
    return speed_model.expected_goodput(speed_model.flags_for(c.as_dict()), concurrency=24, chunks=20,
                                        slo_ttft_ms=400, slo_step_ms=22)


def drive(method: str, *, planted_rejected: bool = True, trace: list | None = None, **kw):
    """Run a strategy to its end; a measurement is 3 runs of the closed form (no noise); returns (outcome, runs)."""
    cands, base = _space()
    by_id = {c.id: c for c in cands}
    strat = search.strategy(method, DIMS, cands, base, **kw)
    runs: dict[str, list] = {}
    live = base.id
    while True:
        step = search.next_step(strat, search.Evidence(runs, frozenset(), live))
        if isinstance(step, search.Outcome):
            return step, runs, by_id
        if trace is not None:
            trace.append((step.candidate, step.n))
        c = by_id[step.candidate]
        assert step.n == len(runs.get(c.id, [])) + 1  # it asks for the next one, never one it has
        if planted_rejected and c.as_dict()["chunked_prefill_size"] == 2048:
            runs.setdefault(c.id, []).append(None)
        else:
            g = truth(c)
            runs.setdefault(c.id, []).append([g * 0.99, g, g * 1.01])
            live = c.id


def test_descent_finds_the_optimum_with_far_fewer_measurements_than_the_grid():
    outcome, runs, by_id = drive("descent")
    feasible = [c for c in by_id.values() if c.as_dict()["chunked_prefill_size"] != 2048]
    best = max(feasible, key=truth)
    assert truth(by_id[outcome.winner]) >= 0.95 * truth(best)
    assert by_id[outcome.winner].as_dict()["chunked_prefill_size"] != 2048  # rejected: never the winner
    descent = sum(len(v) for v in runs.values())
    grid_outcome, grid_runs, _ = drive("grid")
    assert descent < sum(len(v) for v in grid_runs.values()) == len(by_id)
    assert grid_outcome.winner == best.id
    assert outcome.complete and outcome.verdict == "better beyond noise"


def test_a_replay_from_any_prefix_of_the_evidence_asks_for_the_same_next_measurement():
    """What --resume relies on: the strategy is a function of the finished measurements."""
    trace: list = []
    drive("descent", trace=trace)
    cands, base = _space()
    by_id = {c.id: c for c in cands}
    for k in range(len(trace)):
        runs: dict[str, list] = {}
        live = base.id
        for cid, _n in trace[:k]:
            c = by_id[cid]
            if c.as_dict()["chunked_prefill_size"] == 2048:
                runs.setdefault(cid, []).append(None)
            else:
                g = truth(c)
                runs.setdefault(cid, []).append([g * 0.99, g, g * 1.01])
                live = cid
        strat = search.strategy("descent", DIMS, cands, base)
        step = search.next_step(strat, search.Evidence(runs, frozenset(), live))
        assert isinstance(step, search.Need) and (step.candidate, step.n) == trace[k], k


def test_candidates_closer_than_noise_are_measured_again_before_one_is_taken():
    cands, base = _space()
    by_id = {c.id: c for c in cands}
    strat = search.strategy("descent", DIMS, cands, base)
    other = next(c for c in cands if c.as_dict() == {**base.as_dict(), "enable_pcie_ipc_allreduce": True})
    runs = {base.id: [[10.0, 10.4, 10.8]], other.id: [[10.2, 10.6, 11.0]]}  # ranges overlap
    step = search.next_step(strat, search.Evidence(runs, frozenset(), other.id))
    assert isinstance(step, search.Need) and step.n == 2 and "closer than noise" in step.why
    assert step.candidate == other.id  # the live one first: no restart
    assert by_id[step.candidate]


def test_budget_ends_with_the_best_measured_so_far():
    cands, base = _space()
    strat = search.strategy("descent", DIMS, cands, base)
    runs = {base.id: [[10.0, 10.1, 10.2]]}
    out = strat.best_so_far(search.Evidence(runs, frozenset(), base.id))
    assert out.winner == base.id and not out.complete and out.verdict == "baseline"


def test_halving_spends_more_restarts_than_the_grid_it_prunes():
    _, halving, _ = drive("halving")
    _, grid, _ = drive("grid")
    assert sum(len(v) for v in halving.values()) > sum(len(v) for v in grid.values())


def test_parse_space_types_values_and_refuses_what_is_not_a_tunable():
    assert space.parse_space(["max_running_requests=32,48", "enable_pcie_ipc_allreduce=false,true",
                              "mem_fraction_static=0.85"]) == {
        "max_running_requests": (32, 48), "enable_pcie_ipc_allreduce": (False, True), "mem_fraction_static": (0.85,)}
    for bad, words in (("tp_size=4,8", "not a tunable"), ("max_running_requests", "KEY=V1,V2"),
                       ("max_running_requests=", "KEY=V1,V2")):
        with pytest.raises(UsageError, match=words):
            space.parse_space([bad])
    with pytest.raises(UsageError, match="twice"):
        space.parse_space(["max_running_requests=1", "max_running_requests=2"])


def test_dimensions_start_at_the_profile_and_leave_out_what_it_cannot_use(tmp_path):
    profile = load_profile(write_profile(tmp_path / "p.toml", gpu_count=8,
                                         sglang_lines=("max_running_requests = 32",)))
    dims = space.dimensions(profile, "0.5.23")
    keys = [d.key for d in dims]
    assert "speculative_num_steps" not in keys  # no speculative_algorithm in the profile
    mrr = next(d for d in dims if d.key == "max_running_requests")
    assert mrr.baseline == 32 and mrr.values[0] == 32
    assert "enable_pcie_ipc_allreduce" not in [d.key for d in space.dimensions(profile, "0.5.20")]  # 0.5.21+
    with pytest.raises(UsageError, match="speculative_algorithm"):
        space.dimensions(profile, "0.5.23", {"speculative_num_steps": (2, 3)})
    for bad in ({"max_running_requests": ("many",)}, {"mem_fraction_static": (1.5,)}):
        with pytest.raises(UsageError, match="not a value the profile takes"):
            space.dimensions(profile, "0.5.23", bad)
    # a candidate the profile rules refuse is pruned before anything runs
    cand = space.Candidate((("max_running_requests", 0),))
    assert space.prune(profile, cand).stage == "profile"


def test_the_journal_round_trips_and_a_kill_s_unfinished_rows_are_dropped_and_counted(tmp_path):
    j = tj.TuneJournal(service="s", started_at="t", updated_at="t", sglang_version="0.5.23", profile="",
                       profile_sha256="x", baseline="b", settings={}, dimensions=[],
                       measurements=[tj.Measurement(candidate="b", n=1, state="measured", started_at="t",
                                                    restarted=False, goodput_runs=[1.0]),
                                     tj.Measurement(candidate="c", n=1, state="deploying", started_at="t")])
    tj.save(tmp_path, j)
    back = tj.load(tmp_path)
    assert back.measurements == j.measurements and (tmp_path / "journal.json").stat().st_mode & 0o777 == 0o600
    kept, dropped = tj.drop_unfinished(back)
    assert [m.candidate for m in dropped] == ["c"] and kept.restarts() == 1 and kept.lost_restarts == 1
    (tmp_path / "journal.json").write_text('{"format": 1}')
    with pytest.raises(UsageError, match="unreadable"):
        tj.load(tmp_path)


def test_budget_is_restarts_or_a_duration():
    assert parse_budget("12") == (12, None)
    assert parse_budget("4h") == (None, 14400.0) and parse_budget("90m") == (None, 5400.0)
    for bad in ("0", "4 days", "-1", "h"):
        with pytest.raises(UsageError, match="--budget"):
            parse_budget(bad)


@pytest.mark.sglang
def test_validate_many_says_what_one_validate_run_per_command_says(sglang_python):
    """The batch tune runs before any restart: SGLang imported once, each command parsed as validate parses it."""
    from kimi_deploy.validate import validate_many, validate_server_args

    jobs = [(["--model-path", "/models/x", "--max-running-requests", "32"], None, {}),
            (["--model-path", "/models/x", "--max-running-requests", "many"], None, {}),
            (["--model-path", "/models/x", "--chunked-prefil-size", "8192"], None, {}),
            (["--model-path", "/models/x"], None, {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"})]
    many = validate_many(sglang_python, jobs)
    assert [v.ok for v in many] == [True, False, False, True]
    assert many[0].stages == ("argparse", "exact-names", "record", "deprecated-args")
    one = validate_server_args(sglang_python, jobs[1][0])  # each interpreter start is seconds: one to compare
    assert (many[1].errors, many[1].stages) == (one.errors, one.stages)
    assert "invalid int value: 'many'" in many[1].errors[0] and "abbreviation" not in many[2].errors[0]


def test_the_profile_s_tune_table_limits_the_space_and_refuses_what_is_not_tunable(tmp_path):
    from kimi_deploy.errors import ProfileError

    lines = ("max_running_requests = 32", "", "[tune.space]", "max_running_requests = [16, 64]",
             "enable_pcie_ipc_allreduce = [true]")
    profile = load_profile(write_profile(tmp_path / "p.toml", gpu_count=8, sglang_lines=lines))
    dims = space.dimensions(profile, "0.5.23")
    assert [(d.key, d.values) for d in dims] == [("enable_pcie_ipc_allreduce", (False, True)),
                                                ("max_running_requests", (32, 16, 64))]
    assert [d.key for d in space.dimensions(profile, "0.5.23", {"chunked_prefill_size": (4096,)})] == [
        "chunked_prefill_size"]  # --space replaces the table for one run
    plain = load_profile(write_profile(tmp_path / "q.toml", gpu_count=8, sglang_lines=lines[:1]))
    assert profile.digest() != plain.digest()
    assert "tune" not in plain.model_dump(exclude_none=True)
    with pytest.raises(ProfileError) as err:
        load_profile(write_profile(tmp_path / "r.toml", gpu_count=8, sglang_lines=("", "[tune.space]",
                                                                                  "tp_size = [4, 8]")))
    assert any("tp_size is not a tunable option" in line for line in err.value.problems)
