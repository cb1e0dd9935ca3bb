"""Statistics of the quality tier: a 95 % interval for a proportion, a two-proportion test, the verdict.

Interval: Wilson's score interval with continuity correction (Wilson 1927, "Probable inference, the law of
succession, and statistical inference", JASA 22:209-212; the continuity-corrected form is Newcombe 1998,
"Two-sided confidence intervals for the single proportion: comparison of seven methods", Statistics in
Medicine 17:857-872, method 4). Why the corrected form: the plain score interval's coverage oscillates around
the nominal level and dips below it for some (n, p) (Brown, Cai & DasGupta 2001, "Interval estimation for a
binomial proportion", Statistical Science 16:101-133); computed exactly here, plain Wilson covers an accuracy of
0.8722 (K2VV's vLLM figure) in 94.4 % of n = 200 runs and 0.85 in 93.3 % at n = 100, while the corrected
interval's exact coverage stays >= 95.0 % for n in 30-1000 and p in 0.5-0.995 (tests/test_check_quality_stats.py).

Comparison of two runs: the pooled two-proportion z test (normal approximation), two-sided p-value.
"""

from __future__ import annotations

import dataclasses
import math

#: The standard normal quantile of 0.975: a two-sided 95 % interval.
Z95 = 1.959963984540054


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The continuity-corrected Wilson score interval ``(lower, upper)`` for ``successes`` out of ``n``
    (fractions in [0, 1]; ``(0.0, 1.0)`` when ``n`` is 0: nothing is known).

    Raises:
        ValueError: a negative count, or ``successes > n``.
    """
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"need 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    q = 1.0 - p
    z2 = z * z
    lower = 0.0 if successes == 0 else (2 * n * p + z2 - 1 - z * math.sqrt(z2 - 2 - 1 / n + 4 * p * (n * q + 1))) \
        / (2 * (n + z2))
    upper = 1.0 if successes == n else (2 * n * p + z2 + 1 + z * math.sqrt(z2 + 2 - 1 / n + 4 * p * (n * q - 1))) \
        / (2 * (n + z2))
    return max(0.0, lower), min(1.0, upper)


@dataclasses.dataclass(frozen=True)
class Proportion:
    """``successes`` out of ``n`` with its 95 % interval: ``estimate``, ``lower``, ``upper`` (fractions; the
    estimate is ``None`` when ``n`` is 0)."""

    successes: int
    n: int

    @property
    def estimate(self) -> float | None:
        return self.successes / self.n if self.n else None

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.successes, self.n)

    @property
    def lower(self) -> float:
        return self.interval[0]

    @property
    def upper(self) -> float:
        return self.interval[1]

    def text(self) -> str:
        """``95.5 % (95 % CI 92.1-97.6 %, 191/200)``, or ``no sample (0/0)``."""
        if not self.n:
            return "no sample (0/0)"
        lo, hi = self.interval
        return (f"{100 * self.successes / self.n:.2f} % (95 % CI {100 * lo:.2f}-{100 * hi:.2f} %, "
                f"{self.successes}/{self.n})")


def below_threshold(p: Proportion, threshold: float) -> bool:
    """The verdict: ``True`` (fail) when the whole 95 % interval lies below ``threshold`` (its upper bound is
    under it), i.e. the shortfall is beyond sampling noise (a one-sided test at the 2.5 % level). A run whose
    estimate is under the threshold but whose interval still reaches it passes: at a true accuracy equal to
    the threshold this fails in at most 2.5 % of runs instead of about half of them."""
    return p.n > 0 and p.upper < threshold


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Two proportions A (before) and B (after): the difference B - A, the pooled z statistic and the two-sided
    p-value; ``significant`` at ``alpha``; ``drop``: B is significantly lower than A."""

    a: Proportion
    b: Proportion
    z: float
    p_value: float
    alpha: float = 0.05

    @property
    def difference(self) -> float | None:
        if self.a.estimate is None or self.b.estimate is None:
            return None
        return self.b.estimate - self.a.estimate

    @property
    def significant(self) -> bool:
        return self.p_value < self.alpha

    @property
    def drop(self) -> bool:
        return self.significant and (self.difference or 0.0) < 0


def two_proportion_test(a: Proportion, b: Proportion, alpha: float = 0.05) -> Comparison:
    """The pooled two-proportion z test of A against B (two-sided p-value from the normal distribution:
    ``erfc(|z| / sqrt 2)``). With an empty sample, or both samples all-successes or all-failures (no
    variance), ``z`` is 0 and the p-value 1: no evidence of a change."""
    if not a.n or not b.n:
        return Comparison(a, b, 0.0, 1.0, alpha)
    pooled = (a.successes + b.successes) / (a.n + b.n)
    se = math.sqrt(pooled * (1 - pooled) * (1 / a.n + 1 / b.n))
    if se == 0:
        return Comparison(a, b, 0.0, 1.0, alpha)
    z = (b.successes / b.n - a.successes / a.n) / se
    return Comparison(a, b, z, math.erfc(abs(z) / math.sqrt(2)), alpha)
