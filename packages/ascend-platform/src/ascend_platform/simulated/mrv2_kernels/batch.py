"""Input preparation and post-step bookkeeping of Model Runner V2's batch (`vllm/v1/worker/gpu/input_batch.py`).

Per step MRV2 launches: positions/seq_lens, sampled+draft tokens into input_ids (with the logits indices), the
sampled/rejected counts, the post-step state update, and on prefill steps the prompt tokens. Each stand-in below is
vectorised over the batch; spec-decode-only branches (draft tokens) fall back to short per-request loops.
"""

from __future__ import annotations

import torch

from ascend_platform.simulated.mrv2_kernels import host_batch
from ascend_platform.simulated.mrv2_kernels.common import flat, rows_of


def prepare_pos_seq_lens(pos_ptr, seq_lens_ptr, idx_mapping_ptr, query_start_loc_ptr, num_computed_tokens_ptr,
                         max_num_reqs, BLOCK_SIZE=None, **_launch):
    """`_prepare_pos_seq_lens_kernel`: seq_len = computed + query length; positions continue from computed."""
    if host_batch.prepare_pos_seq_lens(pos_ptr, seq_lens_ptr, idx_mapping_ptr, query_start_loc_ptr,
                                       num_computed_tokens_ptr, max_num_reqs):
        return
    nr = idx_mapping_ptr.shape[0]
    qsl = query_start_loc_ptr[: nr + 1].long()
    lens = qsl[1:] - qsl[:-1]
    computed = flat(num_computed_tokens_ptr)[idx_mapping_ptr.long()].long()
    seq_lens = flat(seq_lens_ptr)
    seq_lens[:nr] = (computed + lens).to(seq_lens.dtype)
    seq_lens[nr:max_num_reqs] = 0
    n = int(qsl[nr]) if nr else 0
    if n == nr:  # one token per request (decode): its position is its computed length
        flat(pos_ptr)[:n] = computed.to(pos_ptr.dtype)
    elif n:
        seg, offset = rows_of(lens, n)
        flat(pos_ptr)[:n] = (computed[seg] + offset).to(pos_ptr.dtype)


def combine_sampled_and_draft_tokens(input_ids_ptr, idx_mapping_ptr, last_sampled_tokens_ptr, query_start_loc_ptr,
                                     seq_lens_ptr, prefill_len_ptr, draft_tokens_ptr, draft_tokens_stride,
                                     cu_num_logits_ptr, logits_indices_ptr, BLOCK_SIZE=None,
                                     NUM_NEW_SAMPLED_TOKENS=1, **_launch):
    """`_combine_sampled_and_draft_tokens_kernel`: logits indices, then the last sampled token and any drafts of
    requests past their prompt written into input_ids."""
    if host_batch.combine_sampled_and_draft_tokens(input_ids_ptr, idx_mapping_ptr, last_sampled_tokens_ptr,
                                                   query_start_loc_ptr, seq_lens_ptr, prefill_len_ptr, draft_tokens_ptr,
                                                   draft_tokens_stride, cu_num_logits_ptr, logits_indices_ptr,
                                                   NUM_NEW_SAMPLED_TOKENS):
        return
    nr = idx_mapping_ptr.shape[0]
    if nr == 0:
        return
    reqs = idx_mapping_ptr.long()
    cu = cu_num_logits_ptr[: nr + 1].long()
    num_logits = cu[1:] - cu[:-1]
    query_end = query_start_loc_ptr[1 : nr + 1].long()
    logits_start = query_end - num_logits
    total = logits_indices_ptr.shape[0]
    if total == nr:  # one logit per request: its last query token
        logits_indices_ptr.copy_(logits_start)
    else:
        seg, offset = rows_of(num_logits, total)
        logits_indices_ptr.copy_(logits_start[seg] + offset)

    seq_len = seq_lens_ptr[:nr].long()
    prefill_len = flat(prefill_len_ptr)[reqs].long()
    decoding = seq_len > prefill_len
    input_ids = flat(input_ids_ptr)
    if NUM_NEW_SAMPLED_TOKENS > 0:
        write = decoding & (seq_len - num_logits >= prefill_len)
        rows = write.nonzero().view(-1)
        if rows.numel():
            last = flat(last_sampled_tokens_ptr)[reqs[rows]]
            input_ids[logits_start[rows]] = last.to(input_ids.dtype)
    num_drafts = num_logits - NUM_NEW_SAMPLED_TOKENS
    draft_rows = (decoding & (num_drafts > 0)).nonzero().view(-1).tolist()
    for r in draft_rows:  # spec decode only
        k, end, req = int(num_drafts[r]), int(query_end[r]), int(reqs[r])
        start = req * draft_tokens_stride
        input_ids[end - k : end] = flat(draft_tokens_ptr)[start : start + k].to(input_ids.dtype)


