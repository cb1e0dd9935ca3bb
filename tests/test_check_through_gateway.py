"""Issue 41: ``check --each-worker`` (the gateway host's nightly check, and the Kubernetes CronJob's) also runs the
concurrency pass and the reasoning checks through the gateway itself, reporting each case's rate: the real smg
1.13.0 (``$KIMI_DEPLOY_SMG``, round_robin) in front of two scripted servers (tests/quality_server.py) that leak the
reasoning into content in a fraction of answers, or fail only at 8 requests at once; well-behaved, nothing is
flagged. The SGLang replay behind the same gateway: tests/test_fleet_gateway.py."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time

import httpx
import pytest

from helpers import run_cli
from kimi_deploy.check import CheckOptions
from kimi_deploy.check.workers import THROUGH_GATEWAY, check_each_worker, gateway_checks
from kimi_deploy.catalog.presets import get_preset
from kimi_deploy.check.check_ids import select
from kimi_deploy.profile import dump_profile, parse_profile
from loopback import free_port
from quality_server import QualityServer

ONLY = ["contract.concurrency.*", "contract.reasoning_*"]


def _profile():
    """The K2.5 preset on loopback without a key: the parsers the checks expect (smg does not pass on the workers'
    /model_info, so through the gateway the profile says a reasoning parser is due, as on the gateway host)."""
    data = get_preset("kimi-k25-rtx-pro-6000-x8").data
    sglang = {k: v for k, v in data["sglang"].items() if k != "api_key_file"}
    return parse_profile({**data, "sglang": {**sglang, "host": "127.0.0.1"}})


@contextlib.contextmanager
def gateway(smg: str, workers: list[QualityServer]):
    """smg 1.13.0 on loopback in front of ``workers`` (round_robin, no key), once it lists them all healthy."""
    port, prom = free_port(), free_port()
    argv = [smg, "launch", "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin", "--worker-urls",
            *(w.url for w in workers), "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom),
            "--disable-tokenizer-autoload"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(1200):
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            with contextlib.suppress(httpx.HTTPError, ValueError):
                listed = httpx.get(url + "/workers", timeout=2).json().get("workers", [])
                if len(listed) == len(workers) and all(w.get("is_healthy") for w in listed):
                    break
            time.sleep(0.1)
        yield url
    finally:
        proc.kill()  # nothing to keep: a graceful stop waits out smg's 5 s grace period
        proc.wait(timeout=30)


def _run(url: str, n: int, only=ONLY):
    return check_each_worker(CheckOptions(only=only, concurrency=n, deadline=300, repeat=0, profile=_profile()), url)


def _rows(report):
    return {r.id: r for r in report.results}


def test_the_checks_through_the_gateway_are_the_selected_ones_of_the_list():
    assert gateway_checks(["health.*", "contract.*"]) == select(THROUGH_GATEWAY)
    assert "contract.concurrency.reasoning_on" in gateway_checks(["contract.*"])
    assert gateway_checks(["health.*"]) == [] and gateway_checks(["contract.*"], ["contract.concurrency.*"]) == \
        select(["contract.reasoning_on.*", "contract.reasoning_off.*"])


def test_well_behaved_workers_raise_no_alarm_through_the_gateway(smg_path):
    with QualityServer(conversation=True) as a, QualityServer(conversation=True) as b, \
            gateway(smg_path, [a, b]) as url:
        fleet = _run(url, 2)
        sent = len(a.requests) + len(b.requests)
    assert fleet.error is None and int(fleet.exit_code) == 0, fleet.to_json()
    assert len(fleet.runs) == 2 and fleet.through_gateway is not None
    rows = _rows(fleet.through_gateway)
    assert set(rows) == set(select(ONLY)) and all(r.status == "pass" for r in rows.values()), rows
    # each worker loaded at the per-server level: 2 x 2 workers at once through the gateway
    assert rows["contract.concurrency.tool_auto"].detail == "4 requests at once, none failed (0.0 %)"
    direct = 2 * (6 * 2 + 4)  # per worker: six bursts of 2, reasoning_on/off streamed and not
    assert sent == direct + 6 * 4 + 4
    assert sorted(w["url"] for w in fleet.to_json()["workers"]) == sorted([a.url, b.url])  # smg's order


def test_a_worker_that_leaks_reasoning_in_a_fraction_of_answers_shows_its_rate_through_the_gateway(smg_path):
    """One of two workers puts its reasoning and ``</think>`` in front of content in about a third of its answers
    (seeded). The direct pass checks the clean one only (the list given), so every leaked answer is one the gateway
    relayed: through the gateway the leak is named per case with its rate (markup_leak: a think tag in content),
    and every leaked answer is counted, none other."""
    with QualityServer(conversation=True, think_leak_rate=0.34, seed=3) as leaky, \
            QualityServer(conversation=True) as clean, gateway(smg_path, [leaky, clean]) as url:
        fleet = check_each_worker(CheckOptions(only=["contract.concurrency.*"], concurrency=4, deadline=300, repeat=0,
                                               profile=_profile()), url, urls=[clean.url])
        leaked = leaky.faults.get("think_leak", 0)
    assert [run.url for run in fleet.runs] == [clean.url] and int(fleet.runs[0].exit_code) == 0
    rows = _rows(fleet.through_gateway)
    counted = 0
    for row in rows.values():
        if row.status == "pass":
            assert row.detail == "4 requests at once, none failed (0.0 %)"
            continue
        m = re.match(r"(\d+) of 4 requests sent at once failed \((\d+\.\d) %: ([a-z_ 0-9,]+)\)", row.detail)
        assert m and row.kind == "markup_leak", row
        kinds = dict(part.rsplit(" ", 1) for part in m.group(3).split(", "))
        assert set(kinds) == {"markup_leak"} and float(m.group(2)) == pytest.approx(100 * int(m.group(1)) / 4, abs=.05)
        counted += int(kinds["markup_leak"])
    assert counted == leaked > 0  # every leaked answer counted, none other
    assert int(fleet.exit_code) == 1
    doc = fleet.to_json()["through_gateway"]
    assert doc["exit_code"] == 1 and set(doc["failed"]) == {i for i, r in rows.items() if r.status == "fail"}
    assert doc["report"]["schema"].startswith("kimi-deploy.check/")


def test_a_fault_from_eight_at_once_shows_through_the_gateway_at_eight_per_worker(smg_path):
    """Both workers answer empty at 8 requests at once or more (seeded rate 0.5; each gathers its burst before it
    answers, so the level is the burst's size: a client that sent fewer would fail the test, not hang it): through
    the gateway the pass sends the per-server level x 2 at once, smg's round_robin gives each worker 8, and the
    fault shows with its rate (tests/test_check_concurrency.py: the same server passes 4 at once)."""
    kw = dict(conversation=True, gather=8, fail_from_concurrency=8, concurrency_fault_rate=0.5)
    only = ["contract.concurrency.tool_auto", "contract.concurrency.reasoning_on"]
    with QualityServer(seed=11, **kw) as a, QualityServer(seed=12, **kw) as b, gateway(smg_path, [a, b]) as url:
        fleet = _run(url, 8, only=only)
        levels = set(a.levels) | set(b.levels)
    assert levels == {8}  # directly and through the gateway alike
    rows = _rows(fleet.through_gateway)
    assert set(rows) == set(only)
    failing = [r for r in rows.values() if r.status == "fail"]
    assert failing and int(fleet.exit_code) == 1
    for row in failing:
        kind = "empty_answer" if row.id.endswith(".reasoning_on") else "tool_call_dropped"
        assert row.kind == kind and re.match(rf"\d+ of 16 requests sent at once failed \(\d+\.\d %: {kind} ",
                                             row.detail), row.detail


def test_the_cli_writes_the_gateways_report_and_a_line_for_it(smg_path, tmp_path):
    with QualityServer(think_leak_rate=1.0) as a, QualityServer() as b, gateway(smg_path, [a, b]) as url:
        out, prom = tmp_path / "each.json", tmp_path / "check.prom"
        profile = tmp_path / "k25.toml"
        profile.write_text(dump_profile(_profile()))  # smg passes no /model_info on: the profile says reasoning is due
        result = run_cli(["check", "--base-url", url, "--profile", str(profile), "--each-worker", "--only",
                          "contract.concurrency.reasoning_on", "--concurrency", "2", "--deadline", "120", "--json",
                          str(out), "--prom", str(prom)])
    assert result.exit_code == 1, result.stdout + result.stderr
    doc = json.loads(out.read_text())
    assert doc["through_gateway"]["failed"] == ["contract.concurrency.reasoning_on"]
    assert f"{url} (through the gateway): exit 1, 1 checks, 1 failed: contract.concurrency.reasoning_on (2 of 4 " \
           "requests sent at once failed (50.0 %: markup_leak 2)" in result.stdout
    text = prom.read_text()
    service = _profile().service.name
    assert f'kimi_deploy_check_exit_code{{service="{service}",worker="{url}"}} 1' in text
    assert f'kimi_deploy_check_exit_code{{service="{service}",worker="{b.url}"}} 0' in text
