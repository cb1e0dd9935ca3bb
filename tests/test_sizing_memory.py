"""The memory plan (kimi_deploy.sizing.memory) on the recorded Kimi K2.5 inputs (tests/data/models) and the
recorded 8 x RTX PRO 6000 GPUs (tests/data/nvidia-smi). Pure: no SGLang; test_validate_sizing.py checks the
same numbers against SGLang's own code."""

from __future__ import annotations

import copy
import json
import struct
from pathlib import Path

import pytest

from kimi_deploy.errors import UsageError
from kimi_deploy.catalog.presets import MEMORY_WITH_DRAFT, get_preset
from kimi_deploy.profile import parse_profile
from kimi_deploy.sizing.memory import (
    GIB, Facts, GpuFacts, ModelFacts, TensorGroup, group_tensors, load_header_index, plan, read_header_index,
)

DATA = Path(__file__).parent / "data"
MODELS = DATA / "models"
PRESET = "kimi-k25-rtx-pro-6000-x8"


@pytest.fixture(scope="module")
def facts_of():
    gpus = GpuFacts.from_query((DATA / "nvidia-smi/query-8x-server-580.csv").read_text(), "recorded")
    model = ModelFacts.load(MODELS / "kimi-k2.5-int4")
    draft = ModelFacts.load(MODELS / "kimi-k2.5-eagle3-mla")

    def make(**resolved):
        return Facts(gpus, model, draft, resolved=resolved)
    return make


def variant(**sglang):
    """The reference preset with its memory settings left to SGLang (as before they were written out), then
    ``sglang``'s keys."""
    data = copy.deepcopy(get_preset(PRESET).data)
    for key in MEMORY_WITH_DRAFT:
        del data["sglang"][key]
    data["sglang"].update(sglang)
    return parse_profile(data)


def test_recorded_k25_index_matches_the_published_checkpoint():
    """208,550 tensors, 554.27 GiB of tensor data: the published file list's own totals."""
    index = load_header_index(MODELS / "kimi-k2.5-int4/header-index.json")
    assert index.tensors == 208_550
    assert index.nbytes / GIB == pytest.approx(554.27, abs=0.01)
    # K2-Thinking: the same language model, no vision tower, no language_model. prefix
    thinking = load_header_index(MODELS / "kimi-k2-thinking-int4/header-index.json")
    assert not any(g.name.startswith(("language_model.", "vision_tower.", "mm_projector.")) for g in thinking.groups)
    assert (index.nbytes - thinking.nbytes) / GIB == pytest.approx(0.88, abs=0.01)


def test_weights_per_rank_split_and_replicated():
    model = ModelFacts.load(MODELS / "kimi-k2.5-int4")
    whole = sum(g.nbytes for g in model.weights.groups if g.replicated)
    # replicated on every rank: q_a_proj (1.25 GiB), kv_a_proj_with_mqa (0.47), the router (0.31), mm_projector, norms
    assert whole / GIB == pytest.approx(2.14, abs=0.01)
    assert model.weights.per_rank(8) / GIB == pytest.approx(71.16, abs=0.01)
    assert model.weights.per_rank(8) == (model.weights.nbytes - whole) // 8 + whole
    draft = ModelFacts.load(MODELS / "kimi-k2.5-eagle3-mla")
    assert draft.weights.nbytes / 1e9 == pytest.approx(6.03, abs=0.01)  # "~6 GB" published for the checkpoint
    assert draft.weights.per_rank(8) / GIB == pytest.approx(0.75, abs=0.01)


def test_kv_bytes_per_token_mla():
    """MLA: (kv_lora_rank 512 + qk_rope_head_dim 64) x 61 layers x 2 bytes, the same on every TP rank."""
    model = ModelFacts.load(MODELS / "kimi-k2.5-int4")
    assert model.mla and model.num_layers == 61 and model.max_context == 262144 and model.multimodal
    assert model.kv_values_per_token_layer(8) == 576
    p = plan(variant(), Facts(
        GpuFacts.from_query((DATA / "nvidia-smi/query-8x-server-580.csv").read_text(), "recorded"), model,
        ModelFacts.load(MODELS / "kimi-k2.5-eagle3-mla"), resolved={"mem_fraction_static": 0.93}))
    assert p.kv_bytes_per_token == 576 * 61 * 2 == 70272
    assert p.draft_kv_bytes_per_token == 576 * 1 * 2


def test_sglangs_default_fraction_leaves_no_room_for_the_weights(facts_of):
    """SGLang 0.5.23 resolves mem_fraction_static 0.758 for this model on 97887 MiB GPUs (test_validate_sizing)."""
    p = plan(variant(), facts_of(mem_fraction_static=0.757810361328125, max_running_requests=48))
    assert p.verdict == "will not fit" and not p.fits and p.kv_tokens == 0
    assert "set [sglang] mem_fraction_static above 0.77 for the weights alone" in p.problems[0]
    assert "0.956 to also hold one request of context_length 262144" in p.problems[0]


