"""Disaggregated prefill of the MLA model across tensor-parallel sizes: a TP=2 prefill engine, a TP=1 decode engine.

Every TP rank of an MLA model holds the same latent KV, so the decode rank reads the latent pages from ONE prefill
rank (`p2p.rank_groups.plan_reads` picks it per transfer) and tells the other one to free its blocks at once. The
prefill's two workers run on cores 0 and 1 (gloo), the decode engine on core 1, inside the loopback-only namespace
with real Mooncake, like tests/mla/test_mla_pd.py.
"""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.mooncake]

BLOCK_SIZE = 16
PREFILL_PORT = 31900
DECODE_PORT = 32000
PREFILL_TP = 2
MAX_TOKENS = 8
# Far beyond the test's waits: a block freed by the abort timeout could not pass for a prompt release.
ABORT_TIMEOUT_S = 120.0
LENGTHS = (BLOCK_SIZE - 1, BLOCK_SIZE + 1, 3 * BLOCK_SIZE + 5, 5 * BLOCK_SIZE + 3)
ENGINE = dict(dtype="float32", enforce_eager=True, seed=0, max_model_len=256, max_num_seqs=4, block_size=BLOCK_SIZE,
              enable_prefix_caching=True)
STATS = "ascend_testkit.kv_probes:connector_stats"


def _kv_config(role: str, port: int) -> dict:
    return {"kv_connector": "AscendMooncakeConnector", "kv_role": role, "engine_id": f"mla-tp-{role}",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"side_channel_port": port, "abort_timeout_s": ABORT_TIMEOUT_S,
                                          "handshake_timeout_s": 5.0, "claim_wait_s": 5.0}}


@pytest.fixture(scope="module")
def tp_engines(host_pool, netns, netns_host, mla_model):
    from ascend_testkit.engine import default_runner

    runner = default_runner("simulated")
    prefill = host_pool.get(f"simulated-{runner}-cpu0|1-netns", lane="simulated", runner=runner, netns=netns,
                            cpus="0|1")
    decode = netns_host("simulated", 1)
    prefill.start(str(mla_model), wait=False, tensor_parallel_size=PREFILL_TP,
                  kv_transfer_config=_kv_config("kv_producer", PREFILL_PORT), **ENGINE)
    decode.start(str(mla_model), wait=False, kv_transfer_config=_kv_config("kv_consumer", DECODE_PORT), **ENGINE)
    hosts = (prefill, decode)
    for host in hosts:
        host.started()
    yield hosts
    for host in hosts:
        if host.alive:
            host.stop()


@pytest.fixture(scope="module")
def token_ids(mla_model):
    from transformers import AutoTokenizer

    from ascend_testkit.models.tiny_llama import prompt_of_length

    tok = AutoTokenizer.from_pretrained(str(mla_model))
    return {f"len{n}": tok(prompt_of_length(n, offset=7 * n))["input_ids"] for n in LENGTHS}


def _wait(check, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _delta(after: list[dict], before: list[dict], key: str) -> list[int]:
    return [a[key] - b[key] for a, b in zip(after, before, strict=True)]


def test_tp2_prefill_tp1_decode_moves_one_latent_copy(tp_engines, token_ids):
    from ascend_kv_transfer.p2p.rank_groups import plan_reads

    prefill, decode = tp_engines
    single = prefill.run_requests([{"id": f"single-{k}", "prompt_token_ids": ids, "max_tokens": MAX_TOKENS}
                                   for k, ids in token_ids.items()])
    prefill.call("reset_prefix_cache")
    free_before = prefill.call("free_blocks")
    ranks_before = prefill.rpc(STATS)
    assert len(ranks_before) == PREFILL_TP

    firsts = prefill.run_requests([{"id": f"p-{k}", "prompt_token_ids": ids, "max_tokens": 1,
                                    "kv_transfer_params": {"do_remote_decode": True, "transfer_id": f"mlatp-{k}"}}
                                   for k, ids in token_ids.items()])
    for first in firsts:
        assert first["kv_transfer_params"]["remote_tp_size"] == PREFILL_TP
    assert prefill.call("free_blocks") < free_before, "the prefill ranks hold the prompt blocks for the decode"
    decode_before = decode.call("stats")["worker"]
    outs = decode.run_requests([{"id": f"d-{k}", "prompt_token_ids": ids, "max_tokens": MAX_TOKENS,
                                 "kv_transfer_params": first["kv_transfer_params"]}
                                for (k, ids), first in zip(token_ids.items(), firsts, strict=True)])

    # Greedy output of the disaggregated pair equals the TP=2 engine's own.
    for (k, _), out, ref in zip(token_ids.items(), outs, single, strict=True):
        assert out["token_ids"] == ref["token_ids"], k

    # Exactly one copy of the latent came over: blocks x (block_size x latent bytes per token) x layers.
    layers = decode.rpc("ascend_testkit.kv_probes:layer_kv")[0]
    page_bytes = {name: BLOCK_SIZE * layer["bytes_per_token"] for name, layer in layers.items()}
    assert set(page_bytes.values()) == {BLOCK_SIZE * 576 * 4}, page_bytes  # (kv_lora_rank 512 + rope 64) float32
    stats = decode.call("stats")
    worker = stats["worker"]
    expected_total = 0
    for k, ids in token_ids.items():
        assert [v for r, v in stats["scheduler"]["loaded_tokens"].items() if r.startswith(f"d-{k}")] == [len(ids)]
        pulled = [v for r, v in worker["pulled"].items() if r.startswith(f"d-{k}")]
        assert len(pulled) == 1 and pulled[0]["ok"], pulled
        blocks = -(-len(ids) // BLOCK_SIZE)
        assert pulled[0]["blocks"] == blocks, pulled
        assert pulled[0]["nbytes"] == blocks * sum(page_bytes.values()), (k, pulled, page_bytes)
        expected_total += blocks * sum(page_bytes.values())
    assert worker["bytes_pulled"] - decode_before["bytes_pulled"] == expected_total
    assert worker["pulls_ok"] - decode_before["pulls_ok"] == len(token_ids)
    assert worker["pulls_failed"] == decode_before["pulls_failed"]

    # Each transfer was read from the rank the plan names; the other rank was told to free its blocks, at once.
    plans = {k: plan_reads(0, 1, PREFILL_TP, replicated=True, transfer_id=f"mlatp-{k}") for k in token_ids}
    read_from = [sum(p.source == rank for p in plans.values()) for rank in range(PREFILL_TP)]
    assert _wait(lambda: all(s["held_now"] == 0 for s in prefill.rpc(STATS)), 10.0), prefill.rpc(STATS)
    after = prefill.rpc(STATS)
    assert _delta(after, ranks_before, "released_done") == read_from, (after, read_from)
    assert _delta(after, ranks_before, "released_unread") == [len(token_ids) - n for n in read_from], after
    assert _delta(after, ranks_before, "released_expired") == [0] * PREFILL_TP, after
    assert _wait(lambda: prefill.call("free_blocks") == free_before, 10.0)
