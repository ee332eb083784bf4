"""Speculative decoding benchmark: acceptance, target passes per token and throughput against no speculation.

Runs a tiny EAGLE-compatible Llama target (peaked outputs) in a real vLLM engine, once without speculation and once
per method, the engines one after another in one engine host (`ascend_testkit.engine`), requests one at a time (so
passes per token is per request). Prints ONE
JSON object as the last line of stdout (logs go to stderr):

  {"methods": [{"method", "draft", "acceptance_per_position", "mean_accepted_length", "target_passes_per_token",
                "lossless", "tokens_per_s", "speedup_vs_no_spec"}, ...],
   "min_self_draft_acceptance": ..., "no_spec": {...}, "goal": {...}, "lane": ...}

Goal: with a self-draft and k = 3, target passes per token <= 0.26 (the floor is 1 / (k + 1) = 0.25, plus the
prefill pass). Tokens/s on this tiny model measure overhead, not the speed-up a real model gets: a draft as large
as the target costs as much as the target.

Usage: uv run --no-sync python benchmarks/specdecode.py [--max-tokens 160] [--methods draft_model,eagle,dflash]
       [--lane simulated|cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

K = 3
WINDOW = 4
GOAL_PASSES_PER_TOKEN = 0.26


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--num-prompts", type=int, default=3)
    parser.add_argument("--methods", default="draft_model,eagle,dflash")
    parser.add_argument("--lane", choices=("simulated", "cpu"), default="simulated",
                        help="simulated-NPU lane (our platform) or vLLM's own CPU platform")
    args = parser.parse_args()

    from ascend_testkit.engine import EngineHost
    from ascend_testkit.models import drafts as dc
    from ascend_testkit.models.tiny_llama import cached_tiny_llama, prompt_of_length
    from ascend_testkit.speculation import measure

    lane = "simulated-npu" if args.lane == "simulated" else "vllm-cpu"
    with tempfile.TemporaryDirectory(prefix="specdecode-bench-") as tmp, \
            EngineHost("specdecode", lane=args.lane, runner="v1", log_dir=tmp) as host:
        cache = Path(os.environ.get("ASCEND_VLLM_CACHE") or tmp) / "models"
        target = dc.eagle_compatible_target(cached_tiny_llama(cache_dir=cache), sliding_window=WINDOW)
        drafts = {
            ("draft_model", "self"): str(target),
            ("eagle", "self"): str(dc.eagle_draft(target, cache / f"{target.name}-eagle-self", self_draft=True)),
            ("dflash", "random"): str(dc.dflash_draft(target, cache / f"{target.name}-dflash-rand")),
        }
        wanted = set(args.methods.split(","))
        engine_kwargs = {
            "dtype": "float32",
            "max_model_len": 256,
            "enforce_eager": True,
            "max_num_seqs": 4,
            "block_size": 32,
            "seed": 0,
        }
        if lane == "vllm-cpu":
            engine_kwargs["worker_cls"] = "ascend_specdecode.cpu_worker.SpecDecodeCPUWorker"
        prompts = [prompt_of_length(16, offset=37 * i) for i in range(args.num_prompts)]

        def run(spec: dict | None) -> dict:
            log(f"running {spec['method'] if spec else 'no speculation'} ...")
            return measure(host, str(target), spec, prompts, args.max_tokens, **engine_kwargs)

        base = run(None)
        base_tps = base["generated_tokens"] / base["seconds"]
        methods = []
        for (method, draft), model in drafts.items():
            if method not in wanted:
                continue
            r = run({"method": method, "model": model, "num_speculative_tokens": K})
            tps = r["generated_tokens"] / r["seconds"]
            methods.append(
                {
                    "method": method,
                    "draft": draft,
                    "acceptance_per_position": r["acceptance"]["acceptance_per_position"],
                    "mean_accepted_length": r["acceptance"]["mean_accepted_length"],
                    "target_passes_per_token": round(r["target_passes"] / r["generated_tokens"], 4),
                    "lossless": r["token_ids"] == base["token_ids"],
                    "tokens_per_s": round(tps, 1),
                    "speedup_vs_no_spec": round(tps / base_tps, 3),
                    "verifier": r["parts"]["verifier"],
                }
            )
    self_drafts = [m for m in methods if m["draft"] == "self"]
    min_self = min((min(m["acceptance_per_position"]) for m in self_drafts), default=None)
    best_passes = min((m["target_passes_per_token"] for m in self_drafts), default=None)
    result = {
        "methods": methods,
        "min_self_draft_acceptance": min_self,
        "no_spec": {
            "tokens_per_s": round(base_tps, 1),
            "target_passes_per_token": round(base["target_passes"] / base["generated_tokens"], 4),
        },
        "goal": {
            "k": K,
            "target_passes_per_token_max": GOAL_PASSES_PER_TOKEN,
            "met": best_passes is not None and best_passes <= GOAL_PASSES_PER_TOKEN,
        },
        "lane": lane,
        "max_tokens": args.max_tokens,
        "num_prompts": len(prompts),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
