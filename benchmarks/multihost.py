"""Multi-host KV transfer benchmark: prefill and decode on two hosts (network namespaces of `ascend_testkit.hosts`)
joined by a veth link rate-limited with `tc tbf` (default 5 Gbit/s), Mooncake over TCP between them.

- throughput_ratio: GiB/s of our connector's pull (`MooncakeAgent` through the decode engine's step driver) over raw
  Mooncake `batch_transfer_sync_read` of the same bytes, interleaved, on the same link (goal >= 0.9). Synthetic
  producer/consumer processes (benchmarks/kv_transfer.py's 32 layers x 256 blocks x 64 KiB request).
- landed_ratio_vs_in_tree: median time from a decode request's arrival to its KV landed, our connector over vLLM's
  in-tree MooncakeConnector, both between real engines (vLLM CPU platform) on the two hosts (goal <= 1.0).
- ttft_ratio: time to first token of a 2000-token prompt disaggregated across the hosts (prefill leg + decode's first
  token) over the same prompt length on one engine alone (the prefill engine), our connector.

`--delay-ms D` holds every packet on the prefill-decode link D ms each way (a round trip of 2D; `Link.delay`, a TUN
delay line, since this kernel has no netem). The delay line is a Python process: it carries some hundreds of MiB/s at
most, far under 5 Gbit/s, so with a delay the link's speed is the delay line's and both sides of each ratio share it.
Prints logs to stderr and ONE JSON object as the last line of stdout. Root needed.

    python benchmarks/multihost.py [--rate 5gbit] [--delay-ms 1] [--repeats 5] [--requests 8] [--skip-engines]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kv_transfer import (  # noqa: E402
    BLOCKS,
    LAYERS,
    run_producer_and_consumer,
    synthetic_consumer,
    synthetic_producer,
)

PRODUCER_PORT = 33500
PROMPT_TOKENS = 2000  # the tiny Llama allows 2048 positions: the prompt plus a few decoded tokens


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


# ---- synthetic producer / consumer: benchmarks/kv_transfer.py's, each on its host ---------------------------------
def run_synthetic(topo, repeats: int, logdir: Path) -> dict:
    me = [sys.executable, str(Path(__file__).resolve())]
    a, b = topo["prefill"], topo["decode"]
    producer = [*me, "--synthetic-producer", "--repeats", str(repeats), "--host", a.address]
    consumer = [*me, "--synthetic-consumer", "--repeats", str(repeats), "--host", b.address, "--peer-host", a.address]
    return run_producer_and_consumer(lambda **popen: a.popen(producer, **popen), b.command(consumer), logdir)


# ---- engines on the two hosts --------------------------------------------------------------------------------------
def _kv(kind: str, role: str, host) -> dict:
    if kind == "ours":
        return {
            "kv_connector": "AscendMooncakeConnector",
            "kv_role": role,
            "engine_id": f"ours-{role}",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"side_channel_port": 34100, "side_channel_host": host.address},
        }
    return {
        "kv_connector": "MooncakeConnector",
        "kv_role": role,
        "engine_id": f"intree-{role}",
        "kv_connector_extra_config": {"mooncake_protocol": "tcp"},
    }


def run_two_hosts(
    topo, kind: str, model: str, prompts: list[list[int]], singles: list[list[int]], logdir: Path
) -> dict:
    """Landed ms and disaggregated TTFT ms per request; with `singles`, the prefill engine's TTFT serving alone."""
    from ascend_testkit.engine import EngineHost

    bootstrap = 8998
    common = dict(
        dtype="float32",
        enforce_eager=True,
        seed=0,
        block_size=128,
        max_model_len=2048,
        max_num_seqs=4,
        enable_prefix_caching=True,
    )
    setup = () if kind == "ours" else ("ascend_testkit.engine.shims:cpu_accelerator_index",)
    engines = []
    try:
        for name, role, cpu in (("prefill", "kv_producer", 0), ("decode", "kv_consumer", 1)):
            host = topo[name]
            env = {"VLLM_HOST_IP": host.address, "VLLM_MOONCAKE_BOOTSTRAP_PORT": str(bootstrap)}
            eh = EngineHost(f"{kind}-{name}", lane="cpu", log_dir=logdir, cpus=cpu, env=env, netns=host, setup=setup)
            engines.append(eh.start(model, wait=False, kv_transfer_config=_kv(kind, role, host), **common))
        for e in engines:
            e.started()
        prefill, decode = engines
        landed, ttft, alone = [], [], []
        for i, ids in enumerate(prompts):
            tid = f"{kind}-xfer-{i}"
            first = prefill.run_requests(
                [
                    {
                        "id": f"p{i}",
                        "prompt_token_ids": ids,
                        "max_tokens": 1,
                        "kv_transfer_params": {"do_remote_decode": True, "transfer_id": tid},
                    }
                ]
            )[0]
            params = first["kv_transfer_params"] or {}
            if kind != "ours":  # the in-tree connector's router builds the decode side's params
                params = {
                    "do_remote_prefill": True,
                    "remote_engine_id": "intree-kv_producer",
                    "remote_bootstrap_addr": f"http://{topo['prefill'].address}:{bootstrap}",
                    "transfer_id": tid,
                }
            out = decode.run_requests(
                [{"id": f"d{i}", "prompt_token_ids": ids, "max_tokens": 4, "kv_transfer_params": params}]
            )[0]
            if out["t_landed"] is None:
                raise RuntimeError(f"{kind}: decode request {i} never reported its KV landed")
            landed.append((out["t_landed"] - out["t_add"]) * 1000)
            # The client's view: the prefill leg, then the decode server's first token (hand-over between the two
            # legs not counted: a router adds ~1 ms, benchmarks/serving.py).
            ttft.append(((first["t_end"] - first["t_add"]) + (out["t_first"] - out["t_add"])) * 1000)
            log(f"{kind}: request {i} landed {landed[-1]:.1f} ms, ttft {ttft[-1]:.1f} ms")
        for i, ids in enumerate(singles):
            out = prefill.run_requests([{"id": f"s{i}", "prompt_token_ids": ids, "max_tokens": 4}])[0]
            alone.append((out["t_first"] - out["t_add"]) * 1000)
            log(f"{kind}: single-engine request {i} ttft {alone[-1]:.1f} ms")
        return {"landed": landed, "ttft": ttft, "alone": alone}
    finally:
        for e in engines:
            e.close()


