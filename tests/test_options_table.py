"""The one table of SGLang options (issue 12) drives the profile model, the launch, the version rules,
init's profile and production.md; its flags are SGLang 0.5.23's own."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib

import pytest
from packaging.version import Version

from helpers import run_cli
from kimi_deploy import options, versions
from kimi_deploy.launch import build_launch
from kimi_deploy.profile import SGLang, parse_profile

#: A value to set for each row when testing that the row reaches the launch (valid together at 0.5.23).
VALUES = {"model_path": "/models/other", "enforce_disable_flashinfer_allreduce_fusion": True,
          "served_model_name": "kimi", "trust_remote_code": True, "host": "127.0.0.2", "port": 31000, "tp_size": 2, "pp_size": 2,
          "context_length": 4096, "mem_fraction_static": 0.5, "max_running_requests": 7, "chunked_prefill_size": 512,
          "attention_backend": "flashinfer", "tool_call_parser": "kimi_k2", "reasoning_parser": "kimi_k2",
          "speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/models/d", "speculative_num_steps": 3,
          "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4, "disable_overlap_schedule": True,
          "flashinfer_allreduce_fusion_backend": "trtllm", "enable_symm_mem": True, "enable_torch_symm_mem": True,
          "enable_pcie_ipc_allreduce": True, "enable_metrics": True, "api_key_file": "/etc/kimi-deploy/x.api-key"}


def test_the_sglang_model_is_the_table_in_order():
    assert list(SGLang.model_fields) == [o.key for o in options.OPTIONS]
    for option in options.OPTIONS:
        field = SGLang.model_fields[option.key]
        assert field.description == option.help
        assert option.scope in typing_args(options.Scope), option.key
        assert all(sp.source for sp in option.spellings), option.key


def typing_args(alias):
    import typing

    return typing.get_args(alias)


def test_version_rules_are_the_rows_spellings():
    assert {r.feature for r in versions.RULES} == {o.key for o in options.ALL_OPTIONS if o.spellings}
    assert len(versions.RULES) == sum(len(o.spellings) for o in options.ALL_OPTIONS)


def test_fleet_rows_are_not_sglang_keys_and_say_where_they_come_from():
    """--nnodes, --node-rank, --dist-init-addr, --dist-timeout come from [fleet] on every rank: no [sglang] field,
    a set_from naming the [fleet] key, owned (extra_args refuses them), and in production.md's table."""
    for option in options.FLEET_OPTIONS:
        assert option.key not in SGLang.model_fields
        assert option.set_from and option.set_from.startswith("[fleet]"), option.key
        assert option.scope == "every rank" and option.emit == "special", option.key
        assert option.scope in typing_args(options.Scope)
        assert all(options.owned_flags()[flag] == option.set_from for flag in option.flags)
        assert f"| set from {option.set_from} |" in options.markdown_table()
    assert [o.key for o in options.FLEET_OPTIONS] == ["nnodes", "node_rank", "dist_init_addr", "dist_timeout"]


@pytest.mark.parametrize("option", [o for o in options.OPTIONS if o.emit in ("value", "switch", "env-switch")],
                         ids=lambda o: o.key)
def test_every_row_reaches_the_launch_in_its_spelling(option):
    """Setting a row's key puts the row's 0.5.23 spelling, and only then, into argv or env."""
    sglang = {"model_path": "/models/kimi", "tp_size": 2, option.key: VALUES[option.key]}  # KeyError: add a value
    if option.requires:
        sglang |= {k: VALUES[k] for k in ("speculative_algorithm", "speculative_draft_model_path",
                                          "speculative_num_steps", "speculative_eagle_topk",
                                          "speculative_num_draft_tokens")}
    launch = build_launch(parse_profile({"service": {"name": "x", "gpu_count": 8}, "sglang": sglang}), "0.5.23")
    rule = versions.spelling(option.key, Version("0.5.23"))
    if rule.kind == "env":
        assert dict(launch.env)[rule.spelling] == "1"
        return
    args = list(launch.server_args)
    assert rule.spelling in args, (option.key, args)
    if option.emit == "value":
        assert args[args.index(rule.spelling) + 1] == str(VALUES[option.key])
    bare = build_launch(parse_profile({"service": {"name": "x", "gpu_count": 8},
                                       "sglang": {"model_path": "/models/kimi", "tp_size": 2}}), "0.5.23")
    if option.key not in ("host", "port", "tp_size", "model_path"):
        assert rule.spelling not in bare.server_args


