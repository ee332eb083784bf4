"""Disaggregated prefill of the MLA model over Mooncake: the latent KV moves between two simulated-lane engines.

A prefill engine (kv_producer, core 0) and a decode engine (kv_consumer, core 1) run ASCEND_MLA inside the loopback-only
network namespace; the AscendMooncakeConnector moves each layer's latent pages (latent + rope per token, no V).
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.mooncake]

BLOCK_SIZE = 16
PREFILL_PORT = 31700
DECODE_PORT = 31800
MAX_TOKENS = 8
LENGTHS = (BLOCK_SIZE - 1, BLOCK_SIZE, BLOCK_SIZE + 1, 5 * BLOCK_SIZE + 3)
ENGINE = dict(dtype="float32", enforce_eager=True, seed=0, max_model_len=256, max_num_seqs=4, block_size=BLOCK_SIZE,
              enable_prefix_caching=True)


@pytest.fixture(scope="module")
def pd_engines(pd_pair, mla_model):
    with pd_pair(mla_model, "mla", (PREFILL_PORT, DECODE_PORT), **ENGINE) as pair:
        yield pair


def test_disaggregated_mla_output_equals_single_engine(pd_engines, prompt_token_ids, mla_model, disaggregate):
    prefill, decode = pd_engines
    prompts = prompt_token_ids(mla_model, LENGTHS, 5)
    single, outs, stats = disaggregate(prefill, decode, prompts, MAX_TOKENS, "mla")
    for (k, ids), out, ref in zip(prompts.items(), outs, single, strict=True):
        assert out["token_ids"] == ref["token_ids"], k
        loaded = [v for r, v in stats["scheduler"]["loaded_tokens"].items() if r.startswith(f"d-{k}")]
        assert loaded == [len(ids)], (k, loaded)  # the whole prompt's latent came over Mooncake, not recomputed
        pulled = [v for r, v in stats["worker"]["pulled"].items() if r.startswith(f"d-{k}")]
        assert len(pulled) == 1 and pulled[0]["ok"] and pulled[0]["blocks"] == -(-len(ids) // BLOCK_SIZE), pulled
    assert stats["worker"]["pulls_failed"] == 0
    # Both sides attended with our MLA backend over the latent pages the connector moved.
    for host in (prefill, decode):
        usage = host.usage()[0]
        assert usage["attention_impls"] == ["AscendMLAImpl"], usage["attention_impls"]
    assert decode.usage()[0]["counts"].get("kernels.mla_decode_attention", 0) > 0
