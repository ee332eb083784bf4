"""Disaggregated prefill of the MLA model across tensor-parallel sizes, over real Mooncake in the loopback namespace.

Every TP rank of an MLA model holds the same latent KV, so each decode rank reads the latent pages from ONE prefill
rank (`p2p.rank_groups.plan_reads`), and only one copy per decode rank moves:
- prefill TP=2, decode TP=1: the decode rank reads the rank the plan picks for the transfer and tells the other one
  to free its blocks at once;
- prefill TP=1, decode TP=2: both decode ranks read the one prefill rank, which frees its blocks after both reported.
Two hosts take turns: a two-rank host (workers on cores 0 and 1, gloo) and a one-rank host on core 1.
"""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.mooncake]

BLOCK_SIZE = 16
# (prefill, decode) side-channel ports per pairing: a new pair never meets a port the last one held.
PORTS = {2: (31900, 32000), 1: (26300, 26400)}
MAX_TOKENS = 8
# Far beyond the test's waits: a block freed by the abort timeout could not pass for a prompt release.
ABORT_TIMEOUT_S = 120.0
LENGTHS = (BLOCK_SIZE - 1, BLOCK_SIZE + 1, 3 * BLOCK_SIZE + 5, 5 * BLOCK_SIZE + 3)
LATENT_BYTES = (512 + 64) * 4  # kv_lora_rank + rope per token, float32
ENGINE = dict(dtype="float32", enforce_eager=True, seed=0, max_model_len=256, max_num_seqs=4, block_size=BLOCK_SIZE,
              enable_prefix_caching=True)
STATS = "ascend_testkit.kv_probes:connector_stats"


def _kv_config(role: str, port: int) -> dict:
    return {"kv_connector": "AscendMooncakeConnector", "kv_role": role, "engine_id": f"mla-tp-{role}",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"side_channel_port": port, "abort_timeout_s": ABORT_TIMEOUT_S,
                                          "handshake_timeout_s": 5.0, "claim_wait_s": 5.0}}


class Pairs:
    """One prefill/decode pair at a time on the two hosts, keyed by the prefill's TP size (the decode's is 3 - it)."""

    def __init__(self, two_ranks, one_rank, model: str) -> None:
        self.two_ranks, self.one_rank, self.model = two_ranks, one_rank, model
        self.prefill_tp: int | None = None

    def get(self, prefill_tp: int):
        hosts = (self.two_ranks, self.one_rank) if prefill_tp == 2 else (self.one_rank, self.two_ranks)
        if self.prefill_tp != prefill_tp:
            self.stop()
            for host, role, port, tp in zip(hosts, ("kv_producer", "kv_consumer"), PORTS[prefill_tp],
                                            (prefill_tp, 3 - prefill_tp), strict=True):
                host.start(self.model, wait=False, tensor_parallel_size=tp, kv_transfer_config=_kv_config(role, port),
                           **ENGINE)
            for host in hosts:
                host.started()
            self.prefill_tp = prefill_tp
        return hosts

    def stop(self) -> None:
        if self.prefill_tp is not None:
            for host in (self.two_ranks, self.one_rank):
                if host.alive:
                    host.stop()
        self.prefill_tp = None


@pytest.fixture(scope="module")
def pairs(host_pool, netns, netns_host, mla_model):
    from ascend_testkit.engine import default_runner

    runner = default_runner("simulated")
    two_ranks = host_pool.get(f"simulated-{runner}-cpu0|1-netns", lane="simulated", runner=runner, netns=netns,
                              cpus="0|1")
    pairs = Pairs(two_ranks, netns_host("simulated", 1), str(mla_model))
    yield pairs
    pairs.stop()


@pytest.fixture(scope="module")
def token_ids(prompt_token_ids, mla_model):
    return prompt_token_ids(mla_model, LENGTHS, 7)


