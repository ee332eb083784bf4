"""Seeded sampling where the two sides draw different noise by design (plain vLLM CPU's forward_cpu SplitMix64
Gumbel noise, our V1 runner's exponential race, MRV2's counter-based Gumbel noise: see test_seeded_sampling.py):
the first token of DRAWS seeded one-token requests per configuration, fixed seeds (so every figure repeats), tested
with Pearson's chi-square

- against the exact distribution, computed from plain vLLM CPU's full next-token logprobs (temperature, then min-p,
  top-k, top-p as vLLM applies them), on every engine;
- ours against plain vLLM CPU's draws (two samples), on both runners.

A p-value under ALPHA fails. The tests can fail: the same draws are far from a distribution with the filter left out.
"""

from __future__ import annotations

import pytest

from ascend_testkit.sampling_stats import goodness_of_fit, homogeneity

pytestmark = pytest.mark.engine
ALPHA = 1e-3
OURS = ("v1", "mrv2")
EXACT = ("temperature", "top_k", "top_p", "min_p", "top_k_top_p_min_p")  # computable from logprobs alone


def expected_distribution(logprobs: dict[str, float], cfg: dict) -> dict[int, float]:
    """The first-token distribution vLLM samples from under `cfg`, from the full raw logprobs at the prompt."""
    import torch

    from ascend_kernels.reference.sampling import apply_top_k_top_p

    ids = sorted(int(t) for t in logprobs)
    logits = torch.tensor([logprobs[str(t)] for t in ids], dtype=torch.float64)[None] / cfg["temperature"]
    if "min_p" in cfg:
        probs = torch.softmax(logits, dim=-1)
        logits = logits.masked_fill(probs < cfg["min_p"] * probs.max(), float("-inf"))
    logits = apply_top_k_top_p(logits, torch.tensor([cfg["top_k"]]) if "top_k" in cfg else None,
                               torch.tensor([cfg["top_p"]]) if "top_p" in cfg else None)
    probs = torch.softmax(logits, dim=-1)[0]
    return {t: float(p) for t, p in zip(ids, probs.tolist(), strict=True) if p > 0}


@pytest.fixture(scope="module")
def exact(served, workload) -> dict[str, dict[int, float]]:
    full = served["cpu"]["max_logprobs"]["full"][0]
    assert full["prompt_token_ids"] == served.tok(workload.DRAW_PROMPT)["input_ids"]
    first = full["logprobs"][0]
    assert len(first) == workload.VOCAB_SIZE
    return {name: expected_distribution(first, workload.DRAW_CONFIGS[name]) for name in EXACT}


@pytest.mark.parametrize("name", EXACT)
@pytest.mark.parametrize("lane", ("cpu", *OURS))
def test_first_tokens_follow_the_exact_distribution(served, exact, lane, name, workload):
    draws = served[lane]["draws"][name]
    assert len(draws) == workload.DRAWS
    fit = goodness_of_fit(draws, exact[name])
    assert fit.categories >= 4, fit  # enough categories that a wrong filter shows
    assert fit.p_value > ALPHA, (lane, name, fit.as_dict())


@pytest.mark.parametrize("name", [*EXACT, "repetition_penalty"])
@pytest.mark.parametrize("lane", OURS)
def test_first_tokens_are_distributed_as_vllm_cpus(served, lane, name):
    test = homogeneity(served[lane]["draws"][name], served["cpu"]["draws"][name])
    assert test.categories >= 4, test
    assert test.p_value > ALPHA, (lane, name, test.as_dict())


def test_the_chi_square_tests_can_fail(served, exact):
    """The same draws against what they are not: unfiltered draws against the top-k distribution, top-k draws
    against the unfiltered one, and top-p draws against vLLM CPU's unfiltered draws."""
    cpu = served["cpu"]["draws"]
    assert goodness_of_fit(cpu["temperature"], exact["top_k"]).p_value < ALPHA
    assert goodness_of_fit(cpu["top_k"], exact["temperature"]).p_value < ALPHA
    for lane in OURS:
        assert homogeneity(served[lane]["draws"]["top_p"], cpu["temperature"]).p_value < ALPHA, lane


@pytest.mark.parametrize("lane", ("cpu", *OURS))
def test_the_repetition_penalty_moves_the_first_token(served, lane, workload):
    """The penalty's prompt is often continued by one of its own tokens: penalised, those are drawn less often
    than by the same seeds unpenalised (a penalty left out would leave the draws alike)."""
    draws = served[lane]["draws"]
    penalised, free = draws["repetition_penalty"], draws["repetition_baseline"]
    assert homogeneity(penalised, free).p_value < ALPHA
    prompt_tokens = set(served.tok(workload.PENALTY_PROMPT)["input_ids"])

    def share(d):
        return sum(t in prompt_tokens for t in d) / len(d)

    assert share(free) > 0.3 and share(penalised) < share(free) - 0.1, (share(penalised), share(free))
