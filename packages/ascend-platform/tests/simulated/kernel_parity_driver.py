"""Runs vLLM's MRV2 kernel launchers twice on identical inputs: first with vLLM's Triton kernels in Triton's
interpreter, then with the simulated lane's stand-ins registered through vLLM's dispatcher, and prints one JSON line
{case: {output: "equal" | max abs difference | mismatch count}} (a script, not a test module).

Run with ASCEND_VLLM_SIMULATE=1 (the simulated platform turns the interpreter on when vLLM resolves it).
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch

VOCAB, MAX_REQS, MAX_TOKENS, MAX_LEN = 300, 8, 64, 128


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _batch(g: torch.Generator, num_reqs: int, max_q: int = 9):
    idx = torch.randperm(MAX_REQS, generator=g)[:num_reqs].to(torch.int64)
    q = torch.randint(1, max_q, (num_reqs,), generator=g)
    qsl = torch.full((MAX_REQS + 1,), int(q.sum()), dtype=torch.int32)
    qsl[0] = 0
    qsl[1 : num_reqs + 1] = torch.cumsum(q, 0)
    return idx, q, qsl


def case_prepare_pos_seq_lens(g):
    from vllm.v1.worker.gpu.input_batch import prepare_pos_seq_lens

    idx, _, qsl = _batch(g, 5)
    computed = torch.randint(0, 60, (MAX_REQS,), generator=g, dtype=torch.int32)
    pos = torch.randint(-9, 9, (MAX_TOKENS,), generator=g)
    seq_lens = torch.randint(-9, 9, (MAX_REQS,), generator=g, dtype=torch.int32)
    prepare_pos_seq_lens(idx, qsl[:6], computed, pos, seq_lens)
    return {"positions": pos, "seq_lens": seq_lens}


def _combine(g, drafts: int, new_sampled: int):
    from vllm.v1.worker.gpu.input_batch import combine_sampled_and_draft_tokens

    nr = 6
    idx = torch.randperm(MAX_REQS, generator=g)[:nr].to(torch.int64)
    num_logits = torch.randint(0, drafts + 1, (nr,), generator=g) + new_sampled if drafts else torch.full((nr,), 1)
    q = num_logits + torch.randint(0, 4, (nr,), generator=g)
    qsl = torch.zeros(nr + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(q, 0)
    cu = torch.zeros(nr + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(num_logits, 0)
    prefill_len = torch.randint(5, 30, (MAX_REQS,), generator=g, dtype=torch.int32)
    seq_lens = prefill_len[idx] + torch.randint(-4, 5, (nr,), generator=g, dtype=torch.int32)
    input_ids = torch.randint(0, VOCAB, (MAX_TOKENS,), generator=g, dtype=torch.int32)
    last = torch.randint(0, VOCAB, (MAX_REQS, 1), generator=g)
    draft_tokens = torch.randint(0, VOCAB, (MAX_REQS, drafts), generator=g)
    indices = combine_sampled_and_draft_tokens(input_ids, idx, last, qsl, seq_lens, prefill_len, draft_tokens, cu,
                                               int(cu[-1]), new_sampled)
    return {"input_ids": input_ids, "logits_indices": indices}


def case_combine_tokens(g):
    return _combine(g, 0, 1)


def case_combine_tokens_with_drafts(g):
    return _combine(g, 3, 1)


def case_combine_tokens_no_bonus(g):
    return _combine(g, 3, 0)


def case_num_sampled_and_rejected(g):
    from vllm.v1.worker.gpu.input_batch import get_num_sampled_and_rejected

    nr = 6
    idx = torch.randperm(MAX_REQS, generator=g)[:nr].to(torch.int64)
    cu = torch.zeros(nr + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.randint(1, 4, (nr,), generator=g), 0)
    prefill_len = torch.randint(5, 30, (MAX_REQS,), generator=g, dtype=torch.int32)
    seq_lens = prefill_len[idx] + torch.randint(-3, 4, (nr,), generator=g, dtype=torch.int32)
    num_sampled = torch.randint(0, 3, (nr,), generator=g, dtype=torch.int32)
    sampled, rejected = get_num_sampled_and_rejected(num_sampled, seq_lens, cu, idx, prefill_len)
    return {"num_sampled": sampled, "num_rejected": rejected}


def _post_update(g, with_counts: bool, with_qsl: bool):
    from vllm.v1.worker.gpu.input_batch import post_update

    nr, k = 6, 3
    idx = torch.randperm(MAX_REQS, generator=g)[:nr].to(torch.int64)
    idx[2] = -1
    computed = torch.randint(0, 50, (MAX_REQS,), generator=g, dtype=torch.int32)
    last = torch.randint(0, VOCAB, (MAX_REQS, 1), generator=g)
    counts = torch.randint(0, 3, (MAX_REQS, VOCAB), generator=g, dtype=torch.int32) if with_counts else None
    sampled = torch.randint(0, VOCAB, (nr, k + 1), generator=g)
    sampled[0, :] = 7  # the same token twice: counts accumulate
    num_sampled = torch.randint(0, k + 2, (nr,), generator=g, dtype=torch.int32)
    num_rejected = torch.randint(0, 2, (nr,), generator=g, dtype=torch.int32)
    qsl = torch.zeros(nr + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.randint(1, 6, (nr,), generator=g), 0)
    history = torch.randint(0, VOCAB, (MAX_REQS, MAX_LEN), generator=g, dtype=torch.int32)
    total_len = torch.randint(10, 100, (MAX_REQS,), generator=g, dtype=torch.int32)
    post_update(idx, computed, last, counts, sampled, num_sampled, num_rejected, qsl if with_qsl else None, history,
                total_len)
    out = {"num_computed": computed, "last_sampled": last, "all_token_ids": history, "total_len": total_len}
    if counts is not None:
        out["output_bin_counts"] = counts
    return out


def case_post_update(g):
    return _post_update(g, True, True)


def case_post_update_no_counts_no_qsl(g):
    return _post_update(g, False, False)


def case_post_update_num_computed_tokens(g):
    from vllm.v1.worker.gpu.input_batch import post_update_num_computed_tokens

    idx, _, qsl = _batch(g, 5)
    computed = torch.randint(0, 50, (MAX_REQS,), generator=g, dtype=torch.int32)
    post_update_num_computed_tokens(idx, computed, qsl[:6])
    return {"num_computed": computed}


def _prefill(g, lookahead: int):
    from vllm.v1.worker.gpu.input_batch import prepare_prefill_inputs

    idx, q, qsl = _batch(g, 5)
    prefill_len = torch.randint(5, 40, (MAX_REQS,), generator=g, dtype=torch.int32)
    computed = (prefill_len - torch.randint(-3, 12, (MAX_REQS,), generator=g, dtype=torch.int32)).clamp(min=0)
    history = torch.randint(0, VOCAB, (MAX_REQS, MAX_LEN), generator=g, dtype=torch.int32)
    input_ids = torch.randint(0, VOCAB, (MAX_TOKENS,), generator=g, dtype=torch.int32)
    nxt = torch.randint(0, VOCAB, (lookahead, MAX_REQS), generator=g, dtype=torch.int32)
    prepare_prefill_inputs(input_ids, nxt, idx, qsl[:6], history, prefill_len, computed)
    return {"input_ids": input_ids, "next_prefill_tokens": nxt}


def case_prepare_prefill_inputs(g):
    return _prefill(g, 1)


def case_prepare_prefill_inputs_lookahead(g):
    return _prefill(g, 2)


def case_expand_idx_mapping(g):
    from vllm.v1.worker.gpu.input_batch import expand_idx_mapping

    nr = 5
    idx = torch.randperm(MAX_REQS, generator=g)[:nr].to(torch.int64)
    cu = torch.zeros(nr + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.randint(1, 5, (nr,), generator=g), 0)
    expanded, local = expand_idx_mapping(idx, int(cu[-1]), cu, 4)
    return {"expanded_idx_mapping": expanded, "expanded_local_pos": local}


def _staged(g, shape):
    from vllm.v1.worker.gpu.buffer_utils import StagedWriteTensor

    t = StagedWriteTensor(shape, dtype=torch.int32, device=torch.device("cpu"))
    rows = shape if isinstance(shape, int) else shape[0]
    cols = 1 if isinstance(shape, int) else shape[1]
    for _ in range(5):
        row = int(torch.randint(0, rows, (1,), generator=g))
        start = int(torch.randint(0, cols, (1,), generator=g))
        n = 1 if isinstance(shape, int) else int(torch.randint(1, cols - start + 1, (1,), generator=g))
        t.stage_write(row, start, torch.randint(0, 999, (n,), generator=g).tolist())
    t.apply_write()
    return {"tensor": t.gpu}


def case_apply_write_2d(g):
    return _staged(g, (MAX_REQS, 16))


def case_apply_write_1d(g):
    return _staged(g, MAX_REQS)


def _gumbel(g, *, fp64=False, drafting=False, apply_temperature=True, cache=False, padded=True, greedy=False,
            dtype=torch.float32):
    from vllm.v1.worker.gpu.sample.gumbel import gumbel_sample

    n = 7
    logits = (torch.randn(n, VOCAB, generator=g) * 2).to(dtype)
    if greedy:
        logits[1, [3, VOCAB - 2]] = 40.0  # a tie: the lowest id
    idx = torch.randint(0, MAX_REQS, (n,), generator=g)
    if padded:
        idx[3] = -1
    temperature = torch.rand(MAX_REQS, generator=g) + 0.3
    temperature[idx[0]] = 0.0
    if greedy:
        temperature.zero_()
    seeds = torch.randint(-(2**62), 2**62, (MAX_REQS,), generator=g)
    pos = torch.randint(0, 2000, (n,), generator=g)
    logits_cache = torch.zeros(MAX_REQS, 2, VOCAB) if cache else None
    col = torch.tensor(1) if cache else None
    sampled = gumbel_sample(logits, idx, temperature, seeds, pos, apply_temperature, drafting,
                            logits_cache=logits_cache, logits_cache_col=col, use_fp64=fp64)
    out = {"sampled": sampled}
    if cache:
        out["logits_cache"] = logits_cache
    return out


def case_gumbel_sample(g):
    return _gumbel(g)


def case_gumbel_sample_no_padding_rows(g):
    return _gumbel(g, padded=False)


def case_gumbel_sample_greedy(g):
    return _gumbel(g, greedy=True)


def case_gumbel_sample_greedy_bf16_fp64(g):
    return _gumbel(g, greedy=True, dtype=torch.bfloat16, fp64=True)


def case_gumbel_sample_fp64(g):
    return _gumbel(g, fp64=True)


def case_gumbel_sample_drafting_no_temperature(g):
    return _gumbel(g, drafting=True, apply_temperature=False)


def check_gumbel_logits_cache(g):
    """Spec decode's draft-logits cache (vLLM's kernel trips the interpreter here: a scalar store mask), so our
    stand-in is held to the kernel's contract directly: valid rows land in cache[request, column]."""
    logits = torch.randn(7, VOCAB, generator=g)
    out = _gumbel(torch.Generator().manual_seed(5), cache=True)
    del logits
    g2 = torch.Generator().manual_seed(5)
    logits = torch.randn(7, VOCAB, generator=g2) * 2
    idx = torch.randint(0, MAX_REQS, (7,), generator=g2)
    idx[3] = -1
    expected = torch.zeros(MAX_REQS, 2, VOCAB)
    for row, req in enumerate(idx.tolist()):
        if req >= 0:
            expected[req, 1] = logits[row]
    return _compare(expected, out["logits_cache"])


