"""Source patches for the installed SGLang: ``kimi-deploy patch list|status|apply|revert|verify``.

- :mod:`.series`: the ``patches/<version>/series`` manifest and its diffs;
- :mod:`.state`: the audit record kept outside site-packages;
- :mod:`.engine`: status, verify, apply (all-or-nothing through GNU patch), revert.

Interface for other modules: :func:`status` and :func:`verify` (both take the target
interpreter and return a :class:`SeriesStatus`).
"""

from kimi_deploy.patching.engine import (
    ChangeResult,
    FileStatus,
    PatchStatus,
    SeriesStatus,
    apply,
    list_series,
    revert,
    status,
    verify,
)
from kimi_deploy.patching.series import PatchSpec, Series, available_versions, find_series, require_series

__all__ = [
    "ChangeResult", "FileStatus", "PatchSpec", "PatchStatus", "Series", "SeriesStatus", "apply",
    "available_versions", "find_series", "list_series", "require_series", "revert", "status", "verify",
]
