"""Every patch the platform may apply, with its reason and the upstream contract it relies on."""

from __future__ import annotations

from ascend_platform.patches.registry import Patch, PatchRegistry

REGISTRY = PatchRegistry()

MRV2_INIT_KV_CACHE = REGISTRY.register(Patch(
    name="mrv2.init_kv_cache",
    target="vllm.v1.worker.gpu.model_runner:init_kv_cache",
    reason="MRV2's initialize_kv_cache allocates through the module-level init_kv_cache with vLLM's allocator and "
           "offers no hook; scoped to our runner's initialize_kv_cache so our allocator and binding run instead.",
    contract="GPUModelRunner.initialize_kv_cache calls init_kv_cache(forward_context, kv_cache_config, device, "
             "kernel_block_sizes, vllm_config, kv_cache_allocation_context, *, block_tables, attn_groups) and uses "
             "the returned {layer name: tensor} dict as the KV caches.",
    params=("forward_context", "kv_cache_config", "device", "kernel_block_sizes", "vllm_config",
            "kv_cache_allocation_context"),
))

_SHUTDOWN_CACHE_REASON = (
    "vLLM's cleanup_dist_env_and_memory empties the accelerator caches at every engine shutdown unless the platform "
    "is CPU; the simulated lane is a non-CPU (out-of-tree) platform on a CPU-only torch, where the call raises "
    "'Cannot access accelerator device' and the engine core dies with a traceback. There is no device cache to "
    "empty; applied only in the simulated lane, and only while torch sees no accelerator."
)
SIMULATED_EMPTY_CACHE = REGISTRY.register(Patch(
    name="simulated.accelerator_empty_cache",
    target="torch.accelerator:empty_cache",
    reason=_SHUTDOWN_CACHE_REASON,
    contract="vllm.distributed.parallel_state.cleanup_dist_env_and_memory() calls torch.accelerator.empty_cache() "
             "with no arguments when not current_platform.is_cpu().",
))
SIMULATED_EMPTY_HOST_CACHE = REGISTRY.register(Patch(
    name="simulated.accelerator_empty_host_cache",
    target="torch.accelerator:empty_host_cache",
    reason=_SHUTDOWN_CACHE_REASON,
    contract="the same cleanup then calls torch.accelerator.empty_host_cache() with no arguments.",
))
