"""`kimi-deploy bench compare`: says what would mislead (no shared point, no success), plots only on request,
and draws nearly flat data flat (no offset label, axes from 0, ticks at measured points only).

Results are built in the layout of `kimi-deploy bench --json` (kimi_deploy/bench/report.py); the end-to-end
run that writes real ones is tests/test_bench_e2e.py.
"""

from __future__ import annotations

import json

import pytest

from kimi_deploy.cli import cli
from kimi_deploy.errors import ExitCode


def result(label, model, tpots, tputs, conc=(1, 2, 4, 8, 16), completed=8):
    points = []
    for x, tpot, tput in zip(conc, tpots, tputs):
        ok = completed > 0
        points.append({"concurrency": x, "request_rate": None, "num_prompts": 8, "warmup": 0,
                       "spec_accept_length": None, "runs": [],
                       "summary": {"completed": completed, "requests": 8, "errors": 8 - completed,
                                   "output_tokens_per_s": tput if ok else None,
                                   "tpot_ms": {"p50": tpot} if ok else None,
                                   "ttft_ms": {"p50": 60.0} if ok else None,
                                   "e2e_ms": {"p50": 130.0} if ok else None}})
    return {"schema": "kimi-deploy.bench/1", "label": label, "model": model,
            "config": {"mode": "closed-loop", "max_tokens": 32, "ignore_eos": False, "temperature": 0.0,
                       "extra_body": {}, "seed": 0},
            "dataset": {"sha256": "x", "name": "d"}, "points": points}


FLAT_A = result("baseline", "kimi-a", [19.9980, 19.9982, 19.9984, 19.9985, 19.9987], [50, 100, 199, 398, 795])
FLAT_B = result("candidate", "kimi-b", [19.9981, 19.9983, 19.9985, 19.9986, 19.9987], [50, 100, 200, 399, 796])
BROKEN = result("broken", "kimi-a", [0] * 5, [0] * 5, completed=0)


@pytest.fixture
def files(tmp_path):
    out = {}
    for r in (FLAT_A, FLAT_B, BROKEN, result("elsewhere", "kimi-a", [20, 21], [700, 900], conc=(32, 64))):
        out[r["label"]] = tmp_path / f"{r['label']}.json"
        out[r["label"]].write_text(json.dumps(r))
    return out


