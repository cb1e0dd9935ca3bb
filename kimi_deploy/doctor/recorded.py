"""``kimi-deploy facts``: record on the GPU host what the memory plan needs, to size the profile elsewhere.

What is recorded (file name under ``--out DIR`` -> content), exactly what ``validate`` reads off the host:

- ``gpus.csv``: this host's ``nvidia-smi --query-gpu=index,name,pci.bus_id,compute_cap,memory.total,driver_version
  --format=csv`` (:func:`kimi_deploy.doctor.record_gpu_query`), for ``validate --gpu-facts DIR/gpus.csv``;
- ``model/config.json`` (the model's own, byte for byte) and ``model/header-index.json`` (its safetensors headers,
  :func:`kimi_deploy.sizing.memory.read_header_index`, a few KiB), for ``--model-facts DIR/model``;
- with ``speculative_draft_model_path``: the same under ``draft/``, for ``--draft-facts DIR/draft``.

No weight byte is read beyond the shards' headers, and no key file.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path
from typing import Any

from kimi_deploy.doctor import record_gpu_query  # this package: the nvidia-smi probe doctor runs
from kimi_deploy.errors import UsageError
from kimi_deploy.profile import Profile
from kimi_deploy.sizing.memory import ModelFacts, read_header_index
from kimi_deploy.wire.inputs import read_regular
from kimi_deploy.wire.limits import parse_json

#: ``(sub-folder, validate's flag)`` of each model directory recorded.
FOLDERS = (("model", "--model-facts"), ("draft", "--draft-facts"))


@dataclasses.dataclass(frozen=True)
class RecordedFacts:
    """``files``: name under the output folder -> text; ``skipped``: what could not be recorded and why."""

    files: dict[str, str]
    skipped: tuple[str, ...] = ()

    def validate_command(self, profile_path: str, out_dir: Path) -> str:
        """The ``kimi-deploy validate`` command that sizes the profile elsewhere from these files."""
        argv = ["kimi-deploy", "validate", "--profile", profile_path]
        if "gpus.csv" in self.files:
            argv += ["--gpu-facts", str(out_dir / "gpus.csv")]
        for folder, flag in FOLDERS:
            if f"{folder}/config.json" in self.files:
                argv += [flag, str(out_dir / folder)]
        return shlex.join(argv)

    def to_dict(self, out_dir: Path | None = None) -> dict[str, Any]:
        return {"files": {name: str(out_dir / name) if out_dir else None for name in self.files},
                "skipped": list(self.skipped)}


def _model(folder: str, path: str) -> dict[str, str]:
    """``folder/config.json`` and ``folder/header-index.json`` of the model directory ``path``.

    Raises:
        UsageError: no readable config.json, no shard, an unreadable shard header, or a config the plan cannot
            read (:meth:`ModelFacts.from_config`).
    """
    root = Path(path)
    try:
        text = read_regular(root / "config.json").decode("utf-8")
        config = parse_json(text)
    except (OSError, ValueError) as exc:
        raise UsageError("cannot read the model's config.json", value=str(root / "config.json"),
                         hint="run facts on the host that holds the downloaded model (model_path)") from exc
    if not isinstance(config, dict):
        raise UsageError("config.json is not a JSON object", value=str(root / "config.json"))
    index = read_header_index(root)
    ModelFacts.from_config(config, index, name=str(root))  # what validate will read: refused here, not there
    return {f"{folder}/config.json": text,
            f"{folder}/header-index.json": json.dumps(index.to_dict(), indent=2) + "\n"}


def record_facts(profile: Profile) -> RecordedFacts:
    """Read this host's GPUs and the profile's model (and draft) directories.

    A host without a GPU still records the model (``skipped`` says why ``gpus.csv`` is missing).

    Raises:
        UsageError: a model directory that cannot be recorded (:func:`_model`).
    """
    s = profile.sglang
    files: dict[str, str] = {}
    skipped = []
    query, why = record_gpu_query()
    if query is None:
        skipped.append(f"gpus.csv: {why}")
    else:
        files["gpus.csv"] = query
    files.update(_model("model", s.model_path))
    if s.speculative_draft_model_path:
        files.update(_model("draft", s.speculative_draft_model_path))
    return RecordedFacts(files, tuple(skipped))
