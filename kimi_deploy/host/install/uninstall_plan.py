"""Plan ``uninstall``: remove the unmodified files a service's manifest lists and, with ``--purge``, what an
uninstall keeps (state and cache folders, backups, an API key file kimi-deploy created, the accounts it
created, the nightly timer's stamp).

:func:`plan_uninstall_from` and its helpers are pure: facts in, :class:`kimi_deploy.host.install.plan.Plan`
out. :func:`plan_uninstall` and :func:`pick_service` gather the facts first
(:func:`kimi_deploy.host.install.facts.gather_uninstall_facts`). Nothing here reads the host by itself or
writes it (:mod:`kimi_deploy.host.install.apply` does).
"""

from __future__ import annotations

from pathlib import Path

from kimi_deploy import paths
from kimi_deploy.facts import units as unit_facts
from kimi_deploy.errors import UsageError
from kimi_deploy.host.records import Manifest
from kimi_deploy.paths import HostLayout
from kimi_deploy.profile import valid_service_name
from kimi_deploy.deployment import Units
from kimi_deploy.host.install.files import is_unit
from kimi_deploy.host.install.facts import HostFacts, gather_uninstall_facts
from kimi_deploy.host.install.plan import Plan, Refusal, Step, disable_steps, file_change, stale_steps, who_uses


def _purge_steps(facts: HostFacts, svc: str, record: Manifest | None) -> tuple[list[Step], list[str], list[str]]:
    """``--purge`` steps for what ``uninstall`` keeps, the host paths of what exists of it, and notes
    on what stays because another installed service names it (its manifest or profile copy).

    ``record``: the service's manifest (the installed one, the interrupted install's, or the copy in
    its last uninstall backup); None when none exists: only the backup folder is known to be
    kimi-deploy's. The backups go last: a purge killed half-way still finds its record there.
    """
    steps: list[Step] = []
    kept: list[str] = []
    shared: list[str] = []
    layout, claims = facts.layout, facts.claims

    def in_use(host_path: str, what: str) -> bool:
        users = claims.users(host_path)
        if users and host_path in facts.exists:
            shared.append(f"the {what} {host_path} stays: {who_uses(users)} uses it too")
        return bool(users)

    if record:
        if in_use(record.state_dir, "state folder"):
            pass
        elif record.state_dir in facts.exists:
            kept.append(record.state_dir)
            steps.append(Step("remove-tree", f"--purge: remove the state folder {record.state_dir}", when="after",
                              path=layout.join(record.state_dir)))
        if in_use(record.cache_dir, "cache folder"):
            pass
        elif record.cache_dir in facts.exists:
            kept.append(record.cache_dir)
            if record.cache_dir.rstrip("/") == paths.service_cache_dir(svc):
                steps.append(Step("remove-tree", f"--purge: remove the cache folder {record.cache_dir}",
                                  when="after", path=layout.join(record.cache_dir)))
            else:
                steps.append(Step("remove-cache-keys",
                                  f"--purge: remove the sglang-* cache folders in {record.cache_dir} "
                                  "(the folder itself is yours)", when="after", path=layout.join(record.cache_dir)))
    keys = [record.api_key_file_created] if record and record.api_key_file_created else []
    if facts.intent and facts.intent.api_key_created and facts.intent.api_key_created not in keys:
        keys.append(facts.intent.api_key_created)
    backups = layout.service_backup_dir(svc)
    backups_hp = layout.host_path(backups)
    if backups_hp in facts.exists or record is not None:  # an uninstall of an installed service writes one now
        kept.append(backups_hp)
    for key in keys:
        if not in_use(key, "API key file") and key in facts.exists:
            kept.append(key)
            steps.append(Step("remove-file", f"--purge: remove the API key file {key} (kimi-deploy created it)",
                              when="after", path=layout.join(key)))
    steps += _account_purge_steps(facts, [r for r in (record, facts.intent.manifest if facts.intent else None)
                                          if r], kept, shared)
    if backups_hp in kept:
        steps.append(Step("remove-tree", f"--purge: remove the backups {backups_hp}", when="after", path=backups))
    stamp = layout.host_path(layout.timer_stamp(Units.of(svc).check_timer))
    if stamp in facts.exists:  # with its last 03:00 run recorded, a reinstall would run a "missed" check at once
        kept.append(stamp)
        steps.append(Step("remove-file", f"--purge: remove the nightly timer's last-run stamp {stamp}",
                          when="after", path=layout.join(stamp)))
    return steps, kept, shared


