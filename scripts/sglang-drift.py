#!/usr/bin/env python3
"""Maintainers' drift report: the option table's newest SGLang spellings against a release's own arguments.

Usage (the kit's interpreter; each ``--python`` is an SGLang interpreter, read as ``validate`` reads it):

    .venv/bin/python scripts/sglang-drift.py --python /opt/sglang/.venv/bin/python [--old-python OLD] [--json]

What it reads in each SGLang interpreter (:data:`PROBE`, run through :func:`kimi_deploy.engine.run_script`;
the kit never imports sglang): ``ServerArgs.add_cli_args`` on a fresh ``argparse`` parser (every option
string, its dest, help, action class and ``new_flag``), dated removal notes in the argument source
(``srt/server_args.py``, ``srt/arg_groups/**.py``, ``srt/environ.py``: a comment with a ``YYYY-MM-DD`` date
and "remove"/"drop"/"delete"/"deprecat", tied to the flags on its comment block or the next ``--flag``
registered within 6 lines) and which of the table's environment variables occur anywhere in the package.

What it reports (:func:`drift`), against :data:`kimi_deploy.options.ALL_OPTIONS`:

- ``removed``: a row's newest flag (or env variable) the release does not have;
- ``renamed``: ... and the release has another flag for the same dest, or one close to the name;
- ``deprecated``: the flag is there but SGLang calls it deprecated (``Deprecated*Action`` or "deprecated" in
  its help), with SGLang's replacement (``new_flag``) and the removal date its source gives;
- ``aliases``: an alias the table owns that the release lacks;
- with ``--old-python``: flags the newer release added and removed, and those it newly deprecates; the added
  ones that matter for Kimi deployments are listed by name (:data:`KIMI_WORDS` in the flag or its help).

Exit 0 with a report, 1 when the table has a removed/renamed/deprecated row for the release (the table needs a
reviewed update), 2 on usage errors (a missing interpreter, no SGLang there).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kimi_deploy import engine as target
from kimi_deploy.errors import KimiDeployError  # noqa: E402
from kimi_deploy.options import ALL_OPTIONS, Option  # noqa: E402
from packaging.version import Version  # noqa: E402  (not versions.parse_version, which refuses 0.6: what comes next)

#: Runs in the SGLang interpreter. argv[1]: JSON list of environment variable names to look for.
PROBE = r"""
import argparse, json, os, re, sys
names = json.loads(sys.argv[1])
out = {"version": None, "actions": [], "dated": [], "env_present": []}
import sglang
out["version"] = getattr(sglang, "__version__", None)
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(parser)
for a in parser._actions:
    if not a.option_strings or a.dest == "help":
        continue
    text = " ".join(str(a.help or "").split())
    kind = type(a).__name__
    out["actions"].append({"flags": list(a.option_strings), "dest": a.dest, "help": text[:400], "kind": kind,
                           "new_flag": getattr(a, "new_flag", None),
                           "deprecated": kind.startswith("Deprecated") or "deprecated" in text.lower()})
root = os.path.dirname(sglang.__file__)
srt = os.path.join(root, "srt")
files = [os.path.join(srt, "server_args.py"), os.path.join(srt, "environ.py")]
for base, _, found in os.walk(os.path.join(srt, "arg_groups")):
    files += [os.path.join(base, f) for f in sorted(found) if f.endswith(".py")]
date = re.compile(r"\b(20\d\d-\d\d-\d\d)\b")
why = re.compile(r"remov|drop|delete|deprecat", re.I)
flag = re.compile(r"--[a-z0-9][a-z0-9-]+")
for path in files:
    if not os.path.isfile(path):
        continue
    lines = open(path, encoding="utf-8").read().splitlines()
    for i, line in enumerate(lines):
        hash_at = line.find("#")
        if hash_at < 0 or not date.search(line[hash_at:]) or not why.search(line[hash_at:]):
            continue
        start = i
        while start > 0 and lines[start - 1].strip().startswith("#"):
            start -= 1
        end = i
        while end + 1 < len(lines) and lines[end + 1].strip().startswith("#"):
            end += 1
        flags = flag.findall("\n".join(lines[start:end + 1]))
        if not flags:
            for nxt in lines[end + 1:end + 7]:
                got = flag.findall(nxt)
                if got:
                    flags = got[:1]
                    break
        out["dated"].append({"file": os.path.relpath(path, root), "line": i + 1,
                             "date": date.search(line[hash_at:]).group(1), "text": line.strip(), "flags": flags})
