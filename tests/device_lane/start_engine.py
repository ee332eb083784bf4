"""Start one vLLM engine and print what it resolved to and generated as one JSON line: on the device lane (emulated
NPU runtime, its environment from the test) or, with the same arguments, the simulated lane (the comparison).

    python start_engine.py MODEL_DIR GPU_MEMORY_UTILIZATION

The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0); the emulated runtime is installed before vLLM
resolves its platform, as an engine host's `--setup` would. vLLM's log goes to stderr (the test reads its KV sizing).
Prompts end before, on and after the 128-token block edge; greedy, 8 tokens each, top-5 logprobs kept.
"""

from __future__ import annotations

import json
import sys
import traceback

PROMPT_LENGTHS = (5, 127, 129)
MAX_TOKENS = 8


def main(model: str, utilization: float) -> None:
    from ascend_testkit import npu_runtime

    npu_runtime.install_if_requested()
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    facts = {"platform": f"{type(current_platform).__module__}.{type(current_platform).__qualname__}"}
    try:
        llm = LLM(model, dtype="bfloat16", max_model_len=256, enforce_eager=True, max_num_seqs=4, block_size=128,
                  max_num_batched_tokens=64, gpu_memory_utilization=utilization, seed=0)
        core = llm.llm_engine.engine_core.engine_core
        facts["num_blocks"] = core.scheduler.kv_cache_manager.block_pool.num_gpu_blocks
        from ascend_testkit.models.tiny_llama import prompt_of_length

        prompts = [prompt_of_length(n, offset=3 * n) for n in PROMPT_LENGTHS]
        outputs = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0, logprobs=5,
                                                       ignore_eos=True))
        facts["outputs"] = [{"token_ids": list(o.outputs[0].token_ids),
                             "logprobs": [{str(t): lp.logprob for t, lp in step.items()}
                                          for step in o.outputs[0].logprobs]} for o in outputs]
        facts["usage"] = core.model_executor.collective_rpc("ascend_usage")[0]
    except Exception as exc:  # the test reports how far the lane got
        traceback.print_exc()
        facts["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    print("FACTS " + json.dumps(facts, default=str), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