def _account_purge_steps(facts: HostFacts, records: list[Manifest], kept: list[str], shared: list[str]) -> list[Step]:
    """``userdel``/``groupdel`` of the accounts ``records`` say an install created, that exist and that no
    other installed service runs as or created (then a note in ``shared``); users first (a group that is
    still some user's primary group cannot go). Each one goes into ``kept`` as ``user NAME``/``group NAME``."""
    layout = facts.layout
    root_args = () if layout.is_host else ("--root", str(layout.root))
    steps = []
    for kind, names, present, command in (
            ("user", {u for r in records for u in r.users_created}, facts.users, "userdel"),
            ("group", {g for r in records for g in r.groups_created}, facts.groups, "groupdel")):
        for name in sorted(names & present):
            users = facts.claims.accounts.get(f"{kind} {name}", [])
            if users:
                shared.append(f"the {kind} {name} stays: {who_uses(users)}")
                continue
            kept.append(f"{kind} {name}")
            steps.append(Step(
                "command", f"--purge: remove the system {kind} {name} (kimi-deploy created it)", when="after",
                argv=(command, *root_args, name), gone_exit=6,
                hint=(f"a process still runs as {name} (`pgrep -u {name}`): stop it, then run "
                      f"`{layout.command('uninstall --purge --name ' + (records[0].service or 'NAME'))}` again"
                      if kind == "user" else f"a user still has {name} as its primary group: "
                                             f"`{command} {name}` after that user is gone")))
    return steps


def _pick_service(facts: HostFacts, name: str | None, purge: bool) -> str | None:
    """The service ``uninstall`` acts on: ``name``, the only installed one, or the only one left over
    by an earlier uninstall; None when there is none (or, without ``purge``, several left over).

    Raises:
        UsageError: several candidates and no ``name``; ``name`` is not a service name.
    """
    if name is not None:
        return valid_service_name(name)
    if len(facts.installed) == 1:
        return facts.installed[0]
    if len(facts.installed) > 1:
        raise UsageError("several services are installed; say which one to uninstall",
                         value=", ".join(facts.installed), hint="pass --name NAME")
    if len(facts.leftovers) == 1:
        return facts.leftovers[0]
    if len(facts.leftovers) > 1 and purge:
        raise UsageError("several uninstalled services left files behind; say which to purge",
                         value=", ".join(facts.leftovers), hint="pass --name NAME")
    return None


def pick_service(layout: HostLayout, name: str | None, purge: bool = False) -> str | None:
    """The service ``uninstall`` would act on (see :func:`plan_uninstall`); None: none.

    Raises:
        UsageError: several candidates and no ``name``; ``name`` is not a service name.
    """
    return _pick_service(gather_uninstall_facts(layout, None), name, purge)


def plan_uninstall(layout: HostLayout, name: str | None = None, *, force: bool = False,
                   purge: bool = False) -> Plan:
    """Compute what ``kimi-deploy uninstall`` would do: remove the files the manifest lists that are unmodified.

    Files kimi-deploy did not install are never touched, nor files another service's manifest
    lists. The state folder, the caches, the backups and an API key file kimi-deploy created
    are kept unless ``purge``. A service already uninstalled plans only the ``purge`` of what
    its uninstall kept (read from the manifest copy in its last uninstall backup); with nothing
    left, or nothing installed at all, the plan is a no-op that says so. Gathers the facts
    (:func:`gather_uninstall_facts`), then plans from them (:func:`plan_uninstall_from`).

    Raises:
        UsageError: several services (installed, or left over with ``purge``) and no ``name``; a bad manifest.
    """
    svc = _pick_service(gather_uninstall_facts(layout, None), name, purge)
    return plan_uninstall_from(gather_uninstall_facts(layout, svc), svc, force=force, purge=purge)


