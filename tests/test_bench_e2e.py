"""`kimi-deploy bench` end to end against the synthetic server (benchmarks/synthetic_server.py).

Small sizes; the figures are held only to what causality guarantees on any machine, however loaded:
no latency below the server's own delays, no throughput above what it can send. How close they come
to the truth is a measurement of speed, benchmarks/calibrate.py's job (docs/design.md#benchmark-calibration).
Truth for TTFT 60 ms, a 4-token chunk every 10 ms, 32 tokens: 8 chunks, E2E 60 + 7 x 10 = 130 ms,
TPOT 70 / 31 = 2.258 ms, 4 tokens per chunk.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kimi_deploy.bench.prompts import load_dataset
from kimi_deploy.bench.report import CSV_COLUMNS, SCHEMA
from kimi_deploy.cli import cli
from kimi_deploy.errors import ExitCode

REPO = Path(__file__).resolve().parent.parent


class Synthetic:
    """The synthetic server in a child process (its own event loop, as a real server)."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "synthetic_server.py"), "--port", "0",
                                      *args], stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().strip()
        assert line.startswith("listening on "), line
        self.url = line.removeprefix("listening on ")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def server():
    s = Synthetic("--ttft-ms", "60", "--gap-ms", "10", "--tokens-per-chunk", "4", "--reasoning-tokens", "4",
                  "--spec-accept-length", "3.2", "--model", "kimi-synthetic")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def no_usage_server():
    s = Synthetic("--ttft-ms", "20", "--gap-ms", "5", "--tokens-per-chunk", "2", "--no-usage", "--no-flush-cache")
    yield s
    s.stop()


def bench(cli_runner, url: str, *args: str):
    result = cli_runner.invoke(cli, ["bench", "--base-url", url, "--max-tokens", "32", "--no-progress", *args])
    return result


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, server):
    from click.testing import CliRunner

    out = tmp_path_factory.mktemp("bench")
    runner = CliRunner()
    a = bench(runner, server.url, "--concurrency", "1,4", "--num-prompts", "8", "--runs", "2", "--warmup", "2",
              "--slo", "ttft=1000,tpot=50", "--label", "baseline", "--json", str(out / "a.json"),
              "--csv", str(out / "a.csv"))
    b = bench(runner, server.url + "/v1", "--concurrency", "1,4", "--num-prompts", "8", "--warmup", "0",
              "--label", "candidate", "--json", str(out / "b.json"))
    return out, a, b


def test_sweep_writes_a_versioned_json_with_faithful_figures(sweep):
    out, a, _ = sweep
    assert a.exit_code == 0, a.output + str(a.exception)
    result = json.loads((out / "a.json").read_text())
    assert result["schema"] == SCHEMA
    for key in ("label", "created", "kimi_deploy_version", "definitions", "config", "model", "profile_sha256",
                "dataset", "server", "client", "points"):
        assert key in result
    assert set(result["definitions"]) >= {"ttft", "tpot", "itl", "tokens_per_chunk", "e2e", "output_tokens_per_s",
                                          "goodput_requests_per_s"}
    assert result["model"] == "kimi-synthetic"  # resolved from /v1/models
    cfg = result["config"]
    assert cfg["mode"] == "closed-loop" and cfg["max_tokens"] == 32 and cfg["temperature"] == 0.0
    assert cfg["ignore_eos"] is False and cfg["runs"] == 2 and cfg["slo"] == {"ttft": 1000.0, "tpot": 50.0}
    assert "api_key" not in cfg
    assert result["server"]["server_info"]["synthetic"]["ttft_ms"] == 60.0
    assert result["dataset"]["conversations"] == len(load_dataset().conversations)
    assert [p["concurrency"] for p in result["points"]] == [1, 4]
    for point in result["points"]:
        s = point["summary"]
        assert s["requests"] == 16 and s["completed"] == 16 and s["errors"] == 0
        assert s["requests_without_usage"] == 0
        assert point["spec_accept_length"] == 3.2
        assert [r["flush_cache"] for r in point["runs"]] == ["flushed", "flushed"]
        assert len(point["runs"][0]["requests"]) == 8
        # truth TTFT 60 ms, E2E 130 ms, 4 tokens per chunk: never measured below the server's own delays
        # (the 2 ms are the event loop's timer granularity); how far above is load, not the client
        assert 58 <= s["ttft_ms"]["p50"] <= s["e2e_ms"]["p50"] and 128 <= s["e2e_ms"]["p50"]
        assert s["tpot_ms"]["p50"] > 0 and s["itl_ms"]["p50"] > 0
        assert s["tokens_per_chunk"]["mean"] == 4.0  # the reasoning chunk counts as output
        c = point["concurrency"]
        truth = c * 32 / 0.130
        assert 0 < s["output_tokens_per_s"] <= 1.02 * truth
        assert s["goodput_requests_per_s"] == pytest.approx(s["requests_per_s"])


