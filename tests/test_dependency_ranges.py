"""The kit's dependency ranges never admit a release known to be bad: LiteLLM 1.107.0 was pulled from the
package index as a compromised release (shared/notes/upstream-2026-12.md, "Versions on the package index").

Read with packaging (the same reading pip gives a requirement): pyproject.toml's every LiteLLM requirement,
and the LiteLLM test environment's pin (scripts/litellm-testenv.requirements.txt).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent

#: package -> releases no range of the kit may admit, with why.
KNOWN_BAD = {"litellm": {"1.107.0": "pulled from the index as a compromised release"}}


def _pyproject_requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        lines.extend(extra)
    return [Requirement(line) for line in lines]


def _pinned_requirements(path: Path) -> list[Requirement]:
    return [Requirement(line.split("#", 1)[0].strip()) for line in path.read_text().splitlines()
            if line.split("#", 1)[0].strip()]


def test_pyproject_declares_litellm_for_the_hook_and_excludes_the_compromised_release():
    litellm = [r for r in _pyproject_requirements() if r.name == "litellm"]
    assert litellm, "pyproject.toml names no litellm requirement (the litellm-hook extra)"
    for req in litellm:
        assert not req.specifier.contains(Version("1.107.0"), prereleases=True), str(req)
        assert "!=1.107.0" in {str(s) for s in req.specifier}, f"{req}: exclude 1.107.0 by name, not by floor alone"
        assert req.specifier.contains(Version("1.108.7")), f"{req}: the release the hook is tested against"


@pytest.mark.parametrize("path", [REPO / "pyproject.toml", *sorted((REPO / "scripts").glob("*requirements*.txt"))],
                         ids=lambda p: p.name)
def test_no_range_admits_a_known_bad_release(path):
    reqs = _pyproject_requirements() if path.suffix == ".toml" else _pinned_requirements(path)
    for req in reqs:
        for bad, why in KNOWN_BAD.get(req.name.lower(), {}).items():
            assert not req.specifier.contains(Version(bad), prereleases=True), f"{path.name}: {req} admits {bad} ({why})"


def test_the_litellm_test_environment_pins_a_release_the_kit_allows():
    pins = [r for r in _pinned_requirements(REPO / "scripts" / "litellm-testenv.requirements.txt") if r.name == "litellm"]
    assert [str(r.specifier) for r in pins] == ["==1.108.7"]
    allowed = next(r for r in _pyproject_requirements() if r.name == "litellm").specifier
    assert allowed.contains(Version("1.108.7"))
