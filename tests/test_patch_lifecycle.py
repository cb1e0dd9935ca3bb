"""`kimi-deploy patch` against throwaway copies of real SGLang 0.5.23: apply, status, verify, revert, drift,
all-or-nothing, version refusal. Every test builds its own pristine copy (tests/patch_helpers.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kimi_deploy import patching
from kimi_deploy.cli import cli
from kimi_deploy.errors import ExitCode, KimiDeployError
from patch_helpers import make_target, site_packages_of, tree_hashes

pytestmark = pytest.mark.sglang

DEFAULTS = ["kimi-k2-tool-call-ids", "kimi-k2-canonical-history-ids", "redact-api-key"]
SERVING_CHAT = "sglang/srt/entrypoints/openai/serving_chat.py"
DETECTOR = "sglang/srt/function_call/kimik2_detector.py"


@pytest.fixture
def target(sglang_python, tmp_path, monkeypatch):
    """(python, site-packages) of a fresh pristine SGLang copy; state dir in tmp via the env var."""
    monkeypatch.setenv("KIMI_DEPLOY_STATE_DIR", str(tmp_path / "state"))
    python = make_target(sglang_python, tmp_path / "venv")
    return python, site_packages_of(python)


def invoke(cli_runner, *args):
    return cli_runner.invoke(cli, ["patch", *args], catch_exceptions=False)


def test_list_shows_the_series(cli_runner):
    result = invoke(cli_runner, "list", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [p["id"] for p in data["patches"]] == [
        "kimi-k2-tool-call-ids", "kimi-k2-canonical-history-ids", "sm120-flashinfer-allreduce-fusion",
        "sm120-torch-symm-mem", "redact-api-key"]
    assert [p["id"] for p in data["patches"] if p["default"]] == DEFAULTS
    for p in data["patches"]:
        assert p["upstream"] and p["risk"] and p["files"]


def test_apply_status_reapply_verify_revert(target, cli_runner):
    python, site = target
    before = tree_hashes(site / "sglang")
    # stale bytecode of a file the series changes, and of one it does not
    cache = site / "sglang/srt/function_call/__pycache__"
    cache.mkdir()
    (cache / "kimik2_detector.cpython-311.pyc").write_bytes(b"stale")
    (cache / "utils.cpython-311.pyc").write_bytes(b"keep")

    assert patching.status(python).state == "not_applied"
    result = invoke(cli_runner, "verify", "--python", python)
    assert result.exit_code == ExitCode.FAILED
    assert "not applied" in result.stderr

    result = invoke(cli_runner, "apply", "--python", python, "--json")
    assert result.exit_code == 0, result.output
    applied = json.loads(result.stdout)
    assert applied["changed"] and applied["patches"] == DEFAULTS
    after = tree_hashes(site / "sglang")
    changed = sorted(k for k in before if before[k] != after[k])
    assert ["sglang/" + c for c in changed] == sorted(applied["files"])
    assert len(changed) == 4
    assert not (cache / "kimik2_detector.cpython-311.pyc").exists()
    assert (cache / "utils.cpython-311.pyc").exists()

    st = patching.status(python)
    assert st.state == "applied" and st.selected == DEFAULTS
    assert st.to_dict()["patches"][0]["files"][0]["state"] == "patched"
    record = json.loads(Path(st.state_file).read_text())
    assert [p["id"] for p in record["patches"]] == DEFAULTS
    assert record["sglang_version"] == "0.5.23" and record["kit_version"] and record["applied_at"]
    assert record["files"][SERVING_CHAT]["before"] == before[SERVING_CHAT.removeprefix("sglang/")]
    assert record["files"][SERVING_CHAT]["after"] == after[SERVING_CHAT.removeprefix("sglang/")]

    again = invoke(cli_runner, "apply", "--python", python)
    assert again.exit_code == 0 and "already applied" in again.stdout
    assert tree_hashes(site / "sglang") == after

    # what the unit's ExecStartPre= runs: --python only, state found through the environment
    ok = invoke(cli_runner, "verify", "--python", python)
    assert ok.exit_code == 0, ok.output

    result = invoke(cli_runner, "revert", "--python", python)
    assert result.exit_code == 0, result.output
    assert tree_hashes(site / "sglang") == before
    assert not Path(st.state_file).exists()
    # issue 13 item 10: the output named the record it had just deleted as if it were still there
    assert "record deleted" in result.output and st.state_file not in result.output
    assert patching.status(python).state == "not_applied"


def test_drift_after_editing_a_patched_file(target, cli_runner, sglang_python):
    python, site = target
    patching.apply(python)
    detector = site / DETECTOR
    detector.write_text(detector.read_text() + "\n# edited by hand\n")
    st = patching.status(python)
    assert st.state == "drifted"
    assert {p.id: p.state for p in st.patches}["kimi-k2-tool-call-ids"] == "drifted"
    result = invoke(cli_runner, "verify", "--python", python)
    assert result.exit_code == ExitCode.FAILED and "drifted" in result.stderr
    assert invoke(cli_runner, "apply", "--python", python).exit_code == ExitCode.REFUSED
    assert invoke(cli_runner, "revert", "--python", python).exit_code == ExitCode.REFUSED

    # a reinstall of the same release puts the original bytes back: still drift for verify ...
    shutil.copyfile(site_packages_of(sglang_python) / DETECTOR, detector)
    assert patching.status(python).state == "drifted"
    with pytest.raises(KimiDeployError):
        patching.verify(python)
    # ... and apply patches it again
    assert patching.apply(python).changed
    assert patching.verify(python).state == "applied"


def test_all_or_nothing_when_one_patch_cannot_apply(target, cli_runner):
    python, site = target
    chat = site / SERVING_CHAT
    text = chat.read_text()
    # a local edit inside the context of kimi-k2-canonical-history-ids (the second patch)
    anchor = "            )\n\n        prompt_ids = self._encode_messages("
    assert text.count(anchor) == 1
    chat.write_text(text.replace(anchor, anchor.replace("\n\n", "\n        # local edit\n")))
    before = tree_hashes(site / "sglang")
    result = invoke(cli_runner, "apply", "--python", python)
    assert result.exit_code == ExitCode.REFUSED
    assert "kimi-k2-canonical-history-ids does not apply" in result.stderr
    assert tree_hashes(site / "sglang") == before  # kimi-k2-tool-call-ids was not left behind
    st = patching.status(python)
    assert st.state == "not_applied" and not Path(st.state_file).exists()
    assert {p.id: p.detail for p in st.patches}["kimi-k2-canonical-history-ids"] == \
        "does not apply to the installed files"


def test_selection_with_and_only(target):
    python, site = target
    pristine = tree_hashes(site / "sglang")
    result = patching.apply(python, with_=["sm120-torch-symm-mem"])
    assert "sglang/srt/distributed/device_communicators/torch_symm_mem.py" in result.files
    assert patching.verify(python).selected == DEFAULTS[:2] + ["sm120-torch-symm-mem", "redact-api-key"]
    # back to the defaults: the symm-mem files return to their original bytes
    patching.apply(python)
    now = tree_hashes(site / "sglang")
    assert now["srt/distributed/device_communicators/torch_symm_mem.py"] == \
        pristine["srt/distributed/device_communicators/torch_symm_mem.py"]
    assert patching.status(python, only=["sm120-torch-symm-mem"]).state == "not_applied"
    assert patching.verify(python).state == "applied"
    patching.apply(python, only=["redact-api-key"])
    assert patching.status(python).selected == ["redact-api-key"]
    assert patching.status(python, only=DEFAULTS).state == "partial"
    with pytest.raises(KimiDeployError, match="no patch 'redact-apikey'") as exc:
        patching.apply(python, only=["redact-apikey"])
    assert "redact-api-key" in exc.value.hint


def test_refuses_another_version(target, cli_runner):
    python, site = target
    info = site / "sglang-0.5.23.dist-info"
    meta = info / "METADATA"
    meta.write_text(meta.read_text().replace("Version: 0.5.23", "Version: 0.5.99", 1))
    info.rename(site / "sglang-0.5.99.dist-info")
    before = tree_hashes(site / "sglang")
    result = invoke(cli_runner, "apply", "--python", python)
    assert result.exit_code == ExitCode.USAGE
    assert "no patch series for SGLang 0.5.99" in result.stderr and "0.5.23" in result.stderr
    assert tree_hashes(site / "sglang") == before
    assert patching.status(python).state == "no_series"
    assert invoke(cli_runner, "verify", "--python", python).exit_code == ExitCode.FAILED


def test_verify_and_apply_give_the_same_working_fix_on_drift(target, cli_runner, sglang_python):
    """verify's fix after drift is the real sequence: pip's reinstall of the same release, then the
    apply line for the recorded set; apply's refusal names the same reinstall command."""
    python, site = target
    patching.apply(python, with_=["sm120-torch-symm-mem"])
    detector = site / DETECTOR
    detector.write_text(detector.read_text() + "\n# edited by hand\n")
    reinstall = f"{python} -m pip install --force-reinstall --no-deps sglang==0.5.23"
    apply_line = f"kimi-deploy patch apply --python {python} --with sm120-torch-symm-mem"

    verify = invoke(cli_runner, "verify", "--python", python)
    assert verify.exit_code == ExitCode.FAILED
    assert f"fix: reinstall the same SGLang release (`{reinstall}`), then `{apply_line}`, then restart" in verify.stderr
    status = invoke(cli_runner, "status", "--python", python)
    assert f"fix: reinstall the same SGLang release (`{reinstall}`), then `{apply_line}`" in status.stderr
    refused = invoke(cli_runner, *apply_line.split()[2:])            # apply before the reinstall: refused ...
    assert refused.exit_code == ExitCode.REFUSED and f"(`{reinstall}`)" in refused.stderr

    # ... the reinstall (pip cannot reach an index here: the same bytes, copied from the test environment)
    shutil.copyfile(site_packages_of(sglang_python) / DETECTOR, detector)
    st = patching.status(python)
    assert st.state == "drifted" and st.fix == f"`{apply_line}`"      # originals back: apply alone now
    done = invoke(cli_runner, *apply_line.split()[2:])
    assert done.exit_code == 0, done.output
    assert invoke(cli_runner, "verify", "--python", python).exit_code == 0
    assert patching.verify(python).selected == DEFAULTS[:2] + ["sm120-torch-symm-mem", "redact-api-key"]


def test_not_applied_fix_is_the_apply_command(target, cli_runner):
    python, _ = target
    verify = invoke(cli_runner, "verify", "--python", python)
    assert verify.exit_code == ExitCode.FAILED
    assert f"fix: `kimi-deploy patch apply --python {python}`, then restart the service" in verify.stderr
    assert patching.apply_command(python, ["a", "c"], ["a", "b"]) == f"kimi-deploy patch apply --python {python} --only a,c"


def test_the_fix_repeats_a_state_dir_given(target, tmp_path):
    # a trial ran `patch status --state-dir DIR` and was told `kimi-deploy patch apply --python P`, which reads the
    # default record: the fix must name the same state directory
    python, _ = target
    state = tmp_path / "my-state"
    given = patching.status(python, state_dir=state)
    assert given.state == "not_applied" and f" --state-dir {state}" in given.fix
    assert "--state-dir" not in patching.status(python).fix
