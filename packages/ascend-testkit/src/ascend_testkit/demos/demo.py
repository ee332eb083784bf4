"""`ascend-vllm demo`: generate with a real vLLM engine through the Ascend platform in the simulated-NPU lane.

Builds (once, cached) a tiny random Llama offline, starts vLLM with `ASCEND_VLLM_SIMULATE=1` so the Ascend platform,
worker, KV allocator and attention backend run on the CPU, and prints each prompt with its output, decode tokens/s
and the engine's start-up time. Needs no network and no NPU.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from ascend_testkit.demos.quiet import output_to_log
from ascend_testkit.models.checkpoint_cache import default_cache_root

HELP = "Run generation through the Ascend platform in the simulated-NPU lane on a tiny offline model."

_ENV = {"ASCEND_VLLM_SIMULATE": "1", "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompts", type=int, default=4, help="number of prompts (default 4)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens to generate per prompt (default 32)")
    parser.add_argument("--runner", choices=("auto", "v1", "v2"), default="auto",
                        help="vLLM model runner: auto (vLLM's default), v1, or v2 (Model Runner V2)")
    parser.add_argument("--cache-dir", default=None,
                        help="tiny model cache (default: $ASCEND_VLLM_CACHE or ~/.cache/ascend-vllm)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the readable report")
    parser.add_argument("--verbose", action="store_true",
                        help="show vLLM's logs and warnings here (by default they go to a log file under the cache)")


def _prompts(n: int) -> list[str]:
    from ascend_testkit.models.tiny_llama import prompt_of_length

    lengths = [5, 31, 33, 70, 100, 12, 47, 90]
    return [prompt_of_length(lengths[i % len(lengths)], offset=11 * i) for i in range(n)]


def _generate(args: argparse.Namespace, progress) -> dict:
    from pathlib import Path

    from ascend_testkit.models.tiny_llama import cached_tiny_llama

    t0 = time.perf_counter()
    model = cached_tiny_llama(cache_dir=Path(args.cache_dir) / "models" if args.cache_dir else None)
    build_s = time.perf_counter() - t0
    progress("starting a vLLM engine on the Ascend platform (simulated NPU) ...")
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    t1 = time.perf_counter()
    llm = LLM(model=str(model), dtype="float32", max_model_len=256, enforce_eager=True, max_num_seqs=4,
              block_size=32, max_num_batched_tokens=128, seed=0)
    startup_s = time.perf_counter() - t1
    progress(f"engine up in {startup_s:.1f} s; generating ...")
    prompts = _prompts(args.prompts)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    t2 = time.perf_counter()
    results = llm.generate(prompts, params, use_tqdm=False)
    gen_s = time.perf_counter() - t2
    usage = llm.collective_rpc("ascend_usage")[0]
    llm.llm_engine.engine_core.shutdown()  # stop the engine's processes now, not at interpreter exit
    out_tokens = sum(len(r.outputs[0].token_ids) for r in results)
    return {
        "platform": type(current_platform).__name__,
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


def run(args: argparse.Namespace) -> int:
    for key, value in _ENV.items():
        os.environ.setdefault(key, value)
    if args.runner != "auto":
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if args.runner == "v2" else "0"
    log_path = Path(args.cache_dir or default_cache_root()) / "logs" / f"demo-{time.strftime('%Y%m%d-%H%M%S')}.log"
    with output_to_log(log_path, enabled=not args.verbose) as out:
        def progress(msg: str) -> None:
            if not args.json:
                print(msg, file=out, flush=True)

        report = _generate(args, progress)
        report["log"] = None if args.verbose else str(log_path)
        if args.json:
            print(json.dumps(report), file=out)
            return 0
        print(f"platform {report['platform']} (simulated NPU on the CPU), runner {report['runner']}, "
              f"kernels {report['kernel_backend']}, attention {', '.join(report['attention'])}", file=out)
        for i, sample in enumerate(report["samples"]):
            prompt = sample["prompt"] if len(sample["prompt"]) <= 60 else sample["prompt"][:57] + "..."
            print(f"[{i}] prompt: {prompt}\n    output: {sample['output']}", file=out)
        print(f"start-up {report['startup_s']:.1f} s (model build {report['model_build_s']:.1f} s), "
              f"{report['output_tokens']} tokens in {report['generate_s']:.2f} s = {report['tokens_per_s']} tokens/s",
              file=out)
        if report["log"]:
            print(f"vLLM's log: {report['log']} (--verbose shows it here)", file=out)
    return 0
