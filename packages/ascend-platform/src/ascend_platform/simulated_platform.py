"""`SimulatedNPUPlatform`: the Ascend platform running on the CPU device (the simulated-NPU lane).

Ascend policy comes from `AscendPlatformBase` (first in the MRO); the device bits (memory queries, communicator,
OpenMP/LD_PRELOAD environment, vLLM's C++ CPU kernels for the model's GEMMs) come from vLLM's own `CpuPlatform`,
which is what a CPU device needs. The enum stays OOT so vLLM takes its out-of-tree paths (custom ops dispatch to
`forward_oot`), as it does on a real NPU; attention and the KV cache are ours, through `ascend_kernels`' reference
backend.

Instantiating the platform (vLLM does it once per process, when it resolves `current_platform`) prepares the
process: catalogued shutdown shims and, unless the V1 runner is asked for, Triton's interpreter so that vLLM can run
Model Runner V2 as it does on a device (`ascend_platform.simulated.triton_interpreter`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from vllm.platforms.cpu import CpuPlatform

from ascend_platform.npu_platform import AscendPlatformBase, ascend_config_of
from ascend_platform.patches import REGISTRY
from ascend_platform.plugin_config import AscendConfig, AscendConfigError

if TYPE_CHECKING:
    from vllm.config import VllmConfig


class SimulatedNPUPlatform(AscendPlatformBase, CpuPlatform):
    device_name: str = "cpu"
    device_type: str = "cpu"
    dispatch_key: str = "CPU"
    dist_backend: str = "gloo"
    # The NPU's Ray resource, as on a device: a Ray cluster of simulated hosts advertises `NPU` (`ray start
    # --resources '{"NPU": 1}'`) and vLLM's Ray executor places one worker per NPU bundle (vLLM's CPU key is empty,
    # which refuses Ray).
    ray_device_key: str = "NPU"
    device_control_env_var: str = CpuPlatform.device_control_env_var
    simulated = True

    def __init__(self) -> None:
        super().__init__()
        _prepare_process()

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return "npu (simulated on cpu)"

    @classmethod
    def _update_device_config(cls, vllm_config: VllmConfig) -> None:
        # vLLM's CPU policy for the CPU device: KV space from VLLM_CPU_KVCACHE_SPACE, mp executor, worker env. Not its
        # block size: that is for vLLM's CPU attention kernels, which this lane never runs (on a host without AMX it
        # forces 16 on every MLA model, a user's 128 included); the Ascend policy decides it after this.
        cache = vllm_config.cache_config
        block_size, user_specified = cache.block_size, cache.user_specified_block_size
        CpuPlatform.check_and_update_config.__func__(cls, vllm_config)
        cache.block_size, cache.user_specified_block_size = block_size, user_specified
        cls.kernel_backend(ascend_config_of(vllm_config))
        from ascend_platform.simulated.mrv2_lane import check_runner_request

        check_runner_request(vllm_config)

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        """vLLM's hook for platform kernels (each worker, before the runner): MRV2's per-step Triton kernels go to
        torch / ascend_kernels stand-ins when Triton runs in its interpreter (`simulated.kernel_overrides`). Also the
        lane's one hook at worker start before the model loads, so the heap is frozen here (`simulated.startup_gc`):
        vLLM's start-up collections then skip the imported modules."""
        from ascend_platform.simulated.kernel_overrides import register_for_lane
        from ascend_platform.simulated.startup_gc import freeze_startup_heap

        register_for_lane()
        freeze_startup_heap()

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return "ascend_platform.simulated.communicator.SimulatedCommunicator"

    @classmethod
    def kernel_backend(cls, ascend: AscendConfig) -> str:
        """'auto' is the reference kernels here. 'npu' runs the torch_npu bindings on the CPU when this process has a
        usable torch_npu (the testkit's schema-faithful one: `ASCEND_TESTKIT_TORCH_NPU=1`); asked in the main process
        at config time and again by each worker, so a process without one stops at start-up with the reason."""
        if ascend.kernel_backend != "npu":
            return "reference"
        import ascend_kernels

        refused = ascend_kernels.available_backends()["npu"]
        if refused is not None:
            raise AscendConfigError(f"Invalid Ascend additional_config: bad value 'npu' for key 'kernel_backend' "
                                    f"({refused}; allowed: 'auto', 'reference')")
        return "npu"


def _nothing_to_empty() -> None:
    return None


def _install_shutdown_shims() -> None:
    """See the `simulated.accelerator_*` patches. Installed when vLLM resolves this platform, which every process
    that reaches vLLM's shutdown cleanup has done (the engine core calls `current_platform` there)."""
    if torch.accelerator.is_available():
        return
    for name in ("simulated.accelerator_empty_cache", "simulated.accelerator_empty_host_cache"):
        owner, current = REGISTRY.resolve(name)
        if current is not _nothing_to_empty:
            REGISTRY.apply(name, _nothing_to_empty)


def _prepare_process() -> None:
    _install_shutdown_shims()
    from ascend_platform.simulated import mrv2_lane

    mrv2_lane.prepare_process()
