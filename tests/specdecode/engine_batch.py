"""Run several speculative-decoding engines one after another in ONE process (`python engine_batch.py jobs.json`).

Each engine's start-up here is ~40 s, of which ~35 s is three processes (driver, engine core, worker) importing
vLLM; the engine itself needs a few seconds. So the jobs of one lane share a process: vLLM's in-process engine core
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`, set by the caller) and the single-process executor (`uni`), torn down between
engines as vLLM's own `cleanup_dist_env_and_memory` does (minus its accelerator cache calls, which fail on the CPU
device of an OOT platform). Each job is `ascend_specdecode.measure.generate` (unchanged); one result line per job
as soon as it finishes, or an `{"error": ...}` line naming what failed (later jobs still run).
"""

from __future__ import annotations

import gc
import json
import sys
import traceback

RESULT_PREFIX = "SPECDECODE_BATCH_RESULT "


def run(jobs: list[dict]) -> None:
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    from ascend_specdecode.measure import generate

    for job in jobs:
        job = {**job, "engine_kwargs": {**job.get("engine_kwargs", {}), "distributed_executor_backend": "uni"}}
        try:
            result = generate(job)
        except Exception as exc:  # reported to the test that needs this engine, by name
            result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
        print(RESULT_PREFIX + json.dumps({"case": job.get("case"), **result}), flush=True)
        gc.collect()  # the LLM of `generate` is gone: shut its engine down before the next one starts
        destroy_model_parallel()
        destroy_distributed_environment()
        gc.collect()


def main(argv: list[str]) -> int:
    with open(argv[0]) as f:
        jobs = json.load(f)
    run(jobs)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
