"""Scenarios run inside a loopback-only namespace against a real `mooncake_master`, without a vLLM engine.

`python store_scenarios.py <scenario|all> <master port> [<log dir>]`: the pool's scheduler and worker halves (real
Mooncake Store clients, real vLLM `Request` objects, KV caches as CPU tensors) are driven directly; the last stdout
line is one JSON object of what happened, for tests/kv_pool/test_store_loopback.py to assert on.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from ascend_kv_transfer.pool.keys import PoolKeys
from ascend_kv_transfer.pool.options import parse_store_options
from ascend_kv_transfer.pool.scheduler_side import PoolScheduler, PoolTransfer
from ascend_kv_transfer.pool.store_client import StoreClient
from ascend_kv_transfer.pool.worker_side import PoolWorker
from ascend_kv_transfer.ranks import RankCoords

BLOCK = 16  # tokens per block
NUM_BLOCKS = 192
LAYERS = ("layers.0", "layers.1")
PAGE_SHAPE = (2, 8, 1024)  # 64 KiB float32 pages: one object is 128 KiB


def _die_with_parent() -> None:
    """The master is killed with this process, even if a scenario crashes it (PR_SET_PDEATHSIG = SIGKILL)."""
    import ctypes
    import signal

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def start_master(port: int, log: Path, attempts: int = 3, **flags) -> subprocess.Popen:
    """A mooncake_master on 127.0.0.1:`port`, listening. A master that exits while starting (seen once in CI: it
    logged its start, then stopped 0.1 s later) is started again, up to `attempts` times, each within 20 s."""
    import socket

    binary = Path(sys.executable).with_name("mooncake_master")
    argv = [str(binary), f"--rpc_port={port}", "--rpc_address=127.0.0.1", f"--metrics_port={port + 1}",
            "--metrics_host=127.0.0.1", *[f"--{k}={v}" for k, v in flags.items()]]
    for attempt in range(1, attempts + 1):
        proc = subprocess.Popen(argv, stdout=open(log, "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115
                                preexec_fn=_die_with_parent)
        deadline = time.monotonic() + 20
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return proc
            except OSError:
                time.sleep(0.1)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        print(f"master on {port}: attempt {attempt} did not start (exit {proc.returncode})", file=sys.stderr)
        time.sleep(1)
    raise RuntimeError(f"master on {port} did not start in {attempts} attempts (log {log})")


def options(port: int, segment: str = "64MiB"):
    return parse_store_options({"master_server_address": f"127.0.0.1:{port}", "global_segment_size": segment,
                                "inline_load_max_bytes": 1 << 20})


def kv_caches(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {name: torch.rand((NUM_BLOCKS, *PAGE_SHAPE), generator=gen) for name in LAYERS}


def make_worker(opts, caches, keys, save_wait_timeout_s: float = 30.0) -> PoolWorker:
    worker = PoolWorker(client=StoreClient(opts, contribute=True, name="worker"), keys=keys, rank=RankCoords(),
                        layer_groups=dict.fromkeys(LAYERS, 0), layer_order={0: list(LAYERS)},
                        num_blocks=NUM_BLOCKS, inline_load_max_bytes=opts.inline_load_max_bytes,
                        save_wait_timeout_s=save_wait_timeout_s)
    worker.register_kv_caches(caches)
    return worker


def make_scheduler(opts, keys, save_output_blocks=False) -> PoolScheduler:
    return PoolScheduler(client=StoreClient(opts, contribute=False, name="scheduler"), keys=keys,
                         ranks=[RankCoords()], groups=[0], block_size=BLOCK, save=True,
                         save_output_blocks=save_output_blocks)


def request(req_id: str, num_tokens: int, offset: int = 0):
    from vllm import SamplingParams
    from vllm.v1.request import Request

    return Request(req_id, [(offset + 7 * i) % 997 for i in range(num_tokens)], SamplingParams(max_tokens=8), None)


def drain(worker: PoolWorker, want_recv: set[str] = frozenset(), want_send: set[str] = frozenset(),
          timeout: float = 30.0) -> tuple[set[str], set[str], set[int]]:
    sent, recv, invalid = set(), set(), set()
    deadline = time.monotonic() + timeout
    while not (want_recv <= recv and want_send <= sent):
        if time.monotonic() > deadline:
            raise TimeoutError(f"recv {recv} / sent {sent} after {timeout} s")
        s, r = worker.get_finished()
        sent |= s
        recv |= r
        invalid |= worker.load_failures.take_invalid_blocks()
        time.sleep(0.01)
    return sent, recv, invalid


def wait_saves(worker: PoolWorker, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while worker.stats_dict()["pending_saves"]:
        if time.monotonic() > deadline:
            raise TimeoutError("saves still pending")
        time.sleep(0.01)


def same(a: dict, b: dict, a_ids: list[int], b_ids: list[int]) -> bool:
    return all(torch.equal(a[n][i], b[n][j]) for n in LAYERS for i, j in zip(a_ids, b_ids, strict=True))


# ---- scenarios ---------------------------------------------------------------------------------------------------
def roundtrip(port: int, log: Path) -> dict:
    """A saves a request's blocks, the scheduler finds them, B loads them into other blocks: same bytes."""
    master = start_master(port, log)
    keys = PoolKeys("test/roundtrip")
    try:
        opts = options(port)
        src, dst = kv_caches(1), kv_caches(2)
        a, b, sched = make_worker(opts, src, keys), make_worker(opts, dst, keys), make_scheduler(opts, keys)
        req = request("r1", 8 * BLOCK + 5)
        assert sched.get_num_new_matched_tokens(req, 0) == (0, False)
        hashes = sched.hashes.get(req, 8)
        a.start_saves([PoolTransfer("r1", [list(range(8))], hashes)])
        wait_saves(a)
        a.start_saves([PoolTransfer("r1", [list(range(8))], hashes)])  # again: every key is already there
        wait_saves(a)
        a.finish_requests(["r1"])
        sent, _, _ = drain(a, want_send={"r1"})
        # B: 2 blocks computed locally, the pool has the next 6
        req2 = request("r2", 8 * BLOCK + 5)
        tokens, async_load = sched.get_num_new_matched_tokens(req2, 2 * BLOCK)
        blocks = SimpleNamespace(get_block_ids=lambda: ([100 + i for i in range(9)],))
        sched.update_state_after_alloc(req2, blocks, tokens)
        step = sched.build_step(SimpleNamespace(preempted_req_ids=set(), num_scheduled_tokens={},
                                                total_num_scheduled_tokens=0))
        b.start_step(step)
        _, recv, invalid = drain(b, want_recv={"r2"})
        return {"hit_tokens": tokens, "async": async_load, "load_blocks": step.loads[0].block_ids,
                "equal": same(src, dst, list(range(2, 8)), list(range(102, 108))),
                "untouched": same(kv_caches(2), dst, [100, 101, 108], [100, 101, 108]),
                "invalid": sorted(invalid), "sent": sorted(sent), "a": a.stats_dict(), "b": b.stats_dict(),
                "sched": {k: v for k, v in sched.stats.__dict__.items() if k != "per_request_hits"}}
    finally:
        master.kill()


