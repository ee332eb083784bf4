"""A schema-faithful torch_npu for the simulated lane: `install()` puts it in `sys.modules` as `torch_npu`.

Every op of the torch_npu wheel (`ASCEND_TESTKIT_TORCH_NPU_WHEEL`: a version or a wheel path, default 2.13.0) is
defined on the CPU with the wheel's own schema string, so a wrong keyword, type or arity fails in the dispatcher as
on a card. The ops the NPU backend calls compute their documented semantics (implemented here and in `attention/`,
never by calling `ascend_kernels`' reference), enforce the documented constraints, and have each output's shape and
dtype held to torch_npu's own meta function from the wheel. `calls()` counts the fake's calls per op.
"""

from __future__ import annotations

import os
import sys
import threading
import types
from dataclasses import dataclass, field

from ascend_contracts.torch_npu_wheel import TorchNpuWheel, open_torch_npu_wheel
from ascend_testkit.torch_npu.library import FakeLibraries, MetaMismatchError
from ascend_testkit.torch_npu.module import build_module, module_tree
from ascend_testkit.torch_npu.semantics import all_implementations
from ascend_testkit.torch_npu.wheel_meta import MetaLoader, npu_dtype_codes

WHEEL_ENV = "ASCEND_TESTKIT_TORCH_NPU_WHEEL"
LIMITS_ENV = "ASCEND_TESTKIT_TORCH_NPU_LIMITS"  # "card" (default: the documented sizes) or "tiny-models"
DEFAULT_VERSION = "2.13.0"


@dataclass
class _Installed:
    wheel: TorchNpuWheel
    libraries: FakeLibraries
    meta: MetaLoader
    module: types.ModuleType
    limits: str
    replaced: dict[str, types.ModuleType | None] = field(default_factory=dict)


_STATE: dict[str, _Installed] = {}
_LOCK = threading.RLock()


def wheel() -> TorchNpuWheel:
    return open_torch_npu_wheel(os.environ.get(WHEEL_ENV) or DEFAULT_VERSION)


def install(limits: str | None = None) -> types.ModuleType:
    """Define the ops, load the meta functions and put the module in `sys.modules`; idempotent (a second call with
    other limits is an error: uninstall first). `limits`: "card" or "tiny-models" (default `$LIMITS_ENV` or card)."""
    limits = limits or os.environ.get(LIMITS_ENV) or "card"
    with _LOCK:
        if "current" in _STATE:
            if _STATE["current"].limits != limits:
                raise RuntimeError(f"the testkit torch_npu is installed with limits {_STATE['current'].limits!r}, "
                                   f"not {limits!r}: uninstall() first")
            return _STATE["current"].module
        source = wheel()
        libraries = FakeLibraries(source, all_implementations(limits))
        ops = [key for ns, key in libraries.defined if "." not in key]
        module = build_module(source, sorted(ops))
        meta = MetaLoader(module, libraries.defined)
        try:
            namespace = meta.load_all(source)
        except Exception:
            meta.destroy()
            libraries.destroy()
            raise
        for name, code in npu_dtype_codes(namespace).items():
            setattr(module, name, code)
        tree = module_tree(module)
        replaced = {name: sys.modules.get(name) for name in tree}
        sys.modules.update(tree)
        _STATE["current"] = _Installed(source, libraries, meta, module, limits, replaced)
        return module


def uninstall() -> None:
    """Remove the module and the op definitions (restoring what `sys.modules` held before); idempotent."""
    with _LOCK:
        state = _STATE.pop("current", None)
        if state is None:
            return
        for name, previous in state.replaced.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous
        state.meta.destroy()
        state.libraries.destroy()


def installed() -> bool:
    return "current" in _STATE


def calls() -> dict[str, int]:
    """Calls per torch_npu op (as torch_npu names it) since install or the last `reset_calls()`."""
    state = _STATE.get("current")
    return dict(state.libraries.counts) if state else {}


def reset_calls() -> None:
    state = _STATE.get("current")
    if state:
        state.libraries.counts.clear()


def status() -> dict:
    """What the installed fake models: semantic ops, ops whose outputs the wheel's meta functions check, skips."""
    state = _STATE.get("current")
    if state is None:
        return {}
    libs = state.libraries
    implemented = sorted(libs.implementations)
    return {
        "wheel": str(state.wheel.path), "version": state.wheel.version, "limits": state.limits,
        "defined": len(libs.defined), "implemented": implemented,
        "meta_checked": [op for op in implemented if libs.has_meta(state.wheel.namespaces[op], op)],
        "undefinable": dict(libs.undefinable), "meta_skipped": list(state.meta.skipped),
    }


__all__ = ["DEFAULT_VERSION", "LIMITS_ENV", "WHEEL_ENV", "MetaMismatchError", "calls", "install", "installed",
           "reset_calls", "status", "uninstall", "wheel"]
