"""``kimi-deploy tune`` end to end: the real install, restart with its contract gate and rollback, bench, journal.

The server is SGLang 0.5.23's serving layer (tests/replay/server.py on the patched SGLang copy, so every gate tier
passes) timed by tests/replay/speed_model.py over the launch flags of the unit the fake systemd "started": its
``systemctl restart`` copies the installed unit and environment file to the folder the server reads
(``--speed-model``). So each candidate's speed is its own flags', with noise, and the planted
``chunked_prefill_size = 2048`` is the fastest and returns sanitised tool-call ids (the contract gate's
``contract.tool_*`` checks fail on it). Candidates are parsed by that SGLang's own parser before they start; the
memory plan runs on the recorded 8 x RTX PRO 6000 query and Kimi K2.5's recorded header index, so
``mem_fraction_static = 0.6`` is pruned before any restart.

Cost on the 2-core CI machine: about 3 minutes for the module (the optimum run, the kill-and-resume run, Ctrl-C).
"""

from __future__ import annotations

import itertools
import json
import random
import shutil
import signal
import sys
from pathlib import Path

import pytest

from fault_harness import reap, spawn_cli
from install_fakes import write_profile
from kimi_deploy.cli import cli
from kimi_deploy.errors import ExitCode
from kimi_deploy.host.install.apply import apply
from kimi_deploy.host.install.install_plan import plan_install
from kimi_deploy.paths import HostLayout
from kimi_deploy.profile import load_profile
from kimi_deploy.tune import journal as tj

sys.path.insert(0, str(Path(__file__).parent / "replay"))
import speed_model  # noqa: E402

pytestmark = pytest.mark.sglang

REPO = Path(__file__).resolve().parents[1]
UNIT = "etc/systemd/system/kimi-test.service"
ENV = "etc/kimi-deploy/kimi-test.env"
GPU_FACTS = REPO / "tests/data/nvidia-smi/query-8x-server-580.csv"
MODEL_FACTS = REPO / "tests/data/models/kimi-k2.5-int4"
#: The original configuration (the baseline): what is installed and running before tune.
ORIGINAL = ("max_running_requests = 16", "chunked_prefill_size = 8192", "mem_fraction_static = 0.85")
#: The load and SLO of every run here (the server's timing: speed_model.py).
LOAD = ["--concurrency", "8", "--num-prompts", "16", "--warmup", "4", "--max-tokens", "48", "--runs", "3",
        "--slo", "ttft=150,tpot=12", "--poll-interval", "0.05", "--timeout", "60"]


@pytest.fixture(scope="module")
def speed_server(patched_sglang, tmp_path_factory):
    """``(python, port, folder)``: the timed replay server and the folder it reads the running unit from."""
    from replay_process import Replay

    python, _state = patched_sglang
    folder = tmp_path_factory.mktemp("running")
    server = Replay(python, ["--tp-size", "8", "--no-speculative", "--speed-model", str(folder)],
                    tmp_path_factory.mktemp("speed-log") / "replay.log")
    port = int(server.url().rsplit(":", 1)[1])
    yield python, port, folder
    server.stop()


