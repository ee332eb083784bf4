"""The float64 DeepSeek V4.1 reference: its pieces agree with vLLM's own pure-torch / CPU functions, every weight of
the tiny checkpoint is used, and each V4.1 feature changes what it computes."""

from __future__ import annotations

import pytest
import torch

from ascend_testkit.compare import check_logprobs_close
from ascend_testkit.models.deepseek_v41 import cached_tiny_deepseek_v41
from ascend_testkit.models.deepseek_v41_reference import Options, V41Reference, float64_v41_outputs
from ascend_testkit.models.deepseek_v41_reference_attention import (
    candidate_mask,
    causal_entries,
    rope_angles,
    select,
)
from ascend_testkit.models.deepseek_v41_reference_engram import (
    bucket_primes,
    compressed_token_map,
    hash_multipliers,
    ngram_rows,
)
from ascend_testkit.models.word_tokenizer import prompt_of_length


@pytest.fixture(autouse=True)
def _one_thread():
    # two OpenMP threads spin under the shared machine's contention (see test_dsv4_long)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model_dir():
    return cached_tiny_deepseek_v41()


@pytest.fixture(scope="module")
def reference(model_dir):
    return V41Reference(model_dir)


@pytest.fixture(scope="module")
def vllm_config():
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):
        yield


def _ids(reference, n, offset=0):
    return reference.tokenizer(prompt_of_length(n, offset=offset)).input_ids


# ---- anchors against vLLM's own functions ----------------------------------------------------------------------


