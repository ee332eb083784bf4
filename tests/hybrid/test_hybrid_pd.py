"""Disaggregated prefill of a gated delta-net hybrid (tiny Qwen3-Next) over AscendMooncakeConnector, on either model
runner (both engines on MRV2, then both on V1): the decode engine continues from the GDN layers' conv and recurrent
states and the full-attention KV the prefill engine left behind, and generates what a single engine generates.

The tiny hybrid (`ascend_testkit.models.hybrid`: GDN layers 0 and 2, full attention 1 and 3, bf16 as vLLM CPU's GDN
layer takes it) has two KV cache groups of one page size in one backing: a `MambaSpec` group (one state per request:
conv `[dim, kernel - 1]` bf16 and recurrent `[v_heads, v_dim, k_dim]` float32) and a `FullAttentionSpec` group
(128-token blocks). vLLM's decode recomputes a fully loaded prompt's last token, which a recurrent state must not see
twice, so with state groups the connector has the prefill compute the prompt without its last token and the decode
load that much and compute the last one (as upstream's Mooncake connector does). The prompts sit inside the first
block, just past its edge (130) and well into the second (200).

The bytes each layer moved are held against the model's geometry (one state per GDN layer, the prompt's blocks per
attention layer), and each kind is shown to matter: with the decode's pulls leaving it behind
(`ascend_testkit.kv_transfer_faults`) the decode's output changes.
"""

from __future__ import annotations

import pytest

from ascend_testkit.models.hybrid import TinyHybridSpec

pytestmark = [pytest.mark.engine, pytest.mark.mooncake]

PREFILL_PORT = 26500
DECODE_PORT = 26550
MAX_TOKENS = 6
LENGTHS = (30, 130, 200)
KNOCKOUT_LENGTHS = LENGTHS[:2]
ENGINE = {"dtype": "bfloat16", "max_model_len": 512, "enforce_eager": True, "max_num_seqs": 4, "seed": 0}
# Our attention layers move as K and V planes (regions `layer#k`, `layer#v`), the GDN layers as their raw state pages.
KINDS = {"GDN state": r"model\.layers\.\d+\.linear_attn",
         "full-attention KV": r"model\.layers\.\d+\.self_attn\.attn(#\w+)?"}


@pytest.fixture(scope="module")
def hybrid_model(cache_root):
    from ascend_testkit.models.hybrid import cached_tiny_qwen3_next

    return cached_tiny_qwen3_next(cache_dir=cache_root / "models")


# Both engines on one model runner: the simulated lane's default (Model Runner V2), then V1; each pair on side-channel
# ports of its own (a pair's ports are never the previous pair's, whatever their release takes).
RUNNERS = {"mrv2": (None, (PREFILL_PORT, DECODE_PORT)), "v1": ("v1", (PREFILL_PORT + 300, DECODE_PORT + 300))}


@pytest.fixture(scope="module", params=list(RUNNERS))
def hybrid_pd_engines(request, pd_pair, hybrid_model):
    runner, ports = RUNNERS[request.param]
    with pd_pair(hybrid_model, f"hybrid-{request.param}", ports, runner=runner, **ENGINE) as pair:
        yield pair


def prompts_of(model, lengths, stride: int) -> dict[str, list[int]]:
    from transformers import AutoTokenizer

    from ascend_testkit.models.word_tokenizer import prompt_of_length

    tok = AutoTokenizer.from_pretrained(str(model))
    return {f"len{n}": tok(prompt_of_length(n, offset=stride * n))["input_ids"] for n in lengths}


def pulled_for(stats: dict, transfer_id: str) -> dict:
    (pulled,) = [v for v in stats["worker"]["pulled"].values() if v["transfer_id"] == transfer_id]
    return pulled


def drift(outs: list[dict], single: list[dict]) -> list[float | str]:
    """Per prompt: "tokens" if the decode's tokens differ from the single engine's, else the largest difference of
    the chosen tokens' logprobs."""
    out: list[float | str] = []
    for o, r in zip(outs, single, strict=True):
        if o["token_ids"] != r["token_ids"]:
            out.append("tokens")
        else:
            out.append(max(abs(a[str(t)] - b[str(t)])
                           for t, a, b in zip(o["token_ids"], o["logprobs"], r["logprobs"], strict=True)))
    return out


@pytest.fixture(scope="module")
def hybrid_pd_run(hybrid_pd_engines, hybrid_model, disaggregate):
    prefill, decode = hybrid_pd_engines
    prompts = prompts_of(hybrid_model, LENGTHS, 7)
    single, outs, stats = disaggregate(prefill, decode, prompts, MAX_TOKENS, "hybrid", sampling={"logprobs": 5})
    groups = decode.rpc("ascend_testkit.kv_probes:kv_groups")[0]
    return {"prompts": prompts, "single": single, "outs": outs, "stats": stats, "groups": groups}