class Host:
    """A --root tree with the original profile installed and "running"; the restart hook starts what it installs."""

    def __init__(self, tmp_path: Path, fake_systemd, speed_server, original=ORIGINAL) -> None:
        python, port, self.running = speed_server
        self.root = tmp_path / "root"
        self.root.mkdir()
        self.fake = fake_systemd
        self.profile = write_profile(tmp_path / "kimi-test.toml", port=port, gpu_count=8, python=python,
                                     sglang_lines=('served_model_name = "moonshotai/Kimi-K2.5"', *original))
        apply(plan_install(load_profile(self.profile), HostLayout(self.root), enable=False, create_user=False))
        for name in ("unit", "env"):
            (self.running / name).unlink(missing_ok=True)
        self.start()
        fake_systemd.on("restart", f"#!{sys.executable}\nimport shutil\n"
                                   f"shutil.copyfile({str(self.root / UNIT)!r}, {str(self.running / 'unit')!r})\n"
                                   f"shutil.copyfile({str(self.root / ENV)!r}, {str(self.running / 'env')!r})\n")
        self.original_files = self.files()

    def start(self) -> None:
        shutil.copyfile(self.root / UNIT, self.running / "unit")
        shutil.copyfile(self.root / ENV, self.running / "env")

    def files(self) -> dict[str, bytes]:
        return {rel: (self.root / rel).read_bytes() for rel in (UNIT, ENV, "etc/kimi-deploy/kimi-test.toml")}

    def running_flags(self) -> dict[str, str]:
        return speed_model.flags_of((self.running / "unit").read_text(), (self.running / "env").read_text())

    def args(self, *extra: str) -> list[str]:
        return ["tune", "--profile", str(self.profile), "--root", str(self.root), "--host-systemd",
                "--gpu-facts", str(GPU_FACTS), "--model-facts", str(MODEL_FACTS), *LOAD, *extra]

    def journal(self) -> tj.TuneJournal | None:
        return tj.load(HostLayout(self.root).tune_dir("kimi-test"))

    @property
    def folder(self) -> Path:
        return HostLayout(self.root).tune_dir("kimi-test")


def model_goodput(values: dict) -> float:
    """The speed model's goodput of a closed loop of 8 clients (LOAD) with about 10 decode steps an answer: a batch
    cap below 8 queues requests past the TTFT SLO."""
    speed = speed_model.Speed(speed_model.flags_for(values))
    if speed.max_running < 8:
        return 0.0
    return 8 / (speed.ttft_ms + 10 * speed.step(8)) * 1000


SPACE = ["--space", "max_running_requests=4,8,16", "--space", "enable_pcie_ipc_allreduce=false,true",
         "--space", "chunked_prefill_size=2048,8192,16384", "--space", "mem_fraction_static=0.6,0.85"]


