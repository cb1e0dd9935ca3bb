"""Issue 43 item 9: `kimi-deploy facts` records on the GPU host what the memory plan needs (the GPU query, the
model's config.json and safetensors header index), so `validate --gpu-facts --model-facts` sizes the profile on
another machine from exactly what it would read on the host. A fake nvidia-smi replays a recorded query; the model
directory has real safetensors shards."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest

from doctor_helpers import DATA, install_fake_nvidia_smi, make_model_dir
from helpers import run_cli, write_profile
from kimi_deploy.sizing.memory import GpuFacts, ModelFacts, read_header_index

MODELS = Path(__file__).resolve().parent / "data" / "models"


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A GPU host: a fake nvidia-smi alone on PATH, a model and a draft directory, a profile naming them."""
    bin_dir = tmp_path / "bin"
    install_fake_nvidia_smi(bin_dir, "query-8x-server-580.csv")
    monkeypatch.setenv("PATH", str(bin_dir))
    model = make_model_dir(tmp_path / "Kimi-K2.5", config=False)
    shutil.copy(MODELS / "kimi-k2.5-int4" / "config.json", model / "config.json")
    draft = make_model_dir(tmp_path / "eagle3", shards=1, config=False)
    shutil.copy(MODELS / "kimi-k2.5-eagle3-mla" / "config.json", draft / "config.json")
    profile = write_profile(tmp_path, f"""\
[service]
name = "kimi-k25"

[sglang]
model_path = "{model}"
tp_size = 8
speculative_algorithm = "EAGLE3"
speculative_draft_model_path = "{draft}"
""")
    return {"profile": profile, "model": model, "draft": draft}


def test_facts_records_what_validate_reads_and_says_the_command_to_run_elsewhere(host, tmp_path):
    out = tmp_path / "facts"
    result = run_cli(["facts", "--profile", str(host["profile"]), "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "draft/config.json", "draft/header-index.json", "gpus.csv", "model/config.json", "model/header-index.json"]
    assert (out / "gpus.csv").read_text() == (DATA / "query-8x-server-580.csv").read_text()
    assert (out / "model/config.json").read_bytes() == (host["model"] / "config.json").read_bytes()
    assert json.loads((out / "model/header-index.json").read_text()) == read_header_index(host["model"]).to_dict()
    # what validate reads from the recording is what it reads on the host
    for folder, path in (("model", host["model"]), ("draft", host["draft"])):
        recorded, live = ModelFacts.load(out / folder), ModelFacts.load(path)
        assert recorded.weights.groups == live.weights.groups and recorded.num_layers == live.num_layers
        assert recorded.kv_values_per_token_layer(8) == live.kv_values_per_token_layer(8)
    gpus = GpuFacts.from_query((out / "gpus.csv").read_text(), "recorded")
    assert gpus.count == 8
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("then, on any machine")]
    argv = shlex.split(line.split(": ", 1)[1])
    assert argv[:4] == ["kimi-deploy", "validate", "--profile", str(host["profile"])]
    assert argv[4:] == ["--gpu-facts", str(out / "gpus.csv"), "--model-facts", str(out / "model"),
                        "--draft-facts", str(out / "draft")]


def test_without_a_gpu_the_model_is_still_recorded_and_the_gap_said(host, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    out = tmp_path / "facts"
    result = run_cli(["facts", "--profile", str(host["profile"]), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert "gpus.csv" not in data["files"] and data["skipped"] == ["gpus.csv: nvidia-smi not found on PATH"]
    assert (out / "model/header-index.json").is_file()


def test_a_model_directory_without_shards_is_exit_2_and_nothing_written(host, tmp_path):
    for shard in host["model"].glob("*.safetensors"):
        shard.unlink()
    out = tmp_path / "facts"
    result = run_cli(["facts", "--profile", str(host["profile"]), "--out", str(out)])
    assert result.exit_code == 2 and "no safetensors shards" in result.stderr
    assert not out.exists()
