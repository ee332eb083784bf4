"""Each PCP rank's attention, computed from its local chunks and the K/V of both ranks, equals causal attention
over every request's whole context: decodes read the KV replica, prefill chunks merge the cached context with the
gathered step keys their layout points at. Both ranks run in this process (the all-gather is a concatenation)."""

from __future__ import annotations

import pytest
import torch
from vllm.v1.worker.gpu.input_batch import InputBuffers

from ascend_kernels import ops
from ascend_platform.pcp import AscendPCPManager
from ascend_platform.pcp.attention import cache_gathered_kv, chunk_attention, pack_kv
from ascend_testkit.pcp_batches import step_input_batch

CPU = torch.device("cpu")
HEADS, KV_HEADS, DIM, BLOCK, BLOCKS_PER_REQ = 4, 2, 16, 16, 8
SCALE = DIM**-0.5
F64 = torch.float64


def qkv(ids: torch.Tensor, pos: torch.Tensor):
    """Deterministic q/k/v of a token from its id and position (what a model layer would produce)."""
    g = torch.Generator().manual_seed(0)
    q_tab = torch.randn(1000, HEADS * DIM, generator=g, dtype=F64)
    k_tab = torch.randn(1000, KV_HEADS * DIM, generator=g, dtype=F64)
    v_tab = torch.randn(1000, KV_HEADS * DIM, generator=g, dtype=F64)
    p_tab = torch.randn(512, KV_HEADS * DIM, generator=g, dtype=F64)
    ids, pos = ids.long(), pos.long()
    q = (q_tab[ids] + 0.5 * p_tab[pos].repeat(1, 2)).view(-1, HEADS, DIM)
    k = (k_tab[ids] + 0.5 * p_tab[pos]).view(-1, KV_HEADS, DIM)
    return q, k, v_tab[ids].view(-1, KV_HEADS, DIM)


def token_id(req: int, pos: int) -> int:
    return (7 * req + 13 * pos) % 1000


