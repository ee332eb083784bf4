"""DeepSeek V4 on prompts past its 256-token cache block, in the simulated-NPU lane: a heavily compressed layer
(ratio 128, no indexer) and the prefix cache.

The checkpoint adds a ratio-128 layer to the default tiny V4's sliding-window and ratio-4 layers
(`TinyDeepseekV4Spec(compress_ratios=(0, 4, 128))`); 300-token prompts give that layer two complete compressed
entries, so its output depends on what the compressor folded (the float64 reference with fp8_ds_mla storage, as in
test_dsv4_engine.py, is the judge; the same reference without the ratio-128 entries must be further off).
Its weights are drawn with half the default range: at the default, 300 tokens make the model so chaotic that the
float64 reference with and without fp8_ds_mla storage disagree on the first token, and the engine (which also scores
the indexer in fp8) on the second.

One engine (V1 runner, prefix caching on, vLLM's default) serves:
1. prompt A alone (nothing cached);
2. A again with prompt B, whose first SHARED tokens are A's: both hit the prefix cache for exactly one 256-token
   block (hits land on the scheduler's 256-token block where every group agrees, and never cover a prompt's last
   token; V4's sliding-window groups are prefix-cacheable, only V4.1 on MRV2 replays its window instead), so their
   prefill continues from cached compressed rows, sliding-window pages and compressor states (the ratio-4
   compressor's overlapping window reaches back into the cached block);
3. B alone after the prefix cache is reset (B without the cache).
Cached and uncached servings give the same tokens, and all match the reference.
"""

from __future__ import annotations

import pytest

from ascend_testkit.compare import check_logprobs_close, one_thread

V4_BLOCK = 256  # tokens per V4 cache block (every KV cache group)
LENGTH = 300  # > 2 * 128: the ratio-128 layer holds two complete compressed entries
SHARED = 270
INIT_RANGE = 0.5
MAX_TOKENS = 8
LOGPROBS = 5
ENGINE = dict(dtype="float32", max_model_len=512, enforce_eager=True, max_num_seqs=4, seed=0,
              enable_prefix_caching=True, additional_config={"kernel_checks": True})  # every dsv4_* call validated


@pytest.fixture(scope="module")
def v4_128_model(cache_root):
    from ascend_testkit.models.deepseek_v4 import TinyDeepseekV4Spec, cached_tiny_deepseek_v4

    spec = TinyDeepseekV4Spec(compress_ratios=(0, 4, 128), initializer_range=INIT_RANGE)
    return cached_tiny_deepseek_v4(spec, cache_dir=cache_root / "models")


@pytest.fixture(scope="module")
def long_prompts() -> dict[str, str]:
    from ascend_testkit.models.tiny_llama import prompt_of_length

    a = prompt_of_length(LENGTH, offset=11)
    b = " ".join(a.split()[:SHARED] + prompt_of_length(LENGTH - SHARED, offset=500).split())
    return {"A": a, "B": b}


@pytest.fixture(scope="module")
def reference(v4_128_model, long_prompts) -> dict[str, dict]:
    from ascend_testkit.models.deepseek_v4_reference import float64_v4_outputs

    with one_thread():
        outs = float64_v4_outputs(v4_128_model, list(long_prompts.values()), MAX_TOKENS, LOGPROBS,
                                  storage="fp8_ds_mla")
    return dict(zip(long_prompts, outs, strict=True))


@pytest.fixture(scope="module")
def served(sim_v1_host, v4_128_model, long_prompts) -> dict:
    host, a, b = sim_v1_host, long_prompts["A"], long_prompts["B"]
    host.start(v4_128_model, **ENGINE)
    try:
        before = host.usage()[0]["counts"]
        first = host.generate([a], max_tokens=MAX_TOKENS, logprobs=LOGPROBS)["outputs"][0]
        usage = host.usage()[0]
        cached = host.generate([a, b], max_tokens=MAX_TOKENS, logprobs=LOGPROBS)["outputs"]
        cached_counts = host.usage()[0]["counts"]
        assert host.reset_prefix_cache()
        b_uncached = host.generate([b], max_tokens=MAX_TOKENS, logprobs=LOGPROBS)["outputs"][0]
    finally:
        host.stop()
    counts = {k: v - before.get(k, 0) for k, v in usage["counts"].items()}
    cached_counts = {k: v - usage["counts"].get(k, 0) for k, v in cached_counts.items()}
    return {"first": first, "A_cached": cached[0], "B_cached": cached[1], "B_uncached": b_uncached,
            "counts": counts, "cached_counts": cached_counts, "facts": usage["facts"]}