@pytest.fixture(scope="module")
def hybrid_knockouts(hybrid_pd_engines, hybrid_model, disaggregate):
    """Per cache kind: disaggregated runs (fresh prompts) whose pulls leave that kind's layers behind."""
    prefill, decode = hybrid_pd_engines
    out = {}
    try:
        for stride, (kind, pattern) in enumerate(KINDS.items(), start=11):
            hit = decode.rpc("ascend_testkit.kv_transfer_faults:skip_layers_in_pulls", [pattern])[0]
            prompts = prompts_of(hybrid_model, KNOCKOUT_LENGTHS, stride)
            single, outs, stats = disaggregate(prefill, decode, prompts, MAX_TOKENS, f"hybrid-ko{stride}",
                                               sampling={"logprobs": 1})
            out[kind] = {"layers": hit, "tag": f"hybrid-ko{stride}", "prompts": prompts, "single": single,
                         "outs": outs, "stats": stats}
    finally:
        decode.rpc("ascend_testkit.kv_transfer_faults:skip_layers_in_pulls", [])
    return out


def test_disaggregated_hybrid_output_equals_single_engine(hybrid_pd_run):
    """The decode's tokens are the single engine's by vLLM's rule (`check_logprobs_close`: the same, or at the first
    divergence each in the other's top 5). Not token for token: the two compute the prompt's last token by different
    bf16 kernels (the single engine inside its chunked GDN prefill, the decode by the recurrent step), and this model
    amplifies rounding: the chosen tokens' logprobs of the two runs differed by 0.05-0.27 nats with either of the
    reference's two attention formulations, each within bf16 rounding of a float64 attention."""
    from ascend_testkit.compare import check_logprobs_close

    run = hybrid_pd_run
    stats = run["stats"]
    for (k, ids), ref in zip(run["prompts"].items(), run["single"], strict=True):
        assert len(ids) == int(k.removeprefix("len"))
        assert len(ref["token_ids"]) == MAX_TOKENS
        loaded = [v for r, v in stats["scheduler"]["loaded_tokens"].items() if r.startswith(f"d-{k}-")]
        # All but the last prompt token came over Mooncake; the decode computed only that one.
        assert loaded == [len(ids) - 1], (k, loaded)
        assert pulled_for(stats, f"hybrid-{k}")["ok"]
    assert stats["worker"]["pulls_failed"] == 0
    print("logprob drift of the decode against the single engine:", drift(run["outs"], run["single"]))
    check_logprobs_close(run["outs"], run["single"], name_0="disaggregated", name_1="single engine")


def test_each_layer_moved_its_state_or_its_prompt_blocks(hybrid_pd_run):
    run = hybrid_pd_run
    groups = {g["spec"]: g for g in run["groups"]}
    assert set(groups) == {"MambaSpec", "FullAttentionSpec"} and all(g["enable_kv_transfer"] for g in run["groups"])
    spec = TinyHybridSpec()
    conv_dim = 2 * spec.linear_num_key_heads * spec.linear_key_head_dim \
        + spec.linear_num_value_heads * spec.linear_value_head_dim
    # The recurrent state's dtype is vLLM's choice: "auto" keeps the model's bf16, and vLLM CPU's config hook (which
    # the simulated platform runs) makes it float32 on hosts with AVX512-BF16 (its accelerated GDN backend's).
    conv_dtype, recurrent_dtype = groups["MambaSpec"]["state_dtypes"]
    assert conv_dtype == "bfloat16" and recurrent_dtype in ("bfloat16", "float32"), groups["MambaSpec"]
    state = conv_dim * (spec.linear_conv_kernel_dim - 1) * 2 \
        + spec.linear_num_value_heads * spec.linear_value_head_dim * spec.linear_key_head_dim \
        * (4 if recurrent_dtype == "float32" else 2)
    block = groups["FullAttentionSpec"]["block_size"]
    attention_page = block * 2 * spec.num_kv_heads * spec.head_dim * 2  # K and V, bf16
    for k, ids in run["prompts"].items():
        pulled = pulled_for(run["stats"], f"hybrid-{k}")
        blocks = -(-(len(ids) - 1) // block)  # the loaded tokens' blocks
        expected = {name: state for name in groups["MambaSpec"]["layers"]}
        expected |= {name: blocks * attention_page for name in groups["FullAttentionSpec"]["layers"]}
        assert pulled["layer_bytes"] == expected, k
        assert pulled["nbytes"] == sum(expected.values())
    print("bytes per layer", {k: pulled_for(run["stats"], f"hybrid-{k}")["layer_bytes"] for k in run["prompts"]})


def test_each_cache_kind_left_behind_changes_the_decode(hybrid_knockouts):
    changed = {}
    for kind, run in hybrid_knockouts.items():
        assert len(run["layers"]) == 2, run["layers"]  # two GDN layers, two attention layers
        for k in run["prompts"]:
            pulled = pulled_for(run["stats"], f"{run['tag']}-{k}")
            assert pulled["ok"] and not set(run["layers"]) & set(pulled["layer_bytes"]), pulled
        changed[kind] = drift(run["outs"], run["single"])
    print("drift with the kind left behind:", changed)
    # Without either kind the decode's greedy tokens change (not just its logprobs).
    assert all("tokens" in drifts for drifts in changed.values()), changed
