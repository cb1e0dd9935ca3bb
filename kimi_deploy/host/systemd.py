"""What systemd says when an action fails, and the journal's last line: the parts of driving systemd that are not a
read of a unit's state (those, and the one ``systemctl`` gateway the actions run through, are
:mod:`kimi_deploy.facts.units`).

Every call goes through :func:`kimi_deploy.proc.run` (``-v`` prints the exact command). ``journalctl -o cat`` prints
the bare message of each entry.
"""

from __future__ import annotations

from kimi_deploy import proc
from kimi_deploy.errors import KimiDeployError


def failed_job(stderr: str, unit: str) -> str | None:
    """The line in which systemctl says ``unit``'s job failed (its start ran and failed: an ``ExecStartPre=`` or
    ``ExecStart=`` exit, a cgroup it could not attach to, a start timeout), else None (systemctl itself failed:
    no such unit, no systemd, no permission).

    Source: systemd 252's ``src/shared/bus-wait-for-jobs.c`` (``log_job_error_with_service_result``) prints
    ``Job for UNIT failed because REASON.`` or ``Job for UNIT failed.``, then ``See "systemctl status UNIT" ...``.
    """
    for line in stderr.splitlines():
        if line.startswith(f"Job for {unit} failed"):
            return line.strip()
    return None


def journal_last_line(unit: str) -> str | None:
    """The last journal message of ``unit`` (``journalctl -u UNIT -n 1 -o cat --no-pager``), or None.

    ``-u`` takes a required argument (journalctl's getopt table), so ``UNIT`` is read as the unit even when
    it starts with ``-``; after ``--`` journalctl would read match expressions, not units.

    Never raises: a missing journalctl or an unreadable journal gives ``None``.
    """
    try:
        done = proc.run(["journalctl", "-u", unit, "-n", "1", "-o", "cat", "--no-pager"],
                        check=False, timeout=10.0)
    except KimiDeployError:  # progress display only: never fail a wait on it
        return None
    if not done.ok:
        return None
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    return lines[-1].strip() if lines else None
