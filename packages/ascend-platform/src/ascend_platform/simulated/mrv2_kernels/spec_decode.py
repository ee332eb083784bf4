"""Torch stand-ins for Model Runner V2's speculative-decoding kernels (`vllm/v1/worker/gpu/spec_decode/`).

A speculative step launches, besides the target's per-step kernels: the verifier's gather of each logits row's
draft token, the draft inputs of EAGLE/MTP (prefill shift, decode inputs, per-step update) or of DFlash/DFlash2/DSpark
(one query block per request plus its context slots), and for DFlash2 the candidate walk and its proposal cache.
In Triton's interpreter each of these costs 3-110 ms per launch (the DFlash input kernel ~110 ms: 14 s for 40 tokens
of 3 prompts), and interpreted kernels that reduce (`tl.max`) fail in a process whose Triton library was imported
before the interpreter was on. Each function takes its kernel's parameters in the kernel's order (tensors for
pointers, constexprs and launch options as keywords) and does what the whole launch grid does; the grid's extent is
read from the tensors' shapes, as the other stand-ins do. The verifier's rejection kernels are not here: the Ascend
verifier (`ascend_specdecode.mrv2_verification`) takes greedy verification off them.
"""

from __future__ import annotations

import torch

from ascend_platform.facade import kernel_ops
from ascend_platform.simulated.mrv2_kernels.common import flat, rows_of

PAD_SLOT_ID = -1  # vllm.v1.attention.backends.utils.PAD_SLOT_ID


def gather_draft_sampled(draft_sampled_ptr, pos_ptr, input_ids_ptr, positions_ptr, logits_indices_ptr,
                         expanded_idx_mapping_ptr, expanded_local_pos_ptr, prefill_len_ptr, num_logits,
                         BLOCK_SIZE=None, **_launch):
    """`_gather_draft_sampled_kernel`: each logits row's input token and position; draft rows of a step that
    starts inside the prefill are placeholders (-1)."""
    n = int(num_logits)
    if n == 0:
        return
    rows = logits_indices_ptr[:n].long()
    tokens, pos = flat(input_ids_ptr)[rows], flat(positions_ptr)[rows]
    reqs = expanded_idx_mapping_ptr[:n].long().clamp(min=0)
    local = expanded_local_pos_ptr[:n].long()
    placeholder = (local > 0) & (pos.long() - local < flat(prefill_len_ptr)[reqs].long())
    draft_sampled_ptr[:n] = torch.where(placeholder, torch.full_like(tokens, -1), tokens).to(draft_sampled_ptr.dtype)
    pos_ptr[:n] = pos.to(pos_ptr.dtype)


def flatten_sampled(flat_sampled_ptr, sampled_ptr, sampled_stride, num_sampled_ptr, cu_num_logits_ptr, **_launch):
    """`_flatten_sampled_kernel`: each request's sampled tokens laid out at its logits rows (logprobs)."""
    nr = cu_num_logits_ptr.shape[0] - 1
    counts = num_sampled_ptr[:nr].long()
    total = int(counts.sum())
    if total:
        seg, offset = rows_of(counts, total)
        starts = cu_num_logits_ptr[:nr].long()
        flat(flat_sampled_ptr)[starts[seg] + offset] = flat(sampled_ptr)[seg * sampled_stride + offset].to(
            flat_sampled_ptr.dtype)


# ---- EAGLE / MTP (target_dependent_ar) ------------------------------------------------------------------------------

