"""render / presets / init through the CLI, and the secrets promise."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from helpers import MINIMAL, RUNBOOK, replace_examples, run_cli, write_profile

from kimi_deploy.catalog.presets import PRESETS, get_preset
from kimi_deploy.profile import load_profile

PRESET = "kimi-k25-rtx-pro-6000-x8"


def test_presets_lists_one_line_each_and_what_to_measure():
    result = run_cli(["presets"])
    assert result.exit_code == 0
    lines = [line for line in result.stdout.strip().splitlines() if not line.startswith(" ")]
    assert len(lines) == len(PRESETS)
    assert lines[0].startswith(PRESET) and "TP8" in lines[0]
    assert "measure: " in result.stdout and "differs: vs " + PRESET in result.stdout
    data = json.loads(run_cli(["presets", "--json"]).stdout)
    assert all(p["measure"] for p in data.values())


def test_the_pcie_ipc_preset_is_the_reference_on_upstreams_path_without_a_patch():
    """One change of substance against the reference: PCIe IPC on, fusion and torch symm mem off (fusion would
    pre-empt IPC), so it renders the env switch and asks for no gated feature of the patch series."""
    from kimi_deploy.launch import build_launch
    from kimi_deploy.patching import find_series
    from kimi_deploy.versions import parse_version

    ref, ipc = get_preset(PRESET).data, get_preset("kimi-k25-rtx-pro-6000-x8-pcie-ipc").data
    changed = {k for k in ref["sglang"].keys() | ipc["sglang"].keys() if ref["sglang"].get(k) != ipc["sglang"].get(k)}
    assert changed == {"flashinfer_allreduce_fusion_backend", "enable_torch_symm_mem", "enable_pcie_ipc_allreduce"}
    launch = build_launch(get_preset("kimi-k25-rtx-pro-6000-x8-pcie-ipc").profile(), parse_version("0.5.23"))
    assert dict(launch.env)["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] == "1"
    assert find_series("0.5.23").gates_asked(launch.server_args) == []


def test_init_writes_a_commented_profile_equal_to_the_preset(tmp_path):
    path = tmp_path / "kimi.toml"
    result = run_cli(["init", str(path)])
    assert result.exit_code == 0, result.stderr
    text = path.read_text()
    assert text.count("\n#") > 20, "the profile should explain its keys"
    assert load_profile(path).digest() == get_preset(PRESET).profile().digest()


def test_init_refuses_to_overwrite(tmp_path):
    path = tmp_path / "kimi.toml"
    path.write_text("keep me")
    result = run_cli(["init", str(path)])
    assert result.exit_code == 2 and "already exists" in result.stderr
    assert path.read_text() == "keep me"


def test_init_profile_with_every_commented_key_enabled_still_validates(tmp_path):
    """Uncommenting the documented `# key = value` lines gives a valid profile: the comments are not stale."""
    path = tmp_path / "kimi.toml"
    run_cli(["init", str(path)])
    lines = []
    for line in path.read_text().splitlines():
        if re.match(r"^# [a-z_]+ = ", line):
            lines.append(line[2:])
        else:
            lines.append(line)
    data = tomllib.loads("\n".join(lines))
    assert data["sglang"]["max_running_requests"] == 48
    from kimi_deploy.profile import parse_profile

    parse_profile(data)


def test_print_command_is_pasteable_and_equals_the_unit(tmp_path):
    result = run_cli(["render", "--preset", PRESET, "--print-command"])
    assert result.exit_code == 0
    step2 = result.stdout.split("# 2. the launch command", 1)[1].split("\n", 1)[1]
    words = shlex.split(step2.replace("\\\n", " "))
    assert words[0] == "env"
    launch = words[words.index("/opt/sglang/.venv/bin/python"):]
    out = tmp_path / "out"
    run_cli(["render", "--preset", PRESET, "--out", str(out)])
    unit = (out / "kimi-k25.service").read_text()
    exec_start = unit.split("ExecStart=", 1)[1].split("\nRestart=", 1)[0].replace("\\\n", " ")
    # the same command, reading the YAML that step 1 writes instead of the unit's /run file
    assert shlex.split(exec_start) == [w if w != "$KIMI_DEPLOY_SECRETS" else "/run/kimi-k25/sglang-secrets.yaml"
                                       for w in launch]


def test_print_command_without_a_key_is_the_launch_alone(tmp_path):
    result = run_cli(["render", "--profile", str(write_profile(tmp_path, MINIMAL)), "--print-command"])
    assert result.exit_code == 0
    assert "KIMI_DEPLOY_SECRETS" not in result.stdout and "--config" not in result.stdout
    assert shlex.split(result.stdout.replace("\\\n", " "))[0] == "env"


def test_printed_command_runs_as_printed_through_sglangs_config_merger(tmp_path, sglang_python):
    """Issue 13 item 3: the printed command ended in `--config /run/<name>/sglang-secrets.yaml`, a file that
    exists only inside the running unit (SGLang: `Config file not found`). Run the printed text in a shell
    exactly as printed, with only `-m sglang.launch_server` swapped for a probe doing what launch_server
    does with its arguments in SGLang 0.5.23: ConfigArgumentMerger, then ServerArgs' parser."""
    key = "sk-a\"b: #c'd\\e {x} %s $HOME"
    key_file = tmp_path / "kimi.api-key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)  # the key-file rule: nothing for other users
    text = MINIMAL.replace('"/opt/sglang/.venv/bin/python"', json.dumps(sglang_python)) \
        + f'api_key_file = "{key_file}"\n'
    printed = run_cli(["render", "--profile", str(write_profile(tmp_path, text)), "--print-command"])
    assert printed.exit_code == 0, printed.stderr
    assert key not in printed.stdout and "sk-a" not in printed.stdout
    probe = (
        "import argparse, json, sys\n"
        "from sglang.srt.server_args import ServerArgs\n"
        "from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger\n"
        "p = argparse.ArgumentParser(); ServerArgs.add_cli_args(p)\n"
        "argv = ConfigArgumentMerger(p).merge_config_with_args(sys.argv[1:])\n"
        "ns = p.parse_args(argv)\n"
        "print(json.dumps({'api_key': ns.api_key, 'model_path': ns.model_path, 'tp_size': ns.tp_size,"
        " 'config': sys.argv[sys.argv.index('--config') + 1]}))\n"
    )
    script = printed.stdout.replace(" -m sglang.launch_server", " -c " + shlex.quote(probe), 1)
    assert script != printed.stdout
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                          env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert (seen["api_key"], seen["model_path"], seen["tp_size"]) == (key, "/models/moonshotai/Kimi-K2.5", 8)
    assert seen["config"].endswith(".yaml") and not Path(seen["config"]).exists()  # removed when the shell ended


