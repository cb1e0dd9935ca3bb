"""kimi_deploy.litellm_hook (issue #19): the history-id rewrite for servers the kit cannot patch, in the real
LiteLLM proxy (scripts/litellm-testenv) on loopback in front of the vLLM 0.33.0 replay and the unpatched
SGLang 0.5.23 replay.

- one implementation: the SGLang patch kimi-k2-canonical-history-ids carries kimi_deploy.tool_ids' function
  byte for byte;
- the kit imports the hook without litellm installed;
- through the proxy with the hook, every id round trip passes on both servers (direct, and through the same
  proxy without the hook, the ids the servers' parsers drop fail); every other contract check ends as it
  does direct;
- what reaches a recording upstream through the proxy with the hook equals what reaches it without the hook
  but for the ids (streamed and not); hostile histories end as they do without the hook (never a proxy
  error of the hook's making); a text completion passes untouched; an Anthropic /v1/messages request (which
  LiteLLM turns into a chat completion, sanitising its ids) reaches the server with canonical ids.
"""

from __future__ import annotations

import copy
import enum
import inspect
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from conftest import SGLANG_API_KEY, VLLM_API_KEY
from loopback import Loopback, QuietHandler, send
from kimi_deploy import litellm_hook, tool_ids
from kimi_deploy.errors import ExitCode
from test_check_replay import DROPPED_STYLES, profile_for, run_json
from test_check_vllm import VLLM_DROPPED_STYLES

REPO = Path(__file__).resolve().parent.parent
PATCH = REPO / "patches" / "0.5.23" / "kimi-k2-canonical-history-ids.diff"
GOLDEN = REPO / "tests" / "golden" / "litellm" / "config.yaml"
MASTER_KEY = "sk-" + "0123456789abcdef" * 4
SERVED = "moonshotai/Kimi-K2.5"


def _history(call_id: str, second: str | None = None) -> list[dict]:
    calls = [{"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
    if second is not None:
        calls.append({"id": second, "type": "function", "function": {"name": "get_time", "arguments": "{}"}})
    out = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "weather?"},
           {"role": "assistant", "content": "", "tool_calls": calls}]
    out += [{"role": "tool", "tool_call_id": c["id"], "content": f"result {k}"} for k, c in enumerate(calls)]
    return out + [{"role": "assistant", "content": "done"}, {"role": "user", "content": "and Rome?"}]


def test_the_sglang_patch_carries_the_kits_function_verbatim():
    lines = PATCH.read_text().splitlines()
    start = lines.index("+def kimi_k2_canonical_history_ids(")
    end = lines.index("+", start)
    in_patch = "\n".join(line[1:] for line in lines[start:end]) + "\n"
    assert in_patch == inspect.getsource(tool_ids.kimi_k2_canonical_history_ids)


