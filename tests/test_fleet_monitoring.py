"""Fleet monitoring sees the fleet: the rendered prometheus.yml of a 2-replica fleet behind a gateway targets both
replicas' rank 0, node_exporter on every host that writes a check textfile, and the gateway's smg; the gateway host's
nightly ``check --each-worker --prom`` writes one series set per worker; a render that cannot know an address says
so instead of writing loopback.

The end-to-end test runs it for real at the rendered addresses: three network namespaces (two replicas, the gateway
host) and a fourth holding a bridge and Debian's Prometheus; a stand-in SGLang rank 0 on each replica
(tests/fleet_standin.py), the real smg 1.13.0 on the gateway host with the rendered smg arguments, the real
``kimi-deploy check --each-worker --prom`` there, and a textfile stand-in of node_exporter on every host. Needs root
and iproute2 (CI runs as root; .ci/run installs iproute2 and prometheus). Prometheus' API is polled until a
generous deadline, never a fixed sleep.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers import run_cli, write_profile
from kimi_deploy import launch
from kimi_deploy.targets import prometheus as monitoring
from kimi_deploy.profile import parse_profile
from monitoring_helpers import tool

REPO = Path(__file__).resolve().parent.parent
STANDIN = Path(__file__).resolve().parent / "fleet_standin.py"
REPLICA_A, REPLICA_B, GATEWAY_HOST, PROMETHEUS_HOST = "10.77.0.11", "10.77.0.21", "10.77.0.10", "10.77.0.2"
DEADLINE_S = 240.0

PROFILE = f"""\
[service]
name = "kimi-k25"
gpu_count = 8

[sglang]
model_path = "/models/moonshotai/Kimi-K2.5"
served_model_name = "moonshotai/Kimi-K2.5"
host = "0.0.0.0"
port = 30000
tp_size = 8
enable_metrics = true
allow_unauthenticated = true

[fleet]
[[fleet.replicas]]
nodes = ["{REPLICA_A}"]
[[fleet.replicas]]
nodes = ["{REPLICA_B}"]

[gateway]
host = "{GATEWAY_HOST}"
policy = "round_robin"
prometheus_host = "0.0.0.0"

