"""Multi-node ranks: each rank's command and units (golden files, systemd-analyze verify) and SGLang 0.5.23's
own parser on every rank's command.

Regenerate the golden files after an intended change with exactly:

    KIMI_DEPLOY_UPDATE_GOLDEN=1 python -m pytest tests/test_ranks.py -k golden

and review the diff in git before committing.
"""

from __future__ import annotations

import copy
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kimi_deploy.launch import build_launch
from kimi_deploy.options import OPTIONS
from kimi_deploy.profile import parse_profile
from kimi_deploy.deployment import resolve
from kimi_deploy.targets.systemd import render_ranks
from kimi_deploy.topology import find_rank, group_ranks, serving_url
from kimi_deploy.validate import validate_profile, validate_server_args

GOLDEN = Path(__file__).parent / "golden" / "fleet" / "two-rank-group"
UPDATE = os.environ.get("KIMI_DEPLOY_UPDATE_GOLDEN") == "1"
TRUE = shutil.which("true") or "/bin/true"

#: A two-rank group with every serving option set: PP across the nodes (docs/runbook.md#multi-node-groups: over Ethernet).
TWO_RANKS = {
    "service": {"name": "kimi-k25", "python": "/opt/sglang/.venv/bin/python", "gpu_count": 8},
    "sglang": {"model_path": "/models/moonshotai/Kimi-K2.5", "served_model_name": "moonshotai/Kimi-K2.5",
               "host": "0.0.0.0", "port": 30000, "tp_size": 8, "pp_size": 2, "tool_call_parser": "kimi_k2",
               "reasoning_parser": "kimi_k2", "api_key_file": "/etc/kimi-deploy/kimi-k25.api-key",
               "enable_metrics": True, "trust_remote_code": True, "extra_args": ["--log-requests"]},
    "fleet": {"dist_init_port": 20000, "nic": "ens5f0", "dist_timeout": 1800,
              "replicas": [{"nodes": ["10.0.0.11", "10.0.0.12"]}]},
    "monitoring": {"runbook_url": "https://git.corp.test/ops/kimi-deploy/blob/main/docs/runbook.md"},
}


def profile_of(data=None, **changes):
    data = copy.deepcopy(data or TWO_RANKS)
    for table, values in changes.items():
        data[table].update(values)
    return parse_profile(data)


def _without(groups, names):
    return [g for g in groups if g[0] not in names]


def test_every_rank_runs_the_same_command_but_node_rank_and_serving_options():
    profile = profile_of()
    ranks = group_ranks(profile)
    assert [(r.replica, r.rank, r.node) for r in ranks] == [(0, 0, "10.0.0.11"), (0, 1, "10.0.0.12")]
    first, second = (resolve(profile).launch_of(r) for r in ranks)
    serving = {flag for o in OPTIONS if o.scope != "every rank" for flag in o.flags}
    assert serving >= {"--host", "--port", "--tool-call-parser", "--reasoning-parser", "--served-model-name",
                       "--config"}
    # rank 1 has no serving option at all; rank 0 has them, and without them both are the same but --node-rank
    assert not {g[0] for g in second.flag_groups()} & serving
    assert _without(first.flag_groups(), serving | {"--node-rank"}) == _without(second.flag_groups(), {"--node-rank"})
    assert ("--node-rank", "0") in first.flag_groups() and ("--node-rank", "1") in second.flag_groups()
    for launch in (first, second):
        groups = launch.flag_groups()
        assert ("--nnodes", "2") in groups and ("--dist-init-addr", "10.0.0.11:20000") in groups
        assert groups[-5:-3] == [("--log-requests",), ("--nnodes", "2")] and groups[-1] == ("--dist-timeout", "1800")
        env = dict(launch.env)
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "ens5f0"
    assert first.secrets_config == "/run/kimi-k25/sglang-secrets.yaml" and second.secrets_config is None


