"""Ascend kernels behind one facade: `from ascend_kernels import ops`.

Backends: "reference" (pure torch, any device; the simulated-NPU lane) and "npu" (torch_npu kernels, imported lazily
in `ascend_kernels.npu_backend` only). Selection is explicit: `set_backend(name)`; until then the first op call uses
"npu" when torch_npu is usable, else "reference". `available_backends()` says which can run here and why not,
`implementations(backend)` what runs each op there. Argument checks run by default (`set_validation(False)` for
hot paths).
"""

from ascend_kernels import npu_usage, ops
from ascend_kernels.registry import (
    BACKEND_NAMES,
    OP_NAMES,
    BackendUnavailableError,
    available_backends,
    default_backend_name,
    get_backend,
    implementations,
    set_backend,
    use_backend,
)
from ascend_kernels.validation import set_validation, validation_enabled

__all__ = [
    "BACKEND_NAMES",
    "OP_NAMES",
    "BackendUnavailableError",
    "available_backends",
    "default_backend_name",
    "get_backend",
    "implementations",
    "npu_usage",
    "ops",
    "set_backend",
    "set_validation",
    "use_backend",
    "validation_enabled",
]
