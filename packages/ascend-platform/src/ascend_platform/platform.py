"""`NPUPlatform`: the class `register()` names, bound to this process's lane.

On a host where torch_npu sees a device it is `AscendNPUPlatform` (device "npu", PrivateUse1,
ASCEND_RT_VISIBLE_DEVICES, ray key "NPU"); with `ASCEND_VLLM_SIMULATE=1` it is `SimulatedNPUPlatform`, the same
Ascend policy on the CPU device. vLLM imports this module only after `register()` chose our platform.
"""

from __future__ import annotations

from ascend_platform.npu_platform import AscendNPUPlatform, AscendPlatformBase
from ascend_platform.registration import simulate_requested


def _lane_class() -> type[AscendPlatformBase]:
    if simulate_requested():
        from ascend_platform.simulated_platform import SimulatedNPUPlatform

        return SimulatedNPUPlatform
    return AscendNPUPlatform


NPUPlatform = _lane_class()

__all__ = ["AscendNPUPlatform", "AscendPlatformBase", "NPUPlatform"]
