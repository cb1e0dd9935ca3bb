"""systemd's state of a unit (:mod:`kimi_deploy.facts.units`): the reads ``install``, ``status`` and ``restart
--wait`` share, each a command plus a pure parser.

The recorded answers are systemd 252's (Debian 12), taken with ``systemctl --root TREE is-enabled -- UNIT`` on a
tree holding an enabled unit, a unit without an ``[Install]`` section (``static``), one not enabled and none;
the real ``systemctl --root`` (no running manager needed) is then asked the same on a throwaway tree.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kimi_deploy.facts import units

#: ``(exit status, stdout)`` of ``systemctl --root TREE is-enabled -- UNIT`` (systemd 252) -> what install reads.
RECORDED_IS_ENABLED = [
    ((0, "enabled\n"), True),
    ((0, "static\n"), False),  # exit 0, but `enable` does not make it so: nothing for install to undo
    ((1, "disabled\n"), False),
    ((1, ""), False),  # no such unit: "Failed to get unit file state for X: No such file or directory" on stderr
    ((0, "enabled-runtime\n"), False),
]

#: ``systemctl show --property=... -- kimi-k25.service`` of a unit restarting after a failed start (systemd 252).
RECORDED_SHOW = """Id=kimi-k25.service
LoadState=loaded
ActiveState=activating
SubState=auto-restart
UnitFileState=enabled
MainPID=0
NRestarts=3
ExecMainStartTimestamp=[not set]
ExecMainStatus=1
Result=exit-code
FragmentPath=/etc/systemd/system/kimi-k25.service
ControlGroup=
"""


@pytest.mark.parametrize("answer,enabled", RECORDED_IS_ENABLED, ids=[a[1].strip() or "missing" for a, _ in
                                                                    RECORDED_IS_ENABLED])
def test_is_enabled_reads_the_unit_file_state_not_the_exit_status(answer, enabled):
    assert units.parse_is_enabled(*answer) is enabled


def test_show_parses_a_restarting_unit():
    state = units.parse_show(RECORDED_SHOW)
    assert (state.unit, state.active_state, state.sub_state, state.unit_file_state) == \
        ("kimi-k25.service", "activating", "auto-restart", "enabled")
    assert state.main_pid is None and state.started_at is None and state.n_restarts == 3 and not state.is_active
    assert state.result == "exit-code" and "properties" not in state.to_dict()


@pytest.mark.skipif(shutil.which("systemctl") is None, reason="no systemctl on this machine")
def test_is_enabled_asks_the_real_systemctl_in_a_root_tree(tmp_path):
    system = tmp_path / "etc" / "systemd" / "system"
    system.mkdir(parents=True)
    service = "[Unit]\nDescription=x\n[Service]\nExecStart=/bin/true\n"
    for name, text in (("on.service", service + "[Install]\nWantedBy=multi-user.target\n"),
                       ("off.service", service + "[Install]\nWantedBy=multi-user.target\n"),
                       ("static.service", service), ("-dash.service", service + "[Install]\nWantedBy=x.target\n")):
        (system / name).write_text(text)
    subprocess.run(["systemctl", "--root", str(tmp_path), "enable", "--", "on.service", "-dash.service"],
                   check=True, capture_output=True)
    found = {name: units.is_enabled(name, root=tmp_path)
             for name in ("on.service", "off.service", "static.service", "-dash.service", "absent.service")}
    assert found == {"on.service": True, "off.service": False, "static.service": False, "-dash.service": True,
                     "absent.service": False}
    assert units.systemctl_argv("is-enabled", "-dash.service", root=Path("/t")) == \
        ["systemctl", "--root", "/t", "is-enabled", "--", "-dash.service"]
