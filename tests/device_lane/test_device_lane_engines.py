"""The device lane in vLLM engines on the emulated NPU runtime: the platform and worker it resolves to, its memory
profile sized by the emulated card, and its generation against the simulated lane's on the same model and prompts.

See the conftest for the engines.
"""

from __future__ import annotations

import pytest

from ascend_testkit.compare import check_logprobs_close

UTILIZATIONS = (0.25, 0.5)  # the conftest's device-lane engines

pytestmark = pytest.mark.engine

def test_vllm_resolves_the_ascend_platform_to_the_device_lane(device_starts):
    for utilization in UTILIZATIONS:
        assert device_starts[utilization]["platform"] == "ascend_platform.npu_platform.AscendNPUPlatform"
    assert device_starts["simulated"]["platform"] == "ascend_platform.simulated_platform.SimulatedNPUPlatform"


def test_kv_memory_follows_the_emulated_capacity_and_utilization(device_starts, device_capacity):
    """vLLM's profile (NPUWorker's init snapshot and requested memory against the emulated card) gives the KV cache
    what the utilization asks for less the tiny model's weights and activations."""
    for utilization in UTILIZATIONS:
        facts = device_starts[utilization]
        assert facts["kv_memory_gib"] is not None and facts["kv_tokens"], facts["log_tail"]
        requested_gib = device_capacity * utilization / (1 << 30)
        # vLLM logs two decimals; the tiny Llama's weights and activations take a few MiB of the request.
        assert requested_gib - 0.03 <= facts["kv_memory_gib"] <= requested_gib + 0.005, (utilization, facts)
    low, high = (device_starts[u]["kv_tokens"] for u in UTILIZATIONS)
    assert 1.8 < high / low < 2.2, (low, high)


def test_the_device_lane_generates_what_the_simulated_lane_does(device_starts):
    """NPUWorker and NPUModelRunnerV1 over the emulated card (reference kernels) against SimulatedAscendWorker: the
    lanes differ only by the device runtime, so the greedy tokens agree (vLLM's top-k rule at a divergence)."""
    device, simulated = device_starts[max(UTILIZATIONS)], device_starts["simulated"]
    for facts in (device, simulated):
        assert "error" not in facts, facts["error"]
    assert device["usage"]["facts"]["runner_class"] == "ascend_platform.worker.model_runner_v1.NPUModelRunnerV1"
    assert simulated["usage"]["facts"]["runner_class"] == \
        "ascend_platform.worker.model_runner_v1.SimulatedModelRunnerV1"
    assert [len(o["token_ids"]) for o in device["outputs"]] == [8, 8, 8]
    check_logprobs_close(device["outputs"], simulated["outputs"], name_0="device lane (emulated NPU)",
                         name_1="simulated lane")
