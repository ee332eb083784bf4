"""Put the emulated NPU runtime in place when a Python process starts, as an Ascend host has torch_npu installed.

Python imports `sitecustomize` at start-up from sys.path; `ascend_testkit.npu_runtime.process_env()` puts this folder
first on PYTHONPATH together with `ASCEND_TESTKIT_NPU_RUNTIME=emulated`, so every process of such an environment (an
engine host, `ascend-vllm serve`, the worker processes vLLM spawns) has the emulated card before vLLM resolves its
platform. Nothing is imported unless the variable asks for the runtime.
"""

import os

if os.environ.get("ASCEND_TESTKIT_NPU_RUNTIME", "").strip() == "emulated":
    from ascend_testkit.npu_runtime import install_if_requested

    install_if_requested()
