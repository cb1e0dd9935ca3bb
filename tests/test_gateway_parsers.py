"""Issue 41: the gateway's own parsers (smg's ``--reasoning-parser``/``--tool-call-parser``) are part of the resolved
deployment, rendered into the gateway's launch (systemd and Kubernetes), and ``validate`` refuses names that do not
match the model: K2.6 through smg with ``kimi_k25`` scored 0 on tau2-bench against 100 through plain vLLM (smg PR
1868, issue 1873; smg's name for it is ``kimi_thinking``). Checked against smg 1.13.0's recorded ``launch --help``
and against the real binary (``$KIMI_DEPLOY_SMG``): it takes the rendered flags, and with HTTP workers it relays a
worker's answer unchanged whatever its reasoning parser (what the catalog module's docstring states)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import tomllib
from pathlib import Path

import httpx
import pytest

from helpers import run_cli, write_profile
from kimi_deploy import validate
from kimi_deploy.catalog import gateway_parsers
from kimi_deploy.catalog.models import MODELS
from kimi_deploy.deployment import resolve
from kimi_deploy.launch import gateway_args
from kimi_deploy.profile import dump_profile, parse_profile
from kimi_deploy.targets import kubernetes
from loopback import free_port
from quality_server import QualityServer

HELP = (Path(__file__).parent / "data" / "smg-1.13.0-launch-help.txt").read_text()

PROFILE = """\
[service]
name = "kimi-k26"
gpu_count = 8

[sglang]
model_path = "/models/moonshotai/Kimi-K2.6"
served_model_name = "moonshotai/Kimi-K2.6"
host = "0.0.0.0"
tp_size = 8
tool_call_parser = "kimi_k2"
reasoning_parser = "kimi_k2"
api_key_file = "/etc/kimi-deploy/kimi-k26.api-key"

[fleet]
[[fleet.replicas]]
nodes = ["10.0.0.11"]
[[fleet.replicas]]
nodes = ["10.0.0.12"]

