"""Issue 41, item 6: ``check`` and ``bench`` send the model's required sampling from the catalog (K2.7-Code:
Moonshot's API refuses anything but temperature 1.0 / top_p 0.95) unless told otherwise, and the pre-flight says
when a server accepts sampling the model's own API would refuse (scripted loopback server, tests/quality_server.py)."""

from __future__ import annotations

from kimi_deploy.bench.loadgen import BenchConfig, model_sampling
from kimi_deploy.catalog.models import get_model, required_sampling
from kimi_deploy.check import CheckOptions, run_checks
from quality_server import QualityServer

CODE = "moonshotai/Kimi-K2.7-Code"
RULE = {"temperature": 1.0, "top_p": 0.95}


def test_the_catalog_knows_which_model_requires_its_sampling():
    assert get_model("k2.7-code").sampling.request() == RULE
    assert required_sampling("/models/moonshotai/Kimi-K2.7-Code") == RULE
    for key in ("k2-thinking", "k2.5", "k2.6", "k3"):
        assert get_model(key).sampling.request() is None, key


def _rows(url, model, only, **options):
    report = run_checks(CheckOptions(base_url=url, model=model, only=[only], deadline=120, repeat=0, **options))
    return {r.id: r for r in report.results}


def test_check_sends_the_required_sampling_and_a_strict_server_accepts_every_request():
    with QualityServer(conversation=True, refuse_sampling=RULE) as server:
        rows = _rows(server.url, CODE, "contract.tool_auto.*")
    assert {r.status for r in rows.values()} == {"pass"}, [(r.id, r.detail) for r in rows.values()]
    assert {(b.get("temperature"), b.get("top_p")) for b in server.requests} == {(1.0, 0.95)}


def test_told_otherwise_check_sends_temperature_zero_and_the_strict_server_refuses_it():
    with QualityServer(conversation=True, refuse_sampling=RULE) as server:
        rows = _rows(server.url, CODE, "contract.tool_auto.nonstream", sampling="greedy")
    (row,) = rows.values()
    assert (row.status, row.kind) == ("fail", "http_error") and "400" in row.detail
    assert server.requests[-1]["temperature"] == 0 and "top_p" not in server.requests[-1]


def test_other_models_keep_temperature_zero():
    with QualityServer(conversation=True) as server:
        _rows(server.url, "moonshotai/Kimi-K2.5", "contract.tool_auto.nonstream")
    assert server.requests[-1]["temperature"] == 0 and "top_p" not in server.requests[-1]


def test_the_preflight_says_when_a_server_accepts_sampling_the_models_api_refuses():
    with QualityServer(conversation=True) as lax:
        row = _rows(lax.url, CODE, "quality.preflight.sampling.required")["quality.preflight.sampling.required"]
    assert (row.status, row.kind) == ("fail", "sampling_not_enforced")
    assert "temperature 0.3, top_p 0.5" in row.detail and "only temperature 1, top_p 0.95" in row.detail
    with QualityServer(conversation=True, refuse_sampling=RULE) as strict:
        row = _rows(strict.url, CODE, "quality.preflight.sampling.required")["quality.preflight.sampling.required"]
    assert row.status == "pass" and "refused with HTTP 400" in row.detail
    with QualityServer(conversation=True) as other:
        row = _rows(other.url, "moonshotai/Kimi-K2.5", "quality.preflight.sampling.required")[
            "quality.preflight.sampling.required"]
    assert row.status == "skip" and len(other.requests) == 0


def test_bench_sends_the_required_sampling_unless_given_a_temperature():
    temperature, extra = model_sampling(CODE, None, {"chat_template_kwargs": {"thinking": True}})
    assert temperature == 1.0 and extra == {"top_p": 0.95, "chat_template_kwargs": {"thinking": True}}
    assert model_sampling(CODE, None, {"top_p": 0.9}) == (1.0, {"top_p": 0.9})  # the user's own top_p stays
    assert model_sampling("moonshotai/Kimi-K2.5", None, {}) == (0.0, {})
    body = BenchConfig(base_url="http://127.0.0.1:1", temperature=temperature, extra_body=extra).body(CODE, [])
    assert b'"temperature": 1.0' in body and b'"top_p": 0.95' in body
