"""Speculative decoding benchmark: acceptance, target passes per token and throughput against no speculation.

Model Runner V2 (default, the simulated lane's runner): every method the Ascend speculators run, EAGLE, MTP, DFlash,
DFlash2 and DSpark, each on the tiny target its drafter needs (`ascend_testkit.speculation.MRV2_CASES`: an
EAGLE-compatible Llama for EAGLE and DFlash, a MiMo with its own MTP layer for MTP, a bigram Llama for DFlash2 and
DSpark), with the self-draft where the method can take one (DFlash: a random draft), a noisy copy of that self-draft
(acceptance below 1: steps that accept some drafts and reject the rest, so the verifier's rejection and the
runner's rollback of rejected tokens are timed), and each target once without speculation, all in one engine host,
one engine after another, same engine settings. `--runner v1`: vLLM's V1 runner (draft_model, EAGLE with a self and
a noisy draft, DFlash; `--lane cpu` for vLLM's own CPU platform). Requests go one at a time (passes per token is per
request). Prints ONE JSON object as the last line of stdout (logs go to stderr):

  {"methods": [{"method", "draft", "target", "acceptance_per_position", "mean_accepted_length",
                "target_passes_per_token", "rejected_draft_tokens", "lossless", "tokens_per_s",
                "speedup_vs_no_spec", "tokens_per_s_ratio", "verifier", "speculator"}, ...],
   "min_self_draft_acceptance": ..., "no_spec": {...}, "no_spec_by_target": {...}, "goal": {...}, "lane", "runner"}

`tokens_per_s_ratio` = tokens/s with speculation / tokens/s of the same target without (`speedup_vs_no_spec` is the
same figure, kept for older readers). Goal: with a self-draft and k = 3, target passes per token <= 0.26 (the floor is
1 / (k + 1) = 0.25, plus the prefill pass). Tokens/s on these tiny models measure overhead, not the speed-up a real
model gets: a draft as large as the target costs as much as the target, and in the simulated lane every kernel runs
on the CPU.

Usage: uv run --no-sync python benchmarks/specdecode.py [--max-tokens 160] [--num-prompts 2]
       [--methods eagle,mtp,dflash,dflash2,dspark] [--runner v2|v1] [--lane simulated|cpu]
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
ENGINE_KWARGS = {
    "dtype": "float32",
    "max_model_len": 256,
    "enforce_eager": True,
    "max_num_seqs": 4,
    "block_size": 32,
    "seed": 0,
}
V1_METHODS = ("draft_model", "eagle", "dflash")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _plan_v2(cache: Path, wanted: set[str]) -> list[dict]:
    """(label, target, draft kind, model, spec, engine extras) for each wanted MRV2 method and each baseline."""
    from ascend_testkit.speculation import MRV2_CASES, baseline_of, mrv2_case_models

    chosen = [c for c in MRV2_CASES if c.family in wanted and c.draft in ("self", "noisy", "random")]
    cases = chosen + list({baseline_of(c).name: baseline_of(c) for c in chosen}.values())
    models = mrv2_case_models(cache, K, cases)
    return [{"method": c.family, "target": c.target, "draft": c.draft, **models[c.name]} for c in cases]


def _plan_v1(cache: Path, wanted: set[str]) -> list[dict]:
    from ascend_testkit.models import drafts as dc
    from ascend_testkit.models.tiny_llama import cached_tiny_llama
    from ascend_testkit.speculation import NOISE

    target = dc.eagle_compatible_target(cached_tiny_llama(cache_dir=cache), sliding_window=WINDOW)
    drafts = {
        ("draft_model", "self"): str(target),
        ("eagle", "self"): str(dc.eagle_draft(target, cache / f"{target.name}-eagle-self", self_draft=True)),
        ("eagle", "noisy"): str(
            dc.eagle_draft(
                target, cache / f"{target.name}-eagle-noisy{NOISE['eagle']}", self_draft=True, noise=NOISE["eagle"]
            )
        ),
        ("dflash", "random"): str(dc.dflash_draft(target, cache / f"{target.name}-dflash-rand")),
    }
    plan = [{"method": None, "target": "llama", "draft": "none", "model": str(target), "spec": None, "engine": {}}]
    for (method, draft), model in drafts.items():
        if method in wanted:
            plan.append(
                {
                    "method": method,
                    "target": "llama",
                    "draft": draft,
                    "model": str(target),
                    "engine": {},
                    "spec": {"method": method, "model": model, "num_speculative_tokens": K},
                }
            )
    return plan


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--num-prompts", type=int, default=2)
    parser.add_argument("--methods", default=None, help="comma-separated; default: every method of the runner")
    parser.add_argument("--runner", choices=("v2", "v1"), default="v2", help="Model Runner V2 or vLLM's V1 runner")
    parser.add_argument(
        "--lane",
        choices=("simulated", "cpu"),
        default="simulated",
        help="simulated-NPU lane (our platform) or vLLM's own CPU platform (V1 runner only)",
    )
    args = parser.parse_args()
    if args.lane == "cpu" and args.runner == "v2":
        parser.error("vLLM's CPU platform runs the V1 runner here (no Triton CPU backend): use --runner v1")

    from ascend_testkit.engine import EngineHost
    from ascend_testkit.models.tiny_llama import prompt_of_length
    from ascend_testkit.speculation import METHODS, measure

    every = METHODS if args.runner == "v2" else V1_METHODS
    wanted = set(args.methods.split(",")) if args.methods else set(every)
    unknown = wanted - set(every)
    if unknown:
        parser.error(f"--methods {sorted(unknown)} not run by the {args.runner} runner (choose from {list(every)})")
    lane = "simulated-npu" if args.lane == "simulated" else "vllm-cpu"
    prompts = [prompt_of_length(16, offset=37 * i) for i in range(args.num_prompts)]
    with (
        tempfile.TemporaryDirectory(prefix="specdecode-bench-") as tmp,
        EngineHost("specdecode", lane=args.lane, runner=args.runner, log_dir=tmp) as host,
    ):
        cache = Path(os.environ.get("ASCEND_VLLM_CACHE") or tmp) / "models"
        plan = (_plan_v2 if args.runner == "v2" else _plan_v1)(cache, wanted)
        engine_kwargs = dict(ENGINE_KWARGS)
        if lane == "vllm-cpu":
            engine_kwargs["worker_cls"] = "ascend_specdecode.cpu_worker.SpecDecodeCPUWorker"
        runs = []
        # Each target's baseline right before its methods, so that load changes on the machine skew ratios least.
        order = {t: i for i, t in enumerate(dict.fromkeys(p["target"] for p in plan))}
        for item in sorted(plan, key=lambda p: (order[p["target"]], p["spec"] is not None)):
            log(f"running {item['method'] or 'no speculation'} on the {item['target']} target ...")
            r = measure(host, item["model"], item["spec"], prompts, args.max_tokens, **engine_kwargs, **item["engine"])
            runs.append((item, r))
    base = {item["target"]: r for item, r in runs if item["spec"] is None}
    base_tps = {t: r["generated_tokens"] / r["seconds"] for t, r in base.items()}
    methods = []
    for item, r in runs:
        if item["spec"] is None:
            continue
        tps = r["generated_tokens"] / r["seconds"]
        usage = (r.get("usage") or [{}])[0]
        methods.append(
            {
                "method": item["method"],
                "draft": item["draft"],
                "target": item["target"],
                "acceptance_per_position": r["acceptance"]["acceptance_per_position"],
                "mean_accepted_length": r["acceptance"]["mean_accepted_length"],
                "target_passes_per_token": round(r["target_passes"] / r["generated_tokens"], 4),
                "rejected_draft_tokens": r["acceptance"]["num_draft_tokens"] - r["acceptance"]["num_accepted_tokens"],
                "lossless": r["token_ids"] == base[item["target"]]["token_ids"],
                "tokens_per_s": round(tps, 1),
                "tokens_per_s_ratio": round(tps / base_tps[item["target"]], 3),
                "speedup_vs_no_spec": round(tps / base_tps[item["target"]], 3),
                "verifier": usage.get("verifier") or r["parts"]["verifier"],
                "speculator": usage.get("speculator"),
            }
        )
    self_drafts = [m for m in methods if m["draft"] == "self"]
    min_self = min((min(m["acceptance_per_position"]) for m in self_drafts), default=None)
    best_passes = min((m["target_passes_per_token"] for m in self_drafts), default=None)

    def no_spec(target: str) -> dict:
        return {
            "tokens_per_s": round(base_tps[target], 1),
            "target_passes_per_token": round(base[target]["target_passes"] / base[target]["generated_tokens"], 4),
        }

    result = {
        "methods": methods,
        "min_self_draft_acceptance": min_self,
        "no_spec": no_spec("llama" if "llama" in base else next(iter(base))),
        "no_spec_by_target": {t: no_spec(t) for t in base},
        "goal": {
            "k": K,
            "target_passes_per_token_max": GOAL_PASSES_PER_TOKEN,
            "met": best_passes is not None and best_passes <= GOAL_PASSES_PER_TOKEN,
        },
        "lane": lane,
        "runner": args.runner,
        "max_tokens": args.max_tokens,
        "num_prompts": len(prompts),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