[gateway]
host = "10.0.0.10"
"""


def _profile(extra: str = "", text: str = PROFILE):
    return parse_profile(tomllib.loads(text + extra))


def test_every_model_of_the_table_has_smg_names_the_pinned_smg_lists():
    reasoning = validate.option_choices(HELP, "--reasoning-parser")
    tools = validate.option_choices(HELP, "--tool-call-parser")
    assert "kimi_thinking" in reasoning and "deepseek_v4.1" in reasoning and "kimik2" in tools
    for model in MODELS.values():
        names = gateway_parsers.smg_parsers(model)
        assert names is not None, model.key
        assert names.reasoning in reasoning and names.tool_call in tools, model.key
    assert gateway_parsers.smg_parsers(MODELS["k2.6"]).reasoning == "kimi_thinking"
    assert gateway_parsers.smg_parsers(MODELS["k3"]).tool_call == "kimi_k3"


def test_unset_parsers_are_not_passed_and_keep_the_deployment_as_it_was():
    plain = _profile()
    assert "--reasoning-parser" not in gateway_args(plain) and "--tool-call-parser" not in gateway_args(plain)
    assert resolve(plain).gateway_parsers == {"reasoning_parser": None, "tool_call_parser": None}
    assert validate.validate_gateway(plain, HELP) == [] and not validate.check_model(plain).errors
    # an installed fleet profile keeps its digest: unset keys are left out of it
    data = tomllib.loads(PROFILE)
    assert plain.digest() == parse_profile(data).digest()
    assert _profile('reasoning_parser = "kimi_thinking"\n').digest() != plain.digest()
    for profile in (plain, _profile('reasoning_parser = "kimi_thinking"\ntool_call_parser = "kimik2"\n')):
        again = parse_profile(tomllib.loads(dump_profile(profile)))  # the copy install and the check ConfigMap keep
        assert again.gateway == profile.gateway and again.digest() == profile.digest()


def test_set_parsers_are_in_the_deployment_and_both_launches():
    profile = _profile('reasoning_parser = "kimi_thinking"\ntool_call_parser = "kimik2"\n')
    deployment = resolve(profile)
    assert deployment.gateway_parsers == {"reasoning_parser": "kimi_thinking", "tool_call_parser": "kimik2"}
    assert deployment.to_dict()["gateway_parsers"] == deployment.gateway_parsers
    args = list(deployment.gateway_command)
    assert args[args.index("--reasoning-parser") + 1] == "kimi_thinking"
    assert args[args.index("--tool-call-parser") + 1] == "kimik2"
    assert validate.validate_gateway(profile, HELP) == [] and not validate.check_model(profile).errors
    k8s = _profile('reasoning_parser = "kimi_thinking"\ntool_call_parser = "kimik2"\n'
                   '\n[kubernetes]\nimage = "registry.example/sglang:0.5.23"\n'
                   'gateway_image = "registry.example/smg:1.13.0"\n')
    kargs = kubernetes.gateway_args(k8s, "kimi-k26")
    assert kargs[-4:] == ["--reasoning-parser", "kimi_thinking", "--tool-call-parser", "kimik2"]


def test_a_reasoning_parser_that_does_not_match_the_model_is_refused():
    """K2.6 with kimi_k25 (smg PR 1868's regression): validate --gateway's check and validate of the fleet profile
    (the model check every validate runs) refuse it, naming smg's right name and why."""
    wrong = _profile('reasoning_parser = "kimi_k25"\n')
    problems = validate.validate_gateway(wrong, HELP)
    assert len(problems) == 1 and problems[0].startswith(
        "gateway.reasoning_parser: 'kimi_k25' does not match Kimi K2.6 (smg's name for it is 'kimi_thinking'")
    assert "smg PR 1868" in problems[0] and 'fix: set reasoning_parser = "kimi_thinking" in [gateway]' in problems[0]
    assert validate.check_model(wrong).errors == tuple(problems)
    legacy = _profile('reasoning_parser = "kimi"\ntool_call_parser = "kimi_k3"\n')
    assert [p.split(":", 1)[0] for p in validate.validate_gateway(legacy, HELP)] == [
        "gateway.reasoning_parser", "gateway.tool_call_parser"]
    k3 = _profile('reasoning_parser = "kimi_k3"\ntool_call_parser = "kimi_k3"\n',
                  PROFILE.replace("Kimi-K2.6", "Kimi-K3"))
    assert validate.validate_gateway(k3, HELP) == []
    thinking_on_k3 = _profile('reasoning_parser = "kimi_thinking"\n', PROFILE.replace("Kimi-K2.6", "Kimi-K3"))
    assert "does not match Kimi K3" in validate.validate_gateway(thinking_on_k3, HELP)[0]


def test_a_name_this_smg_does_not_have_is_refused_and_hostile_values_never_load():
    """SGLang's spelling (kimi_k2) is not an smg reasoning parser: the pinned smg's own choices say so."""
    sglang_name = _profile('reasoning_parser = "kimi_k2"\n')
    problems = validate.validate_gateway(sglang_name, HELP)
    assert problems[0].startswith("gateway.reasoning_parser: 'kimi_k2' is not one of this smg's reasoning parsers "
                                  "(base, cohere_cmd,")
    assert "does not match Kimi K2.6" in problems[1]
    for bad in ("-x", "Kimi", "a b", "kimi\n", "x" * 65):
        with pytest.raises(Exception) as err:
            _profile(f"reasoning_parser = {json.dumps(bad)}\n")
        assert getattr(err.value, "exit_code", None) == 2, bad


def test_validate_gateway_with_the_real_smg_refuses_the_wrong_parser(tmp_path, smg_path):
    good = write_profile(tmp_path, PROFILE + f'smg = "{smg_path}"\nreasoning_parser = "kimi_thinking"\n'
                                             'tool_call_parser = "kimik2"\n', "good.toml")
    ok = run_cli(["validate", "--profile", str(good), "--gateway", "--json"])
    assert ok.exit_code == 0, ok.stdout + ok.stderr
    wrong = write_profile(tmp_path, PROFILE + f'smg = "{smg_path}"\nreasoning_parser = "kimi_k25"\n', "wrong.toml")
    bad = run_cli(["validate", "--profile", str(wrong), "--gateway"])
    assert bad.exit_code == 1 and "Traceback" not in bad.stderr
    assert "gateway.reasoning_parser: 'kimi_k25' does not match Kimi K2.6" in bad.stdout


def test_the_real_smg_takes_the_rendered_parsers_and_relays_http_workers_answers_unchanged(smg_path):
    """smg 1.13.0 started with the deployment's own arguments (loopback addresses, no key) including
    ``--reasoning-parser kimi_thinking --tool-call-parser kimik2`` lists the worker and relays its answer byte for
    byte: with HTTP workers the split is the workers' own parser's (a worker that leaks ``</think>`` into content
    is not repaired by the gateway, so the check through the gateway sees it)."""
    with QualityServer(think_leak_rate=1.0, seed=1) as worker:
        port, prom = free_port(), free_port()
        text = PROFILE.replace('api_key_file = "/etc/kimi-deploy/kimi-k26.api-key"', "allow_unauthenticated = true")
        profile = _profile(f'bind = "127.0.0.1"\nport = {port}\nprometheus_port = {prom}\nsmg = "{smg_path}"\n'
                           'reasoning_parser = "kimi_thinking"\ntool_call_parser = "kimik2"\npolicy = "round_robin"\n',
                           text)
        argv = list(resolve(profile).gateway_command)
        urls = argv.index("--worker-urls")
        argv[urls + 1:urls + 3] = [worker.url]  # the two replicas' rank 0 -> the one loopback worker
        assert argv[0] == smg_path and "--reasoning-parser" in argv
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env={**os.environ, "HF_HUB_OFFLINE": "1"})
        try:
            url = f"http://127.0.0.1:{port}"
            for _ in range(600):
                assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
                try:
                    listed = httpx.get(url + "/workers", timeout=2).json().get("workers", [])
                    if listed and all(w.get("is_healthy") for w in listed):
                        break
                except (httpx.HTTPError, ValueError):
                    pass
                time.sleep(0.1)
            body = {"model": "moonshotai/Kimi-K2.5", "messages": [{"role": "user", "content": "hi"}]}
            direct = httpx.post(worker.url + "/v1/chat/completions", json=body, timeout=30).json()
            through = httpx.post(url + "/v1/chat/completions", json=body, timeout=30).json()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    assert direct["choices"][0]["message"]["content"].endswith("</think>Yes.")
    assert through["choices"][0]["message"] == direct["choices"][0]["message"]


@pytest.mark.sglang
def test_validate_of_the_fleet_profile_refuses_the_wrong_gateway_parser(tmp_path, sglang_python):
    """validate of the fleet profile (SGLang's own parser on the command) fails on the gateway's parser alone, under
    its own label and with its own fix, not the fit's."""
    path = write_profile(tmp_path, PROFILE + 'reasoning_parser = "kimi_k25"\n')
    result = run_cli(["validate", "--profile", str(path), "--python", sglang_python])
    assert result.exit_code == 1, result.stdout + result.stderr
    assert "gateway: FAILED: gateway.reasoning_parser: 'kimi_k25' does not match Kimi K2.6" in result.stdout
    assert "GPUs that hold it" not in result.stdout and "correct the flag" not in result.stdout
