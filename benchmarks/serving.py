"""Serving benchmark: what `ascend-vllm router` adds to a disaggregated request, and whether it loses any under load.

A prefill server (kv_producer, core 0) and a decode server (kv_consumer, core 1), both `ascend-vllm serve` on our
platform in the simulated-NPU lane, and the router in front of them, all in a loopback-only network namespace (root
needed). The same client (aiohttp) runs the two-step request itself against the servers ("direct": the router's own
prefill/decode payloads, no router) and through the router, interleaved in pairs with distinct prompts of the same
length, so both see the same engines at the same moments. Then `--load` concurrent requests go through the router.

Prints logs to stderr and ONE JSON object as the last line of stdout with keys router_overhead_ms (the median added
latency: median over the pairs of routed minus direct, each pair run back to back; goal <= 2), median_difference_ms
(median routed minus median direct: the same quantity, noisier when other work shares the cores), router_median_ms,
direct_median_ms, completed, sent, completed_ratio (goal 1.0), and details.

    python benchmarks/serving.py [--pairs 200] [--load 64] [--max-tokens 2] [--prompt-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid

PREFILL_PORT, DECODE_PORT, ROUTER_PORT = 8100, 8200, 8000


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def _body(prompt: str, max_tokens: int) -> dict:
    return {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}


async def _direct(session, prefill: str, decode: str, body: dict) -> float:
    """The disaggregated request without the router: the client itself asks prefill, then decode."""
    from ascend_vllm.router.proxy import decode_payload, prefill_payload

    t0 = time.perf_counter()
    async with session.post(prefill + "/v1/completions",
                            json=prefill_payload(body, f"direct-{uuid.uuid4().hex}")) as resp:
        assert resp.status == 200, await resp.text()
        params = (await resp.json())["kv_transfer_params"]
    async with session.post(decode + "/v1/completions", json=decode_payload(body, params)) as resp:
        assert resp.status == 200, await resp.text()
        out = await resp.json()
    assert out["usage"]["completion_tokens"] == body["max_tokens"]
    return (time.perf_counter() - t0) * 1000


async def _routed(session, router: str, body: dict) -> float:
    t0 = time.perf_counter()
    async with session.post(router + "/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        out = await resp.json()
    assert out["usage"]["completion_tokens"] == body["max_tokens"]
    return (time.perf_counter() - t0) * 1000


async def _measure(args, prefill: str, decode: str, router: str) -> dict:
    import aiohttp

    from ascend_testkit.models.tiny_llama import prompt_of_length

    def prompt(i: int) -> str:
        return prompt_of_length(args.prompt_tokens, offset=10_000 + 7 * i)

    async with aiohttp.ClientSession() as session:
        for i in range(args.warmup):
            await _direct(session, prefill, decode, _body(prompt(-1 - 2 * i), args.max_tokens))
            await _routed(session, router, _body(prompt(-2 - 2 * i), args.max_tokens))
        routed, direct = [], []
        for i in range(args.pairs):
            a, b = _body(prompt(2 * i), args.max_tokens), _body(prompt(2 * i + 1), args.max_tokens)
            if i % 2:  # alternate which path goes first
                routed.append(await _routed(session, router, a))
                direct.append(await _direct(session, prefill, decode, b))
            else:
                direct.append(await _direct(session, prefill, decode, b))
                routed.append(await _routed(session, router, a))

        async def one(i: int) -> bool:
            body = _body(prompt_of_length(args.prompt_tokens, offset=50_000 + 7 * i), args.load_max_tokens)
            try:
                async with session.post(router + "/v1/completions", json=body,
                                        timeout=aiohttp.ClientTimeout(total=600)) as resp:
                    out = await resp.json(content_type=None)
                    return resp.status == 200 and out["usage"]["completion_tokens"] == args.load_max_tokens
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                log(f"load request {i} failed: {exc!r}")
                return False

        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(i) for i in range(args.load)))
        load_s = time.perf_counter() - t0
        async with session.get(router + "/status") as resp:
            status = await resp.json()
    return {"routed": routed, "direct": direct, "results": results, "load_s": load_s, "status": status}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=200, help="router/direct request pairs (default 200)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=2, help="tokens per request of the latency pairs")
    parser.add_argument("--load", type=int, default=64, help="concurrent requests of the load run (default 64)")
    parser.add_argument("--load-max-tokens", type=int, default=16)
    args = parser.parse_args()

    from ascend_testkit.models.tiny_llama import cached_tiny_llama
    from ascend_testkit.netns import LoopbackNamespace
    from ascend_testkit.servers import inside, p2p_kv_config, start_router, start_serve, tiny_serve_args

    model = cached_tiny_llama()
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp, LoopbackNamespace() as ns:
        log("starting the prefill and decode servers (a minute or two) ...")
        serve_args = tiny_serve_args(max_num_seqs=64)
        servers = [
            start_serve("prefill", model, PREFILL_PORT, log_dir=tmp, cpu=0, netns=ns, args=serve_args,
                        kv_transfer_config=p2p_kv_config("kv_producer", 30300, "prefill")),
            start_serve("decode", model, DECODE_PORT, log_dir=tmp, cpu=1, netns=ns, args=serve_args,
                        kv_transfer_config=p2p_kv_config("kv_consumer", 30400, "decode")),
        ]
        try:
            for s in servers:
                s.wait_healthy()
            router = start_router("router", ROUTER_PORT, prefill=[servers[0].url], decode=[servers[1].url],
                                  log_dir=tmp, netns=ns, args=["--log-level", "warning"])
            servers.append(router)
            router.wait_healthy(timeout=60)
            start_s = {s.name: round(s.ready_after_s, 1) for s in servers}
            log(f"ready after {start_s} s; {args.pairs} pairs, then {args.load} concurrent requests ...")
            with inside(ns):
                m = asyncio.run(_measure(args, servers[0].url, servers[1].url, router.url))
        finally:
            for s in servers:
                s.close()

    routed_ms, direct_ms = statistics.median(m["routed"]), statistics.median(m["direct"])
    paired = statistics.median(r - d for r, d in zip(m["routed"], m["direct"], strict=True))
    completed = sum(m["results"])
    st = m["status"]
    result = {
        "router_overhead_ms": round(paired, 3),
        "median_difference_ms": round(routed_ms - direct_ms, 3),
        "router_median_ms": round(routed_ms, 3),
        "direct_median_ms": round(direct_ms, 3),
        "completed": completed,
        "sent": args.load,
        "completed_ratio": round(completed / args.load, 4),
        "goals": {"router_overhead_ms": "<= 2", "completed_ratio": "== 1.0"},
        "details": {
            "pairs": args.pairs, "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
            "router_p90_ms": round(statistics.quantiles(m["routed"], n=10)[-1], 3),
            "direct_p90_ms": round(statistics.quantiles(m["direct"], n=10)[-1], 3),
            "load_wall_s": round(m["load_s"], 3), "load_max_tokens": args.load_max_tokens,
            "router_counters": {k: st[k] for k in ("received", "completed", "failed", "rejected")},
            "prefill_sent": st["prefill"][0]["sent"], "decode_sent": st["decode"][0]["sent"],
            "server_ready_s": start_s,
        },
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
