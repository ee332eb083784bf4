"""Model Runner V2's sampling kernels (`vllm/v1/worker/gpu/sample/`, `structured_outputs.py`): Gumbel-max sampling,
logprobs, temperature, min-p, penalties and the structured-output bitmask.

Sampling and logprobs call `ascend_kernels` ops (`gumbel_sample` reproduces MRV2's counter-based noise, so seeded
requests draw what vLLM's kernel draws); the logits processors are a few torch ops each. Rows are selected by the
request index of each logits row (`expanded_idx_mapping`), exactly as the kernels read their per-request state.
"""

from __future__ import annotations

import torch

from ascend_platform.facade import kernel_ops
from ascend_platform.simulated.mrv2_kernels import host_batch
from ascend_platform.simulated.mrv2_kernels.common import flat, rows_of, unpack_bits

_DRAFT_NOISE_SALT = 1 << 30  # vLLM's offset keeping a draft's noise apart from the target's


def gumbel_sample(local_argmax_ptr, local_argmax_stride, local_max_ptr, local_max_stride, logits_cache_ptr,
                  logits_cache_stride_0, logits_cache_stride_1, logits_cache_col_ptr, logits_cache_source_ptr,
                  logits_cache_source_stride, logits_ptr, logits_stride, expanded_idx_mapping_ptr, seeds_ptr, pos_ptr,
                  temp_ptr, vocab_size, BLOCK_SIZE=None, IS_DRAFTING=False, APPLY_TEMPERATURE=True, USE_FP64=False,
                  PER_TOKEN_COL=False, **_launch):
    """`_gumbel_sample_kernel`: the whole row's winner goes to block column 0 (the launcher's per-block reduction
    then picks it); the draft-logits cache is filled first when given."""
    salt = _DRAFT_NOISE_SALT if IS_DRAFTING else 0
    host = host_batch.on_host("gumbel_sample", expanded_idx_mapping_ptr, temp_ptr, seeds_ptr, pos_ptr, local_argmax_ptr,
                              local_max_ptr)
    if host and logits_cache_ptr is None and host_batch.gumbel_greedy(
            logits_ptr[:, :vocab_size], expanded_idx_mapping_ptr, temp_ptr, local_argmax_ptr, local_max_ptr):
        return  # every row greedy: their argmax in one native call
    if logits_cache_ptr is not None or not host:
        reqs = expanded_idx_mapping_ptr.long()
        valid = reqs >= 0
        safe = reqs.clamp(min=0)
    if logits_cache_ptr is not None:
        rows = valid.nonzero().view(-1)
        col = logits_cache_col_ptr[rows].long() if PER_TOKEN_COL else logits_cache_col_ptr.long().view(-1)[0]
        logits_cache_ptr[safe[rows], col, :vocab_size] = logits_cache_source_ptr[rows, :vocab_size]
    if host:
        temperature, seeds, positions = host_batch.gumbel_rows(expanded_idx_mapping_ptr, temp_ptr, seeds_ptr, pos_ptr,
                                                               salt)
    else:
        temperature = torch.where(valid, flat(temp_ptr)[safe].float(), torch.zeros((), dtype=torch.float32))
        seeds = torch.where(valid, flat(seeds_ptr)[safe].long(), torch.zeros((), dtype=torch.long))
        positions = pos_ptr.long() + salt
    sampled = kernel_ops().gumbel_sample(logits_ptr[:, :vocab_size], temperature, seeds, positions,
                                         apply_temperature=bool(APPLY_TEMPERATURE), fp64=bool(USE_FP64))
    if host:
        host_batch.write_gumbel_winners(local_argmax_ptr, local_max_ptr, sampled)
        return
    local_argmax_ptr[:, 0] = sampled
    local_max_ptr[:, 0] = 0.0
    local_max_ptr[:, 1:] = float("-inf")


def topk_log_softmax(output_ptr, logits_ptr, logits_stride, topk_ids_ptr, topk_ids_stride, topk, vocab_size,
                     BLOCK_SIZE=None, TOPK_BLOCK_SIZE=None, **_launch):
    """`_topk_log_softmax_kernel`: log-probabilities of the requested token ids per row."""
    logprobs = kernel_ops().gather_logprobs(logits_ptr[:, :vocab_size], topk_ids_ptr[:, :topk])
    output_ptr.view(logits_ptr.shape[0], topk).copy_(logprobs)


def ranks(output_ptr, logits_ptr, logits_stride, token_ids_ptr, vocab_size, BLOCK_SIZE=None, **_launch):
    """`_ranks_kernel`: rank of each row's sampled token."""
    output_ptr.copy_(kernel_ops().token_ranks(logits_ptr[:, :vocab_size], token_ids_ptr.view(-1)))


