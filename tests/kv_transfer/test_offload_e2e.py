"""Host-memory offloading in a real vLLM engine (AscendOffloadingConnector, loaded by module path).

A long prompt's full blocks are saved to the host tier when its request finishes; after the engine's own prefix
cache is reset, a second request sharing the prefix loads it back from the tier and decodes the same tokens. Once on
vLLM's CPU platform, once in the simulated-NPU lane, where sleep and wake-up move the KV memory under the tier.
"""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.engine

BLOCK_SIZE = 128


@pytest.fixture(scope="module")
def engine(lane, start_engine, model_dir, netns):
    config = {"model": model_dir, "block_size": BLOCK_SIZE, "max_model_len": 1024, "max_num_seqs": 4,
              "kv_transfer_config": {"kv_connector": "AscendOffloadingConnector", "kv_role": "kv_both",
                                     "kv_connector_module_path": "ascend_kv_transfer.offloading_connector",
                                     "kv_connector_extra_config": {"host_bytes": 2 << 20}}}
    # The simulated lane runs MRV2 in the P2P suites; here its V1 runner (each re-allocates KV on wake-up its own way).
    engine = start_engine("offload", config, 0, netns=netns, lane=lane, runner="v1" if lane == "simulated" else None)
    yield engine
    engine.stop()


def _tier_stats(engine, timeout=10.0):
    deadline = time.monotonic() + timeout
    stats = engine.call("stats")
    while stats["worker"]["blocks_stored"] < stats["scheduler"]["stored_blocks"] and time.monotonic() < deadline:
        time.sleep(0.1)
        stats = engine.call("stats")
    return stats


def test_shared_prefix_loads_from_host_tier(engine, token_ids):
    prompt = token_ids(5 * BLOCK_SIZE + 40, offset=17)
    first = engine.run_requests([{"id": "first", "prompt_token_ids": prompt, "max_tokens": 12}])[0]
    stats = _tier_stats(engine)
    assert stats["scheduler"]["stored_blocks"] >= 5 and stats["worker"]["blocks_stored"] >= 5
    assert stats["scheduler"]["hit_tokens"] == 0

    engine.call("reset_prefix_cache")  # so the prefix can only come from the host tier
    second = engine.run_requests([{"id": "second", "prompt_token_ids": prompt, "max_tokens": 12}])[0]
    stats = engine.call("stats")
    hits = [v for k, v in stats["scheduler"]["per_request_hits"].items() if k.startswith("second")]
    assert hits == [5 * BLOCK_SIZE]
    assert stats["worker"]["blocks_loaded"] == 5
    assert second["token_ids"] == first["token_ids"]


def test_budget_bounds_the_tier(engine, token_ids):
    # 2 MiB / (2 layers x 64 KiB) = 16 blocks; push more than that through and the tier stays within budget.
    for i in range(3):
        engine.run_requests([{"id": f"fill{i}", "prompt_token_ids": token_ids(7 * BLOCK_SIZE + 1, offset=100 + i),
                          "max_tokens": 1}])
        engine.call("reset_prefix_cache")
    stats = _tier_stats(engine)
    assert stats["scheduler"]["tier_blocks"] <= 16 and stats["scheduler"]["evictions"] >= 5


def test_tier_follows_the_kv_memory_through_sleep_and_wake(engine, token_ids, registration):
    if engine.lane != "simulated":
        pytest.skip("vLLM's CPU platform has no sleep mode")
    prompt = token_ids(4 * BLOCK_SIZE + 3, offset=300)
    first = engine.run_requests([{"id": "before-sleep", "prompt_token_ids": prompt, "max_tokens": 12}])[0]
    _tier_stats(engine)
    before = registration(engine)
    assert before["registered"] == before["storages"] != []
    engine.sleep(level=1)
    assert registration(engine)["registered"] == []
    engine.wake_up()
    after = registration(engine)
    assert after["registered"] == after["storages"] != []
    assert after["registrations"] == before["registrations"] + 1

    # Sleep dropped the engine's prefix cache: the prefix comes back from the host tier, into the new memory.
    loaded = engine.call("stats")["worker"]["blocks_loaded"]
    again = engine.run_requests([{"id": "after-wake", "prompt_token_ids": prompt, "max_tokens": 12}])[0]
    stats = engine.call("stats")
    assert [v for k, v in stats["scheduler"]["per_request_hits"].items() if k.startswith("after-wake")] == \
        [4 * BLOCK_SIZE]
    assert stats["worker"]["blocks_loaded"] - loaded == 4
    assert again["token_ids"] == first["token_ids"]
