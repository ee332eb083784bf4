"""Disaggregated prefill between two real vLLM engines over Mooncake (AscendMooncakeConnector), and its faults.

A prefill engine (kv_producer, core 0) and a decode engine (kv_consumer, core 1) run in separate processes inside a
loopback-only network namespace; requests carry vLLM's router-style kv_transfer_params from one to the other.
Once on vLLM's CPU platform, once in the simulated-NPU lane (our allocator's layout; sleep and wake-up move the KV
memory and the registrations must follow). A lane's tests share its two engines and run in file order: the last
one kills the prefill engine.
"""

from __future__ import annotations

import json
import time

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.mooncake]

BLOCK_SIZE = 128
PREFILL_PORT = 31100
DECODE_PORT = 31200
PEER_PORT = 31300
ABORT_TIMEOUT_S = 8.0
MAX_TOKENS = 12
# Prompt lengths ending before, on and after block boundaries.
LENGTHS = [BLOCK_SIZE - 1, BLOCK_SIZE, BLOCK_SIZE + 1, 3 * BLOCK_SIZE - 1, 3 * BLOCK_SIZE + 5]


def _kv_config(role: str, port: int, **extra) -> dict:
    return {
        "kv_connector": "AscendMooncakeConnector",
        "kv_role": role,
        "engine_id": f"{role}-engine",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"side_channel_port": port, "abort_timeout_s": ABORT_TIMEOUT_S,
                                      "handshake_timeout_s": 2.0, "claim_wait_s": 3.0, **extra},
    }


@pytest.fixture(scope="module")
def engines(lane, pd_pair, model_dir):
    common = {"model": model_dir, "block_size": BLOCK_SIZE, "max_model_len": 1024, "max_num_seqs": 8}
    kv_configs = (_kv_config("kv_producer", PREFILL_PORT), _kv_config("kv_consumer", DECODE_PORT))
    with pd_pair(("prefill", "decode"), common, kv_configs, lane) as pair:
        yield pair


@pytest.fixture(scope="module")
def baseline(engines, token_ids):
    """Greedy outputs of a single engine (the prefill engine, no transfer) for every prompt."""
    prefill, _ = engines
    prompts = {f"len{n}": token_ids(n, offset=n) for n in LENGTHS}
    outs = prefill.run_requests([{"id": f"base-{k}", "prompt_token_ids": v, "max_tokens": MAX_TOKENS}
                             for k, v in prompts.items()])
    prefill.call("reset_prefix_cache")
    return prompts, {k: o["token_ids"] for k, o in zip(prompts, outs, strict=True)}