def prepare_draft_prefill_inputs(last_token_indices_ptr, draft_current_step_ptr, draft_input_ids_ptr,
                                 draft_positions_ptr, draft_query_start_loc_ptr, draft_seq_lens_ptr,
                                 target_input_ids_ptr, target_positions_ptr, idx_mapping_ptr, last_sampled_ptr,
                                 next_prefill_tokens_ptr, num_sampled_ptr, num_rejected_ptr, query_start_loc_ptr,
                                 seq_lens_ptr, max_num_reqs, BLOCK_SIZE=None, **_launch):
    """`_prepare_prefill_inputs_kernel` (EAGLE/MTP): the target's tokens shifted left by one with the step's next
    token last, the target's positions, query starts and sequence lengths; rejected tail tokens are dropped."""
    nr = idx_mapping_ptr.shape[0]
    if nr == 0:
        return
    reqs = idx_mapping_ptr.long()
    qsl = query_start_loc_ptr[: nr + 1].long()
    starts = qsl[:-1]
    query_len = (qsl[1:] - starts) - num_rejected_ptr[:nr].long()
    sampled = num_sampled_ptr[:nr] > 0
    next_token = torch.where(sampled, flat(last_sampled_ptr)[reqs].to(torch.int32),
                             flat(next_prefill_tokens_ptr)[reqs].to(torch.int32))
    ids, positions = flat(draft_input_ids_ptr), flat(draft_positions_ptr)
    shifted = (query_len - 1).clamp(min=0)
    total = int(shifted.sum())
    if total:
        seg, offset = rows_of(shifted, total)
        src = starts[seg] + offset + 1
        ids[src - 1] = flat(target_input_ids_ptr)[src].to(ids.dtype)
    last = starts + query_len - 1
    flat(last_token_indices_ptr)[:nr] = last.to(last_token_indices_ptr.dtype)
    ids[last] = next_token.to(ids.dtype)
    total = int(query_len.clamp(min=0).sum())
    if total:
        seg, offset = rows_of(query_len.clamp(min=0), total)
        positions[starts[seg] + offset] = flat(target_positions_ptr)[starts[seg] + offset].to(positions.dtype)
    qsl_out, seq_lens_out = flat(draft_query_start_loc_ptr), flat(draft_seq_lens_ptr)
    qsl_out[:nr] = starts.to(qsl_out.dtype)
    seq_lens_out[:nr] = seq_lens_ptr[:nr].to(seq_lens_out.dtype)
    # What the batch's last program does: reset the draft step and pad the per-request buffers for CUDA graphs.
    draft_current_step_ptr.fill_(0)
    qsl_out[nr : max_num_reqs + 1] = qsl[nr].to(qsl_out.dtype)
    seq_lens_out[nr:max_num_reqs] = 0
    flat(last_token_indices_ptr)[nr:max_num_reqs] = 0


def prepare_draft_decode_inputs(draft_tokens_ptr, draft_tokens_stride, target_seq_lens_ptr, num_rejected_ptr,
                                input_ids_ptr, positions_ptr, sample_src_positions_ptr, query_start_loc_ptr,
                                seq_lens_ptr, max_model_len, max_num_reqs, BLOCK_SIZE=None,
                                ADVANCE_DRAFT_POSITIONS=True, **_launch):
    """`_prepare_decode_inputs_kernel` (EAGLE/MTP): one query per request from its first draft token, the next
    position and sequence length (clamped to the model length), the sampling key advanced by one."""
    nr = draft_tokens_ptr.shape[0]  # a strided view: column 0 of the speculator's draft tokens
    qsl = flat(query_start_loc_ptr)
    qsl[: max_num_reqs + 1] = torch.arange(max_num_reqs + 1, device=qsl.device).clamp(max=nr).to(qsl.dtype)
    seq_lens = flat(seq_lens_ptr)
    seq_lens[nr:max_num_reqs] = 0
    if nr == 0:
        return
    flat(input_ids_ptr)[:nr] = draft_tokens_ptr[:nr].to(input_ids_ptr.dtype)
    flat(sample_src_positions_ptr)[:nr] += 1
    seq_len = target_seq_lens_ptr[:nr].long() - num_rejected_ptr[:nr].long()
    if ADVANCE_DRAFT_POSITIONS:
        positions = flat(positions_ptr)
        positions[:nr] = (positions[:nr].long() + 1).clamp(max=max_model_len - 1).to(positions.dtype)
        seq_len = (seq_len + 1).clamp(max=max_model_len)
    seq_lens[:nr] = seq_len.to(seq_lens.dtype)


