"""The ``parser.*`` tier against small loopback servers, and its judge on recorded parser answers.

The replay tests (tests/test_check_replay.py) run the tier against SGLang 0.5.23's own parsers,
unpatched and patched; these cover what does not need SGLang: servers without the endpoints or
without a Kimi parser (one ``skip`` row), a server that refuses, and a parser that answers wrongly.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from kimi_deploy import paths
from kimi_deploy.check import CheckOptions, parser, check_ids, run_checks
from kimi_deploy.check.completion_rules import first
from kimi_deploy.errors import ExitCode
from loopback import Loopback, QuietHandler

TOOLS = parser.corpus()["toolsets"]["files"]


def _call(name, args, index=0):
    return {"tool_index": index, "name": name, "parameters": json.dumps(args)}


@pytest.mark.parametrize("calls, expected, kinds", [
    ([_call("Write", {"file_path": "/a", "content": "x"})], [["Write", {"file_path": "/a", "content": "x"}]], []),
    ([_call("Read", {"file_path": "/etc/hosts"})], [], ["wrong_tool"]),  # the rule drops a tie
    ([_call("Delete", {"file_path": "/a"})], [["Read", {"file_path": "/a"}]], ["wrong_tool", "tool_call_dropped"]),
    ([], [["Read", {"file_path": "/a"}]], ["tool_call_dropped"]),
    ([_call("invalid", {"x": "1"})], [], ["unknown_tool"]),
    ([_call("Read", {"file_path": "/b"})], [["Read", {"file_path": "/a"}]], ["invalid_arguments"]),
    # the first of two calls dropped: the second is still matched, not called a wrong tool
    ([_call("Write", {"file_path": "/a", "content": "x"})],
     [["Read", {"file_path": "/a"}], ["Write", {"file_path": "/a", "content": "x"}]], ["tool_call_dropped"]),
    ([_call("Read", {"file_path": "/a"}), _call("Read", {"file_path": "/a"}, 1)], [["Read", {"file_path": "/a"}]],
     ["wrong_tool"]),  # an extra call
    # item 5, arguments written as a JSON-encoded string: passed through or decoded, the call is kept
    ([_call("Write", '{"file_path": "/a"}')], [["Write", '{"file_path": "/a"}']], []),
    ([_call("Write", {"file_path": "/a"})], [["Write", '{"file_path": "/a"}']], []),
    ([_call("Write", {"file_path": "/b"})], [["Write", '{"file_path": "/a"}']], ["invalid_arguments"]),
])
def test_judge_calls(calls, expected, kinds):
    findings = parser.judge_calls(calls, expected, TOOLS)
    assert [f.kind for f in findings] == kinds


def test_wrong_tool_is_the_most_telling_kind():
    findings = parser.judge_calls([_call("Read", {"file_path": "/a"})], [["Delete", {"file_path": "/a"}]], TOOLS)
    assert first(findings).kind == "wrong_tool"
    assert "gave the call to Read" in first(findings).detail


def test_the_corpus_ships_with_the_package_and_every_id_is_valid():
    ids = parser.check_ids()
    assert len(ids) == len(set(ids)) >= 20
    schema = json.loads(paths.check_report_schema().read_text())
    pattern = schema["$defs"]["check"]["properties"]["id"]["pattern"]
    assert all(jsonschema.Draft202012Validator({"pattern": pattern}).is_valid(i) for i in ids)
    assert check_ids.select(["parser"]) == ids  # a tier prefix selects it
    assert "wrong_tool" in schema["$defs"]["kind"]["enum"]
    for case in parser.corpus()["tool_calls"]:  # every expected call is valid against its tool
        schemas = {t["function"]["name"]: t["function"].get("parameters") for t in
                   parser.corpus()["toolsets"][case["tools"]]}
        for name, args in case["calls"]:
            if isinstance(args, str):  # item 5: the model's own JSON-encoded string, passed through
                continue
            assert jsonschema.Draft202012Validator(schemas[name] or {"type": "object"}).is_valid(args), case["id"]


class Fake:
    """A loopback server: ``model_info`` (None: 404), ``parse`` (a function body -> (status, body))."""

    def __init__(self, model_info=None, parse=None, reasoning=None, info_status=200):
        self.posts: list[tuple[str, dict]] = []
        fake = self

        class Handler(QuietHandler):
            def do_GET(self):
                if self.path == "/model_info" and model_info is not None:
                    self._send(info_status, model_info)
                elif self.path in ("/health", "/v1/models"):
                    self._send(200, {"object": "list", "data": [{"id": "m"}]})
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.posts.append((self.path, body))
                handler = {"/parse_function_call": parse, "/separate_reasoning": reasoning}.get(self.path)
                if handler is None:
                    self._send(404, {"detail": "Not Found"})
                else:
                    self._send(*handler(body))

        self.server = Loopback(Handler)
        self.url = self.server.url

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.server.close()


KIMI = {"tool_call_parser": "kimi_k2", "reasoning_parser": "kimi_k2"}


def _run(url: str):
    return run_checks(CheckOptions(base_url=url, only=["parser"], timeout=5))


@pytest.mark.parametrize("model_info, parse, needle", [
    (None, None, "not SGLang (no /model_info or /server_info)"),                                   # vLLM, Exo, LiteLLM
    ({"tool_call_parser": None, "reasoning_parser": None}, None, "tool_call_parser None, not kimi_k2"),
    ({"tool_call_parser": "qwen25", "reasoning_parser": None}, None, "tool_call_parser 'qwen25'"),
    (KIMI, None, "POST /parse_function_call answered HTTP 404"),                    # no such endpoint
])
def test_one_skip_row_where_the_tier_cannot_run(model_info, parse, needle):
    with Fake(model_info, parse) as fake:
        report = _run(fake.url)
    [row] = report.results
    assert (row.id, row.status, row.kind) == (parser.check_ids()[0], "skip", None)
    assert needle in row.detail
    assert report.exit_code == ExitCode.OK


def test_a_key_needed_for_model_info_is_one_fail_row():
    with Fake(KIMI, info_status=401) as fake:
        report = _run(fake.url)
    [row] = report.results
    assert (row.status, row.kind) == ("fail", "http_error") and "401" in row.evidence


def _sglang_like(attribute):
    """A parser endpoint that attributes every call to ``attribute(body)`` (a buggy parser)."""
    def parse(body):
        if not body["text"]:
            return 200, {"normal_text": "", "calls": []}
        return 200, {"normal_text": "", "calls": attribute(body)}
    return parse


def test_a_parser_that_picks_the_first_tool_fails_as_wrong_tool_and_reasoning_skips_once():
    first_tool = _sglang_like(lambda body: [{"tool_index": 0, "name": body["tools"][0]["function"]["name"],
                                             "parameters": "{}"}])
    with Fake({"tool_call_parser": "kimi_k2", "reasoning_parser": None}, first_tool) as fake:
        report = _run(fake.url)
        posts = fake.posts
    got = {r.id: r for r in report.results}
    assert got["parser.tool_calls.attribution.counter_tie"].kind == "wrong_tool"
    assert got["parser.tool_calls.attribution.weird_id"].kind == "wrong_tool"
    # the reasoning group: one skip row, the rest left out
    reasoning = [r for r in report.results if r.id.startswith("parser.reasoning.")]
    assert [(r.status, r.id) for r in reasoning] == [("skip", "parser.reasoning.think_then_answer")]
    assert "reasoning_parser None" in reasoning[0].detail
    assert report.exit_code == ExitCode.FAILED
    # the server's own parser name was sent, with each case's tools
    sent = [b for p, b in posts if p == "/parse_function_call" and b["text"]]
    assert sent and all(b["tool_call_parser"] == "kimi_k2" and b["tools"] for b in sent)
