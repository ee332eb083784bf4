"""Mixture-of-experts models through the plugin in a real vLLM engine (simulated-NPU lane) against vLLM-CPU.

Engines run once per session (see conftest): Qwen3-MoE, GLM-4-MoE, a DeepSeek-V2 MoE and Cohere2-MoE (a model's own
routing function) on both platforms, a model with its own `RoutedExperts` subclass, Qwen3-MoE over two expert-parallel
ranks with EPLB, and the tiny Llama with batch-sharded sampling over two tensor-parallel ranks (the logits processor's
`skip_gather`).
"""

from __future__ import annotations

import pytest

from ascend_testkit.models.moe import expert_scale

pytestmark = pytest.mark.engine

OUR_OPS = ("kernels.moe_gating_topk", "kernels.fused_moe", "moe.forward")
_PLAIN_MRO = ["AscendRoutedExperts", "AscendRoutedExpertsMixin", "RoutedExperts"]


def _tokens(outputs):
    return [o["token_ids"] for o in outputs]


def test_qwen3_moe_matches_vllm_cpu(moe_runs, logprobs_close):
    ours, cpu = moe_runs["qwen3"], moe_runs["cpu_qwen3"]
    assert all(len(o["token_ids"]) == 16 for o in ours["outputs"])
    logprobs_close(ours["outputs"], cpu["outputs"])
    usage = ours["usage"][0]
    counts, facts = usage["counts"], usage["facts"]
    assert facts["runner"] == "v1"
    assert [layer["mro"][:3] for layer in ours["routed_experts"][0]] == [_PLAIN_MRO] * 2
    for op in OUR_OPS:
        assert counts.get(op, 0) > 0, (op, counts)
    # Every MoE forward of both layers routed through our gating kernel and ran our experts kernel.
    assert counts["kernels.moe_gating_topk"] == counts["kernels.fused_moe"] == counts["moe.forward"]
    assert facts["kernel_checks"] is True and counts["logits.full"] > 0  # our logits processor, one rank


def test_glm_moe_deepseek_routing_and_shared_expert_match_vllm_cpu(moe_runs, logprobs_close):
    """Sigmoid scores, a correction bias steering selection, grouped top-k (4 groups, 2 kept), a scaling factor and a
    shared expert, as DeepSeek-V3 routes, on the V1 runner."""
    ours, cpu = moe_runs["glm"], moe_runs["cpu_glm"]
    logprobs_close(ours["outputs"], cpu["outputs"])
    counts = ours["usage"][0]["counts"]
    assert [layer["mro"][:3] for layer in ours["routed_experts"][0]] == [_PLAIN_MRO] * 2  # layers 1-2; 0 is dense
    assert counts["kernels.moe_gating_topk"] == counts["kernels.fused_moe"] == counts["moe.forward"] > 0
    # One SiluAndMul per step in the dense first layer and one per MoE layer's shared expert, all ours.
    assert counts["kernels.silu_and_mul"] * 2 == counts["moe.forward"] * 3
    assert ours["usage"][0]["facts"]["runner"] == "v1"


def test_deepseek_moe_with_mla_grouped_topk_and_shared_expert_matches_vllm_cpu(moe_runs, logprobs_close):
    """DeepSeek-V2: multi-head latent attention (the Ascend MLA backend), grouped softmax top-k (4 groups, 2 kept),
    routed_scaling_factor and a shared expert, with a dense first layer, on Model Runner V2."""
    ours, cpu = moe_runs["deepseek"], moe_runs["cpu_deepseek"]
    logprobs_close(ours["outputs"], cpu["outputs"])
    usage = ours["usage"][0]
    counts = usage["counts"]
    assert usage["facts"]["attention_backend"] == "ASCEND_MLA" and usage["facts"]["kernel_checks"] is True
    assert usage["facts"]["runner"] == "v2"
    assert [layer["mro"][:3] for layer in ours["routed_experts"][0]] == [_PLAIN_MRO] * 2
    assert counts["kernels.moe_gating_topk"] == counts["kernels.fused_moe"] == counts["moe.forward"] > 0
    assert counts["kernels.silu_and_mul"] * 2 == counts["moe.forward"] * 3


def test_cohere2_moe_custom_routing_function_matches_vllm_cpu(moe_runs, logprobs_close):
    """Cohere2-MoE hands its FusedMoE layers a routing function of its own (sigmoid top-k, renormalised): our router
    calls it instead of the gating kernel, on Model Runner V2, with a shared expert summed in."""
    ours, cpu = moe_runs["cohere"], moe_runs["cpu_cohere"]
    assert all(len(o["token_ids"]) == 16 for o in ours["outputs"])
    logprobs_close(ours["outputs"], cpu["outputs"])
    usage = ours["usage"][0]
    counts = usage["counts"]
    assert usage["facts"]["runner"] == "v2"
    layers = ours["routed_experts"][0]
    assert [layer["mro"][:3] for layer in layers] == [_PLAIN_MRO] * 2
    assert [layer["custom_routing"] for layer in layers] == ["token_choice_with_bias"] * 2
    # Every MoE forward of both layers took the custom-routing branch, and none fell back to the gating kernel.
    assert counts.get("moe.routing.custom", 0) == counts["kernels.fused_moe"] == counts["moe.forward"] > 0, counts
    assert "kernels.moe_gating_topk" not in counts, counts


