"""``[rollout]``: how a fleet's replicas are rolled by the rendered Ansible playbook (``render --target ansible``).

Part of :mod:`kimi_deploy.profile` (its ``__init__`` exports the public names). The table is optional: without it
every key has its default and the profile's digest is what it was before the table existed
(:data:`kimi_deploy.profile.model.DIGEST_OMITS_UNSET`). Only :mod:`kimi_deploy.targets.ansible` reads it.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from kimi_deploy.profile.base import MAX_SPAN_SEC, Section

#: One step of Ansible's ``serial`` ramp as a percentage of the replicas: ``"25%"`` (1 to 100).
PERCENT = re.compile(r"(100|[1-9][0-9]?)%")
#: Most steps ``serial`` may list (a bound on hostile input; Ansible repeats the last step for the rest).
MAX_SERIAL_STEPS = 16


class Rollout(Section):
    """``[rollout]``: the batches of a roll and what must keep serving during one.

    ``serial``: Ansible's play keyword ``serial`` (playbooks_strategies, "Setting the batch size with serial"):
    replicas per batch, a count or a percentage, the last step repeated (``[1, "25%"]``: one replica first, then
    a quarter at a time). ``min_healthy``: the capacity guard before each batch, the number of workers the gateway
    must list ready and healthy besides the batch (unset: 1, or 0 for a single replica).
    ``drain_timeout_sec``: ``restart --drain-timeout`` (the in-flight requests' wait on each replica).
    """

    serial: list[int | str] = Field(default_factory=lambda: [1], min_length=1, max_length=MAX_SERIAL_STEPS,
                                    description='replicas per batch, counts or percentages, the last one repeated '
                                                '(Ansible serial: [1, "25%"])')
    min_healthy: int | None = Field(None, ge=0, description="workers the gateway must list ready and healthy besides "
                                    "each batch (default: 1; 0 with one replica)")
    drain_timeout_sec: int = Field(600, ge=0, le=MAX_SPAN_SEC,
                                   description="restart --drain-timeout: seconds in-flight requests may run on a "
                                               "replica taken out of the gateway")

    @field_validator("serial")
    @classmethod
    def _serial(cls, v: list[int | str]) -> list[int | str]:
        for step in v:
            if isinstance(step, bool) or (isinstance(step, int) and not 1 <= step <= 1 << 16) or (
                    isinstance(step, str) and not PERCENT.fullmatch(step)):
                raise ValueError(f"serial step {step!r} is neither a count of replicas (1 or more) nor a "
                                 'percentage such as "25%" (1% to 100%)')
        return v
