"""`AscendWorker`: the worker class the platform names (`parallel_config.worker_cls`), bound to this process's lane.

The lane's module only is imported: vLLM's CPU worker, under the simulated one, patches torch at import (see
`worker.simulated_worker`), which would take the device lane's `torch.accelerator` away.
"""

from __future__ import annotations

from ascend_platform.registration import simulate_requested
from ascend_platform.worker.base import AscendWorkerMixin

if simulate_requested():
    from ascend_platform.worker.simulated_worker import SimulatedAscendWorker as AscendWorker
else:
    from ascend_platform.worker.npu_worker import NPUWorker as AscendWorker

__all__ = ["AscendWorker", "AscendWorkerMixin"]
