"""One rule for a key file (issue #38): what ``install`` accepts, ``check`` and ``bench`` accept, and the reverse.

Before: install accepted key files every client then refused (1 MB, non-ASCII, two lines, 4097 bytes) with only a
mode warning; check and bench said nothing about a world-readable key file; a symlinked file's whole content was
sent as the Bearer token.
"""

from __future__ import annotations

import os
import stat

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import run_cli
from kimi_deploy.errors import ExitCode, UsageError
from kimi_deploy.paths import HostLayout
from kimi_deploy.wire import apikey

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

_contents = st.one_of(
    st.binary(max_size=64),
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=60)
    .map(lambda s: s.encode() + b"\n"),
    st.sampled_from([b"k" * 4097, b"key\nsecond\n", b"\xef\xbb\xbfkey\n", b"-Cr4sh\n", b"caf\xc3\xa9\n",
                     b"  spaced-key  \n", b"\n\n", b"key\r\n", b"a\x00b\n"]))


@FUZZ
@given(content=_contents, mode=st.sampled_from([0o600, 0o400, 0o640, 0o644, 0o604, 0o660, 0o666]))
def test_install_and_the_clients_apply_one_rule(tmp_path, content, mode):
    path = tmp_path / "etc" / "key"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(content)
    path.chmod(mode)
    fact = apikey.inspect(HostLayout(tmp_path), "/etc/key")
    try:
        key = apikey.read_key_file(path)
    except UsageError as exc:
        assert fact.problem is not None and fact.problem in exc.message
        return
    assert fact.problem is None
    assert key and "\n" not in key and not key.startswith("-") and all(" " <= c <= "~" for c in key)
    assert len(content) <= apikey.MAX_KEY_FILE_BYTES and not stat.S_IMODE(os.stat(path).st_mode) & 0o007


@pytest.mark.parametrize("content, mode, words", [
    (b"k" * 4097, 0o600, "over 4096 bytes"),
    (b"key\nsecond-line\n", 0o600, "2 lines"),
    (b"caf\xc3\xa9\n", 0o600, "U+00E9"),
    (b"-Cr4sh\n", 0o600, "starts with '-'"),
    (b"good-key\n", 0o644, "open to every user"),
])
def test_check_bench_and_install_refuse_the_same_file(tmp_path, content, mode, words):
    key = tmp_path / "key"
    key.write_bytes(content)
    key.chmod(mode)
    for verb in (["check", "--base-url", "http://127.0.0.1:9"], ["bench", "--base-url", "http://127.0.0.1:9"]):
        result = run_cli([*verb, "--api-key-file", str(key)])
        assert result.exit_code == ExitCode.USAGE and words in result.stderr, result.stderr
        assert "second-line" not in result.stderr and "good-key" not in result.stderr
    assert words in (apikey.inspect(HostLayout(tmp_path), "/key").problem or "")


def test_a_symlink_to_a_whole_file_is_not_sent_as_the_key(tmp_path):
    target = tmp_path / "notes"
    target.write_text("line one\nline two\n")
    target.chmod(0o600)
    link = tmp_path / "key"
    link.symlink_to(target)
    with pytest.raises(UsageError, match="2 lines"):
        apikey.read_key_file(link)


def test_the_named_override_accepts_any_mode_but_not_any_content(tmp_path, monkeypatch):
    key = tmp_path / "key"
    key.write_text("shared-key\n")
    key.chmod(0o644)
    with pytest.raises(UsageError, match="open to every user"):
        apikey.read_key_file(key)
    monkeypatch.setenv(apikey.ANY_MODE_ENV, "1")
    assert apikey.read_key_file(key) == "shared-key"
    key.write_text("two\nlines\n")
    with pytest.raises(UsageError, match="2 lines"):
        apikey.read_key_file(key)


def test_group_access_through_a_group_the_reader_is_in_is_allowed():
    """A Kubernetes Secret is mounted 0440 root:fsGroup; the kit's CronJob runs in fsGroup."""
    st_ = os.stat_result((stat.S_IFREG | 0o440, 0, 0, 1, 0, 2000, 10, 0, 0, 0))
    assert apikey.key_file_problem(st_, b"k\n", euid=1000, groups=frozenset({2000})) is None
    problem = apikey.key_file_problem(st_, b"k\n", euid=1000, groups=frozenset({1000}))
    assert problem and "group 2000" in problem[0]