def case_logprobs(g):
    from vllm.v1.worker.gpu.sample.logprob import compute_topk_scores

    logits = torch.randn(5, VOCAB, generator=g) * 3
    sampled = torch.randint(0, VOCAB, (5,), generator=g)
    scores = compute_topk_scores(logits, 4, sampled)
    return {"token_ids": scores.logprob_token_ids, "logprobs": scores.logprobs, "ranks": scores.selected_token_ranks}


def case_temperature(g):
    from vllm.v1.worker.gpu.sample.gumbel import apply_temperature

    logits = torch.randn(6, VOCAB, generator=g)
    idx = torch.randint(0, MAX_REQS, (6,), generator=g)
    temperature = torch.rand(MAX_REQS, generator=g) + 0.2
    temperature[idx[0]], temperature[idx[1]] = 0.0, 1.0
    apply_temperature(logits, idx, temperature)
    return {"logits": logits}


def case_min_p(g):
    from vllm.v1.worker.gpu.sample.min_p import apply_min_p

    logits = torch.randn(6, VOCAB, generator=g) * 3
    idx = torch.randint(0, MAX_REQS, (6,), generator=g)
    min_p = torch.rand(MAX_REQS, generator=g) * 0.3
    min_p[idx[0]] = 0.0
    apply_min_p(logits, idx, min_p)
    return {"logits": logits}


