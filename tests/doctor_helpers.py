"""Test helpers for the doctor: tiny safetensors model directories and a fake nvidia-smi."""

from __future__ import annotations

import json
import stat
import struct
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "nvidia-smi"


def write_safetensors(path: Path, nbytes: int = 32, *, truncate: int = 0) -> None:
    """A valid one-tensor safetensors file of ``8 + header + nbytes`` bytes (minus ``truncate``)."""
    header = json.dumps({"w": {"dtype": "U8", "shape": [nbytes], "data_offsets": [0, nbytes]}}).encode()
    blob = struct.pack("<Q", len(header)) + header + bytes(nbytes)
    path.write_bytes(blob[: len(blob) - truncate] if truncate else blob)


def make_model_dir(root: Path, shards: int = 3, *, missing: int | None = None, truncated: int | None = None,
                   config: bool = True, width: int = 5) -> Path:
    """A sharded model directory with ``model.safetensors.index.json`` naming ``shards`` files
    (``model-00001-of-{shards:0{width}d}.safetensors``: Moonshot publishes a six-digit total)."""
    root.mkdir(parents=True, exist_ok=True)
    if config:
        (root / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"]}))
    names = [f"model-{i + 1:05d}-of-{shards:0{width}d}.safetensors" for i in range(shards)]
    weight_map = {f"layer.{i}.w": name for i, name in enumerate(names)}
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    for i, name in enumerate(names):
        if i == missing:
            continue
        write_safetensors(root / name, 64, truncate=7 if i == truncated else 0)
    return root


def install_fake_nvidia_smi(bin_dir: Path, query: str | None, topo: str | None = None, *,
                            error_file: str | None = None, returncode: int = 9,
                            p2p: tuple[str, str] | None = None) -> Path:
    """Write ``bin_dir/nvidia-smi`` that replays recordings from tests/data/nvidia-smi.

    It prints ``query`` for the exact argv of :func:`kimi_deploy.facts.nvidia.query_gpu_command`,
    ``topo`` for ``topo -m``; with ``error_file`` it prints that and exits ``returncode`` (what
    nvidia-smi does without a loaded driver). Any other argv exits 64, so a changed command
    builder fails the tests.
    """
    from kimi_deploy.facts import nvidia

    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "nvidia-smi"
    table = {
        json.dumps(nvidia.query_gpu_command()[1:]): str(DATA / query) if query else None,
        json.dumps(nvidia.topology_command()[1:]): str(DATA / topo) if topo else None,
    }
    if p2p:  # recordings of tests/data/fabric for `topo -p2p r` and `topo -p2p w`
        from kimi_deploy.doctor import fabric

        for cap, name in zip(("r", "w"), p2p):
            table[json.dumps(fabric.p2p_command(cap)[1:])] = str(DATA.parent / "fabric" / name)
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        f"table = {table!r}\n"
        f"error = {str(DATA / error_file) if error_file else None!r}\n"
        "if error:\n"
        "    sys.stdout.write(open(error).read()); sys.exit(" + str(returncode) + ")\n"
        "path = table.get(json.dumps(sys.argv[1:]))\n"
        "if not path:\n"
        "    sys.stderr.write('fake nvidia-smi: unexpected arguments %r\\n' % sys.argv[1:]); sys.exit(64)\n"
        "sys.stdout.write(open(path).read())\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script
