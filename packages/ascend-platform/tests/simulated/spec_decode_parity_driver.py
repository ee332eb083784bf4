"""Runs vLLM's MRV2 speculative-decoding kernel launchers twice on identical inputs: first with vLLM's Triton kernels
in Triton's interpreter, then with the simulated lane's stand-ins (`mrv2_kernels.spec_decode`) registered through
vLLM's dispatcher, and prints one JSON line {case: {output: "equal" | max abs difference | mismatch count}}.

A script, not a test module (vLLM picks its platform once per process): run with ASCEND_VLLM_SIMULATE=1 and
TRITON_INTERPRET=1 (Triton's own library interpreted too, as in the engine's spawned workers).
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import numpy as np
import torch
import triton
import triton.language as tl
from vllm.platforms import current_platform  # resolved first: the simulated platform turns the interpreter on
from vllm.v1.worker.gpu.sample.gumbel import gumbel_noised_argmax

VOCAB, MAX_REQS, MAX_TOKENS, HIDDEN, K = 300, 8, 96, 24, 3


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _ints(g, lo, hi, shape, dtype=torch.int32):
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def _buffers(g):
    from vllm.v1.worker.gpu.input_batch import InputBuffers

    buffers = InputBuffers(MAX_REQS, MAX_TOKENS, torch.device("cpu"))
    buffers.input_ids.copy_(_ints(g, 0, VOCAB, (MAX_TOKENS,)))
    buffers.positions.copy_(_ints(g, 0, 200, (MAX_TOKENS,), torch.int64))
    buffers.query_start_loc.copy_(_ints(g, 0, 50, (MAX_REQS + 1,)))
    buffers.seq_lens.copy_(_ints(g, 0, 50, (MAX_REQS,)))
    return buffers


def _buffer_outputs(b) -> dict:
    return {"input_ids": b.input_ids, "positions": b.positions, "query_start_loc": b.query_start_loc,
            "seq_lens": b.seq_lens}


def _target_batch(g, num_reqs: int, max_q: int):
    """A target step: per request a query of 1..max_q tokens continuing from some computed length."""
    idx = torch.randperm(MAX_REQS, generator=g)[:num_reqs].to(torch.int64)
    q = torch.randint(1, max_q + 1, (num_reqs,), generator=g)
    qsl = torch.zeros(num_reqs + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(q, 0)
    computed = torch.randint(0, 60, (num_reqs,), generator=g)
    positions = torch.zeros(MAX_TOKENS, dtype=torch.int64)
    for r in range(num_reqs):
        positions[int(qsl[r]):int(qsl[r + 1])] = computed[r] + torch.arange(int(q[r]))
    batch = SimpleNamespace(
        num_reqs=num_reqs, idx_mapping=idx, query_start_loc=qsl, positions=positions,
        input_ids=_ints(g, 0, VOCAB, (MAX_TOKENS,)), seq_lens=(computed + q).to(torch.int32),
        num_scheduled_tokens=q.numpy().astype(np.int32))
    return batch, q


def _step_state(g, q):
    """Sampled/rejected counts of the step (a 0-sampled row is a chunked prefill) and the per-state tokens."""
    num_reqs = q.shape[0]
    num_sampled = _ints(g, 0, 3, (num_reqs,))
    num_sampled[0] = 0
    num_rejected = torch.minimum(_ints(g, 0, 3, (num_reqs,)), (q - 1).to(torch.int32))
    last_sampled = _ints(g, 0, VOCAB, (MAX_REQS, 1), torch.int64)
    next_prefill = _ints(g, 0, VOCAB, (2, MAX_REQS))
    return num_sampled, num_rejected, last_sampled, next_prefill


def case_gather_draft_sampled(g):
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler import gather_draft_sampled

    nr = 5
    counts = torch.randint(1, K + 2, (nr,), generator=g)
    n = int(counts.sum())
    indices = torch.sort(torch.randperm(MAX_TOKENS, generator=g)[:n]).values
    reqs = torch.randperm(MAX_REQS, generator=g)[:nr]
    expanded = torch.repeat_interleave(reqs, counts)
    local = torch.cat([torch.arange(int(c)) for c in counts]).to(torch.int32)
    positions = _ints(g, 0, 60, (MAX_TOKENS,), torch.int64)
    prefill_len = _ints(g, 0, 60, (MAX_REQS,))
    sampled, pos = gather_draft_sampled(_ints(g, 0, VOCAB, (MAX_TOKENS,)), positions, indices, expanded, local,
                                        prefill_len)
    return {"draft_sampled": sampled, "pos": pos}


def case_flatten_sampled(g):
    from vllm.v1.worker.gpu.spec_decode import rejection_sampler

    nr = 5
    counts = torch.randint(1, K + 2, (nr,), generator=g)
    cu = torch.zeros(nr + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(counts, 0)
    sampled = _ints(g, 0, VOCAB, (nr, K + 1), torch.int64)
    num_sampled = torch.minimum(_ints(g, 1, K + 2, (nr,)), counts.to(torch.int32))
    out = torch.zeros(int(cu[-1]), dtype=torch.int64)
    rejection_sampler._flatten_sampled_kernel[(nr,)](out, sampled, sampled.stride(0), num_sampled, cu, num_warps=1)
    return {"flat_sampled": out}


def case_eagle_prefill_inputs(g):
    from vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator import prepare_prefill_inputs

    batch, q = _target_batch(g, 5, 9)
    num_sampled, num_rejected, last_sampled, next_prefill = _step_state(g, q)
    buffers = _buffers(g)
    last = _ints(g, 0, 50, (MAX_REQS,), torch.int64)
    step = torch.tensor(2, dtype=torch.int64)
    prepare_prefill_inputs(last, step, buffers, batch, num_sampled, num_rejected, last_sampled, next_prefill,
                           MAX_REQS)
    return {**_buffer_outputs(buffers), "last_token_indices": last, "current_draft_step": step}


def _decode_inputs(g, advance: bool):
    from vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator import prepare_decode_inputs

    nr = 5
    drafts = _ints(g, 0, VOCAB, (MAX_REQS, K), torch.int64)
    buffers = _buffers(g)
    buffers.positions[:nr] = torch.tensor([3, 40, 126, 127, 9])
    seq_lens = torch.tensor([4, 41, 127, 128, 10], dtype=torch.int32)
    rejected = _ints(g, 0, 2, (nr,))
    src = _ints(g, 0, 100, (MAX_REQS,), torch.int64)
    prepare_decode_inputs(drafts[:nr, 0], seq_lens, rejected, buffers, src, 128, MAX_REQS,
                          advance_draft_positions=advance)
    return {**_buffer_outputs(buffers), "sample_src_positions": src}


def case_eagle_decode_inputs(g):
    return _decode_inputs(g, True)


def case_eagle_decode_inputs_fixed_positions(g):
    return _decode_inputs(g, False)


def _update(g, step: int):
    from vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator import update_draft_inputs

    nr = 5
    buffers = _buffers(g)
    buffers.positions[:nr] = torch.tensor([3, 40, 127, 126, 9])
    buffers.seq_lens[:nr] = torch.tensor([4, 41, 128, 127, 10], dtype=torch.int32)
    out_drafts = _ints(g, 0, VOCAB, (MAX_REQS, K), torch.int64)
    next_hidden = torch.randn(MAX_TOKENS, HIDDEN, generator=g)
    hidden = torch.randn(nr + 2, HIDDEN, generator=g)
    src = _ints(g, 0, 100, (MAX_REQS,), torch.int64)
    update_draft_inputs(_ints(g, 0, VOCAB, (nr,), torch.int64), torch.tensor(step), hidden, out_drafts,
                        next_hidden, buffers, src, nr, 128, K)
    return {**_buffer_outputs(buffers), "draft_tokens": out_drafts, "hidden_states": next_hidden,
            "sample_src_positions": src}


def case_eagle_update_inputs(g):
    return _update(g, 1)


def case_eagle_update_inputs_last_step(g):
    return _update(g, K - 1)


def _dflash(g, anchor: bool, cp_size: int = 1):
    from vllm.v1.worker.gpu.spec_decode.dflash.speculator import prepare_dflash_inputs

    batch, q = _target_batch(g, 5, 9)
    num_sampled, num_rejected, last_sampled, next_prefill = _step_state(g, q)
    buffers = _buffers(g)
    num_query = K if anchor else K + 1
    fills = {"query_slots": (MAX_TOKENS,), "context_positions": (MAX_TOKENS,), "context_slots": (MAX_TOKENS,),
             "sample_indices": (MAX_REQS * K,), "sample_pos": (MAX_REQS * K,), "sample_idx_mapping": (MAX_REQS * K,)}
    outs = {name: _ints(g, -5, 90, shape, torch.int64) for name, shape in fills.items()}
    temperature, seeds = torch.rand(MAX_REQS, generator=g), _ints(g, 0, 2**40, (MAX_REQS,), torch.int64)
    in_temperature, in_seeds = torch.rand(MAX_REQS, generator=g), _ints(g, 0, 2**40, (MAX_REQS,), torch.int64)
    block_table = _ints(g, 1, 40, (MAX_REQS, 8))
    block_table[1, 0] = 0  # an evicted (null) block: its slots must be PAD
    prepare_dflash_inputs(buffers, outs["query_slots"], outs["context_positions"], outs["context_slots"],
                          outs["sample_indices"], outs["sample_pos"], outs["sample_idx_mapping"], temperature, seeds,
                          batch, num_sampled, num_rejected, last_sampled, next_prefill[0], in_temperature, in_seeds,
                          block_table, 16, cp_size - 1, cp_size, 1, 7, num_query, K, MAX_REQS, MAX_TOKENS, 126,
                          sample_from_anchor=anchor)
    return {**_buffer_outputs(buffers), **outs, "temperature": temperature, "seeds": seeds}


def case_dflash_inputs(g):
    return _dflash(g, False)


def case_dspark_inputs_from_anchor(g):
    return _dflash(g, True)


def case_dflash_inputs_context_parallel(g):
    return _dflash(g, False, cp_size=2)


def _walk(g, probabilistic: bool, fp64: bool = False, naive: bool = False):
    from vllm.v1.worker.gpu.spec_decode.dflash2.speculator import CandidateSampler

    nr, top_k = 5, 6
    sampler = CandidateSampler(MAX_REQS, K, top_k, torch.device("cpu"))
    sampler.scores.copy_(torch.randn(sampler.scores.shape, generator=g))
    sampler.cached_candidate_ids.copy_(_ints(g, 0, VOCAB, sampler.cached_candidate_ids.shape, torch.int64))
    candidates = torch.stack([torch.randperm(VOCAB, generator=g)[:top_k] for _ in range(nr * K)]).view(nr, K, top_k)
    scores = torch.randn(nr, K, top_k, top_k, generator=g) * 3
    sample_pos = _ints(g, 1, 500, (MAX_REQS * K,), torch.int64)
    idx = torch.full((MAX_REQS * K,), -1, dtype=torch.int64)
    reqs = torch.randperm(MAX_REQS, generator=g)[:nr]
    idx[: nr * K] = reqs.repeat_interleave(K)
    idx[2 * K : 3 * K] = -1  # a padded row: the walk leaves it alone
    temperature = torch.rand(MAX_REQS, generator=g) + 0.5
    temperature[reqs[0]] = 0.0  # a greedy request among sampled ones
    seeds = _ints(g, 0, 2**40, (MAX_REQS,), torch.int64)
    drafts = _ints(g, 0, VOCAB, (MAX_REQS, K), torch.int64)
    draft_logits = torch.full((MAX_REQS, K, VOCAB), float("-inf")) if probabilistic else None
    args = (candidates, scores, nr, sample_pos, idx, temperature, seeds, drafts, draft_logits, fp64)
    (_naive_walk(sampler, *args) if naive else sampler.sample(*args))
    out = {"draft_tokens": drafts, "realized_scores": sampler.scores, "cached_candidates": sampler.cached_candidate_ids}
    if draft_logits is not None:
        out["draft_logits"] = draft_logits
    return out


@triton.jit
def _walk_choice_kernel(scores_ptr, keys_ptr, out_ptr, seed, pos, temp, top_k: tl.constexpr, BLOCK_K: tl.constexpr,
                        USE_FP64: tl.constexpr):
    """One step of `_selector_walk_kernel` for one row, through vLLM's own `gumbel_noised_argmax` (the walk kernel
    itself fails in Triton 3.9's interpreter on its `mask & valid` with a scalar `valid`)."""
    offsets = tl.arange(0, BLOCK_K)
    mask = offsets < top_k
    scores = tl.load(scores_ptr + offsets, mask=mask, other=float("-inf")).to(tl.float64 if USE_FP64 else tl.float32)
    keys = tl.load(keys_ptr + offsets, mask=mask, other=0)
    _, index = gumbel_noised_argmax(scores, keys, mask, seed, pos, temp, IS_DRAFTING=True, USE_FP64=USE_FP64)
    tl.store(out_ptr, index)


