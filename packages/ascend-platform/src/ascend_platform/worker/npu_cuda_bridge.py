"""vLLM's GPU runners call the CUDA stream API by name (`torch.cuda.Stream`, `Event`, `current_stream`, `stream`,
`set_stream`: async output copies, MRV2's per-step streams); on an NPU host those must be torch_npu's. The NPU
worker points them at `torch.npu` for the life of its process (undone at shutdown), through these registered
patches. torch_npu's own `transfer_to_npu` does the same wholesale; this bridges only what the runners use."""

from __future__ import annotations

import torch

from ascend_platform.patches import REGISTRY, AppliedPatch
from ascend_platform.patches.catalogue import NPU_CUDA_PATCHES

PATCHES = NPU_CUDA_PATCHES  # declared in patches.catalogue


def bridge_cuda_streams_to_npu() -> list[AppliedPatch]:
    return [REGISTRY.apply(patch.name, getattr(torch.npu, patch.attribute)) for patch in PATCHES]
