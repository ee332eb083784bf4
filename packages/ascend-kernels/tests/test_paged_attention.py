"""paged_attention against a naive per-request, per-query formulation in float64."""

from __future__ import annotations

import pytest
import torch
from paged_cases import TOL, naive_paged_attention  # loaded by conftest
from paged_cases import run as _run

from ascend_kernels import ops

DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# The torch formulation's paths (the native decode loop, which takes decode batches first, is held to the same
# naive formulation in test_native_attention.py).
pytestmark = pytest.mark.usefixtures("torch_formulation")


@pytest.fixture(autouse=True)
def pages_in_place(monkeypatch):
    """These tests' contexts are a few blocks, which a float32 cache would gather (`GATHER_SMALL_BYTES`): they are
    written for the pages read in place, the path long contexts take; test_small_contexts_are_gathered checks the
    switch."""
    from ascend_kernels.reference import attention

    monkeypatch.setattr(attention, "GATHER_SMALL_BYTES", 0)


@pytest.mark.parametrize("gather_below", [0, None])
def test_small_contexts_are_gathered(strided_caches, monkeypatch, gather_below):
    """A float32 batch of short contexts is one gathered chunk (not a part per request read in place); past the
    threshold (0 here) the same batch is read in place. Both equal the naive formulation."""
    from ascend_kernels.reference import attention, native_build

    if gather_below is None:
        monkeypatch.undo()  # the module's threshold; the undo also switched the native loops back on: off again
        monkeypatch.setenv(native_build.ENV_SWITCH, "0")
        monkeypatch.setattr(native_build, "_STATE", {})
    else:
        monkeypatch.setattr(attention, "GATHER_SMALL_BYTES", gather_below)
    gathered, in_place = [], []
    attend, attend_pages = attention._attend_blocks, attention._attend_pages
    monkeypatch.setattr(attention, "_attend_blocks", lambda *a: gathered.append(1) or attend(*a))
    monkeypatch.setattr(attention, "_attend_pages", lambda *a: in_place.append(1) or attend_pages(*a))
    _run(strided_caches, q_lens=[1, 1, 1, 2], seq_lens=[40, 17, 64, 20], heads=8, kv_heads=2, dtype=torch.float32)
    if gather_below is None:
        assert in_place == [] and len(gathered) == 2  # the decodes' chunk and the two-row verify's
    else:
        assert gathered == [] and len(in_place) == 4


@DTYPES
def test_empty_batch(strided_caches, dtype):
    _run(strided_caches, q_lens=[], seq_lens=[], heads=4, kv_heads=1, dtype=dtype)


@DTYPES
def test_one_token(strided_caches, dtype):
    _run(strided_caches, q_lens=[1], seq_lens=[1], heads=4, kv_heads=2, dtype=dtype)


@DTYPES
@pytest.mark.parametrize("length", [32, 33])  # ends exactly on a block boundary, and one past it
def test_decode_at_block_boundaries(strided_caches, dtype, length):
    _run(strided_caches, q_lens=[1, 1, 1], seq_lens=[length, 16, length + 15], heads=8, kv_heads=2, dtype=dtype)


@DTYPES
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (8, 2), (8, 1)])  # GQA ratios 1, 4, 8
def test_mixed_prefill_decode_batch_with_padding_tokens(strided_caches, dtype, heads, kv_heads):
    # a fresh prefill, a chunked prefill continuing a context, decodes and a 3-token speculative verify
    _run(
        strided_caches,
        q_lens=[20, 7, 1, 3, 1],
        seq_lens=[20, 39, 48, 17, 5],
        heads=heads,
        kv_heads=kv_heads,
        dtype=dtype,
        padding_tokens=3,
        out=True,
    )


@DTYPES
def test_sliding_window_smaller_than_a_block(strided_caches, dtype):
    _run(strided_caches, q_lens=[12, 1, 4], seq_lens=[12, 40, 33], heads=4, kv_heads=2, dtype=dtype, window=5)


@DTYPES
def test_sinks(strided_caches, dtype):
    _run(strided_caches, q_lens=[9, 1, 1], seq_lens=[9, 33, 2], heads=4, kv_heads=2, dtype=dtype, with_sinks=True)