def test_mhc_matches_vllms_mhc_pre_delayed_torch_and_post(reference):
    from vllm.model_executor.kernels.mhc.torch import mhc_post_torch, mhc_pre_delayed_torch

    c, w = reference.config, reference.w
    hc, hidden = c["hc_mult"], c["hidden_size"]
    g = torch.Generator().manual_seed(1)
    residual = torch.randn(7, hc, hidden, generator=g, dtype=torch.float64)
    pre_prev = torch.rand(7, hc, generator=g, dtype=torch.float64)
    post, comb, pre = reference._mhc_coefficients(residual, 3, "ffn")
    p = "layers.3.hc_ffn_"
    v_post, v_comb, v_input, v_pre = mhc_pre_delayed_torch(
        residual.float(), w[p + "fn"].float(), w[p + "scale"].float(), w[p + "base"].float(), c["rms_norm_eps"],
        c["hc_eps"], c["hc_eps"], 2.0, c["hc_sinkhorn_iters"], pre_mix=pre_prev.float())
    torch.testing.assert_close(post, v_post.squeeze(-1).double(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(comb, v_comb.double(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pre, v_pre.double(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close((pre_prev.unsqueeze(-1) * residual).sum(1), v_input.double(), rtol=1e-5, atol=1e-5)
    out = torch.randn(7, hidden, generator=g, dtype=torch.float64)
    torch.testing.assert_close(reference._mhc_post(out, residual, post, comb),
                               mhc_post_torch(out.float(), residual.float(), v_post, v_comb).double(),
                               rtol=1e-5, atol=1e-4)


def test_first_layer_mhc_equals_vllms_broadcast_embedding_path(reference):
    """vLLM's first layer mixes the raw embedding with hc_attn_fn summed over the copy blocks
    (finalize_mhc_broadcast_weights) and feeds the embedding itself to attention: the reference's broadcast
    residual gives the same coefficients."""
    from vllm.model_executor.kernels.mhc.torch import mhc_pre_delayed_torch

    c, w = reference.config, reference.w
    hc, hidden = c["hc_mult"], c["hidden_size"]
    emb = w["embed.weight"][torch.tensor(_ids(reference, 6))]
    post, comb, pre = reference._mhc_coefficients(emb.unsqueeze(1).expand(-1, hc, -1), 0, "attn")
    broadcast = w["layers.0.hc_attn_fn"].view(-1, hc, hidden).sum(1)
    v_post, v_comb, v_input, v_pre = mhc_pre_delayed_torch(
        emb.float().unsqueeze(1).expand(-1, hc, -1), broadcast.float(), w["layers.0.hc_attn_scale"].float(),
        w["layers.0.hc_attn_base"].float(), c["rms_norm_eps"], c["hc_eps"], c["hc_eps"], 2.0,
        c["hc_sinkhorn_iters"], x=emb.float())
    torch.testing.assert_close(pre, v_pre.double(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(post, v_post.squeeze(-1).double(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(comb, v_comb.double(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v_input.double(), emb.float().double())  # pre_mix None: copy 0, the embedding


@pytest.mark.parametrize("ratio", [0, 1, 2])
def test_rope_matches_vllms_deepseek_v4_rope(model_dir, reference, vllm_config, ratio):
    from vllm.models.deepseek_v41.common.rope import build_deepseek_v4_rope
    from vllm.transformers_utils.config import get_config

    rope = build_deepseek_v4_rope(get_config(str(model_dir), trust_remote_code=False), head_dim=512,
                                  rope_head_dim=64, max_position_embeddings=2048, compress_ratio=ratio)
    assert rope.is_neox_style is False  # GPT-J pairs, as the reference rotates
    theta = reference.config["compress_rope_theta"] if ratio else reference.config["rope_theta"]
    cos, sin = rope_angles(torch.arange(256), theta)
    torch.testing.assert_close(rope.cos_sin_cache[:256, :32].double(), cos, rtol=0, atol=2e-5)
    torch.testing.assert_close(rope.cos_sin_cache[:256, 32:].double(), sin, rtol=0, atol=2e-5)


def test_engram_token_map_multipliers_and_buckets_match_vllms(model_dir, reference):
    from vllm.models.deepseek_v41.common.engram import (
        EngramLayout,
        build_compressed_token_map,
        compute_hash_multipliers,
    )
    from vllm.transformers_utils.config import get_config

    config = get_config(str(model_dir), trust_remote_code=False)
    assert compressed_token_map(reference.tokenizer) == build_compressed_token_map(reference.tokenizer)
    layout = EngramLayout.from_config(config)
    size = config.engram_compressed_vocab_size
    assert torch.equal(torch.tensor(hash_multipliers(layout.layer_ids, layout.max_ngram_size, size)),
                       compute_hash_multipliers(layout.layer_ids, layout.max_ngram_size, size))
    primes = bucket_primes(len(layout.layer_ids), layout.max_ngram_size, layout.n_heads, config.engram_vocab_size)
    assert [[tuple(p) for p in layer] for layer in primes] == [list(layer) for layer in layout.primes]


def test_engram_token_map_normalizes_like_vllm_on_a_mixed_vocabulary():
    """The word tokenizer maps every token apart; a vocabulary with case, accents and spaces exercises the
    normalization (vLLM's `build_compressed_token_map` is the spec)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from vllm.models.deepseek_v41.common.engram import build_compressed_token_map

    words = ["<unk>", "The", "the", "THE", "Thé", "ﬁne", "fine", " ", "\t", "a  b", "Ünïcode", "unicode"]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    ours = compressed_token_map(fast)
    assert ours == build_compressed_token_map(fast)
    assert ours[1] < len(words)  # something collapsed


def test_moe_matches_transformers_deepseek_v4_moe_block(reference):
    """V4.1's MoE is V4's without hash layers: transformers' V4 sparse MoE block in float64 with the same weights
    (vLLM's CPU router kernel, biased_topk_cpu, exists only in the AVX512 build, not on this machine)."""
    from transformers import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4SparseMoeBlock

    c, w = reference.config, reference.w
    config = DeepseekV4Config(
        hidden_size=c["hidden_size"], moe_intermediate_size=c["moe_intermediate_size"],
        n_routed_experts=c["n_routed_experts"], num_experts_per_tok=c["num_experts_per_tok"],
        n_shared_experts=c["n_shared_experts"], routed_scaling_factor=c["routed_scaling_factor"],
        swiglu_limit=c["swiglu_limit"], num_hidden_layers=1, compress_ratios=[0], num_hash_layers=0)
    block = DeepseekV4SparseMoeBlock(config, 0).double()
    p = "layers.1.ffn."
    with torch.no_grad():
        block.gate.weight.copy_(w[p + "gate.weight"])
        block.gate.e_score_correction_bias.copy_(w[p + "gate.bias"])
        n = c["n_routed_experts"]
        block.experts.gate_up_proj.copy_(torch.stack(
            [torch.cat((w[f"{p}experts.{e}.w1.weight"], w[f"{p}experts.{e}.w3.weight"])) for e in range(n)]))
        block.experts.down_proj.copy_(torch.stack([w[f"{p}experts.{e}.w2.weight"] for e in range(n)]))
        block.shared_experts.gate_proj.weight.copy_(w[p + "shared_experts.w1.weight"])
        block.shared_experts.up_proj.weight.copy_(w[p + "shared_experts.w3.weight"])
        block.shared_experts.down_proj.weight.copy_(w[p + "shared_experts.w2.weight"])
        x = torch.randn(11, c["hidden_size"], generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        torch.testing.assert_close(reference._moe(x, 1), block(x.unsqueeze(0)).squeeze(0))


# ---- the reference's own rules, by hand ---------------------------------------------------------------------------


def test_candidate_blocks_keep_the_best_blocks_and_always_the_newest():
    inf = float("inf")
    # one row, 10 closed entries in blocks of 4: [0..3] max 5, [4..7] max 9, [8, 9] (newest) max 0
    logits = torch.tensor([[1.0, 5, 2, 0, 9, 1, 1, 1, 0, -1, -inf, -inf]], dtype=torch.float64)
    kept = candidate_mask(logits, block_size=4, topk_blocks=2)
    assert kept[0].tolist() == [False] * 4 + [True] * 4 + [True, True, False, False]
    kept = candidate_mask(logits, block_size=4, topk_blocks=5)  # more blocks than exist: every closed block
    assert kept[0, :10].all() and not kept[0, 10:].any()


def test_selection_takes_every_causal_entry_until_more_than_topk():
    causal = causal_entries(6, 6, 1)
    logits = torch.arange(36, dtype=torch.float64).view(6, 6).masked_fill(~causal, float("-inf"))
    chosen = select(logits, causal, topk=3)
    assert chosen[2].tolist() == [True, True, True, False, False, False]
    assert chosen[5].tolist() == [False, False, False, True, True, True]  # the three best of six
    assert causal_entries(5, 2, 2).sum(-1).tolist() == [0, 1, 1, 2, 2]  # ratio 2: entry i closes at 2i + 1


def test_ngram_rows_share_the_bigram_of_equal_endings_and_stay_in_their_buckets(reference):
    primes = reference.primes[0]
    flat = [p for per in primes for p in per]
    offsets = [sum(flat[:i]) for i in range(len(flat))]
    rows = ngram_rows([5, 7, 9, 3, 7, 9], 0, reference.multipliers[0], primes)
    heads = len(primes[0])
    assert rows[2][:heads] == rows[5][:heads]  # "7 9" ends both
    assert rows[2][heads:] != rows[5][heads:]  # "5 7 9" vs "3 7 9"
    for row in rows:
        for col, r in enumerate(row):
            assert offsets[col] <= r < offsets[col] + flat[col]
    first = ngram_rows([5], 0, reference.multipliers[0], primes)[0]
    assert first != ngram_rows([6], 0, reference.multipliers[0], primes)[0]


# ---- the checkpoint in the reference -------------------------------------------------------------------------------


class _Recording(dict):
    def __init__(self, *args):
        super().__init__(*args)
        self.read: set[str] = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


def test_a_long_prompt_reads_every_non_expert_weight_of_the_checkpoint(model_dir):
    ref = V41Reference(model_dir)
    ref.w = _Recording(ref.w)
    with torch.no_grad():
        logits = ref.forward(_ids(ref, 40))
    assert torch.isfinite(logits).all()
    unread = {k for k in ref.w if k not in ref.w.read and ".experts." not in k}
    assert not unread, unread


@pytest.mark.parametrize("knockout", [{"engram": False}, {"candidates": False}, {"delayed_mhc": False},
                                      {"index_topk": 10**6}])
def test_each_feature_changes_a_long_prompts_output(model_dir, reference, knockout):
    ids = _ids(reference, 65, offset=65)
    with torch.no_grad():
        base = torch.log_softmax(reference.forward(ids), -1)
        other = torch.log_softmax(V41Reference(model_dir, Options(**knockout)).forward(ids), -1)
    assert (base - other).abs().max() > 1e-2
    assert (base.argmax(-1) != other.argmax(-1)).any()


def test_the_attention_sink_matters(model_dir, reference):
    ids = _ids(reference, 20, offset=3)
    sinkless = V41Reference(model_dir)
    for key in [k for k in sinkless.w if k.endswith("attn_sink")]:
        sinkless.w[key] = torch.full_like(sinkless.w[key], float("-inf"))
    with torch.no_grad():
        assert (reference.forward(ids) - sinkless.forward(ids)).abs().max() > 1e-2


def test_sparse_equals_dense_while_every_row_fits_index_topk(model_dir):
    """A 3-token prompt and 5 greedy tokens keep every query at <= 8 compressed entries: dense attention is the
    same computation; the same checkpoint with a 40-token prompt is not."""
    prompts = [prompt_of_length(3, offset=11)]
    sparse = float64_v41_outputs(model_dir, prompts, 5, 5)
    dense = float64_v41_outputs(model_dir, prompts, 5, 5, index_topk=10**6)
    assert sparse == dense


def test_rounding_defaults_to_vllms_and_each_part_can_be_turned_off(model_dir, reference):
    ids = _ids(reference, 40, offset=40)
    with torch.no_grad():
        rounded = reference.forward(ids)
        exact = V41Reference(model_dir, Options(rounding="none")).forward(ids)
        index_exact = V41Reference(model_dir, Options(index_fp8=False)).forward(ids)
        latent_exact = V41Reference(model_dir, Options(latent_bf16=False)).forward(ids)
    assert (rounded - exact).abs().max() > 0
    # the latent feeds every compressed row: from the first closed entry on
    assert (rounded[:4] - latent_exact[:4]).abs().max() > 0
    # the fp8 indexer only decides the selection, which takes every entry while a row has <= index_topk (8)
    torch.testing.assert_close(rounded[:8], index_exact[:8], rtol=1e-9, atol=1e-9)  # BLAS order only
    assert (rounded[8:] - index_exact[8:]).abs().max() > 1e-3


def test_a_float32_run_follows_the_float64_reference(model_dir):
    """The checkpoint is tame enough for an engine computing in float32: the same math in float32 passes vLLM's
    check_logprobs_close against float64 on 5-65-token prompts for 8 greedy tokens."""
    prompts = [prompt_of_length(n, offset=n) for n in (5, 17, 40, 65)]
    check_logprobs_close(float64_v41_outputs(model_dir, prompts, 8, 5, dtype="float32"),
                         float64_v41_outputs(model_dir, prompts, 8, 5), name_0="float32", name_1="float64")