def test_the_kit_imports_the_hook_without_litellm():
    code = ("import importlib.util, sys; assert importlib.util.find_spec('litellm') is None, 'litellm installed'; "
            "import kimi_deploy.litellm_hook as h; assert h.KimiCanonicalToolIds.__bases__ == (object,); "
            "print(h.CALLBACK)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    if "litellm installed" in done.stderr:
        pytest.skip("litellm is installed in the kit's environment")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "kimi_deploy.litellm_hook.proxy_handler_instance"


@pytest.mark.parametrize("first,second", [
    ("functions_get_weather_0", "functions_get_time_1"),   # sanitised
    ("call_8f3a9c2e", "toolu_01A09q90"),                    # client-minted
    ("same", "same"),                                       # repeated: matched by position
    ("", ""),                                               # empty: matched by position
])
def test_the_request_changes_only_in_its_history_ids(first, second):
    body = {"model": "kimi", "messages": _history(first, second), "tools": [{"type": "function"}],
            "tool_choice": "auto", "temperature": 0, "stream": True, "extra": {"ünï": "cödé"}}
    before = copy.deepcopy(body)
    after = litellm_hook.canonicalize_request(copy.deepcopy(body))
    calls = after["messages"][2]["tool_calls"]
    assert [c["id"] for c in calls] == ["functions.get_weather:0", "functions.get_time:1"]
    assert [m["tool_call_id"] for m in after["messages"][3:5]] == ["functions.get_weather:0", "functions.get_time:1"]
    # every byte but the ids: put the old ids back and the JSON is the request as it came
    restored = copy.deepcopy(after)
    for call, old in zip(restored["messages"][2]["tool_calls"], (first, second)):
        call["id"] = old
    for msg, old in zip(restored["messages"][3:5], (first, second)):
        msg["tool_call_id"] = old
    assert json.dumps(restored, ensure_ascii=False) == json.dumps(before, ensure_ascii=False)


def test_requests_without_a_history_pass_untouched():
    for body in ({"messages": [{"role": "user", "content": "hi"}]}, {"prompt": "x"}, {"messages": "nope"},
                 {"messages": [["not", "a", "dict"]]}):
        same = copy.deepcopy(body)
        assert litellm_hook.canonicalize_request(body) == same


def test_the_hook_rewrites_chat_calls_only():
    import asyncio

    hook = litellm_hook.proxy_handler_instance
    body = {"messages": _history("functions_get_weather_0")}
    out = asyncio.run(hook.async_pre_call_hook(None, None, copy.deepcopy(body), "acompletion"))
    assert out["messages"][2]["tool_calls"][0]["id"] == "functions.get_weather:0"
    untouched = asyncio.run(hook.async_pre_call_hook(None, None, copy.deepcopy(body), "aembedding"))
    assert untouched == body


#: Histories the hook meets in a proxy that validates nothing before the pre-call hook: none may raise (a hook
#: that raises fails every request through the proxy); each is passed on as it came, for the server to judge.
HOSTILE_MESSAGES = {
    "messages a dict": {"role": "user"},
    "messages null": None,
    "a message not a dict": ["hi", {"role": "user", "content": "x"}],
    "tool_calls null": [{"role": "assistant", "content": "x", "tool_calls": None}, {"role": "tool", "content": "r"}],
    "tool_calls a string": [{"role": "assistant", "tool_calls": "functions.a:0"}],
    "tool_calls a dict": [{"role": "assistant", "tool_calls": {"id": "x", "function": {"name": "a"}}}],
    "a call not a dict": [{"role": "assistant", "tool_calls": ["x", None, 3]}],
    "function missing": [{"role": "assistant", "tool_calls": [{"id": "x", "type": "function"}]},
                         {"role": "tool", "tool_call_id": "x", "content": "r"}],
    "function a string": [{"role": "assistant", "tool_calls": [{"id": "x", "function": "get_weather"}]}],
    "function a list": [{"role": "assistant", "tool_calls": [{"id": "x", "function": ["get_weather"]}]}],
    "name not a string": [{"role": "assistant", "tool_calls": [{"id": "x", "function": {"name": {"a": 1}}}]}],
    "id a list": [{"role": "assistant", "tool_calls": [{"id": ["x"], "function": {"name": "a", "arguments": "{}"}}]}],
    "id a dict": [{"role": "assistant", "tool_calls": [{"id": {"x": 1}, "function": {"name": "a"}}]}],
    "tool_call_id a list": [{"role": "assistant", "tool_calls": [{"id": "x", "function": {"name": "a"}}]},
                            {"role": "tool", "tool_call_id": ["x"], "content": "r"}],
    "role a list": [{"role": ["assistant"], "tool_calls": [{"id": "x", "function": {"name": "a"}}]}],
}


@pytest.mark.parametrize("messages", HOSTILE_MESSAGES.values(), ids=HOSTILE_MESSAGES.keys())
def test_hostile_histories_never_raise_and_pass_untouched(messages):
    import asyncio

    for data in ({"model": "kimi", "messages": copy.deepcopy(messages)}, messages, "not a dict", None):
        before = copy.deepcopy(data)
        out = asyncio.run(litellm_hook.proxy_handler_instance.async_pre_call_hook(None, None, data, "acompletion"))
        assert out == before and data == before


def test_the_hook_passes_a_request_on_even_when_the_rewrite_itself_fails(monkeypatch, caplog):
    """A bug in the rewrite (here: one put in by hand) costs the ids, never the request: logged, passed on."""
    import asyncio

    def broken(messages):
        raise RuntimeError("a bug in the rewrite")

    monkeypatch.setattr(litellm_hook, "kimi_k2_canonical_history_ids", broken)
    body = {"messages": _history("functions_get_weather_0")}
    with caplog.at_level("WARNING", logger="kimi_deploy.litellm_hook"):
        out = asyncio.run(litellm_hook.proxy_handler_instance.async_pre_call_hook(None, None, copy.deepcopy(body),
                                                                                  "acompletion"))
    assert out == body
    assert "a bug in the rewrite" in caplog.text and "left as they came" in caplog.text


#: Well-formed histories beyond the sanitised-id one: (name, messages, the ids the calls get, the tool results').
EDGE_HISTORIES = {
    "content parts kept": (
        [{"role": "user", "content": [{"type": "text", "text": "w?"}, {"type": "image_url", "image_url": {"url": "x"}}]},
         {"role": "assistant", "content": [{"type": "text", "text": "calling"}], "tool_calls": [
             {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
         {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "18 C"}]}],
        ["functions.get_weather:0"], ["functions.get_weather:0"]),
    "names with dots and dashes": (
        [{"role": "assistant", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "mcp.fs-read_file", "arguments": "{}"}},
            {"id": "b", "type": "function", "function": {"name": "x-y.z", "arguments": "{}"}}]},
         {"role": "tool", "tool_call_id": "b", "content": "2"}, {"role": "tool", "tool_call_id": "a", "content": "1"}],
        ["functions.mcp.fs-read_file:0", "functions.x-y.z:1"], ["functions.x-y.z:1", "functions.mcp.fs-read_file:0"]),
    "parallel calls over two turns": (
        [{"role": "assistant", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "a", "arguments": "{}"}},
            {"id": "t2", "type": "function", "function": {"name": "b", "arguments": "{}"}}]},
         {"role": "tool", "tool_call_id": "t1", "content": "1"}, {"role": "tool", "tool_call_id": "t2", "content": "2"},
         {"role": "user", "content": "again"},
         {"role": "assistant", "tool_calls": [
             {"id": "t1", "type": "function", "function": {"name": "a", "arguments": "{}"}}]},
         {"role": "tool", "tool_call_id": "t1", "content": "3"}],
        ["functions.a:0", "functions.b:1", "functions.a:2"], ["functions.a:0", "functions.b:1", "functions.a:2"]),
    "arguments not a string: ids rewritten, arguments as they came": (
        [{"role": "assistant", "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "a", "arguments": {"city": "Paris"}}}]},
         {"role": "tool", "tool_call_id": "x", "content": "r"}],
        ["functions.a:0"], ["functions.a:0"]),
    "a result matching no call keeps its id": (
        [{"role": "assistant", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "a", "arguments": "{}"}}]},
         {"role": "tool", "tool_call_id": "c", "content": "1"}, {"role": "tool", "tool_call_id": "zzz", "content": "?"}],
        ["functions.a:0"], ["functions.a:0", "zzz"]),
}


