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


def _kv_config(role: str, port: int) -> dict:
    return {"kv_connector": "AscendMooncakeConnector", "kv_role": role, "engine_id": f"mla-{role}",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"side_channel_port": port, "abort_timeout_s": 30.0,
                                          "handshake_timeout_s": 5.0, "claim_wait_s": 5.0}}


@pytest.fixture(scope="module")
def pd_engines(netns_host, mla_model):
    hosts = []
    for role, port, cpu in (("kv_producer", PREFILL_PORT, 0), ("kv_consumer", DECODE_PORT, 1)):
        host = netns_host("simulated", cpu)
        host.start(str(mla_model), wait=False, kv_transfer_config=_kv_config(role, port), **ENGINE)
        hosts.append(host)
    for host in hosts:
        host.started()
    yield hosts
    for host in hosts:
        if host.alive:
            host.stop()


@pytest.fixture(scope="module")
def mla_token_ids(mla_model):
    from transformers import AutoTokenizer

    from ascend_testkit.models.tiny_llama import prompt_of_length

    tok = AutoTokenizer.from_pretrained(str(mla_model))
    return {f"len{n}": tok(prompt_of_length(n, offset=5 * n))["input_ids"] for n in LENGTHS}


def test_disaggregated_mla_output_equals_single_engine(pd_engines, mla_token_ids):
    prefill, decode = pd_engines
    prompts = mla_token_ids
    single = prefill.run_requests([{"id": f"single-{k}", "prompt_token_ids": ids, "max_tokens": MAX_TOKENS}
                                   for k, ids in prompts.items()])
    prefill.call("reset_prefix_cache")
    firsts = prefill.run_requests([{"id": f"p-{k}", "prompt_token_ids": ids, "max_tokens": 1,
                                    "kv_transfer_params": {"do_remote_decode": True, "transfer_id": f"mla-{k}"}}
                                   for k, ids in prompts.items()])
    outs = decode.run_requests([{"id": f"d-{k}", "prompt_token_ids": ids, "max_tokens": MAX_TOKENS,
                                 "kv_transfer_params": first["kv_transfer_params"]}
                                for (k, ids), first in zip(prompts.items(), firsts, strict=True)])
    stats = decode.call("stats")
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