def test_json_output(tmp_path):
    result = run_cli(["render", "--preset", PRESET, "--json"])
    data = json.loads(result.stdout)
    assert data["sglang_version"] == "0.5.23"
    assert data["argv"][3:5] == ["--model-path", "/models/moonshotai/Kimi-K2.5"]
    assert len(data["profile_sha256"]) == 64


def test_api_key_never_in_rendered_files_or_argv(tmp_path):
    key_file = tmp_path / "api-key"
    key_file.write_text("sk-SENTINEL-do-not-leak\n")
    key_file.chmod(0o600)  # the key-file rule: nothing for other users
    text = MINIMAL.replace("tp_size = 8", f'tp_size = 8\nhost = "0.0.0.0"\napi_key_file = "{key_file}"')
    out = tmp_path / "out"
    result = run_cli(["render", "--profile", str(write_profile(tmp_path, text)), "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    for path in out.iterdir():
        assert "SENTINEL" not in path.read_text()
    command = run_cli(["render", "--profile", str(tmp_path / "profile.toml"), "--print-command"]).stdout
    assert "SENTINEL" not in command and "--api-key" not in command
    unit = (out / "kimi-k25.service").read_text()
    assert f"LoadCredential=api-key:{key_file}" in unit


def test_secrets_script_turns_any_key_into_sglang_yaml(tmp_path, sglang_python):
    """The ExecStartPre= script writes a YAML that SGLang's own config merger reads back to the exact key."""
    out = tmp_path / "out"
    run_cli(["render", "--preset", PRESET, "--out", str(out)])
    unit = (out / "kimi-k25.service").read_text()
    line = next(l for l in unit.splitlines() if l.startswith("ExecStartPre=") and " -c " in l)
    argv = shlex.split(line.removeprefix("ExecStartPre="))
    creds, runtime = tmp_path / "creds", tmp_path / "run"
    creds.mkdir(), runtime.mkdir()
    key = "sk-a\"b: #c'd\\e {x} %s $HOME"
    (creds / "api-key").write_text(key + "\n")
    (creds / "api-key").chmod(0o600)  # the key-file rule: nothing for other users
    env = {"CREDENTIALS_DIRECTORY": str(creds), "RUNTIME_DIRECTORY": str(runtime), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, *argv[1:]], env=env, check=True)
    config = runtime / "sglang-secrets.yaml"
    assert oct(config.stat().st_mode & 0o777) == "0o600"
    probe = (
        "import argparse, json, sys\n"
        "from sglang.srt.server_args import ServerArgs\n"
        "from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger\n"
        "p = argparse.ArgumentParser(); ServerArgs.add_cli_args(p)\n"
        "argv = ConfigArgumentMerger(p).merge_config_with_args(['--model-path', '/m', '--config', sys.argv[1]])\n"
        "print(json.dumps(p.parse_args(argv).api_key))\n"
    )
    done = subprocess.run([sglang_python, "-c", probe, str(config)], capture_output=True, text=True,
                          env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == key


def test_empty_key_credential_fails_the_start(tmp_path):
    out = tmp_path / "out"
    run_cli(["render", "--preset", PRESET, "--out", str(out)])
    line = next(l for l in (out / "kimi-k25.service").read_text().splitlines()
                if l.startswith("ExecStartPre=") and " -c " in l)
    argv = shlex.split(line.removeprefix("ExecStartPre="))
    creds, runtime = tmp_path / "creds", tmp_path / "run"
    creds.mkdir(), runtime.mkdir()
    (creds / "api-key").write_text("\n")
    (creds / "api-key").chmod(0o600)  # the key-file rule: nothing for other users
    done = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True,
                          env={"CREDENTIALS_DIRECTORY": str(creds), "RUNTIME_DIRECTORY": str(runtime)})
    assert done.returncode == 1 and "API key credential is empty" in done.stderr
    assert not (runtime / "sglang-secrets.yaml").exists()


def test_errors_are_json_on_stdout_when_json_was_asked(tmp_path):
    """A script reading --json output gets a JSON error, not an empty stdout; stderr keeps the text."""
    profile = write_profile(tmp_path, MINIMAL.replace("tp_size = 8", "tp_size = 3"))
    result = run_cli(["render", "--profile", str(profile), "--json"])
    assert result.exit_code == 2
    error = json.loads(result.stdout)["error"]
    assert error["error"] == "ProfileError" and error["exit_code"] == 2
    assert any("sglang.tp_size: 3 does not divide" in p for p in error["problems"])
    assert result.stderr.startswith("error: ")
    plain = run_cli(["render", "--profile", str(profile)])
    assert plain.stdout == "" and plain.exit_code == 2


def test_cache_dir_outside_cache_directory_is_made_writable(tmp_path):
    """ProtectSystem=strict: a cache_dir not under /var/cache/<name> (even one sharing its prefix) needs ReadWritePaths=."""
    for cache_dir, writable in [("/var/cache/kimi-k25", False), ("/var/cache/kimi-k25/x", False),
                                ("/var/cache/kimi-k25-old", True), ("/srv/cache", True)]:
        text = MINIMAL.replace('name = "kimi-k25"', f'name = "kimi-k25"\ncache_dir = "{cache_dir}"')
        out = tmp_path / cache_dir.replace("/", "_")
        assert run_cli(["render", "--profile", str(write_profile(out, text)), "--out", str(out)]).exit_code == 0
        unit = (out / "kimi-k25.service").read_text()
        assert (f"ReadWritePaths={cache_dir}\n" in unit) is writable, cache_dir


def test_init_name_derives_the_key_file_from_the_service(tmp_path):
    """Issue 13 item 7: init wrote api_key_file named after the preset's service whatever the name."""
    path = tmp_path / "two.toml"
    result = run_cli(["init", str(path), "--name", "kimi-two"])
    assert result.exit_code == 0, result.stderr
    profile = load_profile(path)
    assert profile.service.name == "kimi-two"
    assert profile.sglang.api_key_file == "/etc/kimi-deploy/kimi-two.api-key"
    assert "# cache_dir = \"/var/cache/kimi-two\"" in path.read_text()
    bad = run_cli(["init", str(tmp_path / "x.toml"), "--name", "../x"])
    assert bad.exit_code == 2
    # init names a new service: the fix must not send a new operator to the installed ones' manifests
    assert "a new service name" in bad.stderr and "manifest.json" not in bad.stderr, bad.stderr


def test_a_renamed_service_with_the_old_key_file_name_is_warned_about(tmp_path):
    path = tmp_path / "p.toml"
    assert run_cli(["init", str(path)]).exit_code == 0
    # init writes {name} (the key file follows a rename); an explicit path named after another service warns
    text = path.read_text().replace("/etc/kimi-deploy/{name}.api-key", "/etc/kimi-deploy/kimi-k25.api-key")
    path.write_text(text.replace('name = "kimi-k25"', 'name = "kimi-two"', 1))
    result = run_cli(["render", "--profile", str(path), "--print-command"])
    assert result.exit_code == 0
    assert "warning: [sglang] api_key_file /etc/kimi-deploy/kimi-k25.api-key is named after service 'kimi-k25'" \
        in result.stderr and '"/etc/kimi-deploy/kimi-two.api-key"' in result.stderr
    # the preset itself, and a key file outside /etc/kimi-deploy, say nothing
    assert "warning" not in run_cli(["render", "--preset", PRESET, "--print-command"]).stderr


def test_an_environment_entry_overriding_a_default_is_written_once(tmp_path):
    """New-operator trial: [environment] HF_HUB_OFFLINE = "0" left HF_HUB_OFFLINE=1 and =0 in the env file and
    `env HF_HUB_OFFLINE=1 ... HF_HUB_OFFLINE=0` in the printed command (the last won, but a reader sees both)."""

    profile = write_profile(tmp_path, MINIMAL + '\n[environment]\nHF_HUB_OFFLINE = "0"\nNCCL_DEBUG = "INFO"\n')
    out = tmp_path / "out"
    assert run_cli(["render", "--profile", str(profile), "--out", str(out)]).exit_code == 0
    env_lines = [line for line in (out / "kimi-k25.env").read_text().splitlines() if "=" in line and line[0] != "#"]
    assert [line for line in env_lines if line.startswith("HF_HUB_OFFLINE=")] == ["HF_HUB_OFFLINE=0"]
    assert env_lines[0] == "HF_HUB_OFFLINE=0" and env_lines[-1] == "NCCL_DEBUG=INFO"  # in place; new ones last
    printed = run_cli(["render", "--profile", str(profile), "--print-command"]).stdout
    assert printed.count("HF_HUB_OFFLINE=") == 1 and "HF_HUB_OFFLINE=0" in printed


@pytest.mark.parametrize("flags", [["--kubernetes"], ["--fleet", "--kubernetes"]])
def test_init_kubernetes_goes_to_kubectl_kustomize_with_no_hand_written_toml(tmp_path, flags):
    """A new operator's path: init --kubernetes, render --target kubernetes, kubectl kustomize: every object
    validates offline (core kinds, LWS and Prometheus Operator CRDs), every pod meets the Pod Security level its
    namespace enforces, the server is Guaranteed QoS."""
    import pod_security
    from kube_helpers import kustomize, qos_class, validate_document

    path = tmp_path / "kimi.toml"
    result = run_cli(["init", str(path), *flags])
    assert result.exit_code == 0, result.stderr
    assert "render --target kubernetes" in result.stdout and "replace the example" in result.stdout
    out = tmp_path / "manifests"
    # the placeholder images are live keys, refused until replaced: no ImagePullBackOff at apply
    refused = run_cli(["render", "--target", "kubernetes", "--profile", str(path), "--out", str(out)])
    assert refused.exit_code == 2 and "replace the example value" in refused.stderr, refused.stderr
    assert "kubernetes.check_image: 'registry.example/kimi-deploy:" in refused.stderr
    assert ("kubernetes.gateway_image" in refused.stderr) == ("--fleet" in flags)
    assert not out.exists()
    text = replace_examples(path.read_text())
    path.write_text(text)
    result = run_cli(["render", "--target", "kubernetes", "--profile", str(path), "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    documents = kustomize(out)
    kinds = [d["kind"] for d in documents]
    assert {"Namespace", "LeaderWorkerSet", "CronJob", "PodMonitor", "PrometheusRule"} <= set(kinds)
    assert ("Deployment" in kinds) == ("--fleet" in flags)
    (namespace,) = [d for d in documents if d["kind"] == "Namespace"]
    level = namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
    assert level == "restricted"
    for document in documents:
        assert validate_document(document) == [], document["kind"]
        for where, template in pod_security.pod_templates(document):
            assert pod_security.violations(level, template["spec"]) == [], where
            if document["kind"] == "LeaderWorkerSet":
                assert qos_class(template["spec"]) == "Guaranteed"
    (lws,) = [d for d in documents if d["kind"] == "LeaderWorkerSet"]
    assert lws["spec"]["replicas"] == (2 if "--fleet" in flags else 1)


def test_init_fleet_renders_host_folders_and_a_scrape_config_of_its_addresses(tmp_path):
    import yaml

    path = tmp_path / "kimi.toml"
    assert run_cli(["init", str(path), "--fleet"]).exit_code == 0
    out, root = tmp_path / "out", tmp_path / "root"
    root.mkdir()
    # the example addresses are live keys from RFC 5737's documentation range, refused where they would reach a
    # host: render (files, --print-command) and install
    for argv in (["render", "--profile", str(path), "--out", str(out)],
                 ["render", "--profile", str(path), "--print-command"],
                 ["render", "--target", "monitoring", "--profile", str(path)],
                 ["install", "--profile", str(path), "--root", str(tmp_path / "root"), "--host", "192.0.2.11",
                  "--dry-run"]):
        refused = run_cli(argv)
        assert refused.exit_code == 2, (argv, refused.stderr)
        assert "replace the example value" in refused.stderr and "fleet.replicas[0].nodes[0]: '192.0.2.11'" in \
            refused.stderr and "gateway.host: '192.0.2.10'" in refused.stderr, refused.stderr
    assert not out.exists() and not any(root.iterdir())
    path.write_text(replace_examples(path.read_text()))
    result = run_cli(["render", "--profile", str(path), "--out", str(out)])
    assert result.exit_code == 0 and "warning: monitoring" not in result.stderr, result.stderr
    assert {p.name for p in out.iterdir() if p.is_dir()} == {"10.1.0.11", "10.1.0.12", "10.1.0.10", "monitoring"}
    config = yaml.safe_load((out / "monitoring" / "prometheus.yml").read_text())
    targets = {j["job_name"]: j["static_configs"][0]["targets"] for j in config["scrape_configs"]}
    assert targets == {"kimi-k25": ["10.1.0.11:30000", "10.1.0.12:30000"],
                       "kimi-k25-check": ["10.1.0.11:9100", "10.1.0.12:9100", "10.1.0.10:9100"],
                       "kimi-k25-gateway": ["10.1.0.10:29000"]}


def test_init_writes_runbook_url_live_and_render_warns_while_it_is_relative(tmp_path):
    """Issue 43 item 2: alerts linked to the relative docs/runbook.md, dead in Alertmanager or PagerDuty, and
    nothing said so. init writes the key live; a single host renders with a warning, a fleet or a cluster is
    refused until it is absolute; absolute, the alerts link there."""
    import yaml

    path = tmp_path / "kimi.toml"
    assert run_cli(["init", str(path)]).exit_code == 0
    assert 'runbook_url = "docs/runbook.md"' in path.read_text().splitlines()
    for argv in (["render", "--profile", str(path), "--out", str(tmp_path / "one")],
                 ["render", "--target", "monitoring", "--profile", str(path)]):
        result = run_cli(argv)
        assert result.exit_code == 0, result.stderr
        assert "warning: monitoring.runbook_url: 'docs/runbook.md' is relative" in result.stderr
    as_json = run_cli(["render", "--target", "monitoring", "--profile", str(path), "--json"])
    assert any("runbook_url" in w for w in json.loads(as_json.stdout).get("warnings", [])) or \
        "monitoring.runbook_url" in as_json.stderr
    path.write_text(path.read_text().replace('runbook_url = "docs/runbook.md"', f'runbook_url = "{RUNBOOK}"'))
    out = tmp_path / "two"
    result = run_cli(["render", "--profile", str(path), "--out", str(out)])
    assert result.exit_code == 0 and "runbook_url" not in result.stderr, result.stderr
    (rules,) = (out / "monitoring").glob("*.rules.yml")
    links = {r["annotations"]["runbook_url"] for g in yaml.safe_load(rules.read_text())["groups"]
             for r in g["rules"] if "alert" in r}
    assert links and all(link.startswith(RUNBOOK + "#") for link in links)


@pytest.mark.parametrize("flags", [["--fleet"], ["--kubernetes"]])
def test_a_relative_runbook_url_is_refused_for_a_fleet_or_a_cluster(tmp_path, flags):
    path = tmp_path / "kimi.toml"
    assert run_cli(["init", str(path), *flags]).exit_code == 0
    path.write_text(replace_examples(path.read_text()).replace(f'runbook_url = "{RUNBOOK}"',
                                                               'runbook_url = "docs/runbook.md"'))
    target = ["--target", "kubernetes"] if "--kubernetes" in flags else []
    out = tmp_path / "out"
    result = run_cli(["render", *target, "--profile", str(path), "--out", str(out)])
    assert result.exit_code == 2 and "monitoring.runbook_url: 'docs/runbook.md' is relative" in result.stderr
    assert "refused for a fleet or a cluster" in result.stderr and not out.exists()


@pytest.mark.parametrize("url, absolute", [("https://git.corp.test/r.md", True), ("http://wiki/runbook", True),
                                           ("HTTPS://X/y", True), ("docs/runbook.md", False), ("/srv/runbook.md", False),
                                           ("https:///runbook.md", False), ("file:///srv/runbook.md", False)])
def test_which_runbook_urls_are_absolute(url, absolute):
    from kimi_deploy.profile.monitoring import runbook_is_absolute

    assert runbook_is_absolute(url) is absolute


@pytest.mark.parametrize("value", ["192.0.2.1", "198.51.100.7:30000", "203.0.113.9", "2001:db8::1",
                                   "[2001:db8::1]:9100", "http://198.51.100.7:9091", "registry.example/x:1",
                                   "mirror.invalid:5000/smg:1.13.0", "https://hooks.example/runbook.md"])
def test_every_documentation_address_and_example_registry_is_an_example(value):
    from kimi_deploy.profile.examples import is_example_value

    assert is_example_value(value)


@pytest.mark.parametrize("value", ["10.0.0.11", "192.0.3.1", "2001:db9::1", "lmsysorg/sglang:v0.5.23-cu130",
                                   "registry.example.com/kimi-deploy:0.1.0", "moonshotai/Kimi-K2.5",
                                   "Kimi K2.5 on gpu.example", "/models/kimi.example", "0.0.0.0"])
def test_real_values_and_prose_are_not_examples(value):
    from kimi_deploy.profile.examples import is_example_value

    assert not is_example_value(value)


@pytest.mark.parametrize("flags", [[], ["--fleet"], ["--kubernetes"], ["--fleet", "--kubernetes"]])
def test_init_every_commented_key_of_every_table_still_validates_and_renders(tmp_path, flags):
    """Uncommenting every `# key = value` line of init --fleet/--kubernetes (each in its own table) gives a profile
    that validates and renders: the documented keys and values are not stale."""
    from kimi_deploy.targets import kubernetes as kubernetes_target
    from kimi_deploy.profile import parse_profile

    path = tmp_path / "kimi.toml"
    assert run_cli(["init", str(path), *flags]).exit_code == 0
    text = path.read_text()
    lines = [re.sub(r"\s+# .*$", "", line[2:]) if re.match(r"^# [a-z_]+ = ", line) else line
             for line in text.splitlines()]
    profile = parse_profile(tomllib.loads("\n".join(lines)))
    if "--kubernetes" in flags:
        assert profile.kubernetes.monitor_labels == {"release": "kube-prometheus-stack"}
        kubernetes_target.render(profile)
    if "--fleet" in flags:
        assert profile.gateway.policy == "cache_aware" and profile.copies == 2
    if not flags:
        assert "init --fleet" in text and "init --kubernetes" in text


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_init_writes_the_memory_settings_live(tmp_path, preset):
    """Every preset's profile carries its memory settings as keys, not comments (docs/runbook.md#size-the-memory)."""
    from kimi_deploy.catalog.presets import MEMORY

    path = tmp_path / "kimi.toml"
    assert run_cli(["init", str(path), "--preset", preset]).exit_code == 0
    sglang = tomllib.loads(path.read_text())["sglang"]
    assert {key: sglang.get(key) for key in MEMORY} == MEMORY


def test_render_out_of_two_services_keeps_each_and_merges_the_scrape_config(tmp_path):
    """Issue 43 item 8: a second service rendered into the same folder overwrote monitoring/prometheus.yml (the
    first service's scrape jobs gone), and a service's files it no longer renders stayed forever. Now the shared
    file is merged, and a render removes only its own stale files (by the folder's manifest)."""
    import yaml

    out = tmp_path / "out"
    first, second = tmp_path / "a.toml", tmp_path / "b.toml"
    for path, name, port in ((first, "kimi-a", 30000), (second, "kimi-b", 30001)):
        assert run_cli(["init", str(path), "--name", name]).exit_code == 0
        path.write_text(path.read_text().replace("port = 30000", f"port = {port}").replace(
            'runbook_url = "docs/runbook.md"', f'runbook_url = "{RUNBOOK}"'))
        assert run_cli(["render", "--profile", str(path), "--out", str(out)]).exit_code == 0
    names = {p.name for p in out.iterdir()}
    assert {"kimi-a.service", "kimi-b.service", "kimi-a.env", "kimi-b.env"} <= names
    config = yaml.safe_load((out / "monitoring" / "prometheus.yml").read_text())
    jobs = {j["job_name"] for j in config["scrape_configs"]}
    assert jobs == {"kimi-a", "kimi-a-check", "kimi-b", "kimi-b-check"}
    assert config["rule_files"] == ["kimi-a.rules.yml", "kimi-b.rules.yml"]
    # rendering a again replaces its own jobs and keeps b's; twice gives the same file
    before = (out / "monitoring" / "prometheus.yml").read_text()
    assert run_cli(["render", "--profile", str(first), "--out", str(out)]).exit_code == 0
    again = (out / "monitoring" / "prometheus.yml").read_text()
    assert {j["job_name"] for j in yaml.safe_load(again)["scrape_configs"]} == jobs
    assert run_cli(["render", "--profile", str(first), "--out", str(out)]).exit_code == 0
    assert (out / "monitoring" / "prometheus.yml").read_text() == again
    assert before.count("job_name") == again.count("job_name")
    # a's metrics off: its monitoring files are its own stale ones and go; b's stay, untouched
    first.write_text(first.read_text().replace("enable_metrics = true", "enable_metrics = false"))
    result = run_cli(["render", "--profile", str(first), "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    assert "removed " in result.stdout and not (out / "monitoring" / "kimi-a.rules.yml").exists()
    assert (out / "monitoring" / "kimi-b.rules.yml").exists() and (out / "kimi-b.service").exists()
    config = yaml.safe_load((out / "monitoring" / "prometheus.yml").read_text())
    assert {j["job_name"] for j in config["scrape_configs"]} == {"kimi-b", "kimi-b-check"}
    assert config["rule_files"] == ["kimi-b.rules.yml"]


def test_merged_prometheus_config_passes_promtool(tmp_path):
    import shutil as _shutil

    promtool = _shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool missing (Debian's prometheus package)")
    out = tmp_path / "out"
    for name, port in (("kimi-a", 30000), ("kimi-b", 30001)):
        path = tmp_path / f"{name}.toml"
        assert run_cli(["init", str(path), "--name", name]).exit_code == 0
        path.write_text(path.read_text().replace("port = 30000", f"port = {port}"))
        assert run_cli(["render", "--target", "monitoring", "--profile", str(path), "--out", str(out)]).exit_code == 0
    done = subprocess.run([promtool, "check", "config", str(out / "prometheus.yml")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
