"""``render --target ansible`` (issue 39): the inventory, playbook and tasks a fleet is rolled with.

What the files say (groups, the batches, the gate, the key's handling, every task named) is read from the
rendered YAML; the real ``ansible-playbook --syntax-check`` / ``--list-tasks`` and ``ansible-lint`` (production
profile) of the Ansible test environment (tests/ansible_env.py) read them as Ansible does. The roll against booted
hosts is tests/test_container_ansible.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from ansible_env import run_tool
from kimi_deploy.cli import cli
from kimi_deploy.errors import ProfileError, UsageError
from kimi_deploy.profile import parse_profile
from kimi_deploy.targets import ansible, registry

SGLANG = {"model_path": "/models/Kimi-K2.5", "served_model_name": "moonshotai/Kimi-K2.5", "host": "0.0.0.0",
          "tp_size": 8, "tool_call_parser": "kimi_k2", "reasoning_parser": "kimi_k2",
          "api_key_file": "/etc/kimi-deploy/kimi-k25.api-key"}


def fleet(replicas=(("10.1.0.11",), ("10.1.0.12",)), gateway="10.1.0.10", rollout=None, sglang=(), **fleet_keys):
    data = {"service": {"name": "kimi-k25", "gpu_count": 8, "timeout_start_sec": 1200},
            "sglang": {**SGLANG, **dict(sglang)},
            "fleet": {"replicas": [{"nodes": list(nodes)} for nodes in replicas], **fleet_keys}}
    if gateway:
        data["gateway"] = {"host": gateway}
    if rollout is not None:
        data["rollout"] = rollout
    return parse_profile(data)


def multi_node():
    return fleet(replicas=(("10.1.0.11", "10.1.0.21"), ("10.1.0.12", "10.1.0.22")), dist_init_port=20000,
                 nic="ens5f0", sglang={"pp_size": 2})


def rendered(profile) -> dict[str, object]:
    files = registry.render("ansible", profile).files
    return {name: (text if name.endswith(".toml") else yaml.safe_load(text)) for name, text in files.items()}


def plays(files):
    return {play["hosts"]: play for play in files["site.yml"][:2]}


def tasks(files):
    return [t for name in ansible.TASK_FILES for t in files[f"tasks/{name}"]]


def flat(task_list):
    for task in task_list:
        yield task
        yield from flat(task.get("block", []) + task.get("always", []))


def test_the_inventory_has_the_fleets_groups_and_each_hosts_name_in_the_profile():
    inv = rendered(fleet())["inventory.yml"]["all"]["children"]["kimi_fleet"]
    groups = inv["children"]
    assert set(groups["kimi_nodes"]["hosts"]) == {"10.1.0.11", "10.1.0.12"}
    assert groups["kimi_replicas"]["hosts"] == {
        "10.1.0.11": {"kimi_worker_url": "http://10.1.0.11:30000", "kimi_group": ["10.1.0.11"]},
        "10.1.0.12": {"kimi_worker_url": "http://10.1.0.12:30000", "kimi_group": ["10.1.0.12"]}}
    assert groups["kimi_gateway"]["hosts"] == {"10.1.0.10": {"kimi_host": "10.1.0.10", "kimi_serves": True}}
    assert inv["vars"]["kimi_min_healthy"] == 1 and inv["vars"]["kimi_roll_all"] is False
    assert inv["vars"]["kimi_installed_profile"] == "/etc/kimi-deploy/kimi-k25.toml"


def test_multi_node_replicas_get_a_group_each_with_their_ranks():
    groups = rendered(multi_node())["inventory.yml"]["all"]["children"]["kimi_fleet"]["children"]
    assert set(groups["kimi_replicas"]["hosts"]) == {"10.1.0.11", "10.1.0.12"}  # rank 0 of each: what rolls
    assert groups["kimi_replicas"]["hosts"]["10.1.0.11"]["kimi_group"] == ["10.1.0.11", "10.1.0.21"]
    assert set(groups["kimi_replica_0"]["hosts"]) == {"10.1.0.11", "10.1.0.21"}
    nodes = groups["kimi_nodes"]["hosts"]
    assert (nodes["10.1.0.21"]["kimi_rank"], nodes["10.1.0.21"]["kimi_serves"]) == (1, False)  # no key on rank 1
    # the roll restarts ranks >= 1 only after rank 0 restarted (rank 0 last to serve)
    names = [t["name"] for t in rendered(multi_node())["tasks/roll.yml"]]
    assert names.index("Roll | wait until rank 0 restarted (multi-node group)") < names.index(
        "Roll | restart the group's ranks after rank 0 (multi-node group; they rejoin it)") < names.index(
        "Roll | wait for the gate's verdict (the replica is back in rotation, or rolled back)")


def test_the_roll_stops_at_the_first_failure_in_batches_the_profile_sets():
    files = rendered(fleet())
    roll = plays(files)["kimi_replicas"]
    assert (roll["serial"], roll["max_fail_percentage"], roll["any_errors_fatal"]) == ([1], 0, True)
    assert [p["hosts"] for p in files["site.yml"]] == ["kimi_gateway", "kimi_replicas", "kimi_gateway"]
    assert files["site.yml"][-1]["name"].startswith("Install the gateway host last")
    ramp = plays(rendered(fleet(rollout={"serial": [1, "25%"], "min_healthy": 1})))["kimi_replicas"]
    assert ramp["serial"] == [1, "25%"]


def test_the_restart_is_the_kits_drain_restart_gate_and_rollback_with_a_longer_ansible_bound():
    files = rendered(fleet(rollout={"drain_timeout_sec": 900}))
    (restart,) = [t for t in files["tasks/roll.yml"] if "async" in t]
    argv = restart["ansible.builtin.command"]["argv"]
    assert argv[1] == "restart" and {"--wait", "--rollback-on-failure"} <= set(argv)
    assert argv[argv.index("--gate") + 1] == "contract"
    assert argv[argv.index("--drain-timeout") + 1] == "{{ kimi_drain_timeout }}"
    inv_vars = files["inventory.yml"]["all"]["children"]["kimi_fleet"]["vars"]
    kit_bound = 900 + 2 * (1200 + ansible.GATE_ALLOWANCE_SEC)  # the drain, the start and the rollback's, gated
    assert inv_vars["kimi_roll_timeout"] > kit_bound and inv_vars["kimi_drain_timeout"] == 900


def test_every_task_is_named_and_the_key_is_0600_and_never_logged():
    files = rendered(fleet())
    every = list(flat(tasks(files))) + [t for play in files["site.yml"] for t in play["tasks"]]
    assert all(t.get("name") for t in every), [t for t in every if not t.get("name")]
    names = [t["name"] for t in every]
    assert len(names) == len(set(names))  # an operator greps one name and finds one task
    (key,) = [t for t in every if t.get("ansible.builtin.copy", {}).get("dest") == "{{ kimi_api_key_file }}"]
    assert key["no_log"] is True and key["diff"] is False and key["ansible.builtin.copy"]["mode"] == "0600"


def test_the_profile_travels_with_the_playbook():
    profile = fleet()
    text = rendered(profile)["files/kimi-k25.toml"]
    import tomllib
    assert parse_profile(tomllib.loads(text)).digest() == profile.digest()


def test_a_profile_without_a_fleet_or_with_no_replica_to_spare_is_refused():
    one_host = parse_profile({"service": {"name": "kimi-k25"}, "sglang": dict(SGLANG, host="127.0.0.1")})
    with pytest.raises(UsageError, match="one host"):
        registry.render("ansible", one_host)
    with pytest.raises(ProfileError, match="min_healthy"):
        registry.render("ansible", fleet(rollout={"min_healthy": 2}))
    single = rendered(fleet(replicas=(("10.1.0.11",),)))["inventory.yml"]
    assert single["all"]["children"]["kimi_fleet"]["vars"]["kimi_min_healthy"] == 0


@pytest.mark.parametrize("serial", [[0], ["0%"], ["101%"], [True], ["25"], []])
def test_a_serial_step_that_is_not_a_count_or_a_percentage_is_an_error(serial):
    with pytest.raises(ProfileError) as raised:
        fleet(rollout={"serial": serial})
    assert any(p.startswith("rollout.serial") for p in raised.value.problems), raised.value.problems


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    """``render --target ansible --out`` of a two-replica fleet (serial ``[1, "25%"]``), through the CLI."""
    folder = tmp_path_factory.mktemp("ansible") / "rendered"
    profile = tmp_path_factory.mktemp("profile") / "fleet.toml"
    from kimi_deploy.profile import dump_profile
    profile.write_text(dump_profile(fleet(rollout={"serial": [1, "25%"]})))
    from click.testing import CliRunner
    result = CliRunner().invoke(cli, ["render", "--profile", str(profile), "--target", "ansible", "--out",
                                      str(folder), "--json"])
    assert result.exit_code == 0, result.output
    assert set(json.loads(result.stdout)["files"]) == {"inventory.yml", "site.yml", "tasks/new_gateway.yml",
                                                       "tasks/install.yml", "tasks/roll.yml", "tasks/gateway.yml",
                                                       "files/kimi-k25.toml"}
    return folder


def test_ansible_playbook_reads_the_rendered_files(out):
    syntax = run_tool("ansible-playbook", "-i", "inventory.yml", "site.yml", "--syntax-check", cwd=out)
    assert syntax.returncode == 0, syntax.stdout + syntax.stderr
    listed = run_tool("ansible-playbook", "-i", "inventory.yml", "site.yml", "--list-hosts", "--list-tasks", cwd=out)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "Roll | drain, restart, gate and roll back on failure (kimi-deploy restart --wait)" in listed.stdout
    assert "hosts (2):" in listed.stdout and "10.1.0.10" in listed.stdout


def test_ansible_lint_production_profile_passes(out):
    lint = run_tool("ansible-lint", "--offline", "--profile", "production", "--nocolor", "site.yml", "tasks",
                    "inventory.yml", cwd=out)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "Profile 'production' was required, and it passed" in lint.stdout + lint.stderr


def test_a_batch_is_planned_guarded_installed_then_restarted_and_check_mode_restarts_nothing():
    roll = rendered(fleet())["tasks/roll.yml"]
    names = [t["name"] for t in roll]
    order = ["Roll | plan the install of each node of this replica",
             "Roll | capacity guard, read the gateway's workers",
             "Roll | capacity guard, probe the other workers' /health from the gateway host",
             "Roll | capacity guard, enough healthy workers besides this batch",
             "Roll | install each node of this replica",
             "Roll | drain, restart, gate and roll back on failure (kimi-deploy restart --wait)"]
    assert [names.index(n) for n in order] == sorted(names.index(n) for n in order)
    plan, install = roll[names.index(order[0])], roll[names.index(order[4])]
    assert plan["vars"]["kimi_dry_run"] is True and install["vars"]["kimi_dry_run"] is False
    (decide,) = [t for t in roll if "kimi_roll_needed" in t.get("ansible.builtin.set_fact", {})]
    assert decide["ansible.builtin.set_fact"]["kimi_roll_needed"].startswith("{{ not ansible_check_mode and")
    restart = roll[names.index(order[5])]
    assert restart["when"] == "kimi_roll_needed" and restart["poll"] == 0  # an async job: a Ctrl-C leaves it be


def test_no_profile_value_can_reach_ansibles_templating():
    """Every string the inventory carries from the profile is a validated host, path or unit stem (no ``{`` or
    ``%``): only the kit's own ``{{ playbook_dir }}`` paths are templates."""
    fleet_vars = rendered(fleet())["inventory.yml"]["all"]["children"]["kimi_fleet"]["vars"]
    templated = {k for k, v in fleet_vars.items() if isinstance(v, str) and ("{" in v or "%" in v)}
    assert templated == {"kimi_profile_src", "kimi_api_key_src"}


def test_the_ansible_environment_pins_a_core_that_runs_on_python_311():
    """ansible-core 2.20 needs Python 3.12 (its release notes); the machines have 3.11: the 2.19 series, pinned."""
    lines = (Path(__file__).resolve().parent.parent / "scripts" / "ansible-testenv.requirements.txt").read_text()
    pins = dict(line.split("==") for line in lines.splitlines() if line and not line.startswith("#"))
    assert pins["ansible-core"].startswith("2.19.") and pins["ansible-lint"] == "26.10.1"


def test_a_missing_key_is_named_before_the_silent_copy(tmp_path):
    """The key's copy is ``no_log`` (its errors too): without ``kimi_api_key`` or the key file, the run stops at an
    assert that names both, before anything is installed."""
    for name, text in registry.render("ansible", fleet()).files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    # the connection does not matter here (the assert runs on the controller; the one task before it is a
    # read-only `systemctl is-active`): local, so no host is needed, and --check, so nothing could change here
    r = run_tool("ansible-playbook", "-i", "inventory.yml", "site.yml", "--check", "--limit", "10.1.0.11", "-e",
                 "ansible_connection=local", "-e", f"ansible_python_interpreter={sys.executable}", cwd=tmp_path)
    assert r.returncode != 0
    assert "no API key to copy: put it at" in r.stdout and "kimi-k25.api-key" in r.stdout, r.stdout + r.stderr
