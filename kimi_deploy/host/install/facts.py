"""What ``install``/``uninstall`` plan from: :class:`HostFacts`, gathered once per plan, and the reads behind it.

The only module of :mod:`kimi_deploy.host.install` that reads the host: the files a plan may touch and the
records beside them (:mod:`kimi_deploy.host.records`), accounts and the groups owning ``/dev/nvidia*`` nodes
(:mod:`kimi_deploy.facts.accounts`), ``systemctl is-enabled`` / ``is-active`` (:mod:`kimi_deploy.facts.units`),
the API key file, and which host of a fleet this machine is (:func:`this_host`). It never writes
and never plans: the planners (:mod:`kimi_deploy.host.install.install_plan`,
:mod:`kimi_deploy.host.install.uninstall_plan`) take a :class:`HostFacts` and read nothing else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from kimi_deploy.facts import accounts
from kimi_deploy.facts import units as unit_facts
from kimi_deploy.wire import apikey, inputs
from kimi_deploy.errors import UsageError
from kimi_deploy.host.records import (Claims, Intent, Manifest, installed_services, last_uninstalled_manifest,
                                      leftover_services, load_intent, load_manifest, other_services_claims, read_bytes,
                                      stale_files)
from kimi_deploy.paths import HostLayout
from kimi_deploy.topology import pick_host
from kimi_deploy.profile import Profile, valid_service_name
from kimi_deploy.deployment import Units, resolve
from kimi_deploy.host.install.files import is_unit, units_to_enable


@dataclasses.dataclass(frozen=True)
class HostFacts:
    """Everything ``install``/``uninstall`` plan from, gathered once (:func:`gather_install_facts`,
    :func:`gather_uninstall_facts`); the planners read nothing else.

    ``files``: host path -> bytes (None: absent) of every file the plan may write or remove.
    ``manifest``/``intent``: the service's manifest and the record of an interrupted install.
    ``last_uninstalled``: the manifest copy of the service's newest uninstall backup (install and
    uninstall read it when the service has no manifest: the accounts an earlier install created).
    ``claims``: what the other installed services use. ``users``/``groups``: the accounts asked
    about that exist (install: the profile's; uninstall: those the records say an install created);
    ``has_passwd``: the tree has ``/etc/passwd`` (``useradd --root`` needs it).
    ``gpu_groups``: group -> members, for the groups owning a ``/dev/nvidia*`` node that is not
    0666 (host only). ``enabled``/``active``: unit -> ``systemctl is-enabled``/``is-active``.
    ``key``: the API key file. ``dirs``: host paths asked about that are folders; ``exists``: host
    paths asked about that exist. ``stale``: leftovers of killed runs (:func:`kimi_deploy.host.records.stale_files`).
    ``installed``/``leftovers``: service names with a manifest / only an uninstall backup.
    """

    layout: HostLayout
    files: Mapping[str, bytes | None] = dataclasses.field(default_factory=dict)
    manifest: Manifest | None = None
    intent: Intent | None = None
    last_uninstalled: Manifest | None = None
    claims: Claims = dataclasses.field(default_factory=Claims)
    users: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()
    has_passwd: bool = True
    gpu_groups: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    enabled: Mapping[str, bool] = dataclasses.field(default_factory=dict)
    active: Mapping[str, bool] = dataclasses.field(default_factory=dict)
    key: apikey.KeyFile | None = None
    #: What is wrong with ``[quality] dataset`` on this host (missing, not a regular file), ``None`` when fine or unset.
    dataset_problem: str | None = None
    dirs: frozenset[str] = frozenset()
    exists: frozenset[str] = frozenset()
    stale: tuple[str, ...] = ()
    installed: tuple[str, ...] = ()
    leftovers: tuple[str, ...] = ()


def _read_files(layout: HostLayout, host_paths: set[str]) -> dict[str, bytes | None]:
    return {hp: read_bytes(layout.under(hp)) for hp in sorted(host_paths)}


def _unit_names(host_paths: set[str] | list[str]) -> list[str]:
    return sorted(Path(hp).name for hp in host_paths if is_unit(hp))


def gather_install_facts(profile: Profile, layout: HostLayout, desired: Mapping[str, bytes], *,
                         enable: bool = True, create_user: bool = True) -> HostFacts:
    """Read what :func:`kimi_deploy.host.install.install_plan.plan_install_from` needs for ``profile``
    (``desired``: :func:`kimi_deploy.host.install.files.desired_files`).

    Runs ``systemctl [--root DIR] is-enabled`` (with ``enable``, and on --root for units that go
    away) and, on the host, ``systemctl is-active`` for the timer.

    Raises:
        UsageError: a bad manifest; a path leading out of the --root tree.
        ExternalCommandError: systemctl is missing.
    """
    svc = profile.service
    deployment = resolve(profile, launches=False)  # the units and the key path (none depends on the release)
    manifest = load_manifest(layout, svc.name)
    intent = load_intent(layout, svc.name)
    last = None if manifest or intent else last_uninstalled_manifest(layout, svc.name)
    recorded = set(manifest.files if manifest else ()) | set(intent.records() if intent else ())
    manifest_hp = layout.host_path(layout.manifest(svc.name))
    targets = set(desired) | recorded | {manifest_hp}
    root = None if layout.is_host else layout.root
    units = []
    if enable:
        units += units_to_enable(deployment.units, desired)
    if not layout.is_host:
        units += [u for u in _unit_names(recorded - set(desired)) if u not in units]
    enabled = {u: unit_facts.is_enabled(u, root=root) for u in units}
    timers = [u for u in units_to_enable(deployment.units, desired) if u.endswith(".timer")]
    active = {timer: unit_facts.is_active(timer) for timer in timers} if enable and layout.is_host else {}
    dirs = frozenset({profile.cache_root} if layout.under(profile.cache_root).is_dir() else ())
    key_hp = deployment.api_key_file
    orphan = intent.api_key_created if intent else None
    exists = frozenset({orphan} if orphan and layout.under(orphan).exists() else ())
    return HostFacts(
        layout=layout, files=_read_files(layout, targets), manifest=manifest, intent=intent, last_uninstalled=last,
        claims=other_services_claims(layout, svc.name),
        users=accounts.existing_accounts(layout, "user", {svc.user}),
        groups=accounts.existing_accounts(layout, "group", {svc.group}),
        has_passwd=layout.is_host or layout.passwd.is_file(),
        gpu_groups=accounts.gpu_group_members() if layout.is_host and create_user else {},
        enabled=enabled, active=active, key=apikey.inspect(layout, key_hp) if key_hp else None, dirs=dirs, exists=exists,
        dataset_problem=_dataset_problem(layout, profile),
        stale=tuple(stale_files(layout, targets | {layout.host_path(layout.intent(svc.name))}
                                | ({key_hp} if key_hp else set()), svc.name)))


def _dataset_problem(layout: HostLayout, profile: Profile) -> str | None:
    """Whether the nightly unit's ``[quality] dataset`` is a regular file here, by the reader's own rule
    (:func:`kimi_deploy.wire.inputs.not_regular`): ``None`` when it is or is unset, else what it is."""
    dataset = profile.quality.dataset if profile.quality is not None else None
    if not dataset:
        return None
    try:
        st = layout.under(dataset).stat()
    except FileNotFoundError:
        return "missing"
    except (OSError, UsageError) as exc:
        return f"unreadable ({getattr(exc, 'strerror', None) or exc})"
    return inputs.not_regular(st.st_mode)


def gather_uninstall_facts(layout: HostLayout, name: str | None) -> HostFacts:
    """Read what :func:`kimi_deploy.host.install.uninstall_plan.plan_uninstall_from` needs: the installed and
    left-over services and, for the service ``name`` (None: only those lists), its manifest, intent, files and
    kept folders.

    Raises:
        UsageError: ``name`` is not a service name; a bad manifest; a path leading out of the --root tree.
    """
    installed, leftovers = tuple(installed_services(layout)), tuple(leftover_services(layout))
    if name is None:
        return HostFacts(layout=layout, installed=installed, leftovers=leftovers)
    name = valid_service_name(name)
    manifest = load_manifest(layout, name)
    intent = load_intent(layout, name)
    last = None if manifest or intent else last_uninstalled_manifest(layout, name)
    recorded = set(manifest.files if manifest else ()) | set(intent.records() if intent else ())
    manifest_hp = layout.host_path(layout.manifest(name))
    files = _read_files(layout, recorded | {manifest_hp}) if manifest or intent else {}
    enabled = ({} if layout.is_host else
               {u: unit_facts.is_enabled(u, root=layout.root) for u in _unit_names(recorded)})
    kept = [r for r in (manifest, intent.manifest if intent else None, last) if r]
    candidates = {layout.host_path(layout.service_backup_dir(name)),
                  layout.host_path(layout.timer_stamp(Units.of(name).check_timer))}
    for record in kept:
        candidates |= {record.state_dir, record.cache_dir}
        if record.api_key_file_created:
            candidates.add(record.api_key_file_created)
    if intent and intent.api_key_created:
        candidates.add(intent.api_key_created)
    exists = frozenset(hp for hp in candidates if layout.under(hp).exists())
    key_paths = {r.api_key_file_created for r in kept if r.api_key_file_created}
    return HostFacts(
        layout=layout, files=files, manifest=manifest, intent=intent, last_uninstalled=last,
        claims=other_services_claims(layout, name), enabled=enabled, exists=exists,
        users=accounts.existing_accounts(layout, "user", {u for r in kept for u in r.users_created}),
        groups=accounts.existing_accounts(layout, "group", {g for r in kept for g in r.groups_created}),
        stale=tuple(stale_files(layout, recorded | {manifest_hp, layout.host_path(layout.intent(name))} | key_paths,
                                name)),
        installed=installed, leftovers=leftovers)


def this_host(profile: Profile, host: str | None) -> str | None:
    """Which host of a ``[fleet]``/``[gateway]`` profile this install is for (``--host``, else found by this
    machine's addresses: :func:`kimi_deploy.topology.pick_host`); None for a one-host profile.

    Raises:
        UsageError: ``host`` given for a one-host profile; no host (or several) of the profile matches (exit 2).
    """
    if profile.hosts():
        return pick_host(profile, host)
    if host is not None:
        raise UsageError("--host is for a profile with [fleet] or [gateway]; this one describes one host",
                         value=host, hint="drop --host")
    return None
