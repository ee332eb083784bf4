"""Real Mooncake agents (producer and consumers) in one process, no vLLM: prints one JSON line of findings.

Usage: `agent_loopback.py pull|broken|steps|layerwise|guarded SECRET_FILE`; run inside a loopback-only
network namespace.
"""

import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from ascend_kv_transfer.kv_regions import describe_kv_caches
from ascend_kv_transfer.options import MooncakeOptions
from ascend_kv_transfer.p2p.agent import MooncakeAgent
from ascend_kv_transfer.p2p.schema import KVGeometry
from ascend_kv_transfer.p2p.step_driver import StepDriver

GEO = KVGeometry(block_size=16, dtype="uint8", num_kv_heads=1, head_size=4096, layout="LBHNC")
LAYERS, BLOCKS, PAGE = 4, 64, 4096


def caches(seed):
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 255, (LAYERS * BLOCKS * PAGE,), dtype=torch.uint8, generator=g)
    return raw, {f"layer{i}": raw[i * BLOCKS * PAGE:(i + 1) * BLOCKS * PAGE].view(BLOCKS, PAGE) for i in range(LAYERS)}


def agent(name, port, seed, cls=MooncakeAgent, **opts):
    raw, layers = caches(seed)
    a = cls(engine_id=name, geometry=GEO, options=MooncakeOptions(side_channel_port=port, **opts))
    a.register(describe_kv_caches(layers))
    return a, layers


def blocking(a):
    """What tools and benchmarks pull with: a step driver of their own (`StepDriver.pull`), reads on its thread."""
    return StepDriver(a, ThreadPoolExecutor(1), inline_read_max_bytes=a.options.inline_read_max_bytes)


def close(driver):
    driver.close()
    driver.pool.shutdown()


def pull_mode():
    out = {}
    prod, p_layers = agent("producer", 32100, 1, abort_timeout_s=0.5)
    prod.serve(32100)
    cons, c_layers = agent("consumer", 32200, 2, max_batch_entries=3, claim_wait_s=0.5)
    puller = blocking(cons)
    remote = list(range(10, 20)) + list(range(30, 35))
    local = list(range(0, 10)) + list(range(40, 45))
    prod.holds.hold("t1", "req1", [remote])
    res = puller.pull(("127.0.0.1", 32100), "t1", [local])
    out["ok"], out["entries"], out["calls"], out["nbytes"] = res.ok, res.entries, res.calls, res.nbytes
    out["bytes_equal"] = all(torch.equal(c_layers[n][local], p_layers[n][remote]) for n in c_layers)
    out["untouched_equal"] = torch.equal(c_layers["layer0"][20:40], caches(2)[1]["layer0"][20:40])
    time.sleep(0.05)
    out["finished_after_done"] = sorted(prod.holds.take_finished_sends())
    again = puller.pull(("127.0.0.1", 32100), "t1", [local])
    out["second_pull_error"] = again.error
    prod.holds.hold("t2", "req2", [remote])
    time.sleep(0.7)
    out["finished_after_timeout"] = sorted(prod.holds.take_finished_sends())
    late = puller.pull(("127.0.0.1", 32100), "t2", [local])
    out["late_pull_error"] = late.error
    print(json.dumps(out), flush=True)
    close(puller)
    cons.close()
    prod.close()


def broken_mode():
    # Mooncake is told (env) to queue 4 transfers per peer; the consumer is told the limit is 1024 so its batch of
    # 64 page-sized entries overflows the queue: the peer must be reported broken and not retried.
    out = {}
    prod, _ = agent("producer", 32300, 1)
    prod.serve(32300)
    cons, _ = agent("consumer", 32400, 2, max_batch_entries=64)
    puller = blocking(cons)
    ids = list(range(0, 64, 2))
    prod.holds.hold("t1", "req1", [ids])
    prod.holds.hold("t2", "req2", [ids])
    first = puller.pull(("127.0.0.1", 32300), "t1", [ids])
    out["first_ok"], out["first_error"] = first.ok, first.error
    start = time.monotonic()
    second = puller.pull(("127.0.0.1", 32300), "t2", [ids])
    out["second_ok"], out["second_error"], out["second_s"] = second.ok, second.error, time.monotonic() - start
    out["released"] = sorted(prod.holds.take_finished_sends())
    print(json.dumps(out), flush=True)
    close(puller)
    cons.close()
    prod.close()