def test_each_replica_points_at_its_own_rank0():
    data = copy.deepcopy(TWO_RANKS)
    data["fleet"]["replicas"].append({"nodes": ["10.0.0.21", "10.0.0.22"]})
    profile = parse_profile(data)
    rank = find_rank(profile, "10.0.0.22")
    assert (rank.replica, rank.rank, rank.rank0) == (1, 1, "10.0.0.21")
    assert ("--dist-init-addr", "10.0.0.21:20000") in resolve(profile).launch_of(rank).flag_groups()
    assert serving_url(profile, rank) == "http://10.0.0.21:30000"
    assert set(render_ranks(profile)) == {"10.0.0.11", "10.0.0.12", "10.0.0.21", "10.0.0.22"}


def test_an_ipv6_rank0_is_bracketed_in_the_rendezvous_address():
    data = copy.deepcopy(TWO_RANKS)
    data["fleet"]["replicas"] = [{"nodes": ["fd00::11", "fd00::12"]}]
    data["sglang"]["host"] = "::"
    profile = parse_profile(data)
    launch = resolve(profile).launch_of(find_rank(profile, "fd00::12"))
    assert ("--dist-init-addr", "[fd00::11]:20000") in launch.flag_groups()


def test_single_host_profiles_have_no_ranks_and_no_rank_flags():
    data = copy.deepcopy(TWO_RANKS)
    data["fleet"] = {"replicas": [{"nodes": ["10.0.0.11"]}, {"nodes": ["10.0.0.12"]}]}
    data["sglang"]["pp_size"] = None
    del data["sglang"]["pp_size"]
    profile = parse_profile(data)
    assert group_ranks(profile) == () and render_ranks(profile) == {}
    flags = {g[0] for g in build_launch(profile).flag_groups()}
    assert not flags & {"--nnodes", "--node-rank", "--dist-init-addr", "--dist-timeout"}
    assert "NCCL_SOCKET_IFNAME" not in dict(build_launch(profile).env)


def test_a_node_that_is_not_in_the_fleet_is_a_usage_error():
    from kimi_deploy.errors import UsageError

    with pytest.raises(UsageError) as caught:
        find_rank(profile_of(), "10.0.0.99")
    assert "10.0.0.11, 10.0.0.12" in caught.value.hint


def test_an_empty_sglang_version_is_refused_on_every_rank_not_taken_for_the_default():
    """``render --sglang-version ""`` is exit 2 on one host; a rank's launch must not read "" as "the default"."""
    from kimi_deploy.errors import UsageError

    with pytest.raises(UsageError, match="not an SGLang version"):
        resolve(profile_of(), "")


def test_two_rank_group_matches_golden():
    hosts = render_ranks(profile_of())
    rendered = {f"{host}/{name}": text for host, files in hosts.items() for name, text in files.items()}
    if UPDATE:
        if GOLDEN.exists():
            shutil.rmtree(GOLDEN)
        for name, text in rendered.items():
            (GOLDEN / name).parent.mkdir(parents=True, exist_ok=True)
            (GOLDEN / name).write_text(text)
        pytest.skip(f"golden files rewritten in {GOLDEN}")
    expected = {p.relative_to(GOLDEN).as_posix(): p.read_text() for p in sorted(GOLDEN.rglob("*")) if p.is_file()}
    assert sorted(rendered) == sorted(expected)
    for name in expected:
        assert rendered[name] == expected[name], f"{name} differs from {GOLDEN / name}"


