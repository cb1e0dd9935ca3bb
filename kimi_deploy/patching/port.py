"""The porting report: how the newest patch series fits another SGLang release's source, patch by patch, hunk by hunk.

For the kit's maintainers, when SGLang releases a version the kit has no ``patches/<version>/`` for
(``kimi-deploy patch port --python OTHER``, or ``--source SITE_PACKAGES``). Nothing of the target is written: the
files a patch touches are copied into a temporary folder and GNU patch runs there (``--dry-run``, ``--verbose``,
``--fuzz=2``, ``LC_ALL=C``), so its own words decide each hunk:

- ``applies``: at the line the diff names (``Hunk #1 succeeded at 15.``);
- ``offset``: the same lines, elsewhere (``... (offset 4 lines)``): the diff must be regenerated, since
  :func:`kimi_deploy.patching.apply` takes exact hunks only (``--fuzz=0``, no offset);
- ``fuzz``: applied only by ignoring up to two context lines (``... with fuzz 2``): read it before trusting it;
- ``fails``: no place fits (``Hunk #3 FAILED at 143.``); the report shows the target's code at the place the diff
  names, or where the hunk's first changed line now is (:attr:`HunkPort.upstream`);
- ``missing_file``: the file the diff changes is not in the target.

Whether a patch's purpose looks already met upstream (:attr:`PatchPort.upstream_note`): the patch applies in
reverse (the target already holds the patched code), or most of the lines it adds already appear in the target
files (a heuristic, worded as one: compare before dropping the patch).

Uses the series loader (:mod:`.series`) and the installation module's GNU patch lookup (:func:`.installation._patch_program`); it
changes no engine behaviour.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Literal

from kimi_deploy import proc
from kimi_deploy.errors import UsageError
from kimi_deploy.patching.installation import PATCH_HINT, _patch_program
from kimi_deploy.patching.series import PatchSpec, Series, available_versions, require_series

HunkState = Literal["applies", "offset", "fuzz", "fails", "missing_file"]

#: Lines of target code shown for a hunk that fails.
EXCERPT_LINES = 12

_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_CHECKING = re.compile(r"^checking file (.+)$")
_RESULT = re.compile(r"^Hunk #(\d+) (succeeded|FAILED) at (\d+)(?: \(offset (-?\d+) lines?\))?"
                     r"(?: with fuzz (\d+))?(?: \(offset (-?\d+) lines?\))?\.")


@dataclasses.dataclass(frozen=True)
class Hunk:
    """One hunk of a diff: its file (relative to site-packages), index in that file (1-based, GNU patch's
    ``Hunk #N``), the old side's start line and length, and its lines (with their `` ``/``-``/``+`` marks)."""

    file: str
    index: int
    old_start: int
    old_len: int
    lines: tuple[str, ...]

    @property
    def added(self) -> list[str]:
        return [ln[1:] for ln in self.lines if ln.startswith("+")]

    @property
    def removed(self) -> list[str]:
        return [ln[1:] for ln in self.lines if ln.startswith("-")]

    @property
    def old_side(self) -> list[str]:
        return [ln[1:] for ln in self.lines if ln.startswith((" ", "-"))]


def parse_hunks(diff_text: str) -> list[Hunk]:
    """The hunks of a unified diff (``--- a/F``/``+++ b/F`` headers, ``@@ -a,b +c,d @@``); text before the first
    header (the patch's description) is skipped."""
    hunks: list[Hunk] = []
    file: str | None = None
    counts: dict[str, int] = {}
    current: list[str] | None = None
    header: tuple[int, int] | None = None
    remaining = 0

    def close() -> None:
        nonlocal current
        if current is not None and file is not None and header is not None:
            counts[file] = counts.get(file, 0) + 1
            hunks.append(Hunk(file, counts[file], header[0], header[1], tuple(current)))
        current = None

    for line in diff_text.splitlines():
        if current is not None and remaining > 0 and not line.startswith("\\"):
            current.append(line if line else " ")
            if not line.startswith("+"):
                remaining -= 1
            continue
        if current is not None and line.startswith("\\"):
            continue
        close()
        if line.startswith("+++ "):
            name = line[4:].split("\t", 1)[0].strip()
            file = name[2:] if name.startswith("b/") else name
        elif (m := _HUNK_HEADER.match(line)) and file is not None:
            header = (int(m.group(1)), int(m.group(2)) if m.group(2) is not None else 1)
            remaining = header[1]
            current = []
            if remaining == 0:
                close()
    close()
    return hunks


@dataclasses.dataclass(frozen=True)
class HunkPort:
    """One hunk on the target: ``state`` (module docstring), ``at`` the target line GNU patch placed or tried it at,
    ``offset``/``fuzz`` as GNU patch said, and for a failed hunk ``upstream``: the target's code now at that
    place (``where`` says which place: the line the diff names, or where its first changed line was found)."""

    file: str
    index: int
    old_start: int
    state: HunkState
    at: int | None = None
    offset: int = 0
    fuzz: int = 0
    where: str = ""
    upstream: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class PatchPort:
    """One patch on the target: its hunks, a verdict (``applies`` when every hunk applies exactly, else the
    worst hunk state, ``already_applied`` when the reverse applies) and ``upstream_note`` when its purpose looks
    already met upstream."""

    id: str
    purpose: str
    default: bool
    hunks: list[HunkPort]
    verdict: str
    upstream_note: str = ""
    added_present: tuple[int, int] = (0, 0)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "purpose": self.purpose, "default": self.default, "verdict": self.verdict,
                "upstream_note": self.upstream_note, "added_lines_present": list(self.added_present),
                "hunks": [h.to_dict() for h in self.hunks]}