def steps_mode():
    """Step-driven pulls (the decode worker's path) against a producer whose engine loop is simulated here."""
    from ascend_kv_transfer.p2p.handoff import PullHandoff

    out = {}
    prod, p_layers = agent("producer", 32500, 1, abort_timeout_s=0.3)
    prod.serve(32500)
    cons, c_layers = agent("consumer", 32600, 2, claim_wait_s=2.0, handshake_timeout_s=0.5)
    pool = ThreadPoolExecutor(1)
    reports = []
    pulls = StepDriver(cons, pool, inline_read_max_bytes=1 << 20)
    address = ("127.0.0.1", 32500)

    def handoff(req, tid, local, at=address):
        return PullHandoff(req_id=req, transfer_id=tid, address=at, local_block_ids=[local], first_block=0,
                           deadline=time.monotonic() + 2.0, wait_s=2.0)

    def run_until(n_reports, steps=5000):
        for _ in range(steps):  # an engine loop: connector calls every ~1 ms, bounded
            reports.extend((h.req_id, res) for h, res in pulls.advance())
            prod.serve_pending()
            if len(reports) >= n_reports and not pulls.waiting():
                return
            time.sleep(0.001)
        raise TimeoutError(f"{len(reports)} of {n_reports} pulls reported")

    def run_steps(steps):
        for _ in range(steps):
            reports.extend((h.req_id, res) for h, res in pulls.advance())
            prod.serve_pending()
            time.sleep(0.001)

    def same(local, remote):
        return all(torch.equal(c_layers[n][local], p_layers[n][remote]) for n in c_layers)

    # Two pulls to a peer never met (two handshakes in flight), both claimed before the prefill holds anything.
    pulls.add(handoff("a", "ta", [0, 1, 2]))
    pulls.add(handoff("b", "tb", [5, 6]))
    run_steps(20)
    out["waiting_before_hold"] = pulls.waiting()
    prod.holds.hold("ta", "req-a", [[10, 11, 12]])
    prod.holds.hold("tb", "req-b", [[20, 21]])
    run_until(2)
    out["early_claims"] = {req: [res.ok, res.error] for req, res in reports}
    out["early_bytes_equal"] = same([0, 1, 2], [10, 11, 12]) and same([5, 6], [20, 21])
    out["inline_reads"] = pulls.inline_reads
    run_steps(50)
    out["released_after_done"] = sorted(prod.holds.take_finished_sends())

    # Over the inline size: the read goes to the thread and still lands.
    reports.clear()
    pulls.inline_read_max_bytes = 0
    prod.holds.hold("tc", "req-c", [[30, 31, 32, 33]])
    pulls.add(handoff("c", "tc", [40, 41, 42, 43]))
    run_until(1)
    out["background"] = [reports[0][1].ok, pulls.background_reads, same([40, 41, 42, 43], [30, 31, 32, 33])]

    # Held past abort_timeout_s before the decode came: expired, reported as a failure, once.
    reports.clear()
    prod.holds.hold("td", "req-d", [[50]])
    time.sleep(0.4)
    prod.holds.take_finished_sends()
    pulls.add(handoff("d", "td", [60]))
    run_until(1)
    out["expired"] = [len(reports), reports[0][1].ok, reports[0][1].error]

    # Nobody at the address: the handshake times out (handshake_timeout_s), reported, no hang.
    reports.clear()
    dead = ("127.0.0.1", 32700)
    pulls.add(handoff("e", "te", [1], at=dead))
    start = time.monotonic()
    run_until(1)
    out["dead_peer"] = [reports[0][1].ok, reports[0][1].error, time.monotonic() - start]

    # The producer registers its KV memory again (as after sleep/wake): what it held is freed, and a consumer that
    # met it before learns from the claim's epoch that its cached regions are stale and handshakes again.
    reports.clear()
    prod.holds.hold("tg", "req-g", [[1]])
    pulls.add(handoff("g", "tg", [2]))
    run_until(1)
    epoch_before = cons.peers.known(address).epoch
    prod.holds.hold("th", "req-h", [[3]])
    prod.register(describe_kv_caches(p_layers))
    prod.holds.hold("tf", "req-f", [[7, 8]])
    pulls.add(handoff("h", "th", [4]))
    pulls.add(handoff("f", "tf", [17, 18]))
    run_until(3)
    run_steps(50)  # the DONE notices reach the producer
    by_req = {req: res for req, res in reports}
    out["reregistered"] = {"epochs": [epoch_before, prod.epoch, cons.peers.known(address).epoch],
                           "held_freed": [by_req["h"].ok, by_req["h"].error],
                           "after": [by_req["f"].ok, by_req["f"].error, same([17, 18], [7, 8])],
                           "released": sorted(prod.holds.take_finished_sends())}
    print(json.dumps(out), flush=True)
    pulls.close()
    pool.shutdown()
    cons.close()
    prod.close()


