"""A decode batch over small contexts as one fused attention call: the batch's pages gathered by one index_select
per cache, then torch's scaled_dot_product_attention under a length mask.

Where a decode step's keys and values are a few hundred KiB (a small model, short contexts) the op's time is torch
dispatch, not bytes: the general path (`attention.paged_attention`: chunks, KV-head groups, block matmuls, an
explicit mask and softmax) makes some 40 torch calls a step for what SDPA does in one. Measured with 2 threads, 4
decodes, block 32, a fragmented table, quiet machine (general path / this one, us; gathered K+V in brackets):
float32 2 q / 2 KV heads, head 32: ctx 64 300 / 82 (128 KiB), ctx 256 385 / 87 (512 KiB), ctx 1,024 552 / 199
(2 MiB); 8 q / 2 KV heads, head 64: ctx 64 312 / 133, ctx 256 521 / 175 (1 MiB); but 32 q / 8 KV heads, head 128:
ctx 64 556 / 908 (2 MiB), ctx 256 3,230 / 6,321 (8 MiB). bfloat16 gained at every size tried up to 16 MiB (e.g.
32 / 8 heads, ctx 1,024: 9,305 / 5,567) but lost at the kernel benchmark's 8 x 1,024 (24 / 28-35 ms). Hence one
bound for every dtype, below where either dtype lost.

What a step's layers share is derived once per step (`step_plan`): the decision, the clamped block ids and the length
mask depend on the batch, not on the layer, so a layer reusing them is two gathers and one SDPA (4 decodes, 2 + 2
heads of 32, best of 7: 83 -> 55 us a call).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

# Gathered K and V bytes of the whole batch up to which a decode batch takes this path.
SMALL_DECODE_BYTES = 1 << 20

_POSITIONS: dict[torch.device, torch.Tensor] = {}


def _positions(length: int, device: torch.device) -> torch.Tensor:
    """arange(length) on `device`, a view of a cached table that grows as longer contexts come."""
    table = _POSITIONS.get(device)
    if table is None or table.numel() < length:
        table = torch.arange(max(length, 4096), device=device)
        _POSITIONS[device] = table
    return table[:length]


def fits(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, qlens: list[int],
         lens: list[int], sinks) -> bool:
    """Whether a batch is a small decode this path computes as the general one does: one query token per request
    over a context of at least one key, no sink logits, K and V of one head size and the query's dtype, and the
    batch's gathered pages within SMALL_DECODE_BYTES."""
    if sinks is not None or not qlens or any(q != 1 for q in qlens) or min(lens) < 1:
        return False
    if not (query.dtype == key_cache.dtype == value_cache.dtype) or value_cache.shape[3] != key_cache.shape[3]:
        return False
    _, bs, hkv, d = key_cache.shape
    blocks = -(-max(lens) // bs)
    return len(lens) * blocks * bs * hkv * 2 * d * key_cache.element_size() <= SMALL_DECODE_BYTES


@dataclass(frozen=True, slots=True)
class DecodePlan:
    """A small decode batch's layer-independent part: `ids` the `[requests * blocks]` block ids each request reads
    (clamped into the cache), `mask` the `[requests, 1, 1, length]` additive length mask (0 visible, -inf not)."""

    requests: int
    length: int
    ids: torch.Tensor
    mask: torch.Tensor


def make_plan(query: torch.Tensor, key_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
              lens: list[int], sliding_window: int | None) -> DecodePlan:
    """block_table `[requests, >= blocks]` int32/int64 block ids; seq_lens the context lengths on the device (the mask
    reads them there); lens the same on the host. A request sees keys `[ctx - sliding_window, ctx)`."""
    r = len(lens)
    num_blocks, bs = key_cache.shape[0], key_cache.shape[1]
    blocks = -(-max(lens) // bs)
    length = blocks * bs
    ids = block_table[:r, :blocks].reshape(-1).clamp(0, num_blocks - 1)
    j = _positions(length, key_cache.device)
    ctx = seq_lens[:r, None]
    visible = j < ctx
    if sliding_window is not None:
        visible &= j >= ctx - sliding_window
    # what SDPA makes of a boolean mask, made once per step here instead of once per layer there
    mask = torch.zeros((r, 1, 1, length), dtype=query.dtype, device=query.device)
    mask.masked_fill_(visible.logical_not_().view(r, 1, 1, length), float("-inf"))
    return DecodePlan(requests=r, length=length, ids=ids, mask=mask)


class _StepMemo(threading.local):
    """The plans made for the host lengths list `lens` of the step being run (one per batch shape and cache)."""

    def __init__(self) -> None:
        self.lens: list[int] | None = None
        self.plans: dict[tuple, DecodePlan | None] = {}
        # the objects whose ids are in the keys, held so that no other object can take their ids within the step
        self.held: list[object] = []


_MEMO = _StepMemo()


def step_plan(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, block_table: torch.Tensor,
              seq_lens: torch.Tensor, starts: list[int], lens: list[int], sliding_window: int | None,
              small: Callable[[], bool]) -> DecodePlan | None:
    """The batch's plan when `small()` (the caller's decision that this batch takes this path), else None; both
    remembered for the step.

    A step is one host lengths list: the attention backend builds `starts` / `lens` once per step and hands the same
    lists to every layer, and a different list object starts a new memo. Within it a plan is reused by a layer
    with the same block table and seq_lens tensors, unchanged since (torch's in-place version counter; tensors made
    under inference mode have none, and get a plan per call), over a cache of the same shape, dtype and window; so
    the op's contract that the host lists equal the tensors is all it relies on, and a caller that rewrote a list
    in place would have to pass a new one anyway.
    """
    if block_table.is_inference() or seq_lens.is_inference():
        # tensors made under inference mode track no version: nothing would show a rewrite, so no reuse
        return make_plan(query, key_cache, block_table, seq_lens, lens, sliding_window) if small() else None
    memo = _MEMO
    if memo.lens is not lens:
        memo.lens, memo.plans, memo.held = lens, {}, []
    key = (id(starts), id(block_table), block_table._version, id(seq_lens), seq_lens._version, key_cache.shape,
           key_cache.dtype, value_cache.shape, query.shape[1:], query.dtype, sliding_window, key_cache.device)
    try:
        return memo.plans[key]
    except KeyError:
        pass
    plan = make_plan(query, key_cache, block_table, seq_lens, lens, sliding_window) if small() else None
    memo.plans[key] = plan
    memo.held += (starts, block_table, seq_lens)
    return plan


def attend_small_decode(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, plan: DecodePlan,
                        scale: float, out: torch.Tensor) -> torch.Tensor:
    """Writes the decode of the first `plan.requests` query rows (one per request) into `out` and returns it."""
    r, length = plan.requests, plan.length
    _, _, hkv, d = key_cache.shape
    hq = query.shape[1]
    k = key_cache.index_select(0, plan.ids).view(r, length, hkv, d).transpose(1, 2)
    v = value_cache.index_select(0, plan.ids).view(r, length, hkv, d).transpose(1, 2)
    o = F.scaled_dot_product_attention(query[:r].reshape(r, hkv, hq // hkv, d), k, v, attn_mask=plan.mask,
                                       scale=scale)
    out[:r].copy_(o.view(r, hq, d))
    return out
