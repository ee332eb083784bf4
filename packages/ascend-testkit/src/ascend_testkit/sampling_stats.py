"""Chi-square tests for sampled tokens: does one engine draw from the same distribution as another, or as a known one?

Used where two samplers are correct but draw with different noise (vLLM's CPU sampler and ours), so their seeded
tokens differ and only their distributions can be compared. Seeds are fixed, so every figure is repeatable. Tokens
whose expected count is under 5 are pooled into one category (the usual validity rule of the chi-square
approximation); the p-value is the chi-square survival function, via torch's regularised incomplete gamma.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MIN_EXPECTED = 5.0


@dataclass(frozen=True)
class ChiSquare:
    statistic: float
    dof: int
    p_value: float
    categories: int

    def as_dict(self) -> dict[str, float]:
        return {"chi2": round(self.statistic, 3), "dof": self.dof, "p": round(self.p_value, 6)}


def survival(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X ~ chi-square(dof)."""
    import torch

    if dof <= 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64)))


def _pooled(expected: Mapping[int, float], observed: Counter[int]) -> tuple[list[float], list[int]]:
    """Categories with expected count >= MIN_EXPECTED, then one for everything else (when it has any mass)."""
    big = sorted(t for t, e in expected.items() if e >= MIN_EXPECTED)
    exp = [expected[t] for t in big]
    obs = [observed.get(t, 0) for t in big]
    rest_expected = sum(e for t, e in expected.items() if e < MIN_EXPECTED)
    rest_observed = sum(observed.values()) - sum(obs)
    if rest_expected > 0 or rest_observed:
        exp.append(rest_expected)
        obs.append(rest_observed)
    return exp, obs


def goodness_of_fit(draws: Sequence[int], probs: Mapping[int, float]) -> ChiSquare:
    """Pearson's test of `draws` against token probabilities `probs`. A draw of a token with probability 0 (absent
    from `probs`) is impossible under it: statistic infinite, p = 0."""
    n = len(draws)
    expected = {t: p * n for t, p in probs.items() if p > 0}
    observed = Counter(draws)
    exp, obs = _pooled(expected, observed)
    dof = len(exp) - 1
    if any(t not in expected for t in observed):
        return ChiSquare(math.inf, dof, 0.0, len(exp))
    stat = sum((o - e) ** 2 / e for e, o in zip(exp, obs, strict=True))
    return ChiSquare(stat, dof, survival(stat, dof), len(exp))


def homogeneity(a: Sequence[int], b: Sequence[int]) -> ChiSquare:
    """Pearson's two-sample test: were `a` and `b` drawn from one distribution? (A 2 x k contingency table; a token
    is its own category when its smaller expected cell reaches MIN_EXPECTED, the rest are pooled.)"""
    ca, cb = Counter(a), Counter(b)
    na, nb = len(a), len(b)
    total = na + nb
    big = sorted(t for t in set(ca) | set(cb) if (ca.get(t, 0) + cb.get(t, 0)) * min(na, nb) / total >= MIN_EXPECTED)
    cols = [[ca.get(t, 0) for t in big], [cb.get(t, 0) for t in big]]
    rest = [na - sum(cols[0]), nb - sum(cols[1])]
    if any(rest):
        cols[0].append(rest[0])
        cols[1].append(rest[1])
    stat = 0.0
    for i in range(len(cols[0])):
        column = cols[0][i] + cols[1][i]
        for side, n in ((0, na), (1, nb)):
            e = column * n / total
            stat += (cols[side][i] - e) ** 2 / e
    dof = len(cols[0]) - 1
    return ChiSquare(stat, dof, survival(stat, dof), len(cols[0]))
