"""``--base-url`` as users paste it: one rule for ``check`` and ``bench`` (kimi_deploy/wire/baseurl.py).

Found by a new-operator trial: ``http://[::1:30000`` and ``http://127.0.0.1:99999`` were tracebacks
(exit 1) in both verbs, ``http://user:pw@host`` was written verbatim into bench's result (and check's
report), and ``.../v1/chat/completions`` ran a check whose every row failed with a 404 fix. Each is now
refused before anything is sent or written (exit 2, the URL and a fix); what users rightly paste passes.
"""

from __future__ import annotations

import socket

import pytest

from kimi_deploy.wire.baseurl import check_base_url
from kimi_deploy.errors import ExitCode, UsageError
from tests.helpers import run_cli


@pytest.fixture
def port():
    """A port nothing listens on (a verb that got past the rule would find nobody: exit 3, not 2)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


BAD = [
    ("http://[::1:{port}", "is not a valid URL", "http://[::1]:30000"),
    ("http://127.0.0.1:99999", "is not a valid URL", "e.g. --base-url"),
    ("http://127.0.0.1:0", "port 0", "e.g. --base-url"),
    ("127.0.0.1:{port}", "must start with http:// or https://", "e.g. --base-url"),
    ("ftp://127.0.0.1:{port}", "must start with http:// or https://", "e.g. --base-url"),
    ("http://:{port}", "has no host", "e.g. --base-url"),
    ("http://user:secret-pw@127.0.0.1:{port}", "carries credentials", "--api-key-file"),
    ("http://127.0.0.1:{port}/?model=x", "query or fragment", "--base-url http://127.0.0.1:{port}/"),
    ("http://127.0.0.1:{port}/v1/chat/completions", "names an endpoint (/v1/chat/completions)",
     "--base-url http://127.0.0.1:{port}"),
    ("http://127.0.0.1:{port}/v1/models/", "names an endpoint (/v1/models)", "--base-url http://127.0.0.1:{port}"),
    ("http://127.0.0.1:{port}/health", "names an endpoint (/health)", "--base-url http://127.0.0.1:{port}"),
]


@pytest.mark.parametrize("verb", [["check"], ["bench", "--no-progress", "--concurrency", "1", "--num-prompts", "1"]],
                         ids=["check", "bench"])
@pytest.mark.parametrize(("url", "message", "fix"), BAD, ids=[u for u, _, _ in BAD])
def test_a_bad_base_url_is_refused_before_anything_is_sent_or_written(verb, url, message, fix, port, tmp_path):
    out = tmp_path / "r.json"
    result = run_cli([*verb, "--base-url", url.format(port=port), "--json", str(out)])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "Traceback" not in result.output
    assert message in result.stderr and fix.format(port=port) in result.stderr, result.stderr
    assert "secret-pw" not in result.output
    assert not out.exists()


@pytest.mark.parametrize("url", ["http://127.0.0.1:30000", "http://127.0.0.1:30000/", "http://127.0.0.1:30000/v1",
                                 "http://127.0.0.1:30000/v1/", " http://localhost:30000 ", "http://[::1]:30000",
                                 "https://gpu-1.example:8443/kimi", "HTTP://127.0.0.1:30000"])
def test_what_users_rightly_paste_passes(url):
    assert check_base_url(url) == url.strip()


def test_the_error_names_the_option():
    with pytest.raises(UsageError, match="--base-url names an endpoint"):
        check_base_url("http://h:1/v1/completions")
