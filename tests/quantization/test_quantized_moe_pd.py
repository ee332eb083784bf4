"""Disaggregated prefill of the quantized DeepSeek (MLA, W8A8_DYNAMIC dense layers, W4A8_DYNAMIC experts) over
Mooncake: a prefill engine (kv_producer, core 0) and a decode engine (kv_consumer, core 1) in the simulated lane,
inside the loopback-only namespace, joined by the AscendMooncakeConnector; the decode engine's answers equal the
prefill engine's own (one engine), with every prompt's latent KV pulled rather than recomputed.

Prompts sit around the 128-token block edge (block_size left to the Ascend policy: 128). The engines are the
session's namespace hosts, joined and driven as the MLA suite's PD engines are (`pd_pair`, `disaggregate`:
tests/conftest.py).
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.mooncake]

BLOCK_SIZE = 128
PREFILL_PORT, DECODE_PORT = 34100, 34200  # side channels, not used by another suite
MAX_TOKENS = 8
LENGTHS = (5, BLOCK_SIZE - 1, BLOCK_SIZE, BLOCK_SIZE + 3)
# float32 (the reference kernels write it; torch_npu's quant matmuls would not): the decode engine computes the
# prompt's last token again, through MLA's weight-absorbed decode path where one engine ran it through the prefill
# path; in bfloat16 the two round one ulp apart, which decides a bfloat16 logit tie (seen: 127-token prompt, token 6).
ENGINE = dict(dtype="float32", enforce_eager=True, seed=0, max_model_len=256, max_num_seqs=4,
              enable_prefix_caching=True, additional_config={"kernel_checks": True})


LOGPROBS = {"logprobs": 5}


def _at_first_difference(out: dict, ref: dict) -> dict:
    """Both sides' top-5 where the tokens first differ (what a mismatch report needs)."""
    pos = next(i for i, (a, b) in enumerate(zip(out["token_ids"], ref["token_ids"], strict=False)) if a != b)
    return {"position": pos, "disaggregated": out["logprobs"][pos], "one engine": ref["logprobs"][pos]}


@pytest.fixture(scope="module")
def quantized_deepseek(cache_root) -> str:
    from ascend_testkit.models.quantized_moe import QuantizedMoeSpec, cached_quantized_moe

    return str(cached_quantized_moe(QuantizedMoeSpec(family="deepseek", experts="W4A8_DYNAMIC"), cache_root / "models"))


@pytest.fixture(scope="module")
def pd_engines(pd_pair, quantized_deepseek):
    with pd_pair(quantized_deepseek, "quant-moe", (PREFILL_PORT, DECODE_PORT), **ENGINE) as hosts:
        yield hosts


def test_disaggregated_quantized_deepseek_equals_one_engine(pd_engines, disaggregate, prompt_token_ids,
                                                             quantized_deepseek):
    prefill, decode = pd_engines
    for host in pd_engines:
        assert [g["block_size"] for g in host.rpc("ascend_testkit.kv_probes:kv_groups")[0]] == [BLOCK_SIZE]
    prompts = prompt_token_ids(quantized_deepseek, LENGTHS, 5)
    # One engine: the prefill engine on its own; its prefix cache is then reset, so the remote prefills compute the
    # prompts again.
    single, outs, stats = disaggregate(prefill, decode, prompts, MAX_TOKENS, "qmoe", sampling=LOGPROBS)
    for (k, ids), out, ref in zip(prompts.items(), outs, single, strict=True):
        assert out["token_ids"] == ref["token_ids"], (k, _at_first_difference(out, ref))
        loaded = [v for r, v in stats["scheduler"]["loaded_tokens"].items() if r.startswith(f"d-{k}")]
        assert loaded == [len(ids)], (k, loaded)  # the whole prompt's latent came over Mooncake, not recomputed
        pulled = [v for r, v in stats["worker"]["pulled"].items() if r.startswith(f"d-{k}")]
        assert len(pulled) == 1 and pulled[0]["ok"] and pulled[0]["blocks"] == -(-len(ids) // BLOCK_SIZE), pulled
    assert stats["worker"]["pulls_failed"] == 0
    # Both engines ran the quantized experts and linears; the decode engine attended over the pulled latent.
    prefilled = prefill.usage()[0]["counts"]
    for op in ("kernels.fused_moe_quant", "kernels.quant_matmul"):
        assert prefilled.get(op, 0) > 0, (op, prefilled)
    decode_usage = decode.usage()[0]
    assert decode_usage["attention_impls"] == ["AscendMLAImpl"], decode_usage["attention_impls"]
    assert decode_usage["counts"].get("kernels.mla_decode_attention", 0) > 0
    assert decode_usage["counts"].get("kernels.fused_moe_quant", 0) > 0
