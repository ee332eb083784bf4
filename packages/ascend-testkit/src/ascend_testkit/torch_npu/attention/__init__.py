"""Independent CPU semantics of torch_npu's attention family, for the schema-faithful fake torch_npu.

`IMPLEMENTATIONS` maps each op name as torch_npu exposes it ("npu_fused_infer_attention_score",
"npu_fused_infer_attention_score.out", "..._v2", "..._v2.out", "_npu_reshape_and_cache", "npu_paged_cache_load"
(torch_npu.atb), "npu_attention_update") to a plain function taking the schema's arguments by their schema names.
They compute in float64 from the documented semantics (nothing from ascend_kernels) and refuse what the card refuses.
`implementations(TINY_MODELS)` keeps every structural refusal but drops the documented size/dtype lists (see limits.py).
"""

from __future__ import annotations

from collections.abc import Callable

from ascend_testkit.torch_npu.attention.attention_update import make_update_ops
from ascend_testkit.torch_npu.attention.cache_ops import make_cache_ops
from ascend_testkit.torch_npu.attention.fused_infer_attention import make_fia_ops
from ascend_testkit.torch_npu.attention.limits import CARD, TINY_MODELS, CardLimits

__all__ = ["CARD", "IMPLEMENTATIONS", "TINY_MODELS", "CardLimits", "implementations"]


def implementations(limits: CardLimits = CARD) -> dict[str, Callable]:
    return {**make_fia_ops(limits), **make_cache_ops(limits), **make_update_ops()}


IMPLEMENTATIONS: dict[str, Callable] = implementations(CARD)
