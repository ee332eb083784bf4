"""MoE routing as torch_npu documents it: gating top-k (softmax; grouped, biased, sigmoid), the dropless
init-routing (sort by expert), and the token unpermute (gather by row index, weight, sum).

Outputs the docs call undefined (expanded rows past the routed ones, norm_out without out_flag) are NaN here, so a
caller that reads them fails instead of passing by luck.
"""

from __future__ import annotations

import torch

from ascend_testkit.torch_npu.attention.refusals import refuse, require_dtype, unmodelled

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def npu_moe_gating_top_k(*, x, k, bias, input_ids, tid2eid, k_group, group_count, group_select_mode, renorm,
                         norm_type, out_flag, routed_scaling_factor, eps):
    op = "npu_moe_gating_top_k"
    require_dtype(op, "x", x, _FLOATS)
    if x.dim() != 2 or x.shape[1] > 2048:
        refuse(op, f"x must be 2-D with at most 2048 experts, got shape {tuple(x.shape)}")
    experts = x.shape[1]
    if input_ids is not None or tid2eid is not None:
        unmodelled(op, "input_ids/tid2eid", "hash routing")
    if renorm != 0:
        refuse(op, f"renorm supports only 0, got {renorm}")
    if norm_type not in (0, 1):
        refuse(op, f"norm_type must be 0 (softmax) or 1 (sigmoid), got {norm_type}")
    if group_select_mode not in (0, 1):
        refuse(op, f"group_select_mode must be 0 (group max) or 1 (top-2 sum), got {group_select_mode}")
    if group_count <= 0 or experts % group_count or experts // group_count <= 2:
        refuse(op, f"group_count={group_count} must divide the {experts} experts into groups of more than 2")
    if not 1 <= k_group <= group_count:
        refuse(op, f"k_group must lie in [1, group_count={group_count}], got {k_group}")
    if not 1 <= k <= experts // group_count * k_group:
        refuse(op, f"k must lie in [1, experts / group_count * k_group = {experts // group_count * k_group}], got {k}")
    if bias is not None and (bias.shape != (experts,) or bias.dtype != x.dtype):
        refuse(op, f"bias must be [{experts}] of x's dtype {x.dtype}, got {tuple(bias.shape)} {bias.dtype}")
    scores = torch.softmax(x.float(), dim=-1) if norm_type == 0 else torch.sigmoid(x.float())
    select = scores if bias is None else scores + bias.float()
    if group_count > 1:
        grouped = select.view(x.shape[0], group_count, -1)
        group_score = grouped.amax(dim=-1) if group_select_mode == 0 else grouped.topk(2, dim=-1).values.sum(-1)
        keep = torch.argsort(-group_score, dim=-1, stable=True)[:, :k_group]
        dropped = torch.ones_like(group_score, dtype=torch.bool).scatter_(1, keep, False)
        select = grouped.masked_fill(dropped[..., None], float("-inf")).view(x.shape[0], -1)
    idx = torch.argsort(-select, dim=-1, stable=True)[:, :k]
    y = scores.gather(1, idx)
    if norm_type == 1:
        y = y / (y.sum(dim=-1, keepdim=True) + eps)
    y = y * routed_scaling_factor
    norm_out = scores if out_flag else torch.full_like(scores, float("nan"))
    return y.to(x.dtype), idx.to(torch.int32), norm_out


