"""What SGLang 0.5.23 resolves for the reference preset on the recorded 8 x RTX PRO 6000 GPUs, with the source line
of each value, and the memory plan checked against SGLang's own KV sizing (the SGLang test environment).

``refused``: the reference preset with its memory settings left to SGLang (what every preset did before they
were written out): SGLang's own choice does not hold the weights. Every preset as written fits
(:func:`test_every_reference_host_preset_validates_as_written_and_fits`)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from kimi_deploy import engine as target
from kimi_deploy.cli import cli
from kimi_deploy.launch import build_launch
from kimi_deploy.catalog.presets import MEMORY_WITH_DRAFT, PRESETS, get_preset
from kimi_deploy.profile import dump_profile, parse_profile
from kimi_deploy.sizing.memory import KV_TOKENS_TOLERANCE, GpuFacts
from kimi_deploy.sizing.report import size_profile

pytestmark = pytest.mark.sglang
PRESET = "kimi-k25-rtx-pro-6000-x8"
DATA = Path(__file__).parent / "data"
GPUS = DATA / "nvidia-smi/query-8x-server-580.csv"
MODEL = DATA / "models/kimi-k2.5-int4"
DRAFT = DATA / "models/kimi-k2.5-eagle3-mla"
FACTS = ["--gpu-facts", str(GPUS), "--model-facts", str(MODEL), "--draft-facts", str(DRAFT)]


def _sglang_defaults(tmp_path: Path) -> Path:
    """The reference preset with its memory settings left to SGLang, as a profile file."""
    data = copy.deepcopy(get_preset(PRESET).data)
    for key in MEMORY_WITH_DRAFT:
        del data["sglang"][key]
    path = tmp_path / "sglang-defaults.toml"
    path.write_text(dump_profile(parse_profile(data)))
    return path


def _size(profile, python):
    gpus = GpuFacts.from_query(GPUS.read_text(), "recorded")
    return size_profile(profile, python, build_launch(profile).server_args, gpus=gpus, model_facts=MODEL,
                        draft_facts=DRAFT)


@pytest.fixture(scope="module")
def refused(sglang_python, tmp_path_factory):
    """``validate --json`` on the reference preset without its memory settings, with the recorded facts (one SGLang
    run for several tests)."""
    from click.testing import CliRunner

    profile = _sglang_defaults(tmp_path_factory.mktemp("refused"))
    result = CliRunner().invoke(cli, ["validate", "--profile", str(profile), "--python", sglang_python, *FACTS,
                                      "--json"])
    return result.exit_code, json.loads(result.stdout)


@pytest.fixture(scope="module")
def roomy(sglang_python):
    data = copy.deepcopy(get_preset(PRESET).data)
    data["sglang"].update(mem_fraction_static=0.93, context_length=131072)
    return _size(parse_profile(data), sglang_python)


def test_sglang_resolves_the_unset_memory_settings_with_their_sources(refused):
    eff = refused[1]["sizing"]["effective"]
    assert eff["errors"] == [] and eff["failed_steps"] == []
    by = {v["field"]: v for v in eff["values"]}
    assert by["mem_fraction_static"]["resolved"] == pytest.approx(0.7578, abs=1e-4)
    assert by["mem_fraction_static"]["source"].startswith("sglang/srt/arg_groups/memory_hook.py:")
    assert by["mem_fraction_static"]["given"] is False and by["mem_fraction_static"]["flag"] == "--mem-fraction-static"
    assert by["max_running_requests"]["resolved"] == 48  # "with EAGLE and no --max-running-requests, SGLang picks 48"
    assert by["max_running_requests"]["source"].startswith("sglang/srt/arg_groups/speculative_hook.py:")
    assert by["chunked_prefill_size"]["resolved"] == 8192
    assert by["cuda_graph_config"]["resolved"]["decode"]["max_bs"] == 512
    assert by["attention_backend"]["resolved"] == "triton"
    # the recorded GPU reached SGLang's own memory query (a 97887 MiB card: the 90-160 GiB row of memory_hook.py)
    assert eff["gpus"]["memory_mib"] == 97887
    assert any("stood in for at import" in n for n in eff["notes"])


def test_each_source_line_is_where_sglang_declares_it(refused, sglang_python):
    """The file:line of every value is a line of the installed SGLang that declares it (a declare_resolution call,
    or the return of a resolution pass)."""
    location = Path(target.probe(sglang_python).sglang_location)
    checked = 0
    for value in refused[1]["sizing"]["effective"]["values"]:
        path, line = value["source"].rsplit(":", 1)
        lines = (location.parent / path).read_text().splitlines()
        window = "\n".join(lines[int(line) - 1:int(line) + 2])
        assert re.search(r"declare_resolution|return|\.extend\(", window), (value, window)
        checked += 1
    assert checked >= 20


def test_the_plan_refuses_sglangs_own_default_and_sglang_agrees(refused):
    code, data = refused
    assert code == 4 and data["refused"] is True and data["ok"] is True  # the parser accepts; the plan refuses
    plan = data["sizing"]["memory"]
    assert plan["verdict"] == "will not fit"
    assert plan["weights_bytes"] == 76_406_061_024
    assert plan["mem_fraction_static"]["source"].startswith("sglang sglang/srt/arg_groups/memory_hook.py:")
    assert "set [sglang] mem_fraction_static above 0.77 for the weights alone" in plan["problems"][0]
    # SGLang's own sizing on the same inputs stops with its own message and nearly the same threshold
    error = data["sizing"]["effective"]["kv_check"]["error"]
    assert "Loaded weights leave no GPU memory for the KV cache" in error
    assert "Raise --mem-fraction-static above 0.769" in error
    assert {"field", "flag", "given", "input", "resolved", "declared_by", "source"} <= \
        set(data["sizing"]["effective"]["values"][0])


def test_kv_tokens_agree_with_sglangs_pool_sizing(roomy):
    agree = roomy.agreement
    assert agree is not None, roomy.effective.kv_check
    assert agree["ok"] and agree["relative"] <= KV_TOKENS_TOLERANCE
    assert agree["plan"] == roomy.plan.kv_tokens == 226_002
    assert abs(agree["sglang"] - agree["plan"]) <= 10
    assert roomy.effective.kv_check["cell_size"] == roomy.plan.kv_bytes_per_token + roomy.plan.draft_kv_bytes_per_token
    assert roomy.effective.kv_check["context_len"] == 131072
    assert roomy.plan.verdict == "tight" and roomy.plan.mem_fraction_static.source == "profile"
    assert dict(roomy.plan.concurrency)[8192] == 27
    assert not any(v.field == "mem_fraction_static" for v in roomy.effective.values)  # given, and kept


def test_cli_text_and_the_risk_flag(cli_runner, sglang_python, tmp_path):
    accepted = cli_runner.invoke(cli, ["validate", "--profile", str(_sglang_defaults(tmp_path)), "--python",
                                       sglang_python, *FACTS, "--accept-memory-risk"])
    assert accepted.exit_code == 0, accepted.output
    out = accepted.stdout
    assert "--mem-fraction-static = 0.7578" in out and "memory_hook.py:" in out
    assert "weights per rank: target 71.16 GiB, draft 0.75 GiB" in out
    assert "accepted with --accept-memory-risk: the memory plan says this profile will not fit" in out


K2_THINKING_WEIGHTS = DATA / "models/kimi-k2-thinking-int4/header-index.json"


def _k2_thinking_facts(tmp_path: Path) -> Path:
    """K2-Thinking's stand-in: K2.5's DeepseekV3 text model config (tests/data/models/README.md: the same text
    model, no vision tower) beside K2-Thinking's recorded header index."""
    folder = tmp_path / "kimi-k2-thinking"
    folder.mkdir()
    config = json.loads((MODEL / "config.json").read_text())["text_config"]
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "header-index.json").write_text(K2_THINKING_WEIGHTS.read_text())
    return folder


