"""The KV pool (AscendStoreConnector) between real vLLM engines over a real mooncake_master, and its faults.

Four engines run in separate processes inside one loopback-only network namespace, all on one master:
A (pool, PYTHONHASHSEED=11, core 0), B (pool with switchable faults, PYTHONHASHSEED=22, core 1), and a
disaggregated pair P (MultiConnector: P2P producer + pool) / D (P2P consumer). The tests share them and run in file
order: the last one kills the master.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.mooncake]

BLOCK = 128
MASTER_PORT = 50051
P2P_PORT = 30400
MAX_TOKENS = 12


def _pool(master: str, role: str = "kv_both", **extra) -> dict:
    return {"kv_connector": "AscendStoreConnector", "kv_role": role, "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"master_server_address": master, "global_segment_size": "64MiB", **extra}}


@pytest.fixture(scope="module")
def master(start_master):
    master = start_master(MASTER_PORT)
    yield master
    master.close()


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    return tmp_path_factory.mktemp("pool-faults")


@pytest.fixture(scope="module")
def engines(start_engine, model_dir, netns, master, faults, here):
    import os

    common = {"model": model_dir, "block_size": BLOCK, "max_model_len": 1024, "max_num_seqs": 4}
    b_kv = _pool(master.address) | {"kv_connector": "FaultInjectingStoreConnector",
                                    "kv_connector_module_path": "pool_faults"}
    p_kv = {"kv_connector": "MultiConnector", "kv_role": "kv_producer", "engine_id": "pool-prefill",
            "kv_load_failure_policy": "recompute", "kv_connector_extra_config": {"connectors": [
                {"kv_connector": "AscendMooncakeConnector", "kv_role": "kv_producer",
                 "kv_connector_extra_config": {"side_channel_port": P2P_PORT}},
                _pool(master.address, "kv_producer")]}}
    d_kv = {"kv_connector": "AscendMooncakeConnector", "kv_role": "kv_consumer", "engine_id": "pool-decode",
            "kv_load_failure_policy": "recompute", "kv_connector_extra_config": {"side_channel_port": P2P_PORT + 100}}
    b_env = {"PYTHONHASHSEED": "22", "ASCEND_POOL_FAULTS_DIR": str(faults),
             "PYTHONPATH": os.pathsep.join(p for p in (str(here), os.environ.get("PYTHONPATH", "")) if p)}
    procs = {
        "A": start_engine("A", common | {"kv_transfer_config": _pool(master.address)}, 0, netns=netns, wait=False,
                          env={"PYTHONHASHSEED": "11"}),
        "B": start_engine("B", common | {"kv_transfer_config": b_kv}, 1, netns=netns, wait=False, env=b_env),
        "P": start_engine("P", common | {"kv_transfer_config": p_kv}, 0, netns=netns, wait=False),
        "D": start_engine("D", common | {"kv_transfer_config": d_kv}, 1, netns=netns, wait=False),
    }
    engines = {name: proc.wait_ready() for name, proc in procs.items()}
    engines["free"] = {name: e.call("free_blocks") for name, e in engines.items()}
    yield engines
    # in parallel: after the master is gone, Mooncake spends seconds per client giving up on it at shutdown
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda name: engines[name].close(), "ABPD"))


def _poll(engine, done, timeout: float = 30.0) -> dict:
    """Stats once `done(stats)` holds (bounded)."""
    deadline = time.monotonic() + timeout
    stats = engine.call("stats")
    while not done(stats) and time.monotonic() < deadline:
        time.sleep(0.1)
        stats = engine.call("stats")
    return stats


def _settled(engines, name: str, timeout: float = 30.0) -> dict:
    """Stats once every block is free again and no save is pending or held."""
    def done(s):
        return s["free_blocks"] == engines["free"][name] and (
            "worker" not in s or (s["worker"]["pending_saves"] == 0 and s["worker"]["held_requests"] == 0))
    return _poll(engines[name], done, timeout)


def _run(engine, req_id: str, ids: list[int], **kw) -> dict:
    return engine.generate([{"id": req_id, "prompt_token_ids": ids, "max_tokens": MAX_TOKENS} | kw])[0]


def _hits(stats: dict, prefix: str) -> list[int]:
    return [v for k, v in stats["scheduler"]["per_request_hits"].items() if k.startswith(prefix)]


def test_prefix_saved_by_one_engine_loads_in_another(engines, token_ids):
    a, b = engines["A"], engines["B"]
    ids = token_ids(5 * BLOCK + 40, offset=17)
    ref = _run(a, "a-first", ids)  # computed from scratch: the no-pool reference
    stats_a = _settled(engines, "A")
    assert stats_a["scheduler"]["hit_tokens"] == 0
    assert stats_a["worker"]["objects_stored"] == 5 and stats_a["worker"]["save_errors"] == 0

    out = _run(b, "b-first", ids)
    assert out["token_ids"] == ref["token_ids"]
    assert out["num_cached_tokens"] == 5 * BLOCK
    stats_b = _settled(engines, "B")
    assert _hits(stats_b, "b-first") == [5 * BLOCK]
    assert stats_b["worker"]["blocks_loaded"] == 5 and stats_b["worker"]["load_failed_blocks"] == 0
    assert stats_b["worker"]["bytes_loaded"] == 5 * 2 * 64 * 1024  # 2 layers x 64 KiB pages per block
    assert stats_b["worker"]["objects_skipped_present"] == 5  # B's saves found A's objects there
    # every block is free again on both engines (loads and saves released theirs)
    assert stats_b["free_blocks"] == engines["free"]["B"] and stats_a["free_blocks"] == engines["free"]["A"]


def test_blocks_removed_after_the_lookup_are_recomputed(engines, token_ids, faults):
    a, b = engines["A"], engines["B"]
    ids = token_ids(4 * BLOCK + 10, offset=31)
    ref = _run(a, "a-removed", ids)
    _settled(engines, "A")
    before = b.call("stats")["worker"]
    (faults / "remove_after_lookup").touch()
    try:
        out = _run(b, "b-removed", ids)
    finally:
        (faults / "remove_after_lookup").unlink()
    assert out["token_ids"] == ref["token_ids"]
    stats = _settled(engines, "B")
    assert stats["scheduler"]["removed_after_lookup"] == 4
    assert stats["worker"]["load_failed_blocks"] - before["load_failed_blocks"] == 4
    assert stats["worker"]["blocks_loaded"] == before["blocks_loaded"]
    # B recomputed the blocks and put them back into the pool
    assert stats["worker"]["objects_stored"] - before["objects_stored"] == 4
    assert stats["free_blocks"] == engines["free"]["B"]


def test_store_raising_on_put_leaks_no_block(engines, token_ids, faults):
    b = engines["B"]
    ids = token_ids(3 * BLOCK + 7, offset=43)
    before = b.call("stats")["worker"]
    (faults / "put_raises").touch()
    try:
        out = _run(b, "b-raises", ids)
        stats = _settled(engines, "B")
    finally:
        (faults / "put_raises").unlink()
    assert len(out["token_ids"]) == MAX_TOKENS
    assert stats["worker"]["save_errors"] - before["save_errors"] == 1
    assert stats["worker"]["put_failed_objects"] - before["put_failed_objects"] == 3
    assert stats["worker"]["pending_saves"] == 0 and stats["worker"]["held_requests"] == 0
    assert stats["free_blocks"] == engines["free"]["B"]
    assert stats["worker"]["pool_enabled"] and stats["scheduler"]["held_requests"] == 0


def test_prefill_saves_to_the_pool_while_decode_pulls_p2p(engines, token_ids):
    p, d, b = engines["P"], engines["D"], engines["B"]
    ids = token_ids(3 * BLOCK + 50, offset=53)
    ref = _run(d, "d-local", ids)
    d.call("reset_prefix_cache")
    first = p.generate([{"id": "p-pd", "prompt_token_ids": ids, "max_tokens": 1,
                         "kv_transfer_params": {"do_remote_decode": True, "transfer_id": "pool-pd"}}])[0]
    out = _run(d, "d-pd", ids, kv_transfer_params=first["kv_transfer_params"])
    assert out["token_ids"] == ref["token_ids"]
    pulled = [v for k, v in d.call("stats")["worker"]["pulled"].items() if k.startswith("d-pd")]
    assert len(pulled) == 1 and pulled[0]["ok"] and pulled[0]["blocks"] == 4  # 3 full blocks + the partial one
    # P frees the prompt's blocks once D pulled them and its pool saves are done; then B finds them in the pool
    assert _settled(engines, "P")["free_blocks"] == engines["free"]["P"]
    again = _run(b, "b-pd", ids)
    assert again["token_ids"] == ref["token_ids"]
    assert _hits(_settled(engines, "B"), "b-pd") == [3 * BLOCK]


def test_master_killed_mid_run_serving_continues(engines, token_ids, master):
    a, b = engines["A"], engines["B"]
    ids = token_ids(2 * BLOCK + 3, offset=61)
    ref = _run(a, "a-before-kill", ids)
    _settled(engines, "A")
    master.kill()
    out_a = _run(a, "a-after-kill", token_ids(2 * BLOCK + 3, offset=67))
    out_b = _run(b, "b-after-kill", ids)  # the pool held these blocks; now B computes them
    assert out_b["token_ids"] == ref["token_ids"] and len(out_a["token_ids"]) == MAX_TOKENS
    for name in "AB":
        stats = _settled(engines, name, timeout=60)
        assert stats["scheduler"]["pool_enabled"] is False
        assert stats["free_blocks"] == engines["free"][name]
    assert _hits(b.call("stats"), "b-after-kill") == []
