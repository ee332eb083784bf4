"""DFlash2's greedy walk over the edge rows it reads (`ascend_specdecode.speculators.candidate_walk`) against
upstream's: every edge scored by vLLM's `_score_edges`, then walked by the simulated lane's `_selector_walk_kernel`
(its stand-in, held to the Triton kernel by the platform's parity tests). Same drafts, same realised score rows (to
fp32 summation order: one row of a matrix product instead of the whole product), on random selectors and on ties.
"""

from __future__ import annotations

import types

import pytest
import torch

K_STEPS = 3


def _selector(vocab: int, hidden: int, rank: int, dtype: torch.dtype, gen: torch.Generator):
    projection = torch.nn.Linear(hidden, rank, bias=False).to(dtype)
    with torch.no_grad():
        projection.weight.copy_(torch.randn(rank, hidden, generator=gen))
    return types.SimpleNamespace(hidden_projection=projection,
                                 predecessor_codebook=torch.randn(vocab, rank, generator=gen).to(dtype),
                                 successor_codebook=torch.randn(vocab, rank, generator=gen).to(dtype))


def _upstream_walk(selector, candidate_ids, unary, hidden_states, anchors, live):
    """What `DFlash2Speculator._generate_draft` does with greedy drafts: all edges, then the kernel's walk."""
    from vllm.model_executor.models.qwen3_dflash2 import _score_edges

    from ascend_platform.simulated.mrv2_kernels.spec_decode import selector_walk

    n, steps, k = candidate_ids.shape
    scores = _score_edges(selector.predecessor_codebook, selector.successor_codebook, candidate_ids, unary,
                          selector.hidden_projection(hidden_states), anchors, k)
    req_state = torch.where(live, torch.arange(n), -1).repeat_interleave(steps)
    tokens = torch.full((n * steps,), -7, dtype=torch.int64)
    realized = torch.full((n, steps, k), -7.0)
    selector_walk(scores.contiguous(), candidate_ids.contiguous(), torch.arange(n * steps) + 5, req_state,
                  torch.zeros(n), torch.zeros(n, dtype=torch.int64), tokens, realized, num_steps=steps, top_k=k,
                  BLOCK_K=k, SAMPLE_PROBABILISTIC=False, USE_FP64=False)
    return tokens.view(n, steps), realized


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("n", "k", "rank", "vocab", "hidden"), [(1, 1000, 64, 1000, 64), (4, 8, 16, 500, 32),
                                                                 (3, 37, 5, 200, 48)])
def test_walked_rows_draft_what_upstream_drafts(dtype, n, k, rank, vocab, hidden):
    from ascend_specdecode.speculators.candidate_walk import walk_greedy

    for seed in range(3):
        gen = torch.Generator().manual_seed(seed)
        selector = _selector(vocab, hidden, rank, dtype, gen)
        candidates = torch.stack([torch.randperm(vocab, generator=gen)[:k] for _ in range(n * K_STEPS)])
        candidates = candidates.view(n, K_STEPS, k)
        unary = (torch.randn(n, K_STEPS, k, generator=gen) * seed).to(dtype)  # seed 0: all zero, the self-draft's
        hidden_states = torch.randn(n, K_STEPS, hidden, generator=gen).to(dtype)
        anchors = torch.randint(0, vocab, (n,), generator=gen, dtype=torch.int32)
        live = torch.ones(n, dtype=torch.bool)
        with torch.inference_mode():
            want_tokens, want_rows = _upstream_walk(selector, candidates, unary, hidden_states, anchors, live)
            tokens, rows = walk_greedy(selector, candidates, unary, hidden_states, anchors)
        assert torch.equal(tokens, want_tokens), (seed, tokens, want_tokens)
        torch.testing.assert_close(rows.float(), want_rows, rtol=1e-5, atol=1e-4)


def test_ties_go_to_the_first_candidate_as_in_the_kernel():
    """Every edge scores the same (zero codebooks): each step picks its first candidate, whatever came before."""
    from ascend_specdecode.speculators.candidate_walk import walk_greedy

    gen = torch.Generator().manual_seed(0)
    selector = _selector(50, 16, 4, torch.float32, gen)
    selector.predecessor_codebook.zero_()
    candidates = torch.stack([torch.randperm(50, generator=gen)[:10] for _ in range(2 * K_STEPS)]).view(2, K_STEPS, 10)
    unary = torch.zeros(2, K_STEPS, 10)
    hidden_states = torch.randn(2, K_STEPS, 16, generator=gen)
    anchors = torch.tensor([3, 4], dtype=torch.int32)
    with torch.inference_mode():
        want, _ = _upstream_walk(selector, candidates, unary, hidden_states, anchors, torch.ones(2, dtype=torch.bool))
        tokens, _ = walk_greedy(selector, candidates, unary, hidden_states, anchors)
    assert torch.equal(tokens, candidates[:, :, 0]) and torch.equal(want, candidates[:, :, 0])
