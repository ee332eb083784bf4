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


def _kv_config(role: str, port: int) -> dict:
    return {"kv_connector": "AscendMooncakeConnector", "kv_role": role, "engine_id": f"sfa-{role}",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"side_channel_port": port, "abort_timeout_s": 30.0,
                                          "handshake_timeout_s": 5.0, "claim_wait_s": 5.0}}


@pytest.fixture(scope="module")
def sfa_pd_engines(netns_host, v32_model):
    hosts = []
    try:
        for role, port, cpu in (("kv_producer", PREFILL_PORT, 0), ("kv_consumer", DECODE_PORT, 1)):
            host = netns_host("simulated", cpu)
            host.start(str(v32_model), wait=False, kv_transfer_config=_kv_config(role, port), **ENGINE)
            hosts.append(host)
        for host in hosts:
            host.started()
        yield hosts
    finally:
        for host in hosts:
            if host.alive:
                host.stop()


@pytest.fixture(scope="module")
def v32_token_ids(v32_model):
    from transformers import AutoTokenizer

    from ascend_testkit.models.tiny_llama import prompt_of_length

    tok = AutoTokenizer.from_pretrained(str(v32_model))
    return {f"len{n}": tok(prompt_of_length(n, offset=7 * n))["input_ids"] for n in LENGTHS}


def test_disaggregated_sparse_output_equals_single_engine(sfa_pd_engines, v32_token_ids):
    prefill, decode = sfa_pd_engines
    prompts = v32_token_ids
    single = prefill.run_requests([{"id": f"single-{k}", "prompt_token_ids": ids, "max_tokens": MAX_TOKENS}
                                   for k, ids in prompts.items()])
    prefill.call("reset_prefix_cache")
    firsts = prefill.run_requests([{"id": f"p-{k}", "prompt_token_ids": ids, "max_tokens": 1,
                                    "kv_transfer_params": {"do_remote_decode": True, "transfer_id": f"sfa-{k}"}}
                                   for k, ids in prompts.items()])
    outs = decode.run_requests([{"id": f"d-{k}", "prompt_token_ids": ids, "max_tokens": MAX_TOKENS,
                                 "kv_transfer_params": first["kv_transfer_params"]}
                                for (k, ids), first in zip(prompts.items(), firsts, strict=True)])
    stats = decode.call("stats")
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
