"""Run one vLLM engine over a fixed greedy workload and report what speculation did (tests and benchmarks).

`python -m ascend_specdecode.measure '<json spec>'` prints one JSON line: the generated token ids, the acceptance
report read from vLLM's spec-decode metrics, the number of target forward passes and the wall time of generation.
A subprocess per engine keeps engines from sharing a process (vLLM holds global state per engine).

Target forward passes are counted from vLLM's ``vllm:iteration_tokens_total`` histogram: one observation per
engine step, and every engine step runs the target once. Requests are generated one at a time so that passes per
generated token is a per-request figure (a batch would share one pass between requests).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

STEP_HISTOGRAM = "vllm:iteration_tokens_total"
RESULT_PREFIX = "SPECDECODE_RESULT "


def _engine_steps(metrics: Sequence[Any]) -> int:
    return sum(int(m.count) for m in metrics if m.name == STEP_HISTOGRAM)


def speculative_parts(worker: Any) -> dict[str, str | None]:
    """Class names of the runner, drafter and verifier a worker runs (called inside the worker via collective_rpc)."""
    runner = worker.model_runner

    def name(obj: Any) -> str | None:
        return None if obj is None else f"{type(obj).__module__}.{type(obj).__qualname__}"

    drafter = getattr(runner, "drafter", None) or getattr(runner, "speculator", None)
    return {
        "runner": name(runner),
        "drafter": name(drafter),
        "verifier": name(getattr(runner, "rejection_sampler", None)),
    }


def generate(job: Mapping[str, Any]) -> dict[str, Any]:
    """Run `job` in this process: {model, speculative_config|None, prompts, max_tokens, engine_kwargs, sequential}."""
    from vllm import LLM, SamplingParams

    from ascend_specdecode.metrics import EMPTY, acceptance_from_metrics

    spec = job.get("speculative_config")
    llm = LLM(
        model=job["model"],
        speculative_config=spec,
        disable_log_stats=False,
        **job.get("engine_kwargs", {}),
    )
    params = SamplingParams(temperature=0.0, max_tokens=int(job["max_tokens"]), ignore_eos=True)
    prompts = list(job["prompts"])
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))  # warm-up
    k = spec["num_speculative_tokens"] if spec else None
    before = llm.get_metrics()
    start = time.perf_counter()
    if job.get("sequential", True):
        outputs = [o for p in prompts for o in llm.generate([p], params, use_tqdm=False)]
    else:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    after = llm.get_metrics()
    token_ids = [list(o.outputs[0].token_ids) for o in outputs]
    parts = llm.collective_rpc(speculative_parts)[0]
    acceptance = acceptance_from_metrics(after, k).minus(acceptance_from_metrics(before, k)) if spec else EMPTY
    generated = sum(len(t) for t in token_ids)
    passes = _engine_steps(after) - _engine_steps(before)
    return {
        "token_ids": token_ids,
        "acceptance": acceptance.as_dict(),
        "target_passes": passes,
        "generated_tokens": generated,
        "seconds": elapsed,
        "parts": parts,
    }


def run_in_subprocess(job: Mapping[str, Any], env: Mapping[str, str] | None = None, timeout: float = 900) -> dict:
    """`generate(job)` in a fresh Python process; raises with the tail of its log when it fails."""
    proc = subprocess.run(
        [sys.executable, "-m", "ascend_specdecode.measure", json.dumps(job)],
        # collective_rpc ships `speculative_parts` to the worker by pickling it.
        env={**os.environ, "VLLM_ALLOW_INSECURE_SERIALIZATION": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    lines = (proc.stdout + proc.stderr).splitlines()
    causes = [line for line in lines if "Error" in line][:15]  # the root cause sits in a worker's log, not the tail
    tail = "\n".join([*causes, "...", *lines[-25:]])
    raise RuntimeError(f"engine run failed (exit {proc.returncode}) for {job.get('speculative_config')}:\n{tail}")


def main(argv: Sequence[str]) -> int:
    result = generate(json.loads(argv[0]))
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