def get_num_sampled_and_rejected(num_sampled_ptr, num_rejected_ptr, seq_lens_ptr, cu_num_logits_ptr,
                                 idx_mapping_ptr, prefill_len_ptr, **_launch):
    """`_get_num_sampled_and_rejected_kernel`: chunked-prefill rows sample and reject nothing."""
    if host_batch.get_num_sampled_and_rejected(num_sampled_ptr, num_rejected_ptr, seq_lens_ptr, cu_num_logits_ptr,
                                               idx_mapping_ptr, prefill_len_ptr):
        return
    nr = idx_mapping_ptr.shape[0]
    chunked = seq_lens_ptr[:nr] < flat(prefill_len_ptr)[idx_mapping_ptr.long()]
    sampled = torch.where(chunked, torch.zeros_like(num_sampled_ptr[:nr]), num_sampled_ptr[:nr])
    num_sampled_ptr[:nr] = sampled
    cu = cu_num_logits_ptr[: nr + 1]
    rejected = (cu[1:] - cu[:-1]).to(sampled.dtype) - sampled
    num_rejected_ptr[:nr] = torch.where(chunked, torch.zeros_like(rejected), rejected).to(num_rejected_ptr.dtype)


def post_update(idx_mapping_ptr, num_computed_tokens_ptr, last_sampled_tokens_ptr, output_bin_counts_ptr,
                output_bin_counts_stride, sampled_tokens_ptr, sampled_tokens_stride, num_sampled_ptr,
                num_rejected_ptr, query_start_loc_ptr, all_token_ids_ptr, all_token_ids_stride, total_len_ptr,
                **_launch):
    """`_post_update_kernel`: append the sampled tokens to each request's history (and penalty counts), advance
    total_len, last_sampled_tokens and num_computed_tokens; rows with a negative request index are skipped."""
    if host_batch.post_update(idx_mapping_ptr, num_computed_tokens_ptr, last_sampled_tokens_ptr, output_bin_counts_ptr,
                              output_bin_counts_stride, sampled_tokens_ptr, num_sampled_ptr, num_rejected_ptr,
                              query_start_loc_ptr, all_token_ids_ptr, all_token_ids_stride, total_len_ptr):
        return
    nr = idx_mapping_ptr.shape[0]
    if nr == 0:
        return
    reqs, num_sampled = idx_mapping_ptr.long(), num_sampled_ptr[:nr].long()
    sampled = sampled_tokens_ptr.reshape(sampled_tokens_ptr.shape[0], -1)[:nr]
    num_rejected = num_rejected_ptr[:nr].long()
    if query_start_loc_ptr is None:
        query_len = torch.zeros_like(num_sampled)
    else:
        qsl = query_start_loc_ptr[: nr + 1].long()
        query_len = qsl[1:] - qsl[:-1]
    if not bool((reqs >= 0).all()):
        keep = (reqs >= 0).nonzero().view(-1)
        reqs, num_sampled, sampled = reqs[keep], num_sampled[keep], sampled[keep]
        num_rejected, query_len = num_rejected[keep], query_len[keep]
    total_len = flat(total_len_ptr)
    start = total_len[reqs].long()
    has = (num_sampled > 0).nonzero().view(-1)
    if has.numel():
        rows, counts = reqs[has], num_sampled[has]
        flat(last_sampled_tokens_ptr)[rows] = sampled[has, counts - 1].to(last_sampled_tokens_ptr.dtype)
        if sampled.shape[1] == 1:  # no drafts: one token per row
            owner, tokens, slot = rows, sampled[has, 0], start[has]
        else:
            seg, offset = rows_of(counts, int(counts.sum()))
            owner, tokens, slot = rows[seg], sampled[has[seg], offset], start[has][seg] + offset
        history = flat(all_token_ids_ptr)
        history[owner * all_token_ids_stride + slot] = tokens.to(history.dtype)
        if output_bin_counts_ptr is not None:
            bins = flat(output_bin_counts_ptr)
            bins.index_put_((owner * output_bin_counts_stride + tokens,), torch.ones_like(tokens, dtype=bins.dtype),
                            accumulate=True)
        total_len[rows] = (start[has] + counts).to(total_len.dtype)
    computed = flat(num_computed_tokens_ptr)
    computed.index_add_(0, reqs, (query_len - num_rejected).to(computed.dtype))


