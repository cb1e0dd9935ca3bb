"""Boot a real systemd in a throwaway systemd-nspawn container and run commands inside it.

The container is the host's own OS (``systemd-nspawn -D / --volatile=yes``: a tmpfs root with the
host's ``/usr`` read-only), booted with ``-b`` so PID 1 is the host's systemd (252 on Debian 12).
``/etc`` is a per-boot copy of the host's (writable: ``useradd`` and ``kimi-deploy install`` write
there) with the host's own enabled units dropped, so only what the test installs starts. Nothing is
downloaded and nothing on the host changes: ``--private-network`` (loopback only), ``--register=no
--keep-unit`` (no host D-Bus needed), and the tmpfs systemd-nspawn wants under
``/run/systemd/nspawn`` is mounted in a private mount namespace (``unshare -m``), because the host's
``/run`` is not a tmpfs on every CI machine and systemd-nspawn refuses to clean up a disk folder.

Commands run inside through ``nsenter`` into every namespace of the container's PID 1, with a clean
operator environment (``env -i``); each has a timeout, the whole boot a watchdog
(:meth:`Container.arm_watchdog`), and :meth:`Container.shutdown` kills a container that does not power
off in time.

Needs root, ``systemd-nspawn`` (Debian: ``systemd-container``), ``unshare`` and ``nsenter``
(util-linux); :func:`unavailable` says which is missing.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

#: PATH and locale of a root shell on Debian 12 (what an operator's `sudo -i` gives).
OPERATOR_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
    "SYSTEMD_PAGER": "",
    "SYSTEMD_COLORS": "0",
}


class CannotBoot(RuntimeError):
    """systemd-nspawn gave up before the container's systemd ran (e.g. no privilege to mount here)."""


class WatchdogExpired(AssertionError):
    """The container's watchdog (:meth:`Container.arm_watchdog`) killed it; a test failure, not an error."""


def unavailable() -> str | None:
    """Why no container can boot on this machine, or None when one can."""
    if os.geteuid() != 0:
        return "booting a container needs root (systemd-nspawn); CI runs the suite as root"
    uid_map = Path("/proc/self/uid_map").read_text().split()
    if uid_map[:3] != ["0", "0", "4294967295"]:
        return (f"root here is root of a user namespace (uid_map {' '.join(uid_map[:3])}), e.g. a rootless "
                "container; systemd-nspawn needs the machine's own root")
    for tool, package in (("systemd-nspawn", "systemd-container"), ("unshare", "util-linux"),
                          ("nsenter", "util-linux")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install {package}; .ci/run installs it)"
    if not Path("/usr/lib/systemd/systemd").exists():
        return "the host has no systemd in /usr/lib/systemd/systemd to boot"
    return None


#: One container at a time on this machine, held from boot to power-off (:meth:`Container.boot`). systemd-nspawn
#: runs with ``--keep-unit``, in its caller's cgroup, so two containers started by one test session (two
#: pytest-xdist workers) share it, and on a cgroup-v1 host their systemds' unit cgroups can collide: a start
#: failed with ``219/CGROUP`` while two containers ran at once.
LOCK_PATH = Path(tempfile.gettempdir()) / "kimi-deploy-test-containers.lock"


#: This process's hold on :data:`LOCK_PATH`: the fd and how many of its containers run.
_PROCESS_LOCK: dict = {"guard": threading.Lock(), "fd": None, "holders": 0}

#: The cgroup-v1 hierarchy systemd names ``name=systemd`` (where a container's systemd puts its units' cgroups).
V1_SYSTEMD_CGROUP = Path("/sys/fs/cgroup/systemd")


