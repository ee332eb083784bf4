"""DeepSeek V3.2's sparse attention (SFA) end to end in the simulated-NPU lane: a tiny V3.2 checkpoint
(index_topk 16, prompts up to 100 tokens, so the lightning indexer drops most of each long context) served through
ASCEND_SFA, `AscendSparseAttnIndexer` and the SFA kernels of ascend_kernels.

The reference is transformers' DeepseekV32ForCausalLM in float64 (`ascend_testkit.models.deepseek_v32_reference`),
its indexer scoring fp8-quantized queries and keys as vLLM's Indexer does (per 128 elements, pow2 scales); plain vLLM
CPU cannot serve the model (its platform refuses sparse attention, asserted below). A dense float64 run (index_topk
above every length) shows the selection matters: it gives other tokens.

One engine per runner: Model Runner V2 (vLLM's default here) with chunked prefill over 16-token blocks (a 32-token
budget), the prompts twice (the second time long prompts continue prefix-cached blocks, indexer keys included), and
the V1 runner once.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ascend_testkit.compare import check_logprobs_close
from ascend_testkit.models.deepseek_v32_reference import float64_v32_outputs

pytestmark = [pytest.mark.engine]

V32_BLOCK_SIZE = 16
V32_PROMPT_LENGTHS = (5, 16, 17, 40, 65, 100)  # below index_topk, at block edges, and 2.5-6x index_topk

MAX_TOKENS = 16
LOGPROBS = 5
ENGINE = dict(dtype="float32", max_model_len=256, enforce_eager=True, max_num_seqs=4, seed=0,
              block_size=V32_BLOCK_SIZE, max_num_batched_tokens=32, enable_chunked_prefill=True,
              additional_config={"kernel_checks": True})


@pytest.fixture(scope="module")
def v32_prompts() -> list[str]:
    from ascend_testkit.models.tiny_llama import prompt_of_length

    return [prompt_of_length(n, offset=3 * n) for n in V32_PROMPT_LENGTHS]


def _generate(host, prompts):
    return host.generate(prompts, max_tokens=MAX_TOKENS, logprobs=LOGPROBS)["outputs"]


@pytest.fixture(scope="module")
def v32_ours(sim_host, v32_model, v32_prompts) -> dict:
    started = sim_host.start(v32_model, **ENGINE)
    try:
        result = {"platform": started["platform"], "outputs": _generate(sim_host, v32_prompts)}
        result["usage"] = sim_host.usage()[0]
        result["layer_kv"] = sim_host.rpc("ascend_testkit.kv_probes:layer_kv")[0]
        counts = result["usage"]["counts"]
        before = counts.get("attention.ascend_sfa.prefill_tokens", 0)
        result["outputs_again"] = _generate(sim_host, v32_prompts)
        result["prefill_tokens_again"] = (
            sim_host.usage()[0]["counts"].get("attention.ascend_sfa.prefill_tokens", 0) - before)
        return result
    finally:
        sim_host.stop()


@pytest.fixture(scope="module")
def v32_reference(v32_model, v32_prompts) -> list[dict]:
    return float64_v32_outputs(v32_model, v32_prompts, MAX_TOKENS, LOGPROBS)


def test_v32_matches_transformers_float64_with_vllms_fp8_indexer(v32_ours, v32_reference):
    assert v32_ours["platform"] == "SimulatedNPUPlatform"
    ours = v32_ours["outputs"]
    assert all(len(o["token_ids"]) == MAX_TOKENS for o in ours)
    check_logprobs_close(ours, v32_reference, name_1="transformers V3.2 float64 (fp8 indexer)")
    # Where the tokens agree the chosen token's logprob agrees too (float32 engine vs float64 reference): within
    # 1e-3 almost everywhere; a key whose fp8 score sits on a rounding edge may swap one selection (seen: 0.03).
    diffs = []
    for a, b in zip(ours, v32_reference, strict=True):
        for pos, (ta, tb) in enumerate(zip(a["token_ids"], b["token_ids"], strict=True)):
            if ta != tb:
                break
            diffs.append(abs(a["logprobs"][pos][str(ta)] - b["logprobs"][pos][str(tb)]))
    assert len(diffs) >= MAX_TOKENS * len(ours) // 2, diffs
    assert max(diffs) < 0.1 and sum(d < 1e-3 for d in diffs) >= 0.95 * len(diffs), diffs


def test_the_indexer_selection_decides_the_output(v32_ours, v32_model, v32_prompts, v32_reference):
    counts = v32_ours["usage"]["counts"]
    # Queries that saw index_topk keys or more: in the 40..100-token prompts most keys are left out.
    assert counts["attention.ascend_sfa.full_selections"] > 0
    dense = float64_v32_outputs(v32_model, v32_prompts, MAX_TOKENS, LOGPROBS, index_topk=10**6)
    index_topk = json.loads((Path(v32_model) / "config.json").read_text())["index_topk"]
    long_prompts = [i for i, n in enumerate(V32_PROMPT_LENGTHS) if n > index_topk]
    differs = [i for i in long_prompts if dense[i]["token_ids"] != v32_ours["outputs"][i]["token_ids"]]
    assert differs, "dense attention gave the same tokens as the sparse model on every long prompt"
    # The 5-token prompt stays within index_topk keys for its first 11 positions: there sparse equals dense.
    assert dense[0]["token_ids"][:11] == v32_ours["outputs"][0]["token_ids"][:11]


def test_prefix_cache_hits_reuse_the_indexer_keys_and_give_the_same_tokens(v32_ours):
    assert [o["token_ids"] for o in v32_ours["outputs_again"]] == [o["token_ids"] for o in v32_ours["outputs"]]
    # Cached full blocks are not prefilled again (their latents and indexer keys come from the cache).
    assert v32_ours["prefill_tokens_again"] < v32_ours["usage"]["counts"]["attention.ascend_sfa.prefill_tokens"]


def test_ascend_sfa_backend_indexer_and_kernels_did_the_work(v32_ours):
    usage = v32_ours["usage"]
    counts, facts = usage["counts"], usage["facts"]
    assert usage["attention_impls"] == ["AscendSFAImpl"] and facts["attention_backend"] == "ASCEND_SFA"
    assert facts["runner"] == "v2" and facts["kernel_backend"] == "reference" and facts["kernel_checks"] is True
    for op in ("kernels.quantize_fp8_groups", "kernels.indexer_cache_write", "kernels.indexer_topk",
               "kernels.sparse_mla_attention", "kernels.reshape_and_cache_mla"):
        assert counts.get(op, 0) > 0, (op, counts)
    # Both layers indexed and attended every prompt token (prefill, in 32-token chunks) and the decodes, and
    # decodes shared steps with prefill chunks.
    prompt_tokens = sum(V32_PROMPT_LENGTHS)
    assert counts["attention.ascend_sfa.prefill_tokens"] >= 2 * prompt_tokens
    assert counts["attention.ascend_sfa.indexed_tokens"] >= 2 * prompt_tokens
    assert counts["attention.ascend_sfa.decode_tokens"] > 0 and counts["attention.ascend_sfa.mixed_batches"] > 0


def test_kv_per_token_is_the_latent_plus_the_fp8_indexer_key(v32_ours):
    layers = v32_ours["layer_kv"]
    mla = {n: kv for n, kv in layers.items() if not n.endswith("indexer.k_cache")}
    indexer = {n: kv for n, kv in layers.items() if n.endswith("indexer.k_cache")}
    assert len(mla) == len(indexer) == 2, sorted(layers)
    for kv in mla.values():
        assert kv["dims"] == {"latent": 512, "rope": 64} and kv["bytes_per_token"] == 576 * 4
    for kv in indexer.values():  # 128 fp8 key bytes + one float32 scale per 128
        assert kv["vllm_view_bytes_per_token"] == 128 + 4
        assert kv["states_per_block"] == V32_BLOCK_SIZE


def test_v1_runner_gives_the_same_tokens(sim_v1_host, v32_model, v32_prompts, v32_ours):
    sim_v1_host.start(v32_model, **ENGINE)
    try:
        outputs = _generate(sim_v1_host, v32_prompts)
        assert sim_v1_host.usage()[0]["facts"]["runner"] == "v1"
    finally:
        sim_v1_host.stop()
    assert [o["token_ids"] for o in outputs] == [o["token_ids"] for o in v32_ours["outputs"]]


def test_plain_vllm_cpu_refuses_the_sparse_model(cpu_host, v32_model):
    err = cpu_host.start_error(v32_model, dtype="float32", max_model_len=256, enforce_eager=True)
    assert err is not None and "Sparse Attention is not supported on CPU" in err["message"], err