def test_no_plot_is_written_unless_asked(files, cli_runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = cli_runner.invoke(cli, ["bench", "compare", str(files["baseline"]), str(files["candidate"])])
    assert res.exit_code == 0, res.output
    assert not list(tmp_path.glob("*.png")) and "wrote" not in res.output


def test_a_bad_plot_path_is_refused_before_anything(files, cli_runner, tmp_path):
    missing = tmp_path / "missing" / "p.png"
    res = cli_runner.invoke(cli, ["bench", "compare", str(files["baseline"]), str(files["candidate"]),
                                  "--plot", str(missing)])
    assert res.exit_code == ExitCode.USAGE and "--plot: the directory" in res.stderr and "mkdir -p" in res.stderr
    assert not missing.parent.exists()


def test_results_without_a_shared_point_are_named(files, cli_runner):
    res = cli_runner.invoke(cli, ["bench", "compare", str(files["baseline"]), str(files["elsewhere"])])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "warning: elsewhere shares no concurrency point with baseline (baseline: 1, 2, 4, 8, 16; " \
           "elsewhere: 32, 64)" in text and "no ratios" in text


@pytest.mark.parametrize("order", [("baseline", "broken"), ("broken", "baseline"), ("broken", "broken"),
                                   ("baseline", "candidate", "broken")])
@pytest.mark.parametrize("as_json", [[], ["--json"]])
def test_a_result_without_a_successful_request_leaves_nothing_to_compare_exit_2(files, cli_runner, tmp_path, order,
                                                                                 as_json):
    """Issue 43: a run that measured nothing compared with exit 0 (a CI gate on it passed on no data)."""
    png = tmp_path / "p.png"
    res = cli_runner.invoke(cli, ["bench", "compare", *(str(files[o]) for o in order), *as_json, "--plot", str(png)])
    assert res.exit_code == ExitCode.USAGE, res.output
    text = " ".join(res.stderr.split())
    assert "nothing to compare: broken" in text and "measured nothing" in text
    assert not png.exists()


def test_a_point_without_success_is_named(files, cli_runner, tmp_path):
    partial = json.loads(json.dumps(FLAT_B))
    partial["points"][2]["summary"].update(completed=0, output_tokens_per_s=None, tpot_ms=None)
    (tmp_path / "partial.json").write_text(json.dumps(partial))
    res = cli_runner.invoke(cli, ["bench", "compare", str(files["baseline"]), str(tmp_path / "partial.json"),
                                  "--json"])
    assert res.exit_code == 0, res.output
    assert "candidate: no successful request at c=4: no figures there" in json.loads(res.stdout)["warnings"]


def _fig(results):
    import matplotlib.pyplot as plt

    from kimi_deploy.bench.compare import figure

    fig = figure(results)
    fig.canvas.draw()  # tick labels and offset texts are only set when drawn
    return fig, plt


def test_nearly_flat_tpot_draws_flat_with_plain_ticks_from_zero():
    fig, plt = _fig([FLAT_A, FLAT_B])
    try:
        tput, tpot, *_ = fig.axes
        for ax in (tput, tpot):
            assert ax.get_ylim()[0] == 0
            assert ax.yaxis.get_offset_text().get_text() == ""  # no "+1.9998e1"
            assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "8", "16"]
            assert ax.xaxis.get_minorticklocs().size == 0
        labels = [t.get_text() for t in tpot.get_yticklabels()]
        assert "20" in "".join(labels) and not any("e" in x for x in labels)
        assert tpot.get_ylim()[1] >= 20  # the data sit inside the axes
    finally:
        plt.close(fig)


def test_title_names_every_result_and_a_failed_result_is_a_note():
    fig, plt = _fig([FLAT_A, FLAT_B, BROKEN])
    try:
        title = fig._suptitle.get_text()
        assert "baseline [kimi-a]" in title and "candidate [kimi-b]" in title and "broken [kimi-a]" in title
        legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        assert legend == ["baseline", "candidate"]
        notes = [t.get_text() for t in fig.texts]
        assert notes[-1] == "not drawn (no successful request at any point): broken"
    finally:
        plt.close(fig)


def test_a_point_without_success_is_a_gap_named_in_the_legend():
    partial = json.loads(json.dumps(FLAT_B))
    partial["points"][2]["summary"].update(completed=0, output_tokens_per_s=None, tpot_ms=None)
    fig, plt = _fig([FLAT_A, partial])
    try:
        legend = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
        assert legend == ["baseline", "candidate (no successful request at c=4)"]
        ys = fig.axes[1].get_lines()[1].get_ydata()
        assert ys[2] != ys[2]  # NaN: a gap, not a zero
    finally:
        plt.close(fig)


def test_a_point_on_one_side_only_is_named(files, cli_runner, tmp_path):
    """Issue 13 item 10: a point present in one result and missing from the other passed without a word."""
    fewer = result("fewer", "kimi-b", [20, 20, 20, 20], [50, 100, 200, 400], conc=(1, 2, 4, 32))
    path = tmp_path / "fewer.json"
    path.write_text(json.dumps(fewer))
    out = cli_runner.invoke(cli, ["bench", "compare", str(files["baseline"]), str(path)]).output
    assert "fewer has no c=8, c=16 (measured in baseline)" in out
    assert "fewer has c=32, which baseline lacks" in out


def _runs(point, values):
    point["runs"] = [{"index": i, "summary": {"completed": 8, "tpot_ms": {"p50": v}, "ttft_ms": {"p50": 60.0 + i},
                                              "e2e_ms": {"p50": 130.0}, "output_tokens_per_s": 100.0}}
                     for i, v in enumerate(values)]


