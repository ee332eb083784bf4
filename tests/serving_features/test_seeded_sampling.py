"""Seeded sampling: where the noise is the same on both sides, the tokens must be equal.

Why the noise differs, from vLLM 0.32's code: `TopKTopPSampler.__init__` gives a platform whose `is_cpu()` is true
`forward_cpu`, which draws a 31-bit seed from the request's generator each step and samples with
`torch.ops._C.fused_gumbel_argmax` (SplitMix64 Gumbel noise); any other platform (ours, on a card and here) gets
`forward_native`, whose `random_sample` races `probs / q` with `q ~ Exp(1)` drawn from the request's generator
itself. With `use_fp64_gumbel` `forward_cpu` takes that same race (in float64), so then plain vLLM CPU and our V1
runner draw one noise and must give one token sequence. Our default float32 race draws the same exponentials as the
float64 one (the CPU generator makes each from one 64-bit draw; only the rounding differs), so our default V1 lane
also gives plain vLLM CPU's fp64 tokens. MRV2 draws counter-based Gumbel noise of (seed, position, token)
(`vllm/v1/worker/gpu/sample/gumbel.py`, reproduced by our stand-in bit for bit): its tokens are held to that noise on
plain vLLM CPU's own distributions along the same text.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.engine
OURS = ("v1", "mrv2")


def _tokens(rows):
    return [r["token_ids"] for r in rows]


def test_v1_runner_draws_vllm_cpus_tokens_with_the_same_noise(served):
    """Temperature, top-k, top-p, min-p, repetition / frequency / presence penalties, logit bias with bad words and
    n=4, each seeded, 16 tokens: our V1 runner (float64 race and default float32 race) and plain vLLM CPU with
    use_fp64_gumbel give the same tokens; JSON-schema and regex requests sampled at temperature too."""
    cpu = served["cpu-fp64"]
    for name in ("v1-fp64", "v1"):
        ours = served[name]
        assert _tokens(ours["seeded"]) == _tokens(cpu["seeded"]), name
        assert ours["n4"] == cpu["n4"], name
        seeded_structured = {r["id"]: r["token_ids"] for r in ours["structured"] if r["id"] in
                             {s["id"] for s in cpu["structured"]}}
        assert seeded_structured == {r["id"]: r["token_ids"] for r in cpu["structured"]}, name
    assert all(len(t) == 16 for t in _tokens(cpu["seeded"]))


def test_plain_vllm_cpu_draws_other_noise_by_default(served):
    """The reason for the distribution tests: by default plain vLLM CPU samples with forward_cpu's SplitMix64 noise,
    so its seeded tokens are not the exponential race's (most of the seeded requests differ)."""
    default, race = _tokens(served["cpu"]["seeded"]), _tokens(served["cpu-fp64"]["seeded"])
    assert sum(a != b for a, b in zip(default, race, strict=True)) >= len(race) // 2


@pytest.mark.parametrize("lane", (*OURS, "cpu"))
def test_n4_returns_the_four_seeded_children(served, lane):
    """n=4 with seed s returns four completions, each the request vLLM makes of it (seed s + i) served alone, and
    not four copies of one."""
    n4 = served[lane]["n4"]
    assert len(n4["n4"]) == 4 and n4["n4"] == n4["singles"]
    assert len({tuple(t) for t in n4["n4"]}) == 4


@pytest.mark.parametrize("lane", (*OURS, "cpu"))
def test_seeded_requests_repeat_whatever_their_batch(served, lane):
    """The same seeded requests in the reverse order (other batch rows beside each) give the same tokens."""
    assert _tokens(served[lane]["seeded"]) == _tokens(served[lane]["seeded_reversed"])


def _dense(logprobs: dict[str, float], vocab: int):
    import torch

    row = torch.full((vocab,), float("-inf"))
    for tok, lp in logprobs.items():
        row[int(tok)] = lp
    return row