#: Preset -> the recorded model facts that stand for its model (K2.6: K2.5's, the same architecture and files;
#: tests/data/models/README.md). K2.7-Code has none: its size is not in the kit's sources.
SIZED = {name: preset.model for name, preset in PRESETS.items() if preset.model in ("k2.5", "k2.6", "k2-thinking")}


@pytest.mark.parametrize("name", sorted(SIZED))
def test_every_reference_host_preset_validates_as_written_and_fits(name, cli_runner, sglang_python, tmp_path):
    """`validate` of each reference-host preset as written, on the recorded 8 x RTX PRO 6000 and model facts: exit 0,
    verdict "fits" (not "tight"), the memory settings the profile's own (none left to SGLang), and SGLang's own
    KV sizing on the same inputs within the tolerance of the plan."""
    preset = get_preset(name)
    model = _k2_thinking_facts(tmp_path) if SIZED[name] == "k2-thinking" else MODEL
    facts = ["--gpu-facts", str(DATA / "nvidia-smi/query-8x-workstation-570.csv"), "--model-facts", str(model)]
    if preset.data["sglang"].get("speculative_draft_model_path"):
        facts += ["--draft-facts", str(DRAFT)]
    result = cli_runner.invoke(cli, ["validate", "--preset", name, "--python", sglang_python, *facts, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    plan = data["sizing"]["memory"]
    assert plan["verdict"] == "fits", (plan["problems"], plan["warnings"])
    assert data["refused"] is False and data["sizing"]["agreement"]["ok"], data["sizing"]["agreement"]
    assert plan["mem_fraction_static"]["source"] == "profile"
    assert plan["context_length"]["source"] == "profile"
    assert min(r["requests"] for r in plan["concurrency"]) >= 2
