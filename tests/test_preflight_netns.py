"""``kimi-deploy preflight`` for real: two ranks in two network namespaces joined by a veth, torch's gloo in
SGLang's test interpreter (KIMI_DEPLOY_SGLANG_PYTHON, which has torch).

Needs root and iproute2 (``ip netns``; CI runs as root and .ci/run installs iproute2). No test races the clock:
"at once" is shown by the stage that failed (before any waiting), each timeout is injected (--timeout), and
subprocess timeouts only guard against a hang.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import write_profile

SGLANG_PYTHON = os.environ.get("KIMI_DEPLOY_SGLANG_PYTHON", "")
REPO = Path(__file__).resolve().parent.parent
NIC = "kd0"
LEADER, WORKER = "10.99.0.1", "10.99.0.2"
PORT = 29517
#: Guard against a hang only (never asserted): torch's import takes seconds on a loaded 2-core machine.
HANG_GUARD = 300


def _has_torch() -> bool:
    if not SGLANG_PYTHON:
        return False
    done = subprocess.run([SGLANG_PYTHON, "-c", "import torch.distributed as d; assert d.is_gloo_available()"],
                          capture_output=True, timeout=HANG_GUARD)
    return done.returncode == 0


# The torch probe is no skipif here: a skipif runs at collection, where it imported torch (about 25 s on a
# loaded 2-core machine) in every pytest-xdist worker and on every run that selected none of these tests.
# The module's fixture asks once, when a test of this module is about to run.
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2 (ip netns)"),
]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def namespaces():
    """Two namespaces (leader, worker), each with ``lo`` and ``kd0`` up, ``kd0`` the ends of one veth.

    Names carry this process's id, so pytest-xdist workers (and other runs on the machine) never share one.
    Skips every test of the module when KIMI_DEPLOY_SGLANG_PYTHON has no torch with gloo."""
    if not _has_torch():
        pytest.skip("KIMI_DEPLOY_SGLANG_PYTHON has no torch with gloo")
    tag = f"{os.getpid() % 100000}"
    leader, worker = f"kdpf-l{tag}", f"kdpf-w{tag}"
    _ip("netns", "add", leader)
    _ip("netns", "add", worker)
    try:
        _ip("link", "add", f"kdl{tag}", "type", "veth", "peer", "name", f"kdw{tag}")
        for ns, end, address in ((leader, f"kdl{tag}", LEADER), (worker, f"kdw{tag}", WORKER)):
            _ip("link", "set", end, "netns", ns)
            _ip("-n", ns, "link", "set", end, "name", NIC)
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", NIC)
            _ip("-n", ns, "link", "set", NIC, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield {LEADER: leader, WORKER: worker}
    finally:
        for ns in (leader, worker):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=60)


def _profile(tmp_path: Path, nic: str = NIC) -> Path:
    return write_profile(tmp_path, f"""\
[service]
name = "kimi-k25"
python = "{SGLANG_PYTHON}"
gpu_count = 8

[sglang]
model_path = "/models/moonshotai/Kimi-K2.5"
tp_size = 8
pp_size = 2
host = "0.0.0.0"
allow_unauthenticated = true

[fleet]
dist_init_port = {PORT}
nic = "{nic}"

[[fleet.replicas]]
nodes = ["{LEADER}", "{WORKER}"]
""")


def _start(namespaces, ns_of: str, profile: Path, node: str, timeout: float) -> subprocess.Popen:
    """``kimi-deploy preflight --json`` for ``node`` inside the namespace of ``ns_of``."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        ["ip", "netns", "exec", namespaces[ns_of], sys.executable, "-m", "kimi_deploy", "preflight",
         "--profile", str(profile), "--host", node, "--timeout", str(timeout), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _finish(process: subprocess.Popen) -> tuple[int, dict, str]:
    stdout, stderr = process.communicate(timeout=HANG_GUARD)
    assert stdout.strip(), stderr
    return process.returncode, json.loads(stdout), stderr


def _run(namespaces, ns_of: str, profile: Path, node: str, timeout: float) -> tuple[int, dict, str]:
    return _finish(_start(namespaces, ns_of, profile, node, timeout))


def test_worker_started_first_still_joins(namespaces, tmp_path):
    profile = _profile(tmp_path)
    worker = _start(namespaces, WORKER, profile, WORKER, 120)
    # The leader starts only once the worker says it is waiting for rank 0 (nothing listens yet).
    seen = []
    for line in worker.stderr:
        seen.append(line)
        if "waiting for rank 0" in line:
            break
    assert any(f"waiting for rank 0 at {LEADER}:{PORT}" in line for line in seen), "".join(seen)
    leader = _start(namespaces, LEADER, profile, LEADER, 120)
    code, result, stderr = _finish(leader)
    worker_code, worker_result, _ = _finish(worker)
    assert (code, worker_code) == (0, 0), (result, worker_result, stderr)
    for data, rank in ((result, 0), (worker_result, 1)):
        assert data["ok"] and data["stages"] == ["address", "nic", "store", "join", "gloo"]
        assert data["rank"]["rank"] == rank and data["rank"]["rank0"] == LEADER
        assert data["nic"] == NIC and data["port"] == PORT