def test_mrv2_draws_its_noise_on_vllm_cpus_distributions(served, workload):
    """Each of MRV2's seeded tokens (temperature, top-k, top-p, min-p and all three; one request after a prompt
    prefilled in two chunks, which MRV2 handles: its noise depends on the position, not on a generator) is what
    vLLM's MRV2 sampler
    draws from plain vLLM CPU's next-token distribution at that point of the same text: Gumbel-max over
    log p / T filtered by min-p, top-k and top-p, with the noise of (seed, position) computed by
    `ascend_kernels.reference.gumbel_sample` (held bit for bit to vLLM's `_gumbel_sample_kernel` by the platform's
    kernel parity test). A log-softmax shifts a row by a constant, so the draw on logprobs is the draw on logits."""
    import torch

    from ascend_kernels.reference import gumbel_sample
    from ascend_kernels.reference.sampling import apply_top_k_top_p

    requests = {r["id"]: r["sampling"] for r in workload.seeded_requests(chunked=True)}
    mrv2 = served["mrv2"]["seeded"]
    replay = served["cpu-replay"]["distributions"]
    vocab = workload.VOCAB_SIZE
    checked = mismatched = 0
    for row, dist in zip(mrv2, replay, strict=True):
        params = requests[row["id"]]
        if any(k in params for k in ("repetition_penalty", "frequency_penalty", "logit_bias")):
            continue  # these act on raw logits, which logprobs do not carry
        prompt_len, out = len(row["prompt_token_ids"]), row["token_ids"]
        rows = [dist["prompt_logprobs"][prompt_len + k] for k in range(len(out) - 1)] + [dist["logprobs"][0]]
        logits = torch.stack([_dense(r, vocab) for r in rows]) / params["temperature"]
        if "min_p" in params:
            threshold = logits.max(dim=-1, keepdim=True).values + torch.log(torch.tensor(params["min_p"]))
            logits = logits.masked_fill(logits < threshold, float("-inf"))
        n = len(out)
        logits = apply_top_k_top_p(logits, torch.full((n,), params.get("top_k", 0)) if "top_k" in params else None,
                                   torch.full((n,), params.get("top_p", 1.0)) if "top_p" in params else None)
        positions = torch.arange(prompt_len - 1, prompt_len - 1 + n)
        drawn = gumbel_sample(logits, torch.ones(n), torch.full((n,), params["seed"]), positions,
                              apply_temperature=False)
        mismatched += sum(int(a != b) for a, b in zip(drawn.tolist(), out, strict=True))
        checked += n
    assert checked >= 6 * 16 and any(r["id"] == "seeded_chunked" for r in mrv2)
    assert len(next(r for r in mrv2 if r["id"] == "seeded_chunked")["prompt_token_ids"]) > workload.TOKEN_BUDGET
    assert mismatched == 0, f"{mismatched} of {checked} MRV2 tokens are not vLLM's draw on vLLM CPU's distribution"


def test_no_seeded_prompt_is_prefilled_in_chunks_on_v1(workload):
    """vLLM 0.32's V1 runner fails a seeded request whose prompt is prefilled in chunks on a CPU generator
    (`_bookkeeping_sync` rewinds the generator's offset: "CPU Generator does not use offset"; plain vLLM CPU too):
    the V1 workloads keep every seeded prompt whole, even with max_num_seqs of them in one step."""
    seeded = [r for r in workload.seeded_requests() if "seed" in r["sampling"]]
    seeded += [r for name in workload.DRAW_CONFIGS for r in workload.draw_requests(name)[:1]]
    seeded += [r for r in workload.structured_requests() if "seed" in r["sampling"]]
    longest = max(len(r["prompt"]) for r in seeded)  # one token per character
    assert longest <= workload.SEEDED_PROMPT_MAX
    assert workload.ENGINE["max_num_batched_tokens"] >= workload.MAX_NUM_SEQS * workload.SEEDED_PROMPT_MAX


@pytest.mark.parametrize("lane", (*OURS, "cpu"))
def test_requests_joining_a_running_batch_sample_as_they_do_alone(served, lane):
    """Seeded requests that join a decoding batch draw what they draw alone, and sample (their temperature reached
    the sampler: they differ from their greedy tokens); greedy requests that join after them, into the slots they
    left, are greedy (no temperature or seed of the slot's last request is left behind). MRV2's sampler copies its
    per-request tables to the device only on steps that added a request (`ascend_platform.worker.sampler_staging`)."""
    joining = served[lane]["joining"]
    assert joining["steps_before_join"] >= 4
    assert joining["together"] == joining["alone"]
    assert all(joining["together"][rid] != tokens for rid, tokens in joining["seeded_as_greedy"].items())
    joined = {rid: t for rid, t in joining["together"].items() if rid != "join_long"}
    assert len(joined) == 6 and all(len(t) == 12 for t in joined.values())
