"""Golden files of everything `render` writes for the presets: the reference at 0.5.23 and at 0.5.12 (old
spellings), the PCIe IPC one and the other Kimi models' presets (K2.6, K2.7-Code, K2-Thinking) at 0.5.23.

Regenerate after an intended change with exactly:

    KIMI_DEPLOY_UPDATE_GOLDEN=1 python -m pytest tests/test_render_golden.py

and review the diff in git before committing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import run_cli

GOLDEN = Path(__file__).parent / "golden" / "render"
PRESET = "kimi-k25-rtx-pro-6000-x8"
UPDATE = os.environ.get("KIMI_DEPLOY_UPDATE_GOLDEN") == "1"


def _tree(directory: Path) -> dict[str, str]:
    """Relative path (``monitoring/prometheus.yml``) -> text of every file under ``directory``."""
    return {p.relative_to(directory).as_posix(): p.read_text() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name != ".kimi-deploy-render.json"}  # render's record of the folder


@pytest.mark.parametrize(("preset", "version"), [(PRESET, "0.5.23"), (PRESET, "0.5.12"),
                                                  ("kimi-k25-rtx-pro-6000-x8-pcie-ipc", "0.5.23"),
                                                  ("kimi-k26-rtx-pro-6000-x8", "0.5.23"),
                                                  ("kimi-k27-code-rtx-pro-6000-x8", "0.5.23"),
                                                  ("kimi-k2-thinking-rtx-pro-6000-x8", "0.5.23")])
def test_preset_render_matches_golden(tmp_path, preset, version):
    out = tmp_path / "out"
    result = run_cli(["render", "--preset", preset, "--sglang-version", version, "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    command = run_cli(["render", "--preset", preset, "--sglang-version", version, "--print-command"])
    rendered = _tree(out)
    rendered["launch-command.sh"] = command.stdout
    golden_dir = GOLDEN / f"{preset}-{version}"
    if UPDATE:
        golden_dir.mkdir(parents=True, exist_ok=True)
        for stale in golden_dir.rglob("*"):
            if stale.is_file():
                stale.unlink()
        for name, text in rendered.items():
            (golden_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (golden_dir / name).write_text(text)
        pytest.skip(f"golden files rewritten in {golden_dir}")
    assert golden_dir.is_dir(), "no golden files: run KIMI_DEPLOY_UPDATE_GOLDEN=1 python -m pytest tests/test_render_golden.py"
    expected = _tree(golden_dir)
    assert sorted(rendered) == sorted(expected)
    for name in expected:
        assert rendered[name] == expected[name], f"{name} differs from {golden_dir / name}"


def test_render_is_deterministic(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    for out in (first, second):
        assert run_cli(["render", "--preset", PRESET, "--out", str(out)]).exit_code == 0
    assert _tree(first) == _tree(second) and "monitoring/kimi-k25.rules.yml" in _tree(first)
