"""The device lane in vLLM engines on the emulated NPU runtime: the platform and worker it resolves to, its memory
profile sized by the emulated card, V1 and MRV2 (with ACL graphs) generating what the simulated lane generates on the
same models and prompts, sleep mode giving the card's memory back, DeepSeek-V2 MLA, TP=2 over the emulated HCCL
group, and `ascend-vllm serve`.

See the conftest for the engines.
"""

from __future__ import annotations

import pytest

from ascend_testkit.compare import check_logprobs_close

UTILIZATIONS = (0.25, 0.5)  # the conftest's engines: V1 at these gpu_memory_utilization
CAPTURE_SIZES = (1, 2, 4)  # their graph_capture_sizes
MAX_TOKENS = 8
pytestmark = pytest.mark.engine

DEVICE_PLATFORM = "ascend_platform.npu_platform.AscendNPUPlatform"
RUNNERS = "ascend_platform.worker.model_runner_v{}.{}ModelRunnerV{}"


def _ok(facts: dict) -> dict:
    assert "error" not in facts, f"{facts['error']}\n{facts.get('log_tail', '')}"
    return facts


def _close(device: dict, simulated: dict, what: str) -> None:
    assert [len(o["token_ids"]) for o in device["outputs"]] == [MAX_TOKENS] * len(simulated["outputs"])
    check_logprobs_close(device["outputs"], simulated["outputs"], name_0=f"device lane ({what})",
                         name_1="simulated lane")


def _graph_counts(usage: dict) -> dict[str, int]:
    return {k: v for k, v in usage["counts"].items() if k.startswith("graph.")}


def test_vllm_resolves_the_ascend_platform_to_the_device_lane(lane_runs):
    for name, facts in lane_runs.device.items():
        assert facts["platform"] == DEVICE_PLATFORM, name
    for name, facts in lane_runs.simulated.items():
        assert facts["platform"] == "ascend_platform.simulated_platform.SimulatedNPUPlatform", name
    v1, v2 = _ok(lane_runs.device["v1"]), _ok(lane_runs.device["v2_graphs"])
    assert v1["usage"][0]["facts"]["runner_class"] == RUNNERS.format(1, "NPU", 1)
    assert v2["usage"][0]["facts"]["runner_class"] == RUNNERS.format(2, "NPU", 2)
    assert v1["usage"][0]["facts"]["worker_device"] == "npu:0"


def test_kv_memory_follows_the_emulated_capacity_and_utilization(lane_runs, device_capacity):
    """vLLM's profile (NPUWorker's init snapshot and requested memory against the emulated card) gives the KV cache
    what the utilization asks for less the tiny model's weights and activations."""
    engines = {u: _ok(lane_runs.device[name]) for u, name in zip(UTILIZATIONS, ("v1_low", "v1"), strict=True)}
    for utilization, facts in engines.items():
        assert facts["kv_memory_gib"] is not None and facts["kv_tokens"], facts["log_tail"]
        requested_gib = device_capacity * utilization / (1 << 30)
        # vLLM logs two decimals; the tiny Llama's weights and activations take a few MiB of the request.
        assert requested_gib - 0.03 <= facts["kv_memory_gib"] <= requested_gib + 0.005, (utilization, facts)
        # What the engine took of the card once up (its KV cache, weights, buffers): within the utilization.
        taken = facts["card_started"]["allocated"] - facts["card_before"]["allocated"]
        assert 0.9 * device_capacity * utilization <= taken <= device_capacity * utilization, (utilization, facts)
    low, high = (engines[u]["kv_tokens"] for u in UTILIZATIONS)
    assert 1.8 < high / low < 2.2, (low, high)


def test_v1_generates_what_the_simulated_lane_does(lane_runs):
    """NPUWorker and NPUModelRunnerV1 over the emulated card (torch_npu's kernels, schema-faithful) against
    SimulatedAscendWorker (reference kernels): the greedy tokens agree (vLLM's top-k rule at a divergence)."""
    _close(_ok(lane_runs.device["v1"]), _ok(lane_runs.simulated["v1"]), "V1")


def test_mrv2_with_acl_graphs_generates_what_the_simulated_lane_does(lane_runs):
    device = _ok(lane_runs.device["v2_graphs"])
    _close(device, _ok(lane_runs.simulated["v2_graphs"]), "MRV2, ACL graphs")
    assert device["usage"][0]["facts"]["triton"] == "interpreter"  # triton-ascend's place on the emulated card


def test_acl_graphs_on_the_npu_kernels_generate_what_they_do_eagerly(lane_runs):
    """The device's own kernels (the npu backend over the schema-faithful torch_npu) in ACL graphs: their bindings
    traced into vLLM's compiled pieces (norms, activation, rotary), torch_npu's attention as the opaque op between
    them; the same tokens as the same kernels run eagerly, nothing falling back."""
    graphs, eager = _ok(lane_runs.device["v2_graphs_npu"]), _ok(lane_runs.device["v2_npu"])
    check_logprobs_close(graphs["outputs"], eager["outputs"], name_0="ACL graphs (npu kernels)", name_1="eager")
    for facts in (graphs, eager):
        usage = facts["usage"][0]
        assert usage["facts"]["kernel_backend"] == "npu" and usage["fallbacks"] == {}, usage["fallback_reasons"]
        assert usage["npu_ops"].get("npu_fused_infer_attention_score_v2", 0) > 0, usage["npu_ops"]
    replays = sum(v for k, v in _graph_counts(graphs["usage"][0]).items() if k.startswith("graph.replay."))
    assert replays > 0 and graphs["card_generated"]["graphs"]["replay"] == replays


