"""Verbs ``install`` and ``uninstall``: plan, show the plan (diffs), apply it unless ``--dry-run``."""

from __future__ import annotations


import click

from kimi_deploy.host.install.apply import ApplyResult, apply, refuse
from kimi_deploy.host.install.facts import this_host
from kimi_deploy.host.install.formatting import format_plan
from kimi_deploy.host.install.install_plan import plan_install
from kimi_deploy.host.install.plan import Plan
from kimi_deploy.host.install.uninstall_plan import pick_service, plan_uninstall
from kimi_deploy.host import journal
from kimi_deploy.host.records import service_lock, shared_lock
from kimi_deploy.cli.common import echo_json, json_flag, name_option, profile_options, profile_or_installed, root_option
from kimi_deploy.errors import KimiDeployError, UsageError
from kimi_deploy.paths import HostLayout
from kimi_deploy.versions import DEFAULT_SGLANG_VERSION


def _show(plan: Plan, result: ApplyResult | None, as_json: bool, dry_run: bool, diffs: bool) -> None:
    if as_json:
        echo_json(result.to_dict() if result else {**plan.to_dict(), "applied": False})
        return
    click.echo(format_plan(plan, diffs=diffs), nl=False)
    if dry_run:
        if not plan.is_noop:
            click.echo("dry run: nothing was changed")
        return
    if result:
        for message in result.messages:
            click.echo(f"done: {message}")


@click.command("install")
@profile_options
@name_option
@root_option
@click.option("--sglang-version", default=None, metavar="V",
              help=f"Target SGLang release for flag spellings (default {DEFAULT_SGLANG_VERSION}).")
@click.option("--dry-run", is_flag=True, help="Show the plan and the diffs; change nothing.")
@click.option("--force", is_flag=True, help="Replace files kimi-deploy did not write or that were edited by hand "
              "(the current ones are kept in /etc/kimi-deploy/backup).")
@click.option("--no-enable", is_flag=True, help="Do not enable the units (no start at boot).")
@click.option("--no-create-user", is_flag=True, help="Do not create the service user/group when missing.")
@click.option("--restart", is_flag=True, help="Restart the service when something changed (no wait; "
              "prefer `kimi-deploy restart --wait --rollback-on-failure`).")
@click.option("--host", "host", default=None, metavar="NAME",
              help="With [fleet]/[gateway]: which host of the profile this is (default: the one whose name or "
                   "address this machine has).")
@click.option("--allow-parser-removal", is_flag=True, help="Install a profile that drops --tool-call-parser or "
              "--reasoning-parser the installed one has (refused otherwise, exit 4: the server would serve tool calls "
              "as plain text).")
@json_flag("Print the plan and what was done as JSON.")
def install_cmd(profile_path, preset, name, root, sglang_version, dry_run, force, no_enable, no_create_user, restart,
                host, allow_parser_removal, as_json):
    """Install the rendered units, env file and profile on the host (plan, diff, apply).

    Without --profile/--preset: the installed profile, as every verb (`install --force` puts back the files
    edited since)."""
    if not root.is_dir():  # a typo'd --root would otherwise become a fresh tree of units, env file and key
        raise UsageError(f"--root: the directory {root} does not exist", value=str(root),
                         hint=f"create it first (mkdir -p {root}) if that tree is meant; install makes none")
    layout = HostLayout(root)
    profile = profile_or_installed(profile_path, preset, name, layout)
    host = this_host(profile, host)

    def make_plan():
        return plan_install(profile, layout, sglang_version=sglang_version, force=force,
                            enable=not no_enable, create_user=not no_create_user, restart=restart,
                            host=host, allow_parser_removal=allow_parser_removal, dry_run=dry_run)

    _recover_first(layout, profile.service.name, dry_run=dry_run, as_json=as_json)
    _carry_out(make_plan, dry_run=dry_run, force=force, as_json=as_json, diffs=True)


def _recover_first(layout: HostLayout, service: str | None, *, dry_run: bool, as_json: bool) -> None:
    """Finish or undo ``service``'s interrupted ``restart``/``upgrade`` (:func:`kimi_deploy.host.journal.recover`)
    before planning: the plan then starts from one complete version. A dry run only says one is on record.
    systemctl is run only on this host's manager (``--root /``)."""
    if not service:
        return
    if dry_run:
        waiting = journal.load(layout, service)
        if waiting is not None:
            click.echo(f"note: an interrupted {waiting.kind} of {service} is on record ({waiting.phase}): the real "
                       "run first finishes or undoes it, then plans again", err=True)
        return
    recovery = journal.recover_locked(layout, service, live=layout.is_host)
    if recovery is not None:
        for line in recovery.lines():
            click.echo(f"note: {line}", err=True)