def test_a_fraction_that_holds_the_weights_but_not_one_max_length_request(facts_of):
    p = plan(variant(), facts_of(mem_fraction_static=0.93))
    assert p.verdict == "will not fit"
    assert p.kv_tokens == 226_002
    assert p.problems == ("the KV cache holds 226002 tokens, less than one request of context_length 262144; set "
                          "[sglang] context_length = 226002 or less, or mem_fraction_static to 0.956, or "
                          "kv_cache_dtype fp8_e4m3 in extra_args (halves bytes per token)",)


def test_fits_and_tight_with_the_context_length_to_match(facts_of):
    tight = plan(variant(context_length=131072), facts_of(mem_fraction_static=0.93, context_length=131072,
                                                         max_running_requests=48))
    assert tight.verdict == "tight" and tight.fits
    assert "one request of context_length 131072 at a time" in tight.warnings[0]
    fits = plan(variant(context_length=65536), facts_of(mem_fraction_static=0.93, context_length=65536,
                                                       max_running_requests=48))
    assert fits.verdict == "fits" and fits.problems == fits.warnings == ()
    assert dict(fits.concurrency) == {8192: 27, 32768: 6, 65536: 3}
    assert fits.to_dict()["concurrency"][0] == {"context": 8192, "requests": 27}


def test_profile_fraction_that_starves_cuda_graphs_is_tight(facts_of):
    profile = variant(mem_fraction_static=0.95, context_length=65536)
    p = plan(profile, Facts(facts_of().gpus, facts_of().model, facts_of().draft))
    assert p.mem_fraction_static.source == "profile"
    assert p.verdict == "tight" and "leaves 4.68 GiB for activations and CUDA graphs" in p.warnings[0]


def test_fp8_kv_halves_the_bytes_per_token(facts_of):
    p = plan(variant(), facts_of(mem_fraction_static=0.93, kv_cache_dtype="fp8_e4m3"))
    assert p.kv_bytes_per_token == 35136 and p.kv_tokens == 452_005 and p.verdict == "tight"  # 1.7 max-length requests


def test_unknown_fraction_is_no_refusal(facts_of):
    p = plan(variant(), facts_of())
    assert p.verdict == "unknown" and p.fits and "mem_fraction_static is unknown" in p.warnings[0]


def _write_shard(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        size = {"BF16": 2, "I32": 4}[dtype]
        for d in shape:
            size *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


def test_reads_real_safetensors_headers_into_groups(tmp_path):
    _write_shard(tmp_path / "model-1.safetensors", {
        f"model.layers.{i}.self_attn.o_proj.weight": ("BF16", [4, 8]) for i in range(3)})
    _write_shard(tmp_path / "model-2.safetensors", {
        **{f"model.layers.{i}.mlp.experts.{e}.up_proj.weight_packed": ("I32", [2, 2]) for i in range(3) for e in range(4)},
        "model.layers.1.input_layernorm.weight": ("BF16", [4]), "lm_head.weight": ("BF16", [16, 4])})
    index = read_header_index(tmp_path)
    names = {g.name: g.count for g in index.groups}
    assert names == {"model.layers.{0-2}.self_attn.o_proj.weight": 3,
                     "model.layers.{0-2}.mlp.experts.{0-3}.up_proj.weight_packed": 12,
                     "model.layers.{1-1}.input_layernorm.weight": 1, "lm_head.weight": 1}
    assert index.nbytes == 3 * 64 + 12 * 16 + 8 + 128
    # what the recorded files are: the same shape, written back and read again
    (tmp_path / "header-index.json").write_text(json.dumps(index.to_dict()))
    assert load_header_index(tmp_path / "header-index.json").groups == index.groups


def test_a_truncated_header_is_a_usage_error(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 500) + b"{")
    with pytest.raises(UsageError, match="header is unreadable"):
        read_header_index(tmp_path)


def test_group_tensors_keeps_gaps_apart():
    groups = group_tensors([("a.1.w", "BF16", (2,)), ("a.3.w", "BF16", (2,))])
    assert [g.name for g in groups] == ["a.{1-1}.w", "a.{3-3}.w"]
    assert TensorGroup("a.{1-1}.w", "BF16", (2,)).replicated


def test_gpu_facts_take_the_smallest_card():
    text = (DATA / "nvidia-smi/query-4x-workstation-580.csv").read_text()
    gpus = GpuFacts.from_query(text, "recorded")
    assert gpus.count == 4 and gpus.memory_mib > 0
    with pytest.raises(UsageError):
        GpuFacts.from_query("not a csv", "x")


