"""The simulated lane's holder scan for kernel overrides repoints exactly what vLLM's own scan repoints."""

from __future__ import annotations

import sys
import types

import pytest


class _Owner:  # a JIT warmup owner: holds the kernel it launches and a cached binding
    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self._kernel_arg_names = ("x",)


def _holders(tag: str):
    """Modules holding two originals the ways vLLM code does (a `from mod import kernel` copy, an owner instance,
    an owner class), and one unrelated function."""
    originals = [lambda: 1, lambda: 2]
    unrelated = lambda: 3  # noqa: E731
    owner_class = type("OwnerClass", (), {"kernel": originals[1]})
    module = types.ModuleType(f"_rebind_probe_{tag}")
    module.copy = originals[0]
    module.owner = _Owner(originals[1])
    module.owner_class = owner_class
    module.other = unrelated
    return module, originals, unrelated


@pytest.mark.parametrize("scan", ["upstream", "ours"])
def test_the_scan_repoints_every_holder(monkeypatch, scan):
    from vllm.triton_utils import dispatcher

    from ascend_platform.simulated import kernel_rebind

    module, originals, unrelated = _holders(scan)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    wrappers = [object(), object()]
    rebind = dispatcher._rebind_kernels if scan == "upstream" else kernel_rebind.rebind_kernels
    rebind(list(zip(originals, wrappers, strict=True)))
    assert module.copy is wrappers[0]
    assert module.owner.kernel is wrappers[1] and "_kernel_arg_names" not in vars(module.owner)
    assert vars(module.owner_class)["kernel"] is wrappers[1]  # a class's attribute, no cached binding to drop
    assert module.other is unrelated