class Gate:
    """Stands in for a device event: the layer's KV counts as written once the gate opens."""

    def __init__(self):
        self.event = threading.Event()

    def wait(self, timeout_s):
        return self.event.wait(timeout_s)


def layerwise_mode():
    """The prefill side of the layerwise push: the caller never waits for a write, a write waits for its layer's
    KV to be written, and a write held up for one decode peer holds up no other peer; decode sides run push
    hand-offs on a simulated engine loop."""
    from ascend_kv_transfer.p2p.handoff import PushHandoff
    from ascend_kv_transfer.p2p.layer_written import WRITTEN
    from ascend_kv_transfer.p2p.layerwise_agent import LayerwiseAgent

    out = {}
    prod, p_layers = agent("producer", 32800, 1, cls=LayerwiseAgent)
    prod.serve(32800)
    address = ("127.0.0.1", 32800)
    consumers, drivers, reports = {}, {}, []
    for name, seed in (("slow", 2), ("fast", 3)):
        consumers[name] = agent(name, 32810 + seed, seed, cls=LayerwiseAgent)
        drivers[name] = StepDriver(consumers[name][0], None, inline_read_max_bytes=0)
    src, dst = {"slow": [4, 5, 6], "fast": [10, 11]}, {"slow": [20, 21, 22], "fast": [30, 31]}
    for name, driver in drivers.items():
        driver.add(PushHandoff(req_id=name, transfer_id=f"t-{name}", address=address, local_block_ids=[dst[name]],
                               first_block=0, deadline=time.monotonic() + 10, wait_s=10))

    def loop(until, steps=3000):
        for _ in range(steps):  # engine loops: connector calls every ~1 ms, bounded
            for driver in drivers.values():
                reports.extend((h.req_id, res.ok, res.error) for h, res in driver.advance())
            prod.serve_pending()
            if until():
                return True
            time.sleep(0.001)
        return False

    def landed(name):
        c_layers = consumers[name][1]
        return all(torch.equal(c_layers[n][dst[name]], p_layers[n][src[name]]) for n in c_layers)

    out["destinations_known"] = loop(lambda: len(prod.known_destinations()) == 2)
    gate = Gate()
    for i in range(LAYERS):  # the forward pass: one call per layer, the slow peer's layers not written yet
        prod.push_layer("t-slow", f"layer{i}", [src["slow"]], 0, 2, gate)
        prod.push_layer("t-fast", f"layer{i}", [src["fast"]], 0, 1, WRITTEN)
    prod.finish("t-slow", [src["slow"]])
    prod.finish("t-fast", [src["fast"]])
    out["fast_landed_while_slow_waits"] = loop(lambda: len(reports) == 1)
    out["reports_before_gate"] = list(reports)
    out["slow_bytes_before_gate"] = landed("slow")
    out["fast_bytes"] = landed("fast")
    out["queued_before_gate"] = prod.writes_queued()
    gate.event.set()
    out["slow_landed_after_gate"] = loop(lambda: len(reports) == 2)
    out["slow_bytes"] = landed("slow")
    out["reports"] = sorted(reports)
    out["layer_pushes"] = prod.layer_pushes
    out["writer_threads"] = prod.writers.peers()
    print(json.dumps(out), flush=True)
    for driver in drivers.values():
        driver.close()
    for c, _ in consumers.values():
        c.close()
    prod.close()