@pytest.mark.parametrize("messages,call_ids,result_ids", EDGE_HISTORIES.values(), ids=EDGE_HISTORIES.keys())
def test_edge_histories_change_only_their_ids(messages, call_ids, result_ids):
    before = copy.deepcopy(messages)
    after = litellm_hook.canonicalize_request({"messages": copy.deepcopy(messages)})["messages"]
    assert [c["id"] for m in after for c in m.get("tool_calls") or []] == call_ids
    assert [m["tool_call_id"] for m in after if m["role"] == "tool"] == result_ids
    for old, new in zip(before, after):  # every other key and value as it came
        assert {k: v for k, v in new.items() if k not in ("tool_calls", "tool_call_id")} == \
            {k: v for k, v in old.items() if k not in ("tool_calls", "tool_call_id")}
        for old_call, new_call in zip(old.get("tool_calls") or [], new.get("tool_calls") or []):
            assert {**new_call, "id": old_call["id"]} == old_call


def test_a_history_already_canonical_is_the_same_object():
    body = {"messages": _history("functions.get_weather:0", "functions.get_time:1")}
    messages = body["messages"]
    assert litellm_hook.canonicalize_request(body)["messages"] is messages


def example_config() -> str:
    return litellm_hook.proxy_config({"kimi-k25": litellm_hook.Upstream(
        "http://10.0.0.5:8000/v1", SERVED, "KIMI_UPSTREAM_API_KEY")})