def _wait(check, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _delta(after: list[dict], before: list[dict], key: str) -> list[int]:
    return [a[key] - b[key] for a, b in zip(after, before, strict=True)]


def _disaggregate(prefill, decode, token_ids: dict[str, list[int]], tag: str, prefill_tp: int) -> dict:
    """Each prompt alone on the prefill engine (the reference), then prefilled there and decoded on the other engine;
    the outputs and every rank's connector counters before and after."""
    single = prefill.run_requests([{"id": f"single-{tag}-{k}", "prompt_token_ids": ids, "max_tokens": MAX_TOKENS}
                                   for k, ids in token_ids.items()])
    prefill.call("reset_prefix_cache")
    run = {"free_before": prefill.call("free_blocks"), "prefill_before": prefill.rpc(STATS),
           "decode_before": decode.rpc(STATS)}
    firsts = prefill.run_requests([{"id": f"p-{tag}-{k}", "prompt_token_ids": ids, "max_tokens": 1,
                                    "kv_transfer_params": {"do_remote_decode": True, "transfer_id": f"{tag}-{k}"}}
                                   for k, ids in token_ids.items()])
    for first in firsts:
        assert first["kv_transfer_params"]["remote_tp_size"] == prefill_tp
    assert prefill.call("free_blocks") < run["free_before"], "the prefill ranks hold the prompt blocks for the decode"
    outs = decode.run_requests([{"id": f"d-{tag}-{k}", "prompt_token_ids": ids, "max_tokens": MAX_TOKENS,
                                 "kv_transfer_params": first["kv_transfer_params"]}
                                for (k, ids), first in zip(token_ids.items(), firsts, strict=True)])
    # Greedy output of the disaggregated pair equals the prefill engine's own.
    for (k, _), out, ref in zip(token_ids.items(), outs, single, strict=True):
        assert out["token_ids"] == ref["token_ids"], k
    loaded = decode.call("stats")["scheduler"]["loaded_tokens"]
    for k, ids in token_ids.items():  # the whole prompt's latent came over Mooncake, not recomputed
        assert [v for r, v in loaded.items() if r.startswith(f"d-{tag}-{k}")] == [len(ids)], k
    # The prefill ranks free every block soon after the decode finished, none by the abort timeout.
    assert _wait(lambda: all(s["held_now"] == 0 for s in prefill.rpc(STATS)), 10.0), prefill.rpc(STATS)
    run["prefill_after"], run["decode_after"] = prefill.rpc(STATS), decode.rpc(STATS)
    assert _delta(run["prefill_after"], run["prefill_before"], "released_expired") == [0] * prefill_tp
    assert _wait(lambda: prefill.call("free_blocks") == run["free_before"], 10.0)
    return run


def _one_copy(decode, decode_stats: dict, token_ids: dict[str, list[int]], tag: str) -> int:
    """Check one decode rank's pulls: each request's blocks x latent page bytes x layers; returns their sum."""
    layers = decode.rpc("ascend_testkit.kv_probes:layer_kv")[0]
    page_bytes = [BLOCK_SIZE * layer["bytes_per_token"] for layer in layers.values()]
    assert len(page_bytes) >= 2 and set(page_bytes) == {BLOCK_SIZE * LATENT_BYTES}, layers
    total = 0
    for k, ids in token_ids.items():
        pulled = [v for r, v in decode_stats["pulled"].items() if r.startswith(f"d-{tag}-{k}")]
        blocks = -(-len(ids) // BLOCK_SIZE)
        assert len(pulled) == 1 and pulled[0]["ok"] and pulled[0]["blocks"] == blocks, pulled
        assert pulled[0]["nbytes"] == blocks * sum(page_bytes), (k, pulled[0], page_bytes)
        total += blocks * sum(page_bytes)
    return total


def test_tp2_prefill_tp1_decode_reads_one_rank_and_frees_the_other_at_once(pairs, token_ids):
    from ascend_kv_transfer.p2p.rank_groups import plan_reads

    prefill, decode = pairs.get(prefill_tp=2)
    run = _disaggregate(prefill, decode, token_ids, "p2d1", prefill_tp=2)
    [before], [after] = run["decode_before"], run["decode_after"]
    expected = _one_copy(decode, after, token_ids, "p2d1")
    assert after["bytes_pulled"] - before["bytes_pulled"] == expected  # one copy, not one per prefill rank
    assert after["pulls_ok"] - before["pulls_ok"] == len(token_ids)
    assert after["pulls_failed"] == before["pulls_failed"]
    # Each transfer was read from the rank the plan names (both ranks serve some); the other rank heard "unread".
    sources = [plan_reads(0, 1, 2, replicated=True, transfer_id=f"p2d1-{k}").source for k in token_ids]
    read_from = [sources.count(rank) for rank in range(2)]
    assert all(read_from), read_from
    assert _delta(run["prefill_after"], run["prefill_before"], "released_done") == read_from
    assert _delta(run["prefill_after"], run["prefill_before"], "released_unread") == [
        len(token_ids) - n for n in read_from]


def test_tp1_prefill_tp2_decode_both_ranks_read_the_one_prefill_rank(pairs, token_ids):
    prefill, decode = pairs.get(prefill_tp=1)
    run = _disaggregate(prefill, decode, token_ids, "p1d2", prefill_tp=1)
    assert len(run["decode_after"]) == 2
    for before, after in zip(run["decode_before"], run["decode_after"], strict=True):
        expected = _one_copy(decode, after, token_ids, "p1d2")
        assert after["bytes_pulled"] - before["bytes_pulled"] == expected  # each decode rank: one copy
        assert after["pulls_ok"] - before["pulls_ok"] == len(token_ids)
        assert after["pulls_failed"] == before["pulls_failed"]
    # The prefill rank freed each transfer once, after both readers reported (none "unread").
    assert _delta(run["prefill_after"], run["prefill_before"], "released_done") == [len(token_ids)]
    assert _delta(run["prefill_after"], run["prefill_before"], "released_unread") == [0]
