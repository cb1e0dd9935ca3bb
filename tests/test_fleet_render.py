"""render --out DIR with [fleet]/[gateway]: one folder per host, the gateway unit (hardened, no GPU, key by
credential, metrics on loopback, workers from the fleet), smg flags checked against the pinned smg's own
--help, and install --host putting exactly that host's part in place.

Regenerate the golden files after an intended change with exactly:

    KIMI_DEPLOY_UPDATE_GOLDEN=1 python -m pytest tests/test_fleet_render.py

and review the diff in git before committing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import run_cli, write_profile
from kimi_deploy import topology
from kimi_deploy import validate
from kimi_deploy.host import gateway
from kimi_deploy.errors import UsageError
from kimi_deploy.profile import parse_profile

GOLDEN = Path(__file__).parent / "golden" / "fleet" / "two-replicas-gateway"
UPDATE = os.environ.get("KIMI_DEPLOY_UPDATE_GOLDEN") == "1"
HELP = (Path(__file__).parent / "data" / "smg-1.13.0-launch-help.txt").read_text()
TRUE = shutil.which("true") or "/bin/true"

PROFILE = """\
[service]
name = "kimi-k25"
gpu_count = 8

[sglang]
model_path = "/models/moonshotai/Kimi-K2.5"
served_model_name = "moonshotai/Kimi-K2.5"
host = "0.0.0.0"
tp_size = 8
tool_call_parser = "kimi_k2"
reasoning_parser = "kimi_k2"
api_key_file = "/etc/kimi-deploy/kimi-k25.api-key"

[fleet]
[[fleet.replicas]]
nodes = ["10.0.0.11"]
[[fleet.replicas]]
nodes = ["10.0.0.12"]

