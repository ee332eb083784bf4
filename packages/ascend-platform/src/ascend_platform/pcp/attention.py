"""Context-parallel prefill attention in plain torch: partial attention per KV shard and the log-sum-exp merge.

Under PCP a rank holds the queries of its head and tail chunks but needs keys from every rank. It gathers each
rank's (padded) keys, values, positions and request ids, attends to each shard separately, keeping the
log-sum-exp of every row, and merges the partial outputs: out = Σ_j exp(lse_j - lse) · out_j with
lse = log Σ_j exp(lse_j). On an NPU the fused kernels do the same in one pass; here it is the reference the
simulated lane and the distributed tests run.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def partial_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of `q` [Tq, H, D] over `k`, `v` [Tk, Hkv, D] where `allowed` [Tq, Tk] is True.

    Returns the output [Tq, H, D] and the log-sum-exp [Tq, H]; a row with no allowed key gets output 0 and
    lse -inf, so it weighs nothing in a merge.
    """
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    group = num_heads // num_kv_heads
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    scores = scores.masked_fill(~allowed.unsqueeze(0), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [H, Tq]
    weights = torch.exp(scores - lse.unsqueeze(-1)).nan_to_num(0.0)
    out = torch.einsum("hqk,khd->qhd", weights, v.float())
    return out.to(q.dtype), lse.transpose(0, 1).contiguous()


def merge_attention_states(outs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor]) -> torch.Tensor:
    """Merge partial attention outputs [Tq, H, D] by their log-sum-exps [Tq, H] into the full attention output."""
    if not outs or len(outs) != len(lses):
        raise ValueError(f"need one lse per partial output, got {len(outs)} outputs and {len(lses)} lses")
    stacked_lse = torch.stack([lse.float() for lse in lses])  # [S, Tq, H]
    total = torch.logsumexp(stacked_lse, dim=0)
    weights = torch.exp(stacked_lse - total.unsqueeze(0)).nan_to_num(0.0)  # rows with no key anywhere stay 0
    merged = sum(w.unsqueeze(-1) * o.float() for w, o in zip(weights, outs, strict=True))
    return merged.to(outs[0].dtype)


def causal_allowed(
    q_pos: torch.Tensor, q_req: torch.Tensor, k_pos: torch.Tensor, k_req: torch.Tensor, k_valid: torch.Tensor
) -> torch.Tensor:
    """[Tq, Tk] mask: same request, key not after the query, key not padding."""
    return (q_req[:, None] == k_req[None, :]) & (k_pos[None, :] <= q_pos[:, None]) & k_valid[None, :]


def context_parallel_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    request_ids: torch.Tensor,
    valid: torch.Tensor,
    scale: float,
    group: torch.distributed.ProcessGroup | None = None,
) -> torch.Tensor:
    """This rank's causal prefill attention when the keys are split across the PCP ranks of `group`.

    Every rank passes its local (padded, equally long) tokens: queries/keys/values, each token's position and
    request id within the step, and whether it is a real token. Each rank's shard is all-gathered, attended to
    separately, and merged by log-sum-exp.
    """
    import torch.distributed as dist

    world = dist.get_world_size(group)
    shards = []
    for tensor in (k, v, positions, request_ids, valid):
        parts = [torch.empty_like(tensor) for _ in range(world)]
        dist.all_gather(parts, tensor.contiguous(), group=group)
        shards.append(parts)
    outs, lses = [], []
    for k_j, v_j, pos_j, req_j, valid_j in zip(*shards, strict=True):
        allowed = causal_allowed(positions, request_ids, pos_j, req_j, valid_j)
        out, lse = partial_attention(q, k_j, v_j, allowed, scale)
        outs.append(out)
        lses.append(lse)
    return merge_attention_states(outs, lses)