def test_the_example_proxy_config_matches_its_golden_file():
    """The config docs/runbook.md shows ("Servers the kit cannot patch"); KIMI_DEPLOY_UPDATE_GOLDEN=1 rewrites it."""
    text = example_config()
    if os.environ.get("KIMI_DEPLOY_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(text)
    assert GOLDEN.read_text() == text
    assert text in (REPO / "docs" / "runbook.md").read_text()


# --- the real LiteLLM proxy ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def litellm_python() -> str:
    """Interpreter of the LiteLLM test environment (``scripts/litellm-testenv``): ``KIMI_DEPLOY_LITELLM_PYTHON``,
    else ``<repo>/.litellm-env/bin/python``; missing: skipped (CI builds it: scripts/test)."""
    explicit = os.environ.get("KIMI_DEPLOY_LITELLM_PYTHON")
    if explicit:
        if not Path(explicit).exists():
            pytest.fail(f"KIMI_DEPLOY_LITELLM_PYTHON={explicit} does not exist")
        return explicit
    default = REPO / ".litellm-env" / "bin" / "python"
    if default.exists():
        return str(default)
    if os.environ.get("CI"):
        pytest.fail("the LiteLLM test environment is missing in CI; scripts/test must run scripts/litellm-testenv")
    pytest.skip("LiteLLM test environment missing: run scripts/litellm-testenv")


class Proxy:
    """``litellm --config`` on a loopback port, the kit's source on its PYTHONPATH."""

    def __init__(self, python: str, config: str, folder: Path, env: dict[str, str]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.yaml").write_text(config)
        with socket.socket() as probe:  # a free port for litellm's --port (it takes no 0)
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.log = folder / "proxy.log"
        full = {**os.environ, **env, "PYTHONPATH": str(REPO), "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "LITELLM_MASTER_KEY": MASTER_KEY, "PYTHONDONTWRITEBYTECODE": "1"}
        self.proc = subprocess.Popen([python, "-m", "litellm.proxy.proxy_cli", "--config", str(folder / "config.yaml"),
                                      "--host", "127.0.0.1", "--port", str(self.port)],
                                     stdout=self.log.open("w"), stderr=subprocess.STDOUT, env=full, cwd=folder)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait(self, timeout: float = 240.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(self.url + "/health/liveliness", timeout=5) as resp:
                    if resp.status == 200:
                        return self.url
            except OSError:
                time.sleep(0.5)
        self.stop()
        pytest.fail(f"the LiteLLM proxy did not start; its log:\n{self.log.read_text()[-4000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class Recorder:
    """A loopback upstream that keeps every request body LiteLLM sends it (``bodies``: ``(path, JSON)``) and
    answers a one-word chat completion (an event stream when asked) or text completion."""

    def __init__(self) -> None:
        self.bodies: list[tuple[str, Any]] = []
        outer = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802
                self._send(200, {"object": "list", "data": [{"id": SERVED, "object": "model"}]})

            def do_POST(self):  # noqa: N802
                data = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                outer.bodies.append((self.path, data))
                base = {"id": "x", "created": 1, "model": SERVED}
                if self.path.endswith("/completions") and not self.path.endswith("/chat/completions"):
                    return self._send(200, {**base, "object": "text_completion", "choices": [
                        {"index": 0, "text": "ok", "finish_reason": "stop"}]})
                if not data.get("stream"):
                    return self._send(200, {**base, "object": "chat.completion", "choices": [{
                        "index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
                frames = [{**base, "object": "chat.completion.chunk", "choices": [
                    {"index": 0, "delta": delta, "finish_reason": finish}]}
                    for delta, finish in (({"role": "assistant", "content": "ok"}, None), ({}, "stop"))]
                send(self, 200, b"".join(b"data: " + json.dumps(f).encode() + b"\n\n" for f in frames)
                     + b"data: [DONE]\n\n", "text/event-stream")

        self.server = Loopback(Handler)
        self.url = self.server.url


@pytest.fixture(scope="module")
def recorder():
    upstream = Recorder()
    yield upstream
    upstream.server.close()


@pytest.fixture(scope="module")
def proxies(litellm_python, vllm_replay, replay, recorder, tmp_path_factory):
    """``{"hook": url, "plain": url}``: two proxies (with the hook; the same config without it) serving
    ``kimi-vllm`` (the vLLM replay, kimi_k2 parsers), ``kimi-sglang`` (SGLang 0.5.23 as released) and
    ``kimi-echo`` (:class:`Recorder`, to see what reaches a server)."""
    models = {"kimi-vllm": litellm_hook.Upstream(vllm_replay["parsers"].url() + "/v1", SERVED, "VLLM_KEY"),
              "kimi-sglang": litellm_hook.Upstream(replay["unpatched"].url() + "/v1", SERVED, "SGLANG_KEY"),
              "kimi-echo": litellm_hook.Upstream(recorder.url + "/v1", SERVED)}
    config = litellm_hook.proxy_config(models)
    plain = config.replace(f'  callbacks: "{litellm_hook.CALLBACK}"\n', "")
    assert plain != config
    env = {"VLLM_KEY": VLLM_API_KEY, "SGLANG_KEY": SGLANG_API_KEY}
    root = tmp_path_factory.mktemp("litellm")
    started = {"hook": Proxy(litellm_python, config, root / "hook", env),
               "plain": Proxy(litellm_python, plain, root / "plain", env)}
    try:
        urls = {name: p.wait() for name, p in started.items()}
        yield {**urls, "hook_log": str(started["hook"].log)}
    finally:
        for p in started.values():
            p.stop()


def _key(tmp_path: Path, key: str) -> Path:
    path = tmp_path / f"key-{abs(hash(key))}"
    path.write_text(key + "\n")
    path.chmod(0o600)  # the key-file rule: nothing for other users
    return path


@pytest.mark.vllm
@pytest.mark.sglang
@pytest.mark.parametrize("model,dropped", [("kimi-vllm", VLLM_DROPPED_STYLES), ("kimi-sglang", DROPPED_STYLES)])
def test_through_the_hook_every_id_round_trip_passes(proxies, tmp_path, model, dropped):
    only = ["--model", model, "--api-key-file", str(_key(tmp_path, MASTER_KEY)), "--only", "contract.id_roundtrip.*"]
    code, doc, _ = run_json(tmp_path, ["--base-url", proxies["plain"], *only])
    failed = {c["id"]: c["kind"] for c in doc["checks"] if c["status"] != "pass"}
    assert failed == {f"contract.id_roundtrip.{s}.{m}": "tool_call_dropped" for s in dropped
                      for m in ("nonstream", "stream")}  # LiteLLM alone changes nothing
    code, doc, _ = run_json(tmp_path, ["--base-url", proxies["hook"], *only])
    assert code == ExitCode.OK, [(c["id"], c["kind"], c["detail"]) for c in doc["checks"] if c["status"] != "pass"]
    assert len(doc["checks"]) == 12 and doc["server"]["kind"] == "other"


@pytest.mark.vllm
@pytest.mark.sglang
@pytest.mark.parametrize("model", ["kimi-vllm", "kimi-sglang"])
def test_through_the_hook_every_other_check_ends_as_direct(proxies, vllm_replay, replay, tmp_path, model):
    """The same profile (kimi_k2 parsers expected: reasoning checked, ids must be canonical) for both runs;
    only the base URL, the model name and the key differ."""
    direct_url, key = ((vllm_replay["parsers"].url(), VLLM_API_KEY) if model == "kimi-vllm"
                       else (replay["unpatched"].url(), SGLANG_API_KEY))
    # the id checks are the hook's to change: the round trips and the agent conversations' client-minted ids
    select = ["--only", "contract.*", "--skip", "contract.id_roundtrip.*,contract.followup.ids.*"]
    _, direct, _ = run_json(tmp_path, ["--profile", str(profile_for(tmp_path, direct_url, name="direct.toml")),
                                       "--api-key-file", str(_key(tmp_path, key)), *select])
    _, proxied, _ = run_json(tmp_path, ["--profile", str(profile_for(tmp_path, proxies["hook"], name="proxy.toml")),
                                        "--model", model, "--api-key-file", str(_key(tmp_path, MASTER_KEY)), *select])
    seen = {c["id"]: (c["status"], c["kind"]) for c in direct["checks"]}
    assert {c["id"]: (c["status"], c["kind"]) for c in proxied["checks"]} == seen
    # 13 cases x 2 modes, multi_turn x 2, malformed; the agent conversations but their ids (10), the concurrency
    # bursts (6: five tool-call cases and reasoning_on), the prefix cache (issue 41)
    # (the vLLM replay reports no cached tokens: its prefix-cache check skips, direct and through the hook alike)
    assert len(seen) == 46 and all(v != ("skip", None) for k, v in seen.items() if k != "contract.prefix_cache")


def _post(url: str, path: str, body: Any) -> tuple[int, str]:
    """POST ``body`` (JSON) to the proxy with the master key: (status, response text)."""
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST", headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {MASTER_KEY}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _through_both(proxies, recorder, path: str, body: Any) -> dict[str, tuple[int, Any]]:
    """``{"plain"|"hook": (status, the body the upstream got, or None)}`` for one request sent through each."""
    out = {}
    for name in ("plain", "hook"):
        before = len(recorder.bodies)
        code, _ = _post(proxies[name], path, body)
        got = recorder.bodies[before:]
        assert len(got) <= 1, got
        out[name] = (code, got[0][1] if got else None)
    return out


#: Requests whose history the hook rewrites, as LiteLLM forwards them (streamed and not).
REAL_PROXY_HISTORIES = {
    "sanitised ids, parallel calls": _history("functions_get_weather_0", "functions_get_time_1"),
    "one id twice": _history("same", "same"),
    "empty ids": _history("", ""),
    **{name: messages for name, (messages, _, _) in EDGE_HISTORIES.items()
       if name != "arguments not a string: ids rewritten, arguments as they came"},
}


@pytest.mark.vllm
@pytest.mark.sglang
@pytest.mark.parametrize("stream", [False, True], ids=["nonstream", "stream"])
@pytest.mark.parametrize("messages", REAL_PROXY_HISTORIES.values(), ids=REAL_PROXY_HISTORIES.keys())
def test_through_the_real_proxy_only_the_history_ids_change(proxies, recorder, messages, stream):
    """What reaches the server through the proxy with the hook is what reaches it through the same proxy
    without it, but for the ids: LiteLLM's own rewriting is the same both ways, the hook adds only its own."""
    body = {"model": "kimi-echo", "messages": messages, "temperature": 0, "max_tokens": 7, "stream": stream,
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
            "tool_choice": "auto"}
    got = _through_both(proxies, recorder, "/v1/chat/completions", body)
    (plain_code, plain), (hook_code, hooked) = got["plain"], got["hook"]
    assert plain_code == hook_code == 200 and plain is not None and hooked is not None
    assert hooked != plain
    assert hooked == litellm_hook.canonicalize_request(copy.deepcopy(plain))


@pytest.mark.vllm
@pytest.mark.sglang
@pytest.mark.parametrize("messages", [m for m in HOSTILE_MESSAGES.values() if isinstance(m, list)],
                         ids=[k for k, m in HOSTILE_MESSAGES.items() if isinstance(m, list)])
def test_a_hostile_history_through_the_real_proxy_ends_as_without_the_hook(proxies, recorder, messages):
    """The hook never turns a request into a proxy error: each hostile history ends with the status (and the
    upstream body) it gets through the proxy without the hook, and the hook logs no failure."""
    log = Path(proxies["hook_log"])
    seen = log.stat().st_size
    got = _through_both(proxies, recorder, "/v1/chat/completions", {"model": "kimi-echo", "messages": messages,
                                                                    "max_tokens": 7})
    assert got["hook"] == got["plain"], got
    with log.open("rb") as fh:  # what the hook's proxy logged for this request only
        fh.seek(seen)
        added = fh.read().decode(errors="replace")
    assert "kimi-deploy tool-id hook" not in added and "async_pre_call_hook" not in added, added[-3000:]


@pytest.mark.vllm
@pytest.mark.sglang
def test_a_text_completion_through_the_real_proxy_passes_untouched(proxies, recorder):
    """Not a chat request (``/v1/completions``: call_type text_completion): the hook leaves it alone."""
    body = {"model": "kimi-echo", "prompt": "functions_get_weather_0 <|tool_call_begin|>", "max_tokens": 3}
    got = _through_both(proxies, recorder, "/v1/completions", body)
    assert got["hook"] == got["plain"] and got["hook"][0] == 200, got


# --- Anthropic Messages (/v1/messages: Claude Code and other Anthropic clients) ------------------------------


def _anthropic_history(first: str, second: str) -> list[dict]:
    return [
        {"role": "user", "content": "weather and time?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": first, "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": second, "name": "mcp.get-time", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": second, "content": "12:00"},
            {"type": "tool_result", "tool_use_id": first, "content": [{"type": "text", "text": "18 C"}]},
            {"type": "text", "text": "and Rome?"}]},
    ]


class CallTypes(str, enum.Enum):
    """The shape of LiteLLM's ``CallTypes`` (a ``str`` enum), which the deployment hook receives."""

    acompletion = "acompletion"
    aembedding = "aembedding"
    aresponses = "aresponses"


@pytest.mark.parametrize("call_type", [CallTypes.acompletion, "acompletion", "completion"])
def test_the_deployment_hook_rewrites_every_chat_completion(call_type):
    """What LiteLLM sends a deployment, after its own translations (an Anthropic request's ids already
    sanitised by it): the same rewrite."""
    import asyncio

    kwargs = {"model": "openai/x", "messages": _history("toolu_01A09q90", "functions_get_time_1"), "stream": False}
    out = asyncio.run(litellm_hook.proxy_handler_instance.async_pre_call_deployment_hook(copy.deepcopy(kwargs),
                                                                                         call_type))
    assert out == litellm_hook.canonicalize_request(copy.deepcopy(kwargs))
    assert [c["id"] for c in out["messages"][2]["tool_calls"]] == ["functions.get_weather:0", "functions.get_time:1"]


@pytest.mark.parametrize("call_type", [CallTypes.aembedding, CallTypes.aresponses, None, ["acompletion"], 7])
def test_the_deployment_hook_leaves_other_calls_alone(call_type):
    import asyncio

    kwargs = {"model": "openai/x", "messages": _history("toolu_01A09q90"), "input": [{"call_id": "call_1"}]}
    out = asyncio.run(litellm_hook.proxy_handler_instance.async_pre_call_deployment_hook(copy.deepcopy(kwargs),
                                                                                         call_type))
    assert out == kwargs


@pytest.mark.vllm
@pytest.mark.sglang
@pytest.mark.parametrize("stream", [False, True], ids=["nonstream", "stream"])
def test_through_the_real_proxy_an_anthropic_history_reaches_the_server_canonical(proxies, recorder, stream):
    """``POST /v1/messages`` (what Claude Code sends, ``toolu_`` ids): LiteLLM makes a chat completion of it;
    with the hook its history ids are canonical, and the whole body is what the OpenAI rule makes of the body
    LiteLLM sends without the hook (the rewrite before LiteLLM's translation equals the rewrite after it)."""
    body = {"model": "kimi-echo", "max_tokens": 16, "stream": stream,
            "messages": _anthropic_history("toolu_01A09q90qw90lq917835lq9", "toolu_01B7xyz"),
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}},
                      {"name": "mcp.get-time", "input_schema": {"type": "object"}}]}
    got = _through_both(proxies, recorder, "/v1/messages", body)
    (plain_code, plain), (hook_code, hooked) = got["plain"], got["hook"]
    assert plain_code == hook_code == 200 and plain is not None and hooked is not None, got
    ids = [c["id"] for m in hooked["messages"] for c in m.get("tool_calls") or []]
    assert ids == ["functions.get_weather:0", "functions.mcp.get-time:1"], hooked["messages"]
    assert [c["id"] for m in plain["messages"] for c in m.get("tool_calls") or []][0].startswith("toolu_")
    assert hooked == litellm_hook.canonicalize_request(copy.deepcopy(plain))


# --- each family's id form: K3 ids pass unchanged, K2 ids are still canonicalised (issue 29) -----------------

K3_SERVED = "moonshotai/Kimi-K3"
#: What SGLang 0.5.23's kimi_k3 path mints (serving_chat._process_tool_call_id: f"{name}:{index}").
K3_HISTORY = _history("get_weather:0", "get_time:1")


def test_proxy_config_marks_a_k3_upstream_and_leaves_k2_ones_as_before():
    text = litellm_hook.proxy_config({
        "kimi-k25": litellm_hook.Upstream("http://10.0.0.5:8000/v1", SERVED),
        "kimi-k3": litellm_hook.Upstream("http://10.0.0.6:8000/v1", K3_SERVED, tool_call_parser="kimi_k3")})
    assert '      model: "openai/moonshotai/Kimi-K3"\n      api_base: "http://10.0.0.6:8000/v1"\n' \
           '      api_key: "none"\n    model_info:\n      kimi_deploy_tool_call_parser: "kimi_k3"\n' in text
    assert text.count("model_info:") == 1  # the K2.5 entry is rendered exactly as before (golden file above)


@pytest.mark.parametrize("data", [
    {"model": "anything", "model_info": {"kimi_deploy_tool_call_parser": "kimi_k3"}},  # the deployment hook
    {"model": K3_SERVED}, {"model": "openai/moonshotai/Kimi-K3"}, {"model": "kimi-k3"},  # known by name
], ids=["model_info", "served name", "litellm model", "short name"])
def test_k3_ids_pass_the_hook_unchanged(data):
    import asyncio

    body = {**data, "messages": copy.deepcopy(K3_HISTORY)}
    for hook in (lambda d: litellm_hook.proxy_handler_instance.async_pre_call_hook(None, None, d, "acompletion"),
                 lambda d: litellm_hook.proxy_handler_instance.async_pre_call_deployment_hook(d, "acompletion")):
        out = asyncio.run(hook(copy.deepcopy(body)))
        assert out == body


def test_k2_ids_are_still_canonicalised_next_to_k3():
    k2 = litellm_hook.canonicalize_request({"model": SERVED, "messages": _history("functions_get_weather_0")})
    assert k2["messages"][2]["tool_calls"][0]["id"] == "functions.get_weather:0"
    # K3's own form sent to a K2 model is K2's business: canonicalised as any foreign id
    k2_from_k3 = litellm_hook.canonicalize_request({"model": "kimi", "messages": copy.deepcopy(K3_HISTORY)})
    assert [c["id"] for c in k2_from_k3["messages"][2]["tool_calls"]] == ["functions.get_weather:0",
                                                                          "functions.get_time:1"]


@pytest.fixture(scope="module")
def mixed_proxy(litellm_python, recorder, tmp_path_factory):
    """One proxy with the hook: ``kimi-k25`` (a K2.5 server) and ``k3-prod`` (a K3 server under a name the kit's
    table does not know: only its ``model_info`` says kimi_k3), both the :class:`Recorder`."""
    config = litellm_hook.proxy_config({
        "kimi-k25": litellm_hook.Upstream(recorder.url + "/v1", SERVED),
        "k3-prod": litellm_hook.Upstream(recorder.url + "/v1", K3_SERVED.replace("Kimi-K3", "house-model"),
                                         tool_call_parser="kimi_k3")})
    proxy = Proxy(litellm_python, config, tmp_path_factory.mktemp("litellm-mixed"), {})
    try:
        yield proxy.wait()
    finally:
        proxy.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["nonstream", "stream"])
def test_a_mixed_k25_and_k3_proxy_rewrites_per_model(mixed_proxy, recorder, stream):
    """Through the real LiteLLM proxy: the K3 model's history reaches its server with its NAME:N ids as sent,
    the K2.5 model's sanitised ids reach its server canonical, in the same proxy."""
    sent = {}
    for model, messages in (("k3-prod", K3_HISTORY), ("kimi-k25", _history("functions_get_weather_0",
                                                                            "functions_get_time_1"))):
        before = len(recorder.bodies)
        code, _ = _post(mixed_proxy, "/v1/chat/completions", {"model": model, "messages": messages,
                                                              "max_tokens": 7, "stream": stream})
        assert code == 200
        (_, body), = recorder.bodies[before:]
        sent[model] = ([c["id"] for m in body["messages"] for c in m.get("tool_calls") or []],
                       [m["tool_call_id"] for m in body["messages"] if m["role"] == "tool"])
    assert sent["k3-prod"] == (["get_weather:0", "get_time:1"], ["get_weather:0", "get_time:1"])
    assert sent["kimi-k25"] == (["functions.get_weather:0", "functions.get_time:1"],
                                ["functions.get_weather:0", "functions.get_time:1"])
