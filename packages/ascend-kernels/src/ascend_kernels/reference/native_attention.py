"""The reference's paged attention on its native loops, when the batch suits them.

- `paged_decode` (`native/attention.c`): every request one query token, the loop over each request's keys.
- `paged_tiled` (`native/attention_tiled.c`): any batch (prefills, verify batches, mixed), query-row tiles against
  key tiles with an online softmax; optionally each row's log-sum-exp (`context_parallel.paged_attention_with_lse`).

Both return False (nothing written) and `attention.paged_attention`'s torch formulation runs when: no library
(`native_build.status()` says why), an empty context, a table too narrow for a length, a device other than the host,
dtypes other than float32 / bfloat16 / float16 or not one dtype for query, caches and output, query heads not a
multiple of the KV heads, or tracing under torch.compile.
"""

from __future__ import annotations

import torch

from ascend_kernels.reference import native_build
from ascend_kernels.reference.native_layers import DTYPE_CODES, host_index, host_tensors


def _takes(query, key_cache, value_cache, block_table, out, lens: list[int]) -> bool:
    """The layout and dtype checks both loops share."""
    if not host_tensors(query, key_cache, value_cache, out) or not host_index(block_table):
        return False
    if not (query.dtype == key_cache.dtype == value_cache.dtype == out.dtype):
        return False
    if query.stride(2) != 1 or key_cache.stride(3) != 1 or value_cache.stride(3) != 1 or out.stride(2) != 1:
        return False
    if query.shape[1] % key_cache.shape[2] != 0:
        return False
    # a length past the table's blocks: the torch formulation reports what it reads
    return max(lens) <= block_table.shape[1] * key_cache.shape[1]


def _sink_logits(sinks) -> torch.Tensor | None | bool:
    """sinks as contiguous float32 host logits, None without sinks, False when the loops cannot read them."""
    if sinks is None:
        return None
    if not sinks.is_cpu or type(sinks) not in (torch.Tensor, torch.nn.Parameter):
        return False
    return sinks.detach().float().contiguous()


def _cache_args(query, key_cache, value_cache, block_table) -> tuple:
    return (
        query.data_ptr(), query.stride(0), query.stride(1),
        key_cache.data_ptr(), key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.data_ptr(), value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        DTYPE_CODES[query.dtype], block_table.data_ptr(), int(block_table.dtype == torch.int64), block_table.stride(0),
        block_table.shape[1], key_cache.shape[0],
    )


def paged_decode(query, key_cache, value_cache, block_table, seq_lens, starts: list[int], lens: list[int], scale,
                 sliding_window, sinks, out) -> bool:
    """`attention.paged_attention` for a decode batch (`starts` and `lens` its host lists), written into out."""
    lib = native_build.library()
    requests = block_table.shape[0]
    if lib is None or not lens or starts != list(range(requests + 1)) or min(lens) < 1:
        return False
    if not _takes(query, key_cache, value_cache, block_table, out, lens) or not host_index(seq_lens):
        return False
    if seq_lens.dim() != 1 or seq_lens.shape[0] < requests:
        return False
    sink_logits = _sink_logits(sinks)
    if sink_logits is False:
        return False
    _, bs, hkv, d = key_cache.shape
    max_len = max(lens)
    window = 0 if sliding_window is None else int(sliding_window)
    rc = lib.ak_paged_decode(
        *_cache_args(query, key_cache, value_cache, block_table),
        seq_lens.data_ptr(), int(seq_lens.dtype == torch.int64), requests,
        query.shape[1], hkv, d, value_cache.shape[3], bs, float(scale), window,
        None if sink_logits is None else sink_logits.data_ptr(), out.data_ptr(), out.stride(0), out.stride(1),
        min(max_len, window) if window else max_len,
        torch.get_num_threads(),
    )
    if rc > 0:
        raise ValueError(f"paged_attention: seq_lens[{rc - 1}] = {int(seq_lens[rc - 1])} disagrees with the host "
                         f"lengths ({lens[rc - 1]}) or the block table's {block_table.shape[1]} blocks")
    if rc < 0:
        raise MemoryError(f"paged_attention: the native loop could not allocate its scratch for {max_len} keys")
    native_build.record("paged_attention")
    return True


def paged_tiled(query, key_cache, value_cache, block_table, starts: list[int], lens: list[int], scale, causal,
                sliding_window, sinks, out, lse=None) -> bool:
    """`attention.paged_attention` for any batch by its host lists `starts` and `lens`, written into out; with `lse`
    (float32 `[tokens, heads]`, heads dense) each row's log-sum-exp of its scaled scores too."""
    lib = native_build.library()
    requests = block_table.shape[0]
    if lib is None or not lens or len(starts) != requests + 1 or len(lens) < requests or max(lens) < 1:
        return False
    if starts[0] < 0 or starts[-1] > min(query.shape[0], out.shape[0]):
        return False
    if not _takes(query, key_cache, value_cache, block_table, out, lens):
        return False
    sink_logits = _sink_logits(sinks)
    if sink_logits is False:
        return False
    if lse is not None and (not host_tensors(lse) or lse.dtype != torch.float32 or lse.dim() != 2
                            or lse.shape[0] < starts[-1] or lse.shape[1] != query.shape[1] or lse.stride(1) != 1):
        return False
    _, bs, hkv, d = key_cache.shape
    host = torch.tensor([*starts, *lens[:requests]], dtype=torch.int64)
    window = 0 if sliding_window is None else int(sliding_window)
    rc = lib.ak_paged_tiled(
        *_cache_args(query, key_cache, value_cache, block_table),
        host.data_ptr(), host.data_ptr() + 8 * (requests + 1), requests, query.shape[1], hkv, d,
        value_cache.shape[3], bs, float(scale), int(bool(causal)), window,
        None if sink_logits is None else sink_logits.data_ptr(), out.data_ptr(), out.stride(0), out.stride(1),
        None if lse is None else lse.data_ptr(), 0 if lse is None else lse.stride(0), torch.get_num_threads(),
    )
    if rc > 0:
        r = rc - 1
        raise ValueError(f"paged_attention: request {r} has {starts[r + 1] - starts[r]} query tokens but seq_len "
                         f"{lens[r]} (the block table holds {block_table.shape[1] * bs} positions a request)")
    if rc < 0:
        raise MemoryError("paged_attention: the native loop could not allocate its tile scratch")
    native_build.record("paged_attention")
    return True
