"""kimi_deploy.redact: key-like fields, secret options of command lines, a known key in every form.

The property tests write what bench and check write (bench JSON/CSV, check JSON/JUnit/Prometheus) for
documents embedding a key anywhere and assert the bytes hold the key in none of its textual forms.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import shlex
import string

from hypothesis import assume, given, settings, strategies as st

from kimi_deploy.check import CheckReport, CheckResult
from kimi_deploy.check import reports
from kimi_deploy.redact import MASK, forms, is_secret_name, redact, redact_text

KEY = "sk-replay-test-key"

# SGLang 0.5.23 /server_info as the replay server (tests/replay/server.py) serves it with --api-key:
# build_server_info(server_args) = resolved_dict() + launch_command (" ".join(argv), unpatched SGLang)
SERVER_INFO = {
    "model_path": "/models/k", "tokenizer_path": "/models/k", "skip_tokenizer_init": True,
    "max_total_tokens": None, "max_prefill_tokens": 16384, "speculative_num_draft_tokens": 4,
    "speculative_token_map": None, "bucket_time_to_first_token": [0.1, 0.5],
    "ssl_keyfile": None, "ssl_keyfile_password": None, "api_key": KEY, "admin_api_key": None,
    "watermark_key": None, "watermark_key_b": None,
    "launch_command": f"--model-path /models/k --tp-size 8 --api-key {KEY} --port 30000",
    "internal_states": [{"avg_spec_accept_length": 2.9}], "version": "0.5.23",
}


def test_server_info_of_unpatched_sglang_keeps_everything_but_the_key():
    out = redact(SERVER_INFO, [KEY])
    assert KEY not in json.dumps(out)
    assert out["api_key"] == MASK
    assert out["launch_command"] == f"--model-path /models/k --tp-size 8 --api-key {MASK} --port 30000"
    for field in ("max_prefill_tokens", "speculative_num_draft_tokens", "bucket_time_to_first_token",
                  "tokenizer_path", "skip_tokenizer_init", "internal_states", "admin_api_key", "ssl_keyfile"):
        assert out[field] == SERVER_INFO[field], field


def test_a_key_the_caller_does_not_know_is_hidden_by_field_and_by_option():
    info = {"admin_api_key": "adm1n secret", "launch_command": "--admin-api-key adm1n secret --port 1 --api-key=x",
            "argv": ["sglang", "--watermark-key", "wm", "--ssl-keyfile-password=pw", "--port", "1"],
            "nested": {"hfToken": "hf_abc", "Authorization": "Bearer z", "client-secret": "s"}}
    out = redact(info)
    assert out["admin_api_key"] == MASK
    assert out["launch_command"] == f"--admin-api-key {MASK} --port 1 --api-key={MASK}"
    assert out["argv"] == ["sglang", "--watermark-key", MASK, f"--ssl-keyfile-password={MASK}", "--port", "1"]
    assert set(out["nested"].values()) == {MASK}


def test_names():
    for name in ("api_key", "admin_api_key", "apiKey", "X-Api-Key", "watermark_key_b", "hf_token", "token",
                 "ssl_keyfile_password", "client_secret", "Authorization", "--api-key"):
        assert is_secret_name(name), name
    for name in ("max_tokens", "completion_tokens", "tokenizer_path", "tokens_per_chunk", "ssl_keyfile",
                 "speculative_token_map", "skip_tokenizer_init", "model", "launch_command", 3, None):
        assert not is_secret_name(name), name


def test_every_form_and_a_clipped_tail():
    key = "k3y with 'quote' & \"dq\"/+"
    text = " | ".join(forms(key))
    assert all(f not in redact_text(text, [key]) for f in forms(key))
    assert shlex.quote(key) in forms(key) and base64.b64encode(key.encode()).decode() in forms(key)
    clipped = "evidence: Bearer " + key[:9] + "…"
    assert redact_text(clipped, [key]) == f"evidence: Bearer {MASK}…"
    assert redact_text("nothing here…", [key]) == "nothing here…"


def test_none_empty_and_non_string_values_stay():
    assert redact({"api_key": None, "token": "", "password": 0, "k": [1, 2.5, None, True]}, [None, ""]) == \
        {"api_key": None, "token": "", "password": 0, "k": [1, 2.5, None, True]}


def test_deeper_than_the_recursion_limit():
    doc: list = [KEY]
    for _ in range(50_000):
        doc = [doc]
    out = redact(doc, [KEY])
    for _ in range(50_000):
        out = out[0]
    assert out == [MASK]


# --- property: whatever JSON embeds the key, the files bench and check write do not hold it ---

KEY_CHARS = string.ascii_letters + string.digits + "-_.~+/=:'\"\\$&<>!@%{}[], é"
keys = st.text(alphabet=KEY_CHARS, min_size=12, max_size=40).filter(lambda k: k.strip() == k)
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | \
    st.text(max_size=20)
names = st.sampled_from(["api_key", "launch_command", "model", "detail", "x", "argv", "hf_token", "note"]) | \
    st.text(max_size=8)


@st.composite
def documents_with(draw, key: str):
    """A JSON document with ``key`` placed in strings (whole, or inside text, or as a launch command)."""
    def leaf():
        return st.one_of(scalars, st.sampled_from([key, f"a {key} b", f"--api-key {key} --port 1",
                                                   f"Bearer {key}", json.dumps({"k": key}), shlex.quote(key)]))
    doc = draw(st.recursive(leaf(), lambda kids: st.lists(kids, max_size=4) | st.dictionaries(names, kids,
                                                                                              max_size=4),
                            max_leaves=12))
    return {"server_info": doc, "evidence": draw(st.sampled_from([key, f"x{key}y", f"{key[:6]}…"]))}


def _leaks(text: str, key: str) -> list[str]:
    return [f for f in forms(key) if len(f) >= 8 and f in text]


def _bench_files(doc: dict, key: str) -> str:
    from kimi_deploy.bench import report as bench_report

    result = bench_report.redact_result(_bench_result(doc), [key])
    return bench_report.to_json_text(result) + bench_report.to_csv(result)


def _bench_result(doc: dict) -> dict:
    return {"schema": "kimi-deploy.bench/1", "label": doc["evidence"], "model": "m",
            "config": {"max_tokens": 1, "mode": "closed-loop"}, "server": {"server_info": doc["server_info"]},
            "points": [{"concurrency": 1, "request_rate": None, "num_prompts": 1, "warmup": 0,
                        "spec_accept_length": None, "runs": [{"flush_cache": f"failed (http 500: {doc['evidence']})",
                                                              "requests": [{"error": doc["evidence"]}]}],
                        "summary": {k: 0 for k in ("requests", "completed", "errors", "requests_without_usage",
                                                   "output_tokens_per_s", "requests_per_s",
                                                   "goodput_requests_per_s", "chunks_per_s", "window_s")}
                        | {"ttft_ms": None, "tpot_ms": None, "itl_ms": None, "e2e_ms": None,
                           "tokens_per_chunk": None, "error_kinds": {}}}],
            "interrupted": None}


def _check_files(doc: dict, key: str) -> str:
    ev = doc["evidence"]
    report = CheckReport(base_url=f"http://127.0.0.1:1/{ev}", model=ev,
                         started_at=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
                         server={"version": json.dumps(doc["server_info"])},
                         results=[CheckResult("health.live", "fail", "http_error", ev, ev, 0.0, fix=ev),
                                  CheckResult("contract.plain.stream", "warn", "model_declined", ev, ev)],
                         profile=ev)
    reports.redact_report(report, [key])
    return reports.to_json_text(report) + reports.to_junit(report) + reports.to_prometheus(report)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), key=keys)
def test_written_files_never_hold_the_key(data, key):
    doc = data.draw(documents_with(key))
    placeholder = "Q" * len(key)  # the same document without the key: what the format writes anyway
    plain = json.loads(json.dumps(doc).replace(json.dumps(key)[1:-1], placeholder))
    for render in (_bench_files, _check_files):
        baseline = render(plain, key)
        assume(not _leaks(baseline, key))  # a key spelled like the format's own text is no leak
        text = render(doc, key)
        assert not _leaks(text, key), (render.__name__, _leaks(text, key))
