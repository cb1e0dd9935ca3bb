"""`kimi-deploy bench` refuses what it cannot measure, before any request; fails when nothing succeeded.

Real servers on loopback: the synthetic server (benchmarks/synthetic_server.py) healthy and with
every chat request answered 500, and a socket that accepts connections and never answers
(the ``silent`` fixture, ``helpers.Silent``: it tells afterwards what was sent to it). No test reads the wall clock.
"""

from __future__ import annotations

import json
import math
import os

import pytest

from kimi_deploy.bench.loadgen import BenchConfig
from kimi_deploy.cli import cli
from kimi_deploy.errors import ExitCode, UsageError
from tests.test_bench_e2e import Synthetic


@pytest.fixture(scope="module")
def server():
    s = Synthetic("--ttft-ms", "5", "--gap-ms", "1", "--tokens-per-chunk", "4", "--model", "kimi-synthetic")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def failing_server():
    s = Synthetic("--ttft-ms", "1", "--chat-status", "500")
    yield s
    s.stop()


@pytest.fixture
def silent_port(silent):
    return silent.port


def bench(cli_runner, url: str, *args: str):
    return cli_runner.invoke(cli, ["bench", "--base-url", url, "--max-tokens", "8", "--no-progress", *args])


# --- 1. nothing succeeded: exit 1, results still written ------------------------------------------------------

def test_every_request_failing_exits_1_names_the_points_and_still_writes(failing_server, cli_runner, tmp_path):
    res = bench(cli_runner, failing_server.url, "--concurrency", "1,2", "--num-prompts", "2", "--warmup", "0",
                "--json", str(tmp_path / "r.json"), "--csv", str(tmp_path / "r.csv"))
    assert res.exit_code == ExitCode.FAILED, res.output
    assert "no successful request at c=1, c=2" in res.stderr
    assert "http 500 x2" in res.output
    result = json.loads((tmp_path / "r.json").read_text())
    assert [p["summary"]["completed"] for p in result["points"]] == [0, 0]
    assert (tmp_path / "r.csv").read_text().count("\n") == 3


def test_one_failed_point_is_enough_to_fail():
    from kimi_deploy.bench.report import failed_points

    def point(c, completed):
        return {"concurrency": c, "request_rate": None, "summary": {"completed": completed}}

    assert failed_points({"points": [point(1, 4), point(64, 0)]}) == ["c=64"]
    assert failed_points({"points": [point(1, 4)]}) == []
    assert failed_points({"points": [{"concurrency": None, "request_rate": 2.5, "summary": {"completed": 0}}]}) \
        == ["rate=2.5/s"]


# --- 2. numbers: finite, in range, each once ----------------------------------------------------------------

BAD_OPTIONS = [
    (["--slo", "e2e=nan"], "--slo e2e must be a finite number"),
    (["--slo", "ttft=inf"], "must be a finite number"),
    (["--slo", "ttft=-5"], "--slo ttft must be > 0"),
    (["--slo", "ttft=0"], "--slo ttft must be > 0"),
    (["--slo", "ttft=200,ttft=300"], "--slo gives ttft twice"),
    (["--slo", "latency=5"], "bad --slo item"),
    (["--slo", "ttft"], "bad --slo item"),
    (["--request-rate", "inf"], "--request-rate must be a finite number"),
    (["--request-rate", "nan"], "--request-rate must be a finite number"),
    (["--request-rate", "0"], "--request-rate must be > 0"),
    (["--request-rate", "2,2"], "--request-rate names a point more than once"),
    (["--temperature", "nan"], "--temperature must be a finite number"),
    (["--temperature", "-1"], "--temperature must be >= 0"),
    (["--warmup", "-1"], "--warmup must be >= 0"),
    (["--concurrency", "1,,2"], "--concurrency has an empty item"),
    (["--concurrency", "1,2,"], "--concurrency has an empty item"),
    (["--concurrency", "2,2"], "--concurrency names a point more than once (2)"),
    (["--concurrency", "0"], "--concurrency must be >= 1"),
    (["--concurrency", "1.5"], "--concurrency takes an integer"),
    # a typo'd count (extra zeros: --concurrency 100000000) once serialized 4e8 request bodies, 22 GB, and
    # was killed by the OOM killer; just past each cap here (the library test below has the huge ones)
    (["--concurrency", "1,16385"], "--concurrency must be >= 1 and <= 16384"),
    (["--num-prompts", "100001"], "--num-prompts must be >= 1 and <= 100000"),
    (["--warmup", "100001"], "--warmup must be >= 0 and <= 100000"),
    (["--runs", "101"], "--runs must be >= 1 and <= 100"),
    (["--num-prompts", "0"], "--num-prompts must be >= 1"),
    (["--max-tokens", "0"], "--max-tokens must be >= 1"),
    (["--runs", "0"], "--runs must be >= 1"),
    (["--request-timeout", "0"], "--request-timeout must be > 0"),
    (["--request-timeout", "nan"], "--request-timeout must be a finite number"),
    (["--request-timeout", "1e999"], "--request-timeout must be a finite number"),
]


