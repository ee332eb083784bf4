"""The one engine harness: real vLLM engines in child processes, driven over a pipe.

A host process (`python -m ascend_testkit.engine.host`) belongs to one lane, fixed when it starts (vLLM chooses its
platform once per process): the simulated-NPU lane (`ASCEND_VLLM_SIMULATE=1`) or vLLM's own CPU platform. It runs
engines one after another (`start` ... `stop` ... `start`), so the ~15 s a process spends importing vLLM is paid once
per lane, not once per engine. Each engine is a `vllm.LLM` with the engine core in the host process, which lets tests
read the scheduler and the connectors directly; the worker ranks of a multi-rank engine are vLLM's own processes.

    host = EngineHost("sim", lane="simulated", log_dir=tmp)      # the process starts; nothing is loaded yet
    host.start(model, runner="v2", max_model_len=256)           # an engine, as LLM(model, ...) builds it
    outs = host.generate(prompts, max_tokens=16, logprobs=5)    # token ids, text, top logprobs per step
    host.usage()                                                # what our parts did, per rank
    host.stop(); host.close()
"""

from ascend_testkit.engine.client import EngineError, EngineHost, EngineStartError
from ascend_testkit.engine.env import default_runner, engine_env
from ascend_testkit.engine.pool import HostPool

__all__ = ["EngineError", "EngineHost", "EngineStartError", "HostPool", "default_runner", "engine_env"]
