"""Which of our ops and stand-ins served the knobs, from each engine's `ascend_usage` counters (what this engine's
workloads ran: the shared hosts' counters add up over engines, so the count before its first request is taken off).

MRV2: every sampling kernel a knob launches is one of our stand-ins (penalties, logit bias / allowed tokens / min
tokens, bad words, min-p, temperature, Gumbel sampling, top-k/top-p through `ascend_kernels.top_k_top_p`, top-k and
prompt logprobs, the grammar bitmask). V1: top-k/top-p run through `ascend_kernels.top_k_top_p` (the declared patch
of `apply_top_k_top_p_pytorch`); the V1 sampler's penalties, logit bias, bad words, min-p and logprobs are vLLM's
torch code, which runs as it is on any device.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.engine

MRV2_STAND_INS = ("penalties", "bincount", "bias", "bad_words", "min_p", "temperature", "gumbel_sample",
                  "apply_top_k_top_p_triton", "topk_log_softmax", "ranks", "prompt_logprobs_token_ids",
                  "fill_logprob_token_ids", "apply_grammar_bitmask")


def _ran(run: dict) -> dict[str, int]:
    before = run["usage_before"]["counts"]
    return {k: v - before.get(k, 0) for k, v in run["usage"]["counts"].items() if v > before.get(k, 0)}


def test_mrv2_knobs_ran_our_stand_ins(served):
    ran = _ran(served["mrv2"])
    missing = [k for k in MRV2_STAND_INS if ran.get(f"mrv2_kernels.{k}", 0) == 0]
    assert not missing, (missing, sorted(ran))
    assert ran["kernels.top_k_top_p"] > 0 and ran["kernels.gumbel_sample"] > 0
    # the sampled rows' noise on the reference's native Gumbel loop (greedy-only launches take the greedy loop)
    native_before = served["mrv2"]["usage_before"]["reference_native"]["calls"]["gumbel_sample"]
    assert served["mrv2"]["usage"]["reference_native"]["calls"]["gumbel_sample"] > native_before
    assert ran.get("mrv2_kernels.host.temperature", 0) > 0, sorted(ran)  # tempered rows divided on the host path
    facts = served["mrv2"]["usage"]["facts"]
    assert facts["runner"] == "v2" and facts["triton"] == "interpreter"


def test_v1_filter_ran_our_op(served):
    ran = _ran(served["v1"])
    assert ran.get("kernels.top_k_top_p", 0) > 0, sorted(ran)
    assert served["v1"]["usage"]["facts"]["runner"] == "v1"
    assert not any(k.startswith("mrv2_kernels.") for k in ran)
