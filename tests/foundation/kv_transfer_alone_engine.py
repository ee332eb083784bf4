"""One plain vLLM engine, driven over stdin/stdout by test_kv_transfer_alone_pd.py.

Runs in the fresh environment that holds only ascend-kv-transfer (and what it declares), the locked vLLM CPU build
and Mooncake: so this file imports vLLM and the standard library only. `AscendMooncakeConnector` reaches vLLM
through ascend-kv-transfer's own `vllm.general_plugins` entry point, as it does for a user.

argv[1]: JSON {model, engine: LLM keyword arguments}. Prints (each reply on a line starting with MARK)
{"ready": ..., "distributions": [the ascend-* distributions installed]} once the engine is up, then answers each
stdin line {"requests": [{id, prompt_token_ids, max_tokens, kv_transfer_params?}]} with one line
{"outputs": [{id, token_ids, kv_transfer_params, num_cached_tokens}]}; a line {"exit": true} (or EOF) ends it.
Errors are printed as {"error": "..."} and end the process.
"""

from __future__ import annotations

import importlib.metadata
import json
import select
import sys
import traceback

MARK = "@@kv-alone@@ "  # vLLM logs to stdout too: replies are the lines that start with this


def _reply(obj: dict) -> None:
    sys.stdout.write(MARK + json.dumps(obj) + "\n")
    sys.stdout.flush()


def _busy(llm) -> bool:
    return llm.llm_engine.engine_core.engine_core.scheduler.has_requests()  # in-process engine core


def _commands(llm):
    """stdin lines, stepping the engine between them while its scheduler has work, as vLLM's engine-core busy loop
    does (`LLM.generate` returns once the outputs are finished): a prefill's held hand-offs are offered, answered
    and released by the connector in those steps."""
    while True:
        busy = _busy(llm)
        ready, _, _ = select.select([sys.stdin], [], [], 0 if busy else 0.1)
        if ready:
            line = sys.stdin.readline()
            if not line:
                return
            yield line
        elif busy:
            llm.llm_engine.step()


def main() -> None:
    spec = json.loads(sys.argv[1])
    from vllm import LLM, SamplingParams

    llm = LLM(model=spec["model"], **spec["engine"])
    ours = sorted(d.metadata["Name"] for d in importlib.metadata.distributions()
                  if d.metadata["Name"].startswith("ascend"))
    _reply({"ready": True, "distributions": ours})
    for line in _commands(llm):
        command = json.loads(line)
        if command.get("exit"):
            break
        prompts, params = [], []
        for r in command["requests"]:
            extra = {"kv_transfer_params": r["kv_transfer_params"]} if r.get("kv_transfer_params") else None
            prompts.append({"prompt_token_ids": r["prompt_token_ids"]})
            params.append(SamplingParams(temperature=0.0, max_tokens=r["max_tokens"], extra_args=extra))
        results = llm.generate(prompts, params, use_tqdm=False)
        _reply({"outputs": [{"id": r["id"], "token_ids": list(out.outputs[0].token_ids),
                             "kv_transfer_params": out.kv_transfer_params,
                             "num_cached_tokens": out.num_cached_tokens}
                            for r, out in zip(command["requests"], results, strict=True)]})


if __name__ == "__main__":
    try:
        main()
    except Exception:
        _reply({"error": traceback.format_exc()})
        sys.exit(1)