def test_tokenizer_gives_the_intended_lengths(v4_128_model, long_prompts):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(v4_128_model)
    a, b = (tok(long_prompts[k]).input_ids for k in "AB")
    assert len(a) == len(b) == LENGTH and a[:SHARED] == b[:SHARED] and a[SHARED] != b[SHARED]


def test_ratio_128_layer_serves_like_the_float64_reference(served, reference):
    assert served["facts"]["model_class"].endswith("AscendDeepseekV4ForCausalLM"), served["facts"]
    assert served["facts"]["kernel_checks"] is True, served["facts"]
    assert served["first"]["num_cached_tokens"] == 0
    check_logprobs_close([served["first"]], [reference["A"]], name_0="simulated lane", name_1="float64 (fp8_ds_mla)")
    counts = served["counts"]
    for ratio in (1, 4, 128):
        assert counts[f"attention.ascend_dsa.ratio{ratio}.tokens"] > 0, ratio


def test_ratio_128_entries_decide_the_first_token_distribution(v4_128_model, long_prompts, served, reference):
    """The engine's first-token log-probs follow the reference, and not the same reference with the ratio-128
    layer's compressed entries dropped (so a ratio-128 path attending to nothing, or to wrong rows, shows)."""
    import torch
    from transformers import AutoTokenizer

    from ascend_testkit.models.deepseek_v4_reference import load_float64_v4

    hf = load_float64_v4(v4_128_model, storage="fp8_ds_mla")
    heavy = [layer.self_attn.compressor for layer in hf.model.layers
             if type(getattr(layer.self_attn, "compressor", None)).__name__ == "DeepseekV4HCACompressor"]
    assert len(heavy) == 1
    heavy[0].compress_rate = 10**6  # no window ever completes: the layer attends to its sliding window only
    ids = AutoTokenizer.from_pretrained(v4_128_model)(long_prompts["A"], return_tensors="pt").input_ids
    with torch.no_grad(), one_thread():
        dropped = torch.log_softmax(hf(ids, use_cache=False).logits[0, -1], dim=-1)
    # Over the engine's top-5 (float32 with fp8 indexer scoring: within ~0.1 of the reference per token), the summed
    # distance to the reference is ~0.26, to the reference without the ratio-128 entries ~0.95.
    ours = served["first"]["logprobs"][0]
    full = reference["A"]["logprobs"][0]
    assert set(ours) == set(full)
    off_full = sum(abs(lp - full[t]) for t, lp in ours.items())
    off_dropped = sum(abs(lp - float(dropped[int(t)])) for t, lp in ours.items())
    assert off_full < 0.5 and 2 * off_full < off_dropped, (off_full, off_dropped)


def test_prefix_cache_hits_one_whole_v4_block_and_serves_the_same_tokens(served, reference):
    # A's 300 tokens fill one 256-token block: that block of every group (compressed rows, window pages, compressor
    # states) is what a later prompt can reuse; B shares 270 tokens, so the same block.
    assert served["A_cached"]["num_cached_tokens"] == V4_BLOCK
    assert served["B_cached"]["num_cached_tokens"] == V4_BLOCK
    assert served["B_uncached"]["num_cached_tokens"] == 0
    # Both prefills continued from the cached block (the attention read it as context).
    assert served["cached_counts"]["attention.ascend_dsa.context_prefills"] >= 2
    assert served["A_cached"]["token_ids"] == served["first"]["token_ids"]
    assert served["B_cached"]["token_ids"] == served["B_uncached"]["token_ids"]
    check_logprobs_close([served["A_cached"], served["B_cached"], served["B_uncached"]],
                         [reference["A"], reference["B"], reference["B"]],
                         name_0="simulated lane", name_1="float64 (fp8_ds_mla)")
