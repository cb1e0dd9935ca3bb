"""Container tier, group 1: a real systemd 252 starts the rendered server unit and the nightly check.

One boot (tests/systemd_container.py) laid out as a GPU host (tests/container_host.py); the operator
applies the patch series, installs the profile and runs ``kimi-deploy restart --wait``, then the
tests below run in file order against that one host (issue 17, scenarios 1, 2, 5 and 6):

1. the hardened unit (``hardening = "standard"``) starts and serves, sandboxed as the design record says,
   with the exposure it states (docs/design.md#the-server-unit-line-by-line);
2. the API key arrives only through the credential;
5. the nightly timer is listed and armed, runs its check unit itself (a missed run, ``Persistent=true``),
   the check unit writes the reports, and fails when the server is down;
6. ``uninstall --purge`` leaves no unit, credential, runtime file, state (the timer's last-run stamp
   too) or the system user and group install created behind.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from container_host import BOOTED, SGLANG_PYTHON, booted_host, documented_exposure, exposure, profile

pytestmark = [pytest.mark.container, pytest.mark.sglang]

NAME = "kimi-k25"
KEY_FILE = f"/etc/kimi-deploy/{NAME}.api-key"


@pytest.fixture(scope="module")
def host(tmp_path_factory, sglang_python, repo_root):
    """The booted host after `patch apply`, `install` and `restart --wait` (its result: ``host.restart``)."""
    with booted_host(tmp_path_factory.mktemp("serve"), sglang_python) as h:
        h.write("/root/kimi.toml", profile(name=NAME))
        h.sh(f"kimi-deploy patch apply --python {SGLANG_PYTHON}")
        h.sh("kimi-deploy install --profile /root/kimi.toml")
        h.restart = h.sh("kimi-deploy restart --wait --timeout 240", check=False, timeout=600)
        h.key = h.sh(f"cat {KEY_FILE}").stdout.strip()
        yield h


def test_restart_wait_starts_the_hardened_unit_and_it_serves(host, repo_root):
    assert host.restart.returncode == 0, host.restart.stdout + host.restart.stderr
    assert "new: ok: ready" in host.restart.stdout and "gate contract passed" in host.restart.stdout
    unit = host.unit(f"{NAME}.service", "ActiveState", "SubState", "MainPID", "NRestarts", "User")
    assert (unit["ActiveState"], unit["SubState"], unit["NRestarts"]) == ("active", "running", "0")
    pid = unit["MainPID"]
    # the sandbox is really applied to the running process, not just written in the unit
    status = host.sh(f"cat /proc/{pid}/status").stdout
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert host.sh(f"stat -c %U /proc/{pid}").stdout.strip() == "sglang"
    assert fields["NoNewPrivs"].strip() == "1"
    assert fields["Seccomp"].strip() == "2"  # SystemCallFilter= installed a filter
    assert int(fields["CapEff"], 16) == 0 and int(fields["CapBnd"], 16) == 0
    # ProtectSystem=strict: / is read-only for it; /var/cache/NAME is not
    probe = host.sh(f"nsenter -t {pid} -m -S 0 sh -c 'touch /usr/kimi-probe; touch /var/cache/{NAME}/kimi-probe'",
                    check=False)
    assert "Read-only file system" in probe.stderr and "/var/cache" not in probe.stderr
    status = host.sh("kimi-deploy status")
    assert "launch    matches the profile" in status.stdout and "patches   applied" in status.stdout


def test_running_unit_has_the_exposure_the_design_record_states(host, repo_root):
    out = host.sh(f"systemd-analyze security {NAME}.service --no-pager").stdout
    assert exposure(out) == documented_exposure(repo_root, "standard")


def test_key_arrives_only_through_the_credential(host):
    key = host.key
    assert len(key) >= 32
    url = "http://127.0.0.1:30000/v1/models"
    assert host.sh(f"curl -s -o /dev/null -w '%{{http_code}}' {url}").stdout == "401"
    wrong = host.sh(f"curl -s -o /dev/null -w '%{{http_code}}' -H 'Authorization: Bearer x{key}' {url}").stdout
    assert wrong == "401"
    ok = host.sh(f"curl -s -w '\\n%{{http_code}}' -H 'Authorization: Bearer {key}' {url}").stdout
    assert ok.endswith("\n200") and "moonshotai/Kimi-K2.5" in ok
    pid = host.unit(f"{NAME}.service", "MainPID")["MainPID"]
    for proc_file in ("cmdline", "environ"):
        text = host.sh(f"tr '\\0' ' ' < /proc/{pid}/{proc_file}").stdout
        assert key not in text, proc_file
        if proc_file == "cmdline":
            assert f"--config /run/{NAME}/sglang-secrets.yaml" in text
    # where the key is allowed: the 0600 YAML in the 0700 runtime directory, owned by the service user
    assert host.sh(f"stat -c '%a %U' /run/{NAME} /run/{NAME}/sglang-secrets.yaml").stdout.split("\n")[:2] == [
        "700 sglang", "600 sglang"]
    # every file written since the boot (its inode changed later than the marker: ctime, which no writer
    # sets back) anywhere but /proc and /sys, /dev/shm and the unit's private /tmp included; a file
    # older than the boot cannot hold a key install generated. As the service user in its own mount
    # namespace, the key is only in its credential ($CREDENTIALS_DIRECTORY) and the YAML in its runtime
    # directory; as root in the container's, also in the key file itself (root 0600) and nowhere else
    walk = (f"find / \\( -path /proc -o -path /sys \\) -prune -o -type f -cnewer {BOOTED} -print0 2>/dev/null"
            f" | xargs -0r grep -lsF -e '{key}'")
    as_service = host.sh(f"nsenter -t {pid} -m -S $(id -u sglang) -G $(id -g sglang) sh -c \"{walk}\"", check=False)
    assert sorted(as_service.stdout.split()) == [f"/run/credentials/{NAME}.service/api-key",
                                                 f"/run/{NAME}/sglang-secrets.yaml"], as_service.stdout
    as_root = host.sh(walk, check=False)
    assert sorted(as_root.stdout.split()) == [KEY_FILE, f"/run/credentials/{NAME}.service/api-key",
                                              f"/run/{NAME}/sglang-secrets.yaml"], as_root.stdout
    # the walk is not vacuous: it reads the files install, the unit and the journal wrote
    written = host.sh(f"find / \\( -path /proc -o -path /sys \\) -prune -o -type f -cnewer {BOOTED} -print").stdout
    assert {f"/etc/systemd/system/{NAME}.service", f"/etc/kimi-deploy/{NAME}.manifest.json"} <= set(written.split())
    assert "/run/log/journal/" in written
    # every field of every journal entry (_CMDLINE too, which `-o cat` would not show), of every unit
    journal = host.sh("journalctl --no-pager -o export").stdout
    assert "The server is fired up" in journal and f"_SYSTEMD_UNIT={NAME}.service" in journal
    assert "_CMDLINE=" in journal and key not in journal
    messages = host.sh("journalctl --no-pager -o cat").stdout
    assert "sglang-secrets.yaml" not in messages.replace(f"--config /run/{NAME}/sglang-secrets.yaml", "")
    info = host.sh(f"curl -s -H 'Authorization: Bearer {key}' http://127.0.0.1:30000/server_info").stdout
    assert "--api-key <redacted>" in info and key not in info  # the redact-api-key patch at work


def test_nightly_timer_is_listed_and_its_check_unit_reports(host, repo_root):
    timers = host.sh("systemctl list-timers --all --no-legend --no-pager 'kimi-deploy-check@*'").stdout
    assert f"kimi-deploy-check@{NAME}.timer" in timers and f"kimi-deploy-check@{NAME}.service" in timers
    host.sh(f"systemctl start kimi-deploy-check@{NAME}.service", timeout=600)
    unit = host.unit(f"kimi-deploy-check@{NAME}.service", "Result", "ExecMainStatus")
    assert unit == {"Result": "success", "ExecMainStatus": "0"}
    state = f"/var/lib/{NAME}"
    report = json.loads(host.sh(f"cat {state}/check-report.json").stdout)
    assert report["exit_code"] == 0 and report["schema"] == "kimi-deploy.check/1"
    ids = {c["id"] for c in report["checks"]}
    assert {"health.ready", "config.tool_call_parser", "contract.tool_auto.stream"} <= ids
    assert "<testsuite" in host.sh(f"cat {state}/check-report.xml").stdout
    assert f'kimi_deploy_check_exit_code{{service="{NAME}"}} 0' in host.sh(f"cat {state}/check.prom").stdout
    # its sandbox is the one docs/design.md#the-server-unit-line-by-line rates (systemd-analyze of the loaded unit, as it ran)
    analyzed = host.sh(f"systemd-analyze security kimi-deploy-check@{NAME}.service --no-pager").stdout
    assert exposure(analyzed) == documented_exposure(repo_root, None)
    # the reports belong to the service user (the unit runs as User=sglang)
    assert host.sh(f"stat -c %U {state}/check-report.json").stdout.strip() == "sglang"
    assert re.search(r"^check +exit 0 at ", host.sh("kimi-deploy status").stdout, re.M)  # status reads the report


def test_nightly_timer_itself_runs_the_check(host):
    """The timer, not the operator, starts the check: a nightly run missed while the host was off
    (``Persistent=true``: a last-run stamp older than the last 03:00) happens as soon as the timer starts.

    The container shares the host's clock, so 03:00 cannot be waited for; a runtime drop-in sets
    ``RandomizedDelaySec=0`` so the catch-up run is immediate instead of within 15 minutes.
    """
    timer, check = f"kimi-deploy-check@{NAME}.timer", f"kimi-deploy-check@{NAME}.service"
    armed = host.unit(timer, "ActiveState", "SubState", "Unit", "Persistent", "NextElapseUSecRealtime")
    assert (armed["ActiveState"], armed["SubState"], armed["Unit"], armed["Persistent"]) == (
        "active", "waiting", check, "yes")
    assert armed["NextElapseUSecRealtime"], armed  # 03:00 plus its randomized delay
    before = host.unit(check, "InvocationID")["InvocationID"]
    host.sh(f"rm /var/lib/{NAME}/check-report.json")
    dropin = f"/run/systemd/system/{timer}.d"
    host.sh(f"mkdir -p {dropin} && printf '[Timer]\\nRandomizedDelaySec=0\\n' > {dropin}/test-now.conf"
            f" && mkdir -p /var/lib/systemd/timers && touch -d '3 days ago' /var/lib/systemd/timers/stamp-{timer}"
            f" && systemctl daemon-reload && systemctl restart {timer}")
    try:
        deadline = time.monotonic() + 300
        while True:
            unit = host.unit(check, "InvocationID", "ActiveState", "Result", "ExecMainStatus")
            if unit["InvocationID"] not in ("", before) and unit["ActiveState"] in ("inactive", "failed"):
                break
            assert time.monotonic() < deadline, f"the timer did not run {check} within 300 s: {unit}"
            time.sleep(1)
    finally:
        host.sh(f"rm -r {dropin} && systemctl daemon-reload")
    assert (unit["Result"], unit["ExecMainStatus"]) == ("success", "0"), unit
    assert json.loads(host.sh(f"cat /var/lib/{NAME}/check-report.json").stdout)["exit_code"] == 0
    assert host.unit(timer, "LastTriggerUSec")["LastTriggerUSec"] not in ("", "n/a", "0")


def test_nightly_check_unit_fails_when_the_server_is_down(host):
    """With the server stopped the check unit fails (exit 3), so ``systemctl --failed`` and an operator's
    ``OnFailure=`` handler (docs/runbook.md#the-nightly-check; here a drop-in naming an alert unit) see it."""
    check = f"kimi-deploy-check@{NAME}.service"
    dropin = f"/etc/systemd/system/{check}.d"
    host.write("/etc/systemd/system/kimi-test-alert@.service",
               "[Service]\nType=oneshot\nExecStart=/bin/sh -c 'echo %i > /run/kimi-test-alert'\n")
    host.sh(f"mkdir -p {dropin} && printf '[Unit]\\nOnFailure=kimi-test-alert@%%N.service\\n' > {dropin}/alert.conf"
            " && systemctl daemon-reload")
    host.sh(f"systemctl stop {NAME}.service")
    try:
        r = host.sh(f"systemctl start {check}", timeout=600, check=False)
        deadline = time.monotonic() + 120  # OnFailure= starts the alert unit once the check unit failed
        while host.sh("test -s /run/kimi-test-alert", check=False).returncode != 0:
            assert time.monotonic() < deadline, "OnFailure= did not start the alert unit within 120 s"
            time.sleep(1)
        alerted = host.sh("cat /run/kimi-test-alert").stdout.strip()
    finally:  # an operator's own files: uninstall below must find only what kimi-deploy installed
        host.sh(f"rm -rf {dropin} /etc/systemd/system/kimi-test-alert@.service /run/kimi-test-alert"
                " && systemctl daemon-reload")
    assert r.returncode != 0
    assert alerted == check.removesuffix(".service")  # the alert unit named the check unit (%N)
    unit = host.unit(f"kimi-deploy-check@{NAME}.service", "Result", "ExecMainStatus", "ActiveState")
    assert unit == {"Result": "exit-code", "ExecMainStatus": "3", "ActiveState": "failed"}  # 3: unreachable
    assert f"kimi-deploy-check@{NAME}.service" in host.sh("systemctl --failed --no-legend --no-pager").stdout
    report = json.loads(host.sh(f"cat /var/lib/{NAME}/check-report.json").stdout)
    assert report["exit_code"] == 3
    assert f'kimi_deploy_check_exit_code{{service="{NAME}"}} 3' in host.sh(f"cat /var/lib/{NAME}/check.prom").stdout


def test_uninstall_purge_leaves_nothing_behind(host):
    host.sh(f"systemctl start {NAME}.service")  # uninstall stops a running server itself
    # systemd keeps the timer's last run here (the nightly runs above) and leaves it when the unit goes
    host.sh(f"test -f /var/lib/systemd/timers/stamp-kimi-deploy-check@{NAME}.timer")
    manifest = json.loads(host.sh(f"cat /etc/kimi-deploy/{NAME}.manifest.json").stdout)
    assert (manifest["users_created"], manifest["groups_created"]) == (["sglang"], ["sglang"])  # install made them
    purge = host.sh("kimi-deploy uninstall --purge")
    assert "remove the system user sglang" in purge.stdout and "remove the system group sglang" in purge.stdout
    files = host.sh("systemctl list-unit-files --no-legend --no-pager 'kimi*'", check=False).stdout
    assert files.strip() == "", files
    # no unit of the kit stays loaded: systemd drops an unreferenced "not-found inactive dead" unit at its
    # next garbage collection, which on a loaded machine can come a moment after daemon-reload returned
    # (seen once at load 6: kimi-k25.service listed right after purge); one that stays loaded for a minute is
    # held by a reference, and the assertion names who holds it
    deadline = time.monotonic() + 60
    while (units := host.sh("systemctl list-units --all --no-legend --no-pager 'kimi*'").stdout.strip()):
        if time.monotonic() > deadline:
            held = [u.lstrip("● ").split()[0] for u in units.splitlines()]
            why = host.sh("for u in " + " ".join(held) + "; do systemctl show \"$u\" -p Id -p LoadState -p ActiveState"
                          " -p RequiredBy -p WantedBy -p TriggeredBy -p BoundBy -p Job --no-pager;"
                          " systemctl list-dependencies --reverse --all --no-pager \"$u\"; done", check=False)
            raise AssertionError(f"still loaded a minute after purge:\n{units}\n{why.stdout}{why.stderr}")
        time.sleep(1)
    left = host.sh(f"ls -d /etc/systemd/system/*{NAME}* /etc/systemd/system/*/*{NAME}* /etc/kimi-deploy/{NAME}.* "
                   f"/etc/kimi-deploy/backup/{NAME} {KEY_FILE} /run/{NAME} /var/lib/{NAME} /var/cache/{NAME} "
                   f"/run/credentials/{NAME}.service /var/lib/systemd/timers/stamp-kimi-deploy-check@{NAME}.timer "
                   "2>/dev/null", check=False).stdout
    assert left == "", left
    # in /etc/kimi-deploy no file is left but the service's lock file (the backup folder, shared by every
    # service, stays, empty)
    assert set(host.sh("find /etc/kimi-deploy -mindepth 1 ! -type d").stdout.split()) <= {
        f"/etc/kimi-deploy/.{NAME}.lock", "/etc/kimi-deploy/.shared@kimi-deploy.lock"}  # the locks' last pids
    assert host.sh("ss -Hltn 'sport = :30000'").stdout.strip() == ""
    assert host.sh("pgrep -u sglang", check=False).stdout == ""
    # the system user and group install created are gone too (getent: 2 = no such entry)
    assert host.sh("getent passwd sglang", check=False).returncode == 2
    assert host.sh("getent group sglang", check=False).returncode == 2
    assert host.sh("getent passwd root").returncode == 0