def slot(req: int, pos: int) -> int:
    return (req * BLOCKS_PER_REQ + pos // BLOCK) * BLOCK + pos % BLOCK


def reference(req: int, pos: int) -> torch.Tensor:
    """Causal attention of request `req`'s token at `pos` over its positions 0..pos (decode rows go through
    paged_attention, whose softmax is float32: hence the 1e-6 tolerance)."""
    ids = torch.tensor([token_id(req, p) for p in range(pos + 1)])
    q, k, v = qkv(ids, torch.arange(pos + 1))
    out, _ = ops.attention_with_lse(q[-1:], k, v, torch.tensor([0, 1]), torch.tensor([0, pos + 1]), scale=SCALE)
    return out[0]


@pytest.mark.parametrize("requests", [
    # (computed, scheduled, prompt length): fresh prefills of several lengths
    [(0, 37, 37), (0, 101, 101), (0, 5, 5), (0, 1, 1)],
    # a chunk continuing 40 cached tokens, a prefix-cache hit of 32, a decode, a fresh prefill
    [(40, 23, 80), (32, 9, 41), (17, 1, 10), (0, 64, 64)],
])
def test_each_rank_equals_causal_attention_over_the_whole_context(requests):
    computed = [c for c, _, _ in requests]
    scheduled = [s for _, s, _ in requests]
    prompts = [p for _, _, p in requests]
    ids = torch.tensor([token_id(r, c + i) for r, (c, s, _) in enumerate(requests) for i in range(s)],
                       dtype=torch.int32)
    batch = step_input_batch(InputBuffers(8, 512, CPU), scheduled, computed, prompts, token_ids=ids)
    managers = [AscendPCPManager(2, r, CPU, max_num_reqs=8, max_num_tokens=512, max_num_blocks_per_group=[8])
                for r in range(2)]
    locals_ = [m.partition_batch(batch, None) for m in managers]
    padded = locals_[0].num_tokens_after_padding
    assert locals_[1].num_tokens_after_padding == padded
    packed = []
    for local in locals_:
        q, k, v = qkv(local.input_ids[:padded], local.positions[:padded])
        packed.append(pack_kv(k, v))
    gathered = torch.cat(packed)  # what vLLM's PCP all-gather returns: rank 0's padded tokens, then rank 1's

    key_cache = torch.zeros(len(requests) * BLOCKS_PER_REQ, BLOCK, KV_HEADS, DIM, dtype=F64)
    value_cache = torch.zeros_like(key_cache)
    for r, c in enumerate(computed):  # the context cached by earlier steps
        cids = torch.tensor([token_id(r, p) for p in range(c)], dtype=torch.int32)
        _, k, v = qkv(cids, torch.arange(c))
        slots = torch.tensor([slot(r, p) for p in range(c)], dtype=torch.int64)
        ops.reshape_and_cache(k, v, key_cache, value_cache, slots)
    # This step's tokens from every rank into the replica: each global token once, padding and duplicates at -1.
    gathered_slots = torch.full((2 * padded,), -1, dtype=torch.int64)
    for rank, local in enumerate(locals_):
        qsl = local.query_start_loc_np
        for row in range(local.num_reqs):
            req = int(local.idx_mapping_np[row])
            for t in range(int(qsl[row]), int(qsl[row + 1])):
                gathered_slots[rank * padded + t] = slot(req, int(local.positions[t]))
    cache_gathered_kv(gathered, DIM, key_cache, value_cache, gathered_slots)

    table = torch.arange(len(requests) * BLOCKS_PER_REQ, dtype=torch.int32).view(len(requests), BLOCKS_PER_REQ)
    for m, local in zip(managers, locals_, strict=True):
        n, layout = local.num_tokens, m.attention_layout
        q, _, _ = qkv(local.input_ids[:n], local.positions[:n])
        rows = table[torch.from_numpy(local.idx_mapping_np[: local.num_reqs]).long()]
        out = torch.zeros(n, HEADS, DIM, dtype=F64)
        d, t0 = (layout.first_prefill_row, layout.prefill_token_start) if layout else (local.num_reqs, n)
        if d:
            ops.paged_attention(q[:t0], key_cache, value_cache, rows[:d], local.query_start_loc[: d + 1],
                                local.seq_lens[:d], scale=SCALE, out=out[:t0])
        if layout is not None:
            chunk_attention(q[t0:n], gathered, DIM, key_cache, value_cache, rows[d:], layout, scale=SCALE,
                            out=out[t0:n])
        qsl = local.query_start_loc_np
        for row in range(local.num_reqs):
            req = int(local.idx_mapping_np[row])
            for t in range(int(qsl[row]), int(qsl[row + 1])):
                torch.testing.assert_close(out[t], reference(req, int(local.positions[t])), rtol=1e-6, atol=1e-6)
    has_context = [m.attention_layout is not None and m.attention_layout.has_context for m in managers]
    assert any(has_context) == any(c > 0 and c < p for c, _, p in requests)


def test_layout_lists_decodes_first_then_each_chunks_step_keys():
    # PCP=2, a decode and a 40-token prefill: chunks of 10; rank 0 holds the decode and chunks 0 and 3, rank 1
    # chunks 1 and 2. A chunk ending at position e sees the request's step keys 0..e-1, which sit on both ranks.
    batch = step_input_batch(InputBuffers(8, 512, CPU), [1, 40], [9, 0], [5, 40])
    m0, m1 = (AscendPCPManager(2, r, CPU, max_num_reqs=8, max_num_tokens=512, max_num_blocks_per_group=[8],
                               shard_decode_requests=True) for r in range(2))
    local0, _ = m0.partition_batch(batch, None), m1.partition_batch(batch, None)
    l0, l1 = m0.attention_layout, m1.attention_layout
    assert local0.num_reqs == 3 and l0.first_prefill_row == 1 and l0.prefill_token_start == 1
    assert l0.query_start_loc.tolist() == [0, 10, 20] and l0.kv_start_loc.tolist() == [0, 10, 50]
    assert l1.first_prefill_row == 0 and l1.query_start_loc.tolist() == [0, 10, 20]
    assert l1.kv_start_loc.tolist() == [0, 20, 50]
    assert l0.context_lens.tolist() == l1.context_lens.tolist() == [0, 0] and not l0.has_context
    # Rank 1's second chunk (positions 20-29) reads step keys 0..29: rank 0's chunk 0, then its own chunks.
    padded = local0.num_tokens_after_padding
    assert l1.kv_index[20:50].tolist() == [1 + i for i in range(10)] + [padded + i for i in range(20)]
    assert m0.last_plan.prefill_rows == 2 and m0.last_plan.buffers_in_place
