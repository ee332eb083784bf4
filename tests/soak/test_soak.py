"""Soak: `ascend-vllm router` in front of one prefill and two decode servers (AscendMooncakeConnector, the side
channel sealed with a shared secret), under steady concurrent load while faults land on a schedule: a decode server
stalls (SIGSTOP) and resumes, a decode server is killed and started again, the prefill server is killed and started
again. Every request must either return the single server's answer or an error that names a server (or says which
role has none); afterwards every server's KV is free again and the servers that were never restarted hold no more
file descriptors or threads than before the load (the router: at most its release executor's threads more).

Bounded: each phase has a deadline; the whole test stays within SOAK_BOUND_S. Figures (requests sent, completed,
named errors, p50/p99 latency, footprints) are printed for the closing note.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import statistics
import threading
import time

import httpx
import pytest

from ascend_testkit.models.tiny_llama import prompt_of_length

pytestmark = [pytest.mark.engine, pytest.mark.mooncake]

ROUTER, PREFILL, DECODES = 8000, 8100, (8200, 8201)
SIDE = {"prefill": 30300, "decode0": 30400, "decode1": 30500}
KV = {"abort_timeout_s": 20.0, "handshake_timeout_s": 2.0, "claim_wait_s": 3.0}
ROUTER_ARGS = ["--health-interval", "1", "--health-timeout", "2", "--read-timeout", "30", "--prefill-timeout", "30",
               "--release-timeout", "2"]
CLIENTS = 4
ERROR_PAUSE_S = 0.5
PROMPTS = [prompt_of_length(40 + 29 * i, offset=4000 + 97 * i) for i in range(8)]
MAX_TOKENS = 16
STALL_S = 3.0
STEADY_AFTER_S = 8.0  # load kept up after the last restart, before it stops
SOAK_BOUND_S = 420.0
WARM_ROUNDS = 5  # warm-up rounds at most, until decode0's descriptors hold still
SECRET = "4c9b1f0e7a2d5c8b3e6f9a1d4c7b0e2f5a8d1c4b7e0f3a6d"


class Deployment:
    def __init__(self, netns, model, logs, secret_file):
        self.netns, self.model, self.logs, self.secret_file = netns, model, logs, secret_file
        self.servers: dict[str, object] = {}
        self.restarts = 0

    def start(self, name: str, wait: bool = True):
        from ascend_testkit.servers import p2p_kv_config, start_serve

        role, port = ("kv_producer", PREFILL) if name == "prefill" else ("kv_consumer", DECODES[int(name[-1])])
        kv = p2p_kv_config(role, SIDE[name], name, side_channel_secret_file=str(self.secret_file), **KV)
        tag = f"{name}-{self.restarts}" if name in self.servers else name
        server = start_serve(tag, self.model, port, log_dir=self.logs, cpu=0 if name == "prefill" else 1,
                             netns=self.netns, kv_transfer_config=kv)
        self.servers[name] = server
        if wait:
            server.wait_healthy(timeout=300)
        return server

    def restart(self, name: str) -> float:
        t0 = time.monotonic()
        self.servers[name].kill()
        self.restarts += 1
        self.start(name)
        return time.monotonic() - t0

    def close(self) -> None:
        for server in self.servers.values():
            server.close()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, tiny_model):
    from ascend_testkit.netns import LoopbackNamespace
    from ascend_testkit.servers import start_router

    logs = tmp_path_factory.mktemp("soak")
    secret_file = logs / "side-channel.secret"
    secret_file.write_text(SECRET)
    os.chmod(secret_file, 0o600)
    ns = LoopbackNamespace()
    dep = Deployment(ns, tiny_model, logs, secret_file)
    try:
        for name in ("prefill", "decode0", "decode1"):
            dep.start(name, wait=False)
        for server in list(dep.servers.values()):
            server.wait_healthy(timeout=300)
        dep.servers["router"] = start_router(
            "router", ROUTER, prefill=[f"http://127.0.0.1:{PREFILL}"],
            decode=[f"http://127.0.0.1:{p}" for p in DECODES], log_dir=logs, netns=ns,
            args=[*ROUTER_ARGS, "--side-channel-secret-file", str(secret_file)])
        dep.servers["router"].wait_healthy(timeout=60)
        yield dep
    finally:
        dep.close()
        ns.close()


def _body(i: int, stream: bool) -> dict:
    body = {"model": "tiny", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": stream}
    return body


async def _one(client: httpx.AsyncClient, i: int, stream: bool) -> dict:
    t0 = time.monotonic()
    out = {"i": i, "stream": stream, "t": t0}
    try:
        if not stream:
            resp = await client.post("/v1/completions", json=_body(i, False))
            data = resp.json()
            out |= {"status": resp.status_code}
            if resp.status_code == 200:
                out["text"] = data["choices"][0]["text"]
            else:
                out["error"] = data.get("error", {}).get("message", json.dumps(data)[:300])
        else:
            async with client.stream("POST", "/v1/completions", json=_body(i, True)) as resp:
                out["status"] = resp.status_code
                if resp.status_code != 200:
                    out["error"] = json.loads(await resp.aread()).get("error", {}).get("message", "")
                else:
                    pieces, error = [], None
                    async for line in resp.aiter_lines():
                        if line.startswith("data: ") and line != "data: [DONE]":
                            event = json.loads(line[len("data: "):])
                            if "error" in event:
                                error = event["error"]["message"]
                            elif event.get("choices"):
                                pieces.append(event["choices"][0]["text"])
                    out["text" if error is None else "error"] = "".join(pieces) if error is None else error
    except httpx.HTTPError as exc:  # the router itself failing to answer in time: never acceptable
        out |= {"status": -1, "error": f"client: {type(exc).__name__}: {exc}"}
    out["seconds"] = time.monotonic() - t0
    return out


def _kv_usage(server) -> float | None:
    status, body = server.get("/metrics")
    if status != 200:
        return None
    for line in body.decode().splitlines():
        if line.startswith("vllm:kv_cache_usage_perc"):
            return float(line.rsplit(" ", 1)[1])
    return None


def _wait_idle(dep: Deployment, timeout_s: float) -> dict:
    """Every server's KV free and the router with nothing in flight, within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        usage = {n: _kv_usage(s) for n, s in dep.servers.items() if n != "router"}
        status = dep.servers["router"].get_json("/status")
        if all(u == 0 for u in usage.values()) and status["inflight"] == 0 and status["queued"] == 0:
            return {"kv_usage": usage, "router": status}
        if time.monotonic() > deadline:
            return {"kv_usage": usage, "router": status, "timed_out": True}
        time.sleep(0.25)


