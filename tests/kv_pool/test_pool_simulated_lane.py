"""The KV pool on the simulated-NPU lane's own KV layout: our platform, allocator and attention on both engines.

test_pool_engines.py runs the pool's faults and its pairing with P2P on vLLM's CPU platform (the connector with
vLLM's allocator); here two simulated-lane engines (core 0 and core 1, both alive: an object lives in the segment
its saver's client contributed) share a prefix through one master, each block's object read from and written into
the pages our allocator cut in the layout the connector asks for.
"""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.mooncake]

BLOCK = 128
MASTER_PORT = 27071  # below Linux's ephemeral range (32768-60999), where engines in the namespace take ports
MAX_TOKENS = 8


def _pool(master: str) -> dict:
    return {"kv_connector": "AscendStoreConnector", "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"master_server_address": master, "global_segment_size": "64MiB"}}


def _settled(host, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    stats = host.stats()
    while (stats["worker"]["pending_saves"] or stats["worker"]["held_requests"]) and time.monotonic() < deadline:
        time.sleep(0.1)
        stats = host.stats()
    return stats


@pytest.fixture(scope="module")
def pair(start_master, netns_host, start_engine, model_dir):
    master = start_master(MASTER_PORT)
    hosts = [netns_host("simulated", cpu) for cpu in (0, 1)]
    try:
        for host in hosts:
            start_engine(host, model_dir, _pool(master.address), wait=False)
        for host in hosts:
            host.started()
        yield hosts
    finally:
        for host in hosts:
            if host.alive and host.engine is not None:
                host.stop()
        master.close()


def test_prefix_saved_by_one_simulated_engine_loads_in_another(pair, token_ids):
    a, b = pair
    ids = token_ids(3 * BLOCK + 20, offset=71)
    ref = a.run_requests([{"id": "sim-a", "prompt_token_ids": ids, "max_tokens": MAX_TOKENS}])[0]
    saved = _settled(a)["worker"]
    assert saved["objects_stored"] == 3 and saved["save_errors"] == 0
    out = b.run_requests([{"id": "sim-b", "prompt_token_ids": ids, "max_tokens": MAX_TOKENS}])[0]
    stats = _settled(b)
    assert out["token_ids"] == ref["token_ids"]
    assert out["num_cached_tokens"] == 3 * BLOCK
    assert stats["worker"]["blocks_loaded"] == 3 and stats["worker"]["load_failed_blocks"] == 0
    # one object per block: both layers' K and V pages of the tiny Llama (2 layers x 64 KiB)
    assert stats["worker"]["bytes_loaded"] == 3 * 2 * 64 * 1024
    for host in pair:  # our platform's attention and allocator served both engines
        usage = host.usage()[0]
        assert usage["attention_impls"] == ["AscendAttentionImpl"], usage["attention_impls"]
        assert usage["sleep"]["kv_bound"], usage["sleep"]