@dataclasses.dataclass(frozen=True)
class PortReport:
    """The series ``series_version`` tried on the SGLang in ``site_packages`` (version ``target_version``)."""

    series_version: str
    target_version: str
    site_packages: str
    patches: list[PatchPort]

    @property
    def all_exact(self) -> bool:
        return all(p.verdict == "applies" for p in self.patches)

    def to_dict(self) -> dict[str, Any]:
        return {"series": self.series_version, "target_version": self.target_version,
                "site_packages": self.site_packages, "all_exact": self.all_exact,
                "patches": [p.to_dict() for p in self.patches]}


_ORDER = ("applies", "offset", "fuzz", "fails", "missing_file")


def _stage(site: Path, files: list[str], stage: Path) -> None:
    for rel in files:
        src = site / rel
        if src.is_file():
            dest = stage / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)


def _gnu_patch(stage: Path, diff: Path, *, reverse: bool = False) -> proc.Completed:
    argv = [_patch_program(), "-p1", "--dry-run", "--verbose", "--batch", "--fuzz=2", "--force",
            "--no-backup-if-mismatch", "--reject-file=-", "-d", str(stage), "-i", str(diff)]
    if reverse:
        argv.insert(2, "--reverse")
    return proc.run(argv, check=False, extra_env={"LC_ALL": "C"}, hint=PATCH_HINT)


def _excerpt(lines: list[str], start: int, count: int = EXCERPT_LINES) -> str:
    """``lines[start-1 : start-1+count]`` numbered (1-based ``start``), as a block of text."""
    lo = max(start - 1, 0)
    return "\n".join(f"{n + 1:5d}  {lines[n]}" for n in range(lo, min(lo + count, len(lines))))


def _failed_place(hunk: Hunk, target_lines: list[str]) -> tuple[str, str]:
    """Where a failed hunk's code is now in the target, and that code: the first line the hunk removes (else its
    first context line) found once, else the line the diff names."""
    probes = [ln for ln in (hunk.removed or hunk.old_side) if len(ln.strip()) > 6]
    for probe in probes[:3]:
        found = [i for i, ln in enumerate(target_lines) if ln.strip() == probe.strip()]
        if len(found) == 1:
            return (f"line {found[0] + 1}, where the hunk's line {probe.strip()[:60]!r} is now",
                    _excerpt(target_lines, found[0] + 1 - 3))
    return (f"line {hunk.old_start}, where the diff expects it (its lines were not found elsewhere)",
            _excerpt(target_lines, hunk.old_start))


def port_patch(series: Series, spec: PatchSpec, site: Path) -> PatchPort:
    """Try one patch of ``series`` on the SGLang source under ``site`` (the folder holding ``sglang/``)."""
    diff = series.diff_path(spec)
    hunks = parse_hunks(diff.read_text(encoding="utf-8"))
    files = list(dict.fromkeys(h.file for h in hunks))
    with tempfile.TemporaryDirectory(prefix="kimi-deploy-port-") as tmp:
        stage = Path(tmp)
        _stage(site, files, stage)
        done = _gnu_patch(stage, diff)
        reverse = _gnu_patch(stage, diff, reverse=True)
    results: dict[tuple[str, int], tuple[str, int, int, int]] = {}
    current = None
    for line in done.stdout.splitlines():
        line = line.strip()
        if m := _CHECKING.match(line):
            current = m.group(1).strip()
            current = current[2:] if current.startswith("b/") else current
        elif (m := _RESULT.match(line)) and current is not None:
            offset = int(m.group(4) or m.group(6) or 0)
            fuzz = int(m.group(5) or 0)
            state = "fails" if m.group(2) == "FAILED" else "fuzz" if fuzz else "offset" if offset else "applies"
            results[(current, int(m.group(1)))] = (state, int(m.group(3)), offset, fuzz)
    ported: list[HunkPort] = []
    texts: dict[str, list[str]] = {}
    for hunk in hunks:
        path = site / hunk.file
        if not path.is_file():
            ported.append(HunkPort(hunk.file, hunk.index, hunk.old_start, "missing_file",
                                   where=f"{hunk.file} is not in the target"))
            continue
        state, at, offset, fuzz = results.get((hunk.file, hunk.index), ("fails", hunk.old_start, 0, 0))
        where = upstream = ""
        if state == "fails":
            lines = texts.setdefault(hunk.file, path.read_text(encoding="utf-8", errors="replace").splitlines())
            where, upstream = _failed_place(hunk, lines)
        ported.append(HunkPort(hunk.file, hunk.index, hunk.old_start, state, at, offset, fuzz, where, upstream))  # type: ignore[arg-type]
    added = [ln.strip() for h in hunks for ln in h.added if len(ln.strip()) > 8]
    bodies = {f: (site / f).read_text(encoding="utf-8", errors="replace") for f in files if (site / f).is_file()}
    lines_present = {ln.strip() for body in bodies.values() for ln in body.splitlines()}
    present = sum(1 for ln in added if ln in lines_present)
    verdict = max((h.state for h in ported), key=_ORDER.index, default="applies")
    note = ""
    if reverse.ok and verdict != "applies":  # forward may still "fit" with fuzz on code that already has it
        verdict = "already_applied"
        note = "the patch applies in reverse: the target already holds the patched code (upstream took it)"
    elif added and present / len(added) >= 0.6 and verdict != "applies":
        note = (f"{present} of the {len(added)} lines this patch adds already appear in the target files: its "
                "purpose may already be met upstream; compare before porting it")
    return PatchPort(spec.id, spec.purpose, spec.default, ported, verdict, note, (present, len(added)))