def _settled_footprints(dep: Deployment, names: tuple[str, ...], seconds: float = 5.0) -> dict[str, dict]:
    """Each server's footprint at its quietest over `seconds` of idle (per fd kind, the least seen): the router's
    pooled upstream connections close after its keep-alive (3 s) and its health checks open them again, so a single
    sample catches a timing-dependent few; a leak holds its descriptors in every sample."""
    samples = []
    deadline = time.monotonic() + seconds
    while not samples or time.monotonic() < deadline:
        samples.append({n: dep.servers[n].footprint() for n in names})
        time.sleep(0.5)
    quiet = {}
    for n in names:
        kinds = {k for sample in samples for k in sample[n]["fd_kinds"]}
        fd_kinds = {k: min(s[n]["fd_kinds"].get(k, 0) for s in samples) for k in kinds}
        quiet[n] = dict(samples[-1][n], fd_kinds=fd_kinds, fds=sum(fd_kinds.values()),
                        threads=min(s[n]["threads"] for s in samples))
    return quiet


def test_soak_with_faults(deployment):
    from ascend_testkit.servers import inside

    dep = deployment
    with inside(dep.netns):
        reference = _reference(dep)
        # Warm until decode0's descriptors stop growing: its transfer sessions to the prefill open lazily, as
        # concurrent pulls first need them (a baseline taken before they all exist once read as 3 leaked pipes and
        # sockets on a loaded machine, CI of this stop, while another run's baseline already held them).
        seen = None
        for _ in range(WARM_ROUNDS):
            warm = asyncio.run(_load(dep, seconds=4.0))
            assert all(r.get("text") == reference[r["i"] % len(PROMPTS)] for r in warm), warm
            _wait_idle(dep, 30)
            now = _settled_footprints(dep, ("decode0",), seconds=2.0)["decode0"]["fd_kinds"]
            if now == seen:
                break
            seen = now
        _failed_decode_leg(dep)  # the router's release path (its side-channel client) is part of the baseline
        idle_before = _wait_idle(dep, 30)
        assert not idle_before.get("timed_out"), idle_before
        keep = ("router", "decode0")  # never restarted: their footprints must come back
        before = _settled_footprints(dep, keep)
        results, faults = _soak(dep)
        idle_after = _wait_idle(dep, KV["abort_timeout_s"] + 20)
        after = _settled_footprints(dep, keep)
        # A fault-free round after it: whatever the faults left must not grow with plain traffic (a leak would).
        calm = asyncio.run(_load(dep, seconds=4.0))
        assert not _wait_idle(dep, 30).get("timed_out")
        after_calm = _settled_footprints(dep, keep)
        router_status = dep.servers["router"].get_json("/status")

    ok = [r for r in results if r.get("text") is not None]
    errors = [r for r in results if r.get("text") is None]
    latencies = sorted(r["seconds"] for r in ok)
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else None
    print(f"soak: {len(results)} requests, {len(ok)} completed, {len(errors)} named errors "
          f"({sorted({r['status'] for r in errors})}), p50 {statistics.median(latencies):.2f} s, p99 {p99:.2f} s; "
          f"faults {faults}; footprint before {before} after {after} after a calm round {after_calm}; "
          f"kv releases {router_status['kv_releases']}")

    wrong = [r for r in ok if r["text"] != reference[r["i"] % len(PROMPTS)]]
    assert not wrong, f"{len(wrong)} answers differ from the single server's: {wrong[:3]}"
    unnamed = [r for r in errors if r["status"] not in (200, 502, 503, 504)
               or not ("http://127.0.0.1:" in r["error"] or "no healthy" in r["error"] or "unavailable" in r["error"])]
    assert not unnamed, f"errors that name no server: {unnamed[:5]}"
    # Requests fail while the only prefill server is down (named 503s); the rest of the time they complete.
    assert len(ok) > 40, (len(ok), len(results))
    healthy_again = [r for r in results if r["t"] > faults["all_healthy_at"]]
    assert healthy_again and all(r.get("text") is not None for r in healthy_again[CLIENTS:]), healthy_again[:8]
    assert max(r["seconds"] for r in results) < 60, "a request waited past the router's bounds"
    assert not idle_after.get("timed_out"), f"not idle after the soak: {idle_after}"
    assert all(r.get("text") == reference[r["i"] % len(PROMPTS)] for r in calm), calm
    for name in keep:  # plain traffic after the faults adds nothing beyond what either idle measurement held
        # (each measured at its quietest over a few idle seconds: see _settled_footprints)
        ceiling = {k: max(before[name]["fd_kinds"].get(k, 0), after[name]["fd_kinds"].get(k, 0))
                   for k in {*before[name]["fd_kinds"], *after[name]["fd_kinds"]}}
        assert all(n <= ceiling.get(k, 0) for k, n in after_calm[name]["fd_kinds"].items()), \
            (name, before, after, after_calm)
        assert after_calm[name]["threads"] <= max(before[name]["threads"], after[name]["threads"]), \
            (name, before, after, after_calm)
    # Against the baseline: the decode server that stalled holds what it held; the router at most the threads its
    # release pool starts under concurrent failures (RELEASE_THREADS, one of them in the baseline) and their fds.
    from ascend_vllm.router.proxy import RELEASE_THREADS

    # The decode server's sockets to the prefill are made anew when it restarts (Mooncake's and the side channel's
    # sessions; measured +4 in CI, +0 locally) and the calm round above shows they do not grow with traffic.
    grown = {k: after["decode0"]["fd_kinds"].get(k, 0) - v for k, v in before["decode0"]["fd_kinds"].items()}
    assert all(n <= 0 for k, n in grown.items() if k != "socket") and grown.get("socket", 0) <= 4, (before, after)
    assert after["decode0"]["threads"] <= before["decode0"]["threads"] + 2, (before, after)
    assert after["router"]["threads"] <= before["router"]["threads"] + RELEASE_THREADS - 1, (before, after)
    assert after["router"]["fds"] <= before["router"]["fds"] + 2, (before, after)


