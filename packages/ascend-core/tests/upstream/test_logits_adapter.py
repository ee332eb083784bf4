"""`skip_gather` of the logits processor: probed by signature, passed to upstream only where it exists."""

from __future__ import annotations

import inspect

import pytest
from vllm.model_executor.layers.logits_processor import LogitsProcessor

from ascend_core.upstream import default_loader, detect_capabilities, logits_forward_kwargs

_TAKES_SKIP_GATHER = "skip_gather" in inspect.signature(LogitsProcessor.forward).parameters


@pytest.mark.skipif(not _TAKES_SKIP_GATHER, reason="the legacy lane's LogitsProcessor (0.27.1) has no skip_gather")
def test_installed_vllm_takes_skip_gather():
    assert logits_forward_kwargs(True) == {"skip_gather": True}
    assert logits_forward_kwargs(False) == {"skip_gather": False}


@pytest.mark.skipif(_TAKES_SKIP_GATHER, reason="the legacy LogitsProcessor (no skip_gather) runs in the release lane")
def test_release_lane_probe_and_adapter():
    # vLLM 0.27.1's own LogitsProcessor, probed as the platform probes it
    assert detect_capabilities(default_loader).logits_skip_gather is False
    assert logits_forward_kwargs(False) == {}
    with pytest.raises(TypeError, match="no skip_gather"):
        logits_forward_kwargs(True)
