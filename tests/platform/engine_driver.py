"""Runs one vLLM engine for the platform e2e tests and writes what it saw as JSON (a script, not a test module).

`python engine_driver.py <spec.json> <out.json>`; spec keys: model, platform ("ascend" or "cpu"), runner ("v1" or
"v2"), prompts, max_tokens, logprobs, sleep (bool), additional_config (dict), engine (extra LLM kwargs), or
bad_configs (a list of additional_configs that must each fail start-up). A separate
process per engine keeps vLLM's process-wide platform choice and environment out of the pytest process.
"""

from __future__ import annotations

import json
import os
import sys
import time


def _environment(spec: dict) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if spec.get("runner", "v1") == "v2" else "0"
    if spec.get("platform", "ascend") == "ascend":
        os.environ["ASCEND_VLLM_SIMULATE"] = "1"
    else:
        os.environ.pop("ASCEND_VLLM_SIMULATE", None)


def _outputs(results) -> list[dict]:
    rows = []
    for r in results:
        out = r.outputs[0]
        logprobs = [{str(tok): lp.logprob for tok, lp in step.items()} for step in (out.logprobs or [])]
        rows.append({"token_ids": list(out.token_ids), "text": out.text, "logprobs": logprobs})
    return rows


def main(spec_path: str, out_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    _environment(spec)
    from vllm import LLM, SamplingParams

    result: dict = {"spec": spec}
    engine_kwargs = dict(dtype="float32", max_model_len=256, enforce_eager=True, max_num_seqs=4, block_size=32,
                         max_num_batched_tokens=64, enable_chunked_prefill=True, enable_prefix_caching=False,
                         seed=0)
    engine_kwargs.update(spec.get("engine", {}))
    if spec.get("additional_config") is not None:
        engine_kwargs["additional_config"] = spec["additional_config"]
    if spec.get("sleep"):
        engine_kwargs["enable_sleep_mode"] = True
    if "bad_configs" in spec:  # start-up must fail in config validation, before any engine process starts
        result["startup_errors"] = []
        for bad in spec["bad_configs"]:
            try:
                LLM(model=spec["model"], **{**engine_kwargs, "additional_config": bad})
                result["startup_errors"].append(None)
            except Exception as exc:
                result["startup_errors"].append({"type": type(exc).__name__, "message": str(exc)})
        with open(out_path, "w") as f:
            json.dump(result, f)
        return 0
    t0 = time.perf_counter()
    try:
        llm = LLM(model=spec["model"], **engine_kwargs)
    except Exception as exc:  # config errors: the tests check the message
        result["startup_error"] = {"type": type(exc).__name__, "message": str(exc)}
        with open(out_path, "w") as f:
            json.dump(result, f)
        return 0
    result["startup_s"] = time.perf_counter() - t0
    params = SamplingParams(max_tokens=spec.get("max_tokens", 24), temperature=0.0, logprobs=spec.get("logprobs", 5))
    t1 = time.perf_counter()
    result["outputs"] = _outputs(llm.generate(spec["prompts"], params, use_tqdm=False))
    result["generate_s"] = time.perf_counter() - t1
    if spec.get("platform", "ascend") == "ascend":
        result["usage"] = llm.collective_rpc("ascend_usage")[0]
    if spec.get("sleep"):
        llm.sleep(level=1)
        result["asleep"] = llm.collective_rpc("ascend_usage")[0]["sleep"]
        llm.wake_up(tags=["weights"])
        llm.wake_up(tags=["kv_cache"])
        result["awake"] = llm.collective_rpc("ascend_usage")[0]["sleep"]
        result["outputs_after_sleep"] = _outputs(llm.generate(spec["prompts"], params, use_tqdm=False))
    with open(out_path, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
