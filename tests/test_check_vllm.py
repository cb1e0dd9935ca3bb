"""`kimi-deploy check` against vLLM 0.33.0's real serving code (tests/vllm_replay/server.py: `vllm serve`'s
parser and app, AsyncLLM with its detokenizer, OpenAIServingChat, the kimi_k2 tool and reasoning parsers; only
the GPU engine core is scripted), and the verdicts that must hold on both servers (issue #19).

Configurations (``vllm_replay`` in conftest.py): ``parsers`` (``--tool-call-parser kimi_k2
--enable-auto-tool-choice --reasoning-parser kimi_k2 --api-key``), ``noparsers``, ``exclude_none``
(parsers plus ``--exclude-tools-when-tool-choice-none``).
"""

from __future__ import annotations

import pytest

from conftest import VLLM_API_KEY
from kimi_deploy.check import followup
from kimi_deploy.errors import ExitCode
from test_check_replay import API_KEY, profile_for, results, run_json

pytestmark = pytest.mark.vllm

#: History id styles whose next call vLLM 0.33.0's kimi_k2 parser drops: it takes only ids matching
#: ``.+:\d+`` (``_TOOL_ID_RE`` in vllm/parser/kimi_k2.py), and Kimi copies the history's style.
VLLM_DROPPED_STYLES = ("sanitised", "openai", "anthropic", "uuid", "counter")


def _key(tmp_path, key: str):
    path = tmp_path / "api-key"
    path.write_text(key + "\n")
    path.chmod(0o600)  # the key-file rule: nothing for other users
    return path


def test_vllm_with_parsers_fails_only_the_dropped_ids_and_the_empty_tool_none_answer(vllm_replay, tmp_path):
    """No false alarm (a named tool_choice ends with finish_reason stop, as OpenAI's does), no false pass
    (tool_choice none answered with nothing: the tools were rendered and the parser swallowed the call)."""
    url = vllm_replay["parsers"].url()
    code, doc, result = run_json(tmp_path, ["--profile", str(profile_for(tmp_path, url)), "--api-key-file",
                                            str(_key(tmp_path, VLLM_API_KEY))])
    assert code == ExitCode.FAILED
    got = results(doc)
    failed = {i: c["kind"] for i, c in got.items() if c["status"] != "pass" and c["status"] != "skip"}
    expected = {f"contract.id_roundtrip.{s}.{m}": "tool_call_dropped"
                for s in VLLM_DROPPED_STYLES for m in ("nonstream", "stream")}
    expected |= {f"contract.tool_none.{m}": "empty_answer" for m in ("nonstream", "stream")}
    expected |= {i: "stop_without_calls" for i in followup.check_ids() if i.startswith("contract.followup.ids.")}
    assert failed == expected, failed
    for mode in ("nonstream", "stream"):
        named = got[f"contract.tool_named.{mode}"]
        assert named["status"] == "pass" and "finish_reason=stop" in named["detail"], named
    none = got["contract.tool_none.nonstream"]
    assert "--exclude-tools-when-tool-choice-none" in none["fix"]
    assert doc["server"] == {"kind": "vllm", "version": "0.33.0"}
    for check_id in ("config.tool_call_parser", "config.reasoning_parser", "config.speculative", "config.tp_size"):
        assert got[check_id]["status"] == "skip"
        assert "vLLM 0.33.0" in got[check_id]["detail"] and "reports no server arguments" in got[check_id]["detail"]
    assert got["contract.reasoning_on.nonstream"]["status"] == "pass"  # vLLM's `reasoning` field
    assert "contract.tool_none.stream" in result.stdout


def test_vllm_excluding_tools_when_none_passes_tool_none(vllm_replay, tmp_path):
    url = vllm_replay["exclude_none"].url()
    code, doc, _ = run_json(tmp_path, ["--base-url", url, "--only", "contract.tool_none.*,contract.tool_named.*"])
    assert code == ExitCode.OK, [(c["id"], c["kind"], c["detail"]) for c in doc["checks"]]
    assert {c["status"] for c in doc["checks"]} == {"pass"}


def test_vllm_without_parsers_is_config_mismatch_with_the_flags(vllm_replay, tmp_path):
    url = vllm_replay["noparsers"].url()
    code, doc, _ = run_json(tmp_path, ["--base-url", url, "--only", "contract.tool_auto.*,contract.tool_named.*"])
    assert code == ExitCode.FAILED
    for check in doc["checks"]:
        assert (check["status"], check["kind"]) == ("fail", "config_mismatch"), check
        assert "--enable-auto-tool-choice --tool-call-parser kimi_k2" in check["detail"]
        assert "HTTP 400" in check["detail"]
        assert check["fix"].startswith("restart the server with a Kimi tool-call parser: vLLM `--enable-auto-tool")
    assert doc["server"]["kind"] == "vllm"


@pytest.fixture(params=["sglang", "vllm"])
def server(request, tmp_path):
    """``(url, --api-key-file path)`` of the SGLang 0.5.23 replay (unpatched, kimi_k2 parsers) or the vLLM
    0.33.0 replay (kimi_k2 parsers, tools excluded for tool_choice none)."""
    if request.param == "sglang":
        return request.getfixturevalue("replay")["unpatched"].url(), _key(tmp_path, API_KEY)
    return request.getfixturevalue("vllm_replay")["exclude_none"].url(), None


def test_both_servers_forced_and_plain_cases_pass(server, tmp_path):
    """The verdicts that must not depend on the server: forced calls (required, named: stop or tool_calls),
    tool_choice none, plain chat, reasoning, parallel calls and the canonical id round trip pass on both."""
    url, key = server
    args = ["--base-url", url, "--model", "moonshotai/Kimi-K2.5", "--only",
            "contract.tool_required.*,contract.tool_named.*,contract.tool_none.*,contract.plain.*,"
            "contract.parallel.*,contract.id_roundtrip.canonical.*,contract.multi_turn.*"]
    if key:
        args += ["--api-key-file", str(key)]
    code, doc, _ = run_json(tmp_path, args)
    bad = [(c["id"], c["kind"], c["detail"]) for c in doc["checks"] if c["status"] != "pass"]
    assert bad == [] and code == ExitCode.OK
    assert len(doc["checks"]) == 14


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_both_servers_a_missing_key_is_http_error_with_health_open(kind, replay_of, tmp_path):
    """Both servers guard the OpenAI routes with --api-key and leave /health open; check says which server it met."""
    url = replay_of(kind)
    code, doc, _ = run_json(tmp_path, ["--base-url", url, "--model", "moonshotai/Kimi-K2.5",
                                       "--only", "health.live,health.models,contract.plain.nonstream"])
    got = results(doc)
    assert code == ExitCode.FAILED
    assert got["health.live"]["status"] == "pass"
    assert (got["health.models"]["status"], got["health.models"]["kind"]) == ("fail", "http_error")
    assert "401" in got["contract.plain.nonstream"]["detail"]
    # without the key the facts are refused too: SGLang's /model_info says 401 (still SGLang), vLLM's /v1/models
    # says nothing of its owner, so the server is only "other"
    assert doc["server"]["kind"] == {"sglang": "sglang", "vllm": "other"}[kind]


@pytest.fixture
def replay_of(request):
    """``kind -> url`` of the replay with kimi_k2 parsers and an API key (SGLang unpatched, vLLM ``parsers``)."""
    def url(kind: str) -> str:
        if kind == "sglang":
            return request.getfixturevalue("replay")["unpatched"].url()
        return request.getfixturevalue("vllm_replay")["parsers"].url()
    return url
