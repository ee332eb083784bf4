"""Attention of long query runs (prefills) over their gathered keys, in pieces of query rows.

Each piece of `PREFILL_ROWS` query tokens goes to torch's fused attention over only the keys it may see: with
causal masking the first piece of a 512-token prefill reads an eighth of the keys, the last all of them, so about
half the score and output work of one call over everything (torch's CPU flash kernel tiles keys 512 at a time, so
its own causal skipping saves nothing at such lengths). The query heads stay unfolded (`enable_gqa`), so neither the
queries nor the mask are copied per query head. The pieces run on the caller's threads as one-thread chunks
(`chunk_threads`), like the decode chunks: no OpenMP barrier per op on a loaded machine. Measured (1 thread,
pinned, load ~10, the benchmark's 512-token prefill, 32 q / 8 KV heads, head 128, float32): one call over the
folded query heads 164 ms, pieces of 128 rows 123 ms, of 64 rows 99 ms; vLLM's CPU attention 62 ms.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PREFILL_ROWS = 64


def _piece_mask(ctx, m, i0, i1, keys, causal, sliding_window):
    """`[n, 1, i1 - i0, keys]` bool: query i (of m, in [i0, i1)) of request r may see key j (the op's contract)."""
    device = ctx.device
    pos = (ctx - m)[:, None] + torch.arange(i0, i1, device=device)  # [n, rows]
    j = torch.arange(keys, device=device)
    mask = j[None, None, :] < ctx[:, None, None]
    if causal:
        mask = mask & (j[None, None, :] <= pos[:, :, None])
    if sliding_window is not None:
        mask = mask & (j[None, None, :] > pos[:, :, None] - sliding_window)
    return mask[:, None]


def prefill_pieces(q, k, v, ctx, lens: list[int], scale, causal, sliding_window):
    """(query row ranges, attend): `attend((i0, i1))` is the output `[n, q_heads, i1 - i0, head_v]` of query rows
    [i0, i1). The pieces are independent, so the caller may run them on several threads.

    q `[n, q_heads, m, head]`, k / v `[n, kv_heads, keys, head]` (strided views are fine), ctx the requests'
    context lengths as a tensor and `lens` as host ints; request r's query i sits at position ctx[r] - m + i.
    """
    n, hq, m, _ = q.shape
    length = k.shape[2]
    gqa = hq != k.shape[1]
    longest = max(lens)

    def attend(piece: tuple[int, int]) -> torch.Tensor:
        i0, i1 = piece
        keys = min(length, longest - m + i1) if causal else length
        visible_all = not causal and sliding_window is None and all(n_ == keys for n_ in lens)
        mask = None if visible_all else _piece_mask(ctx, m, i0, i1, keys, causal, sliding_window)
        return F.scaled_dot_product_attention(
            q[:, :, i0:i1], k[:, :, :keys], v[:, :, :keys], attn_mask=mask, scale=scale, enable_gqa=gqa
        )

    return [(i0, min(m, i0 + PREFILL_ROWS)) for i0 in range(0, m, PREFILL_ROWS)], attend
