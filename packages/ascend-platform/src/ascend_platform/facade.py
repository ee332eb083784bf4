"""Where the platform gets its two collaborators: the kernel facade and the KV allocator.

Everything in this package reaches `ascend_kernels.ops` and `ascend_core.kv.allocate_kv_caches` through these two
functions, so the usage markers (`ascend_platform.usage`) see every call and tests can prove which ones ran.
"""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def kernel_ops() -> Any:
    """The `ascend_kernels.ops` module (its backend chosen by `select_kernel_backend`)."""
    from ascend_kernels import ops

    return ops


def kernel_backend_name() -> str:
    import ascend_kernels

    return ascend_kernels.get_backend()


def select_kernel_backend(name: str) -> None:
    """Switch ascend_kernels to `name` ('reference' in the simulated lane, 'npu' on a device)."""
    import ascend_kernels

    ascend_kernels.set_backend(name)


@functools.cache
def kv_allocator() -> Any:
    """`ascend_core.kv.allocator.allocate_kv_caches`."""
    from ascend_core.kv.allocator import allocate_kv_caches

    return allocate_kv_caches
