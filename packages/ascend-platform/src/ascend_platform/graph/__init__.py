"""Graph capture for Ascend's MRV2 runner: the plan, the graph manager that follows it, and the graph backends.

* `GraphCapturePlan` (plan.py): capture sizes and mode from the config; `capture_descriptors()`;
  `descriptor_for(num_reqs, num_tokens, decode_only=...)` (FULL only for uniform decodes; PIECEWISE for mixed
  batches when the mode has them; NONE past the largest capture size). Under PCP `num_tokens` is the rank-local
  count (`AscendPCPManager.num_tokens_for_dispatch`).
* `AscendGraphManager` (manager.py): vLLM's MRV2 graph manager driven by the plan (the runner builds it).
* Backends (backends.py): ACL graphs on an NPU, eager "graphs" in the simulated lane; static-graph wrappers the
  platform gives vLLM (wrapper.py): `AclGraphWrapper` / `SimulatedGraphWrapper`, which records what it captures and
  replays (trace.py).
"""

from ascend_platform.graph.backends import AclGraphBackend, EagerBackend, GraphBackend, default_backend
from ascend_platform.graph.plan import GraphCapturePlan

__all__ = [
    "AclGraphBackend",
    "EagerBackend",
    "GraphBackend",
    "GraphCapturePlan",
    "default_backend",
]