@dataclass
class Container:
    """One container boot. Add mounts with :meth:`bind`/:meth:`overlay`, then :meth:`boot`.

    ``workdir``: a fresh host folder for this boot (the ``/etc`` copy, overlay upper folders and
    the console log ``console.log``). ``own_cgroup``: on a cgroup-v1 host, run it in a cgroup of its own
    (``/sys/fs/cgroup/systemd/kimi-test/<name>``), so that two containers booted at once by one process
    (tests/test_container_ansible.py) do not create the same unit cgroups (``<name>.service`` in both).
    """

    workdir: Path
    name: str = "kimi-test"
    own_cgroup: bool = False
    mounts: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    init_pid: int | None = None
    boot_seconds: float | None = None
    #: Seconds of the watchdog that killed this container (:meth:`arm_watchdog`), None while it has not.
    expired_after: float | None = None
    _watchdog: threading.Timer | None = None
    _lock_fd: int | None = None

    def _take_lock(self) -> None:
        """Wait for :data:`LOCK_PATH` (released by :meth:`_drop_lock`, or by the kernel when this process dies).
        Containers of one process share it (:data:`_PROCESS_LOCK`): a test that boots two hosts at once
        (``own_cgroup``) holds it once for both."""
        with _PROCESS_LOCK["guard"]:
            if _PROCESS_LOCK["fd"] is None:
                fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o600)
                fcntl.flock(fd, fcntl.LOCK_EX)
                _PROCESS_LOCK["fd"] = fd
            _PROCESS_LOCK["holders"] += 1
            self._lock_fd = _PROCESS_LOCK["fd"]

    def _drop_lock(self) -> None:
        with _PROCESS_LOCK["guard"]:
            if self._lock_fd is None:
                return
            self._lock_fd = None
            _PROCESS_LOCK["holders"] -= 1
            if _PROCESS_LOCK["holders"] == 0:
                os.close(_PROCESS_LOCK["fd"])
                _PROCESS_LOCK["fd"] = None

    def bind(self, src: Path | str, dst: str, *, ro: bool = True) -> None:
        """Bind host ``src`` at ``dst`` inside (read-only unless ``ro`` is false)."""
        self.mounts.append(f"--bind{'-ro' if ro else ''}={src}:{dst}")

    def overlay(self, lower: Path | str, dst: str) -> Path:
        """A writable ``dst`` inside over read-only host ``lower``; writes land in the returned host folder."""
        upper = self.workdir / f"overlay-{len(self.mounts)}"
        upper.mkdir(parents=True)
        self.mounts.append(f"--overlay={lower}:{upper}:{dst}")
        return upper

    def _prepare_etc(self) -> Path:
        """The per-boot copy of the host's ``/etc``; raises CannotBoot when root cannot copy it whole
        (ownership it may not set, files it may not read: no full root here)."""
        etc = self.workdir / "etc"
        r = subprocess.run(["cp", "-a", "/etc", str(etc)], capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise CannotBoot("`cp -a /etc` for the container's /etc failed (no full root here?):\n"
                             + "\n".join(r.stderr.splitlines()[:10]))
        # the host's enabled units (databases, timers, getty ...) are not part of the test
        for wants in (etc / "systemd" / "system").glob("*.wants"):
            shutil.rmtree(wants)
        (etc / "machine-id").write_text(uuid.uuid4().hex + "\n")  # the host's id would clash
        return etc

    def boot(self, timeout: float = 120.0) -> float:
        """Start the container and wait until systemd finished booting; returns the seconds it took.

        Raises CannotBoot when /etc cannot be copied or systemd-nspawn exits before the container's
        systemd ran, RuntimeError (with the console log's tail) when systemd does not finish booting
        within ``timeout``.
        """
        # /etc first, outside the lock: a machine that cannot copy it (root of a user namespace) says so at
        # once instead of after waiting out another worker's container
        etc = self._prepare_etc()
        self._take_lock()
        args = ["systemd-nspawn", "--quiet", "--directory=/", "--volatile=yes", "--register=no",
                "--keep-unit", "--link-journal=no", "--private-network", f"--machine={self.name}",
                "--console=read-only", f"--bind={etc}:/etc", *self.mounts,
                "--boot", "systemd.firstboot=off"]
        script = ("mkdir -p /run/systemd/nspawn && mount -t tmpfs -o mode=0755 tmpfs /run/systemd/nspawn"
                  ' && exec "$@"')
        if self.own_cgroup and (V1_SYSTEMD_CGROUP / "cgroup.procs").exists():
            cgroup = V1_SYSTEMD_CGROUP / "kimi-test" / self.name
            script = f"mkdir -p {cgroup} && echo $$ > {cgroup}/cgroup.procs && {script}"
        self.console = (self.workdir / "console.log").open("wb")
        start = time.monotonic()
        self.proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                                      "sh", *args], stdin=subprocess.DEVNULL, stdout=self.console,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=_terminate_with_parent)
        try:
            return self._wait_booted(start, start + timeout)
        except BaseException:  # a command's timeout, ^C ...: never leave a container behind
            self.kill()
            raise

    def _wait_booted(self, start: float, deadline: float) -> float:
        timeout = deadline - start
        while self.init_pid is None:
            if self.proc.poll() is not None:
                raise CannotBoot(f"systemd-nspawn exited with {self.proc.returncode} before the container's "
                                 f"systemd ran:\n{self.console_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no container init within {timeout} s:\n{self.console_tail()}")
            self.init_pid = _container_init(self.proc.pid)
            if self.init_pid is None:
                time.sleep(0.1)
        state = "offline"
        while state in ("offline", "unknown", ""):  # before PID 1 listens on its private socket
            left = deadline - time.monotonic()
            if left <= 0:
                break
            r = self.run("systemctl is-system-running --wait", timeout=left, check=False)
            state = r.stdout.strip()
            if state in ("offline", "unknown", ""):
                time.sleep(0.2)
        if state not in ("running", "degraded"):
            failed = self.run("systemctl --failed --no-legend", timeout=30, check=False).stdout
            raise RuntimeError(f"the container did not boot (state {state!r}; failed units: {failed})\n"
                               f"{self.console_tail()}")
        self.boot_seconds = time.monotonic() - start
        return self.boot_seconds

    def arm_watchdog(self, seconds: float) -> None:
        """Kill the container (:meth:`kill`) when it still runs ``seconds`` from now; :meth:`shutdown`
        disarms it. A command running then ends (its processes die with the container's PID namespace)
        and it and every later :meth:`run` fail with :class:`WatchdogExpired`, so a hung scenario group
        ends its tests instead of hanging the test run."""
        def expire() -> None:
            self.expired_after = seconds
            self.kill()

        self._watchdog = threading.Timer(seconds, expire)
        self._watchdog.daemon = True
        self._watchdog.start()

    def run(self, command: str, *, timeout: float = 120.0, check: bool = True,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run ``command`` (a shell line) inside as root in an operator's environment.

        Returns the CompletedProcess (text stdout/stderr). ``check``: raise AssertionError naming the
        command, its exit status and output when it fails. ``timeout``: seconds, then
        subprocess.TimeoutExpired. Raises :class:`WatchdogExpired` (check or not) once the watchdog
        killed the container, also for a command it cut short.
        """
        assert self.init_pid is not None, "boot() first"
        self._raise_if_expired(command)
        environment = {**OPERATOR_ENV, **(env or {})}
        argv = ["nsenter", f"--target={self.init_pid}", "--all", "--root", "--wd", "env", "-i",
                *(f"{k}={v}" for k, v in environment.items()), "sh", "-c", command]
        # output is decoded leniently: a binary journal field (`journalctl -o export`) is no harness error
        r = subprocess.run(argv, capture_output=True, encoding="utf-8", errors="replace", timeout=timeout,
                           stdin=subprocess.DEVNULL)
        self._raise_if_expired(command)
        if check and r.returncode != 0:
            raise AssertionError(f"`{command}` exited {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")
        return r

    def _raise_if_expired(self, command: str) -> None:
        if self.expired_after is not None:
            raise WatchdogExpired(f"`{command}`: the container's watchdog killed it after {self.expired_after:.0f} s "
                                  "(a hung start or command; the console log is in "
                                  f"{self.workdir / 'console.log'})")

    def shutdown(self, timeout: float = 60.0) -> None:
        """Power the container off (``systemctl poweroff``); kill it when it is not down within ``timeout`` s.
        Disarms the watchdog."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        try:
            if self.proc is not None and self.proc.poll() is None:
                if self.init_pid is not None:
                    self.run("systemctl poweroff --no-block", timeout=10, check=False)
                self.proc.wait(timeout=timeout)
        except (subprocess.TimeoutExpired, WatchdogExpired):
            self.kill()
        finally:
            if self.proc is not None:
                self.console.close()
            self._remove_cgroup()
            self._drop_lock()

    def _remove_cgroup(self) -> None:
        """Remove the ``own_cgroup`` tree once the container is gone (best effort, deepest first)."""
        top = V1_SYSTEMD_CGROUP / "kimi-test" / self.name
        if not self.own_cgroup or not top.is_dir():
            return
        # deepest first, then the shared parent (still busy while another container of the process runs)
        for folder in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [top, top.parent]:
            with contextlib.suppress(OSError):
                folder.rmdir()

    def kill(self) -> None:
        """Stop the container now: SIGKILL to its PID 1 (the kernel then kills every process of its PID
        namespace; killing systemd-nspawn alone would orphan them), then to systemd-nspawn's process group."""
        if self.init_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.init_pid, signal.SIGKILL)
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self._drop_lock()

    def console_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the container's console (boot messages, nspawn's errors)."""
        self.console.flush()
        text = (self.workdir / "console.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])


def _terminate_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process dies (PR_SET_PDEATHSIG, kept across the
    execs of ``unshare``, ``sh`` and ``systemd-nspawn``, which all run in this one process). On SIGTERM
    systemd-nspawn sends the booted container's PID 1 SIGRTMIN+3, an orderly power-off, so a test run
    killed outright (a CI timeout, SIGKILL) leaves no container behind either."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)


def _container_init(nspawn_pid: int) -> int | None:
    """The host PID of the container's PID 1: the descendant of ``nspawn_pid`` whose innermost PID is 1."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    todo = list(children.get(nspawn_pid, []))
    while todo:
        pid = todo.pop()
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:") and len(line.split()) > 2 and line.split()[-1] == "1":
                return pid
        todo.extend(children.get(pid, []))
    return None


def quote(*words: str) -> str:
    """``words`` as one shell-quoted command line (for :meth:`Container.run`)."""
    return shlex.join(words)