def test_a_wrong_nic_fails_at_once_and_names_it(namespaces, tmp_path):
    code, result, stderr = _run(namespaces, WORKER, _profile(tmp_path, nic="eth9"), WORKER, 600)
    assert code == 1 and not result["timed_out"]
    assert result["stage"] == "nic" and result["stages"] == ["address"]  # failed before waiting for anyone
    assert "eth9" in result["error"] and WORKER in result["error"] and NIC in result["error"]
    assert "[fleet] nic" in result["fix"]
    assert "waiting for rank 0" not in stderr


def test_a_missing_worker_is_a_clear_timeout(namespaces, tmp_path):
    code, result, _ = _run(namespaces, LEADER, _profile(tmp_path), LEADER, 2)
    assert code == 6 and result["timed_out"]
    assert result["stage"] == "join" and result["missing"] == [1]
    assert f"rank 1 ({WORKER}) did not join within 2 s" in result["error"]
    assert WORKER in result["fix"]


def test_a_missing_leader_is_a_clear_timeout_naming_host_and_port(namespaces, tmp_path):
    code, result, _ = _run(namespaces, WORKER, _profile(tmp_path), WORKER, 2)
    assert code == 6 and result["timed_out"]
    assert result["stage"] == "store"
    assert f"rank 0 at {LEADER}:{PORT} did not answer within 2 s" in result["error"]
    assert f"TCP port {PORT}" in result["fix"]


def test_a_host_that_is_not_the_node_is_named(namespaces, tmp_path):
    code, result, _ = _run(namespaces, WORKER, _profile(tmp_path), LEADER, 600)
    assert code == 1 and result["stage"] == "address"
    assert f"this host does not own {LEADER}" in result["error"]
    # a wrong NIC as well: the wrong machine is what is named, not the NIC of a host this is not
    code, result, _ = _run(namespaces, WORKER, _profile(tmp_path, nic="eth9"), LEADER, 600)
    assert code == 1 and result["stage"] == "address" and "eth9" not in result["error"]


def test_a_busy_rendezvous_port_is_named(namespaces, tmp_path):
    holder = subprocess.Popen(
        ["ip", "netns", "exec", namespaces[LEADER], sys.executable, "-c",
         f"import socket, sys; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('0.0.0.0', {PORT})); s.listen(); print('up', flush=True); "
         "sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "up"
        code, result, _ = _run(namespaces, LEADER, _profile(tmp_path), LEADER, 600)
    finally:
        holder.stdin.close()
        holder.wait(timeout=HANG_GUARD)
    assert code == 1 and result["stage"] == "store" and not result["timed_out"]
    assert f"port {PORT} is already in use on {LEADER}" in result["error"]
    assert "dist_init_port" in result["fix"]


def test_a_nic_without_an_address_fails_in_gloo_naming_it(namespaces, tmp_path):
    """Both nodes have the NIC, but it has no address (SGLang's "Unable to find address for" case): the store
    meets over the veth, then gloo fails on both at once instead of waiting for the timeout."""
    for ns in namespaces.values():
        _ip("-n", ns, "link", "add", "kd9", "type", "veth", "peer", "name", "kd9p")  # no dummy module here
        _ip("-n", ns, "link", "set", "kd9", "up")
    try:
        profile = _profile(tmp_path, nic="kd9")
        worker = _start(namespaces, WORKER, profile, WORKER, 600)
        leader = _start(namespaces, LEADER, profile, LEADER, 600)
        results = [_finish(leader), _finish(worker)]
    finally:
        for ns in namespaces.values():
            subprocess.run(["ip", "-n", ns, "link", "del", "kd9"], capture_output=True, timeout=60)
    for (code, result, stderr), node in zip(results, (LEADER, WORKER)):
        assert code == 1 and not result["timed_out"], (result, stderr)
        assert result["stage"] == "gloo" and result["stages"] == ["address", "nic", "store", "join"]
        assert f"gloo found no address on kd9 on host {node}" in result["error"]


def test_a_rank_that_reaches_a_running_groups_store_says_so(namespaces, tmp_path):
    """Rank 0's port answers, but with another program's TCPStore (a running SGLang of the group): the worker
    does not hang, writes only under its own key prefix, and says rank 0's preflight never joined."""
    store = subprocess.Popen(
        ["ip", "netns", "exec", namespaces[LEADER], SGLANG_PYTHON, "-c",
         "import datetime, sys, torch.distributed as d; "
         f"s = d.TCPStore('0.0.0.0', {PORT}, None, True, datetime.timedelta(seconds=60), wait_for_workers=False); "
         "s.set('sglang-key', 'x'); print('up', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "TORCH_CPP_LOG_LEVEL": "FATAL"})
    try:
        assert store.stdout.readline().strip() == "up"
        code, result, _ = _run(namespaces, WORKER, _profile(tmp_path), WORKER, 2)
    finally:
        store.stdin.close()
        store.wait(timeout=HANG_GUARD)
    assert code == 6 and result["stage"] == "join" and result["missing"] == [0]
    assert "rank 0's preflight did not join" in result["error"] and "running SGLang" in result["error"]
    assert "restart every rank of the group together" in result["fix"]
