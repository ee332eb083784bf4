"""Triton in the simulated-NPU lane: its interpreter, announced to vLLM as Triton's "cpu" backend.

On an Ascend host, triton-ascend compiles vLLM's Triton kernels, so vLLM defaults to Model Runner V2 there. vLLM's
CPU build enables Triton (and with it MRV2) only when `triton.backends.backends` has a "cpu" entry
(`vllm/triton_utils/importing.py`), and Triton 3.9 ships none. The simulated lane mirrors the device by running
`@triton.jit` kernels in Triton's interpreter (`knobs.runtime.interpret`, read when a kernel is decorated: each
program instance then runs in numpy on the CPU tensors) and by naming it "cpu" in that dict. The kernels a decode
step launches do not run in the interpreter at all: `ascend_platform.simulated.kernel_overrides` replaces them.

`enable()` is called by `SimulatedNPUPlatform()`: vLLM instantiates the platform while it resolves
`current_platform`, which `vllm/triton_utils/importing.py` does before it reads the backends dict, and before any
vLLM module decorates a kernel. Both changes go through the registered patches `simulated.triton_backends` and
`simulated.triton_interpret`. The "cpu" entry's driver is never active, so Triton itself never selects it for a
compiled launch: only the interpreter runs kernels here.

Triton's own library (`tl.max`, `tl.sum`, ... are `@jit` functions) is decorated when `triton.language` first
imports, which in the process that starts vLLM happens (through torch) before any plugin runs; an interpreted kernel
calling such a `JITFunction` stops with "Cannot call @triton.jit'd outside of the scope of a kernel". Processes
vLLM-CPU spawns inherit TRITON_INTERPRET=1 (the knob exports it) and decorate the library interpreted; where the
engine runs in the process that resolved the platform (VLLM_ENABLE_V1_MULTIPROCESSING=0, one worker), `enable()`
also applies `simulated.triton_library_calls`: such a call runs the library function in the interpreter.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

from ascend_platform.patches import REGISTRY

BACKEND_NAME = "cpu"


@dataclass(frozen=True)
class TritonLaneStatus:
    """Whether this process can run vLLM's Triton kernels in the simulated lane, and how."""

    usable: bool
    mode: str  # "interpreter" (ours), "native" (a real Triton CPU backend), or "" when unusable
    version: str | None
    reason: str  # what is missing when not usable


def status() -> TritonLaneStatus:
    """Probe Triton without changing anything (also what `ascend-vllm doctor` reports)."""
    if importlib.util.find_spec("triton") is None:
        return TritonLaneStatus(False, "", None, "the 'triton' package is not installed (pip install triton)")
    try:
        import triton
        from triton import knobs
        from triton.backends import backends
        from triton.runtime.interpreter import InterpretedFunction  # noqa: F401
    except Exception as exc:  # a partial or broken install
        return TritonLaneStatus(False, "", None, f"triton does not import its backends/interpreter ({exc})")
    version = getattr(triton, "__version__", None)
    entry = backends.get(BACKEND_NAME)
    if entry is not None and entry.driver is not InterpreterDriver:
        return TritonLaneStatus(True, "native", version, "")
    if not hasattr(knobs.runtime, "interpret"):
        return TritonLaneStatus(False, "", version, f"triton {version} has no knobs.runtime.interpret")
    return TritonLaneStatus(True, "interpreter", version, "")


def enable() -> TritonLaneStatus:
    """Make vLLM see Triton here, running kernels in the interpreter. Idempotent; a no-op when Triton already has
    a native CPU backend or cannot be used (the returned status says which)."""
    lane = status()
    if not lane.usable or lane.mode != "interpreter":
        return lane
    from triton.backends import Backend

    _, backends = REGISTRY.resolve("simulated.triton_backends")
    if BACKEND_NAME not in backends:
        REGISTRY.apply("simulated.triton_backends",
                       {**backends, BACKEND_NAME: Backend(compiler=InterpreterCompiler, driver=InterpreterDriver)})
    _, interpret = REGISTRY.resolve("simulated.triton_interpret")
    if not interpret:
        REGISTRY.apply("simulated.triton_interpret", True)
    if not library_interpreted():
        _, call = REGISTRY.resolve("simulated.triton_library_calls")
        if call is not _call_interpreted:
            REGISTRY.apply("simulated.triton_library_calls", _call_interpreted)
    return lane


