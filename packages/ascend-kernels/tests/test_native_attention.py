"""The native decode loop (`reference/native/attention.c`) against the naive float64 formulation, and the batches it
must leave to the torch formulation."""

from __future__ import annotations

import pytest
import torch
from paged_cases import run as _run  # loaded by conftest

from ascend_kernels.reference import native_attention, native_build

DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
pytestmark = pytest.mark.usefixtures("native_loops")


def _native(strided_caches, *, took=True, **case):
    """One case through ops.paged_attention (checked against the naive formulation); asserts whether the native
    loop took it."""
    before = native_build.calls()["paged_attention"]
    _run(strided_caches, **case)
    assert native_build.calls()["paged_attention"] == before + int(took), case


@DTYPES
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (8, 2), (8, 1), (12, 2)])  # GQA 1, 4, 8 and 6 (no 4-run)
def test_decode_batches(strided_caches, dtype, heads, kv_heads):
    _native(strided_caches, q_lens=[1] * 4, seq_lens=[1, 16, 33, 90], heads=heads, kv_heads=kv_heads, dtype=dtype)


@DTYPES
@pytest.mark.parametrize("length", [32, 33])  # ends exactly on a block boundary, and one past it
def test_block_boundaries_and_padding_rows(strided_caches, dtype, length):
    _native(strided_caches, q_lens=[1, 1, 1], seq_lens=[length, 16, length + 15], heads=8, kv_heads=2, dtype=dtype,
            padding_tokens=3, out=True)


@DTYPES
@pytest.mark.parametrize("window", [1, 5, 40])  # under a block, across blocks, past every context
def test_sliding_window(strided_caches, dtype, window):
    _native(strided_caches, q_lens=[1, 1, 1], seq_lens=[3, 20, 37], heads=4, kv_heads=2, dtype=dtype, window=window)


@DTYPES
def test_sinks_with_window_and_gqa(strided_caches, dtype):
    _native(strided_caches, q_lens=[1, 1], seq_lens=[20, 9], heads=8, kv_heads=2, dtype=dtype, with_sinks=True,
            window=6)


def test_value_head_size_differs_and_long_contexts(strided_caches):
    _native(strided_caches, q_lens=[1, 1], seq_lens=[300, 77], heads=4, kv_heads=2, dtype=torch.float32, head=64,
            head_v=32, block_size=32)


def test_many_requests_and_threads(strided_caches):
    """More requests than threads, and fewer (one request split into runs of KV heads across the threads)."""
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        _native(strided_caches, q_lens=[1] * 9, seq_lens=list(range(5, 95, 10)), heads=8, kv_heads=4,
                dtype=torch.float32, head=64)
        _native(strided_caches, q_lens=[1], seq_lens=[600], heads=16, kv_heads=8, dtype=torch.bfloat16, head=64)
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize(("q_lens", "seq_lens"), [([1, 2], [20, 9]), ([5], [5]), ([1, 0], [4, 4])])
def test_batches_with_other_query_lengths_stay_on_torch(strided_caches, q_lens, seq_lens):
    _native(strided_caches, took=False, q_lens=q_lens, seq_lens=seq_lens, heads=4, kv_heads=2, dtype=torch.float32)


def test_a_table_too_narrow_for_a_length_stays_on_torch():
    cache = torch.randn(4, 16, 2, 32)
    query = torch.randn(1, 2, 32)
    out = torch.empty(1, 2, 32)
    assert not native_attention.paged_decode(query, cache, cache, torch.zeros(1, 1, dtype=torch.int32),
                                             torch.tensor([17]), [0, 1], [17], 0.1, None, None, out)


def test_int64_tables_and_lengths_and_ids_past_the_cache(strided_caches):
    """int64 block tables and lengths read as such; an id past the cache is clamped as the torch formulation
    clamps it (both then read the last block)."""
    from ascend_kernels import ops

    _, k, v = strided_caches(6, 16, 2, 32, 32, torch.float32)
    query = torch.randn(2, 4, 32)
    qsl, lens = torch.tensor([0, 1, 2]), torch.tensor([20, 30])
    table = torch.tensor([[0, 9], [3, 2]])  # 9: past the 6 blocks
    got = ops.paged_attention(query, k, v, table, qsl, lens, scale=0.2)
    with pytest.MonkeyPatch.context() as m:
        m.setenv(native_build.ENV_SWITCH, "0")
        m.setattr(native_build, "_STATE", {})
        expected = ops.paged_attention(query, k, v, table, qsl, lens, scale=0.2)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_a_seq_lens_tensor_disagreeing_with_the_host_lengths_is_refused():
    """The loop reads the lengths tensor but sized its scratch from the host list: a longer tensor entry is refused
    by name, never read past the scratch or the table."""
    cache = torch.randn(4, 16, 2, 32)
    query, out = torch.randn(1, 2, 32), torch.zeros(1, 2, 32)
    table = torch.tensor([[0, 1]], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = 30 disagrees with the host lengths \(10\)"):
        native_attention.paged_decode(query, cache, cache, table, torch.tensor([30]), [0, 1], [10], 0.1, None, None,
                                      out)
    assert not out.any()
