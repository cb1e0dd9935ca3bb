"""SGLang version rules: which spelling of each feature a given SGLang release accepts.

One table, :data:`RULES`, read off the option table :data:`kimi_deploy.options.OPTIONS`; each
row cites the SGLang release it comes from (checked against the sglang 0.5.23 wheel and its
release notes, ``sgl-project/sglang`` releases). :func:`spelling` answers "how does version V
spell feature F", or raises :class:`UnsupportedVersionError` naming the version
that added it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from packaging.version import InvalidVersion, Version

from kimi_deploy.errors import UnsupportedVersionError, UsageError
from kimi_deploy.options import ALL_OPTIONS

#: Default target: the release the kit's tests run against.
DEFAULT_SGLANG_VERSION = "0.5.23"
#: Oldest and newest releases whose flags the table describes. Newer releases
#: are accepted with the newest known spelling (and a warning from ``render``).
OLDEST_KNOWN = Version("0.5.0")
NEWEST_KNOWN = Version(DEFAULT_SGLANG_VERSION)


@dataclasses.dataclass(frozen=True)
class Rule:
    """One spelling of one feature, valid for ``since <= version < until``.

    ``feature`` is the ``[sglang]`` profile key of the option (:data:`kimi_deploy.options.OPTIONS`).
    ``kind`` is ``"flag"`` (a launch argument), ``"env"`` (an environment variable) or ``"implicit"``
    (no switch: the release always does it). ``spelling`` is the flag or the variable name. ``value``:
    the rule is about that value of the option only (``None``: any value). ``source`` says where the
    fact comes from.
    """

    feature: str
    kind: str
    spelling: str
    since: Version
    until: Version | None
    source: str
    value: str | None = None

    def applies(self, version: Version) -> bool:
        return self.since <= version and (self.until is None or version < self.until)


def _v(text: str) -> Version:
    return Version(text)


#: The spellings of every row of :data:`kimi_deploy.options.ALL_OPTIONS` ([sglang] rows, then [fleet] ones).
RULES: tuple[Rule, ...] = tuple(
    Rule(option.key, sp.kind, sp.name, max(_v(sp.since), OLDEST_KNOWN), _v(sp.until) if sp.until else None,
         sp.source, sp.value)
    for option in ALL_OPTIONS for sp in option.spellings
)

#: Features (profile keys) the table has rules for.
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


def rules_for(feature: str, value: str | None = None) -> list[Rule]:
    """The rows of :data:`RULES` for ``feature`` (and, when rows exist for it, that ``value``), oldest first.

    Raises:
        KeyError: no row names ``feature``.
    """
    if feature not in FEATURES:
        raise KeyError(feature)
    rows = [r for r in RULES if r.feature == feature]
    specific = [r for r in rows if value is not None and r.value == value]
    return sorted(specific or [r for r in rows if r.value is None], key=lambda r: r.since)


def first_release(feature: str, value: str | None = None) -> Version:
    """The oldest release that has ``feature`` (with ``value``) in any spelling."""
    return min(r.since for r in rules_for(feature, value))


def spelling(feature: str, version: Version, *, what: str | None = None, value: str | None = None) -> Rule:
    """The rule that tells how ``version`` spells ``feature`` (set to ``value``, when its rows depend on it).

    Args:
        feature: an ``[sglang]`` key of the option table (``flashinfer_allreduce_fusion_backend``, ...).
        version: the target SGLang release.
        what: the profile field that asked for the feature, for the error message.
        value: the value asked for (``EAGLE3`` of ``speculative_algorithm`` has its own first release).

    Raises:
        UnsupportedVersionError: ``version`` predates the feature; the message names
            the release that added it.
    """
    rows = rules_for(feature, value)
    for rule in rows:
        if rule.applies(version):
            return rule
    what = what or feature
    if value is not None and any(r.value == value for r in rows):
        what = f'{what} = "{value}"'
    added = first_release(feature, value)
    source = rows[0].source
    raise UnsupportedVersionError(
        f"{what} needs SGLang >= {added}, but the target is SGLang {version}",
        value=str(version),
        hint=f"upgrade SGLang to {added} or later ({source}), or remove {what} from the profile",
    )


@dataclasses.dataclass(frozen=True)
class Removed:
    """A switch SGLang dropped: from ``since`` on, the ``flag`` is refused by SGLang's parser (``how``: ``removed``)
    or the ``env`` variable is read by nothing (``ignored``: the server starts without the setting, silently).
    ``instead``: the spelling to use; ``source``: where the fact comes from."""

    kind: str
    name: str
    since: Version
    how: str
    instead: str
    source: str

    def applies(self, version: Version) -> bool:
        return version >= self.since


#: Switches that are gone in a release, for the refusal of a profile that still spells them (``extra_args`` and
#: ``[environment]``; the option table's own rows never emit them for such a release). Sources: SGLang's release
#: notes (``sgl-project/sglang`` releases), checked against the sglang 0.5.23 wheel's ``srt/server_args.py``.
REMOVED: tuple[Removed, ...] = (
    Removed("flag", "--cuda-graph-max-bs", Version("0.5.23"), "removed",
            "--cuda-graph-max-bs-decode N and/or --cuda-graph-max-bs-prefill N (or --cuda-graph-config)",
            "sglang 0.5.23 server_args: split into -decode/-prefill; the old spelling is an argparse "
            "'ambiguous option' error (absent in 0.5.23; the first release without it is not recorded)"),
    Removed("env", "SGLANG_ENABLE_SPEC_V2", Version("0.5.14"), "ignored",
            "[sglang] enable_spec_v2 (the kit spells it for the release: the variable before 0.5.14, nothing "
            "from 0.5.14, where EAGLE/EAGLE3 always use spec v2; disable_overlap_schedule = true turns overlap off)",
            "sglang PR #27964 removed it in 0.5.14; from 0.5.21 not even a warning (0.5.23 source)"),
)


def removed_switches(version: Version, flags: Iterable[str] = (), env_names: Iterable[str] = ()) -> list[str]:
    """One ``location: problem; fix`` line per switch in ``flags`` (``extra_args``, also ``--flag=value``) or
    ``env_names`` (``[environment]`` keys) that ``version`` has removed or ignores (:data:`REMOVED`)."""
    problems = []
    names = {"flag": [(f, f.split("=", 1)[0]) for f in flags], "env": [(e, e) for e in env_names]}
    where = {"flag": "sglang.extra_args", "env": "environment"}
    for rule in REMOVED:
        if not rule.applies(version):
            continue
        for given, name in names[rule.kind]:
            if name == rule.name:
                what = "refuses" if rule.how == "removed" else "silently ignores"
                problems.append(f"{where[rule.kind]}: SGLang {version} {what} {rule.name} ({rule.how} in "
                                f"{rule.since}; {rule.source}); use {rule.instead}")
    return problems
