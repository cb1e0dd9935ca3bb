"""Every path kimi-deploy reads or writes, in one place.

Two kinds:
- resources shipped with the kit (unit templates in ``systemd/``, patch series in
  ``patches/``): inside an installed wheel they live under ``kimi_deploy/_data/``;
  in a source checkout (editable install) they are the top-level folders.
- the host layout (``/etc/systemd/system``, ``/etc/kimi-deploy``, ...), always
  relative to a root (``--root``, default ``/``) so that tests and image builds can
  point it at a directory.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
from pathlib import Path

from kimi_deploy.errors import UsageError
from kimi_deploy.names import env_file, gateway_service

_PACKAGE_DIR = Path(__file__).resolve().parent
_SOURCE_ROOT = _PACKAGE_DIR.parent


def _resource_dir(name: str) -> Path:
    installed = _PACKAGE_DIR / "_data" / name
    if installed.is_dir():
        return installed
    return _SOURCE_ROOT / name


def systemd_templates_dir() -> Path:
    """Folder of the Jinja2 unit templates (``systemd/`` in the source tree)."""
    return _resource_dir("systemd")


def patches_dir() -> Path:
    """Folder of the patch series, one sub-folder per SGLang version (``patches/``)."""
    return _resource_dir("patches")


def bench_prompts_file() -> Path:
    """The natural prompts ``kimi-deploy bench`` uses by default (JSONL of chat messages, in the wheel)."""
    return _PACKAGE_DIR / "bench" / "data" / "prompts.jsonl"


def check_report_schema() -> Path:
    """JSON Schema of the ``kimi-deploy check`` report (``kimi-deploy.check/1``)."""
    return _PACKAGE_DIR / "check" / "report.schema.json"


#: Environment variable that moves kimi-deploy's own state directory (tests, image builds).
STATE_DIR_ENV = "KIMI_DEPLOY_STATE_DIR"
#: Default state directory of kimi-deploy itself (patch records), outside any SGLang
#: installation so that a reinstall of SGLang cannot erase the record of what was patched.
DEFAULT_STATE_DIR = "/var/lib/kimi-deploy"


def state_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """kimi-deploy's state directory: ``override``, else ``$KIMI_DEPLOY_STATE_DIR``, else ``/var/lib/kimi-deploy``."""
    if override:
        return Path(override)
    return Path(os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


def patch_state_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """Where patch records live: ``<state_dir>/patches`` (one ``<key>.json`` + ``<key>.orig/`` per SGLang install)."""
    return state_dir(override) / "patches"


def kit_templates_dir() -> Path:
    """Folder of the kit's own text templates (the commented profile of ``init``)."""
    return _PACKAGE_DIR / "templates"


#: Host paths of the installed configuration, used inside rendered units.
ETC_DIR = "/etc/kimi-deploy"
SYSTEMD_DIR = "/etc/systemd/system"


def service_state_dir(service: str) -> str:
    """``/var/lib/<service>``: host path of a service's state folder (systemd ``StateDirectory=<service>``)."""
    return f"/var/lib/{service}"


def gateway_check_textfile(service: str) -> str:
    """``/var/lib/<service>-gateway/check.prom``: the Prometheus textfile of the gateway host's nightly
    ``check --each-worker`` (one series set per worker, label ``worker``), for node_exporter's textfile collector."""
    return f"{service_state_dir(gateway_service(service))}/check.prom"


def gateway_check_report(service: str) -> str:
    """``/var/lib/<service>-gateway/check-workers.json``: the gateway host's nightly ``check --each-worker`` report
    (its check unit's ``StateDirectory=<service>-gateway``)."""
    return f"{service_state_dir(gateway_service(service))}/check-workers.json"


def service_cache_dir(service: str) -> str:
    """``/var/cache/<service>``: host path of a service's default cache root (systemd ``CacheDirectory=<service>``)."""
    return f"/var/cache/{service}"


def service_env_file(service: str) -> str:
    """``/etc/kimi-deploy/<service>.env``: host path of the server unit's ``EnvironmentFile=``."""
    return f"{ETC_DIR}/{env_file(service)}"


def service_profile_copy(service: str) -> str:
    """``/etc/kimi-deploy/<service>.toml``: host path of the installed profile (the check unit reads it)."""
    return f"{ETC_DIR}/{service}.toml"


def service_api_key_file(service: str) -> str:
    """``/etc/kimi-deploy/<service>.api-key``: the API key file a profile for ``service`` starts from
    (``init --name``; the preset's)."""
    return f"{ETC_DIR}/{service}.api-key"


def service_runtime_dir(service: str) -> str:
    """``/run/<service>``: the server unit's ``RuntimeDirectory=<service>`` (0700; SGLang's secrets ``--config``)."""
    return f"/run/{service}"


def service_check_report(service: str) -> str:
    """``/var/lib/<service>/check-report.json``: host path of the nightly check's JSON report."""
    return f"{service_state_dir(service)}/check-report.json"


def is_within(host_path: str, folder: str) -> bool:
    """Whether ``host_path`` is ``folder`` or lies below it (lexically, both normalised host paths)."""
    host_path, folder = host_path.rstrip("/") or "/", folder.rstrip("/") or "/"
    return host_path == folder or host_path.startswith(folder.rstrip("/") + "/")


def check_host_path(host_path: str) -> str:
    """``host_path`` when it is an absolute, normalised host path (no ``..``, ``.``, ``//``, no NUL).

    Raises:
        UsageError: a relative path or one that could step out of ``--root`` (exit 2).
    """
    trimmed = host_path.rstrip("/") or "/"
    if (not host_path.startswith("/") or "\0" in host_path or "//" in host_path
            or posixpath.normpath(trimmed) != trimmed):
        raise UsageError("not a normalised absolute host path", value=host_path,
                         hint="write the path without '..', '.' or '//' (e.g. /etc/kimi-deploy/x.api-key)")
    return host_path


@dataclasses.dataclass(frozen=True)
class HostLayout:
    """Where the installed artefacts live on a host, relative to ``root``.

    All attributes are absolute paths on the machine kimi-deploy runs on
    (``root`` joined with the host path). :meth:`host_path` strips ``root`` again
    for text that is read on the target host (unit files name host paths).
    """

    root: Path = Path("/")

    def __post_init__(self) -> None:
        # resolved once, here: planners ask is_host and must not touch the file system
        object.__setattr__(self, "_is_host", Path(self.root).resolve() == Path("/"))

    def _under(self, host_path: str) -> Path:
        return self.root / host_path.lstrip("/")

    def under(self, host_path: str) -> Path:
        """The local path of ``host_path`` (an absolute path on the target host) under ``root``.

        The one gateway from a host path named by a profile or a manifest to a local path: it
        never leads out of ``root``. Lexically, the path must be normalised (:func:`check_host_path`:
        no ``..``); under a ``root`` other than ``/``, the folders on the way must not be symlinks
        that resolve outside the tree either (an image's absolute symlink points at the build
        host, not at the image).

        Raises:
            UsageError: the path is not normalised, or resolves outside ``root`` (exit 2).
        """
        local = self._under(check_host_path(host_path))
        if not self.is_host:
            real_root = os.path.realpath(self.root)
            real = os.path.realpath(local)
            if real != real_root and not real.startswith(real_root.rstrip("/") + "/"):
                raise UsageError("the path leads out of the --root tree (a symlink on the way points outside it)",
                                 value=f"{host_path} -> {real}",
                                 hint=f"replace the symlink inside {self.root} by a folder, or use a path that "
                                      "stays in the tree")
        return local

    def join(self, host_path: str) -> Path:
        """``root`` joined with ``host_path``, lexically (no file system access: the planners' form).

        ``host_path`` must be normalised (:func:`check_host_path`); the symlink check of
        :meth:`under` is the fact gatherers' (every path a plan names was read through it first).

        Raises:
            UsageError: the path is not normalised (exit 2).
        """
        return self._under(check_host_path(host_path))

    @property
    def systemd_dir(self) -> Path:
        """``/etc/systemd/system``: where the units go."""
        return self._under(SYSTEMD_DIR)

    @property
    def config_dir(self) -> Path:
        """``/etc/kimi-deploy``: env files, the installed profile, backups."""
        return self._under(ETC_DIR)

    @property
    def backup_dir(self) -> Path:
        """``/etc/kimi-deploy/backup``: the previous version of every replaced file."""
        return self.config_dir / "backup"

    def state_dir(self, service: str) -> Path:
        """``/var/lib/<service>`` (:func:`service_state_dir`): the service's state (check reports)."""
        return self._under(service_state_dir(service))

    def unit_path(self, unit: str) -> Path:
        """``/etc/systemd/system/<unit>`` (``unit`` with its suffix, e.g. ``kimi-k25.service``)."""
        return self.systemd_dir / unit

    def profile_copy(self, service: str) -> Path:
        """``/etc/kimi-deploy/<service>.toml`` (:func:`service_profile_copy`): the installed profile."""
        return self._under(service_profile_copy(service))

    def manifest(self, service: str) -> Path:
        """``/etc/kimi-deploy/<service>.manifest.json``: what ``install`` wrote, with sha256 of each file."""
        return self.config_dir / f"{service}.manifest.json"

    def intent(self, service: str) -> Path:
        """``/etc/kimi-deploy/<service>.intent.json``: what a running ``install`` is about to write
        (:class:`kimi_deploy.host.records.Intent`); left behind only by a run that was killed."""
        return self.config_dir / f"{service}.intent.json"

    def change_dir(self, service: str) -> Path:
        """``/etc/kimi-deploy/<service>.change/``: the journal of a ``restart --rollback-on-failure`` or ``upgrade``
        in flight (:mod:`kimi_deploy.host.journal`): its ``change.json`` and the old version's bytes; present only
        while the change runs, or after a run that was killed."""
        return self.config_dir / f"{service}.change"

    def tune_dir(self, service: str) -> Path:
        """``/var/lib/kimi-deploy/tune/<service>/``: ``tune``'s journal, the candidates' bench results, its report
        and plot (:mod:`kimi_deploy.tune.journal`)."""
        return self._under(f"{DEFAULT_STATE_DIR}/tune/{service}")

    def lock_file(self, service: str) -> Path:
        """``/etc/kimi-deploy/.<service>.lock``: held by ``install``/``uninstall``/``restart`` of the service
        (:func:`kimi_deploy.host.records.service_lock`); it stays after ``uninstall --purge`` (the pid of its
        last holder, nothing else)."""
        return self.config_dir / f".{service}.lock"

    def shared_lock_file(self) -> Path:
        """``/etc/kimi-deploy/.shared@kimi-deploy.lock``: held by every ``install``/``uninstall`` while it plans
        again and applies (:func:`kimi_deploy.host.records.shared_lock`), for what services share: ports, an API
        key file, folders. ``@`` is in no service name, so no service's lock is this file."""
        return self.config_dir / ".shared@kimi-deploy.lock"

    def service_backup_dir(self, service: str) -> Path:
        """``/etc/kimi-deploy/backup/<service>``: one timestamped folder per install that replaced files."""
        return self.backup_dir / service

    def check_report(self, service: str) -> Path:
        """``/var/lib/<service>/check-report.json``: the nightly check's last JSON report."""
        return self._under(service_check_report(service))

    def timer_stamp(self, timer: str) -> Path:
        """``/var/lib/systemd/timers/stamp-<timer>``: where systemd keeps a ``Persistent=true`` timer's
        last run (systemd.timer(5), ``Persistent=``); systemd leaves it behind when the unit goes."""
        return self._under(f"/var/lib/systemd/timers/stamp-{timer}")

    @property
    def passwd(self) -> Path:
        """``/etc/passwd`` of the target (``useradd --root`` needs it to exist)."""
        return self._under("/etc/passwd")

    @property
    def group_file(self) -> Path:
        """``/etc/group`` of the target."""
        return self._under("/etc/group")

    @property
    def is_host(self) -> bool:
        """True when ``root`` is ``/``: systemctl talks to the running manager, not ``--root``."""
        return self._is_host  # type: ignore[attr-defined]

    def describe(self, host_path: str) -> str:
        """``host_path`` for a message that stands alone (an error): the host path, and the root
        named after it when it is not ``/`` (``/etc/x (under --root /tmp/img)``)."""
        return host_path if self.is_host else f"{host_path} (under --root {self.root})"

    def command(self, args: str) -> str:
        """``kimi-deploy ARGS`` as the user must type it for this tree: ``--root DIR`` added unless the
        root is ``/`` (a fix that drops it would act on the host, not on the tree the user named)."""
        import shlex

        return f"kimi-deploy {args}" + ("" if self.is_host else f" --root {shlex.quote(str(self.root))}")

    def host_path(self, path: Path) -> str:
        """The path as the target host sees it (``root`` removed)."""
        if not path.is_relative_to(self.root):
            return str(path)
        rel = path.relative_to(self.root).as_posix()
        return "/" if rel == "." else "/" + rel

