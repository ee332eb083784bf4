"""`ascend_platform.platform.NPUPlatform` is bound to the lane, in a fresh interpreter per lane."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

CODE = (
    "import json, sys\n"
    "from ascend_platform.platform import NPUPlatform as P\n"
    "print(json.dumps([P.__name__, P.device_name, P.device_type, P.dispatch_key, P.ray_device_key,\n"
    "                  P.device_control_env_var, P.dist_backend, P().is_out_of_tree(), 'torch_npu' in sys.modules]))\n"
)


def _lane(simulate: bool) -> list:
    env = {k: v for k, v in os.environ.items() if k != "ASCEND_VLLM_SIMULATE"}
    if simulate:
        env["ASCEND_VLLM_SIMULATE"] = "1"
    out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("simulate", "expected"), [
    (False, ["AscendNPUPlatform", "npu", "npu", "PrivateUse1", "NPU", "ASCEND_RT_VISIBLE_DEVICES", "hccl", True,
             False]),
    (True, ["SimulatedNPUPlatform", "cpu", "cpu", "CPU", "NPU", "CPU_VISIBLE_MEMORY_NODES", "gloo", True, False]),
])
def test_lane_binding(simulate, expected):
    assert _lane(simulate) == expected
