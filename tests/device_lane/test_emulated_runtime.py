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
npu_runtime.install_if_requested()
free0, total = torch.npu.mem_get_info()
block = torch.empty(64 << 20, dtype=torch.uint8, device="npu")
host = block.to("cpu")  # host memory: not the card's
free1, _ = torch.accelerator.get_memory_info()
stats = torch.accelerator.memory_stats()
del block
free2, _ = torch.npu.mem_get_info()
try:
    torch.empty(300 << 20, dtype=torch.uint8, device="npu")
    oom = "allocated"
except torch.OutOfMemoryError:
    oom = "OutOfMemoryError"
x = torch.arange(6, dtype=torch.float32, device="npu").view(2, 3)
y = (x * 2).sum(dim=1)
try:
    x + torch.ones(2, 3)
    mixed = "ran"
except RuntimeError as exc:
    mixed = "refused" if "same device" in str(exc) else str(exc)
pinned = torch.empty(8, pin_memory=True)
dist.init_process_group("hccl", init_method="tcp://127.0.0.1:29533", rank=0, world_size=1)
t = torch.ones(3, device="npu")
dist.all_reduce(t)
peak = stats["allocated_bytes.all.peak"]
print(json.dumps({"total": total, "used": free0 - free1, "freed": free2 - free1, "peak": peak, "oom": oom,
                  "count": torch.npu.device_count(), "device": str(x.device), "sums": y.cpu().tolist(),
                  "mixed": mixed, "pinned": pinned.is_pinned(), "allreduce": t.cpu().tolist(),
                  "allreduce_device": str(t.device), "backend": dist.get_backend()}))
"""


def test_the_emulated_card_accounts_memory_and_forms_hccl_groups():
    env = dict(os.environ, ASCEND_TESTKIT_NPU_RUNTIME="emulated", ASCEND_TESTKIT_NPU_MEMORY="256MiB",
               ASCEND_TESTKIT_NPU_COUNT="2")
    env.pop("ASCEND_VLLM_SIMULATE", None)
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["total"] == 256 << 20 and facts["count"] == 2 and facts["device"] == "npu:0"
    # The card's allocator counts its tensors exactly; the host copy is not the card's memory.
    assert facts["used"] == 64 << 20 and facts["freed"] == 64 << 20 and facts["peak"] >= 64 << 20
    assert facts["oom"] == "OutOfMemoryError"  # past the card's capacity, as on a card
    assert facts["sums"] == [6.0, 24.0] and facts["pinned"] is True
    assert facts["mixed"] == "refused"  # a non-scalar host tensor in a device op, as a card refuses it
    assert facts["backend"] == "hccl" and facts["allreduce"] == [1.0, 1.0, 1.0]
    assert facts["allreduce_device"] == "npu:0"


def test_the_emulated_runtime_refuses_the_simulated_lane():
    env = dict(os.environ, ASCEND_TESTKIT_NPU_RUNTIME="emulated", ASCEND_VLLM_SIMULATE="1")
    done = subprocess.run([sys.executable, "-c", "from ascend_testkit import npu_runtime; npu_runtime.requested()"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "unset ASCEND_VLLM_SIMULATE=1" in done.stderr


GRAPH_PROBE = r"""
import json, torch
from ascend_testkit import npu_runtime
from ascend_testkit.npu_runtime import graphs
npu_runtime.install_if_requested()
x = torch.randn(4, 8, device="npu"); w = torch.randn(8, 8, device="npu"); out = torch.empty(4, 8, device="npu")
host = {"scale": 2}  # a host value the captured code reads (as attention reads lengths)

def step():
    h = torch.relu(x @ w).to(torch.float64).float() + 1  # `to` may return its input or a new tensor
    out[:, :4].copy_(h[:, :4] * host["scale"])
    out[:, 4:] = torch.nn.functional.silu(x[:, 4:])

graph = torch.npu.NPUGraph()
with torch.npu.graph(graph, pool=torch.npu.graph_pool_handle()):
    capturing = torch.npu.is_current_stream_capturing()
    step()
x.copy_(torch.randn(4, 8))
graph.replay()
replayed = out.cpu().clone()
step()
eager = out.cpu().clone()
host["scale"] = 3  # a host value refreshed after capture: the graph keeps the captured one, as a card's does
graph.replay()
stale = out.cpu().clone()
step()
refused = []
for what in (lambda: x.sum().item(), lambda: x.cpu(), lambda: torch.nonzero(x), torch.npu.synchronize):
    try:
        with torch.npu.graph(torch.npu.NPUGraph()):
            what()
        refused.append(False)
    except graphs.GraphCaptureError:
        refused.append(True)
x.data = torch.randn(4, 8, device="npu")  # new memory (as sleep mode gives weights): the graph read the old address
try:
    graph.replay()
    moved = "replayed"
except graphs.GraphCaptureError as exc:
    moved = "refused" if "moved since the capture" in str(exc) else str(exc)
print(json.dumps({"capturing": capturing, "moved": moved, "replay_equals_eager": torch.equal(replayed, eager),
                  "stale_scale_kept": torch.equal(stale[:, :4] * 3 / 2, out.cpu()[:, :4]) and
                                      not torch.equal(stale, out.cpu()),
                  "refused": refused, "counts": dict(graphs.COUNTS),
                  "after_capture": torch.npu.is_current_stream_capturing()}))
"""


def test_acl_graphs_replay_recorded_ops_on_captured_tensors():
    """A replay computes on the inputs' current contents and on the host values frozen at capture (a stale host value
    gives a stale answer, as on a card); what a card refuses during a capture is refused, and so is a replay over a
    tensor that was given new memory since (a card's graph would read the old address)."""
    env = dict(os.environ, ASCEND_TESTKIT_NPU_RUNTIME="emulated", ASCEND_TESTKIT_NPU_MEMORY="256MiB")
    env.pop("ASCEND_VLLM_SIMULATE", None)
    done = subprocess.run([sys.executable, "-c", GRAPH_PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["capturing"] is True and facts["after_capture"] is False
    assert facts["replay_equals_eager"] is True
    assert facts["stale_scale_kept"] is True
    assert facts["refused"] == [True, True, True, True]
    assert facts["moved"] == "refused"
    assert facts["counts"]["capture"] == 1 and facts["counts"]["replay"] == 2
