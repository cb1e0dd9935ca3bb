"""The words of ``install``/``uninstall``: a plan as terminal text (:func:`format_plan`), what an applied install
or uninstall changed (:func:`install_message`, :func:`count_removed`), ``N files`` (:func:`count_files`).

Pure text from a :class:`kimi_deploy.host.install.plan.Plan`: no I/O, no decisions (``--json`` prints the plan's
and the result's ``to_dict`` instead).
"""

from __future__ import annotations

from kimi_deploy import proc
from kimi_deploy.host.install.plan import Plan


def count_removed(plan: Plan) -> str:
    """``5 files and the manifest``: the files counted as ``status`` counts them, the manifest apart."""
    manifest = plan.layout.manifest(plan.service)
    listed = [c for c in plan.changes if c.path != manifest]
    return count_files(len(listed)) + (" and the manifest" if len(listed) < len(plan.changes) else "")


def install_message(plan: Plan, saved: str) -> str:
    """What an applied install changed, counted as ``status`` counts (the files the manifest lists; the
    manifest itself is named apart), and a rollback note only when there are previous versions to keep."""
    manifest = plan.layout.manifest(plan.service)
    listed = [c for c in plan.changes if c.path != manifest]
    created = sum(c.action == "create" for c in listed)
    replaced = sum(c.action == "replace" for c in listed)
    removed = sum(c.action == "remove" for c in listed)
    parts = [f"{n} {what}" for n, what in ((created, "created"), (replaced, "replaced"), (removed, "removed")) if n]
    text = f"install: {count_files(len(listed))} ({', '.join(parts)})" if parts else "install: the manifest"
    text += " and the manifest" if parts and any(c.path == manifest for c in plan.changes) else ""
    if replaced or removed:
        return text + f"; the previous versions are kept for rollback in {saved}"
    return text + "; nothing was there before, so a rollback removes these files"


def count_files(n: int) -> str:
    """``1 file`` / ``N files``."""
    return f"{n} file" if n == 1 else f"{n} files"


def format_plan(plan: Plan, *, diffs: bool = True) -> str:
    """The plan as text for a terminal: the root (with ``--root``), one line per file and step, the diffs, notes.

    Every path is a host path; with ``--root`` the first line names the tree once. A file
    refused without ``--force`` reads ``refuse`` (what ``--force`` would do follows the reason).
    ``diffs`` False: file names only (``uninstall`` without ``--diff``), and a note saying how to see them.
    """
    out = []
    if not plan.layout.is_host:
        out.append(f"root    {plan.layout.root}  (--root: every path below is a host path inside this tree)")
    verb = {"create": "create ", "replace": "replace", "remove": "remove ", "unchanged": "keep   "}
    forced = {"replace": "--force replaces it", "remove": "--force removes it", "create": "--force creates it"}
    for f in plan.files:
        if f.refused:
            out.append(f"refuse  {f.host_path}  ({f.reason}; {forced.get(f.action, '--force overrides')}, "
                       "keeping a copy in the backup)")
        else:
            out.append(f"{verb[f.action]} {f.host_path}  ({f.reason})")
    for r in plan.refusals:
        if r.kind == "conflict":
            out.append(f"refuse  {r.host_path}  ({r.reason}; --force installs anyway)")
    for s in plan.steps:
        cmd = proc.Completed(s.argv, 0, "", "").command if s.argv else ""
        out.append(f"run     {s.summary}" + (f": {cmd}" if cmd else ""))
    with_diff = [f for f in plan.changes if f.diff]
    if diffs:
        for f in with_diff:
            out.append("")
            out.append(f.diff.rstrip("\n"))
    for note in plan.notes:
        out.append(note if note.startswith("warning:") else f"note: {note}")
    if with_diff and not diffs:
        out.append("note: contents not shown; pass --diff (or -v) to see them")
    if plan.is_noop:
        out.append(plan.noop_message or f"nothing to do: {plan.service} is installed and up to date")
    return "\n".join(out) + "\n"