def _failed_decode_leg(dep: Deployment) -> None:
    """One request whose decode leg the decode server refuses (min_tokens above max_tokens; the prefill request drops
    min_tokens): the router releases the prefill's KV over the sealed side channel."""
    body = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 4, "min_tokens": 8, "temperature": 0}
    resp = httpx.post(dep.servers["router"].url + "/v1/completions", json=body, timeout=60)
    released = resp.headers.get("x-router-release")
    assert resp.status_code == 400 and released == "the prefill's KV blocks were released", \
        (resp.status_code, dict(resp.headers), resp.text[:300])


def _wait_router_healthy(dep: Deployment, timeout_s: float) -> None:
    """Until the router's health checks have put every server back (its /health is 200)."""
    deadline = time.monotonic() + timeout_s
    while dep.servers["router"].get("/health")[0] != 200:
        assert time.monotonic() < deadline, dep.servers["router"].get_json("/status")
        time.sleep(0.2)


def _reference(dep: Deployment) -> list[str]:
    """Each prompt's greedy answer from the prefill server alone (no disaggregation)."""
    out = []
    with httpx.Client(base_url=dep.servers["prefill"].url, timeout=60) as client:
        for prompt in PROMPTS:
            resp = client.post("/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS,
                                                        "temperature": 0, "ignore_eos": True})
            assert resp.status_code == 200, resp.text
            out.append(resp.json()["choices"][0]["text"])
    return out


