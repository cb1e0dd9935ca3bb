"""Container tier, group 2: patch drift, a new profile, and a rollback, under a real systemd 252.

One boot laid out as a GPU host (tests/container_host.py); the tests run in file order against it
(issue 17, scenarios 3, 4 and 1 for ``hardening = "strict"``):

3. a drifted SGLang (one patched file back to its released bytes, as ``pip install --force-reinstall``
   leaves it) makes the unit's ``ExecStartPre=... patch verify`` fail the start with the kit's
   message in the journal; ``kimi-deploy patch apply`` and a restart bring it up;
4. ``kimi-deploy restart --wait`` with a new profile (strict hardening) that serves, then
   ``--rollback-on-failure`` with one that does not (a model path that does not exist): the previous
   files come back byte for byte and the previous server answers again;
5. (issue 25) ``--rollback-on-failure`` with a version that serves, healthy, with both parsers, behind a proxy
   that sanitises every returned tool-call id: the default contract gate fails it at the contract tier, names
   the checks, and the restored version passes the same gate, with no operator action.
"""

from __future__ import annotations

import json
import re

import pytest

from container_host import SGLANG_PYTHON, booted_host, documented_exposure, exposure, profile

pytestmark = [pytest.mark.container, pytest.mark.sglang]

NAME = "kimi-k25"
SITE = "/opt/sglang/.venv/lib/python3.11/site-packages"
DRIFTED = "sglang/srt/function_call/kimik2_detector.py"  # patched by kimi-k2-tool-call-ids
#: RestartSec= of the profiles that serve: the default 30 s, so a failed start is not retried while the
#: operator reads the journal (the restart loop is stopped right after the failure).
SERVING = 'restart_sec = 30'


@pytest.fixture(scope="module")
def host(tmp_path_factory, sglang_python):
    """The booted host with the series applied and the standard profile installed (not started)."""
    with booted_host(tmp_path_factory.mktemp("lifecycle"), sglang_python) as h:
        site = h.sh(f"{SGLANG_PYTHON} -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'").stdout.strip()
        assert site == SITE
        h.sh(f"mkdir -p /root/released && cp {SITE}/{DRIFTED} /root/released/")
        h.write("/root/kimi.toml", profile(name=NAME).replace("restart_sec = 5", SERVING))
        h.sh(f"kimi-deploy patch apply --python {SGLANG_PYTHON}")
        h.sh("kimi-deploy install --profile /root/kimi.toml")
        yield h


def _key(host) -> str:
    return host.sh(f"cat /etc/kimi-deploy/{NAME}.api-key").stdout.strip()


def _answers(host) -> bool:
    code = host.sh(f"curl -s -o /dev/null -w '%{{http_code}}' -H 'Authorization: Bearer {_key(host)}' "
                   "http://127.0.0.1:30000/v1/models", check=False).stdout
    return code == "200"


def test_drifted_sglang_fails_the_start_with_the_kits_message(host):
    host.sh(f"cp /root/released/{DRIFTED.rsplit('/', 1)[1]} {SITE}/{DRIFTED}")  # what a reinstall leaves
    r = host.sh(f"systemctl start {NAME}.service", check=False, timeout=300)
    assert r.returncode != 0
    host.sh(f"systemctl stop {NAME}.service")  # the operator stops the restart loop while fixing it
    journal = host.sh(f"journalctl -u {NAME}.service --no-pager -o cat").stdout
    assert "kimi-k2-tool-call-ids" in journal and "drifted" in journal, journal[-3000:]
    assert "kimi-deploy patch apply" in journal  # the fix, as the kit words it
    assert "fired up" not in journal  # SGLang itself never ran
    unit = host.unit(f"{NAME}.service", "ExecMainPID", "Result")
    assert unit["ExecMainPID"] == "0", unit  # ExecStart= was never reached