def _median_after_warmup(xs: list[float]) -> float | None:
    return statistics.median(xs[1:] or xs) if xs else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="5gbit", help="tc tbf rate of every link (tc's syntax)")
    parser.add_argument("--delay-ms", type=float, default=0.0,
                        help="one-way delay on the prefill-decode link in ms (a round trip gains twice that)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--requests", type=int, default=8, help="decode requests per connector (first is warm-up)")
    parser.add_argument("--skip-engines", action="store_true", help="only the synthetic throughput part")
    parser.add_argument("--synthetic-producer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--synthetic-consumer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--host", default="", help=argparse.SUPPRESS)
    parser.add_argument("--peer-host", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.synthetic_producer:
        synthetic_producer(args.repeats, args.host, PRODUCER_PORT)
        return 0
    if args.synthetic_consumer:
        synthetic_consumer(args.repeats, args.host, args.peer_host, PRODUCER_PORT, offload=False)
        return 0

    from ascend_testkit.hosts import Topology, rate_bits_per_s

    if args.delay_ms < 0:
        parser.error(f"--delay-ms must be >= 0, got {args.delay_ms}")
    result: dict = {"rate": args.rate, "rtt_delay_ms": 2 * args.delay_ms or None}
    with (
        tempfile.TemporaryDirectory(prefix="multihost-bench-") as tmp,
        Topology(["prefill", "decode"], rate=args.rate) as topo,
    ):
        logdir = Path(tmp)
        if args.delay_ms:
            topo.link("prefill", "decode").delay(args.delay_ms / 1000)
            log(f"the prefill-decode link holds packets {args.delay_ms} ms each way")
        log(f"synthetic: {LAYERS} layers x {BLOCKS} blocks x 64 KiB pulled across hosts over a {args.rate} link")
        syn = run_synthetic(topo, args.repeats, logdir)
        result.update(syn)
        result["throughput_ratio"] = syn["connector_gib_s"] / syn["raw_gib_s"]
        result["median_throughput_ratio"] = syn["connector_median_gib_s"] / syn["raw_median_gib_s"]
        result["link_gib_s"] = rate_bits_per_s(args.rate) / 8 / (1 << 30)
        result["landed_ratio_vs_in_tree"] = result["ttft_ratio"] = None
        if not args.skip_engines:
            from transformers import AutoTokenizer

            from ascend_testkit.models.tiny_llama import cached_tiny_llama, prompt_of_length

            model = str(cached_tiny_llama())
            tok = AutoTokenizer.from_pretrained(model)

            def ids(offset: int) -> list[int]:
                return tok(prompt_of_length(PROMPT_TOKENS, offset=offset))["input_ids"]

            prompts = [ids(37 * i) for i in range(args.requests)]
            singles = [ids(100_000 + 37 * i) for i in range(args.requests)]  # no prefix shared with `prompts`
            ours = run_two_hosts(topo, "ours", model, prompts, singles, logdir)
            intree = run_two_hosts(topo, "intree", model, prompts, [], logdir)
            result["landed_ms"] = _median_after_warmup(ours["landed"])
            result["in_tree_landed_ms"] = _median_after_warmup(intree["landed"])
            result["landed_ratio_vs_in_tree"] = result["landed_ms"] / result["in_tree_landed_ms"]
            result["pd_ttft_ms"] = _median_after_warmup(ours["ttft"])
            result["single_ttft_ms"] = _median_after_warmup(ours["alone"])
            result["ttft_ratio"] = result["pd_ttft_ms"] / result["single_ttft_ms"]
            result["details"] = {"ours": ours, "in_tree": intree}
    keys = ("throughput_ratio", "landed_ratio_vs_in_tree", "ttft_ratio", "connector_gib_s", "raw_gib_s", "rate")
    ordered = {k: result.pop(k) for k in keys}
    print(json.dumps(ordered | result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
