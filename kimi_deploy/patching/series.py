"""The patch series manifest: ``patches/<sglang-version>/series`` (TOML) and its diffs.

Format (one file per SGLang release, patches listed in application order)::

    sglang_version = "0.5.23"

    [[patch]]
    id = "kimi-k2-tool-call-ids"          # stable name used by --only / --with and the state record
    file = "kimi-k2-tool-call-ids.diff"   # unified diff, paths a/sglang/... b/sglang/... (patch -p1 in site-packages)
    purpose = "one line"
    upstream = ["https://github.com/..."] # related public issues / PRs
    risk = "low: ..."
    default = true                        # applied without --only / --with
    experimental = false                  # optional: no measurement backs it yet (`patch list` says so)

    [[patch.needed_by]]                   # optional: a profile setting this release refuses or
    setting = "enable_torch_symm_mem"     #   disables on some GPUs unless the patch is applied (a row
                                          #   of kimi_deploy/options.py: its flags are read off that row)
    unless = []                           # optional: rows whose flags turn the feature off again
    compute_capability_major = [12]       # GPUs (nvidia-smi compute_cap major) where it is gated
    patched_compute_capability = ["12.0"] # optional: exact capabilities the patch opens (default: all
                                          #   of compute_capability_major); elsewhere it stays gated
    without = "disabled"                  # "fails": the server does not start; "disabled": it starts
                                          #   without the feature
    symptom = "what SGLang does without the patch, with the source location"

``needed_by`` is the one feature -> patch mapping: ``kimi-deploy doctor`` reads it (through
:meth:`Series.gates_asked`) and holds no list of its own. It names option-table rows, never flags: the
flags that ask for a feature (every release's spelling and the aliases) come from the row
(:data:`kimi_deploy.options.BY_KEY`), so a new spelling is one line in the table.

Unknown keys are errors (pydantic ``extra="forbid"``).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kimi_deploy import options, paths
from kimi_deploy.errors import UnsupportedVersionError, UsageError

SERIES_FILE = "series"


class FeatureGate(BaseModel):
    """A ``[[patch.needed_by]]`` entry: a profile feature the unpatched release refuses or disables.

    ``setting``: the ``[sglang]`` key of an option-table row; :attr:`flags`: that row's SGLang flags
    (matched in the rendered command, so ``extra_args`` count); ``unless``: rows whose flags switch it
    off again (:attr:`unless_flags`; SGLang's enforce-disable switches win); ``compute_capability_major``: GPU generations where the release gates
    it; ``without``: ``"fails"`` (the start fails) or ``"disabled"`` (the server runs without it);
    ``symptom``: what the release does, with the source location.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    setting: str
    unless: list[str] = Field(default_factory=list)
    compute_capability_major: list[int] = Field(min_length=1)
    patched_compute_capability: list[str] = Field(default_factory=list)
    without: Literal["fails", "disabled"]
    symptom: str

    @field_validator("setting")
    @classmethod
    def _a_row(cls, v: str) -> str:
        return _row_key(v)

    @field_validator("unless")
    @classmethod
    def _rows(cls, v: list[str]) -> list[str]:
        return [_row_key(key) for key in v]

    @property
    def flags(self) -> tuple[str, ...]:
        """The flags that ask for the feature: the row's, newest release's spelling first, then older ones
        and aliases (:attr:`kimi_deploy.options.Option.flags` less the owned ones)."""
        return _row_flags(self.setting)

    @property
    def unless_flags(self) -> tuple[str, ...]:
        """The flags of the ``unless`` rows."""
        return tuple(flag for key in self.unless for flag in _row_flags(key))


def _row_key(key: str) -> str:
    """``key`` when it is an option-table row; else ValueError with the closest row (pydantic reports it)."""
    if key in options.BY_KEY:
        return key
    close = difflib.get_close_matches(key, list(options.BY_KEY), n=1)
    raise ValueError(f"{key!r} is no [sglang] key of the option table" + (f"; did you mean {close[0]!r}?" if close
                                                                          else ""))


def _row_flags(key: str) -> tuple[str, ...]:
    row = options.BY_KEY[key]
    spelled = [s.name for s in reversed(row.spellings) if s.kind == "flag"]
    return tuple(dict.fromkeys([*spelled, *row.aliases]))


class PatchSpec(BaseModel):
    """One ``[[patch]]`` entry of a series manifest."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    file: str
    purpose: str
    upstream: list[str] = Field(default_factory=list)
    risk: str
    default: bool
    experimental: bool = False
    needed_by: list[FeatureGate] = Field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class GateHit:
    """A gated feature a command asks for: the patch that lifts the gate, the gate, the flag seen."""

    patch: PatchSpec
    gate: FeatureGate
    flag: str

    def applies_to(self, compute_capability: str) -> bool:
        """Whether GPUs of ``compute_capability`` (nvidia-smi ``compute_cap``, ``"12.0"``) are gated."""
        major = compute_capability.split(".", 1)[0]
        return major.isdigit() and int(major) in self.gate.compute_capability_major

    def patch_opens(self, compute_capability: str) -> bool:
        """Whether the patch lifts the gate on ``compute_capability`` (``patched_compute_capability``, exact;
        empty: on every gated capability)."""
        allowed = self.gate.patched_compute_capability
        return not allowed or compute_capability in allowed


class Series(BaseModel):
    """A parsed ``series`` manifest plus the folder it came from."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    sglang_version: str
    patch: list[PatchSpec]
    directory: Path = Field(exclude=True)

    @field_validator("patch")
    @classmethod
    def _unique(cls, v: list[PatchSpec]) -> list[PatchSpec]:
        ids = [p.id for p in v]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"duplicate patch ids: {', '.join(dupes)}")
        return v

    @property
    def ids(self) -> list[str]:
        return [p.id for p in self.patch]

    @property
    def defaults(self) -> list[PatchSpec]:
        """Patches with ``default = true``, in series order."""
        return [p for p in self.patch if p.default]

    def get(self, patch_id: str) -> PatchSpec:
        """The patch named ``patch_id``.

        Raises:
            UsageError: no such id (with the closest match and the list of ids).
        """
        for spec in self.patch:
            if spec.id == patch_id:
                return spec
        close = difflib.get_close_matches(patch_id, self.ids, n=1)
        raise UsageError(
            f"no patch {patch_id!r} in the series for SGLang {self.sglang_version}", value=patch_id,
            hint=(f"did you mean {close[0]!r}? " if close else "") + f"the series has: {', '.join(self.ids)}")

    def select(self, only: list[str] | None = None, with_: list[str] | None = None) -> list[PatchSpec]:
        """Patches to act on, in series order: ``only`` if given, else the defaults plus ``with_``.

        Raises:
            UsageError: an unknown id.
        """
        if only:
            wanted = {self.get(i).id for i in only}
        else:
            wanted = {p.id for p in self.defaults} | {self.get(i).id for i in (with_ or [])}
        return [p for p in self.patch if p.id in wanted]

    def gates_asked(self, server_args: Sequence[str]) -> list[GateHit]:
        """The gated features ``server_args`` (a rendered SGLang command) asks for, in series order.

        A flag counts as given in ``--flag``, ``--flag VALUE`` and ``--flag=VALUE`` form.
        """
        given = {a.split("=", 1)[0] for a in server_args if a.startswith("--")}
        hits = []
        for spec in self.patch:
            for gate in spec.needed_by:
                flag = next((f for f in gate.flags if f in given), None)
                if flag and not given.intersection(gate.unless_flags):
                    hits.append(GateHit(spec, gate, flag))
        return hits

    def diff_path(self, spec: PatchSpec) -> Path:
        return self.directory / spec.file

    def diff_bytes(self, spec: PatchSpec) -> bytes:
        """The diff file's bytes.

        Raises:
            UsageError: the file named by the manifest is missing.
        """
        path = self.diff_path(spec)
        try:
            return path.read_bytes()
        except OSError as exc:
            raise UsageError(f"patch file of {spec.id} cannot be read: {exc.strerror}", value=str(path),
                             hint="reinstall kimi-deploy; the series is shipped inside the package") from exc

    def diff_sha256(self, spec: PatchSpec) -> str:
        return hashlib.sha256(self.diff_bytes(spec)).hexdigest()

    def files_of(self, spec: PatchSpec) -> list[str]:
        """Paths the diff changes, relative to site-packages (``sglang/srt/...``), from its ``+++ b/`` lines."""
        return _files_cache(self.diff_path(spec))