want = set(names)
for base, _, found in os.walk(root):
    for f in found:
        if not want or not f.endswith(".py"):
            continue
        try:
            text = open(os.path.join(base, f), encoding="utf-8", errors="replace").read()
        except OSError:
            continue
        for name in list(want):
            if name in text:
                out["env_present"].append(name)
                want.discard(name)
print(json.dumps(out))
"""

#: Words that make an added flag worth a maintainer's look for Kimi deployments (in the flag or its help).
KIMI_WORDS = ("kimi", "moonshot", "k2", "k3", "mla", "eagle", "speculative", "allreduce", "all-reduce", "symm",
              "pcie", "cuda-graph", "tool-call", "reasoning", "weight-load", "weight-cache", "checksum", "mxfp4",
              "marlin", "moe", "attn-dp", "flashinfer", "sm120")


@dataclasses.dataclass(frozen=True)
class Release:
    """What :data:`PROBE` read from one SGLang interpreter."""

    python: str
    version: str
    actions: tuple[dict[str, Any], ...]
    dated: tuple[dict[str, Any], ...]
    env_present: frozenset[str]

    def by_flag(self) -> dict[str, dict[str, Any]]:
        return {f: a for a in self.actions for f in a["flags"]}

    def removal_date(self, flag: str) -> str | None:
        """The date SGLang's source gives for removing ``flag`` (first dated note naming it)."""
        return next((d["date"] for d in self.dated if flag in d["flags"]), None)


def env_names(rows: tuple[Option, ...] = ALL_OPTIONS) -> list[str]:
    """Every environment variable the table spells (any release)."""
    return sorted({s.name for o in rows for s in o.spellings if s.kind == "env"})


def read_release(python: str) -> Release:
    """Run :data:`PROBE` in ``python``.

    Raises:
        UsageError: the interpreter does not exist. ExternalCommandError: SGLang cannot be imported there.
    """
    data = target.run_script(python, PROBE, [json.dumps(env_names())], timeout=300, label="drift probe")
    return Release(python=python, version=data["version"], actions=tuple(data["actions"]),
                   dated=tuple(data["dated"]), env_present=frozenset(data["env_present"]))


def _newest(o: Option) -> list:
    """A row's spellings that still apply in the newest release the table knows (no ``until``), valueless."""
    return [s for s in o.spellings if s.until is None and s.value is None and s.kind != "implicit"]


def kimi_relevant(action: dict[str, Any]) -> bool:
    text = (" ".join(action["flags"]) + " " + action["help"]).lower()
    return any(w in text for w in KIMI_WORDS)


