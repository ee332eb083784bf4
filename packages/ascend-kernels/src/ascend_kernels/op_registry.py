"""Every kernel op declared once: its contract function, its argument check and what runs it on each backend.

    @kernel_op(validate=_v.check_rms_norm, reference=ref.rms_norm,
               npu=NpuBinding(target="torch_npu.npu_rms_norm", kind="torch_npu",
                              impl="ascend_kernels.npu_backend:rms_norm"))
    def rms_norm(x, weight, eps, residual=None):
        '''the contract'''

The decorated contract (signature + docstring) is the op's documentation; the name left in the declaring module is
a facade that dispatches through the registry. `bind(...)` (called by `set_backend` / `set_validation`) then puts the
selected backend's implementation itself on every op module's attribute: `ops.rms_norm` IS `reference.rms_norm` with
checks off, and a generated wrapper with exactly the contract's signature (check, then the implementation) with
checks on. `npu.impl` is a lazy "module:function", imported only when "npu" is selected, so torch_npu-touching
code never loads on the reference lane. Everything else (`OP_NAMES`, `REFERENCE_OPS`, `NPU_BINDINGS`,
`implementations(...)`, `kv_layout(...)`) is derived from these declarations.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

# The modules that declare ops, in OP_NAMES order. Adding a family of ops is adding its module here.
OP_MODULES: tuple[str, ...] = (
    "ascend_kernels.ops",
    "ascend_kernels.ops_dsv4",
    "ascend_kernels.ops_dsv41",
    "ascend_kernels.ops_quant",
    "ascend_kernels.ops_quant_moe",
    "ascend_kernels.ops_kv_quant",
    "ascend_kernels.ops_lora",
    "ascend_kernels.ops_vision",
    "ascend_kernels.ops_gdn",
)

BACKEND_NAMES: tuple[str, ...] = ("reference", "npu")
NPU_KINDS = frozenset({"torch_npu", "torch"})


@dataclass(frozen=True, kw_only=True)
class NpuBinding:
    """What runs an op on an NPU. kind "torch_npu": a torch_npu kernel (`impl` is its binding); kind "torch": the
    reference implementation on the NPU device (`impl` may be omitted: it defaults to the op's reference)."""

    target: str  # what runs the op on an NPU, for the doctor and `implementations("npu")`
    kind: str
    note: str = ""
    impl: str | None = None  # "module:function"; imported when the npu backend loads

    def __post_init__(self) -> None:
        if self.kind not in NPU_KINDS:
            raise ValueError(f"NpuBinding kind {self.kind!r} (target {self.target!r}); expected one of "
                             f"{sorted(NPU_KINDS)}")
        if self.impl is not None and self.impl.count(":") != 1:
            raise ValueError(f"NpuBinding impl {self.impl!r} (target {self.target!r}); expected 'module:function'")


def reference_on_device(module: str, note: str = "") -> NpuBinding:
    """The binding of an op with no torch_npu kernel: its reference implementation (`ascend_kernels.reference.
    <module>`) runs on the NPU device."""
    return NpuBinding(target=f"ascend_kernels.reference.{module} on the NPU device", kind="torch", note=note)


@dataclass(frozen=True)
class OpDeclaration:
    name: str
    module: str  # the declaring module (whose attribute `bind` rebinds)
    contract: Callable = field(repr=False)
    validate: Callable | None = field(repr=False)
    reference: Callable = field(repr=False)
    npu: NpuBinding
    facade: Callable = field(repr=False)  # what the module attribute is until a backend is bound


@dataclass(frozen=True)
class KvLayout:
    """The paged KV caches a backend's kernels take, per attention kind: each plane's dims, in order."""

    attention: tuple[tuple[str, tuple[str, ...]], ...]  # (plane, dims) per plane
    mla: tuple[tuple[str, tuple[str, ...]], ...]
    contiguous: bool  # every plane one dense tensor (block-contiguous)

    def planes(self, kind: str) -> dict[str, tuple[str, ...]]:
        if kind not in ("attention", "mla"):
            raise ValueError(f"unknown attention kind {kind!r}; expected 'attention' or 'mla'")
        return dict(getattr(self, kind))


# torch_npu's paged kernels (FIA, _npu_reshape_and_cache, npu_paged_cache_load) take one dense tensor per plane; the
# reference takes the same, so both lanes run the device layout (it also honours strided views, not relied on).
_BLOCK_CONTIGUOUS = KvLayout(
    attention=(("key", ("num_blocks", "block_size", "num_kv_heads", "head_size")),
               ("value", ("num_blocks", "block_size", "num_kv_heads", "head_size_v"))),
    mla=(("latent", ("num_blocks", "block_size", "1", "kv_lora_rank")),
         ("rope", ("num_blocks", "block_size", "1", "rope_dim"))),
    contiguous=True,
)
KV_LAYOUTS: dict[str, KvLayout] = {"reference": _BLOCK_CONTIGUOUS, "npu": _BLOCK_CONTIGUOUS}

_DECLARATIONS: dict[str, OpDeclaration] = {}
_LOADED = False


class _Dispatch:
    """The implementation every op currently runs, by name; a facade that was imported by name before a backend was
    selected calls through this (`bind` rebinds the module attributes themselves, the one-hop path)."""

    bound: dict[str, Callable] = {}
    select_default: Callable[[], object] | None = None  # set by the registry: selects the default backend


def set_default_selector(select: Callable[[], object]) -> None:
    _Dispatch.select_default = select


def kernel_op(*, validate: Callable | None, reference: Callable, npu: NpuBinding) -> Callable[[Callable], Callable]:
    """Declare the decorated contract function as a kernel op (see the module docstring). Raises at import, naming
    the op, when an implementation is missing, the validator asks for an argument the op does not have, or the name
    is declared twice."""

    def declare(contract: Callable) -> Callable:
        name = contract.__name__
        if name in _DECLARATIONS:
            raise ValueError(f"kernel op {name!r} is declared twice ({_DECLARATIONS[name].module} and "
                             f"{contract.__module__})")
        if not callable(reference):
            raise TypeError(f"kernel op {name!r}: reference implementation {reference!r} is not callable")
        if not isinstance(npu, NpuBinding):
            raise TypeError(f"kernel op {name!r}: npu= must be an NpuBinding, got {npu!r}")
        if npu.impl is None and npu.kind == "torch_npu":
            raise ValueError(f"kernel op {name!r}: its torch_npu binding ({npu.target}) names no impl")
        if validate is not None:
            _validator_call(name, inspect.signature(contract), validate)  # fails now, not at the first call
        facade = _facade(name, contract)
        _DECLARATIONS[name] = OpDeclaration(name=name, module=contract.__module__, contract=contract,
                                            validate=validate, reference=reference, npu=npu, facade=facade)
        return facade

    return declare


def _facade(name: str, contract: Callable) -> Callable:
    def facade(*args, **kwargs):
        impl = _Dispatch.bound.get(name)
        if impl is None:
            _Dispatch.select_default()
            impl = _Dispatch.bound[name]
        return impl(*args, **kwargs)

    facade.__name__ = facade.__qualname__ = name
    facade.__doc__ = contract.__doc__
    facade.__module__ = contract.__module__
    facade.__wrapped__ = contract  # inspect.signature / help show the contract
    return facade


def declarations() -> dict[str, OpDeclaration]:
    """Every declared op, in OP_MODULES order then declaration order (imports the op modules once)."""
    global _LOADED
    if not _LOADED:
        for module in OP_MODULES:
            importlib.import_module(module)
        _LOADED = True
    return _DECLARATIONS


def declaration(name: str) -> OpDeclaration:
    decls = declarations()
    if name not in decls:
        raise ValueError(f"unknown kernel op {name!r}; known ops: {', '.join(decls)}")
    return decls[name]


def op_names() -> tuple[str, ...]:
    return tuple(declarations())


def reference_ops() -> dict[str, Callable]:
    return {name: decl.reference for name, decl in declarations().items()}


def npu_bindings() -> dict[str, NpuBinding]:
    return {name: decl.npu for name, decl in declarations().items()}


def npu_callers() -> dict[str, tuple[str, ...]]:
    """`"module:function" -> the facade ops whose npu binding it is`, from the declarations (imports no binding
    module): what the torch_npu contract pins' `called_by` names."""
    out: dict[str, tuple[str, ...]] = {}
    for name, decl in declarations().items():
        if decl.npu.impl is not None:
            out[decl.npu.impl] = (*out.get(decl.npu.impl, ()), name)
    return out


def kv_layout(backend: str) -> KvLayout:
    """The KV cache layout `backend`'s kernels take (data; does not load the backend)."""
    if backend not in KV_LAYOUTS:
        raise ValueError(f"unknown kernel backend {backend!r}; known backends: {', '.join(BACKEND_NAMES)}")
    return KV_LAYOUTS[backend]


def _resolve(spec: str, op: str) -> Callable:
    module_name, _, attr = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ImportError(f"kernel op {op!r}: npu impl {spec!r} cannot be loaded: {exc}") from exc
    if not callable(fn):
        raise TypeError(f"kernel op {op!r}: npu impl {spec!r} is {fn!r}, not a function")
    return fn


def backend_impls(backend: str) -> dict[str, Callable]:
    """`op name -> the function that runs it` on `backend` (for "npu" this imports the bindings, not torch_npu)."""
    if backend == "reference":
        return reference_ops()
    if backend == "npu":
        return {name: decl.reference if decl.npu.impl is None else _resolve(decl.npu.impl, name)
                for name, decl in declarations().items()}
    raise ValueError(f"unknown kernel backend {backend!r}; known backends: {', '.join(BACKEND_NAMES)}")


def bind(impls: dict[str, Callable], *, checked: bool, counter: Callable[[str], Callable] | None = None) -> None:
    """Make every op call `impls[op]` directly: set the declaring module's attribute to the implementation (wrapped
    with the op's check when `checked`, and with `counter(op)` when usage counting is on)."""
    bound = {}
    for name, decl in declarations().items():
        fn = impls[name]
        if counter is not None:
            fn = counter(name)(fn)
        if checked and decl.validate is not None:
            fn = checked_wrapper(decl, fn)
        bound[name] = fn
    _Dispatch.bound = bound
    _set_attributes(bound)


def unbind() -> None:
    """Put the facades back (no backend selected: the first call selects the default)."""
    _Dispatch.bound = {}
    _set_attributes({name: decl.facade for name, decl in declarations().items()})


def _set_attributes(functions: dict[str, Callable]) -> None:
    facade_module = importlib.import_module(OP_MODULES[0])
    for name, decl in declarations().items():
        setattr(importlib.import_module(decl.module), name, functions[name])
        # ascend_kernels.ops re-exports every family's ops: `ops.dsv4_mhc_pre` is one hop too.
        setattr(facade_module, name, functions[name])


def _validator_call(op: str, contract_sig: inspect.Signature, validate: Callable) -> str:
    """The keyword arguments of the validator call, as source: each validator parameter is the op argument of the
    same name (parameters the op lacks must have a default, e.g. `op=`)."""
    params = contract_sig.parameters
    parts = []
    for pname, p in inspect.signature(validate).parameters.items():
        if pname in params:
            parts.append(f"{pname}={pname}")
        elif pname == "op" and p.default is inspect.Parameter.empty:
            parts.append(f"op={op!r}")
        elif p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"kernel op {op!r}: validator {validate.__module__}.{validate.__qualname__} takes "
                            f"{pname!r}, which is not an argument of the op ({', '.join(params)})")
    return ", ".join(parts)


