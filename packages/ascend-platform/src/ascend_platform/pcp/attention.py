"""Prefill context-parallel attention for the Ascend backend: gather K/V across the PCP group, attend, merge.

Per layer and step, every rank:
1. all-gathers its local K/V (keys and values packed along the last dim, so one collective moves both) over vLLM's
   PCP group and writes all of it into its own replica of the KV cache with the gathered slot mapping (padding and
   duplicate replicas carry slot -1), so later steps read one complete cache on every rank;
2. attends each local prefill chunk to its request's keys in two parts: the context cached before this step
   (`ops.paged_attention_with_lse`, all visible) and this step's keys up to the chunk's end straight from the
   gathered K/V (`ops.gather_kv_rows`, `ops.attention_with_lse`, causal), then merges the parts by their
   log-sum-exp (`ops.merge_attention_states`). Decode rows read the replica like any paged decode.

Which gathered rows each chunk needs is the step's `PCPAttentionLayout` (computed by the PCP manager). The same
functions run in the engine (through `AscendAttentionImpl`) and in the two-process check
(`ascend_testkit.cp_step_driver`).
"""

from __future__ import annotations

import torch

from ascend_platform import usage
from ascend_platform.facade import kernel_ops
from ascend_platform.pcp.layout import PCPAttentionLayout


def pack_kv(key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """[tokens, kv_heads, key_size + value_size]: what one all-gather moves."""
    return torch.cat([key, value.to(key.dtype)], dim=-1)


def all_gather_kv(key: torch.Tensor, value: torch.Tensor, group=None) -> torch.Tensor:
    """Every rank's packed K/V, rank after rank (each rank's padded local tokens), over vLLM's PCP group."""
    if group is None:
        from vllm.distributed.parallel_state import get_pcp_group

        group = get_pcp_group()
    with usage.timed("pcp.kv_all_gather"):
        return group.all_gather(pack_kv(key, value).contiguous(), dim=0)


def cache_gathered_kv(gathered: torch.Tensor, key_size: int, key_cache: torch.Tensor, value_cache: torch.Tensor,
                      slot_mapping: torch.Tensor) -> None:
    """Write every rank's tokens into this rank's KV replica (slots -1 are padding or another rank's duplicate)."""
    kernel_ops().reshape_and_cache(gathered[..., :key_size], gathered[..., key_size:], key_cache, value_cache,
                                   slot_mapping[: gathered.shape[0]])


def chunk_attention(query: torch.Tensor, gathered: torch.Tensor, key_size: int, key_cache: torch.Tensor,
                    value_cache: torch.Tensor, block_table: torch.Tensor, layout: PCPAttentionLayout, *,
                    scale: float, out: torch.Tensor) -> torch.Tensor:
    """Attention of this rank's prefill chunks (`query`: their tokens, rows as in `layout`) into `out`."""
    ops = kernel_ops()
    keys, values = ops.gather_kv_rows(gathered, layout.kv_index, key_size=key_size)
    usage.count("pcp.attention.chunks", layout.num_prefill_rows)
    qsl_host, ksl_host = list(layout.query_start_loc_host), list(layout.kv_start_loc_host)
    if not layout.has_context:
        ops.attention_with_lse(query, keys, values, layout.query_start_loc, layout.kv_start_loc, scale=scale,
                               out=out, query_start_loc_host=qsl_host, kv_start_loc_host=ksl_host)
        return out
    step_out, step_lse = ops.attention_with_lse(query, keys, values, layout.query_start_loc,
                                                layout.kv_start_loc, scale=scale, query_start_loc_host=qsl_host,
                                                kv_start_loc_host=ksl_host)
    ctx_out, ctx_lse = ops.paged_attention_with_lse(query, key_cache, value_cache, block_table,
                                                    layout.query_start_loc, layout.context_lens, scale=scale,
                                                    causal=False, query_start_loc_host=qsl_host,
                                                    seq_lens_host=list(layout.context_lens_host))
    ops.merge_attention_states([ctx_out, step_out], [ctx_lse, step_lse], out=out)
    usage.count("pcp.attention.merged_chunks", layout.context_rows)
    return out