@pytest.mark.parametrize(("args", "message"), BAD_OPTIONS, ids=[" ".join(a) for a, _ in BAD_OPTIONS])
def test_bad_numbers_are_refused_before_any_request(args, message, failing_server, cli_runner, tmp_path):
    out = tmp_path / "r.json"
    res = bench(cli_runner, failing_server.url, *args, "--json", str(out))
    assert res.exit_code == ExitCode.USAGE, res.output
    assert message in res.stderr and "fix:" in res.stderr, res.stderr
    assert not out.exists()


def test_the_library_config_applies_the_same_validators():
    from kimi_deploy.bench import params

    for kwargs, message in [({"slo": {"e2e": math.nan}}, "finite"), ({"request_rates": (math.inf,)}, "finite"),
                            ({"temperature": math.nan}, "finite"), ({"concurrency": (2, 2)}, "more than once"),
                            ({"warmup": -1}, ">= 0"), ({"request_timeout": 0.0}, "> 0"),
                            ({"concurrency": (10**8,)}, "<= 16384"), ({"num_prompts": 10**9}, "<= 100000"),
                            ({"request_rates": (2.0,), "max_in_flight": 10**8}, "<= 16384"),
                            ({"warmup": 10**6}, "<= 100000"), ({"runs": 1000}, "<= 100")]:
        with pytest.raises(UsageError, match=message):
            BenchConfig(base_url="http://127.0.0.1:1", **kwargs)
    assert BenchConfig(base_url="http://x", slo={"ttft": 200}).slo == {"ttft": 200.0}
    assert params.slo("ttft=200ms, e2e=3000") == {"ttft": 200.0, "e2e": 3000.0}


def test_json_is_strict_and_a_server_nan_reads_as_null():
    from kimi_deploy.bench.loadgen import spec_accept_length
    from kimi_deploy.bench.report import to_json_text

    with pytest.raises(ValueError):
        to_json_text({"x": math.nan})
    assert spec_accept_length({"internal_states": [{"avg_spec_accept_length": math.nan}]}) is None
    assert spec_accept_length({"internal_states": [{"avg_spec_accept_length": True}]}) is None


def test_an_old_result_with_nan_is_refused_by_compare(tmp_path, cli_runner):
    bad = tmp_path / "old.json"
    bad.write_text('{"schema": "kimi-deploy.bench/1", "config": {"slo": {"e2e": NaN}}}')
    res = cli_runner.invoke(cli, ["bench", "compare", str(bad), str(bad)])
    assert res.exit_code == ExitCode.USAGE and "NaN is not a JSON number" in res.stderr


def test_fewer_prompts_than_concurrency_warns(server, cli_runner):
    res = bench(cli_runner, server.url, "--concurrency", "4", "--num-prompts", "2", "--warmup", "0")
    assert res.exit_code == 0, res.output
    assert "c=4: only 2 prompt(s) per run" in res.output and "measures less load" in res.output
    res = bench(cli_runner, server.url, "--concurrency", "2", "--num-prompts", "2", "--warmup", "0")
    assert "measures less load" not in res.output


# --- 3. output paths: checked before any request, nothing created --------------------------------------------