def test_production_md_carries_the_table(repo_root):
    text = (repo_root / "production.md").read_text()
    assert options.markdown_table() in text


def test_init_profile_lists_every_row(tmp_path):
    path = tmp_path / "p.toml"
    assert run_cli(["init", str(path)]).exit_code == 0
    text = path.read_text()
    section = text[text.index("[sglang]"):text.index("[environment]")]
    keys = re.findall(r"^(?:# )?([a-z_0-9]+) = ", section, flags=re.M)
    assert keys == [o.key for o in options.OPTIONS]
    for option in options.OPTIONS:  # every example is a valid TOML value of the field's type
        value = options.init_example(option, "x")
        if value is not ...:
            tomllib.loads(f"v = {json.dumps(value)}")


#: Runs in the SGLang interpreter: every option string -> (dest, nargs == 0).
ACTIONS_SCRIPT = r"""
import argparse, json
from sglang.srt.server_args import ServerArgs
p = argparse.ArgumentParser(); ServerArgs.add_cli_args(p)
print(json.dumps({s: [a.dest, a.nargs == 0] for a in p._actions for s in a.option_strings}))
"""


@pytest.mark.sglang
def test_every_flag_of_the_table_is_sglang_0_5_23s(sglang_python):
    """Each row's 0.5.23 flags and aliases exist in SGLang's own parser for one setting; switches take no value;
    no other SGLang option is a prefix of an owned flag (so refusing prefixes in extra_args refuses only
    abbreviations of owned flags)."""
    done = subprocess.run([sglang_python, "-c", ACTIONS_SCRIPT], capture_output=True, text=True, check=True)
    actions = json.loads(done.stdout.strip().splitlines()[-1])
    v = Version("0.5.23")
    for option in options.ALL_OPTIONS:
        current = [r for r in versions.rules_for(option.key) if r.applies(v) and r.kind == "flag"] \
            if option.spellings else []
        names = [r.spelling for r in current] + list(option.aliases)
        dests = {actions[name][0] for name in names}  # KeyError: SGLang has no such flag
        assert len(dests) <= 1, (option.key, dests)
        for rule in current:
            assert actions[rule.spelling][1] is (option.emit == "switch"), option.key
    owned = options.owned_flags()
    for name in actions:
        if name not in owned:
            assert not [flag for flag in owned if flag.startswith(name)], name


def test_patch_gates_spell_the_flags_of_the_row_they_name():
    """A series' ``[[patch.needed_by]]`` gate names a row (``setting``) and spells its flags again, for doctor to
    find in the rendered command: every gate flag must be one of that row's flags, the flag the row renders for
    the series' release among them (else doctor misses the feature), and every ``unless_flags`` entry a flag of
    some row. Nothing else ties the series manifest to the option table."""
    from kimi_deploy.patching import available_versions, find_series

    owned = options.owned_flags()
    gates = [(version, gate) for version in available_versions() for spec in find_series(version).patch
             for gate in spec.needed_by]
    assert gates
    for version, gate in gates:
        row = options.BY_KEY[gate.setting]
        assert set(gate.flags) <= set(row.flags), (version, gate.setting)
        assert versions.spelling(gate.setting, Version(version)).spelling in gate.flags, (version, gate.setting)
        assert all(flag in owned for flag in gate.unless_flags), (version, gate.unless_flags)
