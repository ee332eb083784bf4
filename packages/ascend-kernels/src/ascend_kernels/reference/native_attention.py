"""The reference's decode attention on its native loop (`native/attention.c`), when the batch suits it.

`paged_decode` returns False (nothing written) and `attention.paged_attention`'s torch formulation runs when: no
library (`native_build.status()` says why), a batch with a request of more or fewer than one query token (prefills and
verify batches: their work is matrix products, which torch's GEMMs do better than this loop), an empty context, a
table too narrow for a length, a device other than the host, dtypes other than float32 / bfloat16 / float16 or not
one dtype for query, caches and output, or tracing under torch.compile.
"""

from __future__ import annotations

import torch

from ascend_kernels.reference import native_build
from ascend_kernels.reference.native_layers import DTYPE_CODES, host_index, host_tensors


def paged_decode(query, key_cache, value_cache, block_table, seq_lens, starts: list[int], lens: list[int], scale,
                 sliding_window, sinks, out) -> bool:
    """`attention.paged_attention` for a decode batch (`starts` and `lens` its host lists), written into out."""
    lib = native_build.library()
    requests = block_table.shape[0]
    if lib is None or not lens or starts != list(range(requests + 1)) or min(lens) < 1:
        return False
    if not host_tensors(query, key_cache, value_cache, out) or not (host_index(block_table) and host_index(seq_lens)):
        return False
    if not (query.dtype == key_cache.dtype == value_cache.dtype == out.dtype):
        return False
    if query.stride(2) != 1 or key_cache.stride(3) != 1 or value_cache.stride(3) != 1 or out.stride(2) != 1:
        return False
    if seq_lens.dim() != 1 or seq_lens.shape[0] < requests:
        return False
    num_blocks, bs, hkv, d = key_cache.shape
    max_len = max(lens)
    if max_len > block_table.shape[1] * bs:
        return False  # a length past the table's blocks: the torch formulation reports what it reads
    sink_logits = None
    if sinks is not None:
        if sinks.device.type != "cpu" or type(sinks) not in (torch.Tensor, torch.nn.Parameter):
            return False
        sink_logits = sinks.detach().float().contiguous()
    window = 0 if sliding_window is None else int(sliding_window)
    rc = lib.ak_paged_decode(
        query.data_ptr(), query.stride(0), query.stride(1),
        key_cache.data_ptr(), key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.data_ptr(), value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        DTYPE_CODES[query.dtype], block_table.data_ptr(), int(block_table.dtype == torch.int64), block_table.stride(0),
        block_table.shape[1], num_blocks, seq_lens.data_ptr(), int(seq_lens.dtype == torch.int64), requests,
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