def guarded_mode():
    """A producer whose side channel has a secret: strangers get nothing, holders of the secret pull, and a router's
    release frees an unclaimed transfer at once while a claimed one is left to its reader."""
    from ascend_kv_transfer.p2p import schema
    from ascend_kv_transfer.p2p.release import release_transfer
    from ascend_kv_transfer.p2p.side_channel import SideChannelClient, SideChannelTimeout
    from ascend_kv_transfer.p2p.side_channel_auth import SideChannelAuth

    secret_file = sys.argv[2]
    out = {}
    prod, p_layers = agent("producer", 32900, 1, abort_timeout_s=30.0, side_channel_secret_file=secret_file)
    prod.serve(32900)
    address = ("127.0.0.1", 32900)
    remote, local = list(range(10, 14)), list(range(0, 4))
    stranger = SideChannelClient(0.5)
    try:
        stranger.request(address, schema.MetadataRequest(requester="stranger"))
        out["stranger"] = "answered"
    except SideChannelTimeout:
        out["stranger"] = "no answer"
    forged = SideChannelClient(0.5, auth=SideChannelAuth(b"not-the-secret-of-this-deployment"))
    try:
        forged.request(address, schema.ReleaseRequest(transfer_id="t0"))
        out["forged"] = "answered"
    except SideChannelTimeout:
        out["forged"] = "no answer"
    out["refused"] = prod.refused()
    cons, c_layers = agent("consumer", 33000, 2, claim_wait_s=0.5, side_channel_secret_file=secret_file)
    puller = blocking(cons)
    prod.holds.hold("t1", "req1", [remote])
    res = puller.pull(address, "t1", [local])
    out["pull_ok"] = res.ok
    out["bytes_equal"] = all(torch.equal(c_layers[n][local], p_layers[n][remote]) for n in c_layers)
    time.sleep(0.05)
    out["after_pull"] = sorted(prod.holds.take_finished_sends())
    auth = SideChannelAuth.from_file(secret_file)
    params = {"do_remote_prefill": True, "transfer_id": "t2", "remote_host": "127.0.0.1", "remote_port": 32900,
              "remote_workers": 1}
    prod.holds.hold("t2", "req2", [remote])
    out["release_unclaimed"] = release_transfer(params, reason="decode failed", timeout_s=2.0, auth=auth)
    out["after_release"] = sorted(prod.holds.take_finished_sends())
    out["late_claim"] = puller.pull(address, "t2", [local]).error
    prod.holds.hold("t3", "req3", [remote])
    claimer = SideChannelClient(2.0, auth=auth)
    claim = claimer.request(address, schema.ClaimRequest(transfer_id="t3", requester="decode"))
    out["claimed"] = claim.status == schema.ClaimStatus.OK
    out["release_claimed"] = release_transfer(params | {"transfer_id": "t3"}, reason="decode failed",
                                              timeout_s=2.0, auth=auth)
    out["held_claimed"] = prod.holds.num_held()
    out["release_early"] = release_transfer(params | {"transfer_id": "t4"}, reason="before the hold",
                                            timeout_s=2.0, auth=auth)
    prod.holds.hold("t4", "req4", [remote])
    out["after_early_hold"] = sorted(prod.holds.take_finished_sends())
    out["unsigned_release"] = release_transfer(params | {"transfer_id": "t3"}, reason="x", timeout_s=0.5)
    out["stats"] = prod.stats.as_dict()
    print(json.dumps(out), flush=True)
    for c in (stranger, forged, claimer):
        c.close()
    close(puller)
    cons.close()
    prod.close()


if __name__ == "__main__":
    {"pull": pull_mode, "broken": broken_mode, "steps": steps_mode, "layerwise": layerwise_mode,
     "guarded": guarded_mode}[sys.argv[1]]()