def test_bad_output_paths_are_refused_before_any_request(silent, silent_port, cli_runner, tmp_path):
    url = f"http://127.0.0.1:{silent_port}"  # a request would hang: the refusal must come first
    cases = [(["--json", str(tmp_path / "missing" / "r.json")], "--json: the directory", "does not exist"),
             (["--csv", str(tmp_path / "missing" / "r.csv")], "--csv: the directory", "does not exist"),
             (["--json", str(tmp_path)], "is a directory", "e.g."),
             (["--json", str(tmp_path / "a"), "--csv", str(tmp_path / "a")], "name the same file", "own path")]
    (tmp_path / "file").write_text("")
    cases.append((["--csv", str(tmp_path / "file" / "r.csv")], "is not a directory", "existing directory"))
    for args, what, fix in cases:
        res = bench(cli_runner, url, "--request-timeout", "20", *args)
        assert res.exit_code == ExitCode.USAGE, (args, res.output)
        assert what in res.stderr and fix in res.stderr, res.stderr
        assert silent.sent() == [], args  # not even a connection
    assert not (tmp_path / "missing").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_unwritable_directory_is_refused(silent_port, cli_runner, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        res = bench(cli_runner, f"http://127.0.0.1:{silent_port}", "--csv", str(ro / "r.csv"))
    finally:
        ro.chmod(0o755)
    assert res.exit_code == ExitCode.USAGE and "not writable" in res.stderr


# --- 6. every connection and metadata call honours --request-timeout -----------------------------------------

def test_a_silent_server_is_given_up_after_the_request_timeout(silent, cli_runner):
    """Without the timeout the request would wait until the port closes (30 s) and fail with a reset."""
    res = bench(cli_runner, silent.url, "--request-timeout", "0.5")
    assert res.exit_code == ExitCode.UNREACHABLE, res.output
    assert "no answer within 0.5 s" in res.stderr
    assert silent.sent() == ["GET /server_info"]  # given up at the first request: nothing after it


def test_https_against_a_plain_http_port_is_given_up_after_the_request_timeout(server, cli_runner):
    res = bench(cli_runner, server.url.replace("http://", "https://"), "--request-timeout", "0.5")
    assert res.exit_code == ExitCode.UNREACHABLE, res.output
    assert "is the server plain http://?" in res.stderr or "SSL" in res.stderr, res.stderr


def test_https_against_a_silent_port_is_given_up_after_the_request_timeout(silent, cli_runner):
    """The TLS handshake itself is bounded: a port that never answers the ClientHello is given up."""
    res = bench(cli_runner, silent.url.replace("http://", "https://"), "--request-timeout", "0.5")
    assert res.exit_code == ExitCode.UNREACHABLE, res.output
    assert "no connection within 0.5 s (TCP connect + TLS handshake)" in res.stderr, res.stderr
    assert silent.sent() == ["?"]  # one connection, a ClientHello and no HTTP request


# --- a dataset saved by another editor (new-operator trial) ------------------------------------------------------

def test_a_dataset_with_a_bom_loads_and_one_not_utf8_is_refused_with_its_line(tmp_path):
    """A BOM was "line 1 is not JSON (Unexpected UTF-8 BOM ...)"; Latin-1 bytes were replaced by U+FFFD and sent."""
    from kimi_deploy.bench.prompts import load_dataset

    line = '{"messages": [{"role": "user", "content": "caf\u00e9"}]}\n'
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + line.encode())
    assert load_dataset(bom).conversations == (({"role": "user", "content": "caf\u00e9"},),)
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(line.encode() + line.encode("latin-1"))
    with pytest.raises(UsageError, match="not UTF-8 text: byte 0xe9 on line 2") as err:
        load_dataset(latin)
    assert "iconv" in err.value.hint


# --- no model name, and /v1/models says why (new-operator trial: every case read "pass --model") ------------------

MODEL_LISTS = {
    "a redirect": (302, b"", "bench follows no redirect"),
    "an empty list": (200, b'{"object": "list", "data": []}', "the server lists no model"),
    "a web page": (200, b"<html>Welcome to nginx!</html>", "is --base-url the server itself"),
}


@pytest.mark.parametrize(("status", "answer", "fix"), MODEL_LISTS.values(), ids=MODEL_LISTS.keys())
def test_no_model_name_says_what_the_model_list_was(cli_runner, status, answer, fix):
    from loopback import Loopback, QuietHandler

    class Models(QuietHandler):
        def do_GET(self):  # noqa: N802
            if self.path == "/v1/models":
                self.send_response(status)
                if status == 302:
                    self.send_header("Location", "http://127.0.0.1:1/v1/models")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)
            else:
                self._send(404, b"{}")

    with Loopback(Models) as server:
        res = bench(cli_runner, server.url)
    assert res.exit_code == ExitCode.USAGE and "no --model given" in res.stderr, res.output
    assert fix in res.stderr, res.stderr
