"""The gated delta rule bindings (`ascend_kernels.npu_gdn`) over the testkit's torch_npu, against the reference on
the same inputs: a strided state pool as vLLM's hybrid cache hands it over, GQA heads, padded decode rows, fresh and
resumed prefills, an empty sequence; and the fake's refusals of what the kernels do not take."""

from __future__ import annotations

import re

import pytest
import torch

from ascend_kernels import npu_gdn, npu_usage
from ascend_kernels.reference import gdn as ref
from ascend_testkit import torch_npu as fake

HK, HV, D = 2, 4, 128
# bfloat16 inputs, the kernels' float32 accumulation and a bfloat16 state written back per call.
TOL = {"atol": 2e-2, "rtol": 2e-2}


@pytest.fixture(autouse=True)
def _fresh_counts(torch_npu):  # the fake installed by conftest's `torch_npu`
    fake.reset_calls()
    npu_usage.reset()


def _pool(g, slots: int = 6, dtype=torch.bfloat16) -> torch.Tensor:
    """States `[slots, HV, D, D]` as a strided view: each slot inside a larger page, as the hybrid cache lays them
    (float32 is vLLM's default for GDN recurrent states, bfloat16 what the kernels take)."""
    pages = torch.randn(slots, HV * D * D + 64, generator=g).mul_(0.1).to(dtype)
    return pages[:, :HV * D * D].view(slots, HV, D, D)


def _tokens(g, n: int, dtype=torch.bfloat16):
    q = torch.randn(n, HK, D, generator=g).to(dtype)
    k = torch.randn(n, HK, D, generator=g).to(dtype)
    v = torch.randn(n, HV, D, generator=g).to(dtype)
    gate = -torch.rand(n, HV, generator=g)
    beta = torch.rand(n, HV, generator=g)
    return q, k, v, gate, beta


POOL_DTYPES = pytest.mark.parametrize("pool_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])


@POOL_DTYPES
def test_chunk_matches_the_reference_with_fresh_resumed_and_empty_sequences(pool_dtype):
    g = torch.Generator().manual_seed(0)
    q, k, v, gate, beta = _tokens(g, 29)
    pool = _pool(g, dtype=pool_dtype)
    starts = torch.tensor([0, 17, 17, 29], dtype=torch.int32)  # 17 tokens, an empty sequence, 12 tokens
    slots = torch.tensor([4, 0, 1], dtype=torch.int32)
    initial = torch.tensor([False, True, True])
    want_pool = pool.clone()
    want = ref.chunk_gated_delta_rule(q, k, v, gate, beta, want_pool, starts, slots, initial, scale=D ** -0.5)
    got = npu_gdn.chunk_gated_delta_rule(q, k, v, gate, beta, pool, starts, slots, initial, scale=D ** -0.5)
    torch.testing.assert_close(got.float(), want.float(), **TOL)
    torch.testing.assert_close(pool.float(), want_pool.float(), **TOL)
    assert fake.calls() == {"npu_chunk_gated_delta_rule": 1}
    assert not npu_usage.snapshot()["fallbacks"]


@POOL_DTYPES
def test_recurrent_matches_the_reference_over_a_strided_pool_with_padded_rows(pool_dtype):
    g = torch.Generator().manual_seed(1)
    q, k, v, gate, beta = _tokens(g, 4)
    pool = _pool(g, dtype=pool_dtype)
    slots = torch.tensor([3, -1, 0, 5], dtype=torch.int32)  # row 1 is padding
    want_pool = pool.clone()
    want = ref.recurrent_gated_delta_rule(q, k, v, gate, beta, want_pool, slots, scale=D ** -0.5)
    got = npu_gdn.recurrent_gated_delta_rule(q, k, v, gate, beta, pool, slots, scale=D ** -0.5)
    torch.testing.assert_close(got.float(), want.float(), **TOL)
    assert not got[1].any()
    torch.testing.assert_close(pool.float(), want_pool.float(), **TOL)
    assert torch.equal(pool[[1, 2, 4]], want_pool[[1, 2, 4]])  # untouched slots
    assert pool.dtype == pool_dtype
    assert fake.calls() == {"npu_recurrent_gated_delta_rule": 1}


def test_a_dense_pool_is_updated_in_place_by_the_kernel():
    g = torch.Generator().manual_seed(2)
    q, k, v, gate, beta = _tokens(g, 2)
    pool = _pool(g).contiguous()
    slots = torch.tensor([2, 1], dtype=torch.int32)
    want_pool = pool.clone()
    ref.recurrent_gated_delta_rule(q, k, v, gate, beta, want_pool, slots, scale=D ** -0.5)
    npu_gdn.recurrent_gated_delta_rule(q, k, v, gate, beta, pool, slots, scale=D ** -0.5)
    torch.testing.assert_close(pool.float(), want_pool.float(), **TOL)


def test_what_the_kernels_do_not_take_runs_the_reference_and_says_why():
    g = torch.Generator().manual_seed(3)
    q, k, v, gate, beta = _tokens(g, 3, dtype=torch.float16)
    pool = _pool(g).to(torch.float16)
    slots = torch.tensor([0, 1, 2], dtype=torch.int32)
    npu_gdn.recurrent_gated_delta_rule(q, k, v, gate, beta, pool, slots, scale=D ** -0.5)
    q64 = torch.randn(3, HK, 64, generator=g).to(torch.bfloat16)
    pool64 = torch.zeros(4, HV, D, 64, dtype=torch.bfloat16)
    npu_gdn.chunk_gated_delta_rule(q64, q64.clone(), v.to(torch.bfloat16), gate, beta, pool64,
                                   torch.tensor([0, 3]), torch.tensor([1]), torch.tensor([False]), scale=0.125)
    assert fake.calls() == {}
    reasons = npu_usage.snapshot()["fallback_reasons"]
    assert "torch.float16" in reasons["recurrent_gated_delta_rule"], reasons
    assert "Dk = Dv = 128" in reasons["chunk_gated_delta_rule"], reasons


@pytest.mark.parametrize("tokens, lengths, value_dtype, message", [
    (3, [1, 1, 1], torch.float32, "value dtype must be one of bfloat16"),
    (3, [2, 2], torch.bfloat16, "must sum to T=3"),
    (9, [9], torch.bfloat16, "each in [1, 8]"),
])
def test_the_fake_refuses_what_torch_npu_documents_it_refuses(torch_npu, tokens, lengths, value_dtype, message):
    q = torch.nn.functional.normalize(torch.randn(tokens, HK, D), dim=-1).to(torch.bfloat16)
    v = torch.randn(tokens, HV, D).to(value_dtype)
    state = torch.zeros(tokens, HV, D, D, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=re.escape(message)):
        torch_npu.npu_recurrent_gated_delta_rule(
            q, q.clone(), v, state, beta=torch.rand(tokens, HV).to(torch.bfloat16), scale=D ** -0.5,
            actual_seq_lengths=torch.tensor(lengths, dtype=torch.int32),
            ssm_state_indices=torch.arange(tokens, dtype=torch.int32), g=-torch.rand(tokens, HV))