def test_tune_finds_the_optimum_never_ships_the_breaker_and_applies_the_winner(cli_runner, tmp_path, fake_systemd,
                                                                              speed_server):
    host = Host(tmp_path, fake_systemd, speed_server)
    result = cli_runner.invoke(cli, [*host.args(*SPACE, "--apply")], catch_exceptions=False)
    assert result.exit_code == 0, result.output + result.stderr
    report = json.loads((host.folder / "report.json").read_text())
    # the human report: the table (the winner starred), the verdict, what runs now, the commands
    assert any(line.startswith("*") for line in result.stdout.splitlines())
    assert "rejected: contract gate" in result.stdout and "running now: " in result.stdout
    assert "reproduce: kimi-deploy bench --base-url http://127.0.0.1:" in result.stdout
    # progress on stderr: candidate k of n, time left
    assert "candidate 2 of ~" in result.stderr and " left: " in result.stderr
    rows = {r["id"]: r for r in report["candidates"]}
    # pruned before any restart: the memory plan (0.6 cannot hold the weights) and nothing of it started
    assert report["pruned"] >= 18 and all(r["verdict"] == "pruned (memory)" for r in rows.values()
                                          if r["values"]["mem_fraction_static"] == 0.6)
    # the planted fast setting was measured only by its gate: rejected with the contract checks that failed
    planted = [r for r in rows.values() if r["values"]["chunked_prefill_size"] == 2048 and r["measurements"]]
    assert planted and all(r["verdict"] == "rejected: contract gate" for r in planted)
    assert any("contract.tool_auto" in r["detail"] for r in planted)
    assert report["winner_values"]["chunked_prefill_size"] != 2048
    assert host.running_flags().get("--chunked-prefill-size") != "2048"
    # the planted optimum: the model's best goodput among what fits and keeps tool calls; the winner is within 5 %
    # of it by the model, and by what tune measured, of the best it measured
    space = [dict(zip(("max_running_requests", "enable_pcie_ipc_allreduce", "chunked_prefill_size"), combo))
             for combo in itertools.product((4, 8, 16), (False, True), (8192, 16384))]
    optimum = max(model_goodput(v) for v in space)
    assert model_goodput(report["winner_values"]) >= 0.95 * optimum
    best = max((r for r in rows.values() if r["goodput"] is not None), key=lambda r: r["goodput"])
    assert rows[report["winner"]]["goodput"] >= 0.95 * best["goodput"]
    assert report["verdict"] in ("better beyond noise", "not distinguishable", "baseline")
    # the restarts the report counts are the ones systemd saw: each measured candidate's, each rejected one's
    # rollback, and at most one more to put the result in place; a pruned candidate was never started
    rollbacks = sum(1 for r in rows.values() if r["verdict"].startswith("rejected"))
    seen = fake_systemd.verbs().count("restart kimi-test.service")
    assert report["restarts"] + rollbacks <= seen <= report["restarts"] + rollbacks + 1
    assert all(r["measurements"] == 0 for r in rows.values() if r["verdict"].startswith("pruned"))
    # what runs now: the winner (with --apply and better beyond noise) or the original, and the files say so
    journal = host.journal()
    assert journal.phase == "done" and journal.live == report["deployed"]
    if report["deployed"] == report["baseline"]:
        assert host.files() == host.original_files
    else:
        assert host.running_flags()["--max-running-requests"] == str(report["winner_values"]["max_running_requests"])
    for name in ("report.json", "winner.toml", "winner.diff", "tune.png"):
        assert (host.folder / name).is_file(), name
    assert (host.folder / "tune.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report["reproduce"][0].startswith("kimi-deploy install --profile ")


def test_resume_after_sigkill_at_random_points_reruns_nothing_finished_and_loses_nothing(tmp_path, fake_systemd,
                                                                                          speed_server):
    host = Host(tmp_path, fake_systemd, speed_server)
    args = host.args("--space", "max_running_requests=4,16", "--space", "chunked_prefill_size=2048,8192",
                     "--space", "enable_pcie_ipc_allreduce=false,true")
    rng = random.Random(40)
    seen: dict[tuple[str, int], str] = {}  # (candidate, n) -> started_at of every finished measurement so far
    kills = 0
    code = reap(spawn_cli(args, kill_at=rng.randint(20, 120)))
    while code == -signal.SIGKILL and kills < 6:
        kills += 1
        journal = host.journal()
        if journal is not None:
            for m in journal.finished():
                assert seen.setdefault((m.candidate, m.n), m.started_at) == m.started_at, "a finished row changed"
        code = reap(spawn_cli([*args, "--resume"], kill_at=rng.randint(20, 160) if kills < 4 else None))
    assert kills >= 3
    if code != 0:
        code = reap(spawn_cli([*args, "--resume"]))
    assert code == 0
    journal = host.journal()
    finished = {(m.candidate, m.n): m.started_at for m in journal.finished()}
    assert len(finished) == len(journal.finished()), "a candidate was measured twice under one number"
    for key, started in seen.items():  # none lost, none re-run
        assert finished.get(key) == started, key
    assert journal.phase == "done" and journal.result["complete"]
    assert not (host.root / "etc/kimi-deploy/kimi-test.change").exists()  # no change of the host left in flight
    assert host.files() == host.original_files  # no --apply: the original is back
    assert host.running_flags()["--max-running-requests"] == "16"


def test_ctrl_c_puts_the_original_back_and_resume_continues(tmp_path, fake_systemd, speed_server, monkeypatch):
    host = Host(tmp_path, fake_systemd, speed_server)
    args = host.args("--space", "max_running_requests=4,8,16")
    from kimi_deploy.tune import run as tune_run

    real = tune_run.Tuner.bench
    calls = []

    def bench_then_ctrl_c(self, m, profile):
        calls.append(m.candidate)
        if len(calls) == 2:  # the first candidate after the baseline is live: Ctrl-C while it is measured
            raise KeyboardInterrupt
        return real(self, m, profile)

    monkeypatch.setattr(tune_run.Tuner, "bench", bench_then_ctrl_c)
    from click.testing import CliRunner

    result = CliRunner().invoke(cli, args)
    assert result.exit_code == ExitCode.INTERRUPTED, result.output
    assert host.files() == host.original_files
    assert host.running_flags()["--max-running-requests"] == "16"
    journal = host.journal()
    assert journal.interrupted == 1 and journal.live == journal.baseline
    assert [m.state for m in journal.finished()] == ["measured"]
    monkeypatch.setattr(tune_run.Tuner, "bench", real)
    result = CliRunner().invoke(cli, [*args, "--resume", "--json"])
    assert result.exit_code == 0, result.output
    journal = host.journal()
    assert journal.phase == "done" and journal.measurements[0].candidate == journal.baseline
    assert host.files() == host.original_files


def test_a_profile_other_than_the_installed_one_is_refused(cli_runner, tmp_path, fake_systemd, speed_server):
    host = Host(tmp_path, fake_systemd, speed_server)
    other = write_profile(tmp_path / "other.toml", port=1, gpu_count=8)
    result = cli_runner.invoke(cli, ["tune", "--profile", str(other), "--root", str(host.root), "--host-systemd",
                                     "--slo", "ttft=100"])
    assert result.exit_code == ExitCode.REFUSED, result.output
    assert "differs from the installed one" in result.stderr
    assert not host.folder.exists()


FLEET = """\
[service]
name = "kimi-test"
gpu_count = 8
python = "{python}"
timeout_start_sec = 600
[sglang]
model_path = "/models/moonshotai/Kimi-K2.5"
served_model_name = "moonshotai/Kimi-K2.5"
host = "0.0.0.0"
port = {port}
tp_size = 8
context_length = 1000
tool_call_parser = "kimi_k2"
reasoning_parser = "kimi_k2"
api_key_file = "/etc/kimi-deploy/kimi-test.api-key"
max_running_requests = 16
chunked_prefill_size = 8192
[fleet]
[[fleet.replicas]]
nodes = ["127.0.0.2"]
[[fleet.replicas]]
nodes = ["127.0.0.3"]
[gateway]
host = "127.0.0.1"
bind = "127.0.0.1"
port = {gateway}
"""


def test_a_replica_behind_a_gateway_is_drained_before_each_restart_and_back_after_its_gate(
        tmp_path, fake_systemd, speed_server, cli_runner):
    """--host 127.0.0.2: the replica leaves the gateway (smg's worker API, a loopback stand-in) before each restart
    and comes back after its gate; the rejected candidate's rollback passes, so it comes back too; the bench
    measures the replica's own URL (the timed server bound to 127.0.0.2)."""
    from loopback import Loopback, QuietHandler
    from replay_process import Replay

    python, _port, running = speed_server
    server = Replay(python, ["--tp-size", "8", "--no-speculative", "--speed-model", str(running), "--host",
                             "127.0.0.2"], tmp_path / "replica.log")
    port = int(server.url().rsplit(":", 1)[1])
    url = f"http://127.0.0.2:{port}"
    workers = {"w-1": {"id": "w-1", "url": url, "status": "ready", "is_healthy": True, "load": 0}}
    calls: list[str] = []

    class Gateway(QuietHandler):
        def do_GET(self):  # noqa: N802
            self._send(200, {"workers": list(workers.values()), "total": len(workers)})

        def do_DELETE(self):  # noqa: N802
            calls.append("remove")
            workers.pop(self.path.rsplit("/", 1)[1], None)
            self._send(202, {})

        def do_POST(self):  # noqa: N802
            calls.append("add")
            workers["w-1"] = {"id": "w-1", "url": url, "status": "ready", "is_healthy": True, "load": 0}
            self._send(201, {})

    try:
        with Loopback(Gateway) as gw:
            root = tmp_path / "root"
            key = root / "etc/kimi-deploy/kimi-test.api-key"
            key.parent.mkdir(parents=True)
            key.write_text("sk-tune\n")
            key.chmod(0o600)
            profile = tmp_path / "fleet.toml"
            profile.write_text(FLEET.format(python=python, port=port, gateway=gw.port))
            apply(plan_install(load_profile(profile), HostLayout(root), enable=False, create_user=False,
                               host="127.0.0.2"))
            shutil.copyfile(root / UNIT, running / "unit")
            shutil.copyfile(root / ENV, running / "env")
            fake_systemd.on("restart", f"#!{sys.executable}\nimport shutil\n"
                                       f"shutil.copyfile({str(root / UNIT)!r}, {str(running / 'unit')!r})\n"
                                       f"shutil.copyfile({str(root / ENV)!r}, {str(running / 'env')!r})\n")
            result = cli_runner.invoke(cli, ["tune", "--profile", str(profile), "--root", str(root),
                                             "--host-systemd", "--host", "127.0.0.2", *LOAD,
                                             "--space", "chunked_prefill_size=2048,8192", "--json"])
    finally:
        server.stop()
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["url"] == url
    planted = next(r for r in report["candidates"] if r["values"]["chunked_prefill_size"] == 2048)
    assert planted["verdict"] == "rejected: contract gate"
    # every restart was a drain: out before, back after (the rejected one's rollback passed, so back too)
    assert calls and calls == ["remove", "add"] * (len(calls) // 2)
    assert len(calls) // 2 == report["restarts"] + (report["deployed"] != report["baseline"])
    assert "w-1" in workers


def test_dry_run_shows_the_space_the_pruning_and_the_cost_and_restarts_nothing(cli_runner, tmp_path, fake_systemd,
                                                                                speed_server):
    host = Host(tmp_path, fake_systemd, speed_server)
    result = cli_runner.invoke(cli, [*host.args(*SPACE, "--dry-run", "--json")])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["space"] == 36 and plan["feasible"] == 18
    assert {row["stage"] for row in plan["pruned"]} == {"memory"}
    assert plan["restarts"] < plan["grid_restarts"] == 17
    assert plan["start_source"].startswith("a cold start on the reference host")
    human = cli_runner.invoke(cli, [*host.args(*SPACE, "--dry-run")])
    assert "pruned (memory): mem_fraction_static=0.6" in human.stdout and "dry run: nothing was restarted" in human.stdout
    assert fake_systemd.verbs() == [] and not host.folder.exists()


def test_ctrl_c_while_the_winner_goes_live_leaves_the_original_and_resume_finishes_the_report(tmp_path, fake_systemd,
                                                                                              speed_server,
                                                                                              monkeypatch):
    host = Host(tmp_path, fake_systemd, speed_server)
    args = host.args("--space", "enable_pcie_ipc_allreduce=false,true", "--apply")
    from click.testing import CliRunner

    from kimi_deploy.tune import run as tune_run

    real = tune_run.Tuner.restore
    asked = []

    def ctrl_c_at_the_end(self, target, why):
        asked.append(why)
        if why.startswith("apply"):
            raise KeyboardInterrupt
        return real(self, target, why)

    monkeypatch.setattr(tune_run.Tuner, "restore", ctrl_c_at_the_end)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == ExitCode.INTERRUPTED, result.output
    assert asked == ["apply: the winner", "interrupted"]
    journal = host.journal()
    assert journal.phase == "restoring" and journal.result["deployed"] == journal.baseline
    assert host.files() == host.original_files and "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" not in host.running_flags()
    monkeypatch.setattr(tune_run.Tuner, "restore", real)
    result = CliRunner().invoke(cli, [*args, "--resume", "--json"])
    assert result.exit_code == 0, result.output
    assert host.journal().phase == "done" and (host.folder / "report.json").is_file()
    assert host.files() == host.original_files
