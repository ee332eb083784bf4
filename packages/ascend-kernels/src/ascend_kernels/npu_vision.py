"""NPU binding of `vision_attention` (`ascend_kernels.ops_vision`), over torch_npu 2.13.0's

    npu_fused_infer_attention_score(Tensor query, Tensor key, Tensor value, *, ..., SymInt[]? actual_seq_lengths=None,
        SymInt[]? actual_seq_lengths_kv=None, int num_heads=1, float scale=1.0, str input_layout="BSH",
        int num_key_value_heads=0, int sparse_mode=0, ...) -> (Tensor, Tensor)

in the TND layout: the packed sequences' cumulative ends as both the query and the key lengths, no mask, so each
sequence attends to itself only and in full.
"""

from __future__ import annotations

import itertools

from ascend_kernels.npu_backend import _copy_rows, _host, _npu


def vision_attention(q, k, v, cu_seqlens, *, scale, out=None, cu_seqlens_host=None):
    t, h, _ = q.shape
    starts = _host(cu_seqlens_host, cu_seqlens)
    # TND's lengths are cumulative ends, strictly increasing: an empty sequence (a repeated offset) is dropped.
    ends = [hi for lo, hi in itertools.pairwise(starts) if hi > lo]
    first, last = starts[0], (ends[-1] if ends else starts[0])
    if not ends:
        return _copy_rows(None, 0, t, h, v.shape[2], out, q)
    if first:
        ends = [e - first for e in ends]
    result, _ = _npu().npu_fused_infer_attention_score(
        q[first:last].contiguous(), k[first:last].contiguous(), v[first:last].contiguous(), num_heads=h,
        num_key_value_heads=k.shape[1], input_layout="TND", scale=scale, actual_seq_lengths=ends,
        actual_seq_lengths_kv=ends)
    if out is None:
        out = q.new_zeros(t, h, v.shape[2])
    else:
        out[:first].zero_()
        out[last:].zero_()
    out[first:last].copy_(result.view(last - first, h, -1))
    return out
