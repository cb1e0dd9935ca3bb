"""Verb ``upgrade``: a new SGLang environment (``--python``) or model revision (``--profile``), gated."""

from __future__ import annotations

import click

from kimi_deploy.errors import UsageError
from kimi_deploy.cli.common import (Seconds, echo_json, host_systemd_option, json_flag, refuse_host_systemd,
                                    resolve_installed, resolve_profile, root_option)
from kimi_deploy.paths import DEFAULT_STATE_DIR, HostLayout


@click.command("upgrade")
@root_option
@click.option("--python", "python", default=None, metavar="P",
              help="Interpreter of the NEW SGLang environment (its own venv beside the installed one; the installed "
                   "one is never changed).")
@click.option("--profile", "profile_path", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="The new profile (same [service] name), e.g. a new model_path; default: the installed one.")
@click.option("--name", default=None, metavar="NAME", help="Installed service (default: the only one).")
@click.option("--with", "with_", multiple=True, metavar="IDS",
              help="Opt-in patches of the new version's series to apply besides its defaults (comma-separated).")
@click.option("--gate", type=click.Choice(["ready", "fast", "parser", "contract"]), default="contract",
              show_default=True, help="How far the restart's gate verifies (see `kimi-deploy restart --help`).")
@click.option("--timeout", type=Seconds(min=0, min_open=True), default=None, metavar="S",
              help="Seconds to wait for readiness (default: the unit's TimeoutStartSec=).")
@click.option("--poll-interval", type=Seconds(min=0, min_open=True, max=3600), default=5.0, show_default=True,
              metavar="S", help="Seconds between readiness probes.")
@click.option("--state-dir", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="kimi-deploy's state directory for the patch records (default $KIMI_DEPLOY_STATE_DIR or "
                   "/var/lib/kimi-deploy; under --root: ROOT/var/lib/kimi-deploy).")
@click.option("--allow-parser-removal", is_flag=True,
              help="Accept a new profile that drops --tool-call-parser or --reasoning-parser.")
@click.option("--dry-run", is_flag=True, help="Show the plan only; change nothing.")
@host_systemd_option
@json_flag("Print the plan (and the result) as JSON.")
@click.pass_context
def upgrade_cmd(ctx, root, python, profile_path, name, with_, gate, timeout, poll_interval, state_dir,
                allow_parser_removal, dry_run, host_systemd, as_json):
    """Move the installed service to a new SGLang environment or model revision, gated; roll back on failure.

    The plan shows the version change, the flag spellings that differ between the releases, the patch series
    applied to the new environment only (all-or-nothing), validate against the new interpreter and the unit
    diff. Then install and `restart --wait --gate contract --rollback-on-failure`: a failed tier points the
    unit back at the old, untouched environment (exit 1; exit 10 when the restored version fails too)."""
    from pathlib import Path

    from kimi_deploy.host import upgrade as upgrade_lib  # start-up: the upgrade library loads when the verb runs

    if python is None and profile_path is None:
        raise UsageError("nothing to upgrade", hint="pass --python NEW_INTERPRETER (a new SGLang environment) "
                                                    "and/or --profile FILE (e.g. a new model_path)")
    layout = HostLayout(root)
    refuse_host_systemd(layout, host_systemd, "upgrade", dry_run=dry_run)
    new_profile = resolve_profile(Path(profile_path), None) if profile_path else None
    if new_profile is not None:
        upgrade_lib.check_revision_name(new_profile, Path(profile_path), name, layout)
    if state_dir is None and not layout.is_host:
        state_dir = str(layout.under(DEFAULT_STATE_DIR))
    ids = [i.strip() for v in with_ for i in v.split(",") if i.strip()]
    service = new_profile.service.name if new_profile else name

    def plan_it():
        installed, _manifest = resolve_installed(None, None, service, layout)
        return upgrade_lib.plan_upgrade(installed, layout, python=python, profile=new_profile, with_=ids,
                                        state_dir=state_dir, allow_parser_removal=allow_parser_removal)

    if dry_run:
        plan = plan_it()
        waiting = upgrade_lib.journal.load(layout, plan.service)
        if waiting is not None:
            plan.notes.append(f"an interrupted {waiting.kind} is on record ({waiting.phase}): the real run first "
                              "finishes or undoes it and plans again")
        if as_json:
            echo_json({**plan.to_dict(), "applied": False})
        else:
            click.echo(upgrade_lib.format_plan(plan), nl=False)
            click.echo("dry run: nothing was changed")
        ctx.exit(1 if plan.problems else 0)

    def on_event(message):
        if not as_json:
            click.echo(message, err=True)

    with upgrade_lib.locked(layout, service, on_event=on_event) as (service, recovery):
        if recovery is not None and recovery.changed_anything and recovery.change.kind == "upgrade" \
                and (recovery.target == "new" or recovery.change.verdict == "fail"):
            # it finished (the new version passed its gate), or its new version failed the gate: this run
            # completed or rolled back the interrupted upgrade, and does not try the failed version again
            if as_json:
                echo_json({"recovered": recovery.to_dict(), "ok": recovery.target == "new",
                           "exit_code": 0 if recovery.target == "new" else 1})
            else:
                for line in recovery.lines():
                    click.echo(line)
            ctx.exit(0 if recovery.target == "new" else 1)
        installed, manifest = resolve_installed(None, None, service, layout)
        done = upgrade_lib.already_done(installed, manifest.sglang_version, python=python, profile=new_profile)
        if done is not None:  # a re-run of an upgrade that finished (or that a recovery just finished)
            if as_json:
                echo_json({"ok": True, "exit_code": 0, "applied": False, "message": done,
                           "recovered": recovery.to_dict() if recovery else None})
            else:
                click.echo(done)
            ctx.exit(0)
        plan = plan_it()
        if not as_json:
            if recovery is not None:
                for line in recovery.lines():
                    click.echo(line, err=True)
            click.echo(upgrade_lib.format_plan(plan, diffs=False), nl=False)
        result = upgrade_lib.apply_upgrade(plan, layout, gate=gate, timeout=timeout, poll_interval=poll_interval,
                                           on_event=on_event, allow_parser_removal=allow_parser_removal)
    if as_json:
        echo_json(result.to_dict())
    else:
        for line in upgrade_lib.restart_lib.result_lines(result.restart):  # as `restart` prints it
            click.echo(line)
        if result.rolled_back:
            click.echo(f"rolled back: the unit runs {plan.old.python} (SGLang {plan.old.version}) again")
    ctx.exit(result.exit_code)


COMMANDS = [upgrade_cmd]
