"""A gate needs evidence of tool calls: a server that never calls a tool fails the contract tier.

The server here is a loopback OpenAI-compatible endpoint that answers every chat completion in prose (with
reasoning, so only the tool calls are missing), streamed and not, whatever ``tool_choice`` says: what a server that
ignores ``tool_choice`` (or a model that cannot call tools) looks like to a client. Under ``tool_choice`` auto a
prose answer stays ``model_declined`` (a warning: the model may decline); under ``required`` or a named function
it is ``tool_choice_violation`` (a failure), and the gate's contract tier runs those cases.
"""

from __future__ import annotations

import json
import time

import pytest

from install_fakes import sglang_server_args, write_profile
from kimi_deploy.errors import ExitCode
from kimi_deploy.host import gate as gates
from kimi_deploy.profile import load_profile
from kimi_deploy.deployment import resolve
from loopback import Loopback, QuietHandler

PROSE = "I can tell you about the weather, but I will not call a tool for it."
THOUGHT = "The user asks about the weather."


class ProseHandler(QuietHandler):
    """SGLang's info routes (the running parsers: kimi_k2), and prose for every chat completion."""

    protocol_version = "HTTP/1.1"

    def do_GET(self):  # noqa: N802 - http.server's naming
        args = sglang_server_args()
        routes = {"/model_info": {"model_path": args["model_path"], "tokenizer_path": args["model_path"],
                                  "is_generation": True, "preferred_sampling_params": None,
                                  "weight_version": "default", "has_image_understanding": False,
                                  "has_audio_understanding": False, "model_type": "kimi_k25",
                                  "architectures": ["KimiK25ForConditionalGeneration"]},
                  "/server_info": {**args, "version": "0.5.23"},
                  "/v1/models": {"object": "list", "data": [{"id": args["served_model_name"], "object": "model"}]}}
        if self.path not in routes:
            return self._send(404, {"detail": "Not Found"})
        return self._send(200, routes[self.path])

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path != "/v1/chat/completions":
            return self._send(404, {"detail": "Not Found"})
        model, created = body.get("model", "m"), int(time.time())
        if not body.get("stream"):
            return self._send(200, {
                "id": "chatcmpl-1", "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": PROSE, "reasoning_content": THOUGHT}}],
                "usage": {"prompt_tokens": 50, "completion_tokens": 20, "total_tokens": 70}})
        frames = [{"role": "assistant", "reasoning_content": THOUGHT}, {"content": PROSE}]
        chunks = [{"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": created, "model": model,
                   "choices": [{"index": 0, "delta": delta, "finish_reason": None}]} for delta in frames]
        chunks.append({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": created, "model": model,
                       "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 50, "completion_tokens": 20, "total_tokens": 70}})
        data = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        self._send(200, data.encode(), "text/event-stream")


@pytest.fixture
def prose_server():
    with Loopback(ProseHandler) as server:
        yield server


def test_a_server_that_never_calls_a_tool_fails_the_contract_tier(tmp_path, prose_server):
    profile = load_profile(write_profile(tmp_path / "p.toml", port=prose_server.port, api_key=False))
    tier = gates.run_tier("contract", resolve(profile, launches=False), None, base_url=prose_server.url)
    rows = {r["id"]: r for r in tier.results}
    assert set(rows) == set(gates.CONTRACT_SUBSET)
    assert tier.exit_code == ExitCode.FAILED and not tier.ok
    forced = [i for i in rows if i.startswith(("contract.tool_required.", "contract.tool_named."))]
    assert len(forced) == 4
    for check_id in forced:
        assert (rows[check_id]["status"], rows[check_id]["kind"]) == ("fail", "tool_choice_violation"), rows[check_id]
        assert "forced a call; the answer has none, only prose" in rows[check_id]["detail"]
    for mode in ("nonstream", "stream"):  # under auto the model may decline: a warning, not the failure
        assert (rows[f"contract.tool_auto.{mode}"]["status"], rows[f"contract.tool_auto.{mode}"]["kind"]) == \
            ("warn", "model_declined")
        assert rows[f"contract.reasoning_on.{mode}"]["status"] == "pass"
    assert sorted(tier.failed) == sorted(forced)