def temperature(logits_ptr, logits_stride, expanded_idx_mapping_ptr, temperature_ptr, vocab_size, BLOCK_SIZE=None,
                **_launch):
    """`_temperature_kernel`: divide rows by their temperature (0 and 1 leave the row alone)."""
    if host_batch.temperature_rows(logits_ptr[:, :vocab_size], expanded_idx_mapping_ptr, temperature_ptr):
        return
    temp = flat(temperature_ptr)[expanded_idx_mapping_ptr.long()].float()
    rows = ((temp != 0.0) & (temp != 1.0)).nonzero().view(-1)
    if rows.numel():
        view = logits_ptr[:, :vocab_size]
        view[rows] = (view[rows].float() / temp[rows, None]).to(view.dtype)


def min_p(logits_ptr, logits_stride, expanded_idx_mapping_ptr, min_p_ptr, vocab_size, BLOCK_SIZE=None, **_launch):
    """`_min_p_kernel`: mask logits below max + log(min_p) (rows with min_p 0 untouched)."""
    p = flat(min_p_ptr)[expanded_idx_mapping_ptr.long()].float()
    rows = (p != 0.0).nonzero().view(-1)
    if rows.numel():
        view = logits_ptr[:, :vocab_size]
        sub = view[rows]
        threshold = sub.float().max(dim=-1, keepdim=True).values + torch.log(p[rows, None])
        view[rows] = sub.masked_fill(sub < threshold, float("-inf"))


def penalties(logits_ptr, logits_stride, expanded_idx_mapping_ptr, token_ids_ptr, expanded_local_pos_ptr,
              repetition_penalty_ptr, frequency_penalty_ptr, presence_penalty_ptr, prompt_bin_mask_ptr,
              prompt_bin_mask_stride, output_bin_counts_ptr, output_bin_counts_stride, vocab_size, BLOCK_SIZE=None,
              **_launch):
    """`_penalties_kernel`: repetition (prompt or output tokens), frequency and presence penalties; a verify row
    also counts the draft tokens before it."""
    reqs = expanded_idx_mapping_ptr.long()
    rep = flat(repetition_penalty_ptr)[reqs].float()
    freq = flat(frequency_penalty_ptr)[reqs].float()
    pres = flat(presence_penalty_ptr)[reqs].float()
    rows = ((rep != 1.0) | (freq != 0.0) | (pres != 0.0)).nonzero().view(-1)
    if rows.numel() == 0:
        return
    row_reqs = reqs[rows]
    counts = output_bin_counts_ptr[row_reqs, :vocab_size].clone()
    local_pos = expanded_local_pos_ptr.long()[rows]
    for i in (local_pos > 0).nonzero().view(-1).tolist():  # spec decode: drafts before this verify position
        t, p = int(rows[i]), int(local_pos[i])
        counts[i].index_add_(0, token_ids_ptr[t - p + 1 : t + 1].long(), torch.ones(p, dtype=counts.dtype))
    seen = counts > 0
    view = logits_ptr[:, :vocab_size]
    logits = view[rows].float()
    use_rep = (rep[rows] != 1.0).nonzero().view(-1)
    if use_rep.numel():
        prompt = unpack_bits(prompt_bin_mask_ptr[row_reqs[use_rep]], vocab_size)
        sub = logits[use_rep]
        scale = torch.where(prompt | seen[use_rep], rep[rows][use_rep, None], torch.ones((), dtype=torch.float32))
        logits[use_rep] = sub * torch.where(sub > 0, 1.0 / scale, scale)
    logits = logits - freq[rows, None] * counts
    logits = logits - pres[rows, None] * seen
    view[rows] = logits.to(view.dtype)


def bincount(expanded_idx_mapping_ptr, all_token_ids_ptr, all_token_ids_stride, prompt_len_ptr, prefill_len_ptr,
             prompt_bin_mask_ptr, prompt_bin_mask_stride, output_bin_counts_ptr, output_bin_counts_stride,
             BLOCK_SIZE=None, **_launch):
    """`_bincount_kernel`: for requests that use penalties, mark prompt tokens in the packed prompt mask and count
    the already-generated tokens of a resumed prefill in output_bin_counts."""
    reqs = expanded_idx_mapping_ptr.long().tolist()
    prompt_lens, prefill_lens = flat(prompt_len_ptr), flat(prefill_len_ptr)
    history = flat(all_token_ids_ptr)
    words = prompt_bin_mask_ptr.shape[1]
    shifts = torch.arange(32, device=prompt_bin_mask_ptr.device)
    for req in reqs:
        plen, flen = int(prompt_lens[req]), int(prefill_lens[req])
        base = req * all_token_ids_stride
        prompt = history[base : base + plen].long()
        present = torch.zeros(words * 32, dtype=torch.long, device=prompt.device)
        present[prompt] = 1
        packed = (present.view(words, 32) << shifts).sum(dim=-1)
        packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(prompt_bin_mask_ptr.dtype)
        prompt_bin_mask_ptr[req] |= packed
        outputs = history[base + plen : base + flen].long()
        if outputs.numel():
            ones = torch.ones_like(outputs, dtype=output_bin_counts_ptr.dtype)
            output_bin_counts_ptr[req].index_add_(0, outputs, ones)


