"""The KV pool with an MLA model in the simulated-NPU lane: one object per block however many TP ranks hold it.

MLA's latent has no heads to split, so every TP rank of an engine caches the same bytes. A tensor-parallel engine
(TP=2, both cores) serving the tiny DeepSeek-V2 through ASCEND_MLA and our allocator puts each block into the pool
once (TP rank 0 puts, rank 1 leaves it to rank 0), under keys and a namespace without TP coordinates. A TP=1 engine
started afterwards finds every block of the prompt there, loads it into its own latent pages, and generates what the
TP=2 engine generated.
"""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.mooncake]

BLOCK = 16
MASTER_PORT = 27061  # below Linux's ephemeral range (32768-60999), where engines in the namespace take ports
MAX_TOKENS = 8
PROMPT_TOKENS = 5 * BLOCK + 3  # 5 full blocks go to the pool; the partial one does not
ENGINE = dict(dtype="float32", enforce_eager=True, seed=0, max_model_len=256, max_num_seqs=4, block_size=BLOCK,
              enable_prefix_caching=True)


def _pool(master: str) -> dict:
    return {"kv_connector": "AscendStoreConnector", "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"master_server_address": master, "global_segment_size": "64MiB"}}


def _rank_stats(host) -> list[dict]:
    return host.rpc("ascend_testkit.kv_probes:connector_stats")  # one dict of worker counters per rank


def _settled(host, timeout: float = 30.0) -> list[dict]:
    """Every rank's pool counters once no save is pending (bounded)."""
    deadline = time.monotonic() + timeout
    stats = _rank_stats(host)
    while any(s.get("pending_saves") or s.get("held_requests") for s in stats) and time.monotonic() < deadline:
        time.sleep(0.1)
        stats = _rank_stats(host)
    return stats


@pytest.fixture(scope="module")
def mla_dir(cache_root) -> str:
    from ascend_testkit.models.deepseek import cached_tiny_deepseek

    return str(cached_tiny_deepseek(cache_dir=cache_root / "models"))


@pytest.fixture(scope="module")
def prompt_ids(prompt_token_ids, mla_dir) -> list[int]:
    (ids,) = prompt_token_ids(mla_dir, [PROMPT_TOKENS], 0).values()
    assert len(ids) == PROMPT_TOKENS
    return ids


@pytest.fixture(scope="module")
def engines(start_master, netns_host, mla_dir):
    """The TP=2 engine (both cores) and the TP=1 engine (core 1) on one master, both alive: a Mooncake Store object
    lives in the memory segment an engine's client contributed, so the saving engine must outlive the loads."""
    master = start_master(MASTER_PORT)
    tp2, tp1 = netns_host("simulated", "0|1"), netns_host("simulated", 1)
    try:
        tp2.start(mla_dir, wait=False, tensor_parallel_size=2, kv_transfer_config=_pool(master.address), **ENGINE)
        tp1.start(mla_dir, wait=False, kv_transfer_config=_pool(master.address), **ENGINE)
        tp2.started()
        tp1.started()
        yield {"tp2": tp2, "tp1": tp1}
    finally:
        for host in (tp2, tp1):
            if host.alive and host.engine is not None:
                host.stop()
        master.close()


@pytest.fixture(scope="module")
def saved_by_tp2(engines, prompt_ids) -> dict:
    host = engines["tp2"]
    out = host.run_requests([{"id": "tp2", "prompt_token_ids": prompt_ids, "max_tokens": MAX_TOKENS}])[0]
    return {"out": out, "ranks": _settled(host), "usage": host.usage()}


def test_tp_ranks_put_one_object_per_block(saved_by_tp2):
    rank0, rank1 = saved_by_tp2["ranks"]
    assert rank0["objects_stored"] == 5 and rank0["put_failed_objects"] == 0 and rank0["save_errors"] == 0
    assert rank1["objects_stored"] == 0 and rank1["objects_skipped_present"] == 0
    assert rank1["saves_left_to_rank0"] >= 1 and rank0["saves_left_to_rank0"] == 0
    assert rank0["rank"] == rank1["rank"] == "tp0-1.pp0-1.pcp0-1.dcp0-1"  # the keys name no TP rank
    for usage in saved_by_tp2["usage"]:  # both ranks ran our MLA backend over our allocator's latent pages
        assert usage["attention_impls"] == ["AscendMLAImpl"], usage["attention_impls"]


def test_an_engine_of_another_tp_size_loads_them(saved_by_tp2, engines, prompt_ids):
    host = engines["tp1"]
    out = host.run_requests([{"id": "tp1", "prompt_token_ids": prompt_ids, "max_tokens": MAX_TOKENS}])[0]
    (worker,) = _settled(host)
    scheduler = host.stats()["scheduler"]
    assert scheduler["namespace"] == worker["namespace"] == saved_by_tp2["ranks"][0]["namespace"]
    assert out["token_ids"] == saved_by_tp2["out"]["token_ids"]
    assert out["num_cached_tokens"] == 5 * BLOCK
    assert [v for k, v in scheduler["per_request_hits"].items() if k.startswith("tp1")] == [5 * BLOCK]
    assert worker["blocks_loaded"] == 5 and worker["load_failed_blocks"] == 0
    assert worker["objects_skipped_present"] == 5  # its own saves found the TP=2 engine's objects