def test_sinks_with_sliding_window_and_gqa(strided_caches):
    _run(
        strided_caches,
        q_lens=[10, 1],
        seq_lens=[30, 21],
        heads=8,
        kv_heads=1,
        dtype=torch.float32,
        with_sinks=True,
        window=7,
    )


def test_non_causal(strided_caches):
    _run(strided_caches, q_lens=[6, 3], seq_lens=[6, 20], heads=4, kv_heads=2, dtype=torch.float32, causal=False)


def test_value_head_size_differs(strided_caches):
    _run(strided_caches, q_lens=[5, 1], seq_lens=[5, 18], heads=4, kv_heads=2, dtype=torch.float32, head_v=16)


@DTYPES
@pytest.mark.parametrize("small_rows", [0, 10**9])  # every chunk through SDPA, or every chunk through block matmuls
def test_both_attention_paths(strided_caches, monkeypatch, dtype, small_rows):
    from ascend_kernels.reference import attention

    monkeypatch.setattr(attention, "SMALL_ROWS", small_rows)
    _run(
        strided_caches,
        q_lens=[20, 7, 1, 3],
        seq_lens=[20, 39, 48, 17],
        heads=8,
        kv_heads=2,
        dtype=dtype,
        window=9 if small_rows else None,
    )


def test_chunking_over_many_requests_matches(strided_caches, monkeypatch):
    from ascend_kernels.reference import attention

    monkeypatch.setattr(attention, "CHUNK_BYTES", 1)  # one request per chunk
    _run(strided_caches, q_lens=[1, 1, 2, 2, 5], seq_lens=[17, 3, 40, 2, 5], heads=4, kv_heads=2, dtype=torch.float32)


@DTYPES
def test_packed_and_separate_caches_agree(strided_caches, dtype):
    """The allocator's packed K|V pages take the one-pass gather; the same values in separate contiguous caches
    take the two-gather path; both match the naive formulation."""
    from ascend_kernels.reference.attention import _packed_kv

    def separate(num_blocks, block_size, heads, head_size, head_size_v, dtype, *, seed=0):
        backing, k, v = strided_caches(num_blocks, block_size, heads, head_size, head_size_v, dtype, seed=seed)
        assert _packed_kv(k, v) is not None
        k, v = k.contiguous(), v.contiguous()
        assert _packed_kv(k, v) is None
        return backing, k, v

    for caches in (strided_caches, separate):
        _run(caches, q_lens=[1, 1, 1], seq_lens=[33, 16, 47], heads=8, kv_heads=2, dtype=dtype)


@DTYPES
def test_head_major_separate_caches(strided_caches, dtype):
    """Separate K and V caches laid out `[blocks, heads, block_size, head]` (one contiguous page per block and head,
    as vLLM's CPU layout) gather whole pages each, without the packed path."""
    from ascend_kernels.reference.attention import _packed_kv, _page_rows

    def head_major(num_blocks, block_size, heads, head_size, head_size_v, dtype, *, seed=0):
        backing, k, v = strided_caches(num_blocks, block_size, heads, head_size, head_size_v, dtype, seed=seed)
        k = k.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
        v = v.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
        assert _packed_kv(k, v) is None and _page_rows(k) is not None and _page_rows(v) is not None
        return backing, k, v

    _run(head_major, q_lens=[1, 1, 3], seq_lens=[33, 16, 47], heads=8, kv_heads=2, dtype=dtype)


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_page_gather_matches_advanced_indexing(strided_caches, kv_heads):
    """The one-index_select page gather reads exactly the pages the layout-agnostic gather reads."""
    from ascend_kernels.reference.attention import _gather_pages, _packed_kv, _page_rows

    _, k, v = strided_caches(9, 16, kv_heads, 32, 32, torch.float32)
    packed = _packed_kv(k, v)
    blocks = torch.tensor([[3, 0, 8], [5, 5, 1]])
    heads = torch.arange(kv_heads)
    for cache in (k, packed):
        assert _page_rows(cache) is not None or cache is k
        expected = cache.permute(0, 2, 1, 3)[blocks[:, None, :], heads[None, :, None]].reshape(2, kv_heads, 48, -1)
        torch.testing.assert_close(_gather_pages("test", cache, blocks), expected, rtol=0, atol=0)


