"""Inspect a local Hugging Face model directory: config, safetensors shards, sizes.

Format sources: ``model.safetensors.index.json`` has ``{"metadata": {...}, "weight_map":
{tensor: shard file}}`` (transformers' sharded checkpoints); a safetensors file is an
8-byte little-endian header length N, N bytes of JSON header whose tensors carry
``data_offsets: [begin, end]`` into the data that follows (huggingface/safetensors,
"Format"). A shard whose size is not ``8 + N + max(end)`` is truncated or padded: a
partial download.
"""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

from kimi_deploy.wire.inputs import INDEX_FILE_BYTES, read_regular
from kimi_deploy.wire.limits import parse_json

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


@dataclasses.dataclass(frozen=True)
class ModelDir:
    """What :func:`inspect_model_dir` found. ``weights_bytes``: sum of the shard sizes, bytes.

    ``problems``: one line each (missing config.json, missing or truncated shard, bad index);
    empty means the directory looks complete.
    """

    path: str
    exists: bool
    has_config: bool
    shards: tuple[str, ...]
    missing: tuple[str, ...]
    truncated: tuple[str, ...]
    weights_bytes: int
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.exists and not self.problems


def _read_header(path: Path) -> tuple[int, object] | None:
    """``(length, parsed JSON)`` of the safetensors file ``path``'s header (an 8-byte little-endian length, then that
    many bytes of JSON, at most 100 MiB), or ``None`` when it cannot be read."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(8)
            if len(raw) != 8:
                return None
            (n,) = struct.unpack("<Q", raw)
            if n > 100 * 1024 * 1024:
                return None
            return n, parse_json(fh.read(n))
    except (OSError, ValueError):
        return None


def safetensors_expected_size(path: Path) -> int | None:
    """The size ``path`` must have according to its own header (bytes), or ``None`` if unreadable."""
    read = _read_header(path)
    if read is None:
        return None
    n, header = read
    if not isinstance(header, dict):  # a header that is JSON but no object: not a safetensors file
        return None
    end = 0
    for name, entry in header.items():
        if name == "__metadata__" or not isinstance(entry, dict):
            continue
        offsets = entry.get("data_offsets") or [0, 0]
        end = max(end, int(offsets[1]))
    return 8 + n + end


def inspect_model_dir(path: str | Path) -> ModelDir:
    """Check ``path``: exists, has ``config.json``, every shard of the index exists with its header's size.

    Without an index, ``model.safetensors`` (or any ``*.safetensors``) is the shard set.
    Reads only shard headers (a few KiB each), never the weights.
    """
    root = Path(path)
    if not root.is_dir():
        return ModelDir(str(path), False, False, (), (), (), 0, (f"{path} is not a directory",))
    problems: list[str] = []
    has_config = (root / "config.json").is_file()
    if not has_config:
        problems.append("no config.json")
    shards: list[str] = []
    index = root / INDEX_NAME
    if index.is_file():
        try:
            weight_map = parse_json(read_regular(index, INDEX_FILE_BYTES).decode("utf-8"))["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            problems.append(f"{INDEX_NAME} is not a valid index ({type(exc).__name__})")
        if not shards and not problems:
            problems.append(f"{INDEX_NAME} names no shards")
    elif (root / SINGLE_NAME).is_file():
        shards = [SINGLE_NAME]
    else:
        shards = sorted(p.name for p in root.glob("*.safetensors"))
        if not shards:
            problems.append("no *.safetensors weights and no index")
    missing, truncated, total = [], [], 0
    for name in shards:
        shard = root / name
        if not shard.is_file():
            missing.append(name)
            continue
        size = shard.stat().st_size
        total += size
        if safetensors_expected_size(shard) != size:
            truncated.append(name)
    if missing:
        problems.append(f"{len(missing)} of {len(shards)} shards missing (first: {missing[0]})")
    if truncated:
        problems.append(f"{len(truncated)} shards truncated or unreadable (first: {truncated[0]})")
    return ModelDir(str(path), True, has_config, tuple(shards), tuple(missing), tuple(truncated), total,
                    tuple(problems))


def read_header_tensors(path: Path) -> list[tuple[str, str, tuple[int, ...]]] | None:
    """``(name, dtype, shape)`` of every tensor in the safetensors file ``path``'s header (dtype as the
    format spells it: ``BF16``, ``I32``, ...), or ``None`` when the header is unreadable. Reads the header
    only (same format rules as :func:`safetensors_expected_size`)."""
    read = _read_header(path)
    if read is None:
        return None
    header = read[1]
    if not isinstance(header, dict):
        return None
    tensors = []
    for name, entry in header.items():
        if name == "__metadata__" or not isinstance(entry, dict):
            continue
        shape = entry.get("shape")
        if not isinstance(entry.get("dtype"), str) or not isinstance(shape, list) \
                or not all(isinstance(d, int) and d >= 0 for d in shape):
            return None
        tensors.append((name, entry["dtype"], tuple(shape)))
    return tensors


def model_shards(path: str | Path) -> list[Path]:
    """The shard files of the model directory ``path`` the way :func:`inspect_model_dir` finds them
    (index, else ``model.safetensors``, else every ``*.safetensors``); missing ones are left out."""
    root = Path(path)
    index = root / INDEX_NAME
    names: list[str] = []
    if index.is_file():
        try:
            names = sorted(set(parse_json(read_regular(index, INDEX_FILE_BYTES).decode("utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            names = []
    elif (root / SINGLE_NAME).is_file():
        names = [SINGLE_NAME]
    else:
        names = sorted(p.name for p in root.glob("*.safetensors"))
    return [root / name for name in names if (root / name).is_file()]
