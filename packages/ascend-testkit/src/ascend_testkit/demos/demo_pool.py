"""`ascend-vllm demo-pool`: two real vLLM engines sharing a KV pool over Mooncake Store (`AscendStoreConnector`).

A `mooncake_master` and two engines (A on core 0 with PYTHONHASHSEED=1, B on core 1 with PYTHONHASHSEED=2, each
lending 64 MiB to the pool) run in a loopback-only network namespace. For each prompt, A computes it and saves its
full blocks to the pool; B then serves the same prompt, loading the prefix A computed. Prints both outputs, the pool
hit rate and the times to first token. Needs root (for the namespace) and `mooncake-transfer-engine`
(`pip install "ascend-kv-transfer[mooncake]"`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HELP = "Run two vLLM engines on one Mooncake KV pool: the second serves prefixes the first computed."

MASTER_PORT = 27051  # below Linux's ephemeral range (32768-60999), where the engines take their ports


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="model folder (default: the tiny random Llama, built offline)")
    parser.add_argument("--lengths", default="200,900,1500", help="prompt lengths in tokens, comma separated")
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--lane", choices=("simulated", "cpu"), default="cpu",
                        help="the engines' platform: vLLM's own CPU platform (default) or our simulated-NPU lane")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")


def _kv(master: str) -> dict:
    return {"kv_connector": "AscendStoreConnector", "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"master_server_address": master, "global_segment_size": "64MiB"}}


def _settled(host, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        stats = host.stats()
        if not stats["worker"]["pending_saves"] and not stats["worker"]["held_requests"]:
            return stats
        if time.monotonic() > deadline:
            raise TimeoutError("the pool's saves did not finish")
        time.sleep(0.05)


def _ms(rec: dict, key: str) -> float:
    return round((rec[key] - rec["t_add"]) * 1000, 1)


def run(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from ascend_testkit.engine import EngineHost
    from ascend_testkit.models.tiny_llama import cached_tiny_llama, prompt_of_length
    from ascend_testkit.mooncake_master import MooncakeMaster
    from ascend_testkit.netns import LoopbackNamespace

    model = args.model or str(cached_tiny_llama())
    tok = AutoTokenizer.from_pretrained(model)
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    common = dict(dtype="float32", enforce_eager=True, seed=0, block_size=args.block_size,
                  max_model_len=max(lengths) + args.max_tokens + 8, max_num_seqs=4)
    rows = []
    with tempfile.TemporaryDirectory(prefix="demo-pool-") as tmp, LoopbackNamespace() as ns:
        root = Path(tmp)
        print("starting mooncake_master and two engines (about a minute) ...", file=sys.stderr, flush=True)
        master = MooncakeMaster(ns, root / "master.log", rpc_port=MASTER_PORT)
        hosts = [EngineHost(name, lane=args.lane, log_dir=root, cpus=i, netns=ns, env={"PYTHONHASHSEED": str(i + 1)})
                 .start(model, wait=False, kv_transfer_config=_kv(master.address), **common)
                 for i, name in enumerate(("engine-A", "engine-B"))]
        try:
            for h in hosts:
                h.started()
            a, b = hosts
            for n in lengths:
                ids = tok(prompt_of_length(n, offset=n))["input_ids"]
                first = a.run_requests([{"id": f"a-{n}", "prompt_token_ids": ids, "max_tokens": args.max_tokens}])[0]
                _settled(a)
                second = b.run_requests([{"id": f"b-{n}", "prompt_token_ids": ids,
                                          "max_tokens": args.max_tokens}])[0]
                stats = _settled(b)
                hit = next((v for k, v in stats["scheduler"]["per_request_hits"].items() if k.startswith(f"b-{n}")),
                           0)
                rows.append({
                    "prompt_tokens": n, "pool_hit_tokens": hit, "hit_rate": round(hit / n, 3),
                    "engine_a": tok.decode(first["token_ids"]), "engine_b": tok.decode(second["token_ids"]),
                    "identical": first["token_ids"] == second["token_ids"],
                    "ttft_a_ms": _ms(first, "t_first"), "ttft_b_ms": _ms(second, "t_first"),
                    "kv_landed_b_ms": _ms(second, "t_landed") if second["t_landed"] else None,
                })
            a_worker, b_worker = a.stats()["worker"], b.stats()["worker"]
        finally:
            for h in hosts:
                h.close()
            master.close()
    ok = all(r["identical"] for r in rows)
    total = sum(r["prompt_tokens"] for r in rows)
    hit_rate = round(sum(r["pool_hit_tokens"] for r in rows) / total, 3)
    if args.json:
        print(json.dumps({"rows": rows, "hit_rate": hit_rate, "engine_a": a_worker | {"recent_loads": None},
                          "engine_b": b_worker | {"recent_loads": None}}))
        return 0 if ok else 1
    for r in rows:
        same = "identical" if r["identical"] else "DIFFERENT"
        print(f"\n{r['prompt_tokens']} prompt tokens — {same}; {r['pool_hit_tokens']} served from the pool "
              f"({r['hit_rate']:.1%})")
        print(f"  engine A, computed  (first token {r['ttft_a_ms']:7.1f} ms): {r['engine_a']}")
        print(f"  engine B, from pool (first token {r['ttft_b_ms']:7.1f} ms, KV landed after {r['kv_landed_b_ms']} ms):"
              f" {r['engine_b']}")
    print(f"\npool hit rate {hit_rate:.1%} of B's prompt tokens; A stored {a_worker['objects_stored']} block objects "
          f"({a_worker['bytes_stored'] / 2**20:.1f} MiB); B loaded {b_worker['blocks_loaded']} blocks "
          f"({b_worker['bytes_loaded'] / 2**20:.1f} MiB in {b_worker['load_seconds'] * 1000:.1f} ms), "
          f"{b_worker['load_failed_blocks']} failed")
    return 0 if ok else 1
