"""Every kind of bad profile gets exit 2, the offending key and value, and a fix; nothing is written."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal

import pytest

from helpers import MINIMAL, run_cli, write_profile

PRESET_LIKE = MINIMAL.replace('tp_size = 8\n', 'tp_size = 8\nhost = "0.0.0.0"\napi_key_file = "/etc/kimi-deploy/k.api-key"\n')

CASES = [
    # (id, profile text, substrings the error must contain)
    ("unknown-key", MINIMAL.replace("tp_size = 8", "tp_sise = 8"),
     ["sglang.tp_sise: unknown key", "did you mean tp_size?"]),
    ("key-in-wrong-table", MINIMAL.replace('python = "/opt', 'tp_size = 8\npython = "/opt'),
     ["service.tp_size: unknown key", "tp_size belongs in the [sglang] table"]),
    ("unknown-table", MINIMAL + "\n[sglan]\nport = 1\n", ["sglan: unknown key", "did you mean [sglang]?"]),
    ("wrong-type", MINIMAL + 'port = "thirty thousand"\n', ["sglang.port", "'thirty thousand'"]),
    ("port-out-of-range", MINIMAL + "port = 70000\n", ["sglang.port", "less than or equal to 65535", "70000"]),
    ("tp-does-not-divide", MINIMAL.replace("tp_size = 8", "tp_size = 3"),
     ["sglang.tp_size: 3 does not divide service.gpu_count = 8"]),
    ("tp-above-gpus", MINIMAL.replace("tp_size = 8", "tp_size = 16"),
     ["sglang.tp_size: 16 does not divide service.gpu_count = 8"]),
    ("spec-incomplete", MINIMAL + 'speculative_algorithm = "EAGLE3"\n'
     'speculative_draft_model_path = "/models/d"\nspeculative_num_steps = 3\n',
     ["must be set together", "speculative_eagle_topk, speculative_num_draft_tokens"]),
    ("spec-without-algorithm", MINIMAL + "speculative_num_steps = 3\nspeculative_eagle_topk = 1\n"
     "speculative_num_draft_tokens = 4\n", ["no algorithm", 'speculative_algorithm = "EAGLE3"']),
    ("eagle-without-draft", MINIMAL + 'speculative_algorithm = "EAGLE3"\n', ["EAGLE3 needs a draft model"]),
    ("spec-v2-topk", MINIMAL + 'speculative_algorithm = "EAGLE3"\nspeculative_draft_model_path = "/models/d"\n'
     "speculative_num_steps = 3\nspeculative_eagle_topk = 4\nspeculative_num_draft_tokens = 8\n"
     "enable_spec_v2 = true\n", ["supports only speculative_eagle_topk = 1, got 4"]),
    ("draft-tokens-vs-steps", MINIMAL + 'speculative_algorithm = "EAGLE3"\nspeculative_draft_model_path = "/m/d"\n'
     "speculative_num_steps = 3\nspeculative_eagle_topk = 1\nspeculative_num_draft_tokens = 8\n",
     ["SGLang would silently use steps + 1 = 4", "speculative_num_draft_tokens = 4"]),
    ("relative-model-path", MINIMAL.replace('"/models/moonshotai/Kimi-K2.5"', '"models/kimi"'),
     ["sglang.model_path", "relative", "absolute path"]),
    ("relative-python", MINIMAL.replace('"/opt/sglang/.venv/bin/python"', '"python3"'),
     ["service.python", "relative"]),
    ("needs-quoting", MINIMAL + 'served_model_name = "kimi k2.5"\n',
     ["sglang.served_model_name", "would need shell quoting", "' '"]),
    ("extra-arg-needs-quoting", MINIMAL + 'extra_args = ["--json-model-override-args", "{\\"a\\": 1}"]\n',
     ["sglang.extra_args", "would need shell quoting"]),
    ("percent-specifier", MINIMAL.replace('"/models/moonshotai/Kimi-K2.5"', '"/models/%i"'),
     ["sglang.model_path", "would need shell quoting", "'%'"]),
    ("public-without-key", MINIMAL + 'host = "0.0.0.0"\n',
     ["sglang.host: 0.0.0.0 accepts connections from other machines but no api_key_file",
      "allow_unauthenticated = true"]),
    ("api-key-in-extra-args", PRESET_LIKE + 'extra_args = ["--api-key", "sk-123"]\n',
     ["an API key on the command line", "use api_key_file"]),
    ("reserved-env", MINIMAL + '\n[environment]\nSGLANG_ENABLE_SPEC_V2 = "1"\n',
     ["environment.SGLANG_ENABLE_SPEC_V2", "use [sglang] enable_spec_v2"]),
    ("root-user", MINIMAL.replace('name = "kimi-k25"', 'name = "kimi-k25"\nuser = "root"'),
     ["service.user", "must not run as root"]),
    ("bad-unit-name", MINIMAL.replace('name = "kimi-k25"', 'name = "kimi k25.service"'), ["service.name"]),
    ("missing-model-path", MINIMAL.replace('model_path = "/models/moonshotai/Kimi-K2.5"\n', ""),
     ["sglang.model_path: required, but missing"]),
    ("bad-hardening", MINIMAL.replace('name = "kimi-k25"', 'name = "kimi-k25"\nhardening = "paranoid"'),
     ["service.hardening", "'standard' or 'strict'", "paranoid"]),
    ("toml-syntax", MINIMAL + "port = \n", ["is not valid TOML", "line"]),
    ("string-for-int", MINIMAL.replace("tp_size = 8", 'tp_size = "8"'),
     ["sglang.tp_size", "valid integer", "'8'"]),
    ("string-for-bool", MINIMAL + 'trust_remote_code = "yes"\n', ["sglang.trust_remote_code", "valid boolean"]),
    ("span-out-of-range", MINIMAL.replace('name = "kimi-k25"', 'name = "kimi-k25"\ntimeout_start_sec = 99999999999999'),
     ["service.timeout_start_sec", "less than or equal to 604800"]),
    pytest.param(
        MINIMAL.replace('name = "kimi-k25"', 'name = "kimi-k25"\ncheck_on_calendar = "every blue moon"'),
        ["service.check_on_calendar", "systemd rejects 'every blue moon'", "*-*-* 03:00:00"],
        id="bad-calendar",
        marks=pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")),
]


@pytest.mark.parametrize("text,expected", [c if isinstance(c, type(pytest.param())) else pytest.param(*c[1:], id=c[0])
                                           for c in CASES])
def test_bad_profile_is_exit_2_with_message_and_no_output(tmp_path, text, expected):
    profile = write_profile(tmp_path, text)
    out = tmp_path / "out"
    result = run_cli(["render", "--profile", str(profile), "--out", str(out)])
    assert result.exit_code == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: ")
    for fragment in expected:
        assert fragment in result.stderr, f"{fragment!r} not in:\n{result.stderr}"
    assert "fix:" in result.stderr
    assert not out.exists(), "a failed render must not create the output folder"


def test_integer_environment_values_mean_strings(tmp_path):
    """`NCCL_IB_DISABLE = 1` is what people write; it is the string "1" in the EnvironmentFile."""
    profile = write_profile(tmp_path, MINIMAL + "\n[environment]\nNCCL_IB_DISABLE = 1\nNCCL_MIN_NCHANNELS = 4\n")
    out = tmp_path / "out"
    assert run_cli(["render", "--profile", str(profile), "--out", str(out)]).exit_code == 0
    env = (out / "kimi-k25.env").read_text()
    assert "NCCL_IB_DISABLE=1\n" in env and "NCCL_MIN_NCHANNELS=4\n" in env


def test_boolean_environment_value_is_refused(tmp_path):
    profile = write_profile(tmp_path, MINIMAL + "\n[environment]\nNCCL_IB_DISABLE = true\n")
    result = run_cli(["render", "--profile", str(profile)])
    assert result.exit_code == 2 and "environment.NCCL_IB_DISABLE" in result.stderr


def test_empty_sglang_version_is_an_error():
    result = run_cli(["render", "--preset", "kimi-k25-rtx-pro-6000-x8", "--sglang-version", ""])
    assert result.exit_code == 2 and "not an SGLang version" in result.stderr


def test_missing_profile_file(tmp_path):
    result = run_cli(["render", "--profile", str(tmp_path / "nope.toml")])
    assert result.exit_code == 2
    assert "profile file not found" in result.stderr and "kimi-deploy init" in result.stderr


ENCODINGS = {  # how a profile saved by another editor arrives (new-operator trial: no fix line, Python's words)
    "utf-8 with BOM": (b"\xef\xbb\xbf" + MINIMAL.encode(), "starts with a UTF-8 byte-order mark (BOM)",
                       "save it as UTF-8 without BOM"),
    "utf-16": (MINIMAL.encode("utf-16"), "starts with a UTF-16 byte-order mark", "iconv -f UTF-16 -t UTF-8"),
    "latin-1": (MINIMAL.replace('name = "kimi-k25"', 'name = "kimi-k25"\ndescription = "caf\xe9"').encode("latin-1"),
                "is not UTF-8 text: byte 0xe9 at line 3, column 19", "iconv -f LATIN1 -t UTF-8"),
}


@pytest.mark.parametrize("verb", [["render"], ["check", "--base-url", "http://127.0.0.1:9"]], ids=["render", "check"])
@pytest.mark.parametrize(("data", "message", "fix"), ENCODINGS.values(), ids=ENCODINGS.keys())
def test_a_profile_in_another_encoding_names_it_and_the_fix(tmp_path, verb, data, message, fix):
    profile = tmp_path / "p.toml"
    profile.write_bytes(data)
    result = run_cli([*verb, "--profile", str(profile)])
    assert result.exit_code == 2, result.output
    fix_line = next(line for line in result.stderr.splitlines() if line.strip().startswith("fix: "))
    assert message in result.stderr and fix in fix_line, result.stderr
    assert "codec" not in result.stderr and "Invalid statement" not in result.stderr


def test_crlf_line_endings_are_fine(tmp_path):
    profile = tmp_path / "p.toml"
    profile.write_bytes(MINIMAL.replace("\n", "\r\n").encode())
    assert run_cli(["render", "--profile", str(profile), "--print-command"]).exit_code == 0


@pytest.mark.parametrize("verb", [["render"], ["check"], ["install", "--dry-run"]])
def test_a_directory_given_as_the_profile_says_so_with_a_fix(tmp_path, verb):
    result = run_cli([*verb, "--profile", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "the profile is a directory" in result.stderr and "fix: give the path of the TOML file" in result.stderr


@contextlib.contextmanager
def _no_hang(seconds: int = 120):
    """Fail (not hang the suite) when the code under test blocks on a FIFO: the refusal takes milliseconds."""
    def expired(signum, frame):
        raise AssertionError(f"blocked for {seconds} s reading a FIFO")
    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("verb", [["render"], ["validate"], ["install", "--dry-run"]])
@pytest.mark.parametrize("kind", ["fifo", "device", "huge"])
def test_a_profile_that_is_not_a_small_regular_file_is_refused_before_it_is_read(tmp_path, verb, kind):
    """A FIFO without a writer blocked every verb forever and /dev/zero filled memory (Path.read_bytes)."""
    path = tmp_path / "p.toml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    else:
        path.write_text(MINIMAL + "#" * (1 << 20))
    with _no_hang():
        result = run_cli([*verb, "--profile", str(path)])
    assert result.exit_code == 2, result.output
    said = {"fifo": "the profile is a FIFO (named pipe), not a regular file",
            "device": "the profile is a character device, not a regular file",
            "huge": "the profile is larger than 1 MiB"}[kind]
    assert said in result.stderr and "fix: give the path of the TOML file itself" in result.stderr


def test_a_gpu_facts_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "gpus.csv"
    os.mkfifo(fifo)
    with _no_hang():
        result = run_cli(["validate", "--profile", str(write_profile(tmp_path, MINIMAL)), "--gpu-facts", str(fifo)])
    assert result.exit_code == 2, result.output
    assert "cannot read the GPU facts file (a FIFO (named pipe), not a regular file)" in result.stderr


def test_unknown_preset_suggests_the_close_one():
    result = run_cli(["render", "--preset", "kimi-k25-rtx-pro-6000"])
    assert result.exit_code == 2
    assert "no such preset" in result.stderr and "did you mean kimi-k25-rtx-pro-6000-x8?" in result.stderr


def test_profile_and_preset_together_is_an_error(tmp_path):
    profile = write_profile(tmp_path, MINIMAL)
    result = run_cli(["render", "--profile", str(profile), "--preset", "kimi-k25-rtx-pro-6000-x8"])
    assert result.exit_code == 2 and "mutually exclusive" in result.stderr


def test_several_problems_are_reported_together(tmp_path):
    text = MINIMAL.replace("tp_size = 8", "tp_size = 3\nport = 0\nhots = \"x\"")
    result = run_cli(["render", "--profile", str(write_profile(tmp_path, text))])
    assert result.exit_code == 2
    assert "sglang.port" in result.stderr and "sglang.hots: unknown key (did you mean host?)" in result.stderr


def test_debug_shows_the_traceback(tmp_path):
    profile = write_profile(tmp_path, MINIMAL.replace("tp_size = 8", "tp_size = 3"))
    from kimi_deploy.errors import ProfileError

    with pytest.raises(ProfileError):
        run_cli(["--debug", "render", "--profile", str(profile)])


def test_failed_render_leaves_previous_output_untouched(tmp_path):
    good = write_profile(tmp_path, MINIMAL, "good.toml")
    out = tmp_path / "out"
    assert run_cli(["render", "--profile", str(good), "--out", str(out)]).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    bad = write_profile(tmp_path, MINIMAL.replace("tp_size = 8", "tp_size = 5"), "bad.toml")
    assert run_cli(["render", "--profile", str(bad), "--out", str(out)]).exit_code == 2
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_render_that_cannot_replace_a_file_restores_the_others(tmp_path):
    """A rename failing half-way (a folder in the way) puts back what was already replaced."""
    good = write_profile(tmp_path, MINIMAL, "good.toml")
    out = tmp_path / "out"
    assert run_cli(["render", "--profile", str(good), "--out", str(out)]).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    blocker = out / "kimi-deploy-check@kimi-k25.timer"  # written last
    blocker.unlink()
    blocker.mkdir()
    (blocker / "keep").write_text("x")
    before.pop("kimi-deploy-check@kimi-k25.timer")
    changed = write_profile(tmp_path, MINIMAL.replace("tp_size = 8", "tp_size = 8\nport = 30001"), "changed.toml")
    result = run_cli(["render", "--profile", str(changed), "--out", str(out)])
    assert result.exit_code == 2 and "cannot replace" in result.stderr
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert after == before
    assert sorted(p.name for p in out.iterdir()) == sorted([*before, "kimi-deploy-check@kimi-k25.timer"])
