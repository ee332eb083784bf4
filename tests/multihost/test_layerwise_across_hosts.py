"""Layerwise disaggregated prefill (AscendMooncakeLayerwiseConnector) across two hosts: the decode engine on one
namespace host registers its blocks with the prefill engine on another, which writes each layer into them over the
veth link as it computes it. Both engines in the simulated-NPU lane, `side_channel_host` each host's own address;
the decode output equals the prefill engine's own greedy tokens."""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.mooncake]

BLOCK_SIZE = 128
SIDE_CHANNEL_PORT = 31700
MAX_TOKENS = 10
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 4  # the tiny Llama, float32


def _kv(role: str, host) -> dict:
    return {
        "kv_connector": "AscendMooncakeLayerwiseConnector",
        "kv_role": role,
        "engine_id": f"lw-{role}",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {
            "side_channel_port": SIDE_CHANNEL_PORT,
            "side_channel_host": host.address,
            "abort_timeout_s": 30.0,
        },
    }


@pytest.fixture(scope="module")
def lw(tmp_path_factory, model_dir):
    from ascend_testkit.engine import EngineHost
    from ascend_testkit.hosts import Topology

    logs = tmp_path_factory.mktemp("multihost-layerwise")
    engine = dict(
        dtype="float32",
        enforce_eager=True,
        seed=0,
        max_model_len=1024,
        max_num_seqs=4,
        block_size=BLOCK_SIZE,
        enable_prefix_caching=True,
    )
    with Topology(["prefill", "decode"]) as topo:
        engines = []
        try:
            for cpu, (name, role) in enumerate((("prefill", "kv_producer"), ("decode", "kv_consumer"))):
                eh = EngineHost(f"lw-{name}", lane="simulated", log_dir=logs, cpus=cpu, netns=topo[name])
                engines.append(eh.start(model_dir, wait=False, kv_transfer_config=_kv(role, topo[name]), **engine))
            for e in engines:
                e.started()
            yield topo, engines[0], engines[1]
        finally:
            for e in engines:
                e.close()


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.parametrize("n", [2 * BLOCK_SIZE + 7])
def test_prefill_host_pushes_layers_into_the_decode_host(lw, token_ids, n):
    topo, prefill, decode = lw
    ids = token_ids(n, offset=11 * n)
    expected = prefill.run_requests([{"id": f"base-{n}", "prompt_token_ids": ids, "max_tokens": MAX_TOKENS}])[0]
    prefill.call("reset_prefix_cache")
    free_before = prefill.call("free_blocks")
    before = prefill.call("stats")["worker"]
    pushed_before = topo["prefill"].bytes_sent("decode")

    tid = f"lw-hosts-{n}"
    decode.submit(
        [
            {
                "id": f"d-{n}",
                "prompt_token_ids": ids,
                "max_tokens": MAX_TOKENS,
                "kv_transfer_params": {
                    "do_remote_prefill": True,
                    "remote_engine_id": "lw-kv_producer",
                    "remote_bootstrap_addr": f"{topo['prefill'].address}:{SIDE_CHANNEL_PORT}",
                    "transfer_id": tid,
                },
            }
        ]
    )
    # The decode host registered its destination with the prefill host before the prefill starts.
    assert _wait(lambda: tid in prefill.call("stats")["worker"]["push_destinations"], 30)
    first = prefill.run_requests(
        [
            {
                "id": f"p-{n}",
                "prompt_token_ids": ids,
                "max_tokens": 1,
                "kv_transfer_params": {"do_remote_decode": True, "transfer_id": tid},
            }
        ]
    )[0]
    out = decode.collect([f"d-{n}"], timeout=60)[0]

    assert out["token_ids"] == expected["token_ids"]
    assert first["token_ids"] == expected["token_ids"][:1]
    stats = prefill.call("stats")["worker"]
    assert stats["layer_pushes"] - before["layer_pushes"] == 2  # both layers written while the prefill ran
    pulled = [v for k, v in decode.call("stats")["worker"]["pulled"].items() if k.startswith(f"d-{n}")]
    assert len(pulled) == 1 and pulled[0]["ok"] and pulled[0]["blocks"] == -(-n // BLOCK_SIZE)
    # The layers went from the prefill host to the decode host over their link.
    assert topo["prefill"].bytes_sent("decode") - pushed_before >= n * KV_BYTES_PER_TOKEN
    assert _wait(lambda: prefill.call("free_blocks") == free_before, 10)
