"""`skip_gather` of the logits processor: probed by signature, passed to upstream only where it exists."""

from __future__ import annotations

import pytest

from ascend_core.upstream import default_loader, detect_capabilities, logits_forward_kwargs
from ascend_core.upstream import logits as logits_mod


class ReleaseLaneLogitsProcessor:  # vLLM <= 0.28 (read from the 0.28.0 wheel): no skip_gather
    def forward(self, lm_head, hidden_states, embedding_bias=None):
        raise NotImplementedError


def test_installed_vllm_takes_skip_gather():
    assert logits_forward_kwargs(True) == {"skip_gather": True}
    assert logits_forward_kwargs(False) == {"skip_gather": False}


def test_release_lane_probe_and_adapter(monkeypatch):
    def load(module, attr=None):
        if (module, attr) == ("vllm.model_executor.layers.logits_processor", "LogitsProcessor"):
            return ReleaseLaneLogitsProcessor
        return default_loader(module, attr)

    caps = detect_capabilities(load)
    assert caps.logits_skip_gather is False
    monkeypatch.setattr(logits_mod, "capabilities", lambda: caps)
    assert logits_forward_kwargs(False) == {}
    with pytest.raises(TypeError, match="no skip_gather"):
        logits_forward_kwargs(True)