def drift(new: Release, old: Release | None = None, rows: tuple[Option, ...] = ALL_OPTIONS) -> dict[str, Any]:
    """The report (JSON-friendly): ``table`` findings for ``new``, and with ``old`` the release-to-release diff.

    ``table`` entries: ``{"key", "status": removed|renamed|deprecated|alias-gone|not-yet, "flag", ...}``.
    """
    version = Version(new.version)
    flags = new.by_flag()
    dests: dict[str, list[str]] = {}
    for a in new.actions:
        dests.setdefault(a["dest"], []).extend(a["flags"])
    table: list[dict[str, Any]] = []
    for o in rows:
        for s in _newest(o):
            if Version(s.since) > version:
                table.append({"key": o.key, "status": "not-yet", "flag": s.name,
                              "detail": f"the table spells it from {s.since}; {new.version} predates that"})
                continue
            if s.kind == "env":
                if s.name not in new.env_present:
                    table.append({"key": o.key, "status": "removed", "flag": s.name,
                                  "detail": f"no file of sglang {new.version} names {s.name}"})
                continue
            action = flags.get(s.name)
            if action is None:
                dest = s.name.lstrip("-").replace("-", "_")
                same = [f for f in dests.get(dest, []) if f != s.name]
                close = same or difflib.get_close_matches(s.name, list(flags), n=2, cutoff=0.8)
                table.append({"key": o.key, "status": "renamed" if close else "removed", "flag": s.name,
                              "now": close, "detail": (f"sglang {new.version} has {', '.join(close)}" if close
                                                       else f"sglang {new.version} has no {s.name}")})
            elif action["deprecated"]:
                table.append({"key": o.key, "status": "deprecated", "flag": s.name, "now": action["new_flag"],
                              "removal": new.removal_date(s.name), "detail": action["help"]})
        for alias in o.aliases:
            if alias not in flags:
                table.append({"key": o.key, "status": "alias-gone", "flag": alias,
                              "detail": f"sglang {new.version} no longer accepts {alias}"})
    report: dict[str, Any] = {"release": new.version, "python": new.python, "table": table,
                              "deprecated_in_release": [
                                  {"flag": a["flags"][0], "now": a["new_flag"],
                                   "removal": new.removal_date(a["flags"][0]), "help": a["help"]}
                                  for a in new.actions if a["deprecated"]],
                              "dated_notes": list(new.dated)}
    if old is not None:
        before = old.by_flag()
        added = [a for a in new.actions if not set(a["flags"]) & set(before)]
        gone = sorted({f for a in old.actions for f in a["flags"]} - set(flags))
        newly = [a["flags"][0] for a in new.actions if a["deprecated"]
                 and not any(before.get(f, {}).get("deprecated") for f in a["flags"])
                 and set(a["flags"]) & set(before)]
        report["against"] = {
            "release": old.version, "python": old.python, "table": drift(old, rows=rows)["table"],
            "added": [a["flags"][0] for a in added], "removed": gone, "newly_deprecated": newly,
            "added_for_kimi": [{"flag": a["flags"][0], "help": a["help"]} for a in added if kimi_relevant(a)],
        }
    return report


def needs_update(report: dict[str, Any]) -> bool:
    """Whether the table must change for this release (anything but rows the release predates)."""
    return any(t["status"] != "not-yet" for t in report["table"])


def _table(release: str, table: list[dict[str, Any]]) -> list[str]:
    out = [f"## SGLang {release} against the option table (kimi_deploy/options.py)", ""]
    if not table:
        return out + ["Every newest spelling of the table is in this release, none deprecated."]
    out += ["| profile key | status | table's flag | release has | removal date | detail |", "|---|---|---|---|---|---|"]
    for t in table:
        now = t.get("now")
        now = ", ".join(now) if isinstance(now, list) else (now or "")
        out.append(f"| `{t['key']}` | {t['status']} | `{t['flag']}` | {now} | {t.get('removal') or ''} | "
                   f"{t['detail'].replace('|', '/')} |")
    return out


def markdown(report: dict[str, Any]) -> str:
    """The report as the text maintainers paste into a review (GitHub markdown)."""
    out = _table(report["release"], report["table"])
    if "against" in report:
        out += [""] + _table(report["against"]["release"], report["against"]["table"])
    out += ["", f"Deprecated in SGLang {report['release']} (whether the table uses them or not):", ""]
    for d in report["deprecated_in_release"]:
        out.append(f"- `{d['flag']}` -> {d['now'] or '(no new_flag)'}; removal: {d['removal'] or 'no date in the source'}")
    if "against" in report:
        a = report["against"]
        out += ["", f"## SGLang {a['release']} -> {report['release']}", "",
                f"- flags added ({len(a['added'])}): {', '.join(f'`{f}`' for f in a['added']) or 'none'}",
                f"- flags removed: {', '.join(f'`{f}`' for f in a['removed']) or 'none'}",
                f"- newly deprecated: {', '.join(f'`{f}`' for f in a['newly_deprecated']) or 'none'}",
                "- added and relevant for Kimi deployments:" if a["added_for_kimi"] else
                "- added and relevant for Kimi deployments: none"]
        out += [f"  - `{k['flag']}`: {k['help'][:160]}" for k in a["added_for_kimi"]]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sglang-drift", description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", required=True, help="the SGLang interpreter of the release to compare")
    parser.add_argument("--old-python", help="an older release's SGLang interpreter: also diff the two releases")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    try:
        new = read_release(args.python)
        old = read_release(args.old_python) if args.old_python else None
    except KimiDeployError as exc:
        print(exc.render(), file=sys.stderr)
        return 2
    report = drift(new, old)
    print(json.dumps(report, indent=2) if args.json else markdown(report), end="" if not args.json else "\n")
    return 1 if needs_update(report) else 0


if __name__ == "__main__":
    sys.exit(main())