[monitoring]
scrape_interval_s = 1
runbook_url = "https://git.corp.test/ops/kimi-deploy/blob/main/docs/runbook.md"
"""


def _scrape_targets(profile) -> dict[str, list[str]]:
    config = yaml.safe_load(monitoring.prometheus_config(profile, "# test"))
    return {job["job_name"]: job["static_configs"][0]["targets"] for job in config["scrape_configs"]}


def test_the_fleet_scrape_config_targets_every_replica_every_check_host_and_the_gateway():
    profile = parse_profile(__import__("tomllib").loads(PROFILE))
    assert _scrape_targets(profile) == {
        "kimi-k25": [f"{REPLICA_A}:30000", f"{REPLICA_B}:30000"],
        "kimi-k25-check": [f"{REPLICA_A}:9100", f"{REPLICA_B}:9100", f"{GATEWAY_HOST}:9100"],
        "kimi-k25-gateway": [f"{GATEWAY_HOST}:29000"],
    }
    assert monitoring.scrape_notes(profile) == []


def test_multi_node_replicas_are_scraped_at_rank_0_and_ipv6_in_brackets():
    text = PROFILE.replace(f'nodes = ["{REPLICA_A}"]', 'nodes = ["fd00::11", "fd00::12"]').replace(
        f'nodes = ["{REPLICA_B}"]', 'nodes = ["fd00::21", "fd00::22"]').replace("tp_size = 8", "tp_size = 8\npp_size = 2").replace(
        "[fleet]\n", '[fleet]\ndist_init_port = 20000\nnic = "ens5f0"\n')
    targets = _scrape_targets(parse_profile(__import__("tomllib").loads(text)))
    assert targets["kimi-k25"] == ["[fd00::11]:30000", "[fd00::21]:30000"]
    assert targets["kimi-k25-check"] == ["[fd00::11]:9100", "[fd00::21]:9100", f"{GATEWAY_HOST}:9100"]


def test_smg_metrics_on_loopback_are_said_not_written_as_a_loopback_target(tmp_path):
    """smg's metrics bound to the gateway host's loopback (the [gateway] default) cannot be scraped from another
    host: no gateway job pointing at some other machine's 127.0.0.1, a NOTE in prometheus.yml, a render warning."""
    text = PROFILE.replace('prometheus_host = "0.0.0.0"\n', "")
    profile = parse_profile(__import__("tomllib").loads(text))
    assert "kimi-k25-gateway" not in _scrape_targets(profile)
    (note,) = monitoring.scrape_notes(profile)
    assert "127.0.0.1:29000" in note and 'prometheus_host = "0.0.0.0"' in note
    config = monitoring.prometheus_config(profile, "# test")
    assert f"# NOTE {note}" in config and "127.0.0.1" not in yaml.safe_load(config).__repr__()
    result = run_cli(["render", "--profile", str(write_profile(tmp_path, text)), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.stderr
    assert "monitoring.gateway: smg's metrics listen on 127.0.0.1:29000" in result.stderr
    # an explicit [monitoring] gateway (a Prometheus on the gateway host itself) is the operator's to give
    explicit = text.replace("scrape_interval_s = 1", 'scrape_interval_s = 1\ngateway = "127.0.0.1:29000"')
    assert _scrape_targets(parse_profile(__import__("tomllib").loads(explicit)))["kimi-k25-gateway"] == [
        "127.0.0.1:29000"]


def test_the_gateway_hosts_nightly_check_writes_its_textfile():
    from kimi_deploy.targets import systemd

    profile = parse_profile(__import__("tomllib").loads(PROFILE))
    files = systemd.host_files(profile)[GATEWAY_HOST]
    (unit,) = [text for name, text in files.items() if name.startswith("kimi-deploy-check@") and
               name.endswith(".service")]
    assert "--each-worker" in unit and "--prom /var/lib/kimi-k25-gateway/check.prom" in unit


# ---------------------------------------------------------------- the real thing, in network namespaces


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture
def hosts():
    """Namespaces for both replicas and the gateway host, each with ``kd0`` at its address, joined by a bridge
    in a fourth namespace that holds Prometheus' address; name -> namespace."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None:
        pytest.skip("needs iproute2 (ip netns)")
    tag = f"{os.getpid() % 100000}"
    names = {"hub": PROMETHEUS_HOST, "a": REPLICA_A, "b": REPLICA_B, "g": GATEWAY_HOST}
    spaces = {key: f"kdfm-{key}{tag}" for key in names}
    made: list[str] = []
    try:
        for ns in spaces.values():
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        hub = spaces["hub"]
        _ip("-n", hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", hub, "addr", "add", f"{PROMETHEUS_HOST}/24", "dev", "br0")
        _ip("-n", hub, "link", "set", "br0", "up")
        for key in ("a", "b", "g"):
            inner, outer = f"kfi{key}{tag}", f"kfo{key}{tag}"
            _ip("link", "add", inner, "type", "veth", "peer", "name", outer)
            _ip("link", "set", inner, "netns", spaces[key])
            _ip("link", "set", outer, "netns", hub)
            _ip("-n", spaces[key], "link", "set", inner, "name", "kd0")
            _ip("-n", spaces[key], "addr", "add", f"{names[key]}/24", "dev", "kd0")
            _ip("-n", spaces[key], "link", "set", "kd0", "up")
            _ip("-n", hub, "link", "set", outer, "master", "br0")
            _ip("-n", hub, "link", "set", outer, "up")
        yield {names[key]: ns for key, ns in spaces.items()}
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=60)


class Processes:
    """Processes started in namespaces, each ended (TERM, then KILL) on :meth:`close`."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path, self.procs = tmp_path, []

    def start(self, ns: str, name: str, argv: list[str], **kw) -> subprocess.Popen:
        log = (self.tmp_path / f"{name}.log").open("w")
        proc = subprocess.Popen(["ip", "netns", "exec", ns, *argv], stdout=log, stderr=subprocess.STDOUT, **kw)
        self.procs.append((name, proc))
        return proc

    def log(self, name: str) -> str:
        return (self.tmp_path / f"{name}.log").read_text(errors="replace")[-3000:]

    def close(self) -> None:
        for _, proc in reversed(self.procs):
            proc.terminate()
        for _, proc in reversed(self.procs):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _in(ns: str, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=timeout)


def _api(ns: str, url: str) -> dict | None:
    """GET ``url`` from inside ``ns`` (Prometheus' namespace), parsed; None while nothing answers."""
    code = ("import json, sys, urllib.request\n"
            "try:\n"
            f"    print(urllib.request.urlopen({url!r}, timeout=10).read().decode())\n"
            "except OSError as exc:\n"
            "    sys.exit(7)\n")
    done = _in(ns, sys.executable, "-c", code)
    return json.loads(done.stdout) if done.returncode == 0 else None


def _until(what: str, probe, procs: Processes, deadline: float):
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.5)
    pytest.fail(f"{what} not seen before the deadline; last {last!r}\nprometheus log:\n{procs.log('prometheus')}")


def test_real_prometheus_scrapes_both_replicas_and_the_gateway_and_the_check_per_worker(hosts, tmp_path, smg_path):
    deadline = time.monotonic() + DEADLINE_S
    profile_path = write_profile(tmp_path, PROFILE)
    profile = parse_profile(__import__("tomllib").loads(PROFILE))
    etc = tmp_path / "etc"
    etc.mkdir()
    from kimi_deploy.targets.systemd import render

    for name, text in render(profile).monitoring.items():
        (etc / name).write_text(text)
    procs = Processes(tmp_path)
    try:
        textfiles = {}
        for host in (REPLICA_A, REPLICA_B):
            procs.start(hosts[host], f"sglang-{host}", [sys.executable, str(STANDIN), "sglang", "--host", "0.0.0.0",
                                                       "--port", "30000"])
        for host in (REPLICA_A, REPLICA_B, GATEWAY_HOST):
            textfiles[host] = tmp_path / f"textfile-{host}" / "check.prom"
            textfiles[host].parent.mkdir()
            procs.start(hosts[host], f"node-{host}", [sys.executable, str(STANDIN), "textfile", "--host", "0.0.0.0",
                                                     "--port", "9100", "--file", str(textfiles[host])])
        # the gateway unit's own smg arguments (workers from [fleet], metrics on 0.0.0.0:29000), the test's smg
        argv = launch.gateway_argv(profile)
        assert argv[0] == profile.gateway.smg
        procs.start(hosts[GATEWAY_HOST], "smg", [smg_path, *argv[1:], "--disable-tokenizer-autoload"],
                    env={**os.environ, "HF_HUB_OFFLINE": "1"})
        procs.start(hosts[PROMETHEUS_HOST], "prometheus", [
            tool("prometheus"), f"--config.file={etc / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            "--web.listen-address=127.0.0.1:9090"])

        def gateway_lists_both():
            done = _in(hosts[GATEWAY_HOST], sys.executable, "-c",
                       "import urllib.request; print(urllib.request.urlopen("
                       f"'http://{GATEWAY_HOST}:30000/workers', timeout=5).read().decode())")
            return done.returncode == 0 and all(f"http://{h}:30000" in done.stdout for h in (REPLICA_A, REPLICA_B))

        _until("smg lists both replicas", gateway_lists_both, procs, deadline)
        # the gateway host's nightly check, as its unit runs it (the unit's --json/--prom paths made local)
        check = _in(hosts[GATEWAY_HOST], str(Path(sys.executable).parent / "kimi-deploy"), "check", "--profile",
                    str(profile_path), "--each-worker", "--only", "health.*", "--json", str(tmp_path / "workers.json"),
                    "--prom", str(textfiles[GATEWAY_HOST]), timeout=600)
        assert check.returncode in (0, 1), check.stdout + check.stderr
        text = textfiles[GATEWAY_HOST].read_text()
        for host in (REPLICA_A, REPLICA_B):
            assert f'kimi_deploy_check_exit_code{{service="kimi-k25",worker="http://{host}:30000"}}' in text, text

        def all_up():
            answer = _api(hosts[PROMETHEUS_HOST], "http://127.0.0.1:9090/api/v1/targets")
            if not answer:
                return None
            seen = {(t["labels"]["job"], t["labels"]["instance"]): t["health"]
                    for t in answer["data"]["activeTargets"]}
            return seen if set(seen.values()) == {"up"} and len(seen) == 6 else None

        up = _until("every target up", all_up, procs, deadline)
        assert set(up) == {("kimi-k25", f"{REPLICA_A}:30000"), ("kimi-k25", f"{REPLICA_B}:30000"),
                           ("kimi-k25-check", f"{REPLICA_A}:9100"), ("kimi-k25-check", f"{REPLICA_B}:9100"),
                           ("kimi-k25-check", f"{GATEWAY_HOST}:9100"), ("kimi-k25-gateway", f"{GATEWAY_HOST}:29000")}

        def per_worker():
            answer = _api(hosts[PROMETHEUS_HOST], "http://127.0.0.1:9090/api/v1/query?query="
                          "kimi_deploy_check_exit_code%7Bjob%3D%22kimi-k25-check%22%7D")
            series = answer and answer["data"]["result"]
            return {s["metric"].get("worker"): float(s["value"][1]) for s in series} if series else None

        exits = _until("the check per worker", per_worker, procs, deadline)
        assert set(exits) == {f"http://{REPLICA_A}:30000", f"http://{REPLICA_B}:30000"}
        workers = json.loads((tmp_path / "workers.json").read_text())
        assert exits == {w["url"]: float(w["exit_code"]) for w in workers["workers"]}
        gateway_health = _api(hosts[PROMETHEUS_HOST], "http://127.0.0.1:9090/api/v1/query?query=smg_worker_health")
        assert {s["metric"]["job"] for s in gateway_health["data"]["result"]} == {"kimi-k25-gateway"}
    finally:
        procs.close()


def test_a_gateway_listing_no_worker_still_writes_a_failed_run():
    from kimi_deploy.check.reports import workers_to_prometheus

    text = workers_to_prometheus([], service="kimi-k25", exit_code=1, started_at=1767225600.0)
    assert 'kimi_deploy_check_exit_code{service="kimi-k25"} 1\n' in text
    assert 'kimi_deploy_check_last_run_timestamp_seconds{service="kimi-k25"} 1767225600.000\n' in text
    assert text.count("# TYPE kimi_deploy_check_exit_code gauge") == 1


def test_each_worker_still_refuses_junit(tmp_path):
    result = run_cli(["check", "--base-url", "http://127.0.0.1:9", "--each-worker", "--junit",
                      str(tmp_path / "x.xml")])
    assert result.exit_code == 2 and "--junit writes one server's report" in result.stderr
