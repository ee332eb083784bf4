"""The emulated NPU runtime on its own (in a fresh process: installing it renames torch's PrivateUse1 for good):
memory against the configured capacity, the `torch.npu` / `torch.accelerator` answers, HCCL over gloo."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = r"""
import json, torch, torch.distributed as dist
from ascend_testkit import npu_runtime
from ascend_platform import device_seam
npu_runtime.install_if_requested()
free0, total = torch.npu.mem_get_info()
block = torch.empty(64 << 20, dtype=torch.uint8, device=device_seam.worker_device(0))
free1, _ = torch.accelerator.get_memory_info()
stats = torch.accelerator.memory_stats()
del block
free2, _ = torch.npu.mem_get_info()
try:
    torch.empty(1, device="npu")
    npu_tensor = "created"
except Exception as exc:
    npu_tensor = type(exc).__name__
dist.init_process_group("hccl", init_method="tcp://127.0.0.1:29533", rank=0, world_size=1)
t = torch.ones(3)
dist.all_reduce(t)
peak = stats["allocated_bytes.all.peak"]
print(json.dumps({"total": total, "used": free0 - free1, "freed": free2 - free1, "peak": peak,
                  "count": torch.npu.device_count(), "device": str(device_seam.worker_device(0)),
                  "npu_tensor": npu_tensor, "allreduce": t.tolist(), "backend": dist.get_backend()}))
"""


def test_the_emulated_card_accounts_memory_and_forms_hccl_groups():
    env = dict(os.environ, ASCEND_TESTKIT_NPU_RUNTIME="emulated", ASCEND_TESTKIT_NPU_MEMORY="256MiB",
               ASCEND_TESTKIT_NPU_COUNT="2")
    env.pop("ASCEND_VLLM_SIMULATE", None)
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["total"] == 256 << 20 and facts["count"] == 2 and facts["device"] == "cpu"
    assert facts["used"] == 64 << 20 and facts["freed"] == 64 << 20 and facts["peak"] >= 64 << 20
    # Tensors on `npu` itself fail loudly: the device lane must place them through the device seam.
    assert facts["npu_tensor"] == "NotImplementedError"
    assert facts["backend"] == "hccl" and facts["allreduce"] == [1.0, 1.0, 1.0]


def test_the_emulated_runtime_refuses_the_simulated_lane():
    env = dict(os.environ, ASCEND_TESTKIT_NPU_RUNTIME="emulated", ASCEND_VLLM_SIMULATE="1")
    done = subprocess.run([sys.executable, "-c", "from ascend_testkit import npu_runtime; npu_runtime.requested()"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "unset ASCEND_VLLM_SIMULATE=1" in done.stderr
