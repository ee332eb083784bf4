"""Out-of-tree replacements for vLLM's RMSNorm, SiluAndMul and RotaryEmbedding, calling `ascend_kernels`.

vLLM instantiates the class registered with `CustomOp.register_oot` under the in-tree class name, and on an
out-of-tree platform dispatches to `forward_oot`. Registration is global in vLLM and rejects duplicates, so
`register_custom_ops()` runs once per process (the worker calls it before the model is built).
"""

from __future__ import annotations

import torch

from ascend_platform.facade import kernel_ops

_registered = False


def register_custom_ops() -> bool:
    """Register our ops with vLLM; returns False when they were already registered in this process."""
    global _registered
    if _registered:
        return False
    from vllm.model_executor.custom_op import CustomOp
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    @CustomOp.register_oot(name="RMSNorm")
    class AscendRMSNorm(RMSNorm):
        def forward_oot(self, x: torch.Tensor, residual: torch.Tensor | None = None):
            if self.variance_size_override is not None or not self.has_weight:
                return self.forward_native(x, residual)
            return kernel_ops().rms_norm(x, self.weight.data, self.variance_epsilon, residual=residual)

    @CustomOp.register_oot(name="SiluAndMul")
    class AscendSiluAndMul(SiluAndMul):
        def forward_oot(self, x: torch.Tensor) -> torch.Tensor:
            return kernel_ops().silu_and_mul(x)

    @CustomOp.register_oot(name="RotaryEmbedding")
    class AscendRotaryEmbedding(RotaryEmbedding):
        def forward_oot(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None = None):
            cos_sin_cache = self._match_cos_sin_cache_dtype(query)
            return kernel_ops().rotary_embedding(positions, query, key, cos_sin_cache, head_size=self.head_size,
                                                 rotary_dim=self.rotary_dim, is_neox=self.is_neox_style)

    from ascend_platform.attention.sfa_indexer import register_sparse_indexer
    from ascend_platform.attention.vision_attention import register_vision_attention

    register_sparse_indexer()
    register_vision_attention()  # vision towers' MMEncoderAttention
    _registered = True
    return True
