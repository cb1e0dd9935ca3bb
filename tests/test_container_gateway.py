"""Container tier, group 3: the gateway unit starts in front of two replicas under a real systemd 252.

Issue 17, scenario 7. One boot (tests/systemd_container.py) laid out as docs/runbook.md (its install step and
"Replicas behind a gateway") sets a host up (tests/container_host.py), with the real pinned gateway (smg 1.13.0, ``KIMI_DEPLOY_SMG``) at
``/opt/smg/.venv``. The operator follows that runbook: one API key file, ``validate --gateway``, each
host's part installed with ``kimi-deploy install``, the replicas started with ``restart --wait``, the
gateway unit with ``systemctl start``.

One container is one systemd, so it holds every host's part, and the fleet model does not let one
profile put two replicas there: every node of ``fleet.toml`` installs the same server unit
(``<name>.service``, its env file, its profile copy), so ``install --host 127.0.0.3`` would replace what
``--host 127.0.0.2`` installed, and ``[sglang] host`` must be ``0.0.0.0`` (or the one node), so both
would listen on the same port. What the model allows is what a node of a single-node replica installs
anyway, "exactly what one host gets without [fleet]" (kimi_deploy.targets.systemd.host_files): each replica is its own
one-host profile (``kimi-r0`` on 127.0.0.2, ``kimi-r1`` on 127.0.0.3, the fleet's ``[sglang]`` and key
otherwise), and the gateway host's part comes from the fleet profile itself (``install --host
127.0.0.1``), whose ``[[fleet.replicas]]`` are those two loopback addresses. Two loopback addresses
and one port are the fleet's own shape: worker URLs ``http://{node}:{[sglang] port}``.

The tests run in file order against that host:

- the gateway unit is active, sandboxed (a dynamic user, no capabilities), the key not in its argv;
- a chat completion through it answers 200 with the key and 401 without;
- ``/workers`` lists both replicas, ready and healthy;
- the gateway host's nightly check unit runs ``check --each-worker`` against both;
- ``kimi-deploy status`` on the gateway host reports the gateway unit, that check and the gateway's view;
- ``systemd-analyze security`` of the running gateway unit is the exposure docs/design.md#the-gateway-unit states;
- with one replica unit stopped, chat completions through the gateway still answer 200 (smg retried
  the ones it sent there).
"""

from __future__ import annotations

import json
import re
import time

import pytest

from container_host import SGLANG_PYTHON, SMG, booted_host, exposure, profile, skip_or_fail

pytestmark = [pytest.mark.container, pytest.mark.sglang]

NAME = "kimi-k25"
GATEWAY_UNIT = f"{NAME}-gateway.service"
KEY_FILE = f"/etc/kimi-deploy/{NAME}.api-key"
#: Replica service name -> its node (one loopback address each; the container's `lo` answers all of 127/8).
REPLICAS = {"kimi-r0": "127.0.0.2", "kimi-r1": "127.0.0.3"}
PORT = 30000  # [sglang] port of every replica, as in production
GATEWAY_HOST = "127.0.0.1"
GATEWAY_PORT = 31000  # not 30000: a probe of 127.0.0.1:30000 must never reach the gateway by accident
GATEWAY = f"http://{GATEWAY_HOST}:{GATEWAY_PORT}"


def fleet_profile() -> str:
    """The fleet's profile (docs/runbook.md#replicas-behind-a-gateway): the replicas' [sglang] on every address, the gateway on loopback.

    ``round_robin``: every replica gets requests, so a stopped one is really sent traffic (the default
    ``cache_aware`` may send a short prompt to one worker only)."""
    replicas = "".join(f'[[fleet.replicas]]\nnodes = ["{node}"]\n' for node in REPLICAS.values())
    return profile(name=NAME, host="0.0.0.0", port=PORT) + f"""
[fleet]
{replicas}
[gateway]
host = "{GATEWAY_HOST}"
bind = "{GATEWAY_HOST}"
port = {GATEWAY_PORT}
policy = "round_robin"
smg = "{SMG}"
"""


def _workers(host, key: str) -> list[dict]:
    r = host.sh(f"curl -s -H 'Authorization: Bearer {key}' {GATEWAY}/workers", check=False)
    try:
        return json.loads(r.stdout)["workers"]
    except (ValueError, KeyError, TypeError):
        return []


