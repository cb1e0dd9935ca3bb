"""Carry a plan out (:func:`apply`) or refuse it (:func:`refuse`): the only module of
:mod:`kimi_deploy.host.install` that changes the host.

It plans nothing and reads nothing to decide: it does what the :class:`kimi_deploy.host.install.plan.Plan`
says, in the order :func:`apply` documents (intent record, steps before, backup, one atomic write, removals,
steps after). The caller holds the service's lock (:func:`kimi_deploy.host.records.service_lock`) and the
host's (:func:`kimi_deploy.host.records.shared_lock`); the CLI does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any

from kimi_deploy import fsio, proc
from kimi_deploy.wire import apikey
from kimi_deploy.errors import ExternalCommandError, KimiDeployError, RefusedError
from kimi_deploy.fsio import write_atomic, write_many_atomic
from kimi_deploy.host.records import restore_backup, write_backup
from kimi_deploy.paths import HostLayout
from kimi_deploy.host.install.plan import Plan, Step
from kimi_deploy.host.install.formatting import count_files, count_removed, install_message


@dataclasses.dataclass(frozen=True)
class ApplyResult:
    """What :func:`apply` did: the plan, the backup folder (None: no file changed), commands run, messages."""

    plan: Plan
    backup: Path | None
    ran: tuple[str, ...]
    messages: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {**self.plan.to_dict(), "applied": True, "backup": str(self.backup) if self.backup else None,
                "ran": list(self.ran), "messages": list(self.messages)}


def refuse(plan: Plan) -> None:
    """Raise :class:`RefusedError` naming every refused file, unless the plan has none or is forced."""
    if not plan.refusals or plan.force:
        return
    conflicts = [r for r in plan.refusals if r.kind == "conflict"]
    if conflicts:
        raise RefusedError(f"refusing to {plan.operation}: {plan.service} would collide with another installed "
                           "service", value="; ".join(f"{r.host_path}: {r.reason}" for r in plan.refusals),
                           hint="give this profile its own ports ([sglang] port, [gateway] port) and paths "
                                f"(`{plan.layout.command('status --name OTHER')}` shows the other one), or pass --force "
                                "to install anyway")
    lines = [f"{r.host_path}: {r.reason}" for r in plan.refusals]
    count, them = count_files(len(lines)), "it" if len(lines) == 1 else "them"
    backups = plan.layout.describe(plan.layout.host_path(plan.layout.service_backup_dir(plan.service)))
    if plan.operation == "install":
        message = f"refusing to install: it would overwrite {count} that kimi-deploy did not write as they are now"
        hint = (f"move hand edits into the profile (compare with `{plan.layout.command('install --dry-run')}`), "
                "or pass --force "
                f"to overwrite {them}: a copy is kept in {backups}")
    else:
        message = f"refusing to uninstall: {count} changed since kimi-deploy installed {them}"
        hint = ("copy out what you want to keep (see the changes with "
                f"`{plan.layout.command('uninstall --dry-run --diff')}`), "
                f"then pass --force to remove {them} anyway: a copy is kept in {backups}")
    raise RefusedError(message, value="; ".join(lines), hint=hint)


def _create_api_key(path: Path) -> None:
    write_atomic(path, apikey.new_key() + "\n", mode=0o600)
    if os.geteuid() == 0:
        os.chown(path, 0, 0)


def _run_step(step: Step, layout: HostLayout, ran: list[str], messages: list[str]) -> None:
    if step.kind == "command":
        done = proc.run(step.argv, check=False, hint=step.hint)
        ran.append(done.command)
        if not done.ok and done.returncode != step.gone_exit:
            raise ExternalCommandError(f"command failed with exit status {done.returncode}", command=done.shown,
                                       returncode=done.returncode, stdout=done.stdout, stderr=done.stderr,
                                       hint=step.hint)
    elif step.kind == "mkdir":
        assert step.path is not None
        fsio.mkdir(step.path)
        if step.owner:
            shutil.chown(step.path, *step.owner)
    elif step.kind == "api-key":
        assert step.path is not None
        _create_api_key(step.path)
        messages.append(f"created the API key file {layout.host_path(step.path)} (mode 0600, a random key; "
                        "clients need it as their Bearer token)")
        return
    elif step.kind == "remove-tree":
        assert step.path is not None
        fsio.remove_tree(step.path)
    elif step.kind == "remove-file":
        assert step.path is not None
        fsio.remove(step.path)
    elif step.kind == "remove-cache-keys":
        assert step.path is not None
        for child in sorted(step.path.glob("sglang-*")):
            fsio.remove_tree(child)
    messages.append(step.summary)


def apply(plan: Plan) -> ApplyResult:
    """Carry ``plan`` out: intent record, steps before, backup, one atomic write, removals, steps after.

    An install first writes its intent (:class:`kimi_deploy.host.records.Intent`: the manifest it is
    about to install, the one it replaces, the key file it creates) and removes it after the last
    file; a run killed in between leaves files the next run recognises as its own. A failure
    while staging or renaming the new files leaves every target as it was
    (:func:`kimi_deploy.fsio.write_many_atomic` undoes a half-done rename), drops the backup set
    and removes an API key file this run created; a failure while removing files restores the backup.
    The caller holds :func:`kimi_deploy.host.records.service_lock` (the CLI does).

    Raises:
        RefusedError: the plan has refusals and no ``force`` (exit 4); nothing was changed.
        UsageError: a target cannot be written (permissions, a folder in the way); the plan is a dry run's that
            the real run refuses (:attr:`Plan.blocked_by`; nothing was changed).
        StorageError: the file system refused (disk full, read-only); exit 8.
        ExternalCommandError: useradd/systemctl failed; files written so far stay (rerun after fixing).
    """
    if plan.blocked_by is not None:
        raise plan.blocked_by
    refuse(plan)
    ran: list[str] = []
    messages: list[str] = []
    layout = plan.layout
    intent_path = layout.intent(plan.service) if plan.service else None
    changes = plan.changes
    record = plan.intent if plan.operation == "install" and (changes or plan.steps) else None
    if record is not None and intent_path is not None:
        write_atomic(intent_path, record.to_bytes(), mode=0o600)
    created_key: Path | None = None
    backup = None
    try:
        for step in plan.steps:
            if step.when == "before":
                _run_step(step, layout, ran, messages)
                if step.kind == "api-key":
                    created_key = step.path
        if changes:
            backup = write_backup(layout, plan.service, plan.operation, {c.host_path: c.old for c in changes})
            writes = {c.path: c.new for c in changes if c.new is not None}
            write_many_atomic(writes)
    except BaseException:
        if backup is not None:
            with contextlib.suppress(KimiDeployError):
                fsio.remove_tree(backup.path)
        if created_key is not None:  # the key of a run that failed goes with it
            with contextlib.suppress(KimiDeployError):
                fsio.remove(created_key)
        if record is not None and intent_path is not None:
            with contextlib.suppress(KimiDeployError):
                fsio.remove(intent_path)
        raise
    backup_path = backup.path if backup else None
    if changes:
        assert backup is not None
        try:
            for c in changes:
                if c.action == "remove":
                    fsio.remove(c.path)
        except KimiDeployError as exc:
            restore_backup(layout, backup, "")
            exc.message = f"{plan.operation} failed midway and was rolled back: {exc.message}"
            raise
        saved = layout.host_path(backup.path)
        if plan.operation == "install":
            messages.append(install_message(plan, saved))
        elif any(st.kind == "remove-tree" and st.path == layout.service_backup_dir(plan.service)
                 for st in plan.steps):
            messages.append(f"uninstall: removed {count_removed(plan)}")
        else:
            messages.append(f"uninstall: removed {count_removed(plan)}; copies kept in {saved}")
    if intent_path is not None and (record is not None or plan.stale_intent):
        fsio.remove(intent_path)
    for step in plan.steps:
        if step.when == "after":
            _run_step(step, layout, ran, messages)
    return ApplyResult(plan, backup_path, tuple(ran), tuple(messages))