def test_csv_has_one_row_per_point(sweep):
    out, a, _ = sweep
    rows = list(csv.DictReader(io.StringIO((out / "a.csv").read_text())))
    assert list(rows[0].keys()) == CSV_COLUMNS
    assert [r["concurrency"] for r in rows] == ["1", "4"]
    assert all(r["label"] == "baseline" and r["spec_accept_length"] == "3.2" for r in rows)
    assert all(r["partial"] == "false" for r in rows)  # a whole sweep (an interrupted one: test_interrupt.py)
    points = json.loads((out / "a.json").read_text())["points"]
    for row, point in zip(rows, points, strict=True):  # the CSV carries the JSON's figures, to 4 decimals
        for column in ("output_tokens_per_s", "ttft_ms_p50", "e2e_ms_p50"):
            metric, _, stat = column.rpartition("_") if column.endswith("_p50") else (column, "", "")
            value = point["summary"][metric][stat] if stat else point["summary"][metric]
            assert float(row[column]) == pytest.approx(value, abs=5e-5)


def test_terminal_table_names_points(sweep):
    _, a, _ = sweep
    assert "c=4" in a.output and "wrote" in a.output


def test_compare_prints_ratios_and_writes_a_png(sweep, cli_runner):
    out, _, b = sweep
    assert b.exit_code == 0, b.output
    png = out / "cmp.png"
    res = cli_runner.invoke(cli, ["bench", "compare", str(out / "a.json"), str(out / "b.json"), "--plot", str(png)])
    assert res.exit_code == 0, res.output
    assert "candidate" in res.output and "TPOT p50" in res.output and "out tok/s" in res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    res = cli_runner.invoke(cli, ["bench", "compare", str(out / "a.json"), str(out / "b.json"), "--json"])
    data = json.loads(res.stdout)
    assert data["labels"] == ["baseline", "candidate"] and data["warnings"] == []
    assert [row["x"] for row in data["rows"]] == [1.0, 4.0]
    for row in data["rows"]:  # each ratio is this result's figure over the baseline's
        for metric in ("tpot_ms", "output_tokens_per_s"):
            assert row["ratios"][metric] == pytest.approx(row["values"][metric] / row["baseline"][metric])
        assert row["ratios"]["ttft_ms"] == pytest.approx(row["values"]["ttft_ms"] / row["baseline"]["ttft_ms"])


def test_compare_warns_when_the_workload_differs(sweep):
    from kimi_deploy.bench.compare import compare
    from kimi_deploy.bench.report import load_result

    out, _, _ = sweep
    a = load_result(out / "a.json")
    b = json.loads(json.dumps(a))
    b["label"] = "longer"
    b["config"]["max_tokens"] = 64
    cmp = compare([a, b])
    assert cmp.warnings == ["not the same workload: longer: max_tokens 64 differs from baseline's 32"]
    assert all(row.ratios["tpot_ms"] == pytest.approx(1.0) for row in cmp.rows)


def test_compare_refuses_other_files(tmp_path, cli_runner):
    bad = tmp_path / "x.json"
    bad.write_text('{"schema": "other/1"}')
    res = cli_runner.invoke(cli, ["bench", "compare", str(bad), str(bad)])
    assert res.exit_code == ExitCode.USAGE and "not a kimi-deploy.bench/1 result" in res.stderr


def test_no_usage_is_reported_per_request_and_in_the_summary(no_usage_server, cli_runner, tmp_path):
    res = bench(cli_runner, no_usage_server.url, "--concurrency", "2", "--num-prompts", "4", "--json",
                str(tmp_path / "n.json"))
    assert res.exit_code == 0, res.output
    result = json.loads((tmp_path / "n.json").read_text())
    point = result["points"][0]
    s = point["summary"]
    assert s["completed"] == 4 and s["requests_without_usage"] == 4
    assert s["output_tokens_per_s"] is None and s["tpot_ms"] is None and s["tokens_per_chunk"] is None
    assert all(r["usage_missing"] and r["output_tokens"] is None for r in point["runs"][0]["requests"])
    assert point["runs"][0]["flush_cache"] == "unsupported (http 404)"
    assert "had no usage block" in res.output


