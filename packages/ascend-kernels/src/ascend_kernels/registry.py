"""Kernel backends: which exist, which is selected, and what each one implements.

A backend is a name plus a table `op name -> callable` with the facade's signature, derived from the op declarations
(`ascend_kernels.op_registry`). Selection is explicit and process-wide: `set_backend(name)` binds every op module's
attributes to that backend's functions (one hop); until then the first op call picks "npu" when torch_npu is usable
and "reference" otherwise. Asking for a backend that cannot load raises `BackendUnavailableError` with the reason (for
"npu", the torch_npu import error text).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ascend_kernels import npu_usage, op_registry
from ascend_kernels.op_registry import BACKEND_NAMES, kv_layout  # noqa: F401  (part of this module's API)

# Derived from the declarations (`ascend_kernels.op_registry`), in declaration order.
OP_NAMES: tuple[str, ...] = op_registry.op_names()


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run in this process; the message says why."""


@dataclass(frozen=True, kw_only=True)
class Backend:
    name: str
    ops: dict[str, Callable] = field(repr=False)
    # op name -> short description of what runs it (e.g. "torch_npu.npu_rms_norm"); for the capability query.
    implementations: dict[str, str] = field(repr=False)


def _load_reference() -> Backend:
    ops = op_registry.backend_impls("reference")
    return Backend(name="reference", ops=ops,
                   implementations={name: f"ascend_kernels.reference ({fn.__module__})" for name, fn in ops.items()})


def _load_npu() -> Backend:
    from ascend_kernels.npu_probe import torch_npu_status

    status = torch_npu_status()
    if not status.usable:
        raise BackendUnavailableError(f"kernel backend 'npu' is unavailable: {status.reason}")
    from ascend_kernels.npu_backend import load_torch_npu

    load_torch_npu()
    return Backend(name="npu", ops=op_registry.backend_impls("npu"),
                   implementations={name: b.target for name, b in op_registry.npu_bindings().items()})


_LOADERS: dict[str, Callable[[], Backend]] = {"reference": _load_reference, "npu": _load_npu}


class _State:
    """The selected backend; its implementations are bound onto the op modules (`op_registry.bind`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loaded: dict[str, Backend] = {}
        self.backend: Backend | None = None


_STATE = _State()


def _backend(name: str) -> Backend:
    if name not in _LOADERS:
        raise ValueError(f"unknown kernel backend {name!r}; known backends: {', '.join(BACKEND_NAMES)}")
    with _STATE.lock:
        backend = _STATE.loaded.get(name)
        if backend is None:
            backend = _LOADERS[name]()
            missing = [op for op in OP_NAMES if op not in backend.ops]
            if missing:
                raise BackendUnavailableError(f"kernel backend {name!r} lacks ops: {', '.join(missing)}")
            _STATE.loaded[name] = backend
        return backend


def default_backend_name() -> str:
    """ "npu" when torch_npu imports and sees a device, else "reference"."""
    from ascend_kernels.npu_probe import torch_npu_status

    return "npu" if torch_npu_status().usable else "reference"


def set_backend(name: str) -> None:
    """Select the backend every `ascend_kernels.ops` call runs on, process-wide.

    Raises ValueError for an unknown name and BackendUnavailableError (with the reason) when it cannot load here.
    """
    _activate(_backend(name))


def _activate(backend: Backend | None) -> None:
    _STATE.backend = backend
    rebind()


def rebind() -> None:
    """Bind the selected backend's implementations onto the op modules again (after a switch of the checks or of
    usage counting); nothing when no backend is selected yet (the first op call selects the default)."""
    from ascend_kernels.validation import validation_enabled

    backend = _STATE.backend
    if backend is None:
        op_registry.unbind()
        return
    wrappers = [w for w in (_Observer.wrap, npu_usage.facade_counter(backend.name) if npu_usage.facade_counting()
                            else None) if w is not None]
    op_registry.bind(backend.ops, checked=validation_enabled(), counter=_chain(wrappers) if wrappers else None)


class _Observer:
    wrap: Callable[[str], Callable[[Callable], Callable]] | None = None


def set_op_observer(wrap: Callable[[str], Callable[[Callable], Callable]] | None) -> None:
    """Wrap every op each time a backend binds: `wrap(op)(fn)` returns what `ops.<op>` runs (e.g. the platform's
    per-op usage timing, so no caller counts its own calls); None removes it. Rebinds the selected backend."""
    if _Observer.wrap is not wrap:
        _Observer.wrap = wrap
        rebind()


def _chain(wrappers: list[Callable[[str], Callable[[Callable], Callable]]]):
    def for_op(op: str):
        def wrap(fn: Callable) -> Callable:
            for wrapper in wrappers:
                fn = wrapper(op)(fn)
            return fn

        return wrap

    return for_op


def get_backend() -> str:
    """The selected backend's name (selecting the default on first use)."""
    return _selected().name


def _selected() -> Backend:
    if _STATE.backend is None:
        set_backend(default_backend_name())
    assert _STATE.backend is not None
    return _STATE.backend


op_registry.set_default_selector(_selected)


def available_backends() -> dict[str, str | None]:
    """Every known backend -> None when it can run here, else the reason it cannot."""
    result: dict[str, str | None] = {}
    for name in BACKEND_NAMES:
        try:
            _backend(name)
        except BackendUnavailableError as exc:
            result[name] = str(exc)
        else:
            result[name] = None
    return result


def implementations(backend: str) -> dict[str, str]:
    """`op name -> what runs it` for `backend`, from the declarations: a backend that cannot load here (no
    torch_npu) still answers, so capability questions do not depend on the machine."""
    if backend == "reference":
        return {name: "ascend_kernels.reference" for name in OP_NAMES}
    if backend == "npu":
        return {name: binding.target for name, binding in op_registry.npu_bindings().items()}
    raise ValueError(f"unknown kernel backend {backend!r}; known backends: {', '.join(BACKEND_NAMES)}")


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Run a block on `name`, then restore the previous selection (tests, benchmarks)."""
    previous = _STATE.backend
    set_backend(name)
    try:
        yield
    finally:
        _activate(previous)
