"""What both Ascend workers share (`AscendWorkerMixin`): our runners (V1 or MRV2), sleep mode, the usage report.

`SimulatedAscendWorker` (`worker.simulated_worker`, on vLLM's `CPUWorker`) and `NPUWorker` (`worker.npu_worker`, on
vLLM's GPU `Worker`) are importable by name; `worker.worker.AscendWorker`, the class the platform names, is the
lane's. Both differ from their parents only in the
runner they construct (with `ascend_specdecode`'s drafter and verifier when speculative decoding is configured),
sleep mode, and `ascend_usage()`.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

from vllm.logger import init_logger

from ascend_platform import usage
from ascend_platform.facade import kernel_backend_name, select_kernel_backend
from ascend_platform.worker.sleep import SleepController

logger = init_logger(__name__)


class AscendWorkerMixin:
    _sleep: SleepController | None = None

    def _runner_class(self, v2: bool) -> type:
        raise NotImplementedError

    def _build_runner(self) -> Any:
        import ascend_kernels
        from ascend_platform.npu_platform import ascend_config_of
        from ascend_platform.ops.custom_ops import register_custom_ops
        from ascend_platform.ops.pluggable_layers import register_pluggable_layers
        from ascend_platform.ops.sampling_filter import install_torch_route as install_sampling_filter
        from ascend_platform.platform import NPUPlatform

        ascend = ascend_config_of(self.vllm_config)
        select_kernel_backend(NPUPlatform.kernel_backend(ascend))
        ascend_kernels.set_validation(ascend.kernel_checks)
        if ascend.custom_ops:
            register_custom_ops()
        register_pluggable_layers()
        install_sampling_filter()
        # Only the chosen runner's module is imported: the other may not import on this vLLM (the legacy lane has
        # no MRV2 KV hooks, and start-up refused MRV2 there already).
        cls = self._runner_class(bool(self.use_v2_model_runner))
        logger.info("Ascend worker: %s", cls.__name__)
        usage.note("runner_class", f"{cls.__module__}.{cls.__qualname__}")
        usage.note("kernel_backend", kernel_backend_name())
        usage.note("kernel_checks", ascend.kernel_checks)
        runner = cls(self.vllm_config, self.device)
        model_type = getattr(self.vllm_config.model_config.hf_config, "model_type", None)
        if model_type == "deepseek_v4":
            from ascend_platform.models.deepseek_v4 import register_deepseek_v4

            # Per process, before the runner builds the model: vLLM's own V4 entry would pick CUDA's classes.
            register_deepseek_v4()
        elif model_type == "deepseek_v41":
            from ascend_platform.models.deepseek_v41 import register_deepseek_v41

            # vLLM's V4.1 entry is its CUDA/ROCm vision-language wrapper.
            register_deepseek_v41()
        from ascend_platform.models.qwen_gdn import has_linear_attention, register_qwen_gdn

        if has_linear_attention(self.vllm_config.model_config.hf_text_config):
            register_qwen_gdn()  # vLLM's GDN layer would pick CUDA's Triton kernels on an out-of-tree platform
        if self.vllm_config.speculative_config is not None:
            import ascend_specdecode
            from ascend_core.upstream import dflash2_unavailable_reason

            # The model registry is per process and this one builds the draft (the main process never does). A vLLM
            # without DFlash2 factories has no DFlash2 draft to build (start-up refused such configs already).
            if dflash2_unavailable_reason() is None:
                from ascend_specdecode.models.dflash2 import register_dflash2_draft

                register_dflash2_draft()
            ascend_specdecode.install_speculative_decoding(runner)
        return runner

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)
        if self.vllm_config.speculative_config is not None:
            import ascend_specdecode

            # Idempotent: whatever loading did, the engine verifies with AscendRejectionSampler on the V1 runner.
            ascend_specdecode.install_verifier(self.model_runner)
            rejection_sampler = getattr(self.model_runner, "rejection_sampler", None)
            if rejection_sampler is not None:
                usage.note("verifier", f"{type(rejection_sampler).__module__}.{type(rejection_sampler).__qualname__}")

    @property
    def sleep_controller(self) -> SleepController:
        if self._sleep is None:
            self._sleep = SleepController(self.model_runner)
        return self._sleep

    def determine_available_memory(self) -> int:
        """vLLM's budget; scaled down when our private per-layer buffers (310P) cost more than its shared pages."""
        available = super().determine_available_memory()
        from ascend_platform.worker.kv_binding import kv_mode_for

        if kv_mode_for(self.vllm_config) != "private":
            return available
        from ascend_core.kv.allocator import scale_budget_for_private
        from ascend_core.upstream import planner_function

        groups = planner_function("get_kv_cache_groups")(self.vllm_config, self.model_runner.get_kv_cache_spec())
        kv_transfer = self.vllm_config.kv_transfer_config is not None
        scaled = scale_budget_for_private(groups, available, kv_transfer=kv_transfer)
        logger.info("private KV buffers: planner budget %d -> %d bytes", available, scaled)
        return scaled

    def _maybe_get_memory_pool_context(self, tag: str) -> AbstractContextManager:
        return nullcontext()  # sleep mode keeps host copies itself (SleepController): no cumem memory pool

    def sleep(self, level: int = 1) -> None:
        self.sleep_controller.sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.sleep_controller.wake_up(tags)

    def ascend_usage(self) -> dict[str, Any]:
        """What ran in this worker: counters from our parts, the runner, allocator and kernel backend; with the npu
        kernel backend, the torch_npu ops it called and the facade ops that fell back to the reference (and why); the
        reference's layer ops that ran on its native loops."""
        from ascend_kernels import npu_usage
        from ascend_kernels.reference import native_build

        report = usage.snapshot()
        report.update(npu_usage.snapshot())
        native = native_build.loaded_status()  # None: no reference layer op ran here, nothing was built
        report["reference_native"] = {"available": native is not None and native.available,
                                      "reason": None if native is None else native.reason,
                                      "calls": native_build.calls()}
        report["sleep"] = self.sleep_controller.state()
        layers = self.model_runner.compilation_config.static_forward_context.values()
        attn = {type(getattr(layer, "impl", None)).__qualname__ for layer in layers}
        report["attention_impls"] = sorted(a for a in attn if a != "NoneType")
        backends = {layer.attn_backend.get_name() for layer in layers if hasattr(layer, "attn_backend")}
        report["facts"]["attention_backend"] = ",".join(sorted(backends))
        return report
