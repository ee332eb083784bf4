"""The device lane's engines: `AscendNPUPlatform` and `NPUWorker` inside real vLLM engines on the testkit's emulated
NPU runtime (`ASCEND_TESTKIT_NPU_RUNTIME=emulated`, `ASCEND_VLLM_SIMULATE` unset, `ASCEND_TESTKIT_NPU_MEMORY` cards).

`device_starts[utilization]`: one engine per gpu_memory_utilization, all started side by side in their own processes
(module-scoped: ~30 s for the lot on two cores), each reporting what it resolved to, its KV sizing from vLLM's log,
and how far it got.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

CAPACITY = 512 << 20
UTILIZATIONS = (0.25, 0.5)
START_TIMEOUT_S = 300
_KV_MEMORY = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
_KV_TOKENS = re.compile(r"NPU KV cache size: ([\d,]+) tokens")


def device_env(cache_root: Path) -> dict[str, str]:
    from ascend_testkit.engine.env import vllm_cache_root
    from ascend_testkit.reach.collect import reach_env

    # The shared model-info cache spares vLLM's inspection subprocess, which would load the general plugins after
    # resolving its platform without torch_npu (the plugin then refuses the stale answer).
    root = vllm_cache_root(cache_root / "vllm-device-lane")
    env = dict(os.environ)
    env.pop("ASCEND_VLLM_SIMULATE", None)
    env.pop("ASCEND_TESTKIT_TORCH_NPU", None)
    env.update({"ASCEND_TESTKIT_NPU_RUNTIME": "emulated", "ASCEND_TESTKIT_NPU_MEMORY": str(CAPACITY),
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_USE_V2_MODEL_RUNNER": "0", "HF_HUB_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false", "VLLM_CACHE_ROOT": str(root)})
    env.update(reach_env())  # tests/reach counts what these engines ran (the device-lane modules)
    return env


@pytest.fixture(scope="session")
def device_capacity() -> int:
    return CAPACITY


def simulated_env(cache_root: Path) -> dict[str, str]:
    """The same engine in the simulated lane: what the device lane is compared with."""
    env = device_env(cache_root)
    env.pop("ASCEND_TESTKIT_NPU_RUNTIME")
    env.pop("ASCEND_TESTKIT_NPU_MEMORY")
    env["ASCEND_VLLM_SIMULATE"] = "1"
    return env


@pytest.fixture(scope="module")
def device_starts(tiny_model, cache_root) -> dict[float | str, dict]:
    """Facts per utilization of the device-lane engines, and under "simulated" the simulated lane's engine."""
    script = Path(__file__).with_name("start_engine.py")
    env = device_env(cache_root)
    procs = {u: subprocess.Popen([sys.executable, str(script), str(tiny_model), str(u)], env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE) for u in UTILIZATIONS}
    procs["simulated"] = subprocess.Popen([sys.executable, str(script), str(tiny_model), "0.5"],
                                          env=simulated_env(cache_root), text=True, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE)
    starts = {}
    for utilization, proc in procs.items():
        out, err = proc.communicate(timeout=START_TIMEOUT_S)
        lines = [line for line in out.splitlines() if line.startswith("FACTS ")]
        if not lines:
            pytest.fail(f"the device-lane engine (utilization {utilization}) printed no facts; rc {proc.returncode}; "
                        f"stderr tail: {err[-3000:]}")
        facts = json.loads(lines[-1].removeprefix("FACTS "))
        log = out + err  # vLLM logs to stdout
        memory, tokens = _KV_MEMORY.findall(log), _KV_TOKENS.findall(log)
        facts["kv_memory_gib"] = float(memory[-1]) if memory else None
        facts["kv_tokens"] = int(tokens[-1].replace(",", "")) if tokens else None
        facts["log_tail"] = log[-3000:]
        starts[utilization] = facts
    return starts