def test_long_block_table_is_left_alone(strided_caches):
    """Out-of-range padding ids in the caller's table are clamped on a copy, never in place."""
    _, k, v = strided_caches(4, 16, 2, 32, 32, torch.float32)
    table = torch.tensor([[2, 1, 99]])
    ops.paged_attention(
        torch.randn(1, 4, 32),
        k,
        v,
        table,
        torch.tensor([0, 1], dtype=torch.int32),
        torch.tensor([20], dtype=torch.int32),
        scale=0.2,
    )
    assert table.tolist() == [[2, 1, 99]]


def test_block_path_runs_on_one_intra_op_thread_and_restores_the_callers(strided_caches, monkeypatch):
    from ascend_kernels.reference import attention

    seen, in_place = [], []
    attend, attend_pages = attention._attend_blocks, attention._attend_pages
    monkeypatch.setattr(attention, "_attend_blocks", lambda *a: seen.append(torch.get_num_threads()) or attend(*a))
    monkeypatch.setattr(
        attention, "_attend_pages", lambda *a: in_place.append(torch.get_num_threads()) or attend_pages(*a)
    )
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        # with sinks: one chunk of gathered pages; without: the pages read in place, a part per request
        _run(strided_caches, q_lens=[1, 1], seq_lens=[20, 9], heads=4, kv_heads=2, dtype=torch.float32, with_sinks=True)
        assert seen == [1] and in_place == [] and torch.get_num_threads() == 2
        _run(strided_caches, q_lens=[1, 1], seq_lens=[20, 9], heads=4, kv_heads=2, dtype=torch.float32)
        assert seen == [1] and in_place == [1, 1] and torch.get_num_threads() == 2
        _, k, v = strided_caches(4, 16, 2, 32, 32, torch.float32)
        with pytest.raises(RuntimeError):  # 3 query heads over 2 KV heads fail inside the chunk loop
            attention.paged_attention(
                torch.randn(1, 3, 32), k, v, torch.tensor([[0]]), torch.tensor([0, 1]), torch.tensor([5]), scale=0.2
            )
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)


def test_one_thread_window_works_where_a_bound_worker_froze_set_num_threads(monkeypatch):
    """vLLM's CPU worker (and ours) replace torch.set_num_threads with a warning no-op after binding threads."""
    import ascend_kernels.reference.attention as attention

    calls = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(n))
    previous = torch.get_num_threads()
    torch._C.set_num_threads(2)
    try:
        with attention._one_intra_op_thread():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2 and calls == []
    finally:
        torch._C.set_num_threads(previous)


@DTYPES
def test_chunks_shared_between_two_threads_match(strided_caches, monkeypatch, dtype):
    """With two intra-op threads the chunks run on two Python threads (each its own workspaces) at the same time:
    the first two chunks each wait for the other to start, so one thread alone would break the barrier."""
    import threading

    from ascend_kernels.reference import attention

    monkeypatch.setattr(attention, "CHUNK_BYTES", 1)  # one request per chunk
    previous = torch.get_num_threads()
    torch._C.set_num_threads(2)
    try:
        # the gathered pages (sinks; reduced precision always) and the pages read in place (float32, none) alike
        in_place = "_attend_pages" if dtype == torch.float32 else "_attend_blocks"
        for name, with_sinks in (("_attend_blocks", True), (in_place, False)):
            both_started = threading.Barrier(2, timeout=30)
            calls = []
            attend = getattr(attention, name)

            def first_two_meet(*args, attend=attend, calls=calls, both_started=both_started):
                calls.append(threading.get_ident())
                if len(calls) <= 2:
                    both_started.wait()
                return attend(*args)

            monkeypatch.setattr(attention, name, first_two_meet)
            _run(
                strided_caches,
                q_lens=[1, 1, 4, 1, 1, 2],
                seq_lens=[40, 17, 33, 5, 64, 20],
                heads=8,
                kv_heads=2,
                dtype=dtype,
                with_sinks=with_sinks,
            )
            assert len(set(calls)) == 2 and torch.get_num_threads() == 2
    finally:
        torch._C.set_num_threads(previous)


