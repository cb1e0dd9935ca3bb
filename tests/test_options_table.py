"""The one table of SGLang options (issue 12) drives the profile model, the launch, the version rules,
init's profile and docs/reference/profile.md; its flags are SGLang 0.5.23's own."""

from __future__ import annotations

import json
import os
import re
import runpy
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
          "context_length": 4096, "mem_fraction_static": 0.5, "max_running_requests": 7, "chunked_prefill_size": 512, "max_prefill_tokens": 4096, "load_format": "safetensors", "weight_loader_prefetch_checkpoints": True,
          "weight_loader_prefetch_num_threads": 6, "startup_weight_load_mode": "overlap",
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
        assert isinstance(option.scope, options.Scope), option.key
        assert all(sp.source for sp in option.spellings), option.key


def test_scope_says_which_rank_carries_a_row():
    """Every rank carries an every-rank row; only rank 0 (it serves HTTP) a serving-rank row; no rank a router or
    Kubernetes row."""
    row = options.BY_KEY["tp_size"]
    assert row.scope is options.Scope.EVERY_RANK and row.on_rank(0) and row.on_rank(3)
    for key in ("host", "port", "api_key_file", "tool_call_parser", "reasoning_parser", "served_model_name"):
        row = options.BY_KEY[key]
        assert row.scope is options.Scope.SERVING_RANK and row.on_rank(0) and not row.on_rank(1), key
    for scope in (options.Scope.ROUTER, options.Scope.KUBERNETES):
        row = options.Option("x", int, 0, "x", "none", scope)
        assert not row.on_rank(0) and not row.on_rank(1)
    assert [s.value for s in options.Scope] == ["every rank", "serving rank only", "router", "kubernetes container"]


def test_every_emit_names_a_handler_and_the_environment_is_the_tables():
    """A row names its launch handler (``emit``); the reserved environment is the rows' variables and the cache
    table, and the launch sets every cache variable under the stack-keyed folder."""
    import typing

    from kimi_deploy import launch
    from kimi_deploy.profile import RESERVED_ENV

    assert set(launch.EMITTERS) == set(typing.get_args(options.Emit))
    assert set(RESERVED_ENV) == set(options.owned_env()) | {v.name for v in options.CACHE_ENV}
    assert RESERVED_ENV["SGLANG_API_KEY"] == "[sglang] api_key_file"
    spec = build_launch(parse_profile({"service": {"name": "x", "gpu_count": 1},
                                       "sglang": {"model_path": "/models/kimi"}}), "0.5.23")
    env = dict(spec.env)
    assert [env[v.name] for v in options.CACHE_ENV] == [
        spec.cache_dir + (f"/{v.subdir}" if v.subdir else "") for v in options.CACHE_ENV]


def test_status_redacts_and_ignores_what_the_secret_rows_say():
    from kimi_deploy.host import status

    assert status.SECRET_OPTIONS == ("--api-key", "--admin-api-key") == options.secret_flags()
    assert status.IGNORED_OPTIONS == ("--config", "--api-key", "--admin-api-key") == options.merged_flags()


def test_the_files_reference_names_every_cache_variable(repo_root):
    text = (repo_root / "docs" / "reference" / "files.md").read_text()
    caches = text[text.index("## Caches"):]
    caches = caches[:caches.index("\n## ")]
    assert [v.name for v in options.CACHE_ENV] == [
        n for n in re.findall(r"`([A-Z_]+)`", caches) if n in {v.name for v in options.CACHE_ENV}]


def test_version_rules_are_the_rows_spellings():
    assert {r.feature for r in versions.RULES} == {o.key for o in options.ALL_OPTIONS if o.spellings}
    assert len(versions.RULES) == sum(len(o.spellings) for o in options.ALL_OPTIONS)


def test_fleet_rows_are_not_sglang_keys_and_say_where_they_come_from():
    """--nnodes, --node-rank, --dist-init-addr, --dist-timeout come from [fleet] on every rank: no [sglang] field,
    a set_from naming the [fleet] key, owned (extra_args refuses them), and in docs/reference/profile.md's table."""
    for option in options.FLEET_OPTIONS:
        assert option.key not in SGLang.model_fields
        assert option.set_from and option.set_from.startswith("[fleet]"), option.key
        # emitted by the rank builder from [fleet], never by an [sglang] row's handler
        assert option.scope is options.Scope.EVERY_RANK and option.emit == "none", option.key
        assert all(options.owned_flags()[flag] == option.set_from for flag in option.flags)
        assert f"| set from {option.set_from} |" in options.markdown_table()
    assert [o.key for o in options.FLEET_OPTIONS] == ["nnodes", "node_rank", "dist_init_addr", "dist_timeout"]


@pytest.mark.parametrize("option", [o for o in options.OPTIONS if o.emit in ("value", "switch", "env-switch")],
                         ids=lambda o: o.key)