def post_update_num_computed_tokens(idx_mapping_ptr, num_computed_tokens_ptr, query_start_loc_ptr, **_launch):
    """`_post_update_num_computed_tokens_kernel`: num_computed_tokens += query length."""
    nr = idx_mapping_ptr.shape[0]
    qsl = query_start_loc_ptr[: nr + 1]
    computed = flat(num_computed_tokens_ptr)
    computed.index_add_(0, idx_mapping_ptr.long(), (qsl[1:] - qsl[:-1]).to(computed.dtype))


def prepare_prefill_inputs(input_ids_ptr, next_prefill_tokens_ptr, next_prefill_tokens_stride, num_lookahead,
                           idx_mapping_ptr, query_start_loc_ptr, all_token_ids_ptr, all_token_ids_stride,
                           prefill_lens_ptr, num_computed_tokens_ptr, BLOCK_SIZE=None, LOOKAHEAD_BLOCK=None,
                           **_launch):
    """`_prepare_prefill_inputs_kernel`: copy each prefilling request's next prompt chunk into input_ids and its
    next `num_lookahead` prompt tokens (0 past the prompt) into next_prefill_tokens."""
    nr = idx_mapping_ptr.shape[0]
    reqs = idx_mapping_ptr.long()
    prefill_len = flat(prefill_lens_ptr)[reqs]
    computed = flat(num_computed_tokens_ptr)[reqs]
    rows = (computed < prefill_len).nonzero().view(-1).tolist()
    if not rows:
        return
    qsl = query_start_loc_ptr[: nr + 1].tolist()
    history, input_ids = flat(all_token_ids_ptr), flat(input_ids_ptr)
    lookahead = flat(next_prefill_tokens_ptr) if num_lookahead else None
    for r in rows:
        req, done, plen = int(reqs[r]), int(computed[r]), int(prefill_len[r])
        qs, qe = qsl[r], qsl[r + 1]
        base = req * all_token_ids_stride + done
        input_ids[qs:qe] = history[base : base + qe - qs]
        for j in range(num_lookahead):
            p = done + qe - qs + j
            token = history[req * all_token_ids_stride + p] if p < plen else 0
            lookahead[j * next_prefill_tokens_stride + req] = token


def expand_idx_mapping(idx_mapping_ptr, expanded_idx_mapping_ptr, expanded_local_pos_ptr, cu_num_logits_ptr,
                       BLOCK_SIZE=None, **_launch):
    """`_expand_idx_mapping_kernel`: one entry per logit (request index, position within the request)."""
    nr = idx_mapping_ptr.shape[0]
    cu = cu_num_logits_ptr[: nr + 1].long()
    counts = cu[1:] - cu[:-1]
    total = int(cu[nr]) if nr else 0
    if total:
        seg, offset = rows_of(counts, total)
        expanded_idx_mapping_ptr[:total] = idx_mapping_ptr[seg]
        expanded_local_pos_ptr[:total] = offset.to(expanded_local_pos_ptr.dtype)


def apply_staged_write(output_ptr, output_stride, write_indices_ptr, write_starts_ptr, write_contents_ptr,
                       write_cu_lens_ptr, write_group_ids_ptr, BLOCK_SIZE=None, MULTI_GROUP=False, **_launch):
    """`_apply_write_kernel` (single tensor): write each staged run of contents at row index, column start.
    The multi-group form takes a table of raw pointers; the simulated block tables never use it."""
    if MULTI_GROUP:
        raise NotImplementedError("the simulated lane applies block-table writes per group "
                                  "(AscendBlockTables.apply_staged_writes); the fused pointer form is not used")
    n = write_indices_ptr.shape[0]
    if n == 0:
        return
    cu = write_cu_lens_ptr[:n].long()
    lens = torch.diff(cu, prepend=cu.new_zeros(1))
    total = int(cu[-1])
    seg, offset = rows_of(lens, total)
    base = write_indices_ptr[:n].long() * output_stride + write_starts_ptr[:n].long()
    out = flat(output_ptr)
    out[base[seg] + offset] = write_contents_ptr[:total].to(out.dtype)
