"""The chi-square helpers the engine suites' distribution tests rest on, on figures known in closed form."""

from __future__ import annotations

import random

import pytest

from ascend_testkit.sampling_stats import goodness_of_fit, homogeneity, survival


@pytest.mark.parametrize(("statistic", "dof", "p"), [(3.841459, 1, 0.05), (11.0705, 5, 0.05), (6.6349, 1, 0.01),
                                                     (0.0, 3, 1.0)])
def test_survival_is_the_chi_square_tail(statistic, dof, p):
    assert survival(statistic, dof) == pytest.approx(p, abs=1e-4)


def test_goodness_of_fit_counts_pools_and_refuses_the_impossible():
    probs = {0: 0.5, 1: 0.3, 2: 0.19, 3: 0.005, 4: 0.005}
    exact = [0] * 50 + [1] * 30 + [2] * 19 + [3]
    fit = goodness_of_fit(exact, probs)
    assert fit.categories == 4 and fit.dof == 3  # 3 and 4 expect 0.5 each: pooled into one category
    assert fit.p_value > 0.99
    assert goodness_of_fit([0] * 100, probs).p_value < 1e-10
    assert goodness_of_fit([*exact[:-1], 7], probs).p_value == 0.0  # a token the distribution cannot give


def test_homogeneity_tells_one_distribution_from_two():
    rng = random.Random(0)
    tokens, weights = [0, 1, 2, 3], [0.4, 0.3, 0.2, 0.1]
    a = rng.choices(tokens, weights, k=500)
    b = rng.choices(tokens, weights, k=500)
    c = rng.choices(tokens, [0.55, 0.25, 0.15, 0.05], k=500)
    assert homogeneity(a, a).p_value == pytest.approx(1.0)
    assert homogeneity(a, b).p_value > 0.01
    assert homogeneity(a, c).p_value < 1e-4
    assert homogeneity(a, c).categories == 4