def update_draft_inputs(output_draft_tokens_ptr, output_draft_tokens_stride, next_input_hidden_states_ptr,
                        next_input_hidden_states_stride, input_ids_ptr, positions_ptr, sample_src_positions_ptr,
                        seq_lens_ptr, draft_tokens_ptr, current_draft_step_ptr, hidden_states_ptr,
                        hidden_states_stride, hidden_size, max_model_len, num_speculative_steps, BLOCK_SIZE=None,
                        ADVANCE_DRAFT_POSITIONS=True, **_launch):
    """`_update_draft_inputs_kernel` (EAGLE/MTP): store the step's draft tokens; unless it was the last step, make
    them (and the draft's hidden states) the next step's inputs at the next position."""
    nr = draft_tokens_ptr.shape[0]
    if nr == 0:
        return
    step = int(current_draft_step_ptr)
    out = flat(output_draft_tokens_ptr)
    rows = torch.arange(nr, device=out.device)
    out[rows * output_draft_tokens_stride + step] = draft_tokens_ptr[:nr].to(out.dtype)
    if step >= num_speculative_steps - 1:
        return
    flat(sample_src_positions_ptr)[:nr] += 1
    flat(input_ids_ptr)[:nr] = draft_tokens_ptr[:nr].to(input_ids_ptr.dtype)
    next_input_hidden_states_ptr[:nr, :hidden_size] = hidden_states_ptr[:nr, :hidden_size]
    if ADVANCE_DRAFT_POSITIONS:
        positions, seq_lens = flat(positions_ptr), flat(seq_lens_ptr)
        positions[:nr] = (positions[:nr].long() + 1).clamp(max=max_model_len - 1).to(positions.dtype)
        seq_lens[:nr] = (seq_lens[:nr].long() + 1).clamp(max=max_model_len).to(seq_lens.dtype)


# ---- DFlash / DFlash2 / DSpark (parallel drafting) -----------------------------------------------------------------