def _until(done, what: str, timeout: float = 240.0):
    """Poll ``done()`` until truthy; fail after ``timeout`` s (only turns a hang into a failure)."""
    deadline = time.monotonic() + timeout
    while not (value := done()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(1)
    return value


@pytest.fixture(scope="module")
def smg(request) -> str:
    """The pinned smg (conftest's ``smg_path``); missing, the group is skipped, or fails with
    ``$KIMI_DEPLOY_REQUIRE_CONTAINERS=1`` (:func:`container_host.skip_or_fail`) like a container that cannot boot."""
    try:
        return request.getfixturevalue("smg_path")
    except pytest.skip.Exception as exc:
        skip_or_fail(str(exc))


@pytest.fixture(scope="module")
def host(tmp_path_factory, sglang_python, smg):
    """The booted host: the key, the series applied, both replicas installed and started (``restart --wait``),
    the gateway validated, installed and started, and listing both workers ready. Results on ``host``:
    ``validate`` and ``installs`` (name -> CompletedProcess), ``restarts`` (name -> CompletedProcess)."""
    with booted_host(tmp_path_factory.mktemp("gateway"), sglang_python, smg=smg) as h:
        # runbook step 2: one key, created once (root, 0600), at api_key_file on every host
        h.sh(f"mkdir -p /etc/kimi-deploy && umask 077 && python3 -c 'import secrets; print(secrets.token_hex(32))'"
             f" > {KEY_FILE}")
        h.key = h.sh(f"cat {KEY_FILE}").stdout.strip()
        h.write("/root/fleet.toml", fleet_profile())
        for name, node in REPLICAS.items():
            h.write(f"/root/{name}.toml", profile(name=name, host=node, port=PORT, api_key_file=KEY_FILE))
        h.validate = h.sh("kimi-deploy validate --profile /root/fleet.toml --gateway", check=False)
        h.sh(f"kimi-deploy patch apply --python {SGLANG_PYTHON}")
        h.installs = {name: h.sh(f"kimi-deploy install --profile /root/{name}.toml", check=False)
                      for name in REPLICAS}
        # both replicas start at once (each start imports SGLang); each restart --wait has its own log
        h.sh(" & ".join(f"(kimi-deploy restart --wait --name {name} --timeout 240 > /root/{name}.restart 2>&1;"
                        f" echo $? >> /root/{name}.restart)" for name in REPLICAS) + " & wait", timeout=600)
        h.restarts = {name: h.sh(f"cat /root/{name}.restart").stdout for name in REPLICAS}
        h.installs["gateway"] = h.sh(f"kimi-deploy install --profile /root/fleet.toml --host {GATEWAY_HOST}",
                                     check=False)
        if h.installs["gateway"].returncode == 0:
            h.sh(f"systemctl start {GATEWAY_UNIT}")
            _until(lambda: len([w for w in _workers(h, h.key) if w.get("status") == "ready"]) == 2,
                   "the gateway to list both replicas ready")
        yield h


def test_each_hosts_part_installs_and_the_replicas_serve(host):
    assert host.validate.returncode == 0, host.validate.stdout + host.validate.stderr  # the pinned smg's flags
    for name, r in host.installs.items():
        assert r.returncode == 0, f"{name}: {r.stdout}{r.stderr}"
    for name, log in host.restarts.items():
        assert log.rstrip().endswith("\n0") and "gate contract passed" in log, f"{name}: {log}"
    # the gateway host got the gateway unit and its --each-worker check, and no server unit of the fleet's name
    files = host.sh(f"ls /etc/systemd/system/ | grep {NAME}", check=False).stdout.split()
    assert GATEWAY_UNIT in files and f"{NAME}.service" not in files, files
    assert f"kimi-deploy-check@{NAME}-gateway.timer" in host.sh(
        "systemctl list-timers --all --no-legend --no-pager 'kimi-deploy-check@*'").stdout


def test_the_gateway_unit_is_active_and_sandboxed(host):
    unit = host.unit(GATEWAY_UNIT, "ActiveState", "SubState", "MainPID", "NRestarts", "DynamicUser")
    assert (unit["ActiveState"], unit["SubState"], unit["NRestarts"], unit["DynamicUser"]) == (
        "active", "running", "0", "yes"), unit
    pid = unit["MainPID"]
    status = host.sh(f"cat /proc/{pid}/status").stdout
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert fields["Uid"].split()[0] != "0" and fields["NoNewPrivs"].strip() == "1"
    assert fields["Seccomp"].strip() == "2" and int(fields["CapEff"], 16) == 0
    cmdline = host.sh(f"tr '\\0' ' ' < /proc/{pid}/cmdline").stdout
    assert host.key not in cmdline and host.key not in host.sh(f"tr '\\0' ' ' < /proc/{pid}/environ").stdout
    # every field of every journal entry (_CMDLINE too, which `-o cat` would not show)
    journal = host.sh("journalctl --no-pager -o export").stdout
    assert f"_SYSTEMD_UNIT={GATEWAY_UNIT}" in journal and "_CMDLINE=" in journal and host.key not in journal


def _chat(host, key: str | None, prompt: str = "hi") -> str:
    auth = f"-H 'Authorization: Bearer {key}' " if key else ""
    body = json.dumps({"model": "moonshotai/Kimi-K2.5", "max_tokens": 8,
                       "messages": [{"role": "user", "content": prompt}]})
    return host.sh(f"curl -s -o /dev/null -w '%{{http_code}}' -H 'Content-Type: application/json' {auth}"
                   f"--data '{body}' {GATEWAY}/v1/chat/completions", check=False, timeout=120).stdout


def test_a_chat_through_the_gateway_needs_the_key(host):
    assert _chat(host, host.key) == "200"
    assert _chat(host, None) == "401"
    assert _chat(host, "x" + host.key) == "401"


def test_the_gateway_lists_both_replicas_healthy(host):
    workers = _workers(host, host.key)
    assert sorted(w["url"] for w in workers) == [f"http://{node}:{PORT}" for node in REPLICAS.values()]
    assert all(w["status"] == "ready" and w["is_healthy"] for w in workers), workers
    assert host.sh(f"curl -s -o /dev/null -w '%{{http_code}}' {GATEWAY}/workers").stdout == "401"


def test_the_gateway_hosts_nightly_check_runs_every_worker(host):
    """The gateway host's ``kimi-deploy-check@<name>-gateway`` unit (DynamicUser, the key by credential) runs
    ``check --each-worker``: every worker the gateway lists, one report each, in its state folder."""
    check = f"kimi-deploy-check@{NAME}-gateway.service"
    host.sh(f"systemctl start {check}", timeout=600)
    assert host.unit(check, "Result", "ExecMainStatus") == {"Result": "success", "ExecMainStatus": "0"}
    report = json.loads(host.sh(f"cat /var/lib/{NAME}-gateway/check-workers.json").stdout)
    assert report["exit_code"] == 0
    assert sorted(w["url"] for w in report["workers"]) == [f"http://{node}:{PORT}" for node in REPLICAS.values()]
    assert all(w["exit_code"] == 0 and w["checks"] > 0 for w in report["workers"]), report["workers"]


def test_status_shows_the_gateways_view(host):
    """On the gateway host ``status`` reports the gateway unit (no SGLang there) and the gateway's view."""
    r = host.sh(f"kimi-deploy status --name {NAME}", check=False)
    assert re.search(rf"^service   {GATEWAY_UNIT}: active/running, enabled: enabled", r.stdout, re.M), r.stdout
    assert re.search(rf"^check     exit 0 at .*kimi-deploy-check@{NAME}-gateway.timer$", r.stdout, re.M), r.stdout
    assert f"gateway   {GATEWAY}: 2 worker(s)" in r.stdout, r.stdout + r.stderr
    for node in REPLICAS.values():
        assert re.search(rf"^ +http://{re.escape(node)}:{PORT}: ready, healthy, \d+ in flight$", r.stdout, re.M), r.stdout
    assert r.returncode == 0, r.stdout + r.stderr
    view = json.loads(host.sh(f"kimi-deploy status --name {NAME} --json", check=False).stdout)["gateway"]
    assert view["error"] is None and view["problems"] == [] and len(view["workers"]) == 2


def documented_gateway_exposure(repo_root) -> str:
    """The gateway unit's exposure docs/design.md#the-gateway-unit states."""
    text = (repo_root / "docs" / "design.md").read_text()
    m = re.search(r"`systemd-analyze security[^`]*` \(systemd 252\): \*\*(\d+\.\d)\*\*", text)
    assert m, "docs/design.md states no exposure for the gateway unit"
    return m.group(1)


def test_running_gateway_unit_has_the_exposure_the_design_record_states(host, repo_root):
    out = host.sh(f"systemd-analyze security {GATEWAY_UNIT} --no-pager").stdout
    assert exposure(out) == documented_gateway_exposure(repo_root)


def _metric(host, name: str) -> float:
    """Sum of ``name`` over its labels on smg's metrics endpoint (``[gateway] prometheus_port``, loopback)."""
    text = host.sh("curl -s http://127.0.0.1:29000/metrics").stdout
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, flags=re.M))


def test_with_one_replica_stopped_the_gateway_still_answers(host):
    stopped, running = list(REPLICAS)
    host.sh(f"systemctl stop {stopped}.service")
    assert host.unit(f"{stopped}.service", "ActiveState")["ActiveState"] == "inactive"
    down = host.sh(f"curl -s -o /dev/null -w '%{{http_code}}' http://{REPLICAS[stopped]}:{PORT}/health",
                   check=False).stdout
    assert down == "000"  # nothing listens there any more
    # round_robin sends every other request to the stopped replica; smg retries it on the other one
    retries = _metric(host, "smg_worker_retries_total")
    codes = [_chat(host, host.key, f"prompt {i}") for i in range(6)]
    assert codes == ["200"] * 6, codes
    assert _metric(host, "smg_worker_retries_total") > retries  # requests did go to the stopped one
    assert host.unit(f"{running}.service", "ActiveState")["ActiveState"] == "active"
