"""npu_attention_update: merge the partial attention outputs of SP/CP ranks by their LSEs.

lse_m = max_i lse_i + log(sum_i exp(lse_i - max_i lse_i));  out = sum_i out_i * exp(lse_i - lse_m).
lse_out is only computed for update_type 1; for 0 the card leaves it unwritten, so it comes back NaN here and a caller
that reads it fails visibly. Rows whose LSEs are all -inf (nothing seen on any rank) merge to output 0, LSE -inf.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ascend_testkit.torch_npu.attention.refusals import refuse

OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def npu_attention_update(lse: Sequence[torch.Tensor], local_out: Sequence[torch.Tensor], update_type: int):
    op = "npu_attention_update"
    if update_type not in (0, 1):
        refuse(op, f"update_type must be 0 (output only) or 1 (output and lse), got {update_type}")
    if not lse or len(lse) != len(local_out):
        refuse(op, f"lse and local_out must be non-empty lists of one length (one per SP rank), got {len(lse)} and "
               f"{len(local_out)}")
    rows, head_dim = local_out[0].shape if local_out[0].dim() == 2 else (None, None)
    for index, (part_lse, part_out) in enumerate(zip(lse, local_out, strict=True)):
        if part_lse.dtype != torch.float32:
            refuse(op, f"lse[{index}] must be float32, got {part_lse.dtype}")
        if part_out.dtype not in OUT_DTYPES or part_out.dtype != local_out[0].dtype:
            refuse(op, f"local_out[{index}] dtype {part_out.dtype} must be one of float32/float16/bfloat16 and equal "
                   f"local_out[0]'s {local_out[0].dtype}")
        if part_out.dim() != 2 or tuple(part_out.shape) != (rows, head_dim):
            refuse(op, f"local_out[{index}] must be [batch*seq*heads, head_dim] like local_out[0] "
                   f"{tuple(local_out[0].shape)}, got {tuple(part_out.shape)}")
        if part_lse.dim() != 1 or part_lse.shape[0] != rows:
            refuse(op, f"lse[{index}] must be [batch*seq*heads] = ({rows},), got {tuple(part_lse.shape)}")
    stacked_lse = torch.stack([t.double() for t in lse])  # [sp, rows]
    top = stacked_lse.amax(dim=0)
    anchor = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    weights = torch.exp(stacked_lse - anchor)
    total = weights.sum(dim=0)
    merged_lse = anchor + torch.log(total)
    share = torch.where(total > 0, weights / total.clamp_min(1e-300), torch.zeros_like(weights))
    out = (share.unsqueeze(-1) * torch.stack([t.double() for t in local_out])).sum(dim=0)
    lse_out = merged_lse.float() if update_type == 1 else torch.full_like(lse[0], float("nan"))
    return out.to(local_out[0].dtype), lse_out


def make_update_ops() -> dict[str, Callable]:
    return {"npu_attention_update": npu_attention_update}
