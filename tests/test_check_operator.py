"""What a new operator sees from `kimi-deploy check` (issue 13 items 1 and 5): what each case asks the
server to generate, live progress, and a fix on every failed row.

Real servers on loopback: the kit's own benchmarks/synthetic_server.py with its DEFAULTS (TTFT 200 ms,
4 tokens every 20 ms, every answer as long as the request's max_tokens, prose only: a server that cannot
call tools). Its /server_info counts the chat requests and the tokens they asked for, so the tests
assert on work asked for, never on elapsed time.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import httpx
import pytest
from rich.console import Console

from helpers import run_cli
from kimi_deploy.check import CheckOptions, run_checks
from kimi_deploy.check import concurrency, followup
from kimi_deploy.check.contract import CASES, REPLY_TOKENS, check_ids
from kimi_deploy.check.results import FAILURE_KINDS, FIXES, WARN_KINDS, CheckResult

REPO = Path(__file__).resolve().parent.parent


def _serve(*args: str):
    proc = subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "synthetic_server.py"), "--port", "0", *args],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("listening on "), line
        yield line.removeprefix("listening on ")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def synthetic():
    """benchmarks/synthetic_server.py with its defaults (only the port is chosen)."""
    yield from _serve()


@pytest.fixture
def synthetic_eos():
    """benchmarks/synthetic_server.py as docs/runbook.md#reading-a-failed-check runs it for a check in seconds: answers that
    end after 16 tokens, as a model's do."""
    yield from _serve("--eos-tokens", str(EOS_TOKENS))


#: The synthetic server's ``--eos-tokens`` in the run docs/design.md#what-each-case-costs describes.
EOS_TOKENS = 16


def served(url: str) -> tuple[int, int]:
    info = httpx.get(f"{url}/server_info").json()
    return info["chat_requests"], info["completion_tokens_served"]


def test_synthetic_server_defaults_are_asked_only_what_each_case_needs(synthetic):
    """At max_tokens=4096 and two retries per declined call, these three checks cost 7 requests and
    24 577 tokens (about 2 minutes at the defaults' 200 tokens/s); now 4 requests and 1 537 tokens."""
    events = []
    only = ["health.ready", "contract.plain.nonstream", "contract.tool_auto.*"]
    report = run_checks(CheckOptions(base_url=synthetic, only=only, timeout=30, deadline=600),
                        progress=lambda *e: events.append(e))
    requests, tokens = served(synthetic)
    # health.ready: one max_tokens=1 completion; plain and tool_auto: REPLY_TOKENS each, no retry after
    # an answer cut at max_tokens (finish_reason length)
    assert (requests, tokens) == (4, 1 + 3 * REPLY_TOKENS)
    by_id = {r.id: r for r in report.results}
    assert by_id["contract.plain.nonstream"].status == "pass"
    for mode in ("nonstream", "stream"):
        r = by_id[f"contract.tool_auto.{mode}"]
        assert (r.status, r.kind) == ("warn", "model_declined")
        assert "max_tokens" in r.detail and "max_tokens" in r.fix and r.evidence
    # progress: a start and an end event per check, counting up to the total
    ids = [r.id for r in report.results]
    assert [e[0] for e in events] == [i for i in ids for _ in (0, 1)]
    assert [(e[1], e[2]) for e in events if e[3] is not None] == [(n, len(ids)) for n in range(1, len(ids) + 1)]


