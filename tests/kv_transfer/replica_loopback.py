"""Real Mooncake agents holding KV that every TP rank shares (MLA's latent) across TP sizes, no vLLM: prints one JSON
line of findings. Run inside a loopback-only network namespace.

    readers   prefill TP=1, decode TP=2: both decode ranks read the one prefill rank, which frees the transfer only
              after the second reader's DONE.
    unread    prefill TP=2, decode TP=1: the decode rank reads the rank `plan_reads` picks and tells the other that
              nobody reads it; that rank frees the transfer at once, even when the notice arrives before its hold.
    split     the same TP=2 -> TP=1 pull without replication (heads split over ranks): refused, naming tp_size.
    ragged    a decode worker (TP=2) told of a TP=3 prefill: that request fails (its blocks are load errors, so vLLM
              recomputes), naming the sizes; the worker goes on.
"""

import json
import time
from concurrent.futures import ThreadPoolExecutor

import msgspec
import torch

from ascend_kv_transfer.kv_regions import describe_kv_caches
from ascend_kv_transfer.options import MooncakeOptions
from ascend_kv_transfer.p2p.agent import MooncakeAgent
from ascend_kv_transfer.p2p.handoff import PullHandoff
from ascend_kv_transfer.p2p.rank_groups import plan_reads
from ascend_kv_transfer.p2p.schema import KVGeometry
from ascend_kv_transfer.p2p.step_driver import StepDriver

LATENT = KVGeometry(block_size=16, dtype="uint8", num_kv_heads=1, head_size=1024, layout="default",
                    tp_replicated=True)
LAYERS, BLOCKS, PAGE = 2, 32, 1024
HOST = "127.0.0.1"


def caches(seed):
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 255, (LAYERS * BLOCKS * PAGE,), dtype=torch.uint8, generator=g)
    return {f"layer{i}": raw[i * BLOCKS * PAGE:(i + 1) * BLOCKS * PAGE].view(BLOCKS, PAGE) for i in range(LAYERS)}


def agent(name, seed, tp_size, port=None, replicated=True, **opts):
    layers = caches(seed)
    geometry = msgspec.structs.replace(LATENT, tp_size=tp_size, tp_replicated=replicated)
    # Generous bounds: on a loaded machine a round trip can stall for seconds; no finding depends on a timeout.
    options = MooncakeOptions(side_channel_port=port or 26500, claim_wait_s=10.0, handshake_timeout_s=10.0,
                              abort_timeout_s=60.0, **opts)
    a = MooncakeAgent(engine_id=name, geometry=geometry, options=options)
    a.register(describe_kv_caches(layers))
    if port is not None:
        a.serve(port)
    return a, layers


class Decode:
    """One decode rank's step driver, driven like an engine loop (bounded)."""

    def __init__(self, cons, producers):
        self.cons, self.producers, self.reports = cons, producers, []
        self.driver = StepDriver(cons, ThreadPoolExecutor(1), inline_read_max_bytes=1 << 30)

    def pull(self, port, tid, local, readers=1):
        self.driver.add(PullHandoff(req_id=tid, transfer_id=tid, address=(HOST, port), local_block_ids=[local],
                                    first_block=0, deadline=time.monotonic() + 10.0, wait_s=10.0, readers=readers))
        return self.run(lambda: self.reports)[-1]

    def run(self, done, bound_s=30.0):
        deadline = time.monotonic() + bound_s
        while time.monotonic() < deadline:
            self.reports.extend(res for _, res in self.driver.advance())
            for p in self.producers:
                p.serve_pending()
            if done() and not self.driver.waiting() and not self.driver.channel.in_flight():
                return done()
            time.sleep(0.001)
        raise TimeoutError(f"hand-offs did not finish within {bound_s:g} s")


def same(c_layers, local, p_layers, remote):
    return all(torch.equal(c_layers[n][local], p_layers[n][remote]) for n in c_layers)


