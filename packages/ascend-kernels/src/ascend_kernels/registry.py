"""Kernel backends: which exist, which is selected, and what each one implements.

A backend is a name plus a table `op name -> callable` with the facade's signature (`ascend_kernels.ops`). Selection
is explicit and process-wide: `set_backend(name)`; until then the first use picks "npu" when torch_npu is usable and
"reference" otherwise. Asking for a backend that cannot load raises `BackendUnavailableError` with the reason (for
"npu", the torch_npu import error text).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace

OP_NAMES: tuple[str, ...] = (
    "reshape_and_cache",
    "reshape_and_cache_mla",
    "paged_attention",
    "mla_decode_attention",
    "gather_mla_cache",
    "mla_prefill_attention",
    "rotary_embedding",
    "rms_norm",
    "silu_and_mul",
    "topk_softmax",
    "fused_moe_reference",
    "moe_gating_topk",
    "fused_moe",
    "sample_greedy",
    "sample",
    "rejection_sample",
    "compute_slot_mapping",
    "gumbel_sample",
    "gather_logprobs",
    "token_ranks",
    "attention_with_lse",
    "paged_attention_with_lse",
    "merge_attention_states",
    "gather_kv_rows",
    "quantize_fp8_groups",
    "indexer_cache_write",
    "indexer_topk",
    "sparse_mla_attention",
    "dsv4_qnorm_rope_kv_insert",
    "dsv4_save_partial_states",
    "dsv4_compress_norm_rope_store",
    "dsv4_compress_norm_rope_store_indexer",
    "dsv4_indexer_q_rope_quant",
    "dsv4_fp8_paged_mqa_logits",
    "dsv4_topk_transform",
    "dsv4_sparse_mla_with_kvcache",
    "dsv4_inverse_rope_o_proj",
    "dsv4_mhc_pre",
    "dsv4_mhc_post",
    "dsv4_hc_head",
    "dsv41_mhc_pre_delayed",
    "dsv41_hc_collapse",
    "dsv41_q_rope_kv_insert",
    "dsv41_save_compress_norm",
    "dsv41_rope_quant_insert",
    "dsv41_indexer_k_norm_rope_store",
    "dsv41_select_candidate_blocks",
    "dsv41_apply_candidate_mask",
    "dsv41_engram_write_hash_cache",
    "dsv41_engram_hash",
    "dsv41_engram_lookup",
    "dsv41_engram_gate",
)

BACKEND_NAMES: tuple[str, ...] = ("reference", "npu")


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run in this process; the message says why."""


@dataclass(frozen=True, kw_only=True)
class Backend:
    name: str
    ops: dict[str, Callable] = field(repr=False)
    # op name -> short description of what runs it (e.g. "torch_npu.npu_rms_norm"); for the capability query.
    implementations: dict[str, str] = field(repr=False)

    def supports(self, op_name: str) -> bool:
        return op_name in self.ops


def _load_reference() -> Backend:
    from ascend_kernels.reference import REFERENCE_OPS

    return Backend(
        name="reference",
        ops=dict(REFERENCE_OPS),
        implementations={name: f"ascend_kernels.reference ({fn.__module__})" for name, fn in REFERENCE_OPS.items()},
    )


def _load_npu() -> Backend:
    from ascend_kernels.npu_probe import torch_npu_status

    status = torch_npu_status()
    if not status.usable:
        raise BackendUnavailableError(f"kernel backend 'npu' is unavailable: {status.reason}")
    from ascend_kernels import npu_backend

    return Backend(
        name="npu",
        ops=npu_backend.npu_ops(),
        implementations={name: binding.target for name, binding in npu_backend.NPU_BINDINGS.items()},
    )


_LOADERS: dict[str, Callable[[], Backend]] = {"reference": _load_reference, "npu": _load_npu}


class _State:
    """The selected backend; `impl` is what the facade calls (attribute lookup is the whole dispatch cost)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loaded: dict[str, Backend] = {}
        self.backend: Backend | None = None
        self.impl: SimpleNamespace | None = None


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
    backend = _backend(name)
    _STATE.impl = SimpleNamespace(**backend.ops)
    _STATE.backend = backend


def get_backend() -> str:
    """The selected backend's name (selecting the default on first use)."""
    return _selected().name


def _selected() -> Backend:
    if _STATE.backend is None:
        set_backend(default_backend_name())
    assert _STATE.backend is not None
    return _STATE.backend


def current_impl() -> SimpleNamespace:
    impl = _STATE.impl
    if impl is None:
        _selected()
        impl = _STATE.impl
    return impl


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


def supports(op_name: str, backend: str | None = None) -> bool:
    """Whether `backend` (default: the selected one) implements `op_name`.

    For a backend that cannot load here this answers from its static binding table (the NPU table is readable
    without torch_npu), so capability questions do not depend on the machine.
    """
    if op_name not in OP_NAMES:
        raise ValueError(f"unknown kernel op {op_name!r}; known ops: {', '.join(OP_NAMES)}")
    name = backend if backend is not None else get_backend()
    return op_name in implementations(name)


def implementations(backend: str) -> dict[str, str]:
    """`op name -> what runs it` for `backend` (the static table; does not load the backend)."""
    if backend == "reference":
        return {name: "ascend_kernels.reference" for name in OP_NAMES}
    if backend == "npu":
        from ascend_kernels.npu_backend import NPU_BINDINGS

        return {name: binding.target for name, binding in NPU_BINDINGS.items()}
    raise ValueError(f"unknown kernel backend {backend!r}; known backends: {', '.join(BACKEND_NAMES)}")


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Run a block on `name`, then restore the previous selection (tests, benchmarks)."""
    previous = _STATE.backend
    set_backend(name)
    try:
        yield
    finally:
        _STATE.backend = previous
        _STATE.impl = None if previous is None else SimpleNamespace(**previous.ops)
