"""The native attention loops (`reference/native/attention.c`, the decode; `attention_tiled.c`, any batch) against the
naive float64 formulation, and the calls they must leave to the torch formulation."""

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


# ------------------------------------------------------------------ the tiled loop: prefills, verifies, mixed batches


@DTYPES
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (8, 2), (8, 1), (12, 2)])
def test_tiled_mixed_prefill_decode_verify_with_padding(strided_caches, dtype, heads, kv_heads):
    # a fresh prefill, a chunked prefill continuing a context, decodes, a 3-token verify, a request with no tokens
    _native(strided_caches, q_lens=[20, 7, 1, 3, 0, 1], seq_lens=[20, 39, 48, 17, 6, 5], heads=heads,
            kv_heads=kv_heads, dtype=dtype, padding_tokens=3, out=True)


@DTYPES
def test_tiled_many_query_and_key_tiles(strided_caches, dtype):
    """Query tiles of 16 tokens (GQA 4) and key tiles of 64: a prefill of 100 tokens continuing 100 cached ones
    crosses both tile edges."""
    _native(strided_caches, q_lens=[100, 1, 70], seq_lens=[200, 129, 70], heads=8, kv_heads=2, dtype=dtype, head=64)


def test_tiled_results_do_not_depend_on_the_thread_count(strided_caches):
    """Work items are (request, query tile, KV head), each summed in one order: 1, 2 or 3 threads give the same
    bits."""
    from ascend_kernels import ops

    _, k, v = strided_caches(40, 16, 2, 64, 64, torch.float32)
    query = torch.randn(171, 8, 64)
    qsl, lens = torch.tensor([0, 100, 101, 171], dtype=torch.int32), torch.tensor([200, 129, 70], dtype=torch.int32)
    table = torch.randperm(40)[:39].view(3, 13).to(torch.int32)
    previous, results = torch.get_num_threads(), []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            results.append(ops.paged_attention(query, k, v, table, qsl, lens, scale=0.125))
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])


@DTYPES
@pytest.mark.parametrize("window", [1, 5, 40, 100])  # one key, under a block, across blocks, past every context
def test_tiled_sliding_window(strided_caches, dtype, window):
    _native(strided_caches, q_lens=[12, 1, 4, 90], seq_lens=[12, 40, 33, 95], heads=4, kv_heads=2, dtype=dtype,
            window=window)


@DTYPES
def test_tiled_sinks_with_window_and_gqa(strided_caches, dtype):
    _native(strided_caches, q_lens=[10, 1, 70], seq_lens=[30, 21, 70], heads=8, kv_heads=1, dtype=dtype,
            with_sinks=True, window=7)
    _native(strided_caches, q_lens=[9, 1, 1], seq_lens=[9, 33, 2], heads=4, kv_heads=2, dtype=dtype, with_sinks=True)


def test_tiled_non_causal(strided_caches):
    _native(strided_caches, q_lens=[6, 3, 80], seq_lens=[6, 20, 90], heads=4, kv_heads=2, dtype=torch.float32,
            causal=False)
    _native(strided_caches, q_lens=[6, 3], seq_lens=[6, 20], heads=4, kv_heads=2, dtype=torch.float32, causal=False,
            window=4)


@pytest.mark.parametrize(("head", "head_v"), [(64, 32), (32, 16), (24, 24), (80, 40), (40, 72)])
def test_tiled_head_sizes(strided_caches, head, head_v):
    """Value heads of their own size, and sizes off the 16-float vector (padded in the value tile, never written)."""
    _native(strided_caches, q_lens=[5, 1, 40], seq_lens=[5, 18, 77], heads=4, kv_heads=2, dtype=torch.float32,
            head=head, head_v=head_v, out=True, padding_tokens=2)


def test_tiled_request_shorter_than_its_queries_is_refused():
    cache = torch.randn(4, 16, 2, 32)
    query, out = torch.randn(5, 2, 32), torch.zeros(5, 2, 32)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"request 1 has 4 query tokens but seq_len 3"):
        native_attention.paged_tiled(query, cache, cache, table, [0, 1, 5], [10, 3], 0.1, True, None, None, out)
    assert not out.any()


def test_tiled_int64_tables_match_the_torch_formulation(strided_caches):
    from ascend_kernels import ops

    _, k, v = strided_caches(6, 16, 2, 32, 32, torch.float32)
    query = torch.randn(7, 4, 32)
    qsl, lens = torch.tensor([0, 5, 7]), torch.tensor([20, 30])
    table = torch.tensor([[0, 9], [3, 2]])  # 9: past the 6 blocks, clamped as the torch formulation clamps it
    before = native_build.calls()["paged_attention"]
    got = ops.paged_attention(query, k, v, table, qsl, lens, scale=0.2)
    assert native_build.calls()["paged_attention"] == before + 1
    with pytest.MonkeyPatch.context() as m:
        m.setenv(native_build.ENV_SWITCH, "0")
        m.setattr(native_build, "_STATE", {})
        expected = ops.paged_attention(query, k, v, table, qsl, lens, scale=0.2)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_a_table_too_narrow_for_a_length_stays_on_torch():
    cache = torch.randn(4, 16, 2, 32)
    query = torch.randn(1, 2, 32)
    out = torch.empty(1, 2, 32)
    table = torch.zeros(1, 1, dtype=torch.int32)
    assert not native_attention.paged_decode(query, cache, cache, table, torch.tensor([17]), [0, 1], [17], 0.1, None,
                                             None, out)
    assert not native_attention.paged_tiled(query, cache, cache, table, [0, 1], [17], 0.1, True, None, None, out)


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
