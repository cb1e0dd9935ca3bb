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
from pathlib import Path

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


def check_report_schema() -> Path:
    """JSON Schema of the ``kimi-deploy check`` report (``kimi-deploy.check/1``)."""
    return _PACKAGE_DIR / "check" / "report.schema.json"


def kit_templates_dir() -> Path:
    """Folder of the kit's own text templates (the commented profile of ``init``)."""
    return _PACKAGE_DIR / "templates"


@dataclasses.dataclass(frozen=True)
class HostLayout:
    """Where the installed artefacts live on a host, relative to ``root``.

    All attributes are absolute paths on the machine kimi-deploy runs on
    (``root`` joined with the host path). :meth:`host_path` strips ``root`` again
    for text that is read on the target host (unit files name host paths).
    """

    root: Path = Path("/")

    def _under(self, host_path: str) -> Path:
        return self.root / host_path.lstrip("/")

    @property
    def systemd_dir(self) -> Path:
        """``/etc/systemd/system``: where the units go."""
        return self._under("/etc/systemd/system")

    @property
    def config_dir(self) -> Path:
        """``/etc/kimi-deploy``: env files, the installed profile, backups."""
        return self._under("/etc/kimi-deploy")

    @property
    def backup_dir(self) -> Path:
        """``/etc/kimi-deploy/backup``: the previous version of every replaced file."""
        return self.config_dir / "backup"

    def state_dir(self, service: str) -> Path:
        """``/var/lib/<service>``: kimi-deploy's records (patch state, check reports)."""
        return self._under(f"/var/lib/{service}")

    def cache_dir(self, service: str) -> Path:
        """``/var/cache/<service>``: JIT and compile caches (systemd ``CacheDirectory=``)."""
        return self._under(f"/var/cache/{service}")

    def host_path(self, path: Path) -> str:
        """The path as the target host sees it (``root`` removed)."""
        if not path.is_relative_to(self.root):
            return str(path)
        rel = path.relative_to(self.root).as_posix()
        return "/" if rel == "." else "/" + rel


#: Host paths of the installed configuration, used inside rendered units.
ETC_DIR = "/etc/kimi-deploy"
SYSTEMD_DIR = "/etc/systemd/system"
