"""Where the platform gets its two collaborators: the kernel facade and the KV allocator.

Everything in this package reaches `ascend_kernels.ops` and `ascend_core.kv.allocate_kv_caches` through these two
functions. The first use of the kernels installs the usage timer on the kernel registry (`usage.kernel_op_timer`),
so every op call of this process counts as "kernels.<op>" in one place and tests can prove which ones ran.
"""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def kernel_ops() -> Any:
    """The `ascend_kernels.ops` module (its backend chosen by `select_kernel_backend`), its ops counted."""
    from ascend_kernels import ops

    _count_kernel_ops()
    return ops


def _count_kernel_ops() -> None:
    from ascend_kernels import registry
    from ascend_platform.usage import kernel_op_timer

    registry.set_op_observer(kernel_op_timer)


def kernel_backend_name() -> str:
    import ascend_kernels

    return ascend_kernels.get_backend()


def select_kernel_backend(name: str) -> None:
    """Switch ascend_kernels to `name` ('reference' in the simulated lane, 'npu' on a device)."""
    import ascend_kernels

    _count_kernel_ops()
    ascend_kernels.set_backend(name)


@functools.cache
def kv_allocator() -> Any:
    """`ascend_core.kv.allocator.allocate_kv_caches`."""
    from ascend_core.kv.allocator import allocate_kv_caches

    return allocate_kv_caches
