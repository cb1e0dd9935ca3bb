"""A GPU host's layout inside a test container, as docs/runbook.md#put-kimi-deploy-on-the-host sets one up.

Inside the container (tests/systemd_container.py), outside /home and /root as ``ProtectHome=yes``
requires:

| path | what |
|---|---|
| ``/opt/kimi-deploy/bin/kimi-deploy`` | the kit (this checkout, read-only at ``/opt/kimi-deploy/src``) in its own venv ``/opt/kimi-deploy/venv`` |
| ``/opt/sglang/.venv/bin/python`` | the SGLang 0.5.23 test environment (``KIMI_DEPLOY_SGLANG_PYTHON``): its site-packages under a throwaway overlay, so ``kimi-deploy patch apply`` can write while the shared environment stays read-only |
| ``/opt/<name>/.venv/bin/python`` | with ``sglang_envs=``: further SGLang environments built on the host (tests/patch_helpers.py ``release_target``/``make_target``, e.g. 0.5.22 beside 0.5.23 for ``kimi-deploy upgrade``): their site-packages bound writable, so the kit's patches land there and a test can hash the files on the host |
| ``/opt/smg/.venv/bin/smg`` | with ``smg=``: the pinned gateway (smg 1.13.0, ``KIMI_DEPLOY_SMG``), docs/runbook.md#replicas-behind-a-gateway's path: its site-packages bound read-only |
| ``/models/Kimi-K2.5`` | a model folder with the scripted Kimi tokenizer (tests/replay/kimi_tokenizer.py), read-only |
| ``/out`` | a writable host folder to bring files out |

Both venvs are rebuilt around the container's own ``/usr/bin/python3.X`` (same X as the host
venvs): the host venvs may point at an interpreter under /root (pyenv), which ``ProtectHome=yes``
hides from the units, and an operator builds them from the system Python anyway. Their
site-packages are the host venvs' own, bound in (CPython keeps the ABI within 3.X).

``python -m sglang.launch_server`` runs the stand-in (tests/standin/) because the test profiles put
``/opt/kimi-deploy/src/tests/standin`` on ``PYTHONPATH`` in ``[environment]``.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from typing import NoReturn
from pathlib import Path

import pytest

from systemd_container import OPERATOR_ENV, CannotBoot, Container, unavailable

REPO = Path(__file__).resolve().parent.parent
KIT = "/opt/kimi-deploy/bin/kimi-deploy"
SGLANG_PYTHON = "/opt/sglang/.venv/bin/python"
MODEL = "/models/Kimi-K2.5"
STANDIN = "/opt/kimi-deploy/src/tests/standin"
SMG = "/opt/smg/.venv/bin/smg"


def _site_packages(python: str) -> tuple[str, Path]:
    """``(X.Y, purelib)`` of ``python``'s environment."""
    out = subprocess.run([python, "-c", "import sys, sysconfig; print(f'{sys.version_info[0]}.{sys.version_info[1]}');"
                          "print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True, check=True,
                         timeout=120)
    version, purelib = out.stdout.split()
    return version, Path(purelib)


def system_python_missing(sglang_python: str, *more: str) -> str | None:
    """Why the container cannot rebuild the venvs (no ``/usr/bin/python3.X`` of the venvs' X), else None.

    ``more``: further interpreters to rebuild (smg's)."""
    for python in (sys.executable, sglang_python, *more):
        version, _ = _site_packages(python)
        if not Path(f"/usr/bin/python{version}").exists():
            return f"{python} is Python {version}; the container needs /usr/bin/python{version} to rebuild its venv"
    return None


def _venv_skeleton(folder: Path, version: str) -> None:
    """A venv at ``folder`` on ``/usr/bin/pythonX.Y`` with an empty site-packages (a mount point)."""
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "python").symlink_to(f"/usr/bin/python{version}")
    (folder / "lib" / f"python{version}" / "site-packages").mkdir(parents=True)
    (folder / "pyvenv.cfg").write_text(f"home = /usr/bin\ninclude-system-site-packages = false\nversion = {version}\n")


def smg_python(smg: str) -> str:
    """The interpreter of the venv that holds the ``smg`` script (``bin/python`` beside it)."""
    return str(Path(smg).parent / "python")