@click.command("uninstall")
@root_option
@click.option("--name", default=None, metavar="NAME", help="Service to uninstall (default: the only one installed).")
@click.option("--dry-run", is_flag=True, help="Show the plan; change nothing.")
@click.option("--force", is_flag=True, help="Also remove installed files that were edited by hand.")
@click.option("--purge", is_flag=True, help="Also remove the state folder, the caches, the backups and an API "
              "key file kimi-deploy created; after an earlier uninstall, removes what it kept (with --name).")
@click.option("--diff", "show_diff", is_flag=True, help="Show the contents of the removed files (as with -v).")
@json_flag("Print the plan and what was done as JSON.")
@click.pass_context
def uninstall_cmd(ctx, root, name, dry_run, force, purge, show_diff, as_json):
    """Stop, disable and remove what kimi-deploy installed (only unmodified files; never foreign ones).

    Nothing installed: says so and exits 0."""
    if not root.is_dir():  # as install: a typo'd --root is no host tree, not "nothing installed" (exit 0)
        raise UsageError(f"--root: the directory {root} does not exist", value=str(root),
                         hint="give the tree install used (default /)")
    layout = HostLayout(root)
    service = pick_service(layout, name, purge)
    verbose = bool(ctx.find_root().params.get("verbose"))

    def make_plan():
        return plan_uninstall(layout, service, force=force, purge=purge)

    _recover_first(layout, service, dry_run=dry_run, as_json=as_json)
    _carry_out(make_plan, dry_run=dry_run, force=force, as_json=as_json, diffs=show_diff or verbose)


def _carry_out(make_plan, *, dry_run: bool, force: bool, as_json: bool, diffs: bool) -> None:
    """Show the plan (``--dry-run``, then its refusals, exit 4, or the error the real run raises, as exit 2 for a
    fleet host without its key file), or refuse it (exit 4) unless forced, else apply it and show the result.

    A plan that would change something is made again under the service's lock
    (:func:`kimi_deploy.host.records.service_lock`) and the host's lock on what services share
    (:func:`kimi_deploy.host.records.shared_lock`), and that one is applied: the facts, other services' claims on
    a port or key file included, cannot change between planning and applying. A plan refused without the lock is
    planned again under it when the service was ever locked (another run's half-applied files are no hand edit);
    an empty plan, and a refused one of a service never locked, take no lock (and leave no lock file).
    """
    plan = make_plan()
    if dry_run:
        _show(plan, None, as_json, dry_run=True, diffs=diffs)
        try:
            refuse(plan)
            if plan.blocked_by is not None:  # what the real run refuses (a fleet host without its key file)
                raise plan.blocked_by
        except KimiDeployError as exc:
            if not as_json:
                raise
            # The plan on stdout already lists the refusals: keep stdout one JSON document.
            click.echo(exc.render(), err=True)
            raise click.exceptions.Exit(int(exc.exit_code)) from None
        return
    if plan.refusals and not force and plan.layout.lock_file(plan.service).exists():
        # Planned without the lock, the refusal may be another run's files mid-apply ("edited after install"
        # while its manifest is not yet written): judge the plan that run leaves, under the lock. A service never
        # locked before has no such run (and gets no lock file from a refusal).
        with service_lock(plan.layout, plan.service), shared_lock(plan.layout):
            plan = make_plan()
            if not plan.refusals:
                _show(plan, apply(plan), as_json, dry_run=False, diffs=diffs)
                return
    if plan.refusals and not force:
        if not as_json:
            click.echo(format_plan(plan, diffs=diffs), nl=False, err=True)
        refuse(plan)
    if plan.is_noop:
        _show(plan, apply(plan), as_json, dry_run=False, diffs=diffs)
        return
    with service_lock(plan.layout, plan.service), shared_lock(plan.layout):
        plan = make_plan()  # with every other service's last install in place: a port or key file taken since
        result = apply(plan)  # is in this plan (refused or shared)
    _show(plan, result, as_json, dry_run=False, diffs=diffs)


COMMANDS = [install_cmd, uninstall_cmd]
