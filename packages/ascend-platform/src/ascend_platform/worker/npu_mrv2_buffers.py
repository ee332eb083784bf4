"""MRV2's staging buffers on an NPU: explicit host-to-device copies instead of UVA views.

vLLM's MRV2 keeps per-step inputs (token ids, positions, block tables ...) in pinned host buffers and lets the device
read them through a UVA view when pinned memory is available; the view comes from `get_accelerator_view_from_cpu_
tensor`, which knows CUDA and XPU only. torch_npu pins host memory, so on a card NPUModelRunnerV2 would stop at
construction ("not supported in: npu"; found by the emulated NPU runtime, whose card pins memory as torch_npu does).
The NPU worker therefore answers "no UVA" to MRV2's buffers for the life of its process (the registered patch
`worker.npu_mrv2_no_uva`), and MRV2 uses its own explicit-copy buffers (`NonUvaBuffer`).
"""

from __future__ import annotations

from ascend_platform.patches import REGISTRY, AppliedPatch
from ascend_platform.patches.catalogue import NPU_MRV2_NO_UVA


def no_uva() -> bool:
    return False


def stage_mrv2_inputs_by_copy() -> AppliedPatch:
    return REGISTRY.apply(NPU_MRV2_NO_UVA.name, no_uva)