def case_penalties_and_bincount(g):
    from vllm.v1.worker.gpu.sample.penalties import apply_penalties, bincount

    history = torch.randint(0, VOCAB, (MAX_REQS, MAX_LEN), generator=g, dtype=torch.int32)
    prompt_len = torch.randint(1, 60, (MAX_REQS,), generator=g, dtype=torch.int32)
    prefill_len = prompt_len + torch.randint(0, 10, (MAX_REQS,), generator=g, dtype=torch.int32)
    prompt_mask = torch.zeros(MAX_REQS, (VOCAB + 31) // 32, dtype=torch.int32)
    counts = torch.randint(0, 2, (MAX_REQS, VOCAB), generator=g, dtype=torch.int32)
    new_reqs = torch.tensor([1, 4, 6])
    bincount(new_reqs, history, prompt_len, prefill_len, prompt_mask, counts, int(prefill_len[new_reqs].max()))
    n = 6
    logits = torch.randn(n, VOCAB, generator=g) * 2
    idx = torch.tensor([1, 4, 4, 4, 6, 0])
    local_pos = torch.tensor([0, 0, 1, 2, 0, 0], dtype=torch.int32)  # request 4 verifies two draft tokens
    token_ids = torch.randint(0, VOCAB, (n,), generator=g, dtype=torch.int32)
    rep = torch.ones(MAX_REQS)
    rep[[1, 4]] = torch.tensor([1.3, 0.8])
    freq = torch.zeros(MAX_REQS)
    freq[[4, 6]] = torch.tensor([0.5, -0.2])
    pres = torch.zeros(MAX_REQS)
    pres[[1, 6]] = torch.tensor([0.7, 0.1])
    apply_penalties(logits, idx, token_ids, local_pos, rep, freq, pres, prompt_mask, counts)
    return {"prompt_bin_mask": prompt_mask, "output_bin_counts": counts, "logits": logits}


def _top_k_top_p_inputs(g):
    logits = torch.randn(6, VOCAB, generator=g) * 2
    k = torch.tensor([1, 5, VOCAB, 20, 3, VOCAB], dtype=torch.int32)
    p = torch.tensor([0.9, 1.0, 0.5, 0.95, 1.0, 0.3])
    return logits, k, p


def case_top_k_top_p(g):
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    logits, k, p = _top_k_top_p_inputs(g)
    return {"kept": ~torch.isinf(apply_top_k_top_p(logits.clone(), k, p))}


def naive_top_k_top_p(g):
    """Keep the k largest, then the smallest top set whose mass reaches p."""
    logits, k, p = _top_k_top_p_inputs(g)
    kept = torch.zeros(logits.shape, dtype=torch.bool)
    for r in range(logits.shape[0]):
        order = logits[r].argsort(descending=True)[: int(k[r])]
        probs = torch.softmax(logits[r, order], dim=-1)
        n = int((torch.cumsum(probs, 0) - probs < p[r]).sum())
        kept[r, order[:n]] = True
    return {"kept": kept}


def _grammar_inputs(g):
    stride = 4  # MASK_STRIDE: positions per request
    logits = torch.randn(9, VOCAB, generator=g)
    cu = torch.tensor([0, 2, 3, 6, 9], dtype=torch.int32)  # four requests with 2, 1, 3, 3 logits rows
    mapping = torch.tensor([0 * stride + 1, 1 * stride + 0, 1 * stride + 2, 3 * stride + 2], dtype=torch.int32)
    words = (VOCAB + 31) // 32 + 1  # a wider bitmask buffer than the vocabulary needs
    bitmask = torch.randint(-(2**31), 2**31 - 1, (4, words), generator=g, dtype=torch.int32)
    return logits, cu, mapping, bitmask, stride


def case_grammar_bitmask(g):
    from vllm.triton_utils import triton
    from vllm.v1.worker.gpu.structured_outputs import _apply_grammar_bitmask_kernel

    logits, cu, mapping, bitmask, stride = _grammar_inputs(g)
    grid = (mapping.shape[0], triton.cdiv(VOCAB, 8192))
    _apply_grammar_bitmask_kernel[grid](logits, logits.stride(0), mapping, cu, bitmask, bitmask.stride(0), VOCAB,
                                        MASK_STRIDE=stride, BLOCK_SIZE=8192)
    return {"logits": logits}


def naive_grammar_bitmask(g):
    """Tokens whose bit is 0 become -inf in the mask's row; position 2 of request 1 (one row) is inactive."""
    logits, cu, mapping, bitmask, stride = _grammar_inputs(g)
    for m, index in enumerate(mapping.tolist()):
        req, pos = divmod(index, stride)
        if pos >= int(cu[req + 1] - cu[req]):
            continue
        row = int(cu[req]) + pos
        for token in range(VOCAB):
            if not (int(bitmask[m, token // 32]) >> (token % 32)) & 1:
                logits[row, token] = float("-inf")
    return {"logits": logits}


def _block_tables(g, block_sizes, stand_in: bool):
    from vllm.v1.worker.gpu.block_table import BlockTables

    from ascend_platform.simulated.mrv2_kernels.block_tables import SimulatedBlockTables

    cls = SimulatedBlockTables if stand_in else BlockTables
    tables = cls(block_sizes=block_sizes, max_num_reqs=MAX_REQS, max_num_batched_tokens=MAX_TOKENS,
                 max_num_blocks_per_group=[8] * len(block_sizes), device=torch.device("cpu"))
    for req in range(MAX_REQS):
        ids = tuple(torch.randint(1, 99, (int(torch.randint(1, 5, (1,), generator=g)),), generator=g).tolist()
                    for _ in block_sizes)
        tables.append_block_ids(req, ids, overwrite=False)
    tables.apply_staged_writes()
    tables.append_block_ids(2, tuple([55] for _ in block_sizes), overwrite=False)  # a second write to one row
    tables.apply_staged_writes()
    idx, q, qsl = _batch(g, 5)
    idx[1] = -1
    for bt in tables.input_block_tables:
        bt.fill_(-7)  # stale contents: the gather must leave entries past num_blocks alone and zero padded rows
    gathered = tables.gather_block_tables(idx.clamp(min=0), num_reqs_padded=7)
    positions = torch.zeros(MAX_TOKENS, dtype=torch.int64)
    n = int(qsl[5])
    positions[:n] = torch.randint(0, 60, (n,), generator=g)
    tables.slot_mappings.fill_(12345)
    slots = tables.compute_slot_mappings(idx, qsl[:6], positions[:n + 3], n + 3)
    out = {f"gathered{i}": t for i, t in enumerate(gathered)}
    out.update(slot_mappings=tables.slot_mappings.clone(), returned=slots)
    return out


from logits_kernel_cases import *  # noqa: E402, F403 - more case_* functions (this file stays short)

CASES = [name for name in list(globals()) if name.startswith("case_")]
# The stand-ins with a host (numpy) path, `mrv2_kernels.host_batch`: each case also runs with it off.
HOST_CASES = {name for name in CASES
              if name.startswith(("case_prepare_pos", "case_combine", "case_num_sampled", "case_post_update",
                                  "case_gumbel", "case_temperature"))}
BLOCK_TABLE_CASES = {"block_tables_one_group": [32], "block_tables_two_groups": [16, 32]}


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
    from vllm.platforms import current_platform  # resolves the simulated platform: Triton's interpreter goes on
    from vllm.triton_utils import HAS_TRITON

    assert type(current_platform).__name__ == "SimulatedNPUPlatform", type(current_platform)
    assert HAS_TRITON, "Triton's interpreter is not on"
    globs = globals()
    upstream, failed = {}, {}
    for i, name in enumerate(CASES):
        try:
            upstream[name] = globs[name](_gen(i))
        except Exception as exc:  # noqa: BLE001 - reported: the kernel does not run in the interpreter
            failed[name] = f"{type(exc).__name__}: {exc}"[:300]
    upstream.update({name: _block_tables(_gen(100 + i), sizes, False)
                     for i, (name, sizes) in enumerate(BLOCK_TABLE_CASES.items())})
    from ascend_platform.simulated.kernel_overrides import register_for_lane

    register_for_lane()
    from ascend_platform.simulated.mrv2_kernels import host_batch

    ours = {name: globs[name](_gen(i)) for i, name in enumerate(CASES)}
    from ascend_kernels.reference import native_build

    # the torch formulation (host paths and the reference's native loops off), which the emulated NPU's tensors take,
    # held to the same
    with host_batch.disabled(), native_build.suspended():
        ours_torch = {name: globs[name](_gen(i)) for i, name in enumerate(CASES) if name in HOST_CASES}
    for i, name in enumerate(CASES):  # vLLM's kernel cannot run in the interpreter: hold ours to a naive version
        if name in failed:
            upstream[name] = globs["naive_" + name.removeprefix("case_")](_gen(i))
    ours.update({name: _block_tables(_gen(100 + i), sizes, True)
                 for i, (name, sizes) in enumerate(BLOCK_TABLE_CASES.items())})
    with host_batch.disabled(), native_build.suspended():
        ours_torch.update({name: _block_tables(_gen(100 + i), sizes, True)
                           for i, (name, sizes) in enumerate(BLOCK_TABLE_CASES.items())})
    from ascend_platform import usage

    report = {name.removeprefix("case_"): {k: _compare(v, ours[name][k]) for k, v in outs.items()}
              for name, outs in upstream.items()}
    report.update({name.removeprefix("case_") + "@torch": {k: _compare(v, ours_torch[name][k])
                                                         for k, v in upstream[name].items()}
                   for name in ours_torch})
    report["gumbel_logits_cache_contract"] = {"logits_cache": check_gumbel_logits_cache(_gen(999))}
    from ascend_platform.simulated import triton_interpreter

    library = {"interpreted": triton_interpreter.library_interpreted(), "ready": triton_interpreter.library_ready()}
    print(json.dumps({"report": report, "upstream_failed": failed, "usage": usage.snapshot()["counts"],
                      "native_calls": native_build.calls(), "triton_library": library}))
    return 0


if __name__ == "__main__":
    np.random.seed(0)
    sys.exit(main())
