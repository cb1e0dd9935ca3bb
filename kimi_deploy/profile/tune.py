"""``[tune]``: what ``kimi-deploy tune`` varies for this profile (issue 40), instead of every tunable row.

Part of :mod:`kimi_deploy.profile` (its ``__init__`` exports the public names). The table is optional: without it
``tune`` varies every row of :data:`kimi_deploy.options.TUNABLES` for the target release, and the profile's digest
is what it was before the table existed (:data:`kimi_deploy.profile.model.DIGEST_OMITS_UNSET`). ``tune --space``
replaces it for one run. Example::

    [tune.space]
    max_running_requests = [32, 48, 64]
    enable_pcie_ipc_allreduce = [false, true]
"""

from __future__ import annotations

from pydantic import Field, field_validator

from kimi_deploy.options import TUNABLES
from kimi_deploy.profile.base import Section

#: The most values one key may list: a space past a few hundred points is no search on a 10-minute cold start.
MAX_TUNE_VALUES = 32


class Tune(Section):
    """``[tune]``: the options ``tune`` varies, and over which values."""

    space: dict[str, list[bool | int | float | str]] = Field(
        default_factory=dict, description="tunable [sglang] key -> the values tune tries (the profile's own value "
        "is always the baseline); keys: the options table's TUNABLES")

    @field_validator("space")
    @classmethod
    def _tunable(cls, v: dict[str, list]) -> dict[str, list]:
        keys = [t.key for t in TUNABLES]
        for key, values in v.items():
            if key not in keys:
                raise ValueError(f"{key} is not a tunable option; one of {', '.join(keys)}")
            if not values or len(values) > MAX_TUNE_VALUES:
                raise ValueError(f"{key}: give 1 to {MAX_TUNE_VALUES} values")
        return v
