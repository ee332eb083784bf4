"""Which features prefill context parallel cannot be combined with on Ascend, checked before any buffer exists.

Each conflict is its own error naming both sides and the setting to change, and all conflicts are reported at
once, so a user fixes a configuration in one pass.
"""

from __future__ import annotations

from typing import Any


class PCPConfigError(ValueError):
    """Prefill context parallel is configured together with something it cannot run beside."""

    def __init__(self, conflicts: list[str]):
        self.conflicts = list(conflicts)
        super().__init__(
            "prefill context parallel (prefill_context_parallel_size > 1) conflicts with:\n"
            + "\n".join(f"  - {c}" for c in self.conflicts)
        )


def pcp_conflicts(vllm_config: Any, supports_mm_inputs: bool = False) -> list[str]:
    """Every conflict of the PCP setting with the rest of `vllm_config`; empty when PCP is off or compatible."""
    parallel = vllm_config.parallel_config
    pcp = parallel.prefill_context_parallel_size
    if pcp <= 1:
        return []
    conflicts = []
    dcp = getattr(parallel, "decode_context_parallel_size", 1) or 1
    if dcp > 1:
        conflicts.append(
            f"decode context parallel (decode_context_parallel_size={dcp}): Ascend PCP does not shard the decode KV "
            "cache; set decode_context_parallel_size=1"
        )
    pp = parallel.pipeline_parallel_size
    if pp > 1:
        conflicts.append(f"pipeline parallel (pipeline_parallel_size={pp}): set pipeline_parallel_size=1")
    model = vllm_config.model_config
    if model is not None and getattr(model, "is_encoder_decoder", False):
        conflicts.append(f"encoder-decoder model ({model.model}): PCP splits decoder-only prefills")
    if model is not None and getattr(model, "use_mla", False):
        conflicts.append(f"MLA model ({model.model}): the Ascend MLA backend (ASCEND_MLA) does not serve PCP; only "
                         "the ASCEND attention backend does")
    window = model.get_sliding_window() if model is not None and hasattr(model, "get_sliding_window") else None
    if window:
        conflicts.append(f"sliding-window attention (sliding_window={window}): PCP chunks attend to their whole "
                         "context")
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is not None:
        conflicts.append(f"speculative decoding (method={getattr(spec, 'method', '?')!r}): the Ascend PCP runner "
                         "does not partition draft batches")
    if supports_mm_inputs:
        conflicts.append("multimodal inputs: the model accepts multimodal inputs, which PCP cannot split")
    if getattr(vllm_config, "lora_config", None) is not None:
        conflicts.append("LoRA (enable_lora=True): PCP does not shard LoRA batches; disable LoRA")
    compilation = getattr(vllm_config, "compilation_config", None)
    mode = getattr(compilation, "cudagraph_mode", None)
    if mode is not None and mode.has_full_cudagraphs() and not mode.separate_routine():
        conflicts.append(
            f"graph mode {mode}: full graphs would capture prefills; use FULL_DECODE_ONLY, FULL_AND_PIECEWISE, "
            "PIECEWISE or NONE"
        )
    return conflicts


def validate_pcp_config(vllm_config: Any, supports_mm_inputs: bool = False) -> None:
    """Raise `PCPConfigError` listing every conflict of prefill context parallel in `vllm_config`."""
    conflicts = pcp_conflicts(vllm_config, supports_mm_inputs)
    if conflicts:
        raise PCPConfigError(conflicts)