def test_plot_draws_ttft_and_e2e_run_spread_and_marks_points_under_their_load():
    """Issue 13 item 11: TTFT (25% apart in a real comparison) and E2E were not drawn, nor the spread of
    --runs, nor a point whose prompts were fewer than its concurrency."""
    a = json.loads(json.dumps(FLAT_A))
    b = result("slow-ttft", "kimi-b", [20] * 5, [50, 100, 200, 400, 800])
    for p in b["points"]:
        p["summary"]["ttft_ms"] = {"p50": 75.0}
        p["num_prompts"] = 64
    for p in a["points"]:
        _runs(p, [19.0, 21.0, 20.0])
    a["config"]["runs"] = 3
    a["points"][4]["num_prompts"] = 8  # c=16 with 8 prompts: never 16 in flight
    fig, plt = _fig([a, b])
    try:
        assert [ax.get_title() for ax in fig.axes] == ["Throughput", "Time per output token",
                                                       "Time to first token", "End-to-end latency"]
        ttft = fig.axes[2]
        assert [list(line.get_ydata()) for line in ttft.get_lines()] == [[60.0] * 5, [75.0] * 5]
        assert list(fig.axes[3].get_lines()[0].get_ydata()) == [130.0] * 5
        spread = [c for c in fig.axes[1].collections if type(c).__name__ == "LineCollection"]
        assert any(seg[0][1] == 19.0 and seg[1][1] == 21.0 for c in spread for seg in c.get_segments())
        assert "run-to-run spread" in fig._suptitle.get_text()
        notes = [t.get_text() for t in fig.texts]
        assert any("less load than the point claims" in n and "baseline at c=16" in n for n in notes)
        marks = [c for c in fig.axes[0].collections if type(c).__name__ == "PathCollection"]
        assert [list(m.get_offsets()[0]) for m in marks] == [[16.0, 795.0]]
    finally:
        plt.close(fig)


def test_a_one_percent_spread_is_drawn_with_caps_wider_than_the_marker():
    """New-operator trial (#30 item 6): a run-to-run spread of ~1 % is a bar a few pixels tall, hidden under the
    point's marker. Each bar now has a cap at both ends wider than the marker, drawn in the line's colour beside
    the marker (read back from the rendered pixels); runs that agree draw none."""
    import numpy as np
    from matplotlib.colors import to_rgb

    from kimi_deploy.bench.compare import SPREAD_CAP_PT

    a = result("baseline", "kimi-a", [20.0], [100.0], conc=(4,))  # one point: no line runs beside it
    _runs(a["points"][0], [19.9, 20.1, 20.0])  # 1 % of 20 ms; throughput and E2E agree exactly
    a["config"]["runs"] = 3
    fig, plt = _fig([a])
    try:
        tpot = fig.axes[1]
        (caps,) = [c for c in tpot.collections if c.get_gid() == "spread-cap"]
        assert sorted(round(float(y), 6) for _, y in caps.get_offsets()) == [19.9, 20.1]
        (line,) = tpot.get_lines()
        assert float(caps.get_sizes()[0]) ** 0.5 == SPREAD_CAP_PT > 2 * line.get_markersize()
        pixels = np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(int)
        colour = np.array(to_rgb(line.get_color())) * 255
        beside = (line.get_markersize() / 2 + 3) * fig.dpi / 72  # 3 pt right of the marker's edge
        for y in (19.9, 20.1):
            px, py = tpot.transData.transform((4, y))
            row = pixels.shape[0] - int(round(py))
            near = pixels[row - 1:row + 2, int(round(px + beside))]  # the cap is ~2 px thick
            assert min(np.abs(p - colour).sum() for p in near) < 60, (y, near)
        assert not [c for c in fig.axes[0].collections if c.get_gid() == "spread-cap"]  # no spread, no caps
    finally:
        plt.close(fig)
