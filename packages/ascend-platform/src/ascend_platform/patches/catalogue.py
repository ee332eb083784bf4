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
