"""Model Runner V2's per-step batch bookkeeping on its native loops (`native/mrv2_step.c`), for the simulated lane's
stand-ins of vLLM's `input_batch` Triton kernels (`ascend_platform.simulated.mrv2_kernels.batch`).

Each function takes the kernel's arguments as tensors and returns True when a loop did the work, False (nothing
written) when it does not take the call: no library, a tensor off the host, not int32 / int64 or not dense (the
kernels address their pointers as flat element arrays), or a trace under torch.compile. The caller then runs its
torch formulation, which is what these are held to (with vLLM's kernels, by the stand-ins' parity driver). An index
that reaches past an array raises IndexError naming the batch row; nothing is written then.
"""

from __future__ import annotations

import torch

from ascend_kernels.reference import native_build

_INDEX = (torch.int32, torch.int64)
_NULL = (None, 0, 0)


def _arr(t: torch.Tensor | None) -> tuple[int | None, int, int] | None:
    """(data pointer, is int64, elements) of a dense int32 / int64 host tensor; _NULL for None; None otherwise."""
    if t is None:
        return _NULL
    if type(t) is not torch.Tensor or not t.is_cpu or t.dtype not in _INDEX or not t.is_contiguous():
        return None
    return t.data_ptr(), int(t.dtype == torch.int64), t.numel()


def _arrays(*tensors: torch.Tensor | None) -> list[tuple[int | None, int, int]] | None:
    if torch.compiler.is_compiling():
        return None
    found = [_arr(t) for t in tensors]
    return None if any(a is None for a in found) else found


def _done(op: str, rc: int, what: str) -> bool:
    if rc == -1:
        raise ValueError(f"{op}: query_start_loc / cu_num_logits not non-decreasing within their outputs ({what})")
    if rc > 0:
        raise IndexError(f"{op}: batch row {rc - 1}'s request or tokens reach past the state arrays ({what})")
    native_build.record(op)
    return True


def prepare_pos_seq_lens(pos, seq_lens, idx_mapping, query_start_loc, num_computed_tokens, max_num_reqs: int) -> bool:
    lib = native_build.library()
    found = None if lib is None else _arrays(pos, seq_lens, idx_mapping, query_start_loc, num_computed_tokens)
    if not found:
        return False
    (p, p64, n_pos), (sl, sl64, n_sl), (ix, ix64, nr), (q, q64, n_q), (c, c64, n_c) = found
    if n_q < nr + 1:
        return False
    rc = lib.ak_mrv2_pos_seq_lens(p, p64, n_pos, sl, sl64, n_sl, ix, ix64, q, q64, c, c64, n_c, nr, max_num_reqs)
    return _done("prepare_pos_seq_lens", rc, f"{nr} requests, {n_c} request slots, {n_pos} positions")


def combine_sampled_and_draft_tokens(input_ids, idx_mapping, last_sampled_tokens, query_start_loc, seq_lens,
                                     prefill_len, draft_tokens, draft_tokens_stride: int, cu_num_logits,
                                     logits_indices, new_sampled: int) -> bool:
    lib = native_build.library()
    found = None if lib is None else _arrays(input_ids, idx_mapping, last_sampled_tokens, query_start_loc, seq_lens,
                                             prefill_len, draft_tokens, cu_num_logits, logits_indices)
    if not found:
        return False
    (ids, ids64, n_ids), (ix, ix64, nr), (ls, ls64, n_ls), (q, q64, n_q), (sl, sl64, n_sl), (pl, pl64, n_pl), \
        (d, d64, n_d), (cu, cu64, n_cu), (ind, ind64, n_ind) = found
    if n_q < nr + 1 or n_cu < nr + 1 or n_sl < nr:
        return False
    rc = lib.ak_mrv2_combine_tokens(ids, ids64, n_ids, ix, ix64, ls, ls64, min(n_ls, n_pl), q, q64, sl, sl64, pl, pl64,
                                    d, d64, draft_tokens_stride, n_d, cu, cu64, ind, ind64, n_ind, nr, new_sampled)
    return _done("combine_sampled_and_draft_tokens", rc, f"{nr} requests, {n_ids} input ids")