def eviction(port: int, log: Path) -> dict:
    """A tiny pool evicts objects a lookup saw; loading them is a load error for exactly those blocks."""
    master = start_master(port, log, default_kv_lease_ttl=100, eviction_high_watermark_ratio=0.8, eviction_ratio=0.3)
    keys = PoolKeys("test/eviction")
    try:
        src, dst = kv_caches(3), kv_caches(4)
        # The pool is A's 16 MiB segment (128 objects of 128 KiB); B lends nothing.
        a, b = make_worker(options(port, "16MiB"), src, keys), make_worker(options(port, "0"), dst, keys)
        sched = make_scheduler(options(port), keys)
        req = request("fill", 160 * BLOCK + 1)
        hashes = sched.hashes.get(req, 160)
        a.start_saves([PoolTransfer("fill", [list(range(0, 80))], hashes[:80])])
        wait_saves(a)
        first = [keys.key(RankCoords(), 0, h) for h in hashes[:80]]
        present_before = sum(1 for c in a.client.exists(first) if c == 1)
        # Overfill in small steps: the master evicts when a put finds no room, among objects whose lease (granted
        # by puts, gets and lookups alike, 100 ms here) has run out.
        for start in range(80, 160, 10):
            time.sleep(0.3)
            a.start_saves([PoolTransfer("fill", [list(range(start, start + 10))], hashes[start:start + 10])])
            wait_saves(a)
        time.sleep(0.3)
        codes = a.client.exists([keys.key(RankCoords(), 0, h) for h in hashes])
        gone = [i for i, c in enumerate(codes[:80]) if c != 1]  # present before, evicted since
        kept = [i for i, c in enumerate(codes) if c == 1]
        pick = sorted(gone[:4] + kept[:4])
        b.start_loads([PoolTransfer("load", [[10 + j for j in range(len(pick))]], [hashes[i] for i in pick])])
        _, _, invalid = drain(b, want_recv={"load"})
        expect_invalid = sorted(10 + j for j, i in enumerate(pick) if i in gone[:4])
        good = [(i, 10 + j) for j, i in enumerate(pick) if i in kept[:4]]
        return {"present_before": present_before, "evicted": len(gone), "invalid": sorted(invalid),
                "expect_invalid": expect_invalid,
                "good_equal": same(src, dst, [g[0] for g in good], [g[1] for g in good]), "b": b.stats_dict(),
                "a": a.stats_dict()}
    finally:
        master.kill()


