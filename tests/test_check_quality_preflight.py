"""Issue 27, Kimi pre-flight: a server whose thinking switch, default sampling or prompt-token count is wrong fails
with its own kind and fix; a right one passes (scripted loopback servers, tests/quality_server.py; the prompt-token
count also against SGLang 0.5.23's own serving layer, the replay server, where its test environment exists)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kimi_deploy.check import CheckOptions, run_checks
from kimi_deploy.check.quality import vendor_preflight
from quality_server import QualityServer

REPLAY = Path(__file__).parent / "replay"


def _rows(url: str, only: str = "quality.preflight.*", **options):
    report = run_checks(CheckOptions(base_url=url, only=[only], deadline=120, **options))
    return {r.id.removeprefix("quality.preflight."): r for r in report.results}


def test_a_server_that_honours_the_switch_passes_both_ways():
    with QualityServer() as server:
        rows = _rows(server.url, "quality.preflight.thinking_*")
    assert [(r.status, r.kind) for r in rows.values()] == [("pass", None), ("pass", None)]
    kwargs = [b.get("chat_template_kwargs") for b in server.requests]
    assert kwargs == [{"thinking": True}, {"thinking": False}]


@pytest.mark.parametrize("behaviour, broken", [("always", "thinking_off"), ("never", "thinking_on")])
def test_a_switch_that_is_ignored_fails_with_its_own_kind(behaviour, broken):
    with QualityServer(thinking=behaviour) as server:
        rows = _rows(server.url, "quality.preflight.thinking_*")
    bad = {k: r for k, r in rows.items() if r.status == "fail"}
    assert list(bad) == [broken]
    assert bad[broken].kind == "thinking_switch" and "chat_template_kwargs" in bad[broken].fix


def test_the_switch_is_skipped_where_no_reasoning_parser_is_known():
    with QualityServer(model_info=False) as server:
        rows = _rows(server.url, "quality.preflight.thinking_*")
    assert {r.status for r in rows.values()} == {"skip"}


def _model_dir(tmp_path: Path, **config) -> Path:
    (tmp_path / "generation_config.json").write_text(json.dumps(config))
    return tmp_path


def test_recommended_sampling_defaults_pass(tmp_path):
    with QualityServer(server_info={"sampling_defaults": "model", "preferred_sampling_params": None}) as server:
        rows = _rows(server.url, "quality.preflight.sampling",
                     model_dir=_model_dir(tmp_path, temperature=1.0, top_p=0.95))
    assert rows["sampling.thinking"].status == rows["sampling.instant"].status == "pass"
    assert "clients send temperature 0.6" in rows["sampling.instant"].detail


@pytest.mark.parametrize("info, config, failing, words", [
    # --sampling-defaults openai: the framework's top_p 1.0 in both modes
    ({"sampling_defaults": "openai"}, {"temperature": 1.0, "top_p": 0.95}, {"sampling.thinking", "sampling.instant"},
     "top_p 1 (recommended 0.95)"),
    # --preferred-sampling-params overriding the model's temperature
    ({"sampling_defaults": "model", "preferred_sampling_params": '{"temperature": 0.3}'},
     {"temperature": 1.0, "top_p": 0.95}, {"sampling.thinking", "sampling.instant"}, "temperature 0.3"),
    # a generation_config.json that is not the model's recommendation: instant mode still checks 0.6 / 1.0
    ({"sampling_defaults": "model"}, {"temperature": 0.7, "top_p": 0.95}, {"sampling.instant"}, "temperature 0.7"),
])
def test_wrong_sampling_defaults_fail_with_their_own_kind(tmp_path, info, config, failing, words):
    with QualityServer(server_info=info) as server:
        rows = _rows(server.url, "quality.preflight.sampling", model_dir=_model_dir(tmp_path, **config))
    bad = {k for k, r in rows.items() if r.status == "fail"}
    assert bad == failing, {k: r.detail for k, r in rows.items()}
    for k in bad:
        assert rows[k].kind == "sampling_defaults" and words in rows[k].detail and "top_p 0.95" in rows[k].fix


def test_sampling_is_skipped_with_the_reason_when_it_cannot_be_known():
    with QualityServer(server_info={"sampling_defaults": "model"}) as server:
        rows = _rows(server.url, "quality.preflight.sampling")
    assert {r.status for r in rows.values()} == {"skip"} and "--model-dir" in rows["sampling.thinking"].detail
    with QualityServer(model_info=False) as server:
        rows = _rows(server.url, "quality.preflight.sampling")
    assert {r.status for r in rows.values()} == {"skip"} and "does not report" in rows["sampling.thinking"].detail


def test_prompt_tokens_skipped_with_the_reason_without_the_model_files(tmp_path):
    with QualityServer() as server:
        rows = _rows(server.url, "quality.preflight.prompt_tokens", model_dir=tmp_path)
    assert rows["prompt_tokens"].status == "skip" and "tokenizer_config.json" in rows["prompt_tokens"].detail


@pytest.fixture(scope="module")
def kimi_model_dir(sglang_python, tmp_path_factory) -> Path:
    """The replay's Kimi-style tokenizer folder (tests/replay/kimi_tokenizer.py), built in SGLang's interpreter."""
    folder = tmp_path_factory.mktemp("kimi") / "Kimi-K2.5"
    subprocess.run([sglang_python, "-c", f"import sys; sys.path.insert(0, {str(REPLAY)!r}); import kimi_tokenizer; "
                    f"kimi_tokenizer.build(__import__('pathlib').Path({str(folder)!r}))"], check=True)
    return folder


@pytest.mark.sglang
def test_prompt_tokens_match_on_sglangs_own_serving_layer(replay, kimi_model_dir, sglang_python):
    """The replay server renders with SGLang 0.5.23's serving_chat.py and the same tokenizer folder: no alarm."""
    from conftest import SGLANG_API_KEY

    report = run_checks(CheckOptions(base_url=replay["unpatched"].url(), api_key=SGLANG_API_KEY,
                                     only=["quality.preflight.prompt_tokens"], model_dir=kimi_model_dir,
                                     sglang_python=sglang_python, deadline=120))
    row = report.results[0]
    assert row.status == "pass", (row.kind, row.detail)


@pytest.mark.sglang
@pytest.mark.parametrize("off", [3, -1])
def test_an_off_by_n_prompt_token_count_fails(kimi_model_dir, sglang_python, off):
    expected = vendor_preflight.expected_prompt_tokens(sglang_python, str(kimi_model_dir),
                                                       [dict(b) for b in vendor_preflight.KNOWN_REQUESTS])
    counts = {json.dumps(b["messages"]): n for b, n in zip(vendor_preflight.KNOWN_REQUESTS, expected)}

    def wrong(body):  # right for the plain request, off by N once a tool is declared
        return counts[json.dumps(body["messages"])] + (off if body.get("tools") else 0)

    with QualityServer(prompt_tokens=wrong) as server:
        rows = _rows(server.url, "quality.preflight.prompt_tokens", model_dir=kimi_model_dir,
                     sglang_python=sglang_python)
    row = rows["prompt_tokens"]
    assert row.status == "fail" and row.kind == "prompt_tokens_mismatch", row.detail
    assert f"off by {off:+d}" in row.detail and "tool declaration" in row.detail and row.fix