@DTYPES
def test_query_inside_a_fused_qkv_buffer(strided_caches, dtype):
    """The query as the model hands it: a slice of a wider per-token buffer, its tokens not contiguous."""
    _, k, v = strided_caches(12, 16, 2, 32, 32, dtype)
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(4, (8 + 2 * 2) * 32, generator=gen).to(dtype)
    query = qkv[:, : 8 * 32].view(4, 8, 32)
    assert not query.is_contiguous()
    table = [[3, 7, 1], [0, 5, 9], [2, 4, 11], [6, 8, 10]]
    qsl, seq_lens = [0, 1, 2, 3, 4], [40, 33, 17, 48]
    result = ops.paged_attention(
        query,
        k,
        v,
        torch.tensor(table, dtype=torch.int32),
        torch.tensor(qsl, dtype=torch.int32),
        torch.tensor(seq_lens, dtype=torch.int32),
        scale=32**-0.5,
    )
    expected = naive_paged_attention(query, k, v, table, qsl, seq_lens, 32**-0.5, True, None, None)
    torch.testing.assert_close(result.double(), expected, **TOL[dtype])


@DTYPES
def test_requests_split_into_kv_head_groups(strided_caches, monkeypatch, dtype):
    """A request over the chunk budget runs as groups of KV heads (here one head each), sinks and masks included."""
    from ascend_kernels.reference import attention

    monkeypatch.setattr(attention, "CHUNK_BYTES", 1)
    parts = []
    attend = attention._attend_blocks
    monkeypatch.setattr(attention, "_attend_blocks", lambda q, k, *a: parts.append(k.shape[0]) or attend(q, k, *a))
    _run(
        strided_caches,
        q_lens=[1, 3, 1],
        seq_lens=[40, 21, 33],
        heads=8,
        kv_heads=4,
        dtype=dtype,
        with_sinks=True,
        window=19,
    )
    assert parts == [1] * 12  # 3 requests x 4 KV heads, one (request, head) matrix each


@pytest.mark.parametrize("path", ["native", "gather_then_convert", "convert_per_block"])
@pytest.mark.parametrize("separate", [False, True])  # the allocator's packed K|V pages, separate contiguous caches
def test_reduced_precision_where_the_cpu_only_emulates_it(strided_caches, monkeypatch, path, separate):
    """Where torch's CPU matmul only emulates bfloat16 (no oneDNN support), a call with sinks runs the block matmuls
    on float32 pages (gathered then converted, or converted block by block into place) and one without goes to
    torch's fused attention over the bfloat16 pages; natively the block matmuls take the pages as they are. Every
    way matches the naive formulation: masks or none, GQA, KV-head groups, a distinct V head size."""
    from ascend_kernels.reference import attention

    emulated = path != "native"
    monkeypatch.setattr(attention, "_emulated_matmul", lambda dtype: emulated and dtype == torch.bfloat16)
    monkeypatch.setattr(attention, "PAGE_COPY_MIN_BYTES", 0 if path == "convert_per_block" else 1 << 40)
    monkeypatch.setattr(attention, "CHUNK_BYTES", 1)  # every request as groups of KV heads
    seen = []  # (pages dtype, sinks given) per block-path part
    attend = attention._attend_blocks
    monkeypatch.setattr(
        attention, "_attend_blocks", lambda q, k, *a: seen.append((k.dtype, a[-1] is not None)) or attend(q, k, *a)
    )
    fused = []
    sdpa = attention.F.scaled_dot_product_attention
    monkeypatch.setattr(
        attention.F,
        "scaled_dot_product_attention",
        lambda *a, **kw: fused.append((a[1].dtype, a[1].dim())) or sdpa(*a, **kw),
    )
    converting = attention._converting_reader
    readers = []
    monkeypatch.setattr(attention, "_converting_reader", lambda *a: readers.append(a) or converting(*a))

    def caches(*args, **kwargs):
        backing, k, v = strided_caches(*args, **kwargs)
        return (backing, k.contiguous(), v.contiguous()) if separate else (backing, k, v)

    _run(
        caches,
        q_lens=[1, 1, 3],
        seq_lens=[32, 33, 21],
        heads=8,
        kv_heads=2,
        dtype=torch.bfloat16,
        with_sinks=True,
        window=19,
    )
    _run(caches, q_lens=[1, 1, 2], seq_lens=[16, 47, 30], heads=8, kv_heads=4, dtype=torch.bfloat16)
    _run(caches, q_lens=[1, 1], seq_lens=[32, 16], heads=8, kv_heads=2, dtype=torch.bfloat16, head_v=16)  # no mask
    if emulated:
        assert {dtype for dtype, sinks in seen if sinks} == {torch.float32}
        assert {dtype for dtype, sinks in seen if not sinks} == {torch.bfloat16}
        # four-dimensional operands: with three, torch's CPU attention falls back to its unfused (emulated) matmuls
        assert fused and set(fused) == {(torch.bfloat16, 4)}
    else:
        assert {dtype for dtype, _ in seen} == {torch.bfloat16} and not fused
    assert len(readers) == (1 if path == "convert_per_block" else 0)