def checked_wrapper(decl: OpDeclaration, impl: Callable) -> Callable:
    """A function with exactly the contract's signature that runs the op's check, then `impl`: generated source, so
    arguments are forwarded as they are (no *args/**kwargs repacking). Host-list arguments (`X_host`) are checked
    against their tensor `X` (same length, ints)."""
    from ascend_kernels.validation import host_lengths

    sig = inspect.signature(decl.contract)
    namespace: dict[str, object] = {"_validate": decl.validate, "_impl": impl, "_host_lengths": host_lengths}
    header, forward = [], []
    star_done = False
    for i, (pname, p) in enumerate(sig.parameters.items()):
        default = ""
        if p.default is not inspect.Parameter.empty:
            namespace[f"_d{i}"] = p.default
            default = f"=_d{i}"
        if p.kind is p.KEYWORD_ONLY:
            if not star_done:
                header.append("*")
                star_done = True
            forward.append(f"{pname}={pname}")
        elif p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            forward.append(pname)
        else:
            raise TypeError(f"kernel op {decl.name!r}: contract parameter {pname!r} is {p.kind.description}; "
                            "contracts take named parameters only")
        header.append(f"{pname}{default}")
    body = [f"    _validate({_validator_call(decl.name, sig, decl.validate)})"]
    for pname in sig.parameters:
        base = pname.removesuffix("_host")
        if pname.endswith("_host") and base in sig.parameters:
            body.append(f"    _host_lengths({decl.name!r}, {pname!r}, {pname}, {base}.shape[0])")
    source = (f"def {decl.name}({', '.join(header)}):\n" + "\n".join(body)
              + f"\n    return _impl({', '.join(forward)})\n")
    exec(compile(source, f"<checked {decl.name}>", "exec"), namespace)  # noqa: S102  (generated from the signature)
    fn = namespace[decl.name]
    fn.__doc__ = decl.contract.__doc__
    fn.__module__ = decl.module
    fn.__qualname__ = decl.name
    fn.__wrapped__ = decl.contract
    return fn
