"""Layerwise disaggregated prefill (AscendMooncakeLayerwiseConnector) between two real vLLM engines.

The decode request goes first and hands its blocks to the prefill worker; the prefill engine then writes each layer
into them as it computes it. Output must match a single engine token for token, the prefill's blocks must come back,
a prefill that runs before the decode side asked still completes the hand-off (bulk push), and a request whose
prefill has not come yet holds up no other request. Once on vLLM's CPU platform, once in the simulated-NPU lane.
"""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.mooncake]

BLOCK_SIZE = 128
PREFILL_PORT = 31500
DECODE_PORT = 31600
MAX_TOKENS = 10


def _kv(role: str, port: int) -> dict:
    return {"kv_connector": "AscendMooncakeLayerwiseConnector", "kv_role": role, "engine_id": f"lw-{role}",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"side_channel_port": port, "abort_timeout_s": 30.0}}


@pytest.fixture(scope="module")
def engines(lane, pd_pair, model_dir):
    common = {"model": model_dir, "block_size": BLOCK_SIZE, "max_model_len": 1024, "max_num_seqs": 4}
    kv_configs = (_kv("kv_producer", PREFILL_PORT), _kv("kv_consumer", DECODE_PORT))
    with pd_pair(("lw-prefill", "lw-decode"), common, kv_configs, lane) as pair:
        yield pair


def _decode_request(req_id: str, ids: list[int], tid: str) -> dict:
    return {"id": req_id, "prompt_token_ids": ids, "max_tokens": MAX_TOKENS,
            "kv_transfer_params": {"do_remote_prefill": True, "remote_engine_id": "lw-kv_producer",
                                   "remote_bootstrap_addr": f"127.0.0.1:{PREFILL_PORT}", "transfer_id": tid}}


def _prefill_request(req_id: str, ids: list[int], tid: str) -> dict:
    return {"id": req_id, "prompt_token_ids": ids, "max_tokens": 1,
            "kv_transfer_params": {"do_remote_decode": True, "transfer_id": tid}}


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.parametrize("n", [2 * BLOCK_SIZE + 7, 3 * BLOCK_SIZE])
def test_prefill_pushes_layers_into_waiting_decode(engines, token_ids, n):
    prefill, decode = engines
    ids = token_ids(n, offset=3 * n)
    expected = prefill.run_requests([{"id": f"base-{n}", "prompt_token_ids": ids, "max_tokens": MAX_TOKENS}])[0]
    prefill.call("reset_prefix_cache")
    free_before = prefill.call("free_blocks")
    before = prefill.call("stats")["worker"]

    tid = f"lw-{n}"
    decode.submit([_decode_request(f"d-{n}", ids, tid)])
    # The decode worker registers its destination with the prefill worker before the prefill starts.
    assert _wait(lambda: tid in prefill.call("stats")["worker"]["push_destinations"], 30)
    first = prefill.run_requests([_prefill_request(f"p-{n}", ids, tid)])[0]
    out = decode.collect([f"d-{n}"], timeout=60)[0]

    assert out["token_ids"] == expected["token_ids"]
    assert first["token_ids"] == expected["token_ids"][:1]
    stats = prefill.call("stats")["worker"]
    assert stats["layer_pushes"] - before["layer_pushes"] == 2  # both layers written while the prefill ran,
    assert stats["layers_saved_in_forward"] - before["layers_saved_in_forward"] == 2  # queued from save_kv_layer
    assert stats["layers_saved_after_forward"] == before["layers_saved_after_forward"]
    assert stats["bulk_pushes"] == before["bulk_pushes"]
    pulled = [v for k, v in decode.call("stats")["worker"]["pulled"].items() if k.startswith(f"d-{n}")]
    assert len(pulled) == 1 and pulled[0]["ok"] and pulled[0]["blocks"] == -(-n // BLOCK_SIZE)
    assert _wait(lambda: prefill.call("free_blocks") == free_before, 10)


def test_prefill_first_falls_back_to_one_bulk_push(engines, token_ids):
    prefill, decode = engines
    ids = token_ids(BLOCK_SIZE + 50, offset=77)
    expected = prefill.run_requests([{"id": "base-bulk", "prompt_token_ids": ids, "max_tokens": MAX_TOKENS}])[0]
    prefill.call("reset_prefix_cache")
    bulk_before = prefill.call("stats")["worker"]["bulk_pushes"]
    first = prefill.run_requests([{"id": "p-bulk", "prompt_token_ids": ids, "max_tokens": 1,
                               "kv_transfer_params": {"do_remote_decode": True, "transfer_id": "lw-bulk"}}])[0]
    out = decode.run_requests([{"id": "d-bulk", "prompt_token_ids": ids, "max_tokens": MAX_TOKENS,
                            "kv_transfer_params": first["kv_transfer_params"]}], timeout=60)[0]
    assert out["token_ids"] == expected["token_ids"]
    assert prefill.call("stats")["worker"]["bulk_pushes"] == bulk_before + 1


def test_a_waiting_request_holds_up_no_other(engines, token_ids):
    """Two decode requests; the first one's prefill does not come (its router is slow): the second one's decode side
    still registers at once, its layers are written while its prefill runs, and its KV lands."""
    prefill, decode = engines
    n = 2 * BLOCK_SIZE + 10
    ids = {"slow": token_ids(n, offset=501), "fast": token_ids(n, offset=777)}
    expected = {k: prefill.run_requests([{"id": f"base-{k}", "prompt_token_ids": v, "max_tokens": MAX_TOKENS}])[0]
                for k, v in ids.items()}
    prefill.call("reset_prefix_cache")
    before = prefill.call("stats")["worker"]

    decode.submit([_decode_request(f"d-{k}", v, f"lw-{k}") for k, v in ids.items()])
    assert _wait(lambda: {"lw-slow", "lw-fast"} <= set(prefill.call("stats")["worker"]["push_destinations"]), 30)
    prefill.run_requests([_prefill_request("p-fast", ids["fast"], "lw-fast")])
    fast = decode.collect(["d-fast"], timeout=60)[0]
    assert fast["token_ids"] == expected["fast"]["token_ids"]
    stats = prefill.call("stats")["worker"]
    assert stats["layer_pushes"] - before["layer_pushes"] == 2 and stats["bulk_pushes"] == before["bulk_pushes"]
    pulled = decode.call("stats")["worker"]["pulled"]
    assert [v["ok"] for k, v in pulled.items() if k.startswith("d-fast")] == [True]
    assert not [k for k in pulled if k.startswith("d-slow")]  # still waiting, not failed

    prefill.run_requests([_prefill_request("p-slow", ids["slow"], "lw-slow")])
    slow = decode.collect(["d-slow"], timeout=60)[0]
    assert slow["token_ids"] == expected["slow"]["token_ids"]
    assert [v["ok"] for k, v in decode.call("stats")["worker"]["pulled"].items() if k.startswith("d-slow")] == [True]
