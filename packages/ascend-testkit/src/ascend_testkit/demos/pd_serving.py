"""`ascend-vllm demo-pd --serve`: disaggregated serving as users deploy it, on loopback.

Starts a prefill server and a decode server (`ascend-vllm serve` with `AscendMooncakeConnector`, kv_producer on core
0 and kv_consumer on core 1, our platform in the simulated-NPU lane) and `ascend-vllm router` in front of them, all in
a loopback-only network namespace; sends one streamed completion through the router and the same prompt to the
prefill server alone (the single-server reference, its prefix cache reset first), and prints both answers, the
timings and how many prompt tokens reached the decode server over Mooncake. Needs root (for the namespace) and
Mooncake.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request

ROUTER_PORT, PREFILL_PORT, DECODE_PORT = 8000, 8100, 8200


def _post(url: str, body: dict, timeout: float = 300.0) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def _stream(url: str, body: dict, timeout: float = 300.0) -> tuple[str, float, int, str]:
    """(text, seconds to the first chunk, chunks, decode server) of a streamed completion."""
    req = urllib.request.Request(url, data=json.dumps(body | {"stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    t0, first, pieces, buf = time.perf_counter(), None, [], b""
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        decode = resp.headers.get("x-router-decode", "")
        # read1: whatever has arrived (line iteration would wait for a full buffer and hide the streaming)
        while data := resp.read1(65536):
            buf += data
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if not event.startswith(b"data: ") or event == b"data: [DONE]":
                    continue
                payload = json.loads(event[len(b"data: "):])
                if "error" in payload:
                    raise RuntimeError(f"the router ended the stream with an error: {payload['error']['message']}")
                first = first if first is not None else time.perf_counter() - t0
                pieces.append(payload["choices"][0]["text"])
    return "".join(pieces), first or 0.0, len(pieces), decode


def _kv_received_tokens(decode_url: str) -> float:
    with urllib.request.urlopen(decode_url + "/metrics", timeout=30) as resp:
        return sum(float(line.rsplit(" ", 1)[1]) for line in resp.read().decode().splitlines()
                   if line.startswith("vllm:prompt_tokens_by_source_total") and "external_kv_transfer" in line)


def run_serving(args: argparse.Namespace) -> int:
    from ascend_testkit.models.tiny_llama import cached_tiny_llama, prompt_of_length
    from ascend_testkit.netns import LoopbackNamespace
    from ascend_testkit.servers import inside, p2p_kv_config, start_router, start_serve, tiny_serve_args

    model = args.model or str(cached_tiny_llama())
    n = max(int(x) for x in args.lengths.split(",") if x.strip())
    prompt = prompt_of_length(n, offset=n)
    body = {"model": "tiny", "prompt": prompt, "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True}
    serve_args = tiny_serve_args(max_model_len=n + args.max_tokens + 64)
    with tempfile.TemporaryDirectory(prefix="demo-pd-serve-") as tmp, LoopbackNamespace() as ns:
        print("starting the prefill and decode servers (a minute or two) ...", file=sys.stderr, flush=True)
        servers = [
            # Development endpoints: the prefix cache is reset between the two runs of the prompt.
            start_serve("prefill", model, PREFILL_PORT, log_dir=tmp, cpu=0, netns=ns, args=serve_args,
                        env_extra={"VLLM_SERVER_DEV_MODE": "1"},
                        kv_transfer_config=p2p_kv_config("kv_producer", args.port, "demo-prefill")),
            start_serve("decode", model, DECODE_PORT, log_dir=tmp, cpu=1, netns=ns, args=serve_args,
                        kv_transfer_config=p2p_kv_config("kv_consumer", args.port + 100, "demo-decode")),
        ]
        try:
            for s in servers:
                s.wait_healthy()
            router = start_router("router", ROUTER_PORT, prefill=[servers[0].url], decode=[servers[1].url],
                                  log_dir=tmp, netns=ns, args=["--log-level", "warning"])
            servers.append(router)
            router.wait_healthy(timeout=60)
            with inside(ns):
                kv_before = _kv_received_tokens(servers[1].url)
                t0 = time.perf_counter()
                routed, first_s, chunks, decode_url = _stream(router.url + "/v1/completions", body)
                routed_s = time.perf_counter() - t0
                kv_tokens = _kv_received_tokens(servers[1].url) - kv_before
                urllib.request.urlopen(urllib.request.Request(servers[0].url + "/reset_prefix_cache",
                                                              method="POST"), timeout=30).close()
                t0 = time.perf_counter()
                single = _post(servers[0].url + "/v1/completions", body)["choices"][0]["text"]
                single_s = time.perf_counter() - t0
        finally:
            for s in servers:
                s.close()
    report = {
        "prompt_tokens": n, "max_tokens": args.max_tokens, "identical": routed == single,
        "single_server": single, "through_router": routed,
        "single_server_ms": round(single_s * 1000, 1), "router_total_ms": round(routed_s * 1000, 1),
        "router_first_chunk_ms": round(first_s * 1000, 1), "chunks": chunks, "decode_server": decode_url,
        "kv_tokens_received_by_decode": kv_tokens,
        "server_ready_s": {s.name: round(s.ready_after_s or 0.0, 1) for s in servers},
    }
    if args.json:
        print(json.dumps(report))
        return 0 if report["identical"] else 1
    ready = ", ".join(f"{k} {v} s" for k, v in report["server_ready_s"].items())
    print(f"servers ready: {ready}")
    print(f"\n{n} prompt tokens, {args.max_tokens} generated — {'identical' if routed == single else 'DIFFERENT'}")
    print(f"  single server  ({report['single_server_ms']:7.1f} ms): {single}")
    print(f"  through router ({report['router_total_ms']:7.1f} ms, first chunk after "
          f"{report['router_first_chunk_ms']} ms, {chunks} chunks, decoded on {decode_url}): {routed}")
    print(f"\nthe decode server took {kv_tokens:.0f} of the {n} prompt tokens' KV from the prefill server over "
          "Mooncake (vLLM's prompt_tokens_by_source external_kv_transfer counter)")
    return 0 if routed == single else 1