def test_emulated_matmul_follows_torchs_onednn_probe():
    from ascend_kernels.reference.attention import _emulated_matmul

    assert not _emulated_matmul(torch.float32) and not _emulated_matmul(torch.float64)
    if torch.backends.mkldnn.is_available():
        assert _emulated_matmul(torch.bfloat16) == (not torch.ops.mkldnn._is_mkldnn_bf16_supported())
        assert _emulated_matmul(torch.float16) == (not torch.ops.mkldnn._is_mkldnn_fp16_supported())
    else:
        assert _emulated_matmul(torch.bfloat16) and _emulated_matmul(torch.float16)


@DTYPES
@pytest.mark.parametrize(("causal", "window"), [(True, None), (True, 11), (False, None)])
def test_prefills_in_pieces_of_query_rows(strided_caches, monkeypatch, dtype, causal, window):
    """Long query runs go to torch's fused attention a few query rows at a time, each piece over only the keys it
    may see: equal-length prefills in one chunk (consecutive and not), with and without earlier context."""
    from ascend_kernels.reference import attention, paged_prefill

    monkeypatch.setattr(attention, "SMALL_ROWS", 0)
    monkeypatch.setattr(paged_prefill, "PREFILL_ROWS", 5)
    keys_read = []
    sdpa = attention.F.scaled_dot_product_attention
    monkeypatch.setattr(
        paged_prefill.F,
        "scaled_dot_product_attention",
        lambda q, k, *a, **kw: keys_read.append(k.shape[2]) or sdpa(q, k, *a, **kw),
    )
    _run(
        strided_caches,
        q_lens=[12, 12, 3, 12],
        seq_lens=[12, 30, 40, 12],
        heads=8,
        kv_heads=2,
        dtype=dtype,
        causal=causal,
        window=window,
    )
    # The 12-row runs (one chunk, longest context 30, 2 blocks of 16) in pieces of 5, 5 and 2 rows read 23, 28 and
    # 30 keys causally, all 32 gathered otherwise; the 3-row run one piece of 40 keys (of 48).
    assert sorted(keys_read) == ([23, 28, 30, 40] if causal else [32, 32, 32, 48])


@pytest.mark.parametrize("layout", ["planes", "strided"])
def test_runs_of_consecutive_blocks(strided_caches, monkeypatch, layout):
    """A request's consecutive block ids are read as one view per run where the blocks lie back to back (the device
    KV layout's dense token-major planes), block by block where they do not (per-layer pages interleaved in one
    backing); both match the naive formulation."""
    from ascend_kernels.reference import paged_blocks

    _, k, v = strided_caches(12, 16, 2, 32, 32, torch.float32)
    if layout == "planes":
        k, v = k.contiguous(), v.contiguous()
    runs = []
    find_runs = paged_blocks._runs
    monkeypatch.setattr(paged_blocks, "_runs", lambda *a: runs.append(find_runs(*a)) or runs[-1])
    gen = torch.Generator().manual_seed(5)
    query = torch.randn(3, 8, 32, generator=gen)
    table = [[2, 3, 4, 9], [7, 8, 0, 1], [5, 6, 10, 11]]
    qsl, seq_lens = [0, 1, 2, 3], [64, 50, 33]
    result = ops.paged_attention(
        query,
        k,
        v,
        torch.tensor(table, dtype=torch.int32),
        torch.tensor(qsl, dtype=torch.int32),
        torch.tensor(seq_lens, dtype=torch.int32),
        scale=32**-0.5,
    )
    expected = naive_paged_attention(query, k, v, table, qsl, seq_lens, 32**-0.5, True, None, None)
    torch.testing.assert_close(result.double(), expected, **TOL[torch.float32])
    counts = sorted(tuple(count for _, _, count in r) for r in runs)
    assert counts == ([(1, 1, 1), (1, 1, 1, 1), (1, 1, 1, 1)] if layout == "strided" else [(2, 1), (2, 2), (3, 1)])