def _naive_walk(sampler, candidates, scores, nr, sample_pos, idx, temperature, seeds, drafts, draft_logits, fp64):
    """`CandidateSampler.sample` step by step: the walk's loop in Python, each choice by vLLM's device function."""
    top_k = sampler.top_k
    choice = torch.zeros(1, dtype=torch.int64)
    for row in range(nr):
        state = int(idx[row * K])
        if state < 0:
            continue
        temp = float(temperature[state]) if draft_logits is not None else 0.0
        previous = 0
        for step in range(K):
            flat = row * K + step
            row_scores = scores[row, step, previous].contiguous()
            cands = candidates[row, step].contiguous()
            _walk_choice_kernel[(1,)](row_scores, cands, choice, int(seeds[state]), int(sample_pos[flat]) - 1, temp,
                                      top_k=top_k, BLOCK_K=triton.next_power_of_2(top_k), USE_FP64=fp64)
            index = int(choice[0])
            sampler.scores[row, step] = row_scores
            drafts.view(-1)[flat] = cands[index]
            previous = index
    if draft_logits is not None:
        sampler._cache_draft_logits(candidates, nr * K, idx, draft_logits)


def case_dflash2_walk_greedy(g):
    return _walk(g, False)


def naive_dflash2_walk_greedy(g):
    return _walk(g, False, naive=True)


