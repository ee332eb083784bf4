"""npu_top_k_top_p: the documented nine-step filter (ascending stable sort, k-th value mask, softmax, cumulative
mass from the least likely, mask <= 1 - p keeping the last, unsort)."""

from __future__ import annotations

import torch

from ascend_testkit.torch_npu.attention.refusals import refuse, require_dtype

_OP = "npu_top_k_top_p"


def npu_top_k_top_p(*, logits, p, k):
    require_dtype(_OP, "logits", logits, (torch.float16, torch.bfloat16, torch.float32))
    if logits.dim() != 2:
        refuse(_OP, f"logits must be 2-D, got shape {tuple(logits.shape)}")
    if p is None and k is None:
        refuse(_OP, "p and k cannot both be None")
    rows, vocab = logits.shape
    if p is not None:
        if p.dtype != logits.dtype:
            refuse(_OP, f"p dtype must be the logits' ({logits.dtype}), got {p.dtype}")
        if p.shape != (rows,):
            refuse(_OP, f"p must be 1-D [{rows}], got shape {tuple(p.shape)}")
    if k is not None:
        require_dtype(_OP, "k", k, (torch.int32,))
        if k.shape != (rows,):
            refuse(_OP, f"k must be 1-D [{rows}], got shape {tuple(k.shape)}")
        if rows and (int(k.min()) < 1 or int(k.max()) > min(1024, vocab)):
            refuse(_OP, f"k must lie in [1, min(1024, vocab={vocab})], got [{int(k.min())}, {int(k.max())}]")
    values, order = torch.sort(logits.float(), dim=-1, stable=True)
    if k is not None:
        kth = values.gather(-1, (vocab - k.long())[:, None])
        values = values.masked_fill(values < kth, float("-inf"))
    if p is not None:
        mass = torch.softmax(values, dim=-1).cumsum(dim=-1)
        drop = mass <= (1 - p.float())[:, None]
        drop[:, -1] = False
        values = values.masked_fill(drop, float("-inf"))
    return torch.empty_like(values).scatter_(-1, order, values).to(logits.dtype)