_TWINS: dict[int, Any] = {}


def _call_interpreted(self: Any, *args: Any, **kwargs: Any) -> Any:
    """`JITFunction.__call__` in the simulated lane: an interpreted kernel's call into a library function that was
    decorated before the interpreter was on runs that function interpreted (vLLM never calls one outside a kernel)."""
    twin = _TWINS.get(id(self))
    if twin is None:
        from triton.runtime.interpreter import InterpretedFunction

        twin = _TWINS[id(self)] = InterpretedFunction(self.fn)
    return twin(*args, **kwargs)


def enabled() -> bool:
    """True once `enable()` put the interpreter in place in this process."""
    import sys

    backends = getattr(sys.modules.get("triton.backends"), "backends", {})
    entry = backends.get(BACKEND_NAME)
    return entry is not None and entry.driver is InterpreterDriver


def library_ready() -> bool:
    """Whether interpreted kernels can call Triton's language library in this process."""
    import sys

    jit = sys.modules.get("triton.runtime.jit")
    patched = jit is not None and vars(jit.JITFunction).get("__call__") is _call_interpreted
    return library_interpreted() or patched


def library_interpreted() -> bool:
    """Whether Triton's language library was decorated with the interpreter on in this process (else interpreted
    kernels that call e.g. `tl.max` fail with "Cannot call @triton.jit'd outside of the scope of a kernel")."""
    import sys

    standard = sys.modules.get("triton.language.standard")
    return standard is not None and type(getattr(standard, "max", None)).__name__ == "InterpretedFunction"


def _interpreter_only(what: str) -> NotImplementedError:
    return NotImplementedError(f"{what}: the simulated lane runs Triton kernels in the interpreter only "
                               "(TRITON_INTERPRET); nothing is compiled for it")


def _base_classes() -> tuple[type, type]:
    from triton.backends.compiler import BaseBackend
    from triton.backends.driver import DriverBase

    return BaseBackend, DriverBase


_BaseBackend, _DriverBase = _base_classes() if importlib.util.find_spec("triton") else (object, object)


class InterpreterDriver(_DriverBase):  # type: ignore[misc, valid-type]
    """The "cpu" entry's driver: never active, so Triton's own driver selection never picks it."""

    @classmethod
    def is_active(cls) -> bool:
        return False

    def map_python_to_cpp_type(self, ty: str) -> str:
        raise _interpreter_only("map_python_to_cpp_type")

    def get_current_target(self) -> Any:
        raise _interpreter_only("get_current_target")

    def get_active_torch_device(self) -> Any:
        import torch

        return torch.device("cpu")

    def get_benchmarker(self) -> Any:
        raise _interpreter_only("get_benchmarker")


class InterpreterCompiler(_BaseBackend):  # type: ignore[misc, valid-type]
    """The "cpu" entry's compiler: supports no target (the interpreter needs none)."""

    @staticmethod
    def supports_target(target: Any) -> bool:
        return False

    def hash(self) -> str:
        raise _interpreter_only("hash")

    def parse_options(self, options: dict) -> object:
        raise _interpreter_only("parse_options")

    def add_stages(self, stages: dict, options: object, language: Any) -> None:
        raise _interpreter_only("add_stages")

    def load_dialects(self, context: Any) -> None:
        raise _interpreter_only("load_dialects")

    def get_module_map(self) -> dict:
        raise _interpreter_only("get_module_map")
