"""vLLM's top-k / top-p sampling filter on `ascend_kernels.ops.top_k_top_p` (torch_npu's fused `npu_top_k_top_p` on
a card), for both runners.

Every vLLM sampler filters through `topk_topp_sampler.apply_top_k_top_p` (V1's TopKTopPSampler, MRV2's sampling
states and processed logprobs, the rejection sampler), which runs vLLM's Triton kernel `apply_top_k_top_p_triton`
when Triton is on and its torch formulation `apply_top_k_top_p_pytorch` otherwise; neither is Ascend's, and the
sampler is not a CustomOp. The Triton route is replaced through vLLM's kernel dispatcher (the platforms'
`register_triton_kernel_overrides`), the torch route by a declared patch of the module global that
`apply_top_k_top_p` calls. The random draw stays vLLM's: a seeded request draws with vLLM's own noise.
"""

from __future__ import annotations

import torch

from ascend_platform.facade import kernel_ops
from ascend_platform.patches import REGISTRY

TRITON_FILTER = "vllm.v1.sample.ops.topk_topp_triton.apply_top_k_top_p_triton"
TORCH_FILTER_PATCH = "sampling.top_k_top_p_pytorch"

_installed: list = []


def top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None,
                mask_value: float = float("-inf")) -> torch.Tensor:
    """`apply_top_k_top_p_triton`'s parameters (vLLM's dispatcher passes them in this order)."""
    if mask_value != float("-inf"):
        raise NotImplementedError(f"the top-k/top-p filter masks with -inf only, got mask_value={mask_value}")
    return kernel_ops().top_k_top_p(logits, k, p)


def top_k_top_p_torch(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None,
                      allow_cpu_sync: bool = False) -> torch.Tensor:
    """`apply_top_k_top_p_pytorch`'s parameters (a host sync is never needed here)."""
    return kernel_ops().top_k_top_p(logits, k, p)


def install_torch_route() -> None:
    """Once per process (the worker, before its runner): processes without Triton filter through our op too."""
    if not _installed:
        _installed.append(REGISTRY.apply(TORCH_FILTER_PATCH, top_k_top_p_torch))
