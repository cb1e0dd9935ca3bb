"""SGLang version rules: which spelling of each feature a given SGLang release accepts.

One table, :data:`RULES`; each row cites the SGLang release it comes from
(checked against the sglang 0.5.23 wheel and its changelog, see
``shared/notes/sglang-0.5.23.md``). :func:`spelling` answers "how does version V
spell feature F", or raises :class:`UnsupportedVersionError` naming the version
that added it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from packaging.version import InvalidVersion, Version

from kimi_deploy.errors import UnsupportedVersionError, UsageError

#: Default target: the release the kit's tests run against.
DEFAULT_SGLANG_VERSION = "0.5.23"
#: Oldest and newest releases whose flags the table describes. Newer releases
#: are accepted with the newest known spelling (and a warning from ``render``).
OLDEST_KNOWN = Version("0.5.0")
NEWEST_KNOWN = Version(DEFAULT_SGLANG_VERSION)


@dataclasses.dataclass(frozen=True)
class Rule:
    """One spelling of one feature, valid for ``since <= version < until``.

    ``kind`` is ``"flag"`` (a launch argument) or ``"env"`` (an environment
    variable). ``spelling`` is the flag or the variable name. ``source`` says where
    the fact comes from.
    """

    feature: str
    kind: str
    spelling: str
    since: Version
    until: Version | None
    source: str

    def applies(self, version: Version) -> bool:
        return self.since <= version and (self.until is None or version < self.until)


def _v(text: str) -> Version:
    return Version(text)


RULES: tuple[Rule, ...] = (
    Rule("flashinfer_allreduce_fusion", "flag", "--enable-flashinfer-allreduce-fusion",
         OLDEST_KNOWN, _v("0.5.14"),
         "sglang <0.5.14; still parses in 0.5.23 as a deprecated alias of --flashinfer-allreduce-fusion-backend auto"),
    Rule("flashinfer_allreduce_fusion", "flag", "--flashinfer-allreduce-fusion-backend",
         _v("0.5.14"), None, "sglang 0.5.14 added the backend choice {auto,trtllm,mnnvl,cutedsl}"),
    Rule("enforce_disable_flashinfer_allreduce_fusion", "flag",
         "--enforce-disable-flashinfer-allreduce-fusion", _v("0.5.10"), None, "sglang 0.5.10"),
    Rule("enable_symm_mem", "flag", "--enable-symm-mem", OLDEST_KNOWN, None,
         "sglang <=0.5.1 (forces NCCL_CUMEM_ENABLE=1, NCCL_NVLS_ENABLE=1)"),
    Rule("enable_torch_symm_mem", "flag", "--enable-torch-symm-mem", _v("0.5.3"), None, "sglang 0.5.3"),
    Rule("spec_v2", "env", "SGLANG_ENABLE_SPEC_V2", _v("0.5.5"), _v("0.5.14"),
         "sglang 0.5.5 added the env (off), 0.5.11 made it default on, 0.5.14 removed it: "
         "EAGLE/EAGLE3 always use the v2 worker, overlap unless --disable-overlap-schedule"),
    Rule("spec_v2", "implicit", "", _v("0.5.14"), None,
         "sglang 0.5.14: no switch, v2 worker always; the env is ignored silently from 0.5.21"),
    Rule("speculative_eagle3_kimi", "flag", "--speculative-algorithm", _v("0.5.10"), None,
         "sglang 0.5.10 added EAGLE3 for Kimi K2.5 (draft models lightseekorg/kimi-k2.5-eagle3*)"),
    Rule("pcie_ipc_allreduce", "env", "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", _v("0.5.21"), None,
         "sglang 0.5.21: custom all-reduce over PCIe IPC for world sizes 2/4/8"),
    Rule("tool_call_parser", "flag", "--tool-call-parser", OLDEST_KNOWN, None, "sglang <=0.5.0 (kimi_k2)"),
    Rule("reasoning_parser", "flag", "--reasoning-parser", OLDEST_KNOWN, None, "sglang <=0.5.0 (kimi_k2)"),
    Rule("config_file", "flag", "--config", OLDEST_KNOWN, None,
         "sglang server_args.py: YAML file of options merged before the command line"),
)

#: Features whose first release the table knows, for error messages.
FEATURES = frozenset(rule.feature for rule in RULES)


def parse_version(text: str) -> Version:
    """Parse an SGLang version string (``0.5.23``, ``0.5.23.post1``).

    Raises:
        UsageError: not a version, or outside the 0.5 series the table describes.
    """
    try:
        version = Version(str(text).strip())
    except InvalidVersion as exc:
        raise UsageError(
            "not an SGLang version", value=text,
            hint=f"give a release number such as {DEFAULT_SGLANG_VERSION}",
        ) from exc
    if version.release[:2] != (0, 5) or version < OLDEST_KNOWN:
        raise UsageError(
            f"SGLang {version} is outside the releases kimi-deploy knows ({OLDEST_KNOWN} to {NEWEST_KNOWN}.x)",
            value=text, hint=f"target a 0.5.x release; the default is {DEFAULT_SGLANG_VERSION}",
        )
    return version


def rules_for(feature: str) -> Iterable[Rule]:
    """Every row of :data:`RULES` for ``feature``, oldest first."""
    if feature not in FEATURES:
        raise KeyError(feature)
    return sorted((r for r in RULES if r.feature == feature), key=lambda r: r.since)


def first_release(feature: str) -> Version:
    """The oldest release that has ``feature`` in any spelling."""
    return min(r.since for r in rules_for(feature))


def spelling(feature: str, version: Version, *, what: str | None = None) -> Rule:
    """The rule that tells how ``version`` spells ``feature``.

    Args:
        feature: a key of the table (``flashinfer_allreduce_fusion``, ``spec_v2``, ...).
        version: the target SGLang release.
        what: the profile field that asked for the feature, for the error message.

    Raises:
        UnsupportedVersionError: ``version`` predates the feature; the message names
            the release that added it.
    """
    for rule in rules_for(feature):
        if rule.applies(version):
            return rule
    added = first_release(feature)
    source = next(iter(rules_for(feature))).source
    raise UnsupportedVersionError(
        f"{what or feature} needs SGLang >= {added}, but the target is SGLang {version}",
        value=str(version),
        hint=f"upgrade SGLang to {added} or later ({source}), or remove {what or feature} from the profile",
    )
