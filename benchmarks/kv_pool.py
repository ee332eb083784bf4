"""KV pool benchmark: AscendStoreConnector's loads against the store's own batched get on the same blocks, and the
time to first token of a prompt served from the pool against computing it, on the same engine.

Everything runs inside a loopback-only network namespace (root needed): a mooncake_master, a `mooncake_client` that
lends the pool's memory (so every read, the connector's and the raw one, crosses the same TCP loopback), one vLLM
engine with the pool (CPU platform, one core), and a raw reader process. Model: a random Llama of 8 layers, hidden
512, 8 KV heads of 64 (4 MiB of KV per 128-token block), so a 2048-token prompt is 16 blocks, 15 of them poolable.

For each prompt: compute it (pool miss; saves follow), reset the engine's prefix cache, serve it again (pool hit).
Prints logs to stderr and ONE JSON object as the last stdout line: load_gib_s (the connector as the engine sees it:
the pool hit's bytes over the time from the request's arrival to its KV landing, median over the pool hits),
raw_gib_s (`batch_get_into_multi_buffers` of the same keys with the same buffer sizes from a bare client, same run),
load_ratio (goal >= 0.9; it counts everything the connector adds: lookup, scheduling, key and buffer planning, the
hand-off), store_call_gib_s (the worker's own timing of its store call, for reference), ttft_pool_ms,
ttft_scratch_ms and ttft_ratio (goal <= 0.5).

    python benchmarks/kv_pool.py [--prompts 5] [--tokens 2048]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Below Linux's ephemeral range (32768-60999), where the engines take their ports.
MASTER_PORT = 27051
HOLDER_PORT = 27053
BLOCK = 128


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def model_spec():
    from ascend_testkit.models.tiny_llama import TinyModelSpec

    return TinyModelSpec(hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=8, head_dim=64,
                         intermediate_size=1024, max_position_embeddings=4096)


# ---- raw reader (runs inside the namespace) -----------------------------------------------------------------------
def raw_reader() -> None:
    """stdin: {"loads": [{"keys": [...], "buffer_sizes": [...]}], "repeats": n}; stdout: GiB/s per load."""
    import torch
    from mooncake.store import MooncakeDistributedStore

    job = json.loads(sys.stdin.read())
    store = MooncakeDistributedStore()
    ret = store.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", f"127.0.0.1:{MASTER_PORT}")
    if ret != 0:
        raise SystemExit(f"raw reader: setup returned {ret}")
    largest = max(len(load["keys"]) * sum(load["buffer_sizes"]) for load in job["loads"])
    buf = torch.empty(largest, dtype=torch.uint8)
    store.register_buffer(buf.data_ptr(), buf.nbytes)
    rates = []
    for load in job["loads"]:
        sizes, per_key = load["buffer_sizes"], sum(load["buffer_sizes"])
        ptrs = [[buf.data_ptr() + k * per_key + sum(sizes[:j]) for j in range(len(sizes))]
                for k in range(len(load["keys"]))]
        for _ in range(job["repeats"]):
            t0 = time.perf_counter()
            codes = store.batch_get_into_multi_buffers(load["keys"], ptrs, [sizes] * len(load["keys"]))
            dt = time.perf_counter() - t0
            if any(c != per_key for c in codes):
                raise SystemExit(f"raw reader: get returned {sorted(set(codes))}")
            rates.append(len(load["keys"]) * per_key / dt / 2**30)
    store.close()
    print(json.dumps({"gib_s": rates}), flush=True)


# ---- driver -------------------------------------------------------------------------------------------------------
def _engine_config(tokens: int) -> dict:
    return {"dtype": "float32", "enforce_eager": True, "seed": 0, "block_size": BLOCK, "max_model_len": tokens + 256,
            "max_num_seqs": 2, "enable_prefix_caching": True,
            "kv_transfer_config": {
                "kv_connector": "AscendStoreConnector", "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                "kv_connector_extra_config": {"master_server_address": f"127.0.0.1:{MASTER_PORT}",
                                              "global_segment_size": 0}}}


def _settle_and_reset(engine, free: int, timeout: float = 60.0) -> dict:
    """Wait until the pool's saves are done and every block is free again (a held request's blocks are released a
    step after its saves end), then reset the engine's own prefix cache (it refuses while blocks are in use)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = engine.stats()
        settled = stats["free_blocks"] == free and not stats["worker"]["pending_saves"] \
            and not stats["worker"]["held_requests"]
        if settled and engine.reset_prefix_cache():
            return stats
        if time.monotonic() > deadline:
            raise TimeoutError(f"the engine did not settle: {stats['free_blocks']} of {free} blocks free")
        time.sleep(0.05)


