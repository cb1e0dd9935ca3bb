"""Plan ``install``: the rendered files (create, replace or remove, with diffs), the service accounts and GPU
groups, the cache folder, the API key file, the other services' claims (ports, paths), systemctl
daemon-reload, enable, start and restart.

:func:`plan_install_from` and its helpers are pure: facts in, :class:`kimi_deploy.host.install.plan.Plan`
out (it raises what no ``--force`` overrides: a dropped parser, a fleet host without its key file).
:func:`plan_install` renders the files (:func:`kimi_deploy.host.install.files.desired_files`) and gathers the
facts (:func:`kimi_deploy.host.install.facts.gather_install_facts`) first. Nothing here reads the host by
itself or writes it (:mod:`kimi_deploy.host.install.apply` does).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from pathlib import Path

from kimi_deploy import __version__, paths
from kimi_deploy.facts import units as unit_facts
from kimi_deploy.host import gate as gates
from kimi_deploy.errors import KimiDeployError, UsageError
from kimi_deploy.host.records import Claims, FileRecord, Intent, Manifest, listeners, sha256
from kimi_deploy.paths import HostLayout
from kimi_deploy.profile import Profile, naming_warnings, parse_profile
from kimi_deploy.deployment import Deployment, resolve
from kimi_deploy.host.install.files import desired_files, is_unit, target_host_path, units_to_enable, uses_api_key
from kimi_deploy.host.install.facts import HostFacts, gather_install_facts
from kimi_deploy.host.install.plan import Plan, Refusal, Step, disable_steps, file_change, stale_steps, who_uses


#: Shell of the service user: it never logs in (useradd(8) ``--shell``).
NOLOGIN = "/usr/sbin/nologin"


def _user_steps(profile: Profile, facts: HostFacts, create_user: bool, notes: list[str]) -> list[Step]:
    svc, layout = profile.service, facts.layout
    user_missing = svc.user not in facts.users
    group_missing = svc.group not in facts.groups
    if not (user_missing or group_missing):
        return []
    what = " and ".join(x for x, m in ((f"user {svc.user}", user_missing), (f"group {svc.group}", group_missing)) if m)
    if not create_user:
        notes.append(f"warning: {what} missing and --no-create-user given: the unit fails to start until it exists")
        return []
    if not facts.has_passwd:
        notes.append(f"{what} not created: the --root tree has no /etc/passwd (with --root, kimi-deploy runs "
                     f"useradd --root DIR only on a tree that has one); create it in the image")
        return []
    root_args = () if layout.is_host else ("--root", str(layout.root))
    steps = []
    if group_missing:
        steps.append(Step("command", f"create system group {svc.group}",
                          argv=("groupadd", *root_args, "--system", svc.group)))
    if user_missing:
        steps.append(Step("command", f"create system user {svc.user} (no home, no login shell)",
                          argv=("useradd", *root_args, "--system", "--no-create-home", "--shell", NOLOGIN,
                                "--gid", svc.group, "--home-dir", paths.service_state_dir(svc.name), svc.user)))
    return steps


def _accounts_created(profile: Profile, facts: HostFacts, account_steps: list[Step]) -> tuple[list[str], list[str]]:
    """The users and groups the manifest records as created by kimi-deploy (sorted): those ``account_steps``
    create now, and those the service's earlier records say an install created (the manifest, an
    interrupted install's, or the last uninstall's copy), so a reinstall never forgets them."""
    records = [r for r in (facts.manifest, facts.intent.manifest if facts.intent else None,
                           facts.last_uninstalled) if r]
    users = {u for r in records for u in r.users_created}
    groups = {g for r in records for g in r.groups_created}
    for step in account_steps:
        if step.argv[:1] == ("useradd",):
            users.add(profile.service.user)
        elif step.argv[:1] == ("groupadd",):
            groups.add(profile.service.group)
    return sorted(users), sorted(groups)


def _gpu_group_steps(profile: Profile, facts: HostFacts, create_user: bool) -> list[Step]:
    if not facts.layout.is_host or not create_user:
        return []
    user = profile.service.user
    return [Step("command", f"add {user} to group {group} (owns /dev/nvidia* nodes that are not 0666)",
                 argv=("usermod", "--append", "--groups", group, user))
            for group, members in sorted(facts.gpu_groups.items()) if user not in members]


def _api_key_step(facts: HostFacts, notes: list[str]) -> Step | None:
    """Create the key file when missing; refuse one that breaks the clients' rule
    (:func:`kimi_deploy.wire.apikey.key_file_problem`: what install accepts, check and bench accept).

    Raises:
        UsageError: the key file breaks the rule (the problem and its fix).
    """
    key = facts.key
    if key is None:
        return None
    path = facts.layout.join(key.host_path)
    if not key.exists:
        return Step("api-key", f"create the API key file {key.host_path} with a random key (mode 0600, owner root)",
                    path=path)
    if key.problem is not None:
        raise UsageError(f"the API key file is refused: {key.problem}", value=str(path),
                         hint=(key.fix or "").replace("FILE", key.host_path) or None)
    return None


def _hosts_overlap(a: str, b: str) -> bool:
    """Whether listeners on hosts ``a`` and ``b`` (same port) collide: equal, or either is a wildcard."""
    wildcard = ("0.0.0.0", "::", "")
    return a == b or a in wildcard or b in wildcard


def _conflicts(deployment: Deployment, claims: Claims, force: bool, notes: list[str], refusals: list[Refusal],
               installed: Collection[str]) -> None:
    """Compare what ``deployment`` uses (its key path; its profile's listeners, cache and state folders) with what
    the other installed services use (``claims``).

    ``installed``: the host paths this install puts in place; its listeners are those of its units
    (:func:`kimi_deploy.host.records.listeners`: a gateway-only host does not listen on ``[sglang] port``).

    A shared API key file or cache folder is legitimate: a ``warning:`` note (``uninstall --purge``
    of either keeps it while the other is installed). The same port on overlapping hosts, or a
    host path this profile uses that another service uses for something else (its unit, env file,
    state folder...), is refused without ``force`` (a ``warning:`` note with it).
    """
    def conflict(what: str, reason: str) -> None:
        if force:
            notes.append(f"warning: --force: {what}: {reason}")
        else:
            refusals.append(Refusal(what, reason, kind="conflict"))

    profile = deployment.profile
    for mine, port, _ in listeners(deployment, installed):
        for other, host, other_port, what in claims.ports:
            if port == other_port and _hosts_overlap(host, mine):
                conflict(f"port {port}", f"service {other} listens on {host}:{port} too (its {what}); "
                                         "only one of them can start")
    named = ((deployment.api_key_file, "API key file"), (profile.cache_root, "cache folder"),
             (paths.service_state_dir(profile.service.name), "state folder"))
    for host_path, what in named:
        users = claims.users(host_path)
        if not users:
            continue
        if all(use == what for _, use in users) and what != "state folder":
            notes.append(f"warning: the {what} {host_path} is also used by {who_uses(users)}: shared between services "
                         f"(recorded in the manifests); `uninstall --purge` of one keeps it while another is "
                         "installed")
        else:
            conflict(host_path, f"this profile's {what} is used by {who_uses(users)}")


def _refuse_restart_under_root(restart: bool, layout: HostLayout) -> None:
    """``install --restart`` restarts the running systemd's service, so it refuses a ``--root`` tree.

    Raises:
        UsageError: ``restart`` with a ``layout`` that is not the running host.
    """
    if restart and not layout.is_host:
        raise UsageError("--restart needs the running host, not --root", value=str(layout.root),
                         hint="drop --restart; restart on the host with `kimi-deploy restart --wait`")


def plan_install(profile: Profile, layout: HostLayout, *, sglang_version: str | None = None, force: bool = False,
                 enable: bool = True, create_user: bool = True, restart: bool = False, host: str | None = None,
                 allow_parser_removal: bool = False, dry_run: bool = False) -> Plan:
    """Compute what ``kimi-deploy install`` would do for ``profile`` on ``layout``; changes nothing.

    Gathers the facts (:func:`gather_install_facts`: reads files, accounts, ``systemctl [--root DIR]
    is-enabled`` / ``is-active``), then plans from them (:func:`plan_install_from`; ``dry_run``: see there).

    Raises:
        UsageError: ``restart`` with a root other than ``/``; an empty API key file; a bad manifest;
            a path leading out of the --root tree.
        RefusedError: ``profile`` drops ``--tool-call-parser``/``--reasoning-parser`` that the installed profile
            has (:func:`kimi_deploy.host.gate.refuse_parser_removal`), unless ``allow_parser_removal`` (exit 4).
        ExternalCommandError: systemctl is missing (pass ``enable=False`` to skip it).
    """
    _refuse_restart_under_root(restart, layout)
    files, version = desired_files(profile, sglang_version, host)
    facts = gather_install_facts(profile, layout, files, enable=enable, create_user=create_user)
    return plan_install_from(profile, facts, files, version, force=force, enable=enable, create_user=create_user,
                             restart=restart, allow_parser_removal=allow_parser_removal, dry_run=dry_run)


def _installed_copy(facts: HostFacts, service: str) -> Profile | None:
    """The installed profile copy among ``facts.files`` (None: absent, or not a profile this kit reads)."""
    import tomllib

    data = facts.files.get(paths.service_profile_copy(service))
    if not data:
        return None
    try:
        return parse_profile(tomllib.loads(data.decode("utf-8")), source="the installed profile copy")
    except (KimiDeployError, ValueError):  # tomllib's TOMLDecodeError and UnicodeDecodeError are ValueErrors
        return None


def plan_install_from(profile: Profile, facts: HostFacts, files: Mapping[str, bytes], version: str, *,
                      force: bool = False, enable: bool = True, create_user: bool = True,
                      restart: bool = False, allow_parser_removal: bool = False, dry_run: bool = False) -> Plan:
    """The install plan for ``profile`` given ``facts`` and the rendered ``files`` (:func:`desired_files`); no I/O.

    ``dry_run``: a host of a fleet without its API key file still gets its plan (no key is created: every host
    must hold the same one), with a warning and the refusal in :attr:`Plan.blocked_by`; the real run raises it.

    Raises:
        UsageError: ``restart`` with a root other than ``/``; the API key file is not a regular file, or empty;
            on a host of a fleet, missing (unless ``dry_run``).
        RefusedError: the installed profile copy sets a parser ``profile`` drops, unless ``allow_parser_removal``
            (exit 4; ``--force`` does not override it: it is about the server, not a file).
    """
    svc, layout = profile.service, facts.layout
    deployment = resolve(profile, launches=False)  # the units and the key path (none depends on the release)
    if not allow_parser_removal:
        gates.refuse_parser_removal(_installed_copy(facts, svc.name), profile, what=f"install {svc.name}",
                                    override="--allow-parser-removal")
    _refuse_restart_under_root(restart, layout)
    if facts.key is not None and not uses_api_key(files):
        facts = dataclasses.replace(facts, key=None)  # a rank >= 1: this host's units never read the key
    notes: list[str] = []
    refusals: list[Refusal] = []
    old, intent = facts.manifest, facts.intent

    steps: list[Step] = stale_steps(facts)
    serves = target_host_path(deployment.units.server) in files  # a gateway-only host runs as DynamicUser
    account_steps = _user_steps(profile, facts, create_user, notes) if serves else []
    steps += account_steps
    if serves:
        steps += _gpu_group_steps(profile, facts, create_user)
    if not paths.is_within(profile.cache_root, paths.service_cache_dir(svc.name)) \
            and profile.cache_root not in facts.dirs:
        steps.append(Step("mkdir", f"create the cache folder {profile.cache_root} (ReadWritePaths= must exist)",
                          path=layout.join(profile.cache_root),
                          owner=(svc.user, svc.group) if layout.is_host else None))
    notes += [f"warning: {w}" for w in naming_warnings(profile)]
    blocked_by = None
    if profile.hosts() and facts.key is not None and not facts.key.exists:
        blocked_by = UsageError("the API key file is missing; every host of a fleet must hold the same key",
                                value=facts.key.host_path, hint="copy the key file (0600, root) from the first host "
                                "to this one before installing, or create it once and copy it to every host "
                                "(docs/runbook.md#replicas-behind-a-gateway)")
        if not dry_run:
            raise blocked_by
        notes.append(f"warning: the API key file {facts.key.host_path} is missing; every host of a fleet must hold "
                     "the same key, so install refuses until it is copied here from the first host")
    _conflicts(deployment, facts.claims, force, notes, refusals, files)
    if facts.dataset_problem is not None and profile.quality is not None:
        where = profile.quality.dataset
        if facts.dataset_problem == "missing":
            notes.append(f"warning: [quality] dataset {where} is missing: the nightly check's quality tier fails (exit 2) "
                         "until it is copied there")
        else:
            raise UsageError(f"[quality] dataset {where} is {facts.dataset_problem}, not a regular file: the nightly "
                             "check reads only a regular JSONL file", value=where,
                             hint="copy the dataset to a regular file and name that in [quality] dataset")
    # a key path another service uses for something else is refused as that (exit 4), not as a bad key file
    key_step = None if blocked_by or refusals else _api_key_step(facts, notes)
    if key_step:
        steps.append(key_step)

    key_hp = deployment.api_key_file
    created_key = None
    if key_step:
        created_key = key_hp
    elif key_hp and key_hp in (old and old.api_key_file_created, intent and intent.api_key_created,
                               intent and intent.manifest.api_key_file_created):
        created_key = key_hp  # created by the last install, or by an interrupted one
    orphan_key = intent.api_key_created if intent else None
    if orphan_key and orphan_key != key_hp and orphan_key != (old.api_key_file_created if old else None) \
            and not facts.claims.users(orphan_key) and orphan_key in facts.exists:
        steps.append(Step("remove-file", f"remove the API key file {orphan_key} an interrupted install created",
                          path=layout.join(orphan_key)))
    users_created, groups_created = _accounts_created(profile, facts, account_steps)
    manifest = Manifest(kimi_deploy_version=__version__, service=svc.name, profile_sha256=profile.digest(),
                        sglang_version=version, files={hp: FileRecord(sha256=sha256(b)) for hp, b in files.items()},
                        api_key_file_created=created_key, api_key_file=key_hp,
                        cache_dir=profile.cache_root, state_dir=paths.service_state_dir(svc.name),
                        users_created=users_created, groups_created=groups_created)
    others = facts.claims.files()
    changes = [file_change(facts, hp, data, force, refusals, others=others) for hp, data in files.items()]
    recorded = set(old.files if old else ()) | set(intent.records() if intent else ())
    for hp in sorted(recorded - set(files)):  # files the last install wrote that this one does not render
        changes.append(file_change(facts, hp, None, force, refusals, others=others))
    manifest_hp = layout.host_path(layout.manifest(svc.name))
    changes.append(file_change(facts, manifest_hp, manifest.to_bytes(), force, refusals, needs_header=False))

    gone = [Path(c.host_path).name for c in changes if c.action == "remove" and is_unit(c.host_path)]
    steps += disable_steps(facts, gone)
    units = units_to_enable(deployment.units, files)
    units_changed = any(c.action != "unchanged" and c.host_path.startswith(paths.SYSTEMD_DIR + "/") for c in changes)
    if layout.is_host:
        if units_changed:
            steps.append(Step("command", "reload systemd's unit files", when="after",
                              argv=tuple(unit_facts.systemctl_argv("daemon-reload"))))
    elif units_changed:
        notes.append("daemon-reload skipped: --root edits a file tree, no running systemd to reload")
    if enable:
        root = None if layout.is_host else layout.root
        to_enable = [u for u in units if not facts.enabled.get(u, False)]
        if to_enable:
            steps.append(Step("command", f"enable {', '.join(to_enable)} (start at boot)", when="after",
                              argv=tuple(unit_facts.systemctl_argv("enable", *to_enable, root=root))))
        for timer in (u for u in units if u.endswith(".timer")):
            if layout.is_host and not facts.active.get(timer, False):
                steps.append(Step("command", "start the nightly check timer now", when="after",
                                  argv=tuple(unit_facts.systemctl_argv("start", timer))))
    else:
        notes.append("--no-enable: units are not enabled; the service does not start at boot")
    if restart:
        if any(c.action != "unchanged" for c in changes):
            steps.append(Step("command", f"restart {deployment.units.server}", when="after",
                              argv=tuple(unit_facts.systemctl_argv("restart", deployment.units.server))))
        else:
            notes.append("nothing changed: not restarting")
    if intent:
        notes.append("an earlier install of this service was interrupted: its files are recognised and "
                     "completed now")
    previous = dict(old.files) if old else {}
    record = Intent(manifest=manifest, previous=previous, api_key_created=key_hp if key_step else None)
    return Plan("install", svc.name, layout, tuple(changes), tuple(steps), tuple(notes), tuple(refusals), force,
                intent=record, stale_intent=intent is not None, blocked_by=blocked_by)