def test_every_row_reaches_the_launch_in_its_spelling(option):
    """Setting a row's key puts the row's 0.5.23 spelling, and only then, into argv or env."""
    sglang = {"model_path": "/models/kimi", "tp_size": 2, option.key: VALUES[option.key]}  # KeyError: add a value
    if option.requires or any(o.requires == option.key for o in options.OPTIONS):
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


def test_the_profile_reference_carries_the_table(repo_root):
    """docs/reference/profile.md's option table is :func:`options.markdown_table`'s; after adding a row, rewrite it
    with ``KIMI_DEPLOY_UPDATE_GOLDEN=1 python -m pytest tests/test_options_table.py`` (the golden files' command),
    which runs ``scripts/gen-reference``'s rewrite of the page's generated blocks."""
    path = repo_root / "docs" / "reference" / "profile.md"
    if os.environ.get("KIMI_DEPLOY_UPDATE_GOLDEN") == "1":
        path.write_text(runpy.run_path(str(repo_root / "scripts" / "gen-reference"), run_name="gen_reference")
                        ["regenerate"](path.read_text()))
    assert options.markdown_table() in path.read_text()


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


def test_patch_gates_name_rows_and_take_their_flags_from_them():
    """A series' ``[[patch.needed_by]]`` gate names a row (``setting``) and, for what switches it off again, rows
    (``unless``); the flags doctor looks for in the rendered command are those rows' (the flag the row renders
    for the series' release among them, else doctor misses the feature). The table is the one source of flags."""
    from kimi_deploy.patching import available_versions, find_series

    owned = options.owned_flags()
    gates = [(version, gate) for version in available_versions() for spec in find_series(version).patch
             for gate in spec.needed_by]
    assert gates
    for version, gate in gates:
        row = options.BY_KEY[gate.setting]
        assert set(gate.flags) <= set(row.flags), (version, gate.setting)
        assert versions.spelling(gate.setting, Version(version)).spelling in gate.flags, (version, gate.setting)
        assert gate.flags[0] == versions.spelling(gate.setting, Version(version)).spelling, (version, gate.setting)
        assert all(owned[flag] in gate.unless for flag in gate.unless_flags), (version, gate.unless_flags)
    fusion = next(g for _, g in gates if g.setting == "flashinfer_allreduce_fusion_backend")
    assert fusion.flags == ("--flashinfer-allreduce-fusion-backend", "--enable-flashinfer-allreduce-fusion")
    assert fusion.unless_flags == ("--enforce-disable-flashinfer-allreduce-fusion",)


@pytest.mark.parametrize("field,value,said", [
    ("setting", "enable_torch_symm", "did you mean 'enable_torch_symm_mem'"),
    ("unless", ["enforce_disable_flashinfer_allreduce"], "did you mean 'enforce_disable_flashinfer_allreduce_fusion'"),
    ("flags", ["--enable-torch-symm-mem"], "Extra inputs are not permitted"),
])
def test_a_gate_that_names_no_row_does_not_load(field, value, said):
    from pydantic import ValidationError

    from kimi_deploy.patching import FeatureGate

    data = {"setting": "enable_torch_symm_mem", "compute_capability_major": [12], "without": "disabled",
            "symptom": "s", field: value}
    with pytest.raises(ValidationError, match=said):
        FeatureGate(**data)


def test_a_row_added_to_the_table_leaves_every_digest_alone_until_set():
    """Installed manifests and the golden files record the profile digest: a row outside the frozen first
    keys (``pp_size``, ``max_prefill_tokens``: rows added later) is left out of it while at its default, so
    adding a row is one row, not a row plus a digest exception; setting the row changes the digest."""
    from kimi_deploy.profile import DIGEST_OMITS_UNSET, DIGEST_SGLANG_KEYS, RUNBOOK_DEFAULT_DIGESTED

    assert DIGEST_SGLANG_KEYS <= {o.key for o in options.OPTIONS}
    later = [o for o in options.OPTIONS if o.key not in DIGEST_SGLANG_KEYS]
    assert {"pp_size", "max_prefill_tokens"} <= {o.key for o in later}
    base = {"service": {"name": "k", "gpu_count": 8}, "sglang": {"model_path": "/m", "tp_size": 8}}
    plain = parse_profile(base)
    data = plain.model_dump(mode="json")
    data["monitoring"]["runbook_url"] = RUNBOOK_DEFAULT_DIGESTED  # a moved default is hashed as its first value
    for o in later:
        del data["sglang"][o.key]
    import hashlib
    optional = DIGEST_OMITS_UNSET  # tables left out of the digest while absent
    assert set(optional) == {"fleet", "gateway", "kubernetes", "quality", "startup", "rollout", "tune"}
    blob = json.dumps({k: v for k, v in data.items() if v is not None or k not in optional},
                      sort_keys=True, separators=(",", ":"))
    assert plain.digest() == hashlib.sha256(blob.encode()).hexdigest()
    for o in later:
        explicit = parse_profile({**base, "sglang": {**base["sglang"], o.key: options.init_example(o, "k")}})
        assert (explicit.digest() == plain.digest()) is (options.init_example(o, "k") == o.default), o.key