def _wait_free(engine, target: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    free = engine.call("free_blocks")
    while free != target and time.monotonic() < deadline:
        time.sleep(0.2)
        free = engine.call("free_blocks")
    return free


def _prefill(engine, tag: str, ids: list[int]) -> dict:
    out = engine.run_requests([{"id": f"p-{tag}", "prompt_token_ids": ids, "max_tokens": 1,
                            "kv_transfer_params": {"do_remote_decode": True, "transfer_id": f"xfer-{tag}"}}])[0]
    params = out["kv_transfer_params"]
    assert params["do_remote_prefill"] and params["transfer_id"] == f"xfer-{tag}"
    assert params["remote_bootstrap_addr"] == f"127.0.0.1:{PREFILL_PORT}"
    return out


def _pulled(stats: dict, req_prefix: str) -> dict:
    matches = [v for k, v in stats["worker"]["pulled"].items() if k.startswith(req_prefix)]
    assert len(matches) == 1, (req_prefix, sorted(stats["worker"]["pulled"]))
    return matches[0]


def test_decode_output_matches_single_engine_without_recompute(engines, baseline):
    prefill, decode = engines
    prompts, expected = baseline
    free_before = prefill.call("free_blocks")

    firsts = {k: _prefill(prefill, k, ids) for k, ids in prompts.items()}
    held = prefill.call("free_blocks")
    assert held < free_before, "the prefill engine must hold the prompt blocks until the decode side is done"

    outs = decode.run_requests([{"id": f"d-{k}", "prompt_token_ids": ids, "max_tokens": MAX_TOKENS,
                             "kv_transfer_params": firsts[k]["kv_transfer_params"]} for k, ids in prompts.items()])
    stats = decode.call("stats")
    for (k, ids), out in zip(prompts.items(), outs, strict=True):
        assert out["token_ids"] == expected[k], k
        assert firsts[k]["token_ids"] == expected[k][:1], k
        # Not recomputed: the whole prompt was scheduled as external tokens and its blocks came over Mooncake.
        loaded = [v for r, v in stats["scheduler"]["loaded_tokens"].items() if r.startswith(f"d-{k}")]
        assert loaded == [len(ids)], k
        pulled = _pulled(stats, f"d-{k}")
        assert pulled["ok"] and pulled["blocks"] == -(-len(ids) // BLOCK_SIZE), (k, pulled.get("error"), pulled)
        # runs x regions, coalesced: 2 layers, each one region (vLLM's cells) or, in the simulated lane, two (our
        # allocator lays K and V out as dense planes, torch_npu's paged caches)
        regions = 2 * (2 if prefill.lane == "simulated" else 1)
        assert pulled["entries"] <= pulled["blocks"] * regions
    assert stats["worker"]["pulls_failed"] == 0

    assert _wait_free(prefill, free_before, 10.0) == free_before
    assert prefill.call("stats")["worker"]["released_done"] >= len(prompts)


def test_prefill_frees_blocks_when_decode_never_comes(engines, baseline):
    prefill, decode = engines
    prompts, expected = baseline
    free_before = prefill.call("free_blocks")
    expired_before = prefill.call("stats")["worker"]["released_expired"]
    ids = prompts[f"len{LENGTHS[-1]}"]
    first = _prefill(prefill, "orphan", ids)
    assert prefill.call("free_blocks") < free_before
    assert _wait_free(prefill, free_before, ABORT_TIMEOUT_S + 15) == free_before
    assert prefill.call("stats")["worker"]["released_expired"] == expired_before + 1

    # A decode that turns up after the timeout is told the transfer expired and recomputes: same tokens.
    out = decode.run_requests([{"id": "d-late", "prompt_token_ids": ids, "max_tokens": MAX_TOKENS,
                            "kv_transfer_params": first["kv_transfer_params"]}], timeout=60)[0]
    assert out["token_ids"] == expected[f"len{LENGTHS[-1]}"]
    pulled = _pulled(decode.call("stats"), "d-late")
    assert not pulled["ok"] and "expired" in pulled["error"]


@pytest.mark.parametrize(("field", "value"), [("block_size", 64), ("dtype", "bfloat16"), ("num_kv_heads", 4)])
def test_geometry_mismatch_is_rejected_at_handshake(engines, baseline, run_in_netns, field, value):
    _, decode = engines
    prompts, expected = baseline
    port = PEER_PORT + ["block_size", "dtype", "num_kv_heads"].index(field)
    config = {"fetch_from": ["127.0.0.1", PREFILL_PORT],
              "agents": [{"port": port, "override": {field: value}, "transfer_id": f"geo-{field}"}]}
    peer = run_in_netns("peer_agent.py", json.dumps(config))
    assert json.loads(peer.stdout.readline())["ready"]

    key = f"len{LENGTHS[0]}"
    params = {"do_remote_prefill": True, "remote_engine_id": f"peer-{port}", "transfer_id": f"geo-{field}",
              "remote_bootstrap_addr": f"127.0.0.1:{port}"}
    out = decode.run_requests([{"id": f"d-geo-{field}", "prompt_token_ids": prompts[key], "max_tokens": MAX_TOKENS,
                            "kv_transfer_params": params}], timeout=60)[0]
    assert out["token_ids"] == expected[key]  # recomputed locally, nothing garbage was loaded
    pulled = _pulled(decode.call("stats"), f"d-geo-{field}")
    assert not pulled["ok"] and "GeometryMismatchError" in pulled["error"] and field in pulled["error"]

    peer.stdin.write(b"stats\n")
    peer.stdin.flush()
    peer_stats = json.loads(peer.stdout.readline())[0]
    assert peer_stats["held_now"] == 0 and peer_stats["released_done"] == 1  # the decode side released it
    peer.stdin.close()
    peer.wait(timeout=10)


def test_registrations_follow_the_kv_memory_through_sleep_and_wake(engines, baseline, registration):
    prefill, decode = engines
    if prefill.lane != "simulated":
        pytest.skip("vLLM's CPU platform has no sleep mode")
    prompts, expected = baseline
    for host in (prefill, decode):
        before = registration(host)
        assert before["registered"] == before["storages"] != []  # our allocator's 2 MiB-aligned buffers, exactly
        host.sleep(level=1)
        asleep = registration(host)
        assert asleep["registered"] == [] and asleep["storages"] == []  # nothing registered over freed memory
        host.wake_up()
        after = registration(host)
        assert after["registered"] == after["storages"] != []
        assert after["registrations"] == before["registrations"] + 1
        assert all(addr % (2 << 20) == 0 for addr, _ in after["registered"])

    # The decode side still holds the prefill's metadata of before the sleep: the claim's epoch sends it to handshake
    # again, and the pulled bytes are the new memory's.
    keys = [f"len{LENGTHS[1]}", f"len{LENGTHS[-1]}"]
    firsts = {k: _prefill(prefill, f"{k}-woken", prompts[k]) for k in keys}
    outs = decode.run_requests([{"id": f"d-{k}-woken", "prompt_token_ids": prompts[k], "max_tokens": MAX_TOKENS,
                                 "kv_transfer_params": firsts[k]["kv_transfer_params"]} for k in keys])
    stats = decode.call("stats")
    for k, out in zip(keys, outs, strict=True):
        assert out["token_ids"] == expected[k], k
        pulled = _pulled(stats, f"d-{k}-woken")
        assert pulled["ok"], pulled["error"]
        loaded = [v for r, v in stats["scheduler"]["loaded_tokens"].items() if r.startswith(f"d-{k}-woken")]
        assert loaded == [len(prompts[k])], k


def test_prefill_killed_before_pull_then_decode_recovers(engines, baseline):
    prefill, decode = engines
    prompts, expected = baseline
    key = f"len{LENGTHS[2]}"
    first = _prefill(prefill, "killed", prompts[key])
    prefill.kill()

    start = time.monotonic()
    out = decode.run_requests([{"id": "d-killed", "prompt_token_ids": prompts[key], "max_tokens": MAX_TOKENS,
                            "kv_transfer_params": first["kv_transfer_params"]}], timeout=60)[0]
    assert time.monotonic() - start < 30
    assert out["token_ids"] == expected[key]
    pulled = _pulled(decode.call("stats"), "d-killed")
    assert not pulled["ok"]

    nxt = decode.run_requests([{"id": "d-next", "prompt_token_ids": prompts[f"len{LENGTHS[1]}"],
                            "max_tokens": MAX_TOKENS}], timeout=60)[0]
    assert nxt["token_ids"] == expected[f"len{LENGTHS[1]}"]
