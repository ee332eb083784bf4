"""DFlash2 draft model built through the factories upstream added in vLLM PR 52816 (finalized in 53435).

Upstream constructs `DFlash2Qwen3ForCausalLM.model_cls(...)`, which builds `decoder_layer_cls(...)` per layer, so a
platform swaps in its own layer by declaring both attributes on subclasses; no module-global patching. The Ascend
layer is where NPU-specific attention for the draft belongs; on vLLM's own platforms it is the upstream layer.
"""

from __future__ import annotations

from vllm.model_executor.models.qwen3_dflash2 import (
    DFlash2Qwen3DecoderLayer,
    DFlash2Qwen3ForCausalLM,
    DFlash2Qwen3Model,
)

#: Registry name of the draft architecture (`ModelRegistry.register_model(ARCHITECTURE, QUALNAME)`).
ARCHITECTURE = "DFlash2DraftModel"
QUALNAME = "ascend_specdecode.models.dflash2:AscendDFlash2Qwen3ForCausalLM"


class AscendDFlash2Qwen3DecoderLayer(DFlash2Qwen3DecoderLayer):
    """The DFlash2 draft decoder layer as the Ascend plugin builds it."""


class AscendDFlash2Qwen3Model(DFlash2Qwen3Model):
    decoder_layer_cls = AscendDFlash2Qwen3DecoderLayer


class AscendDFlash2Qwen3ForCausalLM(DFlash2Qwen3ForCausalLM):
    model_cls = AscendDFlash2Qwen3Model


def register_dflash2_draft() -> None:
    """Make vLLM build `AscendDFlash2Qwen3ForCausalLM` for DFlash2 drafts (idempotent; call from a plugin hook)."""
    from vllm import ModelRegistry

    ModelRegistry.register_model(ARCHITECTURE, QUALNAME)