def test_model_defined_routed_experts_subclass_keeps_its_loader_and_uses_our_routing(moe_runs, logprobs_close):
    """ScaledExperts' loader multiplies each expert's down projection by the checkpoint's scale; its checkpoint holds
    down_proj / scale, so only with that loader does the model equal the plain Qwen3-MoE."""
    scaled, plain = moe_runs["scaled"], moe_runs["qwen3"]
    assert _tokens(scaled["outputs"]) == _tokens(plain["outputs"])
    logprobs_close(scaled["outputs"], moe_runs["cpu_qwen3"]["outputs"])
    layers = scaled["routed_experts"][0]
    assert len(layers) == 2
    for layer, plain_layer in zip(layers, plain["routed_experts"][0], strict=True):
        assert layer["mro"][:3] == ["AscendScaledExperts", "AscendRoutedExpertsMixin", "ScaledExperts"]
        assert layer["w2_scale"] == [expert_scale(e) for e in range(8)]
        assert layer["w2_norms"] == pytest.approx(plain_layer["w2_norms"], rel=1e-6)  # = (ckpt / scale) * scale
    counts = scaled["usage"][0]["counts"]
    assert counts["kernels.moe_gating_topk"] == counts["kernels.fused_moe"] == counts["moe.forward"] > 0


def test_expert_parallel_with_eplb_matches_tp1_and_survives_rebalances(moe_runs, logprobs_close):
    run = moe_runs["expert_parallel"]
    # Two EP ranks (each with half the experts plus one redundant slot) equal the single-rank engine.
    logprobs_close(run["A"], moe_runs["qwen3"]["outputs"], name_0="EP=2", name_1="TP=1")
    state_a, state_b = run["state_A"][0], run["state_B"][0]
    assert not state_a["rebalances"], f"a rebalance came before the 'before' window closed: {state_a}"
    rebalances = state_b["rebalances"]
    assert [r["reason"] for r in rebalances] == ["interval"], rebalances
    # B ran across the rebalance (weights moved, map swapped between steps), C wholly after it: same tokens.
    assert _tokens(run["B"]) == _tokens(run["A"]) == _tokens(run["C"])
    for rank_usage, state in zip(run["usage"], run["state_C"], strict=True):
        counts = rank_usage["counts"]
        assert state["layers"] == 2 and counts["eplb.rebalances"] >= 1
        assert counts["eplb.experts_received"] > 0 and counts["logits.gathered"] > 0
    assert run["state_A"][0]["steps"] == run["state_A"][1]["steps"]  # both ranks counted the same steps


def test_expert_parallel_without_eplb_uses_vllms_expert_map_and_matches_tp1(moe_runs, logprobs_close):
    run = moe_runs["expert_parallel_without_eplb"]
    logprobs_close(run["outputs"], moe_runs["qwen3"]["outputs"], name_0="EP=2 (vLLM's map)", name_1="TP=1")
    assert len(run["usage"]) == 2
    for rank_usage in run["usage"]:
        counts = rank_usage["counts"]
        # Each rank computed its own experts through vLLM's global -> local map; EPLB never took part.
        assert counts.get("moe.expert_map", 0) > 0 and counts.get("moe.forward", 0) > 0, counts
        assert "eplb.layers" not in counts and "eplb.rebalances" not in counts, counts


def test_eplb_balances_the_skewed_load(moe_runs):
    run = moe_runs["expert_parallel"]
    before, after = run["window_A"][0], run["window_C"][0]
    # The skewed checkpoint routes most tokens to the first rank's experts under vLLM's linear placement.
    assert before["imbalance"] > 1.5, before
    assert after["imbalance"] <= 1.15, after
    for layer in after["layers"]:
        assert sum(layer["rank_load"]) > 0 and len(layer["phys2log"]) == 10  # 8 experts + 2 redundant slots
    assert run["window_C"][1]["layers"][0]["phys2log"] == after["layers"][0]["phys2log"]  # ranks agree


def test_tp2_batch_sharded_sampling_takes_skip_gather_and_equals_tp1(moe_runs, logprobs_close):
    tp2, tp1 = moe_runs["tp2_batch_sharded"], moe_runs["cpu_llama"]
    assert _tokens(tp2["outputs"]) == _tokens(tp1["outputs"])
    logprobs_close(tp2["outputs"], tp1["outputs"], name_0="TP=2", name_1="TP=1")
    assert len(tp2["usage"]) == 2
    for rank_usage in tp2["usage"]:
        counts = rank_usage["counts"]
        # The runner asked our logits processor for the local vocab shard: it returned before the TP gather.
        assert counts.get("logits.local_shard", 0) > 0 and "logits.gathered" not in counts, counts
        assert rank_usage["facts"]["runner"] == "v2"