def test_whole_suite_against_the_synthetic_server_with_eos_takes_seconds_of_generation(synthetic_eos):
    """Issue 13 item 1: the kit's own synthetic server ran the check into its 720 s deadline. With
    --eos-tokens 16 every answer ends after 16 tokens (finish_reason stop), as a model's do: the
    whole suite runs, every check attempted, and the server generates at most 16 tokens a request, i.e.
    under 0.3 s each at the defaults (TTFT 200 ms + 3 gaps of 20 ms), a few seconds for the suite.
    Asserted on the work the server was asked for, never on elapsed time."""
    report = run_checks(CheckOptions(base_url=synthetic_eos, timeout=30, deadline=600))
    requests, tokens = served(synthetic_eos)
    rows = report.results
    assert report.answered and not report.interrupted
    assert not [r.id for r in rows if r.kind == "timeout" or "not attempted" in (r.evidence or "")]
    # health.ready asks for 1 token; every other chat request is cut at EOS_TOKENS
    assert tokens <= 1 + (requests - 1) * EOS_TOKENS
    # one request per check, plus the retries of calls the server declined (--repeat 2) and the
    # multi-turn case's extra turns: bounded, however the report counts (a followup conversation stops at its
    # first declined call: 3 requests), and each concurrency case's burst (8 at once without a profile)
    assert requests <= 3 * (len(check_ids()) + len(followup.check_ids())) + 8 * len(concurrency.check_ids()), \
        requests
    assert report.exit_code == 1  # prose only: the tool-call cases fail or warn, and say why
    for r in rows:
        if r.status in ("fail", "warn"):
            assert r.fix and r.evidence, r


def test_synthetic_server_eos_tokens_keeps_ignore_eos_requests_whole(synthetic_eos):
    """--eos-tokens ends answers early (finish_reason stop) unless the request sends ignore_eos
    (what `kimi-deploy bench --ignore-eos` sends): those still get every token, finish_reason length."""
    body = {"model": "synthetic", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40}
    short = httpx.post(f"{synthetic_eos}/v1/chat/completions", json=body, timeout=30).json()
    assert (short["usage"]["completion_tokens"], short["choices"][0]["finish_reason"]) == (EOS_TOKENS, "stop")
    whole = httpx.post(f"{synthetic_eos}/v1/chat/completions", json={**body, "ignore_eos": True}, timeout=30).json()
    assert (whole["usage"]["completion_tokens"], whole["choices"][0]["finish_reason"]) == (40, "length")
    with httpx.stream("POST", f"{synthetic_eos}/v1/chat/completions", timeout=30,
                      json={**body, "stream": True, "stream_options": {"include_usage": True}}) as resp:
        events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    assert [c["choices"][0]["finish_reason"] for c in events if c["choices"]][-1] == "stop"
    assert events[-1]["usage"]["completion_tokens"] == EOS_TOKENS
    small = httpx.post(f"{synthetic_eos}/v1/chat/completions", json={**body, "max_tokens": 8}, timeout=30).json()
    assert (small["usage"]["completion_tokens"], small["choices"][0]["finish_reason"]) == (8, "length")


def test_whole_suite_asks_for_a_bounded_number_of_tokens():
    """Every contract case's max_tokens: sized to the case (docs/reference/check-ids.md), none at the old 4096/8192."""
    sizes = {c.name: c.max_tokens for c in CASES}
    assert {n: s for n, s in sizes.items() if not n.startswith("arguments.")} == \
        {n: REPLY_TOKENS for n in sizes if not n.startswith("arguments.")}
    assert sizes["arguments.large"] < 8192 and all(sizes[f"arguments.{n}"] <= 1024
                                                   for n in ("empty", "unicode", "nested", "braces_quotes"))
    # the large case's arguments (8500 characters, ~2 100 tokens) must fit with room to spare
    assert sizes["arguments.large"] >= REPLY_TOKENS + 8500 // 2
    total = sum(2 * s for s in sizes.values()) + 2 * 3 * REPLY_TOKENS  # both modes; multi_turn: 3 turns
    assert total <= 40_000, total
    assert len(check_ids()) == 2 * len(CASES) + 3


@pytest.mark.parametrize("kind", FAILURE_KINDS + WARN_KINDS)
def test_every_kind_has_a_fix(kind):
    assert FIXES.get(kind), f"no fix for {kind}"
    r = CheckResult("contract.plain.nonstream", "warn" if kind in WARN_KINDS else "fail", kind, "what failed")
    assert r.fix and r.evidence  # evidence falls back to the detail when a check had none