def run(args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    from ascend_testkit.engine import EngineHost
    from ascend_testkit.models.tiny_llama import cached_tiny_llama, prompt_of_length
    from ascend_testkit.mooncake_master import MooncakeMaster, master_binary
    from ascend_testkit.netns import LoopbackNamespace

    model = str(cached_tiny_llama(model_spec()))
    tok = AutoTokenizer.from_pretrained(model)
    with tempfile.TemporaryDirectory(prefix="kv-pool-bench-") as tmp, LoopbackNamespace() as ns:
        root = Path(tmp)
        master = MooncakeMaster(ns, root / "master.log", rpc_port=MASTER_PORT)
        holder_log = open(root / "holder.log", "wb")  # noqa: SIM115
        holder = ns.popen([str(Path(master_binary()).with_name("mooncake_client")),
                           f"--global_segment_size={args.pool_mib}MB", "--host=127.0.0.1",
                           "--metadata_server=P2PHANDSHAKE", f"--master_server_address=127.0.0.1:{MASTER_PORT}",
                           f"--port={HOLDER_PORT}"], stdout=holder_log, stderr=subprocess.STDOUT)
        engine = None
        try:
            log("starting the engine (8-layer random Llama, one core) ...")
            engine = EngineHost("kv-pool-bench", lane="cpu", log_dir=root, cpus=0, netns=ns)
            engine.start(model, **_engine_config(args.tokens))
            free = engine.free_blocks()
            scratch, pooled, loads, landed, local = [], [], [], [], []
            for i in range(args.prompts):
                ids = tok(prompt_of_length(args.tokens, offset=101 * i + 5))["input_ids"]
                first = engine.run_requests([{"id": f"scratch-{i}", "prompt_token_ids": ids, "max_tokens": 1}])[0]
                _settle_and_reset(engine, free)
                second = engine.run_requests([{"id": f"pool-{i}", "prompt_token_ids": ids, "max_tokens": 1}])[0]
                stats = engine.stats()
                # the same prefix from the engine's own prefix cache: the floor a pool hit can reach here
                third = engine.run_requests([{"id": f"local-{i}", "prompt_token_ids": ids, "max_tokens": 1}])[0]
                _settle_and_reset(engine, free)
                if first["token_ids"] != second["token_ids"]:
                    raise RuntimeError(f"prompt {i}: pooled output differs from the computed one")
                load = next((v for k, v in stats["worker"]["recent_loads"].items() if k.startswith(f"pool-{i}")), None)
                if load is None:
                    worker = {k: v for k, v in stats["worker"].items() if k != "recent_loads"}
                    raise RuntimeError(f"prompt {i}: no load from the pool; scheduler {stats['scheduler']}, "
                                       f"worker {worker}")
                if load["failed"]:
                    raise RuntimeError(f"prompt {i}: {load['failed']} blocks failed to load")
                landed.append(((second["t_landed"] or second["t_first"]) - second["t_add"]) * 1000)
                scratch.append((first["t_first"] - first["t_add"]) * 1000)
                local.append((third["t_first"] - third["t_add"]) * 1000)
                pooled.append((second["t_first"] - second["t_add"]) * 1000)
                loads.append(load)
                log(f"prompt {i}: scratch {scratch[-1]:.1f} ms, local hit {local[-1]:.1f} ms, pool {pooled[-1]:.1f} ms "
                    f"(KV landed at {landed[-1]:.1f} ms), load {load['bytes'] / 2**20:.0f} MiB in "
                    f"{load['seconds'] * 1000:.1f} ms")
            sched = engine.stats()["scheduler"]
            reader = ns.popen([sys.executable, __file__, "--raw-reader"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=open(root / "raw.log", "wb"))  # noqa: SIM115
            out, _ = reader.communicate(json.dumps({"loads": [{"keys": ld["keys"], "buffer_sizes": ld["buffer_sizes"]}
                                                             for ld in loads], "repeats": 3}).encode(), timeout=300)
            if reader.returncode != 0:
                raise RuntimeError(f"raw reader failed: {(root / 'raw.log').read_text()[-2000:]}")
            raw = json.loads(out.decode().strip().splitlines()[-1])["gib_s"]
        finally:
            if engine is not None:
                engine.close()
            holder.terminate()
            holder.wait(timeout=20)
            holder_log.close()
            master.close()
    warm = slice(1, None) if args.prompts >= 3 else slice(None)
    # The connector's load as the engine sees it: from the request's arrival until its KV landed. (The worker's own
    # timing of its store call times the same call as the raw reader: a ratio of about 1 by construction.)
    load_rates = [ld["bytes"] / (ms / 1000) / 2**30 for ld, ms in zip(loads, landed, strict=True)]
    load_gib_s = statistics.median(load_rates[warm])
    store_call_gib_s = statistics.median([ld["bytes"] / ld["seconds"] / 2**30 for ld in loads][warm])
    raw_gib_s = statistics.median(raw[3:] if len(raw) > 3 else raw)  # 3 reads per load; the first load is a warm-up
    ttft_pool, ttft_scratch = statistics.median(pooled[warm]), statistics.median(scratch[warm])
    return {
        "load_gib_s": round(load_gib_s, 3), "raw_gib_s": round(raw_gib_s, 3),
        "load_ratio": round(load_gib_s / raw_gib_s, 3), "store_call_gib_s": round(store_call_gib_s, 3),
        "ttft_pool_ms": round(ttft_pool, 1), "ttft_scratch_ms": round(ttft_scratch, 1),
        "ttft_ratio": round(ttft_pool / ttft_scratch, 3),
        "ttft_local_hit_ms": round(statistics.median(local[warm]), 1),
        "goals": {"load_ratio": ">= 0.9", "ttft_ratio": "<= 0.5"},
        "prompt_tokens": args.tokens, "prompts": args.prompts,
        "hit_tokens_per_prompt": sched["hit_tokens"] // args.prompts,
        "bytes_per_load": loads[0]["bytes"], "keys_per_load": len(loads[0]["keys"]),
        "buffers_per_key": len(loads[0]["buffer_sizes"]),
        "details": {"load_gib_s": [round(r, 3) for r in load_rates], "raw_gib_s": [round(r, 3) for r in raw],
                    "ttft_pool_ms": [round(t, 1) for t in pooled], "landed_ms": [round(t, 1) for t in landed],
                    "ttft_scratch_ms": [round(t, 1) for t in scratch],
                    "ttft_local_hit_ms": [round(t, 1) for t in local]},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=6, help="prompts (the first is a warm-up when >= 3)")
    parser.add_argument("--tokens", type=int, default=2048, help="prompt length in tokens")
    parser.add_argument("--pool-mib", type=int, default=1024, help="memory the standalone pool client lends")
    parser.add_argument("--raw-reader", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.raw_reader:
        raw_reader()
        return 0
    print(json.dumps(run(args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