def test_patch_apply_then_restart_serves(host):
    host.sh(f"kimi-deploy patch apply --python {SGLANG_PYTHON}")
    r = host.sh("kimi-deploy restart --wait --timeout 240", check=False, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _answers(host)
    assert "ok: SGLang 0.5.23 carries" in host.sh(f"journalctl -u {NAME}.service --no-pager -o cat").stdout


def test_restart_wait_with_a_new_strict_profile_serves(host, repo_root):
    host.write("/root/kimi.toml", profile(name=NAME, hardening="strict").replace("restart_sec = 5", SERVING))
    host.sh("kimi-deploy install --profile /root/kimi.toml")
    r = host.sh("kimi-deploy restart --wait --timeout 240", check=False, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "DevicePolicy=closed" in host.sh(f"systemctl cat {NAME}.service").stdout
    assert host.unit(f"{NAME}.service", "DevicePolicy")["DevicePolicy"] == "closed"
    out = host.sh(f"systemd-analyze security {NAME}.service --no-pager").stdout
    assert exposure(out) == documented_exposure(repo_root, "strict")
    assert _answers(host)


MANIFEST = f"/etc/kimi-deploy/{NAME}.manifest.json"


def _manifest_files(host) -> list[str]:
    """The host paths the installed manifest lists, and the manifest itself."""
    return [*json.loads(host.sh(f"cat {MANIFEST}").stdout)["files"], MANIFEST]


def _installed(host, paths: list[str]) -> dict[str, str]:
    """Path -> sha256 (``"absent"`` when there is none) of each of ``paths``, and of every file in
    /etc/systemd/system and /etc/kimi-deploy that names the service (so one the manifest does not list is
    seen too)."""
    listing = host.sh(f"find /etc/systemd/system /etc/kimi-deploy -name '*{NAME}*' ! -name '.{NAME}.lock' "
                      "! -path '*/backup/*' -type f").stdout.split()
    digests = {}
    for path in sorted({*paths, *listing}):
        r = host.sh(f"sha256sum {path}", check=False)
        digests[path] = r.stdout.split()[0] if r.returncode == 0 else "absent"
    return digests


def test_rollback_on_failure_restores_the_files_byte_for_byte_and_the_old_server(host):
    old_files = _manifest_files(host)
    before = _installed(host, old_files)
    old_pid = host.unit(f"{NAME}.service", "MainPID")["MainPID"]
    host.write("/root/broken.toml", profile(name=NAME, hardening="strict", model_path="/models/not-there"))
    host.sh("kimi-deploy install --profile /root/broken.toml")
    files = sorted({*old_files, *_manifest_files(host)})
    changed = _installed(host, files)
    assert changed != before and any(before.get(p) != changed[p] for p in old_files), changed
    r = host.sh("kimi-deploy restart --wait --rollback-on-failure --timeout 240", check=False, timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr  # the new version's status: its unit failed
    assert re.search(r"^new: FAILED", r.stdout, re.M) and re.search(r"^rollback: ok", r.stdout, re.M), r.stdout
    assert _installed(host, files) == before
    assert host.sh(f"ls -d /etc/kimi-deploy/backup/{NAME}/*.rolled-back").stdout.strip()
    unit = host.unit(f"{NAME}.service", "ActiveState", "MainPID")
    assert unit["ActiveState"] == "active" and unit["MainPID"] != old_pid
    # the old server, not just any: the previous profile's model path and strict sandbox
    cmdline = host.sh(f"tr '\\0' ' ' < /proc/{unit['MainPID']}/cmdline").stdout
    assert "--model-path /models/Kimi-K2.5 " in cmdline and "not-there" not in cmdline, cmdline
    assert host.unit(f"{NAME}.service", "DevicePolicy")["DevicePolicy"] == "closed"
    assert _answers(host)
    journal = host.sh(f"journalctl -u {NAME}.service --no-pager -o cat").stdout
    # SGLang's own argument handling refused the path (it is neither a folder nor a hub repo id)
    assert "OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '/models/not-there'" in journal
    status = host.sh("kimi-deploy status", check=False)
    assert status.returncode == 0, status.stdout


def test_broken_tool_calls_are_rolled_back_by_the_contract_gate(host):
    before = _installed(host, _manifest_files(host))
    text = profile(name=NAME, hardening="strict").replace("restart_sec = 5", SERVING)
    text = text.replace("[environment]\n", '[environment]\nKIMI_REPLAY_SANITISE_IDS = "1"\n')
    host.write("/root/sanitising.toml", text)
    host.sh("kimi-deploy install --profile /root/sanitising.toml")
    r = host.sh("kimi-deploy restart --wait --rollback-on-failure --timeout 240 --json", check=False, timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    data = json.loads(r.stdout)
    assert data["failed_tier"] == "contract" and data["rolled_back"], data["attempts"][0]["summary"]
    assert {"contract.tool_auto.nonstream", "contract.tool_auto.stream"} <= set(data["failed_checks"])
    new, back = data["attempts"]
    assert [t["ok"] for t in new["gate"]["tiers"]] == [True, True, True, False]
    assert back["ok"] and back["gate"]["gate"] == "contract" and back["gate"]["ok"]
    assert _installed(host, _manifest_files(host)) == before
    pid = host.unit(f"{NAME}.service", "MainPID")["MainPID"]
    environ = host.sh(f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout
    assert "KIMI_REPLAY_SANITISE_IDS" not in environ  # the restored server, without the proxy
    assert _answers(host)
