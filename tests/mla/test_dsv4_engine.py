"""DeepSeek V4 (compressed MLA + DeepSeek sparse attention) served by a vLLM engine in the simulated-NPU lane.

A tiny random V4 checkpoint (`ascend_testkit.models.deepseek_v4`: a sliding-window layer and a compressed sparse
layer, ratio 4, with the lightning indexer keeping 4 compressed entries) is built offline in DeepSeek's own tensor
names, which both vLLM's V4 model and transformers' load. The engine serves it with `AscendDeepseekV4ForCausalLM`
(`ascend_platform.models.deepseek_v4`: vLLM's device-neutral V4 model with every fused op on `ascend_kernels`).

- transformers' DeepseekV4ForCausalLM runs it in float64 (`deepseek_v4_reference`), and the indexer's selection
  decides its output on prompts past 16 tokens.
- The engine keeps its latent rows in DeepSeek's fp8_ds_mla cache format (vLLM forces it for V4) and its indexer
  keys in fp8; the random checkpoint is chaotic enough that this rounding alone flips a routing or selection
  decision a few tokens in. The reference therefore stores its cached rows the same way
  (`storage="fp8_ds_mla"`, everything else float64), and the engine must match it under `check_logprobs_close`;
  the same reference with dense compressed attention must differ on the long prompts (the engine follows the
  indexer's selection). The plain float64 reference stays the test of the checkpoint itself.
- Whole prompts in one step, and chunked prefill (a 32-token budget: long prompts in chunks continuing a cached
  context, decodes sharing steps with prefill chunks), on the V1 runner and on MRV2, give the reference's tokens;
  the same prompts again (on cache blocks the first round filled and freed) give the same tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ascend_testkit.compare import check_logprobs_close

PROMPT_LENGTHS = (5, 16, 17, 40, 65)  # within the window, at and past window + index_topk * ratio = 32 tokens
LONG = [i for i, n in enumerate(PROMPT_LENGTHS) if n > 32]
MAX_TOKENS = 8
LOGPROBS = 5
ENGINE = dict(dtype="float32", max_model_len=256, enforce_eager=True, max_num_seqs=4, seed=0)
CHUNKED = dict(enable_chunked_prefill=True, max_num_batched_tokens=32)


@pytest.fixture(scope="module")
def v4_model(cache_root) -> Path:
    from ascend_testkit.models.deepseek_v4 import cached_tiny_deepseek_v4

    return cached_tiny_deepseek_v4(cache_dir=cache_root / "models")


@pytest.fixture(scope="module")
def v4_prompts() -> list[str]:
    from ascend_testkit.models.tiny_llama import prompt_of_length

    return [prompt_of_length(n, offset=3 * n) for n in PROMPT_LENGTHS]


@pytest.fixture(scope="module")
def stored_reference(v4_model, v4_prompts) -> list[dict]:
    from ascend_testkit.models.deepseek_v4_reference import float64_v4_outputs

    return float64_v4_outputs(v4_model, v4_prompts, MAX_TOKENS, LOGPROBS, storage="fp8_ds_mla")


@pytest.fixture(scope="module")
def v4_served(sim_v1_host, sim_host, v4_model, v4_prompts) -> dict[str, dict]:
    """Each engine configuration's outputs (then the same prompts again), and the
    usage counts the first generation added (a host process keeps counting across engines), one engine after the
    other on the shared hosts: the V1 runner with whole prompts and with chunked prefill, MRV2 chunked."""
    runs = {}
    for name, host, extra in (("whole", sim_v1_host, {}), ("chunked", sim_v1_host, CHUNKED),
                              ("mrv2", sim_host, CHUNKED)):
        host.start(v4_model, **(ENGINE | extra))
        try:
            before = host.usage()[0]["counts"]
            outputs = host.generate(v4_prompts, max_tokens=MAX_TOKENS, logprobs=LOGPROBS)["outputs"]
            usage = host.usage()[0]
            again = host.generate(v4_prompts, max_tokens=MAX_TOKENS, logprobs=LOGPROBS)["outputs"]
        finally:
            host.stop()
        counts = {k: v - before.get(k, 0) for k, v in usage["counts"].items()}
        runs[name] = {"outputs": outputs, "again": again, "counts": counts, "facts": usage["facts"]}
    return runs


def test_transformers_loads_every_tensor_of_the_deepseek_named_checkpoint(v4_model):
    import torch
    from transformers import AutoModelForCausalLM

    _, info = AutoModelForCausalLM.from_pretrained(v4_model, dtype=torch.float64, output_loading_info=True,
                                                   experts_implementation="eager")
    assert not any(info.values()), info
    config = json.loads((v4_model / "config.json").read_text())
    assert config["compress_ratios"] == [0, 4] and config["num_hash_layers"] == 0  # what vLLM's model reads


def test_float64_reference_depends_on_the_indexer_selection(v4_model, v4_prompts):
    from ascend_testkit.models.deepseek_v4_reference import float64_v4_outputs

    sparse = float64_v4_outputs(v4_model, v4_prompts, MAX_TOKENS, LOGPROBS)
    dense = float64_v4_outputs(v4_model, v4_prompts, MAX_TOKENS, LOGPROBS, index_topk=10**6)
    assert all(len(o["token_ids"]) == MAX_TOKENS for o in sparse)
    # Up to 16 tokens the 4 compressed entries of ratio 4 are all there is: sparse equals dense.
    short = [i for i, n in enumerate(PROMPT_LENGTHS) if n + MAX_TOKENS <= 17]
    assert short and all(sparse[i]["token_ids"] == dense[i]["token_ids"] for i in short)
    differs = [i for i, n in enumerate(PROMPT_LENGTHS) if n > 16 and sparse[i]["token_ids"] != dense[i]["token_ids"]]
    assert differs, "dense compressed attention gave the same tokens as the sparse model on every long prompt"


def test_engine_serves_deepseek_v4_like_the_float64_reference(v4_served, stored_reference):
    whole = v4_served["whole"]
    assert all(len(o["token_ids"]) == MAX_TOKENS for o in whole["outputs"])
    check_logprobs_close(whole["outputs"], stored_reference, name_0="simulated lane", name_1="float64 (fp8_ds_mla)")
    assert whole["facts"]["model_class"].endswith("AscendDeepseekV4ForCausalLM"), whole["facts"]
    counts = whole["counts"]
    # Both layer kinds attended through the Ascend op, the compressed one after the indexer's fp8 scoring (every
    # step holds a prompt past 16 tokens, so no step takes the every-key-taken shortcut).
    assert counts["attention.ascend_dsa.ratio1.tokens"] > 0 and counts["attention.ascend_dsa.ratio4.tokens"] > 0
    assert counts["attention.ascend_dsa.indexed_tokens"] > 0
    for op in ("dsv4_qnorm_rope_kv_insert", "dsv4_sparse_mla_with_kvcache", "dsv4_compress_norm_rope_store",
               "dsv4_compress_norm_rope_store_indexer", "dsv4_fp8_paged_mqa_logits", "dsv4_topk_transform",
               "dsv4_mhc_pre", "dsv4_hc_head", "moe_gating_topk", "fused_moe"):
        assert counts[f"kernels.{op}"] > 0, op


def test_engine_follows_the_indexer_selection_on_long_prompts(v4_model, v4_prompts, v4_served):
    from ascend_testkit.models.deepseek_v4_reference import float64_v4_outputs

    long_prompts = [v4_prompts[i] for i in LONG]
    dense = float64_v4_outputs(v4_model, long_prompts, MAX_TOKENS, LOGPROBS, index_topk=10**6, storage="fp8_ds_mla")
    ours = [v4_served["whole"]["outputs"][i]["token_ids"] for i in LONG]
    assert any(o != d["token_ids"] for o, d in zip(ours, dense, strict=True)), \
        "the engine gave dense compressed attention's tokens on every long prompt"


def test_chunked_prefill_and_mixed_batches_serve_the_same_tokens(v4_served, stored_reference):
    chunked = v4_served["chunked"]
    counts = chunked["counts"]
    assert counts["attention.ascend_dsa.context_prefills"] > 0  # prefill chunks continuing a cached context
    assert counts["attention.ascend_dsa.mixed_batches"] > 0  # decodes and prefill chunks in one step
    check_logprobs_close(chunked["outputs"], stored_reference, name_0="chunked", name_1="float64 (fp8_ds_mla)")
    assert [o["token_ids"] for o in chunked["outputs"]] == [o["token_ids"] for o in v4_served["whole"]["outputs"]]


def test_mrv2_serves_the_same_tokens(v4_served, stored_reference):
    mrv2 = v4_served["mrv2"]
    assert "model_runner_v2" in mrv2["facts"]["runner_class"], mrv2["facts"]
    assert mrv2["counts"]["attention.ascend_dsa.context_prefills"] > 0
    check_logprobs_close(mrv2["outputs"], stored_reference, name_0="MRV2", name_1="float64 (fp8_ds_mla)")


@pytest.mark.parametrize("run", ["whole", "chunked", "mrv2"])
def test_serving_again_on_reused_cache_blocks_gives_the_same_tokens(v4_served, run):
    # V4's cache blocks are 256 tokens and these prompts shorter: nothing comes from the prefix cache, the second
    # round runs on blocks the first one filled and freed (stale rows must stay unread).
    served = v4_served[run]
    assert all(o["num_cached_tokens"] == 0 for o in served["again"])
    assert [o["token_ids"] for o in served["again"]] == [o["token_ids"] for o in served["outputs"]]