def _files_cache(path: Path) -> list[str]:
    out: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("+++ "):
            name = line[4:].split("\t", 1)[0].strip()
            name = name[2:] if name.startswith("b/") else name
            if name not in out:
                out.append(name)
    return out


def available_versions() -> list[str]:
    """SGLang versions the kit ships a series for (folders of ``patches/`` holding a ``series`` file)."""
    root = paths.patches_dir()
    if not root.is_dir():
        return []
    return sorted(d.name for d in root.iterdir() if (d / SERIES_FILE).is_file())


def find_series(sglang_version: str) -> Series | None:
    """The series for ``sglang_version``, or ``None`` when the kit has none.

    Raises:
        UsageError: the manifest exists but does not parse or validate.
    """
    directory = paths.patches_dir() / sglang_version
    manifest = directory / SERIES_FILE
    if not manifest.is_file():
        return None
    try:
        data = tomllib.loads(manifest.read_text(encoding="utf-8"))
        series = Series(directory=directory, **data)
    except (tomllib.TOMLDecodeError, ValidationError, TypeError) as exc:
        raise UsageError(f"the patch series manifest does not validate: {exc}", value=str(manifest),
                         hint="fix the manifest (format in kimi_deploy/patching/series.py)") from exc
    if series.sglang_version != sglang_version:
        raise UsageError("the series manifest names another SGLang version than its folder",
                         value=f"{manifest}: {series.sglang_version}", hint="fix sglang_version in the manifest")
    return series


def require_series(sglang_version: str) -> Series:
    """The series for ``sglang_version``.

    Raises:
        UnsupportedVersionError: the kit has no series for that version (exit 2), naming those it has.
    """
    series = find_series(sglang_version)
    if series is None:
        have = available_versions()
        raise UnsupportedVersionError(
            f"kimi-deploy has no patch series for SGLang {sglang_version}", value=sglang_version,
            hint=f"series exist for: {', '.join(have) or 'none'}; install one of those SGLang versions, "
                 "or run without patches (profile [service] verify_patches = false)")
    return series


__all__ = ["FeatureGate", "GateHit", "PatchSpec", "Series", "available_versions", "find_series", "require_series", "SERIES_FILE"]
