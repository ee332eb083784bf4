"""The small-decode path of paged_attention (`reference.paged_small_decode`): which batches take it, its per-step
plan, and what stays on the general path; each against the naive float64 formulation."""

from __future__ import annotations

import pytest
import torch
from paged_cases import TOL, naive_paged_attention  # loaded by conftest
from paged_cases import run as _run

from ascend_kernels import ops

DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# The torch formulation's small-decode path (the native decode loop, which takes decode batches first, is held to the
# same naive formulation in test_native_attention.py).
pytestmark = pytest.mark.usefixtures("torch_formulation")


@DTYPES
@pytest.mark.parametrize(("heads", "kv_heads", "window"), [(8, 2, None), (4, 4, 21), (8, 1, None)])
def test_small_decode_batches_take_one_fused_call(strided_caches, monkeypatch, dtype, heads, kv_heads, window):
    """A decode-only batch whose pages are small (`paged_small_decode`) is one SDPA call over the gathered pages, and
    equals the naive formulation: fragmented blocks, contexts ending on and past block edges, GQA, a sliding window,
    padding tokens after the batch."""
    from ascend_kernels.reference import attention, paged_small_decode

    fused = []
    attend = paged_small_decode.attend_small_decode
    monkeypatch.setattr(paged_small_decode, "attend_small_decode", lambda *a: fused.append(1) or attend(*a))
    monkeypatch.setattr(attention, "_attend_blocks", lambda *a: pytest.fail("the general path ran"))
    _run(strided_caches, q_lens=[1, 1, 1, 1], seq_lens=[40, 17, 64, 1], heads=heads, kv_heads=kv_heads, dtype=dtype,
         window=window, padding_tokens=2, out=True)
    assert fused == [1]


def test_a_small_decode_plan_is_made_once_per_step(strided_caches, monkeypatch):
    """Layers of one step (the same host lists, block table and seq_lens) share one plan; a block table rewritten in
    place, or the next step's host lists, make a new one; every layer still equals the naive formulation."""
    from ascend_kernels.reference import paged_small_decode

    made = []
    make = paged_small_decode.make_plan
    monkeypatch.setattr(paged_small_decode, "make_plan", lambda *a: made.append(1) or make(*a))
    seq_lens, block_size, heads, kv_heads, head = [40, 17, 64], 16, 4, 2, 32
    gen = torch.Generator().manual_seed(3)
    layers = [strided_caches(16, block_size, kv_heads, head, head, torch.float32, seed=seed)[1:] for seed in (1, 2)]
    table = torch.tensor([[3, 5, 7, 0], [9, 2, 0, 0], [1, 4, 6, 8]], dtype=torch.int32)
    qsl = torch.arange(4, dtype=torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)

    def step(starts: list[int], host_lens: list[int]) -> None:
        for k_cache, v_cache in layers:
            query = torch.randn(3, heads, head, generator=gen)
            got = ops.paged_attention(query, k_cache, v_cache, table, qsl, lens, scale=0.2,
                                      query_start_loc_host=starts, seq_lens_host=host_lens)
            expected = naive_paged_attention(query, k_cache, v_cache, table.tolist(), [0, 1, 2, 3], seq_lens, 0.2,
                                             True, None, None)
            torch.testing.assert_close(got.double(), expected, **TOL[torch.float32])

    starts, host_lens = [0, 1, 2, 3], list(seq_lens)
    step(starts, host_lens)
    assert len(made) == 1  # two layers, one plan
    table[2, 1] = 10  # the table rewritten in place within the step
    step(starts, host_lens)
    assert len(made) == 2
    step([0, 1, 2, 3], list(seq_lens))  # the next step's lists
    assert len(made) == 3
    with torch.inference_mode():  # inference tensors track no version: a plan per call, and still right
        table, lens = table.clone(), lens.clone()
        step(starts, host_lens)
        table[0, 0] = 11
        step(starts, host_lens)
    assert len(made) == 7


@pytest.mark.parametrize("case", ["sinks", "verify", "over_the_bound"])
def test_other_batches_stay_on_the_general_path(strided_caches, monkeypatch, case):
    """Sinks, a multi-token query and pages over SMALL_DECODE_BYTES keep the general path (and still match)."""
    from ascend_kernels.reference import paged_small_decode

    monkeypatch.setattr(paged_small_decode, "attend_small_decode", lambda *a: pytest.fail("the fused path ran"))
    if case == "over_the_bound":
        monkeypatch.setattr(paged_small_decode, "SMALL_DECODE_BYTES", 1024)
    _run(strided_caches, q_lens=[1, 2 if case == "verify" else 1], seq_lens=[40, 17], heads=8, kv_heads=2,
         dtype=torch.float32, with_sinks=case == "sinks")
