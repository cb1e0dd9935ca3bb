"""``kimi-deploy upgrade``: a new SGLang environment (or a new model revision) as one reviewed, gated change.

The new SGLang lives in its own environment beside the installed one (``--python NEW``); the installed
environment is only read (its version), never written: a rollback points the unit back at it as it was.

Plan (:func:`plan_upgrade`, all of it before anything changes; ``--dry-run`` stops there):

1. the version change (each interpreter probed: :func:`kimi_deploy.engine.probe`) and the model change
   (``--profile`` with another ``model_path``, e.g. K2.5 → K2.6);
2. the flag spellings that differ between the two releases (:func:`spelling_changes`, from the option table's
   per-release spellings, :data:`kimi_deploy.versions.RULES`), marked where the profile uses them;
3. the patch set the resolved deployment requires (:attr:`kimi_deploy.deployment.Deployment.required_patches`:
   the new series' defaults plus every opt-in patch a feature the profile turns on needs, e.g. the SM120
   all-reduce fusion and symmetric-memory gates) plus ``with_``, tried with GNU patch's dry run against the new
   environment only; for a model revision alone (the same environment), the required patches must already be
   applied there, or the plan is refused naming them;
4. ``validate`` against the new interpreter (:func:`kimi_deploy.validate.validate_profile`: SGLang's own
   argparse);
5. the install plan for the profile pointing at the new interpreter
   (:func:`kimi_deploy.host.install.install_plan.plan_install`): the unit and env-file diff. It refuses a
   profile that drops a parser (:mod:`kimi_deploy.host.gate`).

Apply (:func:`apply_upgrade`): the patches (all-or-nothing, into the new environment), the install (with its
backup of the previous files), then ``restart --wait --gate GATE --rollback-on-failure``
(:func:`kimi_deploy.host.restart.restart`): a failed tier restores the previous files — the unit's ``ExecStart=``
names the old interpreter again — restarts, and gates the restored version the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from kimi_deploy.host.install.apply import ApplyResult, apply as apply_install, refuse
from kimi_deploy.host.install.formatting import format_plan as format_install_plan
from kimi_deploy.host.install.install_plan import plan_install
from kimi_deploy.host.install.plan import Plan
from kimi_deploy import patching, versions
from kimi_deploy import engine as target
from kimi_deploy.catalog.models import identify
from kimi_deploy.deployment import Deployment, Units, require_fit, resolve
from kimi_deploy.errors import ExitCode, KimiDeployError, RefusedError, UsageError
from kimi_deploy.host import gate as gates
from kimi_deploy.host import journal
from kimi_deploy.host.records import find_installed, service_lock
from kimi_deploy.options import OPTIONS
from kimi_deploy.paths import HostLayout
from kimi_deploy.profile import Profile
from kimi_deploy.host import restart as restart_lib
from kimi_deploy.host.records import installed_services
from kimi_deploy.validate import validate_profile


@dataclasses.dataclass(frozen=True)
class Environment:
    """One SGLang environment: its interpreter, SGLang version and package folder (``.../sglang``)."""

    python: str
    version: str
    location: str

    @classmethod
    def probe(cls, python: str) -> Environment:
        """Ask ``python`` (:func:`kimi_deploy.engine.probe`).

        Raises:
            UsageError: the interpreter is missing or has no SGLang (with the command that checks it).
        """
        info = target.probe(python)
        version, location = target.require_sglang(info)
        return cls(str(python), version, location)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class SpellingChange:
    """How one feature's spelling differs between two releases (``None``: the release has no spelling of it).

    ``old``/``new`` read ``--flag``, ``env VAR`` or ``implicit`` (always on, no switch); ``value``: the rows
    are about that value only (``EAGLE3``); ``in_profile``: the profile sets the feature (not its default), so
    the rendered command changes with it.
    """

    feature: str
    old: str | None
    new: str | None
    in_profile: bool
    value: str | None = None
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _spelled(rule: versions.Rule | None) -> str | None:
    if rule is None:
        return None
    return {"flag": rule.spelling, "env": f"env {rule.spelling}"}.get(rule.kind, "implicit")


def spelling_changes(old: str, new: str, profile: Profile | None = None) -> list[SpellingChange]:
    """Every feature of the option table whose spelling differs between SGLang ``old`` and ``new``, in table order.

    Raises:
        UsageError: a version outside the 0.5 series (:func:`kimi_deploy.versions.parse_version`).
    """
    v_old, v_new = versions.parse_version(old), versions.parse_version(new)
    defaults = {o.key: o.default for o in OPTIONS}
    out: list[SpellingChange] = []
    seen: set[tuple[str, str | None]] = set()
    for rule in versions.RULES:
        key = (rule.feature, rule.value)
        if key in seen:
            continue
        seen.add(key)
        rows = [r for r in versions.RULES if (r.feature, r.value) == key]
        before = next((r for r in rows if r.applies(v_old)), None)
        after = next((r for r in rows if r.applies(v_new)), None)
        if _spelled(before) == _spelled(after):
            continue
        value = getattr(profile.sglang, rule.feature, None) if profile is not None else None
        used = value not in (None, False, [], ()) and value != defaults.get(rule.feature) and (
            rule.value is None or str(value) == rule.value)
        out.append(SpellingChange(rule.feature, _spelled(before), _spelled(after), bool(used), rule.value,
                                  (after or before).source if (after or before) else ""))
    return out


@dataclasses.dataclass(frozen=True)
class UpgradePlan:
    """What :func:`apply_upgrade` would do; built by :func:`plan_upgrade`, changes nothing.

    ``old``/``new``: the installed and the new environment (the same one for a model revision alone);
    ``old_model``/``new_model``: ``[sglang] model_path`` before and after; ``patches``: the new series' ids
    to apply (empty: no series, or a model revision alone); ``patch_check``: GNU patch's dry run of them in
    the new environment (``ok``, ``message``); ``validation``: :class:`kimi_deploy.validate.ProfileValidation`
    as a dict; ``install``: the install plan (its ``changes`` carry the unit diff); ``profile``: the profile
    that is installed (``[service] python`` = ``new.python``).
    """

    service: str
    old: Environment
    new: Environment
    old_model: str
    new_model: str
    spelling: list[SpellingChange]
    series: str | None
    patches: list[str]
    patch_check: dict[str, Any]
    validation: dict[str, Any]
    install: Plan
    profile: Profile
    state_dir: str | None
    notes: list[str]
    deployment: Deployment | None = None
    missing_patches: list[str] = dataclasses.field(default_factory=list)

    @property
    def required(self) -> list[str]:
        """The patches the new deployment requires (:attr:`kimi_deploy.deployment.Deployment.required_patches`)."""
        return list(self.deployment.required_patches) if self.deployment else []

    @property
    def problems(self) -> list[str]:
        """Why this plan may not be applied (empty: it may)."""
        out = []
        if self.missing_patches:
            gated = self.deployment.gated if self.deployment else {}
            out.append("patches: the profile needs " + ", ".join(
                f"{p} ({gated[p]})" if p in gated else p for p in self.missing_patches)
                + f" in {self.new.location}, which does not have them (apply them there with `kimi-deploy patch "
                  f"apply --python {self.new.python} --with {','.join(self.missing_patches)}`, or turn the "
                  "feature off in the profile)")
        if not self.validation.get("ok"):
            out += [f"validate: {e}" for e in self.validation.get("problems", self.validation.get("errors", []))] \
                or ["validate failed"]
        if not self.patch_check.get("ok", True):
            out.append(f"patches: {self.patch_check.get('message')}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"service": self.service, "old": self.old.to_dict(), "new": self.new.to_dict(),
                "version_change": f"{self.old.version} -> {self.new.version}",
                "model_change": None if self.old_model == self.new_model else f"{self.old_model} -> {self.new_model}",
                "spelling_changes": [s.to_dict() for s in self.spelling], "series": self.series,
                "patches": self.patches, "required_patches": self.required,
                "missing_patches": self.missing_patches, "patch_check": self.patch_check, "validation": self.validation,
                "deployment": self.deployment.to_dict() if self.deployment else None,
                "install": self.install.to_dict(), "notes": self.notes, "problems": self.problems}


def _with_python(profile: Profile, python: str) -> Profile:
    return profile.model_copy(update={"service": profile.service.model_copy(update={"python": python})})


def check_revision_name(profile: Profile, path: Path, name: str | None, layout: HostLayout) -> None:
    """Refuse a new profile (a model revision) that names another service than the installed one it is meant for:
    ``upgrade`` moves a service, it never creates one, and ``install`` of that profile would start a second
    service on the same GPUs. The hint names how to keep the installed name (``init --model KEY --name NAME``).

    Raises:
        UsageError: ``--name`` differs from the profile's ``[service] name``, or nothing of that name is installed
            while other services are (exit 2).
    """
    wanted = profile.service.name
    installed = installed_services(layout)
    if name == wanted or (name is None and (wanted in installed or not installed)):
        return  # the same service, or nothing installed (the installed-service lookup says so, with its hint)
    target = name or (installed[0] if len(installed) == 1 else None)
    model = identify(profile.sglang.model_path, profile.sglang.served_model_name)
    keep = target or "NAME"
    init = f"kimi-deploy init --model {model.key} --name {keep} NEW.toml" if model \
        else f"kimi-deploy init --name {keep} NEW.toml"
    raise UsageError(
        f"the new profile names service {wanted}, not "
        + (f"--name {target}" if name else f"the installed service {target}" if target
           else f"an installed service ({', '.join(installed)})"),
        value=f"{path}: [service] name = {wanted!r}",
        hint=f"a model revision keeps the service name: set [service] name = \"{keep}\" in {path}, or write the "
             f"profile with `{init}` and pass it to upgrade; installing this profile instead would start a "
             f"second service on the same GPUs")


def plan_upgrade(installed: Profile, layout: HostLayout, *, python: str | None = None,
                 profile: Profile | None = None, with_: Sequence[str] = (), state_dir: str | None = None,
                 allow_parser_removal: bool = False) -> UpgradePlan:
    """Plan moving the installed service to the SGLang of ``python`` and/or to ``profile`` (a model revision).

    Args:
        installed: the installed profile copy (its ``[service] python`` is the old environment).
        python: the new environment's interpreter (None: keep the installed one; then ``profile`` must change).
        profile: the new profile (None: the installed one); its ``[service] python`` is replaced by ``python``.
        with_: opt-in patches of the new series besides its defaults.
        state_dir: kimi-deploy's state folder for the patch records (:func:`kimi_deploy.paths.state_dir`).

    Raises:
        UsageError: nothing to change, another service's profile, an interpreter without SGLang, an unknown
            patch id.
        RefusedError: ``python`` is the installed environment (an upgrade never changes it in place), the new
            profile's model cannot fit (:func:`kimi_deploy.deployment.require_fit`, before any interpreter is
            asked), or the new profile drops a parser (exit 4).
        UnsupportedVersionError: the new release lacks a feature the profile asks for.
    """
    new_profile = profile or installed
    if new_profile.service.name != installed.service.name:
        raise UsageError(f"--profile is for service {new_profile.service.name}, the installed one is "
                         f"{installed.service.name}", value=new_profile.service.name,
                         hint="upgrade the installed service's profile (same [service] name)")
    require_fit(new_profile)  # a model that cannot fit: the same refusal as every verb, before any interpreter
    old = Environment.probe(installed.service.python)
    new = Environment.probe(python) if python else old
    if python and _same_environment(old, new):
        raise RefusedError("the new interpreter is the installed SGLang environment: an upgrade installs the new "
                           "release into an environment of its own and never changes the running one in place",
                           value=f"{python} ({new.location})",
                           hint="create one beside it (python3 -m venv /opt/sglang-NEW && /opt/sglang-NEW/bin/pip "
                                "install 'sglang==NEW'), then pass --python /opt/sglang-NEW/bin/python")
    new_profile = _with_python(new_profile, new.python)
    if new.location == old.location and new_profile.model_dump() == installed.model_dump():
        raise UsageError("nothing to upgrade: the same environment and the same profile as installed",
                         hint="pass --python NEW_INTERPRETER (a new SGLang) and/or --profile FILE (e.g. a new "
                              "model_path)")
    notes: list[str] = []
    if versions.parse_version(new.version) < versions.parse_version(old.version):
        notes.append(f"SGLang {new.version} is older than the installed {old.version}: a downgrade")
    deployment = resolve(new_profile, new.version)
    series = patching.find_series(new.version) if new.location != old.location else None
    patches: list[str] = []
    missing: list[str] = []
    check: dict[str, Any] = {"ok": True, "message": "no patches to apply"}
    if new.location == old.location and deployment.required_patches:
        # a model revision alone: nothing is applied to the running environment, so what the new profile
        # requires (an opt-in gate it turns on) must be there already
        try:
            there = patching.status(new.python, only=list(deployment.required_patches), state_dir=state_dir)
            applied = {p.id for p in there.patches if p.state == "applied"}
            missing = [p for p in deployment.required_patches if p not in applied]
        except KimiDeployError as exc:
            check = {"ok": False, "message": exc.message, "hint": exc.hint}
    if new.location != old.location:
        if series is None:
            notes.append(f"the kit has no patch series for SGLang {new.version} (patches/{new.version}/): the new "
                         "environment runs as released; the gate's parser tier shows what that means "
                         "(`kimi-deploy patch port` reports how the newest series fits)")
        else:
            patches = patches_to_apply(deployment, series, with_)
            try:
                done = patching.apply(new.python, only=patches, state_dir=state_dir, dry_run=True)
                check = {"ok": True, "message": done.message}
            except KimiDeployError as exc:
                check = {"ok": False, "message": exc.message, "hint": exc.hint}
    try:
        validation = validate_profile(new_profile, new.python).to_dict()
    except KimiDeployError as exc:
        validation = {"ok": False, "errors": [exc.message], "hint": exc.hint}
    plan = plan_install(new_profile, layout, sglang_version=new.version, enable=False,
                        create_user=False, allow_parser_removal=allow_parser_removal)
    return UpgradePlan(installed.service.name, old, new, installed.sglang.model_path, new_profile.sglang.model_path,
                       spelling_changes(old.version, new.version, new_profile), series.sglang_version if series
                       else None, patches, check, validation, plan, new_profile, state_dir, notes, deployment, missing)


def patches_to_apply(deployment: Deployment, series: patching.Series, with_: Sequence[str] = ()) -> list[str]:
    """The ids an upgrade applies to the new environment, in series order: the deployment's required set (the
    series' defaults plus every opt-in patch a feature the profile turns on needs) plus ``with_``.

    Raises:
        UsageError: an unknown id in ``with_``.
    """
    return [p.id for p in series.select(with_=[*deployment.gated, *with_])]


def already_done(installed: Profile, installed_version: str, *, python: str | None,
                 profile: Profile | None = None) -> str | None:
    """The sentence for an upgrade that is already in place (a re-run after it finished), else None.

    In place: ``python`` is the installed interpreter, its SGLang is the version the install recorded
    (``Manifest.sglang_version``), and ``profile`` (with ``python``) is the installed one. An interpreter whose
    SGLang changed underneath the installed service (``pip install -U`` into the running environment) is not in
    place: :func:`plan_upgrade` refuses it.

    Raises:
        UsageError: ``python`` has no SGLang.
    """
    if python is None:
        return None
    env = Environment.probe(python)
    old = Environment.probe(installed.service.python)
    wanted = _with_python(profile or installed, env.python)
    if not _same_environment(old, env) or env.version != installed_version \
            or wanted.model_dump() != installed.model_dump():
        return None
    return (f"nothing to do: {installed.service.name} already runs SGLang {env.version} from {env.python} with this "
            "profile (the upgrade is in place)")


def _same_environment(a: Environment, b: Environment) -> bool:
    try:
        return os.path.samefile(a.location, b.location)
    except OSError:
        return Path(a.location).resolve() == Path(b.location).resolve()


@dataclasses.dataclass(frozen=True)
class UpgradeResult:
    """What :func:`apply_upgrade` did: the plan, the patch change (None: none), the install, the gated restart."""

    plan: UpgradePlan
    patched: patching.ChangeResult | None
    installed: ApplyResult
    restart: Any  # kimi_deploy.host.restart.RestartResult

    @property
    def exit_code(self) -> int:
        return self.restart.exit_code

    @property
    def rolled_back(self) -> bool:
        return self.restart.rollback is not None

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.plan.to_dict(), "exit_code": self.exit_code, "ok": self.exit_code == ExitCode.OK,
                "rolled_back": self.rolled_back, "patched": self.patched.to_dict() if self.patched else None,
                "backup": str(self.installed.backup) if self.installed.backup else None,
                "restart": self.restart.to_dict()}


def _label(env: Environment, model: str) -> str:
    return f"SGLang {env.version} ({env.python}), {model}"


def begin_change(plan: UpgradePlan, layout: HostLayout, gate: str) -> journal.Change:
    """Record the upgrade before its first write (:mod:`kimi_deploy.host.journal`): every file of the install
    plan in the old version (as on disk now) and the new one, both environments, the gate.

    Raises:
        UsageError / StorageError: the journal cannot be written; nothing changed.
    """
    files = {f.host_path: f for f in plan.install.files}
    old = {hp: f.old for hp, f in files.items()}
    new = {hp: f.new if f.action != "unchanged" else f.old for hp, f in files.items()}
    unit = Units.of(plan.service).server
    unit_hp = layout.host_path(layout.unit_path(unit))
    existed = old[unit_hp] is not None if unit_hp in old else layout.unit_path(unit).exists()
    change = journal.Change(kind="upgrade", service=plan.service, started_at=journal.stamp(),
                            old_label=_label(plan.old, plan.old_model), new_label=_label(plan.new, plan.new_model),
                            old=journal.hashes(old), new=journal.hashes(new), touches_files=True,
                            backups_before=journal.backup_names(layout, plan.service), unit_existed=existed,
                            gate=gate, resume=restart_lib.resume_command(layout, plan.service))
    return journal.begin(layout, change, old)


@contextlib.contextmanager
def locked(layout: HostLayout, service: str | None, *, on_event: Callable[[str], None] | None = None) \
        -> Iterator[tuple[str, journal.Recovery | None]]:
    """Hold ``service``'s lock (None: the only installed one) for an upgrade's plan and apply, after finishing or
    undoing an interrupted change of it (:func:`kimi_deploy.host.journal.recover`); yields ``(service, what the
    recovery did or None)``.

    Raises:
        UsageError: nothing installed, or several and no ``service``; an unreadable journal.
        LockedError: another install, uninstall, restart or upgrade of it is running (exit 7).
    """
    name = service or find_installed(layout, None).service
    with service_lock(layout, name):
        yield name, journal.recover(layout, name, live=True, on_event=on_event)


def apply_upgrade(plan: UpgradePlan, layout: HostLayout, *, gate: str = gates.DEFAULT_GATE,
                  timeout: float | None = None, poll_interval: float = 5.0,
                  on_event: Callable[[str], None] | None = None, on_poll: Callable[..., None] | None = None,
                  clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                  allow_parser_removal: bool = False) -> UpgradeResult:
    """Patch the new environment, install, restart gated with rollback on failure; journaled from before the
    first write to the end (:func:`begin_change`), so a kill at any instant leaves a change the next command
    finishes (the new version passed its gate) or undoes (anything else).

    The caller holds the service's lock (:func:`kimi_deploy.host.records.service_lock`; the CLI does) and has
    recovered an interrupted change first (:func:`kimi_deploy.host.journal.recover`) before planning.

    Raises:
        RefusedError: the plan has problems (validation errors, a patch that does not apply) or refused files
            (exit 4); nothing changed.
        KimiDeployError: from the patch engine (nothing changed there: all-or-nothing), the install, or the
            restart (see :func:`kimi_deploy.host.restart.restart`); the journal then stays for the next command.
    """
    if plan.problems:
        raise RefusedError("refusing to upgrade: the plan has problems", value="; ".join(plan.problems),
                           hint="fix them (`kimi-deploy upgrade --dry-run` shows the plan), then run it again")
    refuse(plan.install)
    say = on_event or (lambda _m: None)
    change = begin_change(plan, layout, gate)
    patched = None
    if plan.patches:
        say(f"applying {len(plan.patches)} patch(es) to the new environment ({plan.new.location})")
        patched = patching.apply(plan.new.python, only=plan.patches, state_dir=plan.state_dir)
    say("installing the new unit and profile (the previous files are kept in a backup)")
    installed = apply_install(plan.install)
    if installed.backup is not None:
        change = journal.update(layout, change, backup=layout.host_path(installed.backup))
    deployment = plan.deployment or resolve(plan.profile, plan.new.version, launches=False)
    result = restart_lib.restart(deployment, layout, wait=True, gate=gate, rollback_on_failure=True,
                                 timeout=timeout, poll_interval=poll_interval, on_event=on_event, on_poll=on_poll,
                                 clock=clock, sleep=sleep, allow_parser_removal=allow_parser_removal, change=change,
                                 hold_lock=False)
    return UpgradeResult(plan, patched, installed, result)


def format_plan(plan: UpgradePlan, *, diffs: bool = True) -> str:
    """The plan as text: versions, spelling changes, patches, validation, the install plan with its diffs."""
    lines = [f"upgrade {plan.service}:",
             f"  SGLang: {plan.old.version} ({plan.old.python}) -> {plan.new.version} ({plan.new.python})"
             + ("  [unchanged]" if plan.old.location == plan.new.location else ""),
             f"  model:  {plan.old_model}" + (f" -> {plan.new_model}" if plan.new_model != plan.old_model
                                             else "  [unchanged]")]
    if plan.spelling:
        lines.append(f"  flag spellings that differ between {plan.old.version} and {plan.new.version}:")
        for s in plan.spelling:
            what = s.feature + (f" = {s.value}" if s.value else "")
            mark = "  (your profile sets it)" if s.in_profile else ""
            lines.append(f"    {what}: {s.old or 'none'} -> {s.new or 'none'}{mark}")
    else:
        lines.append("  flag spellings: none differ between the two releases")
    if plan.patches:
        state = "applies" if plan.patch_check.get("ok") else "DOES NOT APPLY"
        lines.append(f"  patches (series {plan.series}, into the new environment only): {', '.join(plan.patches)} "
                     f"[{state}: {plan.patch_check.get('message')}]")
    gated = plan.deployment.gated if plan.deployment else {}
    if gated:
        lines.append("  required by the profile's features: " + ", ".join(f"{p} ({flag})" for p, flag in gated.items()))
    for problem in plan.problems:
        if problem.startswith("patches: the profile needs"):
            lines.append(f"  {problem}")
    v = plan.validation
    lines.append("  validate against the new interpreter: " + ("ok" if v.get("ok") else "FAILED"))
    for e in v.get("problems", v.get("errors", [])):
        lines.append(f"    error: {e}")
    for w in v.get("warnings", [])[:5]:
        lines.append(f"    warning: {w}")
    for n in plan.notes:
        lines.append(f"  note: {n}")
    text = "\n".join(lines) + "\n"
    return text + format_install_plan(plan.install, diffs=diffs)