def npu_moe_init_routing_v2(*, x, expert_idx, scale, offset, active_num, expert_capacity, expert_num, drop_pad_mode,
                            expert_tokens_num_type, expert_tokens_num_flag, quant_mode, active_expert_range,
                            row_idx_type, x_dtype):
    op = "npu_moe_init_routing_v2"
    require_dtype(op, "x", x, _FLOATS)
    require_dtype(op, "expert_idx", expert_idx, (torch.int32,))
    if x.dim() != 2 or expert_idx.dim() != 2 or x.shape[0] != expert_idx.shape[0]:
        refuse(op, f"x [rows, H] and expert_idx [rows, K] must share rows, got {tuple(x.shape)} and "
               f"{tuple(expert_idx.shape)}")
    # The docs: "currently only" drop_pad_mode 0, expert_tokens_num_type 1 or 2, expert_tokens_num_flag True.
    if drop_pad_mode != 0:
        refuse(op, f"drop_pad_mode supports only 0, got {drop_pad_mode}")
    if expert_tokens_num_type not in (1, 2):
        refuse(op, f"expert_tokens_num_type supports 1 (count) and 2 (key-value), got {expert_tokens_num_type}")
    if not expert_tokens_num_flag:
        refuse(op, f"expert_tokens_num_flag supports only True, got {expert_tokens_num_flag}")
    if expert_tokens_num_type == 2:
        unmodelled(op, "expert_tokens_num_type", expert_tokens_num_type)
    if quant_mode != -1:
        unmodelled(op, "quant_mode", quant_mode)
    if scale is not None or offset is not None:
        unmodelled(op, "scale/offset", "a tensor")
    if not 0 < expert_num <= 10240:
        refuse(op, f"expert_num must lie in (0, 10240], got {expert_num}")
    start, end = active_expert_range if active_expert_range else (0, expert_num)
    if not 0 <= start < end <= expert_num:
        refuse(op, f"active_expert_range must satisfy 0 <= start < end <= expert_num={expert_num}, "
               f"got {active_expert_range}")
    if row_idx_type not in (0, 1):
        refuse(op, f"row_idx_type must be 0 (gather) or 1 (scatter), got {row_idx_type}")
    rows, k = expert_idx.shape
    pairs = rows * k
    if active_num not in (-1, 0) and active_num < pairs:
        unmodelled(op, "active_num below rows * K", active_num)
    flat = expert_idx.reshape(-1).long()
    active = (flat >= start) & (flat < end)
    # Sort the active pairs by expert, ties in pair order; inactive pairs go last.
    order = torch.argsort(torch.where(active, flat, torch.full_like(flat, end)), stable=True)
    available = int(active.sum())
    expanded_x = torch.full((pairs, x.shape[1]), float("nan"), dtype=x.dtype, device=x.device)
    expanded_x[:available] = x.index_select(0, order[:available] // k)
    if row_idx_type == 0:  # per pair: the expanded row it went to, -1 when its expert is outside the range
        row_idx = torch.full((pairs,), -1, dtype=torch.int32, device=x.device)
        row_idx[order[:available]] = torch.arange(available, dtype=torch.int32, device=x.device)
    else:  # per expanded row: the pair it came from (rows past the available ones undefined)
        row_idx = order.to(torch.int32)
    counts = torch.bincount(flat[active] - start, minlength=end - start).to(torch.int64)
    expanded_scale = torch.full((pairs,), float("nan"), dtype=torch.float32, device=x.device)
    return expanded_x, row_idx, counts, expanded_scale


def npu_moe_token_unpermute(*, permuted_tokens, sorted_indices, probs, padded_mode, restore_shape):
    op = "npu_moe_token_unpermute"
    if padded_mode:
        refuse(op, "padded_mode supports only False")
    require_dtype(op, "permuted_tokens", permuted_tokens, _FLOATS)
    require_dtype(op, "sorted_indices", sorted_indices, (torch.int32, torch.int64))
    if permuted_tokens.dim() != 2 or sorted_indices.dim() != 1:
        refuse(op, f"permuted_tokens must be 2-D and sorted_indices 1-D, got {tuple(permuted_tokens.shape)} and "
               f"{tuple(sorted_indices.shape)}")
    topk = 1 if probs is None else probs.shape[1]
    if probs is not None and (probs.dim() != 2 or probs.shape[0] * topk != sorted_indices.shape[0]):
        refuse(op, f"probs must be [tokens, topK] with tokens * topK = {sorted_indices.shape[0]}, "
               f"got {tuple(probs.shape)}")
    if probs is not None and probs.dtype != permuted_tokens.dtype:
        refuse(op, f"probs dtype must be permuted_tokens' ({permuted_tokens.dtype}), got {probs.dtype}")
    n = sorted_indices.shape[0]
    if n and (int(sorted_indices.min()) < 0 or int(sorted_indices.max()) >= permuted_tokens.shape[0]):
        refuse(op, f"sorted_indices must index the {permuted_tokens.shape[0]} permuted rows, got values in "
               f"[{int(sorted_indices.min())}, {int(sorted_indices.max())}]")
    gathered = permuted_tokens.index_select(0, sorted_indices.long()).float().view(n // topk, topk, -1)
    if probs is not None:
        gathered = gathered * probs.float()[..., None]
    return gathered.sum(dim=1).to(permuted_tokens.dtype)
