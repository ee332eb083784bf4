"""vLLM's LoRA logits wrapper runs the base layer's `forward` with itself as `self`
(`LogitsProcessorWithLoRA.forward`: `type(self.base_layer).forward(self, ...)`); ours must serve it, as vLLM's own
`LogitsProcessor.forward` does (it called `super()` there: "super(type, obj): obj must be an instance or subtype of
type", and a LoRA engine died at its first step). The engine-level proof is tests/lora/test_lora_engines.py."""

from __future__ import annotations

import torch
import torch.nn as nn
from vllm.lora.layers.logits_processor import LogitsProcessorWithLoRA

from ascend_platform.ops.logits_processor import AscendLogitsProcessor


def test_lora_wrapper_runs_our_forward_with_itself_as_self():
    base = nn.Module.__new__(AscendLogitsProcessor)  # no vLLM config needed: the wrapper reads these attributes
    nn.Module.__init__(base)
    # logits given as input: LogitsProcessor.forward then only scales them (no head, no TP gather)
    base.logits_as_input, base.soft_cap, base.scale = True, None, 2.0
    wrapper = nn.Module.__new__(LogitsProcessorWithLoRA)
    nn.Module.__init__(wrapper)
    wrapper.base_layer = base
    logits = torch.arange(6, dtype=torch.float32).view(2, 3)
    assert torch.equal(wrapper(None, logits.clone()), logits * 2.0)
