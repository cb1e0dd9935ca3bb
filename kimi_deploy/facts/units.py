"""systemd's state of this host's units, as ``systemctl`` reports it: the one gateway to ``systemctl``
(:func:`systemctl_argv`, :func:`systemctl`; the actions of :mod:`kimi_deploy.host.systemd` run through it too) and
the reads every verb shares: a unit's state on the running manager (:func:`show`: ``status``, ``restart --wait``,
the readiness wait), whether a unit file is enabled (:func:`is_enabled`, also in a ``--root`` tree) and whether a
unit is active (:func:`is_active`: ``install``'s timer).

Each read is a command plus a pure parser tested on recorded output (:func:`parse_show`: ``systemctl show``
prints ``Property=value`` lines, systemd(1) ``systemctl show``; :func:`parse_is_enabled`: ``systemctl
is-enabled`` prints the unit file's state and exits 0 only for an enabled one, systemctl(1) ``is-enabled``); the
tests build :class:`UnitState` directly as the recorded form of a unit's state. With a root other than ``/`` the
unit-file verbs (``enable``, ``disable``, ``is-enabled``) run as ``systemctl --root DIR ...``, which reads and edits
the symlinks under DIR without a running systemd (systemd 252 and later); ``show`` and ``is-active`` need the
running manager.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kimi_deploy import proc

#: Properties ``status`` and ``restart --wait`` read (names from systemd.exec(5)/systemd.service(5)).
SHOW_PROPERTIES = (
    "Id", "LoadState", "ActiveState", "SubState", "UnitFileState", "MainPID", "NRestarts",
    "ExecMainStartTimestamp", "ExecMainStatus", "Result", "FragmentPath", "ControlGroup",
)

#: Fix for a failed ``systemctl`` on the running manager. ``restart`` and ``status`` reach it with or without
#: ``--root`` (the tree holds the files, the running systemd runs them), so the fix names which verbs take a tree.
HINT = ("is systemd running on this host? `systemctl status` shows it; for an image tree, install and uninstall "
        "take --root DIR (restart and status always act on the running systemd)")
#: Fix for a failed ``systemctl --root DIR``: the tree, not a running systemd, is the suspect.
ROOT_HINT = ("systemctl --root DIR only edits unit files in that tree: is DIR an OS tree (with etc/systemd/system) "
             "and readable? `systemctl --root DIR list-unit-files` shows what it sees")


#: Suffixes of systemd unit names (systemd.unit(5)): an argument ending in one is a unit name.
UNIT_SUFFIXES = (".service", ".timer", ".socket", ".target", ".path", ".mount", ".automount", ".swap",
                 ".slice", ".scope", ".device")


def systemctl_argv(verb: str, *args: str, root: Path | None = None) -> list[str]:
    """``systemctl [--root DIR] VERB OPTIONS... -- UNITS...`` as argv (``root`` only for unit-file verbs).

    ``args`` are options and unit names in any order; unit names (arguments ending in one of
    :data:`UNIT_SUFFIXES`) go after ``--``, so a name starting with ``-`` can never be read as an option.
    """
    units = [a for a in args if a.endswith(UNIT_SUFFIXES)]
    options = [a for a in args if not a.endswith(UNIT_SUFFIXES)]
    return ["systemctl", *(["--root", str(root)] if root is not None else []), verb, *options,
            *(["--", *units] if units else [])]


def systemctl(verb: str, *args: str, root: Path | None = None, check: bool = True,
              timeout: float = 120.0) -> proc.Completed:
    """Run ``systemctl VERB ARGS`` (:func:`systemctl_argv`) through the subprocess gateway.

    Raises:
        ExternalCommandError: systemctl is missing or fails (with ``check``).
    """
    return proc.run(systemctl_argv(verb, *args, root=root), check=check, timeout=timeout,
                    hint=HINT if root is None else ROOT_HINT)


@dataclasses.dataclass(frozen=True)
class UnitState:
    """What ``systemctl show`` says about one unit.

    ``main_pid`` is ``None`` when the unit has no running main process (systemd prints 0);
    ``n_restarts`` counts automatic restarts (``Restart=``) since the last manual start.
    ``properties`` keeps every property printed, verbatim.
    """

    unit: str
    load_state: str
    active_state: str
    sub_state: str
    unit_file_state: str
    main_pid: int | None
    n_restarts: int | None
    started_at: str | None
    result: str | None
    properties: dict[str, str]

    @property
    def is_active(self) -> bool:
        return self.active_state == "active"

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (``properties`` left out: it is the raw input)."""
        data = dataclasses.asdict(self)
        data.pop("properties")
        return data


def parse_show(text: str, unit: str = "") -> UnitState:
    """Parse ``systemctl show UNIT --property=...`` output (``Key=value`` lines) into :class:`UnitState`.

    Unknown or missing properties are tolerated (``""`` / ``None``); ``MainPID=0`` means no process;
    ``[not set]`` (systemd's placeholder for unset timestamps/ints) reads as ``None``.
    """
    props: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key and not key.startswith(" "):
            props[key.strip()] = value.strip()

    def opt_int(name: str) -> int | None:
        raw = props.get(name, "")
        try:
            return int(raw)
        except ValueError:
            return None

    pid = opt_int("MainPID")
    started = props.get("ExecMainStartTimestamp") or None
    if started in ("n/a", "[not set]"):
        started = None
    return UnitState(
        unit=props.get("Id") or unit,
        load_state=props.get("LoadState", ""),
        active_state=props.get("ActiveState", ""),
        sub_state=props.get("SubState", ""),
        unit_file_state=props.get("UnitFileState", ""),
        main_pid=pid or None,
        n_restarts=opt_int("NRestarts"),
        started_at=started,
        result=props.get("Result") or None,
        properties=props,
    )


def show(unit: str, properties: Sequence[str] = SHOW_PROPERTIES) -> UnitState:
    """``systemctl show --property=... -- UNIT`` on the running manager, parsed.

    Raises:
        ExternalCommandError: systemctl failed (no running systemd, no bus).
    """
    done = systemctl("show", unit, f"--property={','.join(properties)}", timeout=30.0)
    return parse_show(done.stdout, unit)


def parse_is_enabled(returncode: int, stdout: str) -> bool:
    """Whether ``systemctl is-enabled UNIT``'s answer says ``enabled``: exit 0 and that word on its first line
    (exit 0 also comes with ``static``, ``alias``, ``indirect`` or ``generated``, which ``enable`` does not
    make; systemctl(1), ``is-enabled``)."""
    return returncode == 0 and stdout.strip().splitlines()[:1] == ["enabled"]


def is_enabled(unit: str, root: Path | None = None) -> bool:
    """``systemctl [--root DIR] is-enabled UNIT`` says ``enabled`` (:func:`parse_is_enabled`).

    Raises:
        ExternalCommandError: systemctl is missing.
    """
    done = systemctl("is-enabled", unit, root=root, check=False, timeout=30.0)
    return parse_is_enabled(done.returncode, done.stdout)


def is_active(unit: str) -> bool:
    """``systemctl is-active UNIT`` exits 0 (the unit is active on the running manager)."""
    return systemctl("is-active", unit, check=False, timeout=30.0).ok