def lay_out(box: Container, host: Path, sglang_python: str, model_dir: Path, smg: str | None = None,
            sglang_envs: Mapping[str, Path] | None = None) -> Path:
    """Add the mounts of the table above to ``box``; ``host`` is a fresh folder for the read-only parts.

    ``sglang_envs``: venv folder inside (``/opt/sglang-0.5.22/.venv``) -> the host site-packages of a throwaway
    SGLang environment on the same Python X.Y; its ``zz-kimi-deploy-shared-env.pth`` (the dependencies) is
    rewritten to the container's ``/opt/sglang/.venv`` site-packages, the only copy of them visible inside.

    ``smg``: the host's pinned smg script; its venv is rebuilt at ``/opt/smg/.venv`` (its script's
    first line rewritten to that venv's python, as pip writes it there). Returns the host folder bound at ``/out``.
    """
    kit_version, kit_site = _site_packages(sys.executable)
    sg_version, sg_site = _site_packages(sglang_python)
    opt = host / "opt"
    _venv_skeleton(opt / "kimi-deploy" / "venv", kit_version)
    _venv_skeleton(opt / "sglang" / ".venv", sg_version)
    (opt / "kimi-deploy" / "src").mkdir()
    wrapper = opt / "kimi-deploy" / "bin" / "kimi-deploy"
    wrapper.parent.mkdir()
    # the checkout is installed editable on the host; inside, the same source comes from PYTHONPATH
    wrapper.write_text("#!/bin/sh\nPYTHONPATH=/opt/kimi-deploy/src exec /opt/kimi-deploy/venv/bin/python -m kimi_deploy \"$@\"\n")
    wrapper.chmod(0o755)
    out = host / "out"
    out.mkdir()
    box.bind(opt, "/opt")
    box.bind(REPO, "/opt/kimi-deploy/src")
    box.bind(kit_site, f"/opt/kimi-deploy/venv/lib/python{kit_version}/site-packages")
    box.overlay(sg_site, f"/opt/sglang/.venv/lib/python{sg_version}/site-packages")
    if smg is not None:
        smg_version, smg_site = _site_packages(smg_python(smg))
        venv = opt / "smg" / ".venv"
        _venv_skeleton(venv, smg_version)
        body = Path(smg).read_text().split("\n", 1)[1]
        (venv / "bin" / "smg").write_text(f"#!{Path(SMG).parent}/python\n{body}")
        (venv / "bin" / "smg").chmod(0o755)
        box.bind(smg_site, f"{Path(SMG).parent.parent}/lib/python{smg_version}/site-packages")
    for venv, site in (sglang_envs or {}).items():
        assert venv.startswith("/opt/") and not venv.startswith(("/opt/sglang/", "/opt/kimi-deploy/")), venv
        _venv_skeleton(opt / venv.removeprefix("/opt/"), sg_version)
        (site / "zz-kimi-deploy-shared-env.pth").write_text(f"/opt/sglang/.venv/lib/python{sg_version}/site-packages\n")
        box.bind(site, f"{venv}/lib/python{sg_version}/site-packages", ro=False)
    box.bind(model_dir, MODEL)
    box.bind(out, "/out", ro=False)
    return out


def profile(*, name: str = "kimi-k25", port: int = 30000, hardening: str = "standard",
            model_path: str = MODEL, extra: str = "", host: str = "127.0.0.1", api_key_file: str | None = None) -> str:
    """A profile for the container host: the stand-in on PYTHONPATH, the API key file in /etc/kimi-deploy
    (``/etc/kimi-deploy/<name>.api-key`` unless ``api_key_file``); SGLang listens on ``host``.

    Speculative settings and parsers as on the reference host (the stand-in reports them through
    ``/server_info``); ``timeout_start_sec`` 300 (the stand-in starts in well under a minute here).
    """
    return f"""\
[service]
name = "{name}"
python = "{SGLANG_PYTHON}"
kimi_deploy = "{KIT}"
gpu_count = 8
hardening = "{hardening}"
timeout_start_sec = 300
restart_sec = 5
{extra}
[sglang]
model_path = "{model_path}"
served_model_name = "moonshotai/Kimi-K2.5"
host = "{host}"
port = {port}
tp_size = 8
tool_call_parser = "kimi_k2"
reasoning_parser = "kimi_k2"
api_key_file = "{api_key_file or f'/etc/kimi-deploy/{name}.api-key'}"

[environment]
PYTHONPATH = "{STANDIN}"
"""