def put_raises(port: int, log: Path) -> dict:
    """The store raising on put: the save is counted, the held request is still reported, the pool stays on."""
    master = start_master(port, log)
    keys = PoolKeys("test/raises")
    try:
        opts = options(port)
        caches = kv_caches(5)
        a, sched = make_worker(opts, caches, keys), make_scheduler(opts, keys)
        real = a.client.store

        class Raising:
            def __getattr__(self, name):
                return getattr(real, name)

            def batch_put_from_multi_buffers(self, *args, **kwargs):
                raise RuntimeError("injected: batch_put_from_multi_buffers raised")

        a.client.store = Raising()
        hashes = sched.hashes.get(request("r", 4 * BLOCK), 4)
        a.start_saves([PoolTransfer("r", [[0, 1, 2, 3]], hashes)])
        a.finish_requests(["r"])
        sent, _, _ = drain(a, want_send={"r"})
        after_fault = a.stats_dict()
        a.client.store = real
        a.start_saves([PoolTransfer("r2", [[0, 1, 2, 3]], hashes)])
        wait_saves(a)
        found = sched.get_num_new_matched_tokens(request("r3", 4 * BLOCK + 1), 0)
        return {"sent": sorted(sent), "after_fault": after_fault, "after": a.stats_dict(), "found": found}
    finally:
        master.kill()


def stalled_save(port: int, log: Path) -> dict:
    """A put still running when vLLM, told to wait for the saves (preemption), gave up waiting and reused the blocks:
    what the put read may be the blocks' next owner's bytes, so it must not stay published under the old hashes."""
    master = start_master(port, log)
    keys = PoolKeys("test/stalled")
    try:
        opts = options(port)
        src = kv_caches(7)
        a = make_worker(opts, src, keys, save_wait_timeout_s=0.3)
        b = make_worker(options(port, "0"), kv_caches(8), keys)
        sched = make_scheduler(opts, keys)
        real = a.client.store
        gate_s = 1.5

        class Stalling:  # Mooncake's put, started late: it reads the buffers after the blocks were reused
            def __getattr__(self, name):
                return getattr(real, name)

            def batch_put_from_multi_buffers(self, *args, **kwargs):
                time.sleep(gate_s)
                return real.batch_put_from_multi_buffers(*args, **kwargs)

        a.client.store = Stalling()
        hashes = sched.hashes.get(request("victim", 4 * BLOCK), 4)
        a.start_saves([PoolTransfer("victim", [[0, 1, 2, 3]], hashes)])
        t0 = time.monotonic()
        a.wait_for_saves(["victim"])
        gave_up_s = time.monotonic() - t0
        for name in LAYERS:  # the blocks' next owner writes its KV
            src[name][0:4] = torch.full_like(src[name][0:4], -1.0)
        wait_saves(a, timeout=gate_s + 10)
        names = [keys.key(RankCoords(), 0, h) for h in hashes]
        present = [c == 1 for c in b.client.exists(names)]
        return {"gave_up_s": gave_up_s, "disabled": not a.client.available, "present_after": present,
                "worker": a.stats_dict()}
    finally:
        master.kill()


