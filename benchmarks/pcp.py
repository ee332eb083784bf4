"""Prefill context parallel: time to first token of one long prompt with PCP=2 against PCP=1, in the same run.

Both engines run in the simulated lane (Model Runner V2) on the same small Llama (hidden 512, 4 layers, 8 heads of
64, enough work per token that a 2,048-token prefill is compute-bound), eagerly, prefix caching off:
* PCP=1: one rank, its threads pinned to core 0;
* PCP=2: two ranks (vLLM's worker processes, gloo), rank 0 pinned to core 0 and rank 1 to core 1.
Each round sends one fresh 2,048-token prompt (max_tokens=1) to each engine in turn (the order alternates, so load
on the shared machine hits both alike); TTFT is the time from adding the request to its first token. The first
round is a warm-up.

Prints ONE JSON object as the last line of stdout (logs on stderr):
  prefill_ratio = median TTFT with PCP=2 / median TTFT with PCP=1; goal <= 0.7
plus the per-round figures, where PCP=2's time went per measured prefill and rank (the K/V all-gather, which
includes waiting for the slower rank, and the attention kernels; from the ranks' usage counters), and the machine's
load average (the machine is shared: PCP=2 needs both cores, so load elsewhere slows it more than PCP=1).

    uv run --no-sync python benchmarks/pcp.py [--rounds 5] [--prompt-tokens 2048] [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

GOAL = 0.7
ENGINE = dict(dtype="float32", max_model_len=4096, enforce_eager=True, max_num_seqs=2, block_size=128,
              max_num_batched_tokens=4096, enable_prefix_caching=False, seed=0)
ENGINES = {"pcp1": dict(pcp=1, cpus="0"), "pcp2": dict(pcp=2, cpus="0|1")}
BREAKDOWN = ("pcp.kv_all_gather", "kernels.attention_with_lse", "kernels.reshape_and_cache", "kernels.rms_norm",
             "kernels.silu_and_mul", "kernels.rotary_embedding")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def model_spec():
    from ascend_testkit.models.tiny_llama import TinyModelSpec

    return TinyModelSpec(hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=8, head_dim=64,
                         intermediate_size=1536, max_position_embeddings=4096, initializer_range=0.02)


def prompt(round_no: int, name: str, n: int) -> list[int]:
    """A fresh prompt per round and engine (3..999: the tiny tokenizer's words), never a prefix of another."""
    salt = 7 * round_no + (0 if name == "pcp1" else 3)
    return [3 + (salt + 31 * i + i * i) % 997 for i in range(n)]


def measure(rounds: int, prompt_tokens: int, cache_dir: Path, workdir: Path) -> dict:
    from ascend_testkit.engine import EngineHost
    from ascend_testkit.models.tiny_llama import cached_tiny_llama

    spec = model_spec()
    model = cached_tiny_llama(spec, cache_dir=cache_dir)
    hosts = {name: EngineHost(f"bench-{name}", lane="simulated", runner="v2", cpus=e["cpus"], log_dir=workdir)
             for name, e in ENGINES.items()}
    try:
        for name, host in hosts.items():  # start-ups overlap; they are not measured
            host.start(model, wait=False, prefill_context_parallel_size=ENGINES[name]["pcp"], **ENGINE)
        startup = {name: round(host.started()["startup_s"], 1) for name, host in hosts.items()}
        log(f"started: {startup}")
        ttft: dict[str, list[float]] = {name: [] for name in hosts}
        for round_no in range(rounds + 1):
            order = list(hosts) if round_no % 2 == 0 else list(reversed(hosts))
            for name in order:
                rid = f"{name}-{round_no}"
                (rec,) = hosts[name].run_requests(
                    [{"id": rid, "prompt_token_ids": prompt(round_no, name, prompt_tokens), "max_tokens": 1}],
                    timeout=600)
                seconds = rec["t_first"] - rec["t_add"]
                log(f"round {round_no} {name}: TTFT {seconds:.3f} s{' (warm-up)' if round_no == 0 else ''}")
                if round_no:
                    ttft[name].append(seconds)
            if round_no == 0:  # the counters include start-up's profiling run: measure from here on
                before = hosts["pcp2"].usage()
        after = hosts["pcp2"].usage()
        per_rank = [{k: (a["seconds"].get(k, 0.0) - b["seconds"].get(k, 0.0)) / rounds for k in BREAKDOWN}
                    for b, a in zip(before, after, strict=True)]
        return {"ttft": ttft, "startup_s": startup, "per_rank_seconds": per_rank, "spec": spec}
    finally:
        for host in hosts.values():
            host.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--cache-dir", type=Path, default=None, help="where the benchmark model is built and kept")
    args = parser.parse_args()
    from ascend_testkit.models.checkpoint_cache import default_cache_dir

    with tempfile.TemporaryDirectory(prefix="pcp-bench-") as tmp:
        result = measure(args.rounds, args.prompt_tokens, args.cache_dir or default_cache_dir(), Path(tmp))
    median = {name: statistics.median(ts) for name, ts in result["ttft"].items()}
    spec = result["spec"]
    out = {
        "prefill_ratio": round(median["pcp2"] / median["pcp1"], 3),
        "goal": {"prefill_ratio": f"<= {GOAL}"},
        "ttft_s": {name: round(m, 4) for name, m in median.items()},
        "ttft_rounds_s": {name: [round(t, 4) for t in ts] for name, ts in result["ttft"].items()},
        "prompt_tokens": args.prompt_tokens,
        "rounds": args.rounds,
        "cores": {name: e["cpus"] for name, e in ENGINES.items()},
        "model": {"hidden": spec.hidden_size, "layers": spec.num_layers, "heads": spec.num_heads,
                  "head_dim": spec.head_dim, "intermediate": spec.intermediate_size},
        "pcp2_seconds_per_prefill": [{k: round(v, 4) for k, v in rank.items()} for rank in result["per_rank_seconds"]],
        "startup_s": result["startup_s"],
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
