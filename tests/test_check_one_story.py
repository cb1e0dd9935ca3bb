"""check tells one story about one server (issue #30 item 4): against the kit's synthetic server
(benchmarks/synthetic_server.py, which answers /server_info but has no /model_info) the parser tier's row uses
the same notion of "what server is this" as the JSON's server.kind; the live progress ends on the report's row
count; a fix hints only at the status it explains; evidence is not cut in the middle of a word."""

from __future__ import annotations

from kimi_deploy.check import CheckOptions, run_checks
from kimi_deploy.check.results import CheckResult, clip, fix_for
from test_check_operator import synthetic_eos  # noqa: F401 - the fixture


def test_the_parser_row_and_the_server_kind_agree_and_progress_counts_rows(synthetic_eos):  # noqa: F811
    seen = []
    report = run_checks(CheckOptions(base_url=synthetic_eos, only=["health.*", "parser.*"], timeout=30,
                                     deadline=600), lambda cid, done, total, result: seen.append((done, total)))
    assert report.server.get("kind") == "sglang"
    (parser_row,) = [r for r in report.results if r.id.startswith("parser.")]
    assert "not SGLang" not in parser_row.detail and "is SGLang" in parser_row.detail
    done, total = seen[-1]
    assert done == total == len(report.results)


def test_a_2xx_answer_gets_only_the_2xx_hint():
    row = CheckResult("contract.malformed", "fail", "http_error",
                      "a malformed request (messages not a list) was accepted with 2xx")
    assert "401" not in row.fix and "404" not in row.fix and "does not validate requests" in row.fix
    assert "--api-key-file" in fix_for("http_error", detail="GET /health answered HTTP 401 Unauthorized")


def test_evidence_is_cut_between_words():
    text = "the quick brown fox jumps over the lazy dog " * 5
    cut = clip(text, 60)
    assert cut.endswith("…") and len(cut) <= 60
    assert text.startswith(cut[:-1]) and text[len(cut) - 1] == " "
    assert clip("x" * 200, 60) == "x" * 59 + "…"  # one long token is still cut at the limit
