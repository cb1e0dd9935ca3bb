"""The search space of ``tune``: the options table's tunable rows, limited by ``--space``, as candidate profiles.

A **candidate** is the profile with some ``[sglang]`` keys changed (:class:`Candidate`: ``values``, the tuned keys
only, and its id, a digest of them). The space is the cross product of each dimension's values
(:class:`Dimension`): a row of :data:`kimi_deploy.options.TUNABLES` whose SGLang releases include the target's,
its values replaced by ``--space KEY=V1,V2`` when given, plus the profile's own value (the baseline is always in
the space). A row that needs another key unset in the profile (the EAGLE-3 steps without ``speculative_algorithm``)
is left out, and so is a row ``--space`` does not name when ``--space`` is given.

Pruning before anything restarts, cheapest first (:func:`prune`):

1. ``profile``: the profile model and its cross-field rules (:func:`kimi_deploy.profile.parse_profile`);
2. ``memory``: the memory plan (:func:`kimi_deploy.sizing.memory.plan`) on the host's GPUs and the model's facts:
   a ``will not fit`` verdict is never started (a failed cold start on the reference host costs ~10 minutes).

SGLang's own parser (``validate``) then checks every candidate that is left, in one interpreter start
(:func:`kimi_deploy.validate.validate_many`, :meth:`kimi_deploy.tune.run.Tuner.validate_all`): still before any
restart, and a candidate it refuses is never started.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from kimi_deploy import versions
from kimi_deploy.errors import UsageError
from kimi_deploy.options import BY_KEY, TUNABLES, Tunable
from kimi_deploy.errors import ProfileError
from kimi_deploy.profile import Profile, parse_profile
from kimi_deploy.sizing import memory

#: More candidates than this is a space no search on a 10-minute cold start can cover: refused with a hint.
MAX_SPACE = 4096


@dataclasses.dataclass(frozen=True)
class Dimension:
    """One tuned key: its ``values`` in trying order (the baseline's first), the ``baseline`` (the profile's own
    value, ``None`` when unset) and ``why`` from the options table."""

    key: str
    values: tuple[Any, ...]
    baseline: Any
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "values": list(self.values), "baseline": self.baseline, "why": self.why}


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One point of the space: ``values`` (tuned key -> value, every dimension's key, in dimension order)."""

    values: tuple[tuple[str, Any], ...]

    @property
    def id(self) -> str:
        """12 hex digits of the sha256 of the canonical JSON of :attr:`values` (stable across runs and hosts)."""
        text = json.dumps([[k, v] for k, v in self.values], separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def as_dict(self) -> dict[str, Any]:
        return dict(self.values)

    def label(self, baseline: Mapping[str, Any] | None = None) -> str:
        """``key=value`` of each value that differs from ``baseline`` (``baseline`` when none does)."""
        diff = [f"{k}={_text(v)}" for k, v in self.values if baseline is None or baseline.get(k) != v]
        return " ".join(diff) or "baseline"


def _text(value: Any) -> str:
    return "unset" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def parse_space(items: Sequence[str]) -> dict[str, tuple[Any, ...]]:
    """``--space KEY=V1,V2`` options -> key -> values, each value typed as the profile's field takes it
    (``true``/``false``, integers, decimals, ``none`` for unset; the profile model then checks the range).

    Raises:
        UsageError: not ``KEY=V1[,V2...]``, a key that is no tunable row (with the rows), a key given twice.
    """
    tunable = {t.key for t in TUNABLES}
    out: dict[str, tuple[Any, ...]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not raw.strip():
            raise UsageError("--space takes KEY=V1,V2", value=item,
                             hint="e.g. --space max_running_requests=32,48,64")
        if key not in tunable:
            raise UsageError(f"--space: {key} is not a tunable option", value=key,
                             hint=f"one of {', '.join(sorted(tunable))} (kimi_deploy/options.py TUNABLES)")
        if key in out:
            raise UsageError(f"--space names {key} twice", value=item, hint="give each key once, values comma-separated")
        out[key] = tuple(dict.fromkeys(_typed(v.strip()) for v in raw.split(",") if v.strip()))
    return out


def _typed(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "unset"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _applies(t: Tunable, version: str) -> bool:
    v = versions.parse_version(version)
    return versions.parse_version(t.since) <= v and (t.until is None or v < versions.parse_version(t.until))


def dimensions(profile: Profile, sglang_version: str, space: Mapping[str, Sequence[Any]] | None = None
               ) -> tuple[Dimension, ...]:
    """The dimensions of ``profile``'s space for ``sglang_version`` (module docstring); ``space``: ``--space``, else
    the profile's ``[tune.space]``, else every tunable row.

    Raises:
        UsageError: ``--space`` names a row the target release does not have, or one whose needed key is unset.
    """
    s = profile.sglang
    if not space and profile.tune is not None and profile.tune.space:
        space = {k: tuple(v) for k, v in profile.tune.space.items()}  # [tune.space]; --space replaces it
    out = []
    for t in TUNABLES:
        if space and t.key not in space:
            continue
        why_not = None
        if not _applies(t, sglang_version):
            why_not = f"SGLang {sglang_version} does not have it (releases {t.since}+" + (
                f" to <{t.until})" if t.until else ")")
        elif t.needs and getattr(s, t.needs) is None:
            why_not = f"it needs [sglang] {t.needs}, which the profile leaves unset"
        if why_not:
            if space:
                raise UsageError(f"--space {t.key}: {why_not}", value=t.key, hint="leave it out of --space")
            continue
        baseline = getattr(s, t.key)
        values = tuple(space[t.key]) if space else t.values
        if space:
            for value in values:  # each value alone on the profile: a typo is an error here, not a pruned space
                try:
                    apply(profile, Candidate(((t.key, value),)))
                except ProfileError as exc:
                    problem = (getattr(exc, "problems", None) or [exc.message])[0]
                    raise UsageError(f"--space {t.key}: {value!r} is not a value the profile takes: {problem}",
                                     value=f"{t.key}={value}", hint="give values of the option's type and range "
                                                                    "(docs/reference/profile.md)") from None
        out.append(Dimension(t.key, tuple(dict.fromkeys((baseline, *values))), baseline, t.why))
    return tuple(d for d in out if len(d.values) > 1)


def baseline(dims: Sequence[Dimension]) -> Candidate:
    """The profile as it is: every dimension at its baseline."""
    return Candidate(tuple((d.key, d.baseline) for d in dims))


def candidates(dims: Sequence[Dimension]) -> list[Candidate]:
    """Every point of the space, the baseline first (dimension order, values in trying order).

    Raises:
        UsageError: more than :data:`MAX_SPACE` points.
    """
    size = 1
    for d in dims:
        size *= len(d.values)
    if size > MAX_SPACE:
        raise UsageError(f"the space has {size} candidates, more than {MAX_SPACE}", value=size,
                         hint="limit it with --space KEY=V1,V2 (fewer keys or values)")
    return [Candidate(tuple(zip((d.key for d in dims), combo))) for combo in itertools.product(*(d.values for d in dims))]


def couple(values: Mapping[str, Any], profile: Profile) -> dict[str, Any]:
    """``values`` plus the keys SGLang sets together with them: at EAGLE top-k 1 the draft tokens are steps + 1
    (sglang 0.5.23 srt/arg_groups/speculative_hook.py rewrites any other value; the profile rules refuse it)."""
    out = dict(values)
    steps = out.get("speculative_num_steps")
    if steps is not None and (profile.sglang.speculative_eagle_topk or 1) == 1:
        out["speculative_num_draft_tokens"] = int(steps) + 1
    return out


def apply(profile: Profile, candidate: Candidate) -> Profile:
    """``profile`` with ``candidate``'s values (and their coupled keys), validated as a loaded profile is.

    Raises:
        ProfileError: the combination breaks the profile model or its rules (exit 2; :func:`prune` records it).
    """
    data = profile.model_dump(mode="json")
    data["sglang"].update(couple(candidate.as_dict(), profile))
    return parse_profile(data, source=f"candidate {candidate.id}")


@dataclasses.dataclass(frozen=True)
class Pruned:
    """Why a candidate is never started: ``stage`` ``profile`` or ``memory``, and the problems in words."""

    stage: str
    problems: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "problems": list(self.problems)}


def prune(profile: Profile, candidate: Candidate, facts: Any = None) -> Pruned | None:
    """``None`` when ``candidate`` may be started, else why not (module docstring's stages 1-2).

    ``facts``: :class:`kimi_deploy.sizing.memory.Facts` (GPUs and the model's facts); ``None`` skips the memory
    stage (no facts here: ``tune`` says so once).
    """
    try:
        changed = apply(profile, candidate)
    except ProfileError as exc:
        return Pruned("profile", tuple(getattr(exc, "problems", None) or [exc.message]))
    if facts is not None:
        plan = memory.plan(changed, facts)
        if not plan.fits:
            return Pruned("memory", tuple(plan.problems))
    return None


def tunable_keys() -> tuple[str, ...]:
    """Every tunable row's key, in visiting order (``--space``'s choices)."""
    return tuple(t.key for t in TUNABLES if t.key in BY_KEY)
