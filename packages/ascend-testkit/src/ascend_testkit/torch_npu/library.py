"""The fake's op libraries: every op of the wheel defined under its namespace with the wheel's schema string, a CPU
kernel that binds the call by the schema's argument names, counts it, runs the semantic implementation and holds
each output's shape and dtype to torch_npu's own meta function on meta tensors.

Ops with no semantic implementation are still defined (so a call binds, and fails by its schema as on a card) and
raise NotImplementedError naming the op when run.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import torch
import torch.library

from ascend_contracts.torch_npu_wheel import TorchNpuWheel


class MetaMismatchError(AssertionError):
    """A fake output's shape or dtype differs from what torch_npu's meta function gives for the same call."""


def _to_meta(value):
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return type(value)(_to_meta(v) for v in value)
    return value


def _flat(result) -> list:
    if result is None:
        return []
    if isinstance(result, torch.Tensor):
        return [result]
    out = []
    for item in result:
        out.extend(item if isinstance(item, (list, tuple)) else [item])
    return out


class FakeLibraries:
    def __init__(self, wheel: TorchNpuWheel, implementations: dict[str, Callable]):
        self.wheel = wheel
        self.implementations = implementations
        self.counts: collections.Counter[str] = collections.Counter()
        self.undefinable: dict[str, str] = {}
        self.defined: set[tuple[str, str]] = set()
        self._libs = {ns: torch.library.Library(ns, "DEF") for ns in sorted(set(wheel.namespaces.values()))}
        for key, text in wheel.schemas.items():
            ns = wheel.namespaces[key]
            try:
                self._libs[ns].define(text)
            except RuntimeError as exc:  # a schema this torch cannot take: named in the report, never silently used
                self.undefinable[key] = str(exc).splitlines()[0]
                continue
            self.defined.add((ns, key))
        for ns, key in self.defined:
            self._libs[ns].impl(key, self._kernel(ns, key), "CPU")

    def destroy(self) -> None:
        for lib in self._libs.values():
            lib._destroy()
        self._libs.clear()

    def overload(self, ns: str, key: str) -> torch._ops.OpOverload:
        name, _, overload = key.partition(".")
        return getattr(getattr(getattr(torch.ops, ns), name), overload or "default")

    def has_meta(self, ns: str, key: str) -> bool:
        return torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::{key}", "Meta")

    def _kernel(self, ns: str, key: str) -> Callable:
        schema = torch._C.parse_schema(self.wheel.schemas[key])
        positional = [a.name for a in schema.arguments if not a.kwarg_only]
        # The dispatcher hands a Python kernel only what the caller passed; the schema's defaults fill the rest.
        defaults = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
        single = len(schema.returns) == 1 and str(schema.returns[0].type) != "Tensor[]"
        impl = self.implementations.get(key)

        def kernel(*args, **kwargs):
            bound = {**defaults, **dict(zip(positional, args, strict=False)), **kwargs}
            self.counts[key] += 1
            if impl is None:
                raise NotImplementedError(f"torch_npu.{key}: no semantic implementation in the testkit's torch_npu")
            result = impl(**bound)
            if not schema.returns:
                if result is not None:
                    raise TypeError(f"{key} returns () by its schema, but the fake's implementation returned "
                                    f"{type(result).__name__}")
                return None
            if not single and not isinstance(result, (tuple, list)):
                raise TypeError(f"{key} returns {len(schema.returns)} values by its schema, got "
                                f"{type(result).__name__}")
            self._check_meta(ns, key, bound, result)
            return tuple(result) if len(schema.returns) > 1 else result

        return kernel

    def _check_meta(self, ns: str, key: str, bound: dict, result) -> None:
        if not self.has_meta(ns, key):
            return
        expected = _flat(self.overload(ns, key)(**{name: _to_meta(v) for name, v in bound.items()}))
        got = _flat(result)
        if len(expected) != len(got):
            raise MetaMismatchError(f"{key}: the fake returns {len(got)} tensors, torch_npu's meta function "
                                    f"{len(expected)}")
        for index, (want, have) in enumerate(zip(expected, got, strict=True)):
            if want is None or have is None:
                continue
            if tuple(want.shape) != tuple(have.shape) or want.dtype != have.dtype:
                raise MetaMismatchError(
                    f"{key} output {index}: the fake gives shape {tuple(have.shape)} {have.dtype}, torch_npu's meta "
                    f"function gives {tuple(want.shape)} {want.dtype}")