def plan_uninstall_from(facts: HostFacts, svc: str | None, *, force: bool = False, purge: bool = False) -> Plan:
    """The uninstall plan of service ``svc`` (None: none picked) given ``facts``; no I/O."""
    layout = facts.layout
    if svc is None:
        where = layout.host_path(layout.config_dir)
        message = f"nothing to do: no service installed by kimi-deploy in {where}"
        notes = ([f"left over from earlier uninstalls: {', '.join(facts.leftovers)} "
                  f"(remove with `{layout.command('uninstall --purge --name NAME')}`)"] if facts.leftovers else [])
        return Plan("uninstall", "", layout, (), (), tuple(notes), (), force, noop_message=message)
    manifest, intent = facts.manifest, facts.intent
    stale = stale_steps(facts)
    if manifest is None and intent is None:  # uninstalled before: only what that uninstall kept may be left
        purge_steps, kept, shared = _purge_steps(facts, svc, facts.last_uninstalled)
        if purge:
            return Plan("uninstall", svc, layout, (), tuple(stale + purge_steps), tuple(shared), (), force,
                        noop_message=f"nothing to do: {svc} is not installed and nothing of it is left")
        notes = [f"{svc} is already uninstalled; kept (remove with `{layout.command(f'uninstall --purge --name {svc}')}`): "
                 f"{', '.join(kept)}"] if kept else []
        return Plan("uninstall", svc, layout, (), tuple(stale), tuple(notes), (), force,
                    noop_message=f"nothing to do: {svc} is not installed"
                                 + ("" if kept else " and nothing of it is left"))
    notes: list[str] = []
    refusals: list[Refusal] = []
    others = facts.claims.files()
    recorded = set(manifest.files if manifest else ()) | set(intent.records() if intent else ())
    changes = [file_change(facts, hp, None, force, refusals, others=others) for hp in sorted(recorded)]
    manifest_hp = layout.host_path(layout.manifest(svc))
    changes.append(file_change(facts, manifest_hp, None, force, refusals, needs_header=False, manifest=_NO_MANIFEST))

    units = [Path(c.host_path).name for c in changes if c.action == "remove" and is_unit(c.host_path)]
    units.sort(key=lambda u: (not u.startswith(f"{svc}."), u.endswith(".service"), u))  # server first, timers next
    steps = stale + disable_steps(facts, units)
    if units and layout.is_host:
        # A unit that failed (e.g. the last nightly check) stays loaded as "not-found failed" after its file
        # is gone, and `systemctl --failed` and unit monitoring keep reporting it (seen under systemd 252 in
        # tests/test_container_serve.py). Each name goes as a glob matching only itself ("x.servic[e]"):
        # systemctl expands globs over loaded units, so a unit `disable --now` already unloaded is skipped
        # instead of failing the uninstall with "Unit ... not loaded".
        steps.append(Step("command", f"forget the failed state of {', '.join(units)}", when="after",
                          argv=tuple(unit_facts.systemctl_argv("reset-failed", *(f"{u[:-1]}[{u[-1]}]" for u in units)))))
        steps.append(Step("command", "reload systemd's unit files", when="after",
                          argv=tuple(unit_facts.systemctl_argv("daemon-reload"))))
    record = manifest or (intent.manifest if intent else None)
    if intent:
        notes.append("an install of this service was interrupted: the files it wrote are removed too")
    purge_steps, kept, shared = _purge_steps(facts, svc, record)
    notes += shared
    if purge:
        steps += purge_steps
    elif kept:
        notes.append(f"kept (remove with `{layout.command(f'uninstall --purge --name {svc}')}`): {', '.join(kept)}")
    return Plan("uninstall", svc, layout, tuple(changes), tuple(steps), tuple(notes), tuple(refusals), force,
                stale_intent=intent is not None)


#: Classify the manifest file itself against no record (it carries no header).
_NO_MANIFEST = Manifest(kimi_deploy_version="", service="", profile_sha256="", sglang_version="", files={},
                        cache_dir="/", state_dir="/")
