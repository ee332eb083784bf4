"""`ascend-vllm demo`: generate with a real vLLM engine through the Ascend platform in the simulated-NPU lane.

Builds (once, cached) a tiny random Llama offline, starts vLLM with `ASCEND_VLLM_SIMULATE=1` so the Ascend platform,
worker, KV allocator and attention backend run on the CPU, and prints each prompt with its output, decode tokens/s
and the engine's start-up time. Needs no network and no NPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HELP = "Run generation through the Ascend platform in the simulated-NPU lane on a tiny offline model."

_ENV = {"ASCEND_VLLM_SIMULATE": "1", "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompts", type=int, default=4, help="number of prompts (default 4)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens to generate per prompt (default 32)")
    parser.add_argument("--runner", choices=("v1", "v2"), default="v1",
                        help="vLLM model runner: v1, or v2 (MRV2, needs a Triton CPU backend)")
    parser.add_argument("--cache-dir", default=None,
                        help="tiny model cache (default: $ASCEND_VLLM_CACHE or ~/.cache/ascend-vllm)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the readable report")
    parser.add_argument("--verbose", action="store_true", help="keep vLLM's INFO logs")


def _prompts(n: int) -> list[str]:
    from ascend_testkit.models.tiny_llama import prompt_of_length

    lengths = [5, 31, 33, 70, 100, 12, 47, 90]
    return [prompt_of_length(lengths[i % len(lengths)], offset=11 * i) for i in range(n)]


def run(args: argparse.Namespace) -> int:
    for key, value in _ENV.items():
        os.environ.setdefault(key, value)
    if not args.verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if args.runner == "v2" else "0"
    from pathlib import Path

    from ascend_testkit.models.tiny_llama import cached_tiny_llama

    t0 = time.perf_counter()
    model = cached_tiny_llama(cache_dir=Path(args.cache_dir) / "models" if args.cache_dir else None)
    build_s = time.perf_counter() - t0

    from vllm import LLM, SamplingParams

    t1 = time.perf_counter()
    llm = LLM(model=str(model), dtype="float32", max_model_len=256, enforce_eager=True, max_num_seqs=4,
              block_size=32, max_num_batched_tokens=128, seed=0)
    startup_s = time.perf_counter() - t1
    prompts = _prompts(args.prompts)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    t2 = time.perf_counter()
    results = llm.generate(prompts, params, use_tqdm=False)
    gen_s = time.perf_counter() - t2
    usage = llm.collective_rpc("ascend_usage")[0]
    out_tokens = sum(len(r.outputs[0].token_ids) for r in results)
    report = {
        "platform": type(__import__("vllm.platforms", fromlist=["current_platform"]).current_platform).__name__,
        "runner": usage["facts"].get("runner"),
        "kernel_backend": usage["facts"].get("kernel_backend"),
        "attention": usage["attention_impls"],
        "model": str(model),
        "model_build_s": round(build_s, 2),
        "startup_s": round(startup_s, 2),
        "generate_s": round(gen_s, 2),
        "output_tokens": out_tokens,
        "tokens_per_s": round(out_tokens / gen_s, 1) if gen_s else None,
        "samples": [{"prompt": p, "output": r.outputs[0].text} for p, r in zip(prompts, results, strict=True)],
    }
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"platform {report['platform']} (simulated NPU on the CPU), runner {report['runner']}, "
          f"kernels {report['kernel_backend']}, attention {', '.join(report['attention'])}")
    for i, s in enumerate(report["samples"]):
        prompt = s["prompt"] if len(s["prompt"]) <= 60 else s["prompt"][:57] + "..."
        print(f"[{i}] prompt: {prompt}\n    output: {s['output']}")
    print(f"start-up {report['startup_s']:.1f} s (model build {report['model_build_s']:.1f} s), "
          f"{out_tokens} tokens in {report['generate_s']:.2f} s = {report['tokens_per_s']} tokens/s")
    sys.stdout.flush()
    return 0