def test_rank_units_run_the_preflight_and_only_rank0_carries_http_parts():
    hosts = render_ranks(profile_of())
    leader, worker = hosts["10.0.0.11"], hosts["10.0.0.12"]
    assert sorted(worker) == ["kimi-k25.env", "kimi-k25.service"]
    assert sorted(leader) == ["kimi-deploy-check@kimi-k25.service", "kimi-deploy-check@kimi-k25.timer",
                              "kimi-k25.env", "kimi-k25.service"]
    for node, files in hosts.items():
        unit = files["kimi-k25.service"]
        assert (f"ExecStartPre=/usr/local/bin/kimi-deploy preflight --profile /etc/kimi-deploy/kimi-k25.toml "
                f"--host {node} --timeout 300") in unit
        assert unit.index("preflight --profile") < unit.index("ExecStart=")
        assert "GLOO_SOCKET_IFNAME=ens5f0" in files["kimi-k25.env"]
    assert "LoadCredential=" in leader["kimi-k25.service"] and "LoadCredential=" not in worker["kimi-k25.service"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing")
@pytest.mark.parametrize("hardening", ["standard", "strict"])
def test_every_rendered_rank_unit_passes_verify(tmp_path, hardening):
    """Every unit of every rank, with ExecStart=/ExecStartPre= binaries that exist here."""
    profile = profile_of(service={"python": sys.executable, "kimi_deploy": TRUE, "hardening": hardening})
    units = []
    for host, files in render_ranks(profile).items():
        for name, text in files.items():
            if name.endswith((".service", ".timer")):
                path = tmp_path / host / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                units.append(path)
    assert len(units) == 4  # rank 0: server + check service + timer; rank 1: server
    for host in {p.parent for p in units}:  # one host's units verify together (the timer needs its service)
        done = subprocess.run(["systemd-analyze", "verify", *map(str, sorted(host.iterdir()))],
                              capture_output=True, text=True)
        assert done.returncode == 0 and done.stderr.strip() == "", done.stderr


@pytest.mark.sglang
def test_every_rank_parses_with_sglangs_own_parser(sglang_python):
    profile = profile_of(service={"python": sglang_python})
    result = validate_profile(profile, sglang_python)
    assert result.ok, [r.validation.errors for r in result.ranks]
    assert [r.rank.rank for r in result.ranks] == [0, 1]
    for checked in result.ranks:
        assert "exact-names" in checked.validation.stages and "record" in checked.validation.stages
        args = checked.validation.server_args
        assert args[args.index("--node-rank") + 1] == str(checked.rank.rank)
    assert result.to_dict()["ranks"][1]["node"] == "10.0.0.12"


@pytest.mark.sglang
def test_an_abbreviated_option_is_rejected_though_argparse_accepts_it(sglang_python):
    launch = resolve(profile_of()).launch_of(group_ranks(profile_of())[1])
    args = [a if a != "--nnodes" else "--nnode" for a in launch.server_args]
    v = validate_server_args(sglang_python, args)
    assert "argparse" in v.stages and not v.ok  # SGLang's argparse took it
    assert v.errors == ("--nnode is an abbreviation of --nnodes: SGLang's argparse expands it, but a later "
                        "release may add an option that makes it ambiguous or another option; spell it out",)


@pytest.mark.sglang
def test_validate_cli_reports_each_rank(sglang_python, tmp_path):
    import tomli_w

    from helpers import run_cli

    data = copy.deepcopy(TWO_RANKS)
    data["service"]["python"] = sglang_python
    data["sglang"]["extra_args"] = ["--skip-server-warm"]
    path = tmp_path / "profile.toml"
    path.write_text(tomli_w.dumps(data))
    result = run_cli(["validate", "--profile", str(path)])
    assert result.exit_code == 1, result.stdout + result.stderr
    for rank in ("rank 0 (10.0.0.11)", "rank 1 (10.0.0.12)"):
        assert f"{rank}: error: --skip-server-warm is an abbreviation of --skip-server-warmup" in result.stdout


def test_local_rank_is_the_node_this_host_owns():
    from kimi_deploy.errors import UsageError
    from kimi_deploy.topology import local_rank

    profile = profile_of()
    assert local_rank(profile, owns=lambda host: host == "10.0.0.12").rank == 1
    assert local_rank(profile, owns=lambda host: False) is None  # an image tree, a workstation
    assert local_rank(profile, "10.0.0.11", owns=lambda host: False).rank == 0  # --host wins
    with pytest.raises(UsageError):
        local_rank(profile, owns=lambda host: True)
    single = parse_profile({**copy.deepcopy(TWO_RANKS), "fleet": {"replicas": [{"nodes": ["10.0.0.11"]}]},
                            "sglang": {**TWO_RANKS["sglang"], "pp_size": 1}})
    assert local_rank(single, owns=lambda host: True) is None


def test_restart_wait_on_a_rank_that_serves_no_http_is_refused_before_anything_runs(tmp_path, monkeypatch):
    from kimi_deploy.host import restart as restart_lib
    from kimi_deploy.facts import units as systemd
    from kimi_deploy.errors import UsageError
    from kimi_deploy.paths import HostLayout

    calls = []
    monkeypatch.setattr(systemd, "systemctl", lambda *a, **k: calls.append(a))
    with pytest.raises(UsageError) as caught:
        restart_lib.restart(resolve(profile_of(), launches=False), HostLayout(tmp_path), wait=True, node="10.0.0.12")
    assert "rank 1 of replica 0" in caught.value.message and "http://10.0.0.11:30000" in caught.value.hint
    assert calls == []


def test_check_on_a_rank_that_serves_no_http_names_rank0(tmp_path, monkeypatch):
    import tomli_w

    from helpers import run_cli
    from kimi_deploy import topology as ranks

    monkeypatch.setattr(ranks, "owns_address", lambda host: host == "10.0.0.12")
    path = tmp_path / "profile.toml"
    path.write_text(tomli_w.dumps(TWO_RANKS))
    result = run_cli(["check", "--profile", str(path)])
    assert result.exit_code == 2
    assert "serves none" in result.stderr and "http://10.0.0.11:30000" in result.stderr


def test_status_of_a_rank_that_serves_no_http_asks_no_health_and_compares_its_own_command():
    from kimi_deploy import __version__
    from kimi_deploy.host.records import Manifest
    from kimi_deploy.paths import HostLayout
    from kimi_deploy.wire.readiness import not_served
    from kimi_deploy.host.status import StatusFacts, status_from
    from kimi_deploy.facts.units import parse_show

    profile = profile_of()
    rank = find_rank(profile, "10.0.0.12")
    manifest = Manifest(kimi_deploy_version=__version__, service="kimi-k25", profile_sha256=profile.digest(),
                        sglang_version="0.5.23", files={}, cache_dir="/var/cache/kimi-k25",
                        state_dir="/var/lib/kimi-k25")
    running = list(resolve(profile).launch_of(rank).server_args)
    facts = StatusFacts(HostLayout(Path("/nonexistent/kimi-deploy-ranks")), {},
                        parse_show("ActiveState=active\nSubState=running\nMainPID=42\n"), None, None,
                        not_served("rank 1 serves no HTTP"), (running, "/proc/42/cmdline"),
                        {"state": "no_series"}, None, None, rank)
    report = status_from(resolve(profile), manifest, facts)
    assert report.health["ready"] is None
    assert not any("not ready" in p for p in report.problems), report.problems
    assert report.launch.in_sync, (report.launch.missing, report.launch.unexpected)


def test_owns_address_binds_without_sending():
    from kimi_deploy.topology import owns_address

    assert owns_address("127.0.0.1")
    assert not owns_address("192.0.2.1")  # TEST-NET-1 (RFC 5737): never a local address here
    assert not owns_address("no-such-host.invalid")
    assert owns_address(socket.gethostname().upper())  # this machine's name, however spelt, resolved or not


def test_render_of_a_multi_node_profile_is_rank0_of_the_first_replica():
    from kimi_deploy.targets.systemd import render

    profile = profile_of()
    assert dict(render(profile).files) == render_ranks(profile)["10.0.0.11"]


@pytest.mark.parametrize(("args", "said"), [
    (["--host", "10.0.0.99"], "not a node of the profile"),
    (["--host", "10.0.0.12", "--timeout", "nan"], "not a number"),
    (["--host", "10.0.0.12", "--timeout", "inf"], "not in the range"),
    (["--host", "10.0.0.12", "--python", "/nonexistent/python"], "does not exist"),
])
def test_preflight_usage_errors_exit_2_without_running_anything(tmp_path, args, said):
    import tomli_w

    from helpers import run_cli

    path = tmp_path / "profile.toml"
    path.write_text(tomli_w.dumps(TWO_RANKS))
    result = run_cli(["preflight", "--profile", str(path), *args])
    assert result.exit_code == 2 and said in result.stderr, result.stderr


def test_preflight_of_a_single_host_profile_says_there_are_no_ranks(tmp_path):
    from helpers import MINIMAL, run_cli, write_profile

    result = run_cli(["preflight", "--profile", str(write_profile(tmp_path, MINIMAL)), "--host", "10.0.0.11"])
    assert result.exit_code == 2 and "no multi-node replica" in result.stderr


def test_preflight_in_an_interpreter_without_torch_says_so(tmp_path):
    """The kit's own interpreter has no torch: the script stops with one line, not a traceback (the NIC and
    address stages pass first: loopback is the NIC and 127.0.0.1 is owned, a rank-1 view of a test group)."""
    from kimi_deploy.host import preflight as preflight_lib
    from kimi_deploy.topology import Rank

    try:
        import torch  # noqa: F401
        pytest.skip("this interpreter has torch")
    except ImportError:
        pass
    data = copy.deepcopy(TWO_RANKS)
    data["fleet"]["nic"] = "lo"
    result = preflight_lib.preflight(parse_profile(data), Rank(0, 1, ("10.0.0.11", "127.0.0.1")), timeout=1,
                                     python=sys.executable)
    assert not result.ok and result.stage == "store" and result.stages == ("address", "nic")
    assert "torch does not import" in result.error and "--python" in result.fix


def test_render_out_writes_each_ranks_folder_and_the_monitoring_files_once(tmp_path):
    import tomli_w

    from helpers import run_cli

    path = tmp_path / "profile.toml"
    path.write_text(tomli_w.dumps(TWO_RANKS))
    out = tmp_path / "out"
    result = run_cli(["render", "--profile", str(path), "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    written = {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*")
               if p.is_file() and p.name != ".kimi-deploy-render.json"}  # render's record of the folder
    golden = {p.relative_to(GOLDEN).as_posix(): p.read_text() for p in GOLDEN.rglob("*") if p.is_file()}
    assert {k: v for k, v in written.items() if not k.startswith("monitoring/")} == golden
    assert "monitoring/prometheus.yml" in written


def test_install_of_a_rank_installs_that_ranks_unit():
    from kimi_deploy.host.install.files import desired_files

    files, _ = desired_files(profile_of(), host="10.0.0.12")
    unit = files["/etc/systemd/system/kimi-k25.service"].decode()
    assert "--node-rank 1" in unit and "--host 0.0.0.0" not in unit
    assert not any("kimi-deploy-check" in name for name in files)


def test_a_rank_that_serves_no_http_installs_without_the_api_key(tmp_path):
    """Ranks >= 1 load no credential (no API, no check): their install neither needs nor creates the key, so
    the secret lives only on the hosts that use it (rank 0, the gateway host)."""
    from helpers import run_cli

    from kimi_deploy.profile import dump_profile

    profile = tmp_path / "group.toml"
    profile.write_text(dump_profile(profile_of()))
    for host, needs in (("10.0.0.12", False), ("10.0.0.11", True)):
        root = tmp_path / f"root-{host}"
        root.mkdir()
        result = run_cli(["install", "--profile", str(profile), "--root", str(root), "--host", host,
                          "--no-create-user", "--no-enable"])
        if needs:
            assert result.exit_code == 2 and "every host of a fleet must hold the same key" in result.stderr
        else:
            assert result.exit_code == 0, result.stderr
            assert not (root / "etc/kimi-deploy/kimi-k25.api-key").exists()
            assert "LoadCredential" not in (root / "etc/systemd/system/kimi-k25.service").read_text()
