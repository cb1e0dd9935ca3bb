"""Container tier, group 4: the real ansible-playbook rolls a fleet of two booted hosts (issue 39).

Two containers (tests/systemd_container.py, a real systemd 252 each, booted at once in cgroups of their own), laid
out as GPU hosts (tests/container_host.py) and joined by a veth pair in their private network namespaces:
``10.77.0.1`` runs replica 0 and the pinned gateway (smg 1.13.0), ``10.77.0.2`` replica 1; each replica is the
stand-in SGLang (tests/standin/) behind the kit's real units. ``kimi-deploy render --target ansible`` writes the
playbook on this machine (the controller), and the real ``ansible-playbook`` of the Ansible test environment
(tests/ansible_env.py: ansible-core 2.19.14) reaches each host over SSH: sshd runs inside each container, and
ssh's ``ProxyCommand`` is ``nsenter --net socat`` into that container's network namespace (a real connection,
not ``ansible_connection=local``).

The scenarios share the two boots and run in file order, each starting from the state the one before left:

1. a new fleet: the first run installs every host, starts the gateway and both replicas, gated;
2. a second run of the unchanged profile reports ``changed=0`` and restarts nothing;
3. ``--check --diff`` shows each host's install plan and its diff, and changes nothing;
4. a clean roll: one replica at a time, the gateway's worker list (sampled every 0.5 s) never without a healthy
   worker;
5. a profile whose files fail the contract gate: the roll stops at the first replica, which is rolled back and
   back in rotation; the other keeps its process and its files; ``ansible-playbook`` exits non-zero;
6. the capacity guard refuses a batch while the other worker is down: nothing installed or restarted;
7. SIGINT to ansible-playbook's process group mid-roll: every replica ends serving on its old or new files, back
   in rotation, never left drained; the next run finishes the roll.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ansible_env import ansible_bin, run_tool
from container_host import KIT, SGLANG_PYTHON, SMG, booted_host, profile, skip_or_fail

pytestmark = [pytest.mark.container, pytest.mark.sglang]

NAME = "kimi-k25"
A, B = "10.77.0.1", "10.77.0.2"
PORT = 30000
GATEWAY_PORT = 31000
KEY_FILE = f"/etc/kimi-deploy/{NAME}.api-key"
ENV_FILE = f"/etc/kimi-deploy/{NAME}.env"
UNIT = f"{NAME}.service"
SAMPLES = "/root/workers.jsonl"
#: Each host's boot may run the whole module (its watchdog; the module's own waits bound each step).
WATCHDOG = 2400.0


def fleet_profile(roll: int, sanitise: bool = False) -> str:
    """The fleet's profile: both replicas on every address of their host, the gateway on 10.77.0.1:31000
    (round_robin: both replicas get requests). ``roll``: ``KIMI_TEST_ROLL`` in ``[environment]``, a change of
    every replica's env file and nothing else; ``sanitise``: the stand-in rewrites every returned tool-call id
    (``KIMI_REPLAY_SANITISE_IDS``), which fails the contract gate's id round trip."""
    env = f'KIMI_TEST_ROLL = "{roll}"\n' + ('KIMI_REPLAY_SANITISE_IDS = "1"\n' if sanitise else "")
    return profile(name=NAME, host="0.0.0.0", port=PORT, api_key_file=KEY_FILE) + env + f"""
[fleet]
[[fleet.replicas]]
nodes = ["{A}"]
[[fleet.replicas]]
nodes = ["{B}"]

[gateway]
host = "{A}"
bind = "0.0.0.0"
port = {GATEWAY_PORT}
policy = "round_robin"
smg = "{SMG}"
"""