def test_failed_rows_carry_fix_and_evidence_in_table_json_and_junit(synthetic, tmp_path):
    """Issue 13 item 5: `tool_call_dropped` gave no fix; a check's fix now reaches every report."""
    profile = tmp_path / "p.toml"
    profile.write_text('[service]\nname = "kimi-x"\npython = "/opt/sg/bin/python"\n\n[sglang]\n'
                       'model_path = "/models/k"\nserved_model_name = "other-model"\ntp_size = 1\n')
    junit = tmp_path / "r.xml"
    result = run_cli(["check", "--base-url", synthetic, "--profile", str(profile), "--only", "health.models",
                      "--json", str(tmp_path / "r.json"), "--junit", str(junit)])
    assert result.exit_code == 1, result.stdout + result.stderr
    row = json.loads((tmp_path / "r.json").read_text())["checks"][0]
    assert row["status"] == "fail" and row["evidence"] and row["fix"]
    assert "fix: " in result.stdout
    failure = ET.parse(junit).getroot().find("testcase/failure")
    assert "fix: " in failure.get("message") and "fix: " in failure.text


def test_tool_call_dropped_fix_names_the_profiles_python_and_evidence_is_not_empty():
    from kimi_deploy.check.results import CheckReport
    from kimi_deploy.check.runner import _add_fixes
    from kimi_deploy.check.completion_rules import Expectation, Message, check_message
    from kimi_deploy.profile import Profile
    import datetime as dt

    msg = Message(content="", reasoning=None, tool_calls=[], finish_reason="stop", completion_tokens=31)
    finding = check_message(msg, Expectation(call="one"))[0]
    assert finding.kind == "tool_call_dropped" and "completion_tokens=31" in finding.evidence
    report = CheckReport(base_url="http://x", model=None, started_at=dt.datetime.now(dt.timezone.utc),
                         results=[CheckResult("contract.id_roundtrip.openai.stream", "fail", finding.kind,
                                              finding.detail, finding.evidence)])
    profile = Profile.model_validate({"service": {"name": "kimi-x", "python": "/opt/sg/bin/python"},
                                      "sglang": {"model_path": "/models/k", "tp_size": 1}})
    _add_fixes(report, profile)
    assert "kimi-deploy patch apply --python /opt/sg/bin/python" in report.results[0].fix


def test_live_progress_line_names_the_check_and_counts():
    from kimi_deploy.cli.check import LiveProgress

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with LiveProgress(console) as progress:
        progress("health.live", 0, 40, None)
        progress("health.live", 1, 40, CheckResult("health.live", "fail", "unreachable", "x"))
        progress("contract.plain.stream", 1, 40, None)
        progress.progress.refresh()
        text = out.getvalue()
    assert "contract.plain.stream" in text and "1/40" in text and "39 left, 1 failed" in text


def test_no_progress_when_not_a_terminal(synthetic):
    result = run_cli(["check", "--base-url", synthetic, "--only", "health.live"])
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""


def test_summary_line_names_no_server_software_it_did_not_see():
    """Issue 13 item 10: the summary called every server "SGLang" (here: the synthetic server)."""
    import datetime as dt

    from kimi_deploy.check import CheckReport
    from kimi_deploy.check.reports import render_table

    report = CheckReport(base_url="http://127.0.0.1:1", model="m", started_at=dt.datetime.now(dt.timezone.utc),
                         server={"version": "synthetic"}, results=[CheckResult("health.live", "pass")])
    out = io.StringIO()
    render_table(report, Console(file=out, width=200))
    assert "SGLang" not in out.getvalue() and "server version synthetic" in out.getvalue()


def test_accuracy_without_a_single_tool_call_does_not_send_the_operator_to_the_patch_series(synthetic_eos, tmp_path):
    """Issue 43: quality.accuracy of a server that never calls tools (the synthetic server answers in prose) said
    "apply the kit's patch series", which changes nothing there. Its fix names the tool-call parser instead; a
    dropped id in a real tool-call exchange keeps the patch fix (the test above)."""
    report = tmp_path / "q.json"
    run_cli(["check", "--base-url", synthetic_eos, "--only", "quality.accuracy", "--sample", "4", "--json",
             str(report)])
    (row,) = [r for r in json.loads(report.read_text())["checks"] if r["id"] == "quality.accuracy"]
    assert row["status"] == "fail" and row["kind"] == "tool_call_dropped"
    assert "patch apply" not in row["fix"] and "patch series" not in row["fix"]
    assert row["fix"].startswith("no answer called a tool") and "--tool-call-parser kimi_k2" in row["fix"]