def master_dies(port: int, log: Path) -> dict:
    """The master killed mid-run: the pool turns off, nothing raises, every request is still reported."""
    master = start_master(port, log)
    keys = PoolKeys("test/dies")
    opts = options(port)
    caches = kv_caches(6)
    a, sched = make_worker(opts, caches, keys), make_scheduler(opts, keys)
    req = request("r", 4 * BLOCK + 1)
    hashes = sched.hashes.get(req, 4)
    a.start_saves([PoolTransfer("r", [[0, 1, 2, 3]], hashes)])
    wait_saves(a)
    hit_before = sched.get_num_new_matched_tokens(req, 0)
    master.kill()
    master.wait(timeout=10)
    t0 = time.monotonic()
    hit_after = sched.get_num_new_matched_tokens(request("r2", 4 * BLOCK + 1), 0)
    lookup_s = time.monotonic() - t0
    a.start_loads([PoolTransfer("load", [[20, 21, 22, 23]], hashes)])
    a.start_saves([PoolTransfer("save", [[0, 1, 2, 3]], hashes)])
    a.finish_requests(["save"])
    sent, recv, invalid = drain(a, want_recv={"load"}, want_send={"save"}, timeout=60)
    a.start_saves([PoolTransfer("later", [[0]], hashes[:1])])
    wait_saves(a)
    return {"hit_before": hit_before, "hit_after": hit_after, "lookup_s": lookup_s, "invalid": sorted(invalid),
            "sent": sorted(sent), "recv": sorted(recv), "scheduler_enabled": sched.client.available,
            "worker": a.stats_dict(), "reason": a.client.disabled_reason or sched.client.disabled_reason}


def save_planning(port: int, log: Path) -> dict:
    """Which blocks the scheduler hands to the workers to save, step by step, with and without output blocks."""
    master = start_master(port, log)
    try:
        out = {}
        for save_output in (False, True):
            sched = make_scheduler(options(port), PoolKeys("test/plan"), save_output_blocks=save_output)
            sched.kv_cache_manager = SimpleNamespace(get_block_ids=lambda req_id: ([40 + i for i in range(8)],))
            req = request("r", 3 * BLOCK + 5)
            sched.update_state_after_alloc(req, None, 0)

            def step(scheduled: int, preempted=(), sched=sched):
                built = sched.build_step(SimpleNamespace(preempted_req_ids=set(preempted),
                                                         num_scheduled_tokens={"r": scheduled},
                                                         total_num_scheduled_tokens=scheduled))
                return [t.block_ids[0] for t in built.saves], built.finished_saves, built.preempted

            steps = [step(3 * BLOCK + 5)]  # the prompt's forward: its 3 full blocks
            req.num_computed_tokens = 3 * BLOCK + 5
            req.append_output_token_ids(list(range(20)))
            steps.append(step(1))  # a decode step filling no block
            req.num_computed_tokens = 4 * BLOCK + 8
            steps.append(step(1))  # the 4th block (prompt tail + output) is full now
            steps.append(step(1, preempted=["r"]))  # preempted: its blocks are recomputed and saved again
            finished = sched.request_finished(req)
            steps.append(step(0))
            out[f"save_output_{save_output}"] = {"steps": steps, "finished": finished,
                                                 "tracked_after": len(sched.hashes)}
        return out
    finally:
        master.kill()


SCENARIOS = {f.__name__: f for f in (roundtrip, eviction, put_raises, master_dies, save_planning, stalled_save)}

if __name__ == "__main__":
    # `all` runs every scenario in this one process (vLLM imports once), each against its own master.
    names = list(SCENARIOS) if sys.argv[1] == "all" else [sys.argv[1]]
    port, logs = int(sys.argv[2]), Path(sys.argv[3]) if len(sys.argv) > 3 else Path("/tmp")
    out = {}
    for i, name in enumerate(names):
        try:
            out[name] = SCENARIOS[name](port + 10 * i, logs / f"master-{name}.log")
        except Exception as e:  # reported, so the other scenarios still run
            out[name] = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(out, default=str), flush=True)
