"""The KV pool (AscendStoreConnector) between real vLLM engines over a real mooncake_master, and its faults.

An engine pointed at no master fails to start with the named error. Then engines run in separate processes inside
the session's loopback-only network namespace, all on one master:
A (pool, the session's PYTHONHASHSEED, core 0) and B (pool with switchable faults, PYTHONHASHSEED=22, core 1, its
own host); then A makes way for a disaggregated pair P (MultiConnector: P2P producer + pool, core 0) and D (P2P
consumer, core 1). The tests share them and run in file order: the last one kills the master.
"""

from __future__ import annotations

import os
import time

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.mooncake]

BLOCK = 128
MASTER_PORT = 27051  # below Linux's ephemeral range (32768-60999), where engines in the namespace take ports
P2P_PORT = 30400
MAX_TOKENS = 12
B_HASHSEED = "22"


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
def engines(start_engine, shared_host, own_host, model_dir, master, faults, here):
    b_env = {"PYTHONHASHSEED": B_HASHSEED, "ASCEND_POOL_FAULTS_DIR": str(faults),
             "PYTHONPATH": os.pathsep.join(p for p in (str(here), os.environ.get("PYTHONPATH", "")) if p)}
    b_kv = _pool(master.address) | {"kv_connector": "FaultInjectingStoreConnector",
                                    "kv_connector_module_path": "pool_faults"}
    a = start_engine(shared_host(0), model_dir, _pool(master.address), wait=False)
    b = start_engine(own_host("pool-b", 1, b_env), model_dir, b_kv, wait=False)
    a.started()
    b.started()
    engines = {"A": a, "B": b, "free": {"A": a.free_blocks(), "B": b.free_blocks()}}
    yield engines
    for name in ("A", "B", "P", "D"):
        host = engines.get(name)
        if host is not None and host.alive and host.engine is not None:
            host.stop()


@pytest.fixture(scope="module")
def pd(engines, start_engine, shared_host, model_dir, master):
    """A makes way for the disaggregated pair on the same cores."""
    engines["A"].stop()
    p_kv = {"kv_connector": "MultiConnector", "kv_role": "kv_producer", "engine_id": "pool-prefill",
            "kv_load_failure_policy": "recompute", "kv_connector_extra_config": {"connectors": [
                {"kv_connector": "AscendMooncakeConnector", "kv_role": "kv_producer",
                 "kv_connector_extra_config": {"side_channel_port": P2P_PORT}},
                _pool(master.address, "kv_producer")]}}
    d_kv = {"kv_connector": "AscendMooncakeConnector", "kv_role": "kv_consumer", "engine_id": "pool-decode",
            "kv_load_failure_policy": "recompute", "kv_connector_extra_config": {"side_channel_port": P2P_PORT + 100}}
    p = start_engine(shared_host(0), model_dir, p_kv, wait=False)
    d = start_engine(shared_host(1), model_dir, d_kv, wait=False)
    p.started()
    d.started()
    engines.update(P=p, D=d)
    engines["free"].update(P=p.free_blocks(), D=d.free_blocks())
    return engines


def _poll(host, done, timeout: float = 30.0) -> dict:
    """Stats once `done(stats)` holds (bounded)."""
    deadline = time.monotonic() + timeout
    stats = host.stats()
    while not done(stats) and time.monotonic() < deadline:
        time.sleep(0.1)
        stats = host.stats()
    return stats


def _settled(engines, name: str, timeout: float = 30.0) -> dict:
    """Stats once every block is free again and no save is pending or held."""
    def done(s):
        pool = s.get("worker", {})
        return s["free_blocks"] == engines["free"][name] and not pool.get("pending_saves") \
            and not pool.get("held_requests")
    return _poll(engines[name], done, timeout)


def _run(host, req_id: str, ids: list[int], **kw) -> dict:
    return host.run_requests([{"id": req_id, "prompt_token_ids": ids, "max_tokens": MAX_TOKENS} | kw])[0]


def _hits(stats: dict, prefix: str) -> list[int]:
    return [v for k, v in stats["scheduler"]["per_request_hits"].items() if k.startswith(prefix)]


def _pd(p, d, tag: str, ids: list[int]) -> dict:
    first = p.run_requests([{"id": f"p-{tag}", "prompt_token_ids": ids, "max_tokens": 1,
                             "kv_transfer_params": {"do_remote_decode": True, "transfer_id": f"pool-{tag}"}}])[0]
    return _run(d, f"d-{tag}", ids, kv_transfer_params=first["kv_transfer_params"])


def test_master_absent_at_start_is_a_named_error(shared_host, model_dir, engine_defaults):
    kv = _pool("127.0.0.1:50999", master_connect_timeout_s=1.0)
    err = shared_host(0).start_error(model_dir, **(engine_defaults | {"kv_transfer_config": kv}))
    assert err is not None and err["type"] == "PoolUnavailableError", err
    assert "Mooncake master at 127.0.0.1:50999 is unreachable" in err["message"]
    assert "over 1 s failed" in err["message"] and "master_server_address" in err["message"]


def test_prefix_saved_by_one_engine_loads_in_another(engines, token_ids):
    assert os.environ.get("PYTHONHASHSEED") != B_HASHSEED  # A's engine hashes blocks with another seed than B's
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
    before = b.stats()["worker"]
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
    before = b.stats()["worker"]
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


def test_prefill_saves_to_the_pool_while_decode_pulls_p2p(pd, token_ids):
    p, d, b = pd["P"], pd["D"], pd["B"]
    ids = token_ids(3 * BLOCK + 50, offset=53)
    ref = _run(d, "d-local", ids)
    assert d.reset_prefix_cache()
    out = _pd(p, d, "pd", ids)
    assert out["token_ids"] == ref["token_ids"]
    pulled = [v for k, v in d.stats()["worker"]["pulled"].items() if k.startswith("d-pd")]
    assert len(pulled) == 1 and pulled[0]["ok"] and pulled[0]["blocks"] == 4  # 3 full blocks + the partial one
    # P frees the prompt's blocks once D pulled them and its pool saves are done; then B finds them in the pool
    assert _settled(pd, "P")["free_blocks"] == pd["free"]["P"]
    again = _run(b, "b-pd", ids)
    assert again["token_ids"] == ref["token_ids"]
    assert _hits(_settled(pd, "B"), "b-pd") == [3 * BLOCK]


def test_master_killed_mid_run_serving_continues(pd, token_ids, master, start_master):
    p, d, b = pd["P"], pd["D"], pd["B"]
    pooled = token_ids(5 * BLOCK + 40, offset=17)  # in the pool since the first test
    ref = _run(d, "d-ref-kill", pooled)
    assert d.reset_prefix_cache()
    assert b.reset_prefix_cache()
    master.kill()
    try:
        out_b = _run(b, "b-after-kill", pooled)  # B's lookup fails: it computes the prompt
        out_pd = _pd(p, d, "after-kill", pooled)  # the disaggregated pair goes on without its pool
        assert out_b["token_ids"] == ref["token_ids"] and out_pd["token_ids"] == ref["token_ids"]
        stats = _settled(pd, "B", timeout=60)
        assert stats["scheduler"]["pool_enabled"] is False and _hits(stats, "b-after-kill") == []
        assert stats["free_blocks"] == pd["free"]["B"]
        assert _settled(pd, "P", timeout=60)["free_blocks"] == pd["free"]["P"]
    finally:
        # a master on the port again, so the engines' Mooncake clients shut down in ~2 s instead of ~7 s each
        start_master(MASTER_PORT)