def test_validate_with_an_unreadable_model_directory_still_reports_the_parser(tmp_path, monkeypatch):
    """A partial download stops the sizing, not validate: the note says why (no SGLang needed to show it)."""
    from kimi_deploy.sizing import report

    (tmp_path / "config.json").write_text((MODELS / "kimi-k2.5-int4/config.json").read_text())
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 500) + b"{")
    gpus = GpuFacts.from_query((DATA / "nvidia-smi/query-8x-server-580.csv").read_text(), "recorded")
    with pytest.raises(UsageError, match="header is unreadable"):
        report.size_profile(variant(), "/nonexistent/python", [], gpus=gpus, model_facts=tmp_path,
                            draft_facts=MODELS / "kimi-k2.5-eagle3-mla")
    skipped = report.size_profile(variant(), "/nonexistent/python", [], gpus=None)
    assert skipped.plan is None and skipped.effective is None
    assert skipped.skipped[0].startswith("no GPU facts")
    assert "/models/moonshotai/Kimi-K2.5 is not on this machine" in skipped.skipped[1]
    assert skipped.lines()[0].startswith("note: not sized: no GPU facts")


def test_sglangs_own_fraction_for_its_floor_is_not_tight(facts_of):
    """SGLang picks mem_fraction_static = round((97887 - 10240) / 97887, 3) = 0.895 itself when its reserve estimate is
    at its 10240 MiB floor (memory_hook.py); a profile that writes the same value is not "tight", although the slack
    SGLang then keeps (pre-load memory x 0.105 = 9.83 GiB) is under 10 GiB. One step above it is."""
    at = plan(variant(mem_fraction_static=0.895, context_length=65536), Facts(facts_of().gpus, facts_of().model,
                                                                            facts_of().draft))
    assert round(at.reserve_bytes / GIB, 2) == 9.83 and at.verdict == "fits", at.warnings
    above = plan(variant(mem_fraction_static=0.896, context_length=65536), Facts(facts_of().gpus, facts_of().model,
                                                                               facts_of().draft))
    assert above.verdict == "tight" and "would meet with mem_fraction_static 0.895" in above.warnings[0]


def test_the_reserve_follows_sglangs_own_estimate_of_the_resolved_settings(facts_of):
    """With SGLang's resolved chunked_prefill_size and CUDA graphs, the least reserve is SGLang's own estimate
    (memory_hook.py: 512 + 1.5 x 8192 + 1024 + 2 x 512 + 1536 = 16384 MiB for SGLang's defaults here), not the floor."""
    from kimi_deploy.sizing.memory import sglang_reserve

    graphs = {"decode": {"backend": "full", "max_bs": 512}, "prefill": {"backend": "breakable", "bs": [1, 2]}}
    resolved = {"chunked_prefill_size": 8192, "cuda_graph_config": graphs, "tp_size": 8}
    assert sglang_reserve(resolved, mla=True, gpu_mib=97887)[0] == 16384
    small = {**resolved, "chunked_prefill_size": 4096, "cuda_graph_config": {**graphs, "decode": {"max_bs": 48}}}
    assert sglang_reserve(small, mla=True, gpu_mib=97887)[0] == 10240  # 9312, raised to the floor
    assert sglang_reserve({}, mla=True, gpu_mib=97887) is None
    p = plan(variant(mem_fraction_static=0.895, context_length=65536),
             facts_of(mem_fraction_static=0.895, context_length=65536, **resolved))
    assert p.mem_fraction_static.source == "profile"
    assert p.verdict == "tight" and "16384 MiB" in p.warnings[0] and "0.833" in p.warnings[0]


def _k2_thinking() -> ModelFacts:
    """K2-Thinking: K2.5's DeepseekV3 text config (no vision tower) over its own recorded header index."""
    config = json.loads((MODELS / "kimi-k2.5-int4/config.json").read_text())["text_config"]
    return ModelFacts.from_config(config, load_header_index(MODELS / "kimi-k2-thinking-int4/header-index.json"))


@pytest.mark.parametrize("name", ["kimi-k25-rtx-pro-6000-x8", "kimi-k25-rtx-pro-6000-x8-pcie-ipc",
                                  "kimi-k26-rtx-pro-6000-x8", "kimi-k2-thinking-rtx-pro-6000-x8"])
def test_every_reference_host_preset_fits_as_written(facts_of, name):
    """The plan alone (no SGLang) on each preset's own values: "fits", every memory setting from the profile."""
    profile = get_preset(name).profile()
    base = facts_of()
    model = _k2_thinking() if "thinking" in name else base.model
    draft = base.draft if profile.sglang.speculative_draft_model_path else None
    p = plan(profile, Facts(base.gpus, model, draft))
    assert p.verdict == "fits", (p.problems, p.warnings)
    assert p.mem_fraction_static.source == p.context_length.source == "profile"
    assert min(requests for _context, requests in p.concurrency) >= 2


def test_the_runbooks_memory_settings_are_the_presets():
    """docs/runbook.md#size-the-memory shows the values every preset writes, no other."""
    import re
    import tomllib

    text = (Path(__file__).parent.parent / "docs/runbook.md").read_text()
    section = text[text.index("### Size the memory"):]
    block = re.search(r"```toml\n(.*?)```", section, re.S).group(1)
    assert tomllib.loads(block) == MEMORY_WITH_DRAFT
