"""The installed unit and env file versus a fresh render (``doctor``'s ``unit`` check); the host's port and disk
probes are facts (:mod:`kimi_deploy.facts.ports`, :mod:`kimi_deploy.facts.disk`)."""

from __future__ import annotations

import dataclasses
import difflib

from kimi_deploy.paths import HostLayout
from kimi_deploy.targets.systemd import Rendered


@dataclasses.dataclass(frozen=True)
class FileDrift:
    """One installed file against its fresh render: ``state`` is ``absent``, ``same`` or ``different``.

    ``added``/``removed``: line counts of the unified diff (installed -> fresh render);
    ``first``: the first changed line of the fresh render (or of the installed file); ``diff``: the
    unified diff text.
    """

    name: str
    path: str
    state: str
    added: int = 0
    removed: int = 0
    first: str = ""
    diff: str = ""


def compare_installed(rendered: Rendered, layout: HostLayout) -> list[FileDrift]:
    """Compare ``<root>/etc/systemd/system/<name>.service`` and ``<root>/etc/kimi-deploy/<name>.env``
    with ``rendered``."""
    out = []
    for name, directory in ((rendered.service_unit, layout.systemd_dir), (rendered.env_file, layout.config_dir)):
        path = directory / name
        fresh = rendered.files[name]
        try:
            installed = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            out.append(FileDrift(name, str(path), "absent"))
            continue
        except (OSError, UnicodeDecodeError) as exc:
            out.append(FileDrift(name, str(path), "different", first=f"unreadable: {exc}"))
            continue
        if installed == fresh:
            out.append(FileDrift(name, str(path), "same"))
            continue
        diff = list(difflib.unified_diff(installed.splitlines(), fresh.splitlines(),
                                         f"installed/{name}", f"rendered/{name}", lineterm=""))
        changes = [d for d in diff[2:] if d[:1] in "+-"]
        added = sum(1 for d in changes if d.startswith("+"))
        first = next((d for d in changes if d.startswith("+")), changes[0] if changes else "")
        first = f"{first[:1]} {first[1:].strip()}" if first else ""
        out.append(FileDrift(name, str(path), "different", added, len(changes) - added, first,
                             "\n".join(diff)))
    return out
