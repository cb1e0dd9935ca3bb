"""Source patches for the installed SGLang: ``kimi-deploy patch list|status|apply|revert|verify``.

- :mod:`.series`: the ``patches/<version>/series`` manifest and its diffs;
- :mod:`.state`: the audit record kept outside site-packages;
- :mod:`.installation`: status, verify, apply (all-or-nothing through GNU patch), revert.

Interface for other modules: :func:`status` and :func:`verify` (both take the target
interpreter and return a :class:`SeriesStatus`, whose ``fix`` is the one remedy every verb
prints); :meth:`Series.gates_asked` (the manifest's feature -> patch mapping, ``needed_by``).
"""

from kimi_deploy.patching.installation import (
    ChangeResult,
    FileStatus,
    PatchStatus,
    SeriesStatus,
    apply,
    apply_command,
    reinstall_command,
    require_applied,
    revert,
    status,
    verify,
)
from kimi_deploy.patching.series import (
    FeatureGate,
    GateHit,
    PatchSpec,
    Series,
    available_versions,
    find_series,
    require_series,
)

__all__ = [
    "ChangeResult", "FeatureGate", "FileStatus", "GateHit", "PatchSpec", "PatchStatus", "Series", "SeriesStatus",
    "apply", "apply_command", "available_versions", "find_series", "reinstall_command",
    "require_applied", "require_series", "revert", "status", "verify",
]