#: The operator's PATH inside: the kit's bin folder first (docs/runbook.md#put-kimi-deploy-on-the-host links it into /usr/local/bin,
#: which is the host's read-only /usr here).
PATH = f"/opt/kimi-deploy/bin:{OPERATOR_ENV['PATH']}"


class Host:
    """A booted container laid out as a GPU host; :meth:`sh` runs a command as its root operator."""

    def __init__(self, box: Container, out: Path):
        self.box = box
        self.out = out

    def sh(self, command: str, *, timeout: float = 300.0, check: bool = True) -> subprocess.CompletedProcess:
        """Run ``command`` inside (see :meth:`Container.run`) with ``kimi-deploy`` on PATH."""
        return self.box.run(command, timeout=timeout, check=check, env={"PATH": PATH})

    def write(self, path: str, text: str) -> None:
        """Write ``text`` to ``path`` inside, as the operator's editor would."""
        self.sh(f"mkdir -p $(dirname {path}) && cat > {path} <<'KIMI_EOF'\n{text}KIMI_EOF")

    def debug_report(self, lines: int = 150) -> str:
        """What to read when a scenario failed: ``systemctl --failed``, the status of the kit's units and the
        journal's last ``lines`` lines (each command bounded; a container already gone says so)."""
        parts = []
        for command in ("systemctl --failed --no-legend --no-pager",
                        "systemctl status --no-pager --lines=0 --all 'kimi*' 2>&1 | head -n 60",
                        f"journalctl --no-pager -o short-monotonic -n {lines}"):
            try:
                r = self.box.run(command, timeout=60, check=False)
                text = r.stdout + r.stderr
            except (AssertionError, subprocess.TimeoutExpired, OSError) as exc:
                text = f"(not available: {exc})"
            parts.append(f"$ {command}\n{text.rstrip()}")
        return "\n\n".join(parts)

    def save_journal(self, path: Path) -> None:
        """The boot's whole journal (every unit, monotonic time stamps) to host ``path``; best effort (a
        container the watchdog killed has none left)."""
        try:
            r = self.box.run("journalctl --no-pager -o short-monotonic", timeout=60, check=False)
        except (AssertionError, subprocess.TimeoutExpired, OSError):
            return
        path.write_text(r.stdout)

    def unit(self, unit: str, *props: str) -> dict[str, str]:
        """``systemctl show UNIT -p PROP...`` as a dict."""
        r = self.sh(f"systemctl show {unit} " + " ".join(f"-p {p}" for p in props))
        return dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)