class Fleet:
    """The two booted hosts (``hosts[A]``, ``hosts[B]``), the rendered playbook folder and how to run it."""

    def __init__(self, hosts, folder: Path, conn: Path, key: str, workdir: Path):
        self.hosts, self.folder, self.conn, self.key, self.workdir = hosts, folder, conn, key, workdir
        self.control = Path(f"/tmp/kd-cp-{os.getpid()}")  # ssh's ControlPath must stay short (108 bytes)
        self.control.mkdir(exist_ok=True)

    def render(self, roll: int, sanitise: bool = False) -> None:
        """``kimi-deploy render --target ansible --out`` of :func:`fleet_profile` on this machine, as an operator."""
        source = self.workdir / "fleet.toml"
        source.write_text(fleet_profile(roll, sanitise))
        r = subprocess.run([sys.executable, "-m", "kimi_deploy", "render", "--profile", str(source), "--target",
                            "ansible", "--out", str(self.folder)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        (self.folder / "files" / f"{NAME}.api-key").write_text(self.key + "\n")

    def env(self) -> dict[str, str]:
        return {"ANSIBLE_SSH_CONTROL_PATH_DIR": str(self.control), "ANSIBLE_HOST_KEY_CHECKING": "False",
                "ANSIBLE_PIPELINING": "True", "ANSIBLE_FORKS": "5"}

    def argv(self, *args: str) -> list[str]:
        return ["-i", "inventory.yml", "-i", str(self.conn), "site.yml", *args]

    def play(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        """``ansible-playbook -i inventory.yml -i conn.yml site.yml ARGS`` in the rendered folder."""
        return run_tool("ansible-playbook", *self.argv(*args), cwd=self.folder, env=self.env(), timeout=timeout)

    def main_pid(self, node: str) -> str:
        return self.hosts[node].unit(UNIT, "MainPID")["MainPID"]

    def workers(self) -> list[dict]:
        r = self.hosts[A].sh(f"curl -s -m 5 -H 'Authorization: Bearer {self.key}' "
                             f"http://127.0.0.1:{GATEWAY_PORT}/workers", check=False)
        try:
            return json.loads(r.stdout)["workers"]
        except (ValueError, KeyError, TypeError):
            return []

    def healthy(self) -> set[str]:
        return {w["url"] for w in self.workers() if w.get("status") == "ready" and w.get("is_healthy")}

    def roll_value(self, node: str) -> str | None:
        """``KIMI_TEST_ROLL`` of ``node``'s installed env file."""
        m = re.search(r"^KIMI_TEST_ROLL=(\S+)$", self.hosts[node].sh(f"cat {ENV_FILE}").stdout, re.M)
        return m.group(1).strip('"') if m else None

    def serving_value(self, node: str) -> str | None:
        """``KIMI_TEST_ROLL`` in the environment of the process that serves on ``node`` (its unit's main PID)."""
        pid = self.main_pid(node)
        text = self.hosts[node].sh(f"tr '\\0' '\\n' < /proc/{pid}/environ", check=False).stdout
        m = re.search(r"^KIMI_TEST_ROLL=(\S+)$", text, re.M)
        return m.group(1) if m else None


def _until(done, what: str, timeout: float = 300.0):
    deadline = time.monotonic() + timeout
    while not (value := done()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(1)
    return value


def _link(hosts) -> None:
    """A veth pair from this machine's namespace into the two containers' network namespaces, 10.77.0.0/24."""
    tag = f"kd{os.getpid() % 100000}"
    subprocess.run(["ip", "link", "add", f"{tag}a", "type", "veth", "peer", "name", f"{tag}b"], check=True,
                   capture_output=True, timeout=30)
    for suffix, node in (("a", A), ("b", B)):
        subprocess.run(["ip", "link", "set", f"{tag}{suffix}", "netns", str(hosts[node].box.init_pid)], check=True,
                       capture_output=True, timeout=30)
        hosts[node].sh(f"ip addr add {node}/24 dev {tag}{suffix} && ip link set {tag}{suffix} up")


def _sshd(host, public_key: str) -> None:
    """sshd inside (the machine's own openssh-server, its host keys made in the container's /etc copy) on the
    container's loopback, root by key only."""
    host.sh("mkdir -p /run/sshd /root/.ssh && chmod 700 /root/.ssh && ssh-keygen -A >/dev/null")
    host.write("/root/.ssh/authorized_keys", public_key)
    host.sh("chmod 600 /root/.ssh/authorized_keys && systemd-run --unit=test-sshd /usr/sbin/sshd -D -e "
            "-o ListenAddress=127.0.0.1 -o PermitRootLogin=prohibit-password -o PasswordAuthentication=no "
            "-o UsePAM=no")
    _until(lambda: "127.0.0.1:22 " in host.sh("ss -ltnH", check=False).stdout, "sshd to listen", 60)


def _conn_inventory(hosts, private_key: Path) -> str:
    """The controller's own inventory: how to reach each host (the rendered inventory says nothing of it)."""
    lines = ["all:", "  hosts:"]
    for node, host in hosts.items():
        proxy = f"nsenter --target {host.box.init_pid} --net socat - TCP:127.0.0.1:22"
        lines += [f'    "{node}":', "      ansible_user: root", f"      ansible_ssh_private_key_file: {private_key}",
                  "      ansible_python_interpreter: /usr/bin/python3",
                  f"      ansible_ssh_common_args: '-o ProxyCommand=\"{proxy}\" -o UserKnownHostsFile=/dev/null "
                  "-o StrictHostKeyChecking=no'"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, sglang_python, smg_path_or_skip):
    ansible_bin()  # the Ansible environment first: no boot without it
    for tool in ("sshd", "socat", "ssh"):
        if not any(Path(d, tool).exists() for d in ("/usr/sbin", "/usr/bin")):
            skip_or_fail(f"{tool} is not installed (apt-get install openssh-server socat; .ci/run installs them)")
    workdir = tmp_path_factory.mktemp("ansible-fleet")
    with contextlib.ExitStack() as stack:
        hosts = {}
        for node, label, gateway in ((A, "a", smg_path_or_skip), (B, "b", None)):
            hosts[node] = stack.enter_context(booted_host(workdir / label, sglang_python, smg=gateway,
                                                          own_cgroup=True, watchdog=WATCHDOG))
        _link(hosts)
        key_file = workdir / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key_file)], check=True, timeout=60)
        for host in hosts.values():
            _sshd(host, (workdir / "id_ed25519.pub").read_text())
            host.sh(f"kimi-deploy patch apply --python {SGLANG_PYTHON}", timeout=300)
        conn = workdir / "conn.yml"
        conn.write_text(_conn_inventory(hosts, key_file))
        folder = workdir / "rendered"
        folder.mkdir()
        f = Fleet(hosts, folder, conn, secrets.token_hex(32), workdir)
        f.render(roll=1)
        yield f


@pytest.fixture(scope="module")
def smg_path_or_skip(request) -> str:
    try:
        return request.getfixturevalue("smg_path")
    except pytest.skip.Exception as exc:
        skip_or_fail(str(exc))


def recap(output: str) -> dict[str, dict[str, int]]:
    """``PLAY RECAP`` of ansible-playbook's output: host -> {ok, changed, unreachable, failed, ...}."""
    found = {}
    for m in re.finditer(r"^(\S+)\s+:\s+((?:\w+=\d+\s*)+)$", output.split("PLAY RECAP", 1)[-1], re.M):
        found[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return found


def shown(r: subprocess.CompletedProcess) -> str:
    return f"exit {r.returncode}\n{r.stdout[-12000:]}\n{r.stderr[-4000:]}"


def test_a_new_fleet_is_installed_started_and_gated(fleet):
    r = fleet.play()
    assert r.returncode == 0, shown(r)
    assert fleet.healthy() == {f"http://{A}:{PORT}", f"http://{B}:{PORT}"}
    for node in (A, B):
        assert fleet.roll_value(node) == fleet.serving_value(node) == "1"
        key = fleet.hosts[node].sh(f"stat -c '%a %U' {KEY_FILE} && cat {KEY_FILE}").stdout.split("\n")
        assert key[0] == "600 root" and key[1] == fleet.key
    assert fleet.key not in r.stdout + r.stderr  # no_log: the key never shows in Ansible's output
    assert "gate contract passed" in r.stdout and "Gateway | check every worker through the gateway" in r.stdout


def test_a_second_run_of_the_unchanged_profile_changes_nothing(fleet):
    pids = {node: fleet.main_pid(node) for node in (A, B)}
    r = fleet.play()
    assert r.returncode == 0, shown(r)
    counts = recap(r.stdout)
    assert set(counts) == {A, B} and all(c["changed"] == 0 and c["failed"] == 0 for c in counts.values()), shown(r)
    assert {node: fleet.main_pid(node) for node in (A, B)} == pids


def test_check_diff_shows_each_hosts_install_plan_and_changes_nothing(fleet):
    pids = {node: fleet.main_pid(node) for node in (A, B)}
    fleet.render(roll=2)
    r = fleet.play("--check", "--diff")
    assert r.returncode == 0, shown(r)
    assert r.stdout.count('+KIMI_TEST_ROLL="2"') >= 2 or r.stdout.count("+KIMI_TEST_ROLL=2") >= 2, shown(r)
    assert {node: fleet.roll_value(node) for node in (A, B)} == {A: "1", B: "1"}
    assert {node: fleet.main_pid(node) for node in (A, B)} == pids


def test_a_clean_roll_restarts_one_replica_at_a_time_and_a_worker_always_serves(fleet):
    a = fleet.hosts[A]
    a.sh(f"systemd-run --unit=test-sampler sh -c 'while :; do curl -s -m 2 -H \"Authorization: Bearer {fleet.key}\" "
         f"http://127.0.0.1:{GATEWAY_PORT}/workers; echo; sleep 0.5; done > {SAMPLES}'")
    r = fleet.play()  # the profile of roll 2, rendered by the --check test
    a.sh("systemctl stop test-sampler")
    assert r.returncode == 0, shown(r)
    for node in (A, B):
        assert fleet.roll_value(node) == fleet.serving_value(node) == "2"
    samples = [json.loads(line)["workers"] for line in a.sh(f"cat {SAMPLES}").stdout.splitlines() if
               line.startswith("{")]
    assert len(samples) > 20
    healthy = [sum(1 for w in s if w["status"] == "ready" and w["is_healthy"]) for s in samples]
    assert min(healthy) >= 1, healthy
    assert min(len(s) for s in samples) == 1  # each replica did leave the gateway (drained) once
    # one at a time: replica 1's new start began after replica 0's new process was active (one kernel clock)
    a_ready = int(a.unit(UNIT, "ActiveEnterTimestampMonotonic")["ActiveEnterTimestampMonotonic"])
    b_start = int(fleet.hosts[B].unit(UNIT, "ExecMainStartTimestampMonotonic")["ExecMainStartTimestampMonotonic"])
    assert 0 < a_ready < b_start


def test_a_replica_failing_the_contract_gate_is_rolled_back_and_stops_the_roll(fleet):
    b_pid = fleet.main_pid(B)
    fleet.render(roll=3, sanitise=True)
    r = fleet.play()
    assert r.returncode != 0, shown(r)
    assert "rolled back" in r.stdout or "rollback" in r.stdout, shown(r)
    # replica 0: back on its previous files, serving them, back in rotation
    assert fleet.roll_value(A) == fleet.serving_value(A) == "2"
    assert "KIMI_REPLAY_SANITISE_IDS" not in fleet.hosts[A].sh(f"cat {ENV_FILE}").stdout
    assert fleet.healthy() == {f"http://{A}:{PORT}", f"http://{B}:{PORT}"}
    # replica 1: never reached; its process and its installed files are those of the last good roll
    assert fleet.main_pid(B) == b_pid and fleet.roll_value(B) == "2"
    assert recap(r.stdout)[A]["failed"] == 1 and B not in [h for h, c in recap(r.stdout).items() if c["changed"]]


def test_the_capacity_guard_refuses_a_batch_while_another_worker_is_down(fleet):
    fleet.render(roll=4)
    fleet.hosts[B].sh(f"systemctl stop {UNIT}")  # the gateway still lists it healthy until its checks fail
    a_pid = fleet.main_pid(A)
    try:
        r = fleet.play()
        assert r.returncode != 0, shown(r)
        assert "capacity guard: 0 worker(s) besides this batch" in r.stdout, shown(r)
        assert fleet.main_pid(A) == a_pid and fleet.roll_value(A) == "2"  # nothing installed, nothing restarted
    finally:  # replica 1 back: serving (its /health, as the guard probes it) and healthy in the gateway
        fleet.hosts[B].sh(f"systemctl start {UNIT}")
        _until(lambda: fleet.hosts[A].sh(f"curl -s -m 5 -o /dev/null -w '%{{http_code}}' http://{B}:{PORT}/health",
                                         check=False).stdout == "200", "replica 1 to answer /health", 300)
        _until(lambda: fleet.healthy() == {f"http://{A}:{PORT}", f"http://{B}:{PORT}"},
               "both replicas healthy again", 300)


def test_sigint_mid_roll_leaves_every_replica_serving_old_or_new_files_in_rotation(fleet):
    fleet.render(roll=5)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    home = fleet.folder / ".ansible-home"
    env.update({"HOME": str(home), "ANSIBLE_NOCOLOR": "1", "PYTHONWARNINGS": "ignore", **fleet.env(),
                "PATH": f"{ansible_bin()}:{os.environ.get('PATH', '/usr/bin:/bin')}"})
    log = (fleet.workdir / "sigint.log").open("w")
    proc = subprocess.Popen([str(ansible_bin() / "ansible-playbook"), *fleet.argv()], cwd=fleet.folder, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # Ctrl-C once replica 0 is out of the gateway (its drain and restart under way)
        _until(lambda: f"http://{A}:{PORT}" not in {w["url"] for w in fleet.workers()} or proc.poll() is not None,
               "the roll to take replica 0 out of the gateway", 300)
        assert proc.poll() is None, ("the playbook ended before replica 0 left the gateway:\n"
                                     + (fleet.workdir / "sigint.log").read_text()[-12000:])
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends: the whole foreground group
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        log.close()
    output = (fleet.workdir / "sigint.log").read_text()
    assert proc.returncode != 0, output
    # the restart the controller left goes on to its end: both replicas back in rotation, never left drained
    _until(lambda: fleet.healthy() == {f"http://{A}:{PORT}", f"http://{B}:{PORT}"}
           and all(w["status"] == "ready" for w in fleet.workers()), "both replicas back in rotation", 420)
    for node in (A, B):
        assert fleet.hosts[node].unit(UNIT, "ActiveState")["ActiveState"] == "active"
        assert fleet.roll_value(node) == fleet.serving_value(node) and fleet.roll_value(node) in ("2", "5"), output
    assert fleet.roll_value(B) == "2"  # the roll never got to replica 1
    # the next run finishes the roll
    r = fleet.play()
    assert r.returncode == 0, shown(r)
    assert {node: fleet.serving_value(node) for node in (A, B)} == {A: "5", B: "5"}