def test_acl_graphs_follow_the_capture_plan_and_are_replayed(lane_runs):
    """vLLM compiles the model into pieces split at attention (opaque op); each piece is one AclGraphWrapper, which
    captures an ACL graph per planned size (PIECEWISE, sizes 4, 2, 1) and replays it for every uniform decode step;
    mixed batches past the largest size run eagerly. The emulated card counts the same captures and replays."""
    device = _ok(lane_runs.device["v2_graphs"])
    counts = _graph_counts(device["usage"][0])
    captured = {k: v for k, v in counts.items() if k.startswith("graph.capture.")}
    assert set(captured) == {f"graph.capture.PIECEWISE.{s}" for s in CAPTURE_SIZES}, counts
    pieces = set(captured.values())
    assert len(pieces) == 1 and pieces.pop() == 3, counts  # the tiny Llama's 2 layers: 3 pieces around attention
    decodes = counts["graph.dispatch.uniform_decode.PIECEWISE"]
    replays = sum(v for k, v in counts.items() if k.startswith("graph.replay.PIECEWISE."))
    assert decodes > 0 and replays == 3 * decodes, counts
    assert counts["graph.dispatch.mixed.NONE"] > 0 and counts.get("graph.capture.FULL.4") is None
    card = device["card_generated"]["graphs"]  # the card's own count of NPUGraph captures and replays
    assert card["capture"] == sum(captured.values()) and card["replay"] == replays, card


def test_sleep_levels_release_the_card_and_leave_generation_unchanged(lane_runs):
    """Level 1 keeps the weights on the host (not the card's memory), level 2 drops them (reloaded after waking);
    both drop the KV cache and the graphs, whose addresses wake-up changes (captured again once awake)."""
    device = _ok(lane_runs.device["v2_graphs"])
    tokens = [o["token_ids"] for o in device["outputs"]]
    baseline = device["card_before"]["allocated"]  # what the process's earlier engines left (vLLM's workspace)
    engine = device["card_generated"]["allocated"] - baseline  # its KV cache, weights, graphs and buffers
    for level in (1, 2):
        cycle = device[f"sleep{level}"]
        asleep, awake = cycle["asleep"], cycle["awake"]
        assert asleep["state"]["sleeping"] == ["kv_cache", "weights"] and asleep["state"]["level"] == level
        assert asleep["card"]["allocated"] - baseline < 0.01 * engine, (level, asleep["card"], baseline, engine)
        assert awake["state"]["sleeping"] == [] and awake["state"]["kv_bound"] is True
        assert abs(awake["card"]["allocated"] - cycle["before"]["allocated"]) < (1 << 20), (level, cycle)
        assert awake["card"]["graphs"]["capture"] > cycle["before"]["graphs"]["capture"]  # captured again
        assert [o["token_ids"] for o in cycle["outputs"]] == tokens, level
    assert device["usage"][0]["counts"].get("graphs.recaptured") is None  # usage read before the cycles


def test_deepseek_mla_on_the_device_lane(lane_runs):
    device = _ok(lane_runs.device["mla"])
    _close(device, _ok(lane_runs.simulated["mla"]), "DeepSeek-V2 MLA")
    usage = device["usage"][0]
    assert usage["facts"]["attention_backend"] == "ASCEND_MLA"
    assert usage["counts"]["attention.ascend_mla.decode_tokens"] > 0
    assert sum(v for k, v in _graph_counts(usage).items() if k.startswith("graph.replay.")) > 0


@pytest.mark.parametrize(("engine", "runner", "reference"), [("tp2", 2, "v2_graphs"), ("tp2_v1", 1, "v1")])
def test_tp2_over_the_emulated_hccl_group(lane_runs, engine, runner, reference):
    """Two NPU workers on npu:0 and npu:1, their collectives over the emulated HCCL group (inside the ACL graphs too;
    V1 captures inside vLLM's graph_capture context of the TP group), against the simulated lane's single rank."""
    device = _ok(lane_runs.device[engine])
    _close(device, _ok(lane_runs.simulated[reference]), f"TP=2, runner V{runner}")
    assert [u["facts"]["worker_device"] for u in device["usage"]] == ["npu:0", "npu:1"]
    for usage in device["usage"]:
        assert usage["facts"]["runner_class"] == RUNNERS.format(runner, "NPU", runner)
        assert sum(v for k, v in _graph_counts(usage).items() if k.startswith("graph.replay.")) > 0


def test_ascend_vllm_serve_answers_completions_on_the_device_lane(lane_runs):
    serve = lane_runs.serve
    assert "error" not in serve, serve["error"]
    choice = serve["completion"]["choices"][0]
    assert choice["finish_reason"] == "length" and serve["completion"]["usage"]["completion_tokens"] == 16
    assert choice["text"].strip()
    facts = serve["usage"]["results"][0]["facts"]
    assert facts["runner_class"].startswith("ascend_platform.worker.model_runner_v") and "NPUModelRunner" in \
        facts["runner_class"]
    assert facts["worker_device"] == "npu:0"
