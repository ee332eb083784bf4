"""Graph-capture planning and execution for Ascend's MRV2 runner.

API for the runner:

* `GraphCapturePlan.from_vllm_config(vllm_config, decode_query_len=1)`: capture sizes and mode from the config.
* `plan.capture_descriptors()`: vLLM `BatchExecutionDescriptor`s to capture, largest first.
* `plan.descriptor_for(num_reqs, num_tokens, decode_only=...)`: the descriptor a batch runs with (FULL only for
  decode-only batches; PIECEWISE for mixed ones when the mode has them; NONE past the largest capture size).
  Under PCP pass `pcp_manager.num_tokens_for_dispatch(...)` as `num_tokens`.
* `GraphExecutor(plan, backend=None)`: `capture_all(stage)` and `run(desc, forward)`; the backend is ACL graphs
  on an NPU and eager execution in the simulated lane (`default_backend()`).
"""

from ascend_platform.graph.executor import AclGraphBackend, EagerBackend, GraphBackend, GraphExecutor, default_backend
from ascend_platform.graph.plan import GraphCapturePlan

__all__ = [
    "AclGraphBackend",
    "EagerBackend",
    "GraphBackend",
    "GraphCapturePlan",
    "GraphExecutor",
    "default_backend",
]
