"""torch_npu's own meta functions, loaded from its wheel onto the fake's libraries.

`op_plugin/meta/_meta_registrations.py` (and the ATB one) register Meta kernels with `@impl(m, "op")` on
`Library("npu", "IMPL", "Meta")`: the same namespace the fake defines, so executing the file registers them on the
fake's ops. Its `import torch_npu...` lines are answered by the fake module; its `aten` Meta overrides are dropped
(they would change how this process's own aten ops trace); registrations for ops the fake does not define (the few
`npu` ops not named `npu_*`) are skipped and listed.
"""

from __future__ import annotations

import builtins
import types

import torch
import torch.library

from ascend_contracts.torch_npu_wheel import ATB_META_REGISTRATIONS, META_REGISTRATIONS, TorchNpuWheel


class _DroppedLibrary:
    """Stands in for a `Library("aten", ...)`: accepts registrations and keeps none."""

    def __init__(self, ns: str):
        self.ns = ns


class MetaLoader:
    def __init__(self, fake_module: types.ModuleType, defined: set[tuple[str, str]]):
        self._module = fake_module
        self._defined = defined  # (namespace, op key) pairs the fake has defined
        self.libraries: list[torch.library.Library] = []
        self.skipped: list[str] = []
        self.registered: set[tuple[str, str]] = set()

    def _library(self, ns, kind, dispatch_key=""):
        if ns not in ("npu", "atb"):
            return _DroppedLibrary(ns)
        lib = torch.library.Library(ns, kind, dispatch_key)
        self.libraries.append(lib)
        return lib

    def _impl(self, lib, name, dispatch_key=""):
        def register(fn):
            if isinstance(lib, _DroppedLibrary):
                return fn
            if (lib.ns, name.removesuffix(".default")) not in self._defined:
                self.skipped.append(f"{lib.ns}::{name}")
                return fn
            lib.impl(name, fn, dispatch_key or "Meta")
            self.registered.add((lib.ns, name))
            return fn

        return register

    def _shim_modules(self) -> dict[str, types.ModuleType]:
        library = types.ModuleType("torch.library")
        library.__dict__.update(torch.library.__dict__)
        library.Library = self._library
        library.impl = self._impl
        fake = self._module
        return {"torch.library": library, "torch_npu": fake, "torch_npu.utils": fake.utils,
                "torch_npu.utils._error_code": fake.utils._error_code, "torch_npu.npu": fake.npu,
                "torch_npu.npu.utils": fake.npu.utils, "torch_npu.npu._backends": fake.npu._backends}

    def load(self, wheel: TorchNpuWheel, member: str) -> dict:
        shims = self._shim_modules()
        real_import = builtins.__import__

        def shim_import(name, globals=None, locals=None, fromlist=(), level=0):
            if name in shims:
                if fromlist or "." not in name:
                    return shims[name]
                return shims[name.split(".")[0]]
            return real_import(name, globals, locals, fromlist, level)

        namespace = {"__name__": f"ascend_testkit.torch_npu.wheel:{member}",
                     "__builtins__": {**builtins.__dict__, "__import__": shim_import}}
        code = compile(wheel.text(member), f"{wheel.path}!{member}", "exec")
        exec(code, namespace)  # noqa: S102  (torch_npu's own meta functions, read from its wheel)
        return namespace

    def load_all(self, wheel: TorchNpuWheel) -> dict:
        namespace = self.load(wheel, META_REGISTRATIONS)
        self.load(wheel, ATB_META_REGISTRATIONS)
        return namespace

    def destroy(self) -> None:
        for lib in self.libraries:
            lib._destroy()
        self.libraries.clear()


def npu_dtype_codes(meta_namespace: dict) -> dict[str, int]:
    """torch_npu's own dtype constants (`torch_npu.hifloat8` ...) from the meta file's code -> name table."""
    table = meta_namespace.get("TORCH_NPU_DTYPE_TO_STRING_MAP", {})
    return {name.removeprefix("torch_npu."): code for code, name in table.items()}


__all__ = ["MetaLoader", "npu_dtype_codes"]