def case_dflash2_walk_sampled(g):
    return _walk(g, True)


def naive_dflash2_walk_sampled(g):
    return _walk(g, True, naive=True)


def case_dflash2_walk_sampled_fp64(g):
    return _walk(g, True, fp64=True)


def naive_dflash2_walk_sampled_fp64(g):
    return _walk(g, True, fp64=True, naive=True)


CASES = [name for name in list(globals()) if name.startswith("case_")]


def _compare(a: torch.Tensor, b: torch.Tensor):
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"shape/dtype {tuple(a.shape)}/{a.dtype} vs {tuple(b.shape)}/{b.dtype}"
    if torch.equal(a, b):
        return "equal"
    if a.is_floating_point():
        finite = torch.isfinite(a) & torch.isfinite(b)
        if not torch.equal(torch.isfinite(a), torch.isfinite(b)) or not torch.equal(a[~finite], b[~finite]):
            return "non-finite entries differ"
        return float((a[finite] - b[finite]).abs().max())
    return f"{int((a != b).sum())} of {a.numel()} entries differ"


def main() -> int:
    from vllm.triton_utils import HAS_TRITON

    assert type(current_platform).__name__ == "SimulatedNPUPlatform", type(current_platform)
    assert HAS_TRITON, "Triton's interpreter is not on"
    globs = globals()
    upstream, failed = {}, {}
    for i, name in enumerate(CASES):
        try:
            upstream[name] = {k: v.clone() for k, v in globs[name](_gen(i)).items()}
        except Exception as exc:  # noqa: BLE001 - reported: the kernel does not run in the interpreter
            failed[name] = f"{type(exc).__name__}: {exc}"[:300]
    from ascend_platform.simulated.kernel_overrides import register_for_lane

    register_for_lane()
    ours = {name: globs[name](_gen(i)) for i, name in enumerate(CASES)}
    for i, name in enumerate(CASES):  # vLLM's kernel cannot run in the interpreter: hold ours to a naive version
        if name in failed:
            upstream[name] = globs["naive_" + name.removeprefix("case_")](_gen(i))
    from ascend_platform import usage

    report = {name.removeprefix("case_"): {k: _compare(v, ours[name][k]) for k, v in outs.items()}
              for name, outs in upstream.items()}
    print(json.dumps({"report": report, "upstream_failed": failed, "usage": usage.snapshot()["counts"]}))
    return 0


if __name__ == "__main__":
    np.random.seed(0)
    sys.exit(main())
