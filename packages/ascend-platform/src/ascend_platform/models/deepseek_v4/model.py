"""`AscendDeepseekV4ForCausalLM`: vLLM's device-neutral DeepSeek V4 model with Ascend attention layers.

Everything but the attention is vLLM's V4 model as its CPU implementation builds it (hyper-connections, embeddings,
the MoE, which our platform already routes through `ascend_kernels` as `AscendRoutedExperts`, weight loading); the
attention layers are `AscendDeepseekV4Attention`, swapped in for the construction only (`dsv4.attention_class`), and
the hyper-connection ops are Ascend's (`hyper_connections`).
"""

from __future__ import annotations

from typing import Any

from vllm.models.deepseek_v4.cpu.model import DeepseekV4ForCausalLM

from ascend_platform import usage
from ascend_platform.models.deepseek_v4.attention import AscendDeepseekV4Attention
from ascend_platform.models.deepseek_v4.hyper_connections import adopt_hyper_connections
from ascend_platform.patches.catalogue import REGISTRY


class AscendDeepseekV4ForCausalLM(DeepseekV4ForCausalLM):
    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        with REGISTRY.applied("dsv4.attention_class", AscendDeepseekV4Attention):
            super().__init__(vllm_config=vllm_config, prefix=prefix)
        adopt_hyper_connections(self.model)
        usage.note("model_class", f"{type(self).__module__}.{type(self).__qualname__}")