async def _load(dep: Deployment, *, seconds: float | None = None, stop: threading.Event | None = None) -> list[dict]:
    results: list[dict] = []
    deadline = time.monotonic() + (seconds if seconds is not None else SOAK_BOUND_S)
    rng = random.Random(0)
    counter = iter(range(10**9))

    async def client_loop(client):
        while time.monotonic() < deadline and not (stop is not None and stop.is_set()):
            i = next(counter)
            result = await _one(client, i, stream=rng.random() < 0.5)
            results.append(result)
            if result.get("text") is None:
                await asyncio.sleep(ERROR_PAUSE_S)  # as a client would before trying again

    timeout = httpx.Timeout(90.0)
    async with httpx.AsyncClient(base_url=dep.servers["router"].url, timeout=timeout) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(CLIENTS)))
    return results


def _soak(dep: Deployment) -> tuple[list[dict], dict]:
    """The load on a thread of its own, the faults on this one: a server started again must be started by a thread
    that outlives it (its parent-death signal fires when the starting thread ends, as an executor's thread would)."""
    stop = threading.Event()
    faults: dict[str, float] = {}
    box: dict[str, list[dict]] = {}
    loader = threading.Thread(target=lambda: box.setdefault("results", asyncio.run(_load(dep, stop=stop))),
                              name="soak-load")
    loader.start()
    try:
        time.sleep(3)
        dep.servers["decode0"].signal(signal.SIGSTOP)  # a peer that stalls mid-work
        time.sleep(STALL_S)
        dep.servers["decode0"].signal(signal.SIGCONT)
        faults["decode0_stalled_s"] = STALL_S
        time.sleep(3)
        faults["decode1_restart_s"] = round(dep.restart("decode1"), 1)
        time.sleep(3)
        faults["prefill_restart_s"] = round(dep.restart("prefill"), 1)
        _wait_router_healthy(dep, timeout_s=30)
        faults["all_healthy_at"] = time.monotonic()
        time.sleep(STEADY_AFTER_S)
    finally:
        dep.servers["decode0"].signal(signal.SIGCONT)
        stop.set()
        loader.join(timeout=120)
    assert not loader.is_alive(), "the load did not stop within 120 s"
    return box["results"], faults