def readers_case(out):
    prod, p_layers = agent("prefill-tp1", 1, tp_size=1, port=26500)
    decodes = []
    for rank in range(2):
        cons, c_layers = agent(f"decode-tp2-r{rank}", 10 + rank, tp_size=2)
        decodes.append((Decode(cons, [prod]), c_layers))
    plans = [plan_reads(r, 2, 1, replicated=True, transfer_id="t1") for r in range(2)]
    prod.holds.hold("t1", "req1", [[3, 4, 5]])
    finished, equal = [], []
    for (decode, c_layers), plan in zip(decodes, plans, strict=True):
        res = decode.pull(26500 + plan.source, "t1", [0, 1, 2], readers=plan.readers)
        equal.append(res.ok and res.nbytes == 3 * LAYERS * PAGE and same(c_layers, [0, 1, 2], p_layers, [3, 4, 5]))
        finished.append(sorted(prod.holds.take_finished_sends()))
    out["readers"] = {"plans": [[p.source, p.readers] for p in plans], "copies_equal": equal,
                      "finished_after_each_reader": finished, "held_now": prod.holds.num_held(),
                      "released_done": prod.stats.released_done}
    for decode, _ in decodes:
        decode.cons.close()
    prod.close()


def unread_case(out):
    prods = [agent(f"prefill-tp2-r{r}", 1, tp_size=2, port=26600 + r) for r in range(2)]  # identical latents
    cons, c_layers = agent("decode-tp1", 20, tp_size=1)
    decode = Decode(cons, [p for p, _ in prods])
    found = {}
    for tid, early in (("t-early", True), ("t-late", False)):
        plan = plan_reads(0, 1, 2, replicated=True, transfer_id=tid)
        [other] = plan.release
        if not early:
            for p, _ in prods:
                p.holds.hold(tid, f"req-{tid}", [[7, 8]])
        notice = decode.driver.release_unread((HOST, 26600 + other), tid)
        decode.run(lambda notice=notice: notice.done)
        if early:  # the notice came first: the hold that lands later is freed at once
            for p, _ in prods:
                p.holds.hold(tid, f"req-{tid}", [[7, 8]])
        unread_freed = sorted(prods[other][0].holds.take_finished_sends())
        held_before_read = prods[plan.source][0].holds.num_held()
        res = decode.pull(26600 + plan.source, tid, [0, 1])
        found[tid] = {"unread_freed": unread_freed, "notice": [type(notice.reply).__name__, repr(notice.error)],
                      "source_held_before_read": held_before_read, "ok": res.ok, "nbytes": res.nbytes,
                      "bytes_equal": same(c_layers, [0, 1], prods[plan.source][1], [7, 8]),
                      "source_freed": sorted(prods[plan.source][0].holds.take_finished_sends())}
    out["unread"] = found
    out["unread_stats"] = [[p.stats.released_done, p.stats.released_unread, p.stats.released_expired,
                            p.holds.num_held()] for p, _ in prods]
    cons.close()
    for p, _ in prods:
        p.close()


def split_case(out):
    prod, _ = agent("prefill-tp2-split", 1, tp_size=2, port=26700, replicated=False)
    cons, _ = agent("decode-tp1-split", 30, tp_size=1, replicated=False)
    prod.holds.hold("t-split", "req-split", [[1]])
    res = Decode(cons, [prod]).pull(26700, "t-split", [0])
    out["split"] = {"ok": res.ok, "error": res.error}
    cons.close()
    prod.close()


def ragged_case(out):
    from ascend_kv_transfer.p2p.scheduler_side import P2PStep, RecvJob
    from ascend_kv_transfer.p2p.worker_side import P2PWorker
    from ascend_kv_transfer.ranks import RankCoords

    geometry = msgspec.structs.replace(LATENT, tp_size=2)
    worker = P2PWorker(engine_id="decode-tp2", role="kv_consumer", options=MooncakeOptions(side_channel_port=26800),
                       ranks=RankCoords(tp_rank=1, tp_size=2), geometry=geometry, num_blocks=BLOCKS,
                       layer_groups={f"layer{i}": 0 for i in range(LAYERS)})
    worker.register_kv_caches(caches(40))
    worker.start_step(P2PStep(recv={"req-r": RecvJob("t-r", (HOST, 26900), "prefill-tp3", [[4, 5]],
                                                     remote_tp_size=3)}))
    sending, recving = worker.get_finished()
    out["ragged"] = {"recving": sorted(recving), "invalid": sorted(worker.load_failures.take_invalid_blocks()),
                     "error": worker.pulled["req-r"].error, "pulls_failed": worker.stats()["pulls_failed"]}
    worker.shutdown()


if __name__ == "__main__":
    findings: dict = {}
    readers_case(findings)
    unread_case(findings)
    split_case(findings)
    ragged_case(findings)
    print(json.dumps(findings), flush=True)