def grammar_bitmask(logits_ptr, logits_stride, logits_indices_ptr, cu_num_logits_ptr, bitmask_ptr, bitmask_stride,
                    vocab_size, MASK_STRIDE=None, BLOCK_SIZE=None, **_launch):
    """`_apply_grammar_bitmask_kernel`: -inf for the tokens a grammar forbids (bit 0) in each mask's logits row; a
    mask maps to (request, position) = divmod(index, MASK_STRIDE), inactive past the request's logits."""
    mapping = logits_indices_ptr.long()
    if mapping.numel() == 0:
        return
    req, position = mapping // MASK_STRIDE, mapping % MASK_STRIDE
    cu = cu_num_logits_ptr.long()
    active = (position < cu[req + 1] - cu[req]).nonzero().view(-1)
    if active.numel() == 0:
        return
    rows = cu[req[active]] + position[active]
    words = (vocab_size + 31) // 32
    forbidden = ~unpack_bits(bitmask_ptr[active, :words], vocab_size)
    view = logits_ptr[:, :vocab_size]
    view[rows] = view[rows].masked_fill(forbidden, float("-inf"))


def prompt_logprobs_token_ids(prompt_logprobs_token_ids_ptr, query_start_loc_ptr, idx_mapping_ptr,
                              num_computed_tokens_ptr, all_token_ids_ptr, all_token_ids_stride, BLOCK_SIZE=None,
                              **_launch):
    """`_prompt_logprobs_token_ids_kernel`: the token each scheduled prompt position predicts (the one after it in
    the request's history). The last position of a request reads one past its scheduled tokens, as the kernel
    does (whatever the history holds there; vLLM drops that row unless the prompt continues)."""
    nr = idx_mapping_ptr.shape[0]
    if nr == 0:
        return
    qsl = query_start_loc_ptr[: nr + 1].long()
    lens = qsl[1:] - qsl[:-1]
    total = int(lens.sum())
    if total == 0:
        return
    seg, offset = rows_of(lens, total)
    reqs = idx_mapping_ptr.long()[seg]
    history = flat(all_token_ids_ptr)
    index = reqs * all_token_ids_stride + flat(num_computed_tokens_ptr)[reqs].long() + 1 + offset
    out = flat(prompt_logprobs_token_ids_ptr)
    out[qsl[seg] + offset] = history[index.clamp(max=history.numel() - 1)].to(out.dtype)


def fill_logprob_token_ids(out_token_ids_ptr, out_token_ids_stride, out_valid_mask_ptr, out_valid_mask_stride,
                           sampled_token_ids_ptr, topk_indices_ptr, topk_indices_stride, expanded_idx_mapping_ptr,
                           num_per_req_token_ids_ptr, per_req_token_ids_ptr, per_req_token_ids_stride,
                           NUM_TOPK=0, PADDED_COLS=None, **_launch):
    """`_fill_logprob_token_ids_kernel`: column 0 the sampled token; then a request's own `logprob_token_ids` when
    it gave some, else the top-k ids; the valid mask marks what was written."""
    rows = out_token_ids_ptr.shape[0]
    cols = out_token_ids_ptr.shape[1] - 1
    out_token_ids_ptr[:, 0] = sampled_token_ids_ptr[:rows].to(out_token_ids_ptr.dtype)
    out_valid_mask_ptr[:, 0] = True
    if cols == 0:
        return
    custom = flat(num_per_req_token_ids_ptr)[expanded_idx_mapping_ptr.long()].long()
    width = torch.where(custom > 0, custom, torch.full_like(custom, NUM_TOPK)).clamp(max=cols)
    valid = torch.arange(cols, device=custom.device)[None, :] < width[:, None]
    own = per_req_token_ids_ptr[expanded_idx_mapping_ptr.long(), :cols].long()
    if NUM_TOPK > 0:
        top = torch.zeros(rows, cols, dtype=torch.long, device=own.device)
        top[:, :NUM_TOPK] = topk_indices_ptr[:rows, :NUM_TOPK].long()
    else:
        top = torch.zeros_like(own)
    ids = torch.where((custom > 0)[:, None], own, top)
    out_token_ids_ptr[:, 1:] = torch.where(valid, ids.to(out_token_ids_ptr.dtype), out_token_ids_ptr[:, 1:])
    out_valid_mask_ptr[:, 1:] |= valid