def build_model(sglang_python: str, folder: Path) -> Path:
    """The scripted Kimi model folder (tests/replay/kimi_tokenizer.py) at ``folder``; returns it."""
    replay = Path(__file__).resolve().parent / "replay"
    code = f"import sys; sys.path.insert(0, {str(replay)!r}); import kimi_tokenizer, pathlib; kimi_tokenizer.build(pathlib.Path({str(folder)!r}))"
    r = subprocess.run([sglang_python, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, f"building the scripted model folder failed (exit {r.returncode}):\n{r.stderr[-3000:]}"
    return folder


#: Set to 1 where the tier must run (a release host, a CI known to boot containers): it fails instead of skipping.
REQUIRE_ENV = "KIMI_DEPLOY_REQUIRE_CONTAINERS"


def skip_or_fail(reason: str) -> NoReturn:
    """Skip the test with ``reason`` (listed by pytest's ``-ra`` summary, so a skipped tier is never silent);
    with ``$KIMI_DEPLOY_REQUIRE_CONTAINERS=1`` fail instead, so a host that must prove the units cannot
    pass by skipping. A generic ``CI`` variable does not decide it: whether a CI machine may boot a
    container (privileges, cgroups) is that machine's property, not the variable's."""
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"the container tier must run here (${REQUIRE_ENV}=1), but {reason}", pytrace=False)
    pytest.skip(reason)


#: Created inside right after the boot, before any test command: a file whose inode changed later
#: (``find -cnewer``) was written during the test.
BOOTED = "/run/kimi-test.booted"

#: Watchdog of one boot: a scenario group that has not finished by then is killed (seconds).
GROUP_WATCHDOG = 900.0


@contextlib.contextmanager
def booted_host(workdir: Path, sglang_python: str, *, timings: dict[str, float] | None = None,
                smg: str | None = None, sglang_envs: Mapping[str, Path] | None = None,
                watchdog: float = GROUP_WATCHDOG, own_cgroup: bool = False) -> Iterator[Host]:
    """Boot a container laid out by :func:`lay_out`, yield it as a :class:`Host`, power it off.

    Skips with the reason when no container can boot here (root, systemd-nspawn, the system Python
    missing, or systemd-nspawn giving up before the container's systemd runs, e.g. without the
    privilege to mount); fails instead with ``$KIMI_DEPLOY_REQUIRE_CONTAINERS=1`` (:func:`skip_or_fail`).
    ``timings`` gets ``boot`` (seconds until systemd reported the boot finished) and ``group`` (boot to
    power-off). ``smg``: also lay out the pinned gateway, ``sglang_envs`` further SGLang environments (:func:`lay_out`). A watchdog kills the
    container when the group is not done after ``watchdog`` s (default :data:`GROUP_WATCHDOG`; its tests then
    fail with :class:`~systemd_container.WatchdogExpired`). ``own_cgroup``: see :class:`~systemd_container.Container`.

    For debugging: a failure in the fixture's set-up (the code before its ``yield``) prints
    :meth:`Host.debug_report` (captured by pytest and shown with the error), a failed test gets it as a
    report section (tests/conftest.py), and the whole journal of the boot is saved to
    ``<workdir>/journal.txt`` at power-off.
    """
    reason = unavailable() or system_python_missing(sglang_python, *((smg_python(smg),) if smg else ()))
    if reason:
        skip_or_fail(reason)
    workdir.mkdir(parents=True, exist_ok=True)
    model = build_model(sglang_python, workdir / "model")
    box = Container(workdir / "box", name=f"kimi-test-{os.getpid()}-{workdir.name}"[:60], own_cgroup=own_cgroup)
    box.workdir.mkdir()
    out = lay_out(box, workdir / "host", sglang_python, model, smg, sglang_envs)
    start = time.monotonic()
    try:
        seconds = box.boot(timeout=120)
    except CannotBoot as exc:
        skip_or_fail(f"systemd-nspawn cannot boot a container here: {str(exc)[:2000]}")
    if timings is not None:
        timings["boot"] = seconds
    box.arm_watchdog(watchdog)
    box.run(f"touch {BOOTED}")
    host = Host(box, out)
    try:
        yield host
    except Exception:
        print(host.debug_report())
        raise
    finally:
        host.save_journal(workdir / "journal.txt")
        box.shutdown(timeout=60)
        if timings is not None:
            timings["group"] = time.monotonic() - start


def exposure(analyze_output: str) -> str:
    """The overall exposure (``"2.4"``) from ``systemd-analyze security UNIT`` output."""
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d)", analyze_output)
    assert m, analyze_output[-2000:]
    return m.group(1)


def documented_exposure(repo_root: Path, hardening: str | None) -> str:
    """The exposure the design record's table (docs/design.md#the-server-unit-line-by-line) states for the server unit at ``hardening``, or for the
    nightly check unit (``kimi-deploy-check@<name>.service``) when ``hardening`` is None."""
    text = (repo_root / "docs" / "design.md").read_text()
    row = (r"`kimi-deploy-check@<name>\.service`[^|]*" if hardening is None
           else rf'server, `hardening = "{re.escape(hardening)}"` ')
    m = re.search(rf"^\| {row}\| (\d+\.\d)\b", text, re.M)
    assert m, f"docs/design.md has no exposure row for {hardening or 'the check unit'}"
    return m.group(1)