[gateway]
host = "10.0.0.10"
"""


def _tree(directory: Path) -> dict[str, str]:
    """The rendered files (render's own record of the folder, ``.kimi-deploy-render.json``, left out)."""
    return {p.relative_to(directory).as_posix(): p.read_text() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name != ".kimi-deploy-render.json"}


def _render(tmp_path: Path, text: str = PROFILE) -> Path:
    out = tmp_path / "out"
    result = run_cli(["render", "--profile", str(write_profile(tmp_path, text)), "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    return out


def test_two_replicas_and_a_gateway_match_golden(tmp_path):
    rendered = _tree(_render(tmp_path))
    assert sorted({name.split("/")[0] for name in rendered}) == ["10.0.0.10", "10.0.0.11", "10.0.0.12"]
    if UPDATE:
        shutil.rmtree(GOLDEN, ignore_errors=True)
        for name, text in rendered.items():
            (GOLDEN / name).parent.mkdir(parents=True, exist_ok=True)
            (GOLDEN / name).write_text(text)
        pytest.skip(f"golden files rewritten in {GOLDEN}")
    assert _tree(GOLDEN) == rendered


def test_each_host_folder_holds_exactly_its_part(tmp_path):
    tree = _tree(_render(tmp_path))
    for node in ("10.0.0.11", "10.0.0.12"):
        assert sorted(n.split("/", 1)[1] for n in tree if n.startswith(node + "/")) == [
            "kimi-deploy-check@kimi-k25.service", "kimi-deploy-check@kimi-k25.timer", "kimi-k25.env",
            "kimi-k25.service"]
    assert sorted(n for n in tree if n.startswith("10.0.0.10/")) == [
        "10.0.0.10/kimi-deploy-check@kimi-k25-gateway.service", "10.0.0.10/kimi-deploy-check@kimi-k25-gateway.timer",
        "10.0.0.10/kimi-k25-gateway.service"]
    nightly = tree["10.0.0.10/kimi-deploy-check@kimi-k25-gateway.service"]
    assert "ExecStart=/usr/local/bin/kimi-deploy check --profile /etc/kimi-deploy/kimi-k25.toml --each-worker " \
           "--deadline 2940 --api-key-file %d/api-key --json /var/lib/kimi-k25-gateway/check-workers.json" in nightly
    # one --deadline for the whole run (1380 s per worker and 180 s through the gateway: kimi_deploy/catalog/
    # check_budget.py), the unit's timeout 180 s past it
    assert "DynamicUser=yes" in nightly and "TimeoutStartSec=3120" in nightly
    # one folder for a host that is both a node and the gateway
    both = PROFILE.replace('host = "10.0.0.10"', 'host = "10.0.0.11"\nport = 8000')
    tree = _tree(_render(tmp_path / "both", both))
    assert {"kimi-k25-gateway.service", "kimi-k25.service"} <= {n.split("/", 1)[1] for n in tree
                                                                if n.startswith("10.0.0.11/")}
    assert not any(n.startswith("10.0.0.10/") for n in tree)


def test_one_host_spelt_two_ways_gets_one_folder_with_both_parts(tmp_path):
    """The gateway on a node written another way (FD00:0::11 for fd00::11) is that node: one folder, spelt as
    the node, holding the server and the gateway; --host in either spelling picks it."""
    text = PROFILE.replace("10.0.0.11", "fd00::11").replace('host = "10.0.0.10"', 'host = "FD00:0::11"\nport = 8000')
    tree = _tree(_render(tmp_path, text))
    assert sorted({n.split("/")[0] for n in tree} - {"monitoring"}) == ["10.0.0.12", "fd00::11"]
    assert {"kimi-k25-gateway.service", "kimi-k25.service"} <= {n.split("/", 1)[1] for n in tree
                                                                if n.startswith("fd00::11/")}
    profile = parse_profile(__import__("tomllib").loads(text))
    assert topology.pick_host(profile, "FD00:0::11") == topology.pick_host(profile, "fd00::11") == "fd00::11"
    assert topology.is_node(profile, "FD00::11")


def test_gateway_unit_lists_the_workers_and_keeps_the_key_and_gpus_out(tmp_path):
    unit = (_render(tmp_path) / "10.0.0.10" / "kimi-k25-gateway.service").read_text()
    assert "--worker-urls http://10.0.0.11:30000 http://10.0.0.12:30000" in unit
    assert "--prometheus-host 127.0.0.1" in unit and "--disable-tokenizer-autoload" in unit
    assert "LoadCredential=api-key:/etc/kimi-deploy/kimi-k25.api-key" in unit
    assert "--api-key" not in unit.split("main(sys.argv[1:] + ['--api-key', key])")[1]  # only inside the launcher
    assert "PrivateDevices=yes" in unit and "DevicePolicy=closed" in unit and "DeviceAllow" not in unit
    assert "nvidia" not in unit and "DynamicUser=yes" in unit


def test_without_a_key_the_gateway_runs_the_smg_script(tmp_path):
    text = PROFILE.replace('api_key_file = "/etc/kimi-deploy/kimi-k25.api-key"', "allow_unauthenticated = true")
    unit = (_render(tmp_path, text) / "10.0.0.10" / "kimi-k25-gateway.service").read_text()
    assert "ExecStart=/opt/smg/.venv/bin/smg launch \\" in unit and "LoadCredential" not in unit


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing")
def test_every_fleet_unit_passes_verify_and_the_gateway_exposure_is_low(tmp_path):
    """systemd-analyze verify on every host's units (ExecStart= binaries that exist here), and the gateway's
    exposure (systemd-analyze security --offline=yes) at most 1.5: measured 1.3 with systemd 252."""
    smg = tmp_path / "venv" / "bin"
    smg.mkdir(parents=True)
    for name in ("smg", "python"):
        (smg / name).symlink_to(TRUE)
    text = PROFILE.replace('gpu_count = 8', f'gpu_count = 8\npython = "{sys.executable}"\nkimi_deploy = "{TRUE}"')
    text += f'smg = "{smg / "smg"}"\n'
    out = _render(tmp_path, text)
    units = sorted(str(p) for p in out.rglob("*") if p.suffix in (".service", ".timer"))
    assert len(units) == 9
    for host in ("10.0.0.10", "10.0.0.11", "10.0.0.12"):  # one host's units at a time, as each host has them
        done = subprocess.run(["systemd-analyze", "verify", *[u for u in units if f"/{host}/" in u]],
                              capture_output=True, text=True)
        assert done.returncode == 0 and done.stderr.strip() == "", done.stderr
    done = subprocess.run(["systemd-analyze", "security", "--offline=yes",
                           str(out / "10.0.0.10" / "kimi-k25-gateway.service")], capture_output=True, text=True)
    score = float(re.search(r"Overall exposure level for \S+: (\d+\.\d+)", done.stdout).group(1))
    assert score <= 1.5, done.stdout


def test_gateway_flags_are_exact_options_of_the_pinned_smg():
    """The rendered smg arguments are option names smg 1.13.0's own --help lists (recorded output);
    abbreviations and unknown names are refused; the policy is one of its choices."""
    known = validate.parse_help_options(HELP)
    assert {"--host", "--port", "--policy", "--worker-urls", "--prometheus-host", "--prometheus-port",
            "--disable-tokenizer-autoload", "--api-key", "--cache-match-threshold", "--model"} <= known
    profile = parse_profile(__import__("tomllib").loads(PROFILE))
    assert validate.validate_gateway(profile, HELP) == []
    assert validate.flag_problems(["--polic", "x", "--worker-url", "y", "--port=1"], known) == [
        "--polic: not an option of this smg (its `launch --help` lists no such name)",
        "--worker-url: not an option of this smg (its `launch --help` lists no such name)"]
    assert "round_robin" in validate.policy_choices(HELP)
    bad = parse_profile(__import__("tomllib").loads(PROFILE + 'policy = "fastest"\n'))
    assert validate.validate_gateway(bad, HELP) == [
        "gateway.policy: 'fastest' is not one of this smg's policies (random, round_robin, passthrough, "
        "cache_aware, power_of_two, least_load, manual, consistent_hashing, prefix_hash)"]


def test_pick_host_by_flag_or_the_one_host_this_machine_is():
    profile = parse_profile(__import__("tomllib").loads(PROFILE))
    nobody = lambda host: False  # noqa: E731
    assert topology.pick_host(profile, "10.0.0.12", nobody) == "10.0.0.12"
    assert topology.pick_host(profile, None, lambda host: host == "10.0.0.10") == "10.0.0.10"
    with pytest.raises(UsageError, match="not a host of the profile"):
        topology.pick_host(profile, "10.0.0.99", nobody)
    with pytest.raises(UsageError, match="matching: none"):
        topology.pick_host(profile, None, nobody)
    with pytest.raises(UsageError, match="matching: 10.0.0.11, 10.0.0.10"):  # the profile's order
        topology.pick_host(profile, None, lambda host: host in ("10.0.0.10", "10.0.0.11"))
    # the default rule is local_rank's (topology.owns_address): none of the documentation addresses is this host
    with pytest.raises(UsageError, match="matching: none"):
        topology.pick_host(profile, None)


def test_a_dry_run_on_a_fleet_host_without_the_key_file_shows_the_plan_and_says_so(tmp_path):
    """New-operator trial (#30 item 6): `install --dry-run` on a host of a fleet without the key file refused
    (exit 2) before showing anything. It now shows the plan, warns, then exits 2 with the real run's error; the
    real install still refuses, and neither creates a key (every host must hold the first one's)."""
    import json

    profile = write_profile(tmp_path, PROFILE)
    root = tmp_path / "10.0.0.11"
    root.mkdir()
    args = ["install", "--profile", str(profile), "--root", str(root), "--host", "10.0.0.11", "--no-enable",
            "--no-create-user"]
    shown = run_cli([*args, "--dry-run"])
    assert shown.exit_code == 2, shown.output
    assert "/etc/systemd/system/kimi-k25.service" in shown.stdout and "dry run: nothing was changed" in shown.stdout
    assert "warning: the API key file /etc/kimi-deploy/kimi-k25.api-key is missing" in shown.stdout
    assert "create the API key file" not in shown.stdout
    assert "every host of a fleet must hold the same key" in shown.stderr
    as_json = run_cli([*args, "--dry-run", "--json"])
    assert as_json.exit_code == 2 and "every host of a fleet" in as_json.stderr
    plan = json.loads(as_json.stdout)
    assert not plan["applied"] and any("is missing" in n for n in plan["notes"])
    assert not any(p.is_file() for p in root.rglob("*"))  # nothing written by either
    real = run_cli(args)
    assert real.exit_code == 2 and "every host of a fleet must hold the same key" in real.stderr
    assert not any(p.is_file() for p in root.rglob("*"))


def test_install_puts_each_hosts_part_in_place_and_a_second_run_plans_nothing(tmp_path):
    profile = write_profile(tmp_path, PROFILE)
    for host, unit in (("10.0.0.10", "kimi-k25-gateway.service"), ("10.0.0.11", "kimi-k25.service")):
        root = tmp_path / host
        key = root / "etc" / "kimi-deploy" / "kimi-k25.api-key"
        args = ["install", "--profile", str(profile), "--root", str(root), "--host", host, "--no-enable",
                "--no-create-user"]
        key.parent.mkdir(parents=True)
        missing = run_cli(args)  # the key is never created on one host of a fleet: every host needs the same
        assert missing.exit_code == 2 and "every host of a fleet must hold the same key" in missing.stderr
        key.write_text("sk-fleet\n")
        key.chmod(0o600)
        assert run_cli(args).exit_code == 0
        units = sorted(p.name for p in (root / "etc" / "systemd" / "system").iterdir())
        assert unit in units and ("kimi-k25.service" in units) == (host != "10.0.0.10")
        assert ("kimi-deploy-check@kimi-k25-gateway.timer" in units) == (host == "10.0.0.10")
        again = run_cli(args)
        assert again.exit_code == 0 and "nothing to do" in again.stdout
        assert key.read_text() == "sk-fleet\n"


def test_install_of_a_fleet_needs_to_know_the_host(tmp_path):
    (tmp_path / "r").mkdir()
    result = run_cli(["install", "--profile", str(write_profile(tmp_path, PROFILE)), "--root", str(tmp_path / "r"),
                      "--host", "10.0.0.99", "--no-enable"])
    assert result.exit_code == 2 and "use one of 10.0.0.11, 10.0.0.12, 10.0.0.10" in result.stderr


def test_status_problems_of_the_gateways_view():
    ready = gateway.Worker("1", "http://10.0.0.11:30000", "ready", True)
    expected = ["http://10.0.0.11:30000", "http://10.0.0.12:30000"]
    assert gateway.view_problems(expected[:1], [ready]) == []
    problems = gateway.view_problems(expected, [ready, gateway.Worker("3", "http://10.0.0.99:30000", "ready", True)])
    assert problems[0].startswith("http://10.0.0.12:30000 is not in the gateway's rotation")
    assert problems[1].startswith("the gateway routes to http://10.0.0.99:30000, which the profile does not list")
    sick = gateway.Worker("2", "http://10.0.0.12:30000", "draining", False)
    assert gateway.view_problems(expected, [ready, sick]) == [
        "http://10.0.0.12:30000 is draining, unhealthy in the gateway (GET /workers); fix: `kimi-deploy status` "
        "and `journalctl` on that node"]


def test_validate_gateway_asks_the_pinned_smg_itself(tmp_path, smg_path):
    """validate --gateway runs the real smg 1.13.0: its --version is the pin, its --help has every option."""
    text = PROFILE + f'smg = "{smg_path}"\n'
    profile = write_profile(tmp_path, text)
    ok = run_cli(["validate", "--profile", str(profile), "--gateway", "--json"])
    assert ok.exit_code == 0, ok.stdout + ok.stderr
    data = __import__("json").loads(ok.stdout)
    assert data["ok"] and "1.13.0" in data["version"]
    pinned = write_profile(tmp_path, text + 'version = "1.12.0"\npolicy = "fastest"\n', "pinned.toml")
    bad = run_cli(["validate", "--profile", str(pinned), "--gateway"])
    assert bad.exit_code == 1
    assert "gateway.version: the profile pins smg 1.12.0" in bad.stdout and "'fastest' is not one of" in bad.stdout


def test_validate_gateway_with_an_smg_that_fails_names_the_pinned_install(tmp_path):
    text = PROFILE + f'smg = "{shutil.which("false") or "/bin/false"}"\n'
    result = run_cli(["validate", "--profile", str(write_profile(tmp_path, text)), "--gateway"])
    assert result.exit_code == 5 and "Traceback" not in result.stderr
    assert "fix: [gateway] smg must be the pinned smg" in result.stderr and "pip install smg==1.13.0" in result.stderr