def port_report(site: Path, target_version: str, series_version: str | None = None) -> PortReport:
    """Every patch of the newest series (or ``series_version``'s) tried on the SGLang under ``site``.

    Raises:
        UsageError: no series, or ``site`` holds no ``sglang/`` package.
        UnsupportedVersionError: ``series_version`` has no series.
        ExternalCommandError: GNU patch is missing.
    """
    versions = available_versions()
    if not versions and series_version is None:
        raise UsageError("the kit ships no patch series", hint="reinstall kimi-deploy (patches/ is in the package)")
    series = require_series(series_version or max(versions, key=_version_key))
    if not (site / "sglang").is_dir():
        raise UsageError(f"{site} holds no sglang package", value=str(site),
                         hint="pass the site-packages folder that holds sglang/ (or --python of that environment)")
    return PortReport(series.sglang_version, target_version, str(site),
                      [port_patch(series, spec, site) for spec in series.patch])


def _version_key(text: str) -> tuple:
    from packaging.version import Version

    return (Version(text),)


def format_report(report: PortReport) -> str:
    """The report as Markdown-friendly text (what docs/design.md#porting-the-patch-series-to-a-new-release-maintainers shows)."""
    out = [f"patch series {report.series_version} on SGLang {report.target_version} ({report.site_packages})", ""]
    for p in report.patches:
        out.append(f"{p.id}: {p.verdict}" + (" (default)" if p.default else " (opt-in)"))
        for h in p.hunks:
            detail = {"applies": f"at {h.at}", "offset": f"at {h.at}, offset {h.offset:+d} lines",
                      "fuzz": f"at {h.at}, fuzz {h.fuzz}" + (f", offset {h.offset:+d}" if h.offset else ""),
                      "fails": f"diff names line {h.old_start}", "missing_file": "file missing"}[h.state]
            out.append(f"  {h.file} hunk #{h.index}: {h.state} ({detail})")
            if h.state == "fails":
                out.append(f"    upstream code at {h.where}:")
                out += [f"    {ln}" for ln in h.upstream.splitlines()]
        if p.upstream_note:
            out.append(f"  note: {p.upstream_note}")
        out.append("")
    counts = {v: sum(1 for p in report.patches if p.verdict == v) for v in dict.fromkeys(
        p.verdict for p in report.patches)}
    out.append("summary: " + ", ".join(f"{n} {v}" for v, n in counts.items()))
    if report.target_version != report.series_version:
        out.append(f"next: copy patches/{report.series_version}/ to patches/{report.target_version}/, regenerate the "
                   "diffs of every patch that is not 'applies' (docs: the porting procedure)")
    return "\n".join(out) + "\n"


def source_version(site: Path) -> str:
    """The SGLang version of the source under ``site``: the ``Version:`` of the ``sglang-*.dist-info`` beside
    ``sglang/``, else ``__version__`` of ``sglang/_version.py`` (what a wheel ships).

    Raises:
        UsageError: neither says a version.
    """
    for info in sorted(site.glob("sglang-*.dist-info")):
        try:
            m = re.search(r"^Version:\s*(\S+)", (info / "METADATA").read_text(encoding="utf-8"), re.M)
        except OSError:
            continue
        if m:
            return m.group(1)
    try:
        text = (site / "sglang" / "_version.py").read_text(encoding="utf-8")
    except OSError:
        text = ""
    m = re.search(r"^__version__\s*=\s*(?:version\s*=\s*)?[\"']([^\"']+)[\"']", text, re.M)
    if not m:
        raise UsageError(f"cannot tell the SGLang version of {site} (no sglang-*.dist-info, no sglang/_version.py)",
                         value=str(site), hint="pass the site-packages folder that holds sglang/ (or --python)")
    return m.group(1)