def get_num_sampled_and_rejected(num_sampled, num_rejected, seq_lens, cu_num_logits, idx_mapping,
                                 prefill_len) -> bool:
    lib = native_build.library()
    found = None if lib is None else _arrays(num_sampled, num_rejected, seq_lens, cu_num_logits, idx_mapping,
                                             prefill_len)
    if not found:
        return False
    (ns, ns64, n_ns), (rj, rj64, n_rj), (sl, sl64, n_sl), (cu, cu64, n_cu), (ix, ix64, nr), (pl, pl64, n_pl) = found
    if min(n_ns, n_rj, n_sl) < nr or n_cu < nr + 1:
        return False
    rc = lib.ak_mrv2_num_sampled(ns, ns64, rj, rj64, sl, sl64, cu, cu64, ix, ix64, pl, pl64, n_pl, nr)
    return _done("get_num_sampled_and_rejected", rc, f"{nr} requests, {n_pl} request slots")


def post_update(idx_mapping, num_computed_tokens, last_sampled_tokens, output_bin_counts,
                output_bin_counts_stride: int, sampled_tokens, num_sampled, num_rejected, query_start_loc,
                all_token_ids, all_token_ids_stride: int, total_len) -> bool:
    lib = native_build.library()
    found = None if lib is None else _arrays(idx_mapping, num_computed_tokens, last_sampled_tokens, output_bin_counts,
                                             sampled_tokens, num_sampled, num_rejected, query_start_loc, all_token_ids,
                                             total_len)
    if not found:
        return False
    (ix, ix64, nr), (c, c64, n_c), (ls, ls64, n_ls), (bc, bc64, n_bc), (s, s64, n_s), (ns, ns64, n_ns), \
        (rj, rj64, n_rj), (q, q64, n_q), (h, h64, n_h), (tl, tl64, n_tl) = found
    rows = sampled_tokens.shape[0] if sampled_tokens.dim() else 0
    width = n_s // rows if rows else 0
    if min(n_ns, n_rj, rows) < nr or (q is not None and n_q < nr + 1):
        return False
    n_state = min(n_c, n_ls, n_tl, n_h // all_token_ids_stride if all_token_ids_stride else 0,
                  n_bc // output_bin_counts_stride if bc is not None and output_bin_counts_stride else n_c)
    rc = lib.ak_mrv2_post_update(ix, ix64, c, c64, ls, ls64, n_state, bc, bc64, output_bin_counts_stride, s, s64,
                                 width, ns, ns64, rj, rj64, q, q64, h, h64, all_token_ids_stride, tl, tl64, nr)
    return _done("post_update", rc, f"{nr} requests, {n_state} request slots")


def gather_block_table(src, counts, idx_mapping, dst, num_reqs_padded: int) -> bool:
    """One KV cache group's block table rows of the batch's requests (`src[idx_mapping]`) into its input table
    `dst`, entries past a request's block count (`counts[req]`) left as they were, rows up to num_reqs_padded
    zeroed; vLLM's `_gather_block_tables_kernel`'s work for that group."""
    lib = native_build.library()
    if lib is None or src.dim() != 2 or dst.dim() != 2 or src.shape[1] != dst.shape[1]:
        return False
    found = _arrays(src, counts, idx_mapping, dst)
    if not found:
        return False
    (s, s64, _), (c, c64, n_c), (ix, ix64, nr), (d, d64, _) = found
    if nr > num_reqs_padded or num_reqs_padded > dst.shape[0]:
        return False
    rc = lib.ak_mrv2_gather_block_table(s, s64, src.shape[0], c, c64, n_c, ix, ix64, nr, d, d64, dst.shape[0],
                                        src.shape[1], num_reqs_padded)
    return _done("gather_block_tables", rc, f"{nr} requests, {src.shape[0]} table rows, {n_c} block counts")