def _cp_local_slot(positions, block_ids, block_size: int, cp_rank: int, cp_size: int, cp_interleave: int):
    """`cp_local_slot`: the rank-local KV slot of each position, or PAD_SLOT_ID where another CP rank owns it."""
    offsets = positions % (block_size * cp_size)
    if cp_size == 1:
        return block_ids * block_size + offsets
    local = (offsets // cp_interleave) % cp_size == cp_rank
    local_offsets = (offsets // (cp_interleave * cp_size)) * cp_interleave + offsets % cp_interleave
    return torch.where(local, block_ids * block_size + local_offsets, torch.full_like(block_ids, PAD_SLOT_ID))


def _slots(block_table, rows, positions, valid, block_size, cp_rank, cp_size, cp_interleave):
    """Slots of `positions` in batch rows `rows` of the gathered block table; PAD where invalid or in block 0
    (the null block: evicted sliding-window entries and rejected rows must never be written)."""
    block_num = (positions // (block_size * cp_size)).clamp(max=block_table.shape[1] - 1)
    block_ids = torch.where(valid, block_table[rows, block_num].long(), torch.zeros_like(positions))
    slots = _cp_local_slot(positions, block_ids, block_size, cp_rank, cp_size, cp_interleave)
    return torch.where(valid & (block_ids != 0), slots, torch.full_like(slots, PAD_SLOT_ID))


def prepare_dflash_inputs(out_input_ids_ptr, out_query_positions_ptr, out_query_start_loc_ptr, out_seq_lens_ptr,
                          out_query_slot_mapping_ptr, out_context_positions_ptr, out_context_slot_mapping_ptr,
                          out_sample_indices_ptr, out_sample_pos_ptr, out_sample_idx_mapping_ptr,
                          out_temperature_ptr, out_seeds_ptr, target_positions_ptr, target_query_start_loc_ptr,
                          idx_mapping_ptr, last_sampled_ptr, next_prefill_tokens_ptr, num_sampled_ptr,
                          num_rejected_ptr, temperature_ptr, seeds_ptr, block_table_ptr, block_table_stride,
                          parallel_drafting_token_id, block_size, num_query_per_req, num_speculative_steps,
                          max_num_reqs, max_num_tokens, max_model_len, cp_rank, SAMPLE_FROM_ANCHOR=False,
                          PAD_SLOT_ID=PAD_SLOT_ID, CP_SIZE=1, CP_INTERLEAVE=1, BLOCK_SIZE=None, **_launch):
    """`_prepare_dflash_inputs_kernel`: per request, the accepted context's positions and KV slots (rejected rows
    PAD), then one query block after the last accepted position: the bonus token and `num_query_per_req - 1` mask
    tokens with their positions and slots, and which query rows are sampled at which position (every row from the
    anchor for DSpark, the mask rows for DFlash)."""
    nr = idx_mapping_ptr.shape[0]
    if nr == 0:
        return
    device = idx_mapping_ptr.device
    reqs = idx_mapping_ptr.long()
    qsl = target_query_start_loc_ptr[: nr + 1].long()
    ctx_start, num_ctx = qsl[:-1], qsl[1:] - qsl[:-1]
    num_valid = num_ctx - num_rejected_ptr[:nr].long()
    target_positions = flat(target_positions_ptr)
    last_valid_pos = target_positions[ctx_start + num_valid - 1].long()
    bonus = torch.where(num_sampled_ptr[:nr] > 0, flat(last_sampled_ptr)[reqs].to(torch.int32),
                        flat(next_prefill_tokens_ptr)[reqs].to(torch.int32))
    table = block_table_ptr if block_table_ptr.dim() == 2 else block_table_ptr.view(-1, block_table_stride)
    slot_args = (block_size, cp_rank, CP_SIZE, CP_INTERLEAVE)

    total = int(num_ctx.sum())
    if total:
        seg, j = rows_of(num_ctx, total)
        valid = j < num_valid[seg]
        rows = ctx_start[seg] + j
        ctx_pos = torch.where(valid, target_positions[rows].long(), torch.zeros_like(rows))
        flat(out_context_positions_ptr)[rows] = ctx_pos.to(out_context_positions_ptr.dtype)
        flat(out_context_slot_mapping_ptr)[rows] = _slots(table, seg, ctx_pos, valid, *slot_args).to(
            out_context_slot_mapping_ptr.dtype)

    nq = int(num_query_per_req)
    req_rows = torch.arange(nr, device=device)
    offset = torch.arange(nq, device=device)
    query_pos = last_valid_pos[:, None] + 1 + offset[None, :]
    query_idx = (req_rows[:, None] * nq + offset[None, :]).reshape(-1)
    input_ids = torch.where(offset[None, :] == 0, bonus[:, None],
                            torch.full_like(query_pos, int(parallel_drafting_token_id), dtype=torch.int32))
    everywhere = torch.ones_like(query_pos, dtype=torch.bool)
    q_slots = _slots(table, req_rows[:, None].expand(-1, nq), query_pos, everywhere, *slot_args)
    flat(out_input_ids_ptr)[query_idx] = input_ids.reshape(-1).to(out_input_ids_ptr.dtype)
    flat(out_query_positions_ptr)[query_idx] = query_pos.clamp(max=max_model_len - 1).reshape(-1).to(
        out_query_positions_ptr.dtype)
    flat(out_query_slot_mapping_ptr)[query_idx] = q_slots.reshape(-1).to(out_query_slot_mapping_ptr.dtype)

    first = 0 if SAMPLE_FROM_ANCHOR else 1
    sampled_off = offset[first:]
    sample_idx = (req_rows[:, None] * num_speculative_steps + (sampled_off[None, :] - first)).reshape(-1)
    sample_pos = query_pos[:, first:] + (1 if SAMPLE_FROM_ANCHOR else 0)
    flat(out_sample_indices_ptr)[sample_idx] = (req_rows[:, None] * nq + sampled_off[None, :]).reshape(-1).to(
        out_sample_indices_ptr.dtype)
    flat(out_sample_pos_ptr)[sample_idx] = sample_pos.reshape(-1).to(out_sample_pos_ptr.dtype)
    flat(out_sample_idx_mapping_ptr)[sample_idx] = reqs[:, None].expand(-1, nq - first).reshape(-1).to(
        out_sample_idx_mapping_ptr.dtype)

    qsl_out, seq_lens_out = flat(out_query_start_loc_ptr), flat(out_seq_lens_ptr)
    qsl_out[:nr] = (req_rows * nq).to(qsl_out.dtype)
    seq_lens_out[:nr] = (last_valid_pos + 1 + nq).clamp(max=max_model_len).to(seq_lens_out.dtype)
    flat(out_temperature_ptr)[reqs] = flat(temperature_ptr)[reqs]
    flat(out_seeds_ptr)[reqs] = flat(seeds_ptr)[reqs]
    # What the batch's last request does: pad the per-request and per-sample buffers for CUDA graphs.
    qsl_out[nr : max_num_reqs + 1] = nr * nq
    seq_lens_out[nr:max_num_reqs] = 0
    pad = slice(nr * num_speculative_steps, max_num_reqs * num_speculative_steps)
    flat(out_sample_indices_ptr)[pad] = 0
    flat(out_sample_pos_ptr)[pad] = 0
    flat(out_sample_idx_mapping_ptr)[pad] = -1
    flat(out_query_slot_mapping_ptr)[nr * nq : max_num_tokens] = PAD_SLOT_ID


def selector_walk(scores_ptr, candidate_ptr, sample_pos_ptr, req_state_ptr, temperature_ptr, seeds_ptr, tokens_ptr,
                  realized_scores_ptr, num_steps=None, top_k=None, BLOCK_K=None, SAMPLE_PROBABILISTIC=False,
                  USE_FP64=False, **_launch):
    """`_selector_walk_kernel` (DFlash2): per request, walk the draft positions choosing one of the top-k candidates
    at each, scored by the edge from the previous choice (the anchor at step 0): argmax, or Gumbel-max keyed by the
    candidate's token id when drafts are sampled. Stores the chosen tokens and each step's realised score row."""
    nr = candidate_ptr.shape[0]
    if nr == 0:
        return
    k = int(top_k)
    scores = scores_ptr.reshape(nr, num_steps, k, k)
    candidates = candidate_ptr.reshape(nr, num_steps, k).long()
    req_state = flat(req_state_ptr)[torch.arange(nr, device=candidates.device) * num_steps].long()
    valid = (req_state >= 0).nonzero().view(-1)
    if valid.numel() == 0:
        return
    state = req_state[valid]
    temperature = (flat(temperature_ptr)[state].float() if SAMPLE_PROBABILISTIC
                   else torch.zeros(state.shape, device=state.device))
    seeds = flat(seeds_ptr)[state].long()
    realized = realized_scores_ptr.view(-1, num_steps, k)
    tokens = flat(tokens_ptr)
    score_dtype = torch.float64 if USE_FP64 else torch.float32
    previous = torch.zeros(valid.shape[0], dtype=torch.long, device=candidates.device)
    for step in range(num_steps):
        row_scores = scores[valid, step, previous].to(score_dtype)
        cands = candidates[valid, step]
        index = _walk_choice(row_scores, cands, temperature, seeds,
                             flat(sample_pos_ptr)[valid * num_steps + step].long() - 1, bool(USE_FP64))
        realized[valid, step] = row_scores.to(realized.dtype)
        tokens[valid * num_steps + step] = cands.gather(1, index[:, None]).view(-1).to(tokens.dtype)
        previous = index


def _walk_choice(scores, candidates, temperature, seeds, positions, fp64: bool):
    """Index of the chosen candidate per row: argmax (first on ties) of the scores at temperature 0, else the
    Gumbel-max draw of the drafting stream, whose noise is keyed by token id (so a dense row over the vocabulary,
    -inf off the candidates, draws exactly what the kernel draws)."""
    index = scores.argmax(dim=-1)
    hot = (temperature != 0.0).nonzero().view(-1)
    if hot.numel():
        vocab = int(candidates[hot].max()) + 1
        dense = torch.full((hot.numel(), vocab), float("-inf"), dtype=scores.dtype, device=scores.device)
        dense.scatter_(1, candidates[hot], scores[hot])
        salt = 1 << 30  # vLLM's drafting noise offset (_DRAFT_NOISE_SALT)
        token = kernel_ops().gumbel_sample(dense, temperature[hot], seeds[hot], positions[hot] + salt,
                                           apply_temperature=True, fp64=fp64)
        index[hot] = (candidates[hot] == token[:, None]).int().argmax(dim=-1)
    return index


def cache_draft_logits(draft_logits_ptr, cached_candidate_ptr, candidate_ptr, scores_ptr, req_state_ptr,
                       draft_logits_stride_0, draft_logits_stride_1, num_steps=None, top_k=None, BLOCK_K=None,
                       **_launch):
    """`_cache_draft_logits_kernel` (DFlash2, sampled drafts): the proposal each draft was drawn from, as a dense
    logits row that is -inf off the step's candidates (the previous step's candidates are cleared first)."""
    k = int(top_k)
    candidates = candidate_ptr.reshape(-1, k).long()
    n = candidates.shape[0]
    req_state = flat(req_state_ptr)[:n].long()
    rows = (req_state >= 0).nonzero().view(-1)
    if rows.numel() == 0:
        return
    state, step = req_state[rows], rows % num_steps
    cached = cached_candidate_ptr.view(-1, num_steps, k)
    logits = flat(draft_logits_ptr)
    base = state * draft_logits_stride_0 + step * draft_logits_stride_1
    logits[(base[:, None] + cached[state, step].long()).view(-1)] = float("-inf")
    scores = scores_ptr.reshape(-1, k)[rows]
    logits[(base[:, None] + candidates[rows]).view(-1)] = scores.reshape(-1).to(logits.dtype)
    cached[state, step] = candidates[rows].to(cached.dtype)


_SPEC = "vllm.v1.worker.gpu.spec_decode"
# (kernel vLLM's dispatcher resolves, stand-in, which steps launch it): registered by `kernel_overrides`.
KERNELS = (
    (f"{_SPEC}.rejection_sampler._gather_draft_sampled_kernel", gather_draft_sampled, "spec-decode verify steps"),
    (f"{_SPEC}.rejection_sampler._flatten_sampled_kernel", flatten_sampled, "spec-decode steps with logprobs"),
    (f"{_SPEC}.target_dependent_ar.speculator._prepare_prefill_inputs_kernel", prepare_draft_prefill_inputs,
     "EAGLE/MTP drafting"),
    (f"{_SPEC}.target_dependent_ar.speculator._prepare_decode_inputs_kernel", prepare_draft_decode_inputs,
     "EAGLE/MTP drafting"),
    (f"{_SPEC}.target_dependent_ar.speculator._update_draft_inputs_kernel", update_draft_inputs,
     "EAGLE/MTP drafting"),
    (f"{_SPEC}.dflash.speculator._prepare_dflash_inputs_kernel", prepare_dflash_inputs, "DFlash/DFlash2/DSpark"),
    (f"{_SPEC}.dflash2.speculator._selector_walk_kernel", selector_walk, "DFlash2 drafting"),
    (f"{_SPEC}.dflash2.speculator._cache_draft_logits_kernel", cache_draft_logits, "DFlash2 sampled drafts"),
)
