"""Run engines one after another in this process and print what each resolved to, sized and generated, one JSON line
each (`FACTS <name> {...}`): on the device lane (emulated NPU runtime, the environment from the test) or, with the
same plan, the simulated lane (the comparison).

    python device_engines.py PLAN_JSON

PLAN_JSON: [{"name", "model", "runner" ("v1"/"v2"), "engine" (LLM kwargs), "prompts" ([[length, offset], ...]),
"max_tokens", "sleep_levels" ([1, 2])}]. The engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0,
one rank; a TP engine's ranks are vLLM's own worker processes), through the testkit's `EngineSession`; the emulated
runtime is installed before vLLM resolves its platform, as an engine host's `--setup` would. Between engines the
process's card is read again (`card_stopped`). vLLM logs to stdout; the test reads each engine's KV sizing there,
after the `ENGINE <name>` marker this script prints before it.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any


def _card() -> dict[str, Any] | None:
    """The emulated card's memory and graph counters (None in the simulated lane)."""
    from ascend_testkit import npu_runtime

    if not npu_runtime.installed():
        return None
    return npu_runtime.card_report()


def _prompts(spec: dict[str, Any]) -> list[str]:
    from ascend_testkit.models.tiny_llama import prompt_of_length

    return [prompt_of_length(n, offset=offset) for n, offset in spec["prompts"]]


def _generate(session: Any, prompts: list[str], max_tokens: int) -> list[dict[str, Any]]:
    outputs = session.generate(prompts, sampling={"max_tokens": max_tokens, "temperature": 0, "logprobs": 5,
                                                  "ignore_eos": True})["outputs"]
    return [{"token_ids": o["token_ids"], "logprobs": o["logprobs"]} for o in outputs]


def _sleep_cycle(session: Any, level: int, prompts: list[str], max_tokens: int) -> dict[str, Any]:
    """Sleep at `level`, read the card, wake (weights, then the KV cache; level 2 reloads the weights as a user
    must), read the card again and generate."""
    before = _card()
    session.sleep(level=level)
    asleep = {"card": _card(), "state": session.usage()[0]["sleep"]}
    session.wake_up(["weights"])
    session.wake_up(["kv_cache"])
    if level == 2:
        session.rpc("ascend_testkit.probes:reload_weights")
    return {"before": before, "asleep": asleep, "awake": {"card": _card(), "state": session.usage()[0]["sleep"]},
            "outputs": _generate(session, prompts, max_tokens)}


def run(spec: dict[str, Any], session: Any) -> dict[str, Any]:
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = {"v1": "0", "v2": "1"}[spec["runner"]]
    print(f"ENGINE {spec['name']}", flush=True)
    facts: dict[str, Any] = {"card_before": _card()}
    try:
        session.start(spec["model"], engine=spec["engine"])
        from vllm.platforms import current_platform

        facts["platform"] = f"{type(current_platform).__module__}.{type(current_platform).__qualname__}"
        facts["num_blocks"] = session.total_blocks()
        facts["card_started"] = _card()
        prompts = _prompts(spec)
        facts["outputs"] = _generate(session, prompts, spec["max_tokens"])
        facts["usage"] = session.usage()
        facts["card_generated"] = _card()
        for level in spec.get("sleep_levels", ()):
            facts[f"sleep{level}"] = _sleep_cycle(session, level, prompts, spec["max_tokens"])
    except Exception as exc:  # the test reports how far the lane got
        traceback.print_exc()
        facts["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    finally:
        try:
            session.stop()
        except Exception as exc:
            traceback.print_exc()
            facts.setdefault("error", f"stop: {type(exc).__name__}: {exc}"[:2000])
    facts["card_stopped"] = _card()
    return facts


def main(plan: list[dict[str, Any]]) -> None:
    from ascend_testkit import npu_runtime

    npu_runtime.install_if_requested()
    # The platform is resolved once per process, before any engine picks its runner: started without
    # VLLM_USE_V2_MODEL_RUNNER, a process runs either runner (the simulated lane turns Triton's interpreter on then).
    from vllm.platforms import current_platform  # noqa: F401

    from ascend_testkit.engine.session import EngineSession

    session = EngineSession()
    for spec in plan:
        facts = run(spec, session)
        print(f"FACTS {spec['name']} " + json.dumps(facts, default=str), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
