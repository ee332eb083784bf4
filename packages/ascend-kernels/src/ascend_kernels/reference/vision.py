"""Reference of `vision_attention`: a vision encoder's non-causal attention over packed variable-length sequences."""

from __future__ import annotations

import itertools

import torch


def vision_attention(q, k, v, cu_seqlens, *, scale, out=None, cu_seqlens_host=None):
    t, h, _ = q.shape
    hkv = k.shape[1]
    if out is None:
        out = q.new_zeros(t, h, v.shape[2])
    starts = list(cu_seqlens_host) if cu_seqlens_host is not None else cu_seqlens.tolist()
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    group = h // hkv
    for lo, hi in itertools.pairwise(starts):
        if hi <= lo:
            continue  # an empty sequence (padding of the offsets) owns no rows
        qs = q[lo:hi].to(compute).transpose(0, 1)  # [h, m, d]
        ks = k[lo:hi].to(compute).repeat_interleave(group, dim=1).transpose(0, 1)
        vs = v[lo:hi].to(compute).repeat_interleave(group, dim=1).transpose(0, 1)
        probs = torch.softmax(scale * qs @ ks.transpose(1, 2), dim=-1)
        out[lo:hi] = (probs @ vs).transpose(0, 1).to(out.dtype)
    return out