def test_open_loop_poisson_rate(server, cli_runner, tmp_path):
    res = bench(cli_runner, server.url, "--request-rate", "50", "--num-prompts", "10", "--warmup", "0",
                "--json", str(tmp_path / "o.json"))
    assert res.exit_code == 0, res.output
    result = json.loads((tmp_path / "o.json").read_text())
    assert result["config"]["mode"] == "open-loop"
    point = result["points"][0]
    assert point["request_rate"] == 50.0 and point["summary"]["completed"] == 10


def test_bad_input_gives_named_exit_codes(cli_runner, tmp_path, server):
    res = cli_runner.invoke(cli, ["bench", "--no-progress"])
    assert res.exit_code == ExitCode.USAGE and "--base-url is required" in res.stderr
    res = cli_runner.invoke(cli, ["bench", "--base-url", server.url, "--slo", "latency=5"])
    assert res.exit_code == ExitCode.USAGE and "bad --slo item" in res.stderr
    ds = tmp_path / "d.jsonl"
    ds.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{"prompt": "x"}\n')
    res = cli_runner.invoke(cli, ["bench", "--base-url", server.url, "--dataset", str(ds)])
    assert res.exit_code == ExitCode.USAGE and "dataset line 2" in res.stderr and f"{ds}:2" in res.stderr
    res = cli_runner.invoke(cli, ["bench", "--base-url", "http://127.0.0.1:9", "--concurrency", "1"])
    assert res.exit_code == ExitCode.UNREACHABLE and "did not answer" in res.stderr


def test_custom_dataset_and_profile_hash(server, cli_runner, tmp_path):
    from kimi_deploy.catalog.presets import get_preset

    ds = tmp_path / "d.jsonl"
    ds.write_text('{"messages": [{"role": "user", "content": "Name three rivers."}]}\n')
    prof = tmp_path / "p.toml"
    init = cli_runner.invoke(cli, ["init", str(prof)])
    assert init.exit_code == 0, init.output
    key = tmp_path / "kimi-k25.api-key"  # bench --profile reads the profile's key file, as check --profile does
    key.write_text("sk-bench-e2e\n")
    key.chmod(0o600)
    prof.write_text(prof.read_text().replace("/etc/kimi-deploy/{name}.api-key", str(key)))
    res = bench(cli_runner, server.url, "--concurrency", "1", "--num-prompts", "2", "--warmup", "0", "--dataset",
                str(ds), "--profile", str(prof), "--ignore-eos", "--json", "-")
    assert res.exit_code == 0, res.output
    result = json.loads(res.stdout)
    assert result["dataset"]["name"] == "d.jsonl" and result["dataset"]["conversations"] == 1
    from kimi_deploy.profile import load_profile

    assert result["profile_sha256"] == load_profile(prof).digest()
    assert result["config"]["ignore_eos"] is True
    assert get_preset  # preset module importable alongside


def test_shipped_prompts_are_many_varied_and_reproducible():
    ds = load_dataset()
    assert len(ds.conversations) >= 250
    lengths = sorted(sum(len(m["content"]) for m in c) for c in ds.conversations)
    assert lengths[0] < 100 and lengths[-1] > 3000
    assert any(len(c) > 2 for c in ds.conversations)  # multi-turn
    check = subprocess.run([sys.executable, str(REPO / "benchmarks" / "make_prompts.py"), "--check"])
    assert check.returncode == 0, "prompts.jsonl is out of date: run python benchmarks/make_prompts.py"


def test_control_client_reads_the_synthetic_truth(server):
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "control_client.py"), "--base-url", server.url,
                          "--concurrency", "2", "--num-prompts", "4", "--max-tokens", "32"],
                         capture_output=True, text=True, timeout=60, check=True)
    r = json.loads(out.stdout)
    assert r["requests"] == 4
    assert 58 <= r["ttft_ms_p50"] <= r["e2e_ms_p50"] and 128 <= r["e2e_ms_p50"] and r["tpot_ms_p50"] > 0
