"""DeepSeek V4.1 (text model) served by a vLLM engine in the simulated-NPU lane, against an independent float64 model.

A tiny random V4.1 checkpoint (`ascend_testkit.models.deepseek_v41`, DeepSeek's release tensor names) has every
layer kind V4.1 knows: sliding-window-only layers (ratio 0), compressed layers of ratio 2 and 1, KV sources owning a
compressor and others reading theirs, index sources running an indexer and others reusing its selection, the
candidate-block source narrowing a later indexer, and engram layers. The engine serves it with
`AscendDeepseekV41ForCausalLM` (`ascend_platform.models.deepseek_v41`), every op on `ascend_kernels`;
`ascend_testkit.models.deepseek_v41_reference` computes the same model in float64 (rounding only where vLLM's V4.1
itself rounds: the compressor latent to bf16, the indexer's q/k to fp8).

- Whole prompts of 5/17/40/65 tokens (the longer ones past the window plus index_topk compressed entries, so the
  indexer and the candidate blocks select), and chunked prefill (a 32-token budget: long prompts in chunks continuing
  a cached context, the engram's n-grams crossing chunk edges), on MRV2 (the lane's default runner) and on the V1
  runner, give the reference's tokens under `check_logprobs_close`; usage counters show each part ran.
- Knock-outs: the reference without engram, without candidate filtering, with dense compressed attention, or with
  V4's undelayed mHC gives other tokens on some prompt than the engine: the engine's agreement depends on each.
- What the lane does not serve (a vision tower) is refused at start-up, naming the value.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ascend_testkit.compare import check_logprobs_close

PROMPT_LENGTHS = (5, 17, 40, 65)  # inside the 16-token window, past it, past window + index_topk (8) x ratio
MAX_TOKENS = 8
LOGPROBS = 5
ENGINE = dict(dtype="float32", max_model_len=256, enforce_eager=True, max_num_seqs=4, seed=0,
              additional_config={"kernel_checks": True})  # every dsv41_*/dsv4_* call validated
CHUNKED = dict(enable_chunked_prefill=True, max_num_batched_tokens=32)
RUNS = (("mrv2", "sim_host", {}), ("mrv2_chunked", "sim_host", CHUNKED), ("v1_chunked", "sim_v1_host", CHUNKED))


@pytest.fixture(scope="module")
def v41_model(cache_root) -> Path:
    from ascend_testkit.models.deepseek_v41 import cached_tiny_deepseek_v41

    return cached_tiny_deepseek_v41(cache_dir=cache_root / "models")


@pytest.fixture(scope="module")
def v41_prompts() -> list[str]:
    from ascend_testkit.models.tiny_llama import prompt_of_length

    return [prompt_of_length(n, offset=3 * n) for n in PROMPT_LENGTHS]


@pytest.fixture(scope="module")
def reference(v41_model, v41_prompts) -> list[dict]:
    from ascend_testkit.models.deepseek_v41_reference import float64_v41_outputs

    return float64_v41_outputs(v41_model, v41_prompts, MAX_TOKENS, LOGPROBS)


@pytest.fixture(scope="module")
def v41_served(request, v41_model, v41_prompts) -> dict[str, dict]:
    """Each engine configuration's outputs and the usage counts its generation added (a host process keeps counting
    across engines), one engine after the other on the shared hosts."""
    runs = {}
    for name, host_fixture, extra in RUNS:
        host = request.getfixturevalue(host_fixture)
        host.start(v41_model, **(ENGINE | extra))
        try:
            before = host.usage()[0]["counts"]
            outputs = host.generate(v41_prompts, max_tokens=MAX_TOKENS, logprobs=LOGPROBS)["outputs"]
            usage = host.usage()[0]
        finally:
            host.stop()
        counts = {k: v - before.get(k, 0) for k, v in usage["counts"].items()}
        runs[name] = {"outputs": outputs, "counts": counts, "facts": usage["facts"]}
    return runs


def _tokens(outputs: list[dict]) -> list[list[int]]:
    return [o["token_ids"] for o in outputs]


def test_engine_serves_deepseek_v41_like_the_float64_reference(v41_served, reference):
    run = v41_served["mrv2"]
    assert all(len(o["token_ids"]) == MAX_TOKENS for o in run["outputs"])
    check_logprobs_close(run["outputs"], reference, name_0="simulated lane (MRV2)", name_1="float64 V4.1")
    facts, counts = run["facts"], run["counts"]
    assert facts["model_class"].endswith("AscendDeepseekV41ForCausalLM"), facts
    assert "model_runner_v2" in facts["runner_class"], facts
    assert facts["kernel_checks"] is True, facts
    # The model side: delayed mHC (the first layer's broadcast rule once per step), the final collapse, V4's MoE
    # with sqrtsoftplus routing, the engram's hash, table lookup and gate, all through the kernel facade.
    for op in ("dsv41_mhc_pre_delayed", "dsv4_mhc_post", "dsv41_hc_collapse", "moe_gating_topk", "fused_moe",
               "dsv41_engram_hash", "dsv41_engram_lookup", "dsv41_engram_gate"):
        assert counts.get(f"kernels.{op}", 0) > 0, op
    steps = counts["dsv41.first_layer_broadcast_pre"]
    assert steps > 0 and counts["kernels.dsv41_hc_collapse"] == steps
    # 6 layers: 1 broadcast pre + 11 delayed pres per step; engram at layers 1 and 4 (layer 0 would be skipped).
    assert counts["kernels.dsv41_mhc_pre_delayed"] == 12 * steps
    assert counts["dsv41.engram_layer_calls"] == 2 * counts["dsv41.engram_hash_calls"] > 0
    assert counts["dsv41.lookback_windows"] > 0  # MRV2's model state gathered the engram's lookback ids
    # The attention side: every layer kind attended, KV sources compressed rows of both ratios, and the indexer
    # scored and selected (the long prompts hold more compressed entries than index_topk).
    for kind in ("ratio0.tokens", "ratio1.tokens", "ratio2.tokens", "compressed_rows.ratio1",
                 "compressed_rows.ratio2", "indexed_tokens"):
        assert counts.get(f"attention.ascend_dsa_v41.{kind}", 0) > 0, kind
    # The candidate source (layer 4) published its blocks and a later index source (layer 5) kept only those.
    assert counts.get("attention.ascend_dsa_v41.candidate_filtered_tokens", 0) > 0
    for op in ("dsv41_q_rope_kv_insert", "dsv41_save_compress_norm", "dsv41_indexer_k_norm_rope_store",
               "dsv4_fp8_paged_mqa_logits", "dsv4_topk_transform", "dsv4_sparse_mla_with_kvcache",
               "dsv41_select_candidate_blocks", "dsv41_apply_candidate_mask"):
        assert counts.get(f"kernels.{op}", 0) > 0, op


@pytest.mark.parametrize("run", ["mrv2_chunked", "v1_chunked"])
def test_chunked_prefill_serves_the_reference_tokens(v41_served, reference, run):
    served = v41_served[run]
    check_logprobs_close(served["outputs"], reference, name_0=run, name_1="float64 V4.1")
    assert _tokens(served["outputs"]) == _tokens(v41_served["mrv2"]["outputs"])
    if run == "v1_chunked":
        assert "model_runner_v1" in served["facts"]["runner_class"], served["facts"]
        # The V1 runner passes no lookback ids: the engram read them back from the first layer's cache slots.
        assert served["counts"]["dsv41.engram_slot_history_writes"] > 0


@pytest.mark.parametrize("knock_out", [dict(engram=False), dict(candidates=False), dict(index_topk=10**6),
                                       dict(delayed_mhc=False)], ids=lambda k: next(iter(k)))
def test_engine_depends_on_each_v41_feature(v41_model, v41_prompts, v41_served, reference, knock_out):
    from ascend_testkit.models.deepseek_v41_reference import float64_v41_outputs

    without = float64_v41_outputs(v41_model, v41_prompts, MAX_TOKENS, LOGPROBS, **knock_out)
    ours = _tokens(v41_served["mrv2"]["outputs"])
    assert ours != _tokens(without), f"the engine gave the reference's tokens with {knock_out} too"


def test_start_up_refuses_a_vision_tower_naming_it(sim_host, v41_model, tmp_path):
    vl = tmp_path / "tiny-deepseek_v41-vl"
    shutil.copytree(v41_model, vl, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((vl / "config.json").read_text())
    config["vision_config"] = {"num_hidden_layers": 2}
    (vl / "config.json").write_text(json.dumps(config))
    err = sim_host.start_error(vl, **ENGINE)
    assert err is not None, "the simulated lane started a V4.1 model with a vision tower"
    assert "vision" in err["message"] and "num_hidden_layers=2" in err["message"], err


def test_start_up_refuses_tensor_parallel_naming_it(sim_host, v41_model):
    err = sim_host.start_error(v41_model, **(ENGINE | dict(tensor_parallel_size=2)))
    assert err is not None, "the simulated lane started a V4.1 model with tensor_parallel_size=2"
    assert "tensor_parallel_size=2 (only 1)" in err["message"], err
