"""Disaggregated prefill of DeepSeek V3.2 (sparse attention) over Mooncake: the decode engine gets both caches a
prompt left behind, the latent pages of the attention layers and the fp8 keys + scales of the indexer layers.

A prefill engine (kv_producer, core 0) and a decode engine (kv_consumer, core 1) serve the tiny V3.2 through
ASCEND_SFA in the simulated lane, inside the loopback-only namespace. Prompts run past index_topk (16), so what the
decode engine's indexer selects depends on the keys that came over: missing or misplaced indexer pages change the
selection, then the tokens.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.mooncake]

BLOCK_SIZE = 16
PREFILL_PORT = 32200
DECODE_PORT = 32500
MAX_TOKENS = 8
LENGTHS = (BLOCK_SIZE + 1, 3 * BLOCK_SIZE, 6 * BLOCK_SIZE + 5)
ENGINE = dict(dtype="float32", enforce_eager=True, seed=0, max_model_len=256, max_num_seqs=4, block_size=BLOCK_SIZE,
              enable_prefix_caching=True)


@pytest.fixture(scope="module")
def sfa_pd_engines(pd_pair, v32_model):
    with pd_pair(v32_model, "sfa", (PREFILL_PORT, DECODE_PORT), **ENGINE) as pair:
        yield pair


def test_disaggregated_sparse_output_equals_single_engine(sfa_pd_engines, prompt_token_ids, v32_model, disaggregate):
    prefill, decode = sfa_pd_engines
    prompts = prompt_token_ids(v32_model, LENGTHS, 7)
    single, outs, stats = disaggregate(prefill, decode, prompts, MAX_TOKENS, "sfa")
    for (k, ids), out, ref in zip(prompts.items(), outs, single, strict=True):
        assert out["token_ids"] == ref["token_ids"], k
        loaded = [v for r, v in stats["scheduler"]["loaded_tokens"].items() if r.startswith(f"d-{k}")]
        assert loaded == [len(ids)], (k, loaded)  # both caches came over Mooncake: nothing was recomputed
        pulled = [v for r, v in stats["worker"]["pulled"].items() if r.startswith(f"d-{k}")]
        assert len(pulled) == 1 and pulled[0]["ok"], pulled
    assert stats["worker"]["pulls_failed"] == 0
    for host in (prefill, decode):
        usage = host.usage()[0]
        assert usage["attention_impls"] == ["AscendSFAImpl"], usage["attention_impls"]
    counts = decode.usage()[0]["counts"]
    # The decode engine's indexer chose among more keys than it keeps, over the keys the connector moved.
    assert counts.get("attention.ascend_sfa.full_selections", 0) > 0
