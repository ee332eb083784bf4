"""The platform's graph decisions: which `CUDAGraphMode` and capture sizes a configuration gets, and which
static-graph wrapper vLLM wraps runnables with.

`graph_mode` (additional_config): "eager" never captures; "piecewise" (PIECEWISE), "full" (FULL_DECODE_ONLY) and
"full_and_piecewise" (FULL for uniform decodes, PIECEWISE for mixed batches) always do; "auto" is PIECEWISE on a
device unless enforce_eager, and eager in the simulated lane (no device graphs to gain there; ask for a mode
explicitly to have the simulated lane record what it would capture and replay). Capture sizes are
`graph_capture_sizes` or vLLM's default ladder up to max_num_seqs, capped at what one graph can hold: max_num_seqs
decode tokens for FULL_DECODE_ONLY, max_num_batched_tokens when mixed batches are captured too.

PIECEWISE graphs without torch.compile (the simulated lane compiles nothing) are what vLLM calls breakable CUDA
graphs: vLLM keeps a PIECEWISE mode only with `VLLM_USE_BREAKABLE_CUDAGRAPH=1` there (else it falls back to the
mode's FULL part), and the whole model is then one piece in the platform's wrapper, attention run eagerly.
"""

from __future__ import annotations

from vllm.config import CUDAGraphMode
from vllm.v1.attention.backend import AttentionCGSupport

from ascend_platform.graph.plan import default_capture_sizes
from ascend_platform.registration import simulate_requested

MODES = {
    "piecewise": CUDAGraphMode.PIECEWISE,
    "auto": CUDAGraphMode.PIECEWISE,
    "full": CUDAGraphMode.FULL_DECODE_ONLY,
    "full_and_piecewise": CUDAGraphMode.FULL_AND_PIECEWISE,
}
SIMULATED_WRAPPER = "ascend_platform.graph.wrapper.SimulatedGraphWrapper"
DEVICE_WRAPPER = "ascend_platform.graph.wrapper.AclGraphWrapper"


def graph_mode_for(graph_mode: str, *, simulated: bool, enforce_eager: bool) -> CUDAGraphMode:
    if graph_mode == "eager" or (graph_mode == "auto" and (simulated or enforce_eager)):
        return CUDAGraphMode.NONE
    if graph_mode not in MODES:
        raise ValueError(f"unknown graph_mode {graph_mode!r} (allowed: eager, {', '.join(MODES)})")
    return MODES[graph_mode]


def capture_sizes_for(mode: CUDAGraphMode, sizes: tuple[int, ...] | None, *, max_num_seqs: int,
                      max_num_batched_tokens: int) -> list[int]:
    if mode == CUDAGraphMode.NONE:
        return []
    wanted = list(sizes or default_capture_sizes(max_num_seqs))
    limit = max_num_batched_tokens if mode.has_piecewise_cudagraphs() else max_num_seqs
    # Never capture more than one batch can hold; ACL graphs are memory-hungry per size.
    return [s for s in wanted if s <= limit] or [min(wanted)]


# vLLM's compile-time fusion passes: each rewrites the graph onto CUDA / ROCm kernels (fp8 quant, flashinfer
# all-reduce, fused rope + KV-cache writes ...) whose pass classes vLLM imports only on CUDA-alike or XPU platforms.
# vLLM turns some on from the custom ops a platform enables (rms_norm, silu_and_mul: ours), and on a device a
# torch.compile'd model then stopped with "name 'RMSNormQuantFusionPass' is not defined" (found by the emulated NPU).
FUSION_PASSES = ("fuse_norm_quant", "fuse_act_quant", "fuse_attn_quant", "fuse_allreduce_rms",
                 "enable_qk_norm_rope_fusion", "fuse_rope_kvcache_cat_mla", "fuse_act_padding",
                 "fuse_mla_dual_rms_norm", "fuse_rope_kvcache", "fuse_qk_norm_rope_kvcache")


def without_cuda_fusions(pass_config: object) -> list[str]:
    """Turn vLLM's fusion passes off (Ascend has no kernels they fuse into); returns the ones that were on."""
    were_on = [name for name in FUSION_PASSES if getattr(pass_config, name, False)]
    for name in FUSION_PASSES:
        if hasattr(pass_config, name):
            setattr(pass_config, name, False)
    return were_on


def static_graph_wrapper(simulated: bool) -> str:
    return SIMULATED_WRAPPER if simulated else DEVICE_WRAPPER


def attention_graph_support() -> AttentionCGSupport:
    """Which batches the ASCEND attention backend can run inside a FULL graph.

    In the simulated lane a FULL "graph" replays by re-running the captured forward, and the reference kernels read
    every length from the persistent tensors at each run: uniform decode batches are fine (FULL graphs are only
    planned for those). On a device the kernels take lengths on the host at launch, so a replay would reuse stale
    lengths: NEVER, until graph-parameter updates are built (vLLM then keeps PIECEWISE graphs or none).
    """
    return AttentionCGSupport.UNIFORM_BATCH if simulate_requested() else AttentionCGSupport.NEVER
