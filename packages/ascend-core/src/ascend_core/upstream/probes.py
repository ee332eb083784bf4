"""Feature probes of the installed vLLM: the table in upstream-vllm-contracts.md, computed once per process.

Each probe looks at a dataclass field, a signature or a module, never at a version string. A probe gets its
objects through a loader so tests can hand it stand-ins shaped like another release.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Loader = Callable[[str, "str | None"], Any]


def default_loader(module: str, attr: str | None = None) -> Any:
    """Import `module` and return it, or its attribute `attr`."""
    mod = importlib.import_module(module)
    return getattr(mod, attr) if attr else mod


def module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


@dataclass(frozen=True)
class ProbeResult:
    name: str
    ok: bool
    value: Any
    detail: str
    required: bool


def _field_names(cls: Any) -> set[str]:
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    return set(getattr(cls, "__annotations__", {}))


def _first_present(names: set[str], candidates: tuple[str, ...]) -> str | None:
    return next((c for c in candidates if c in names), None)


def _probe_kv_tensor_layer_field(load: Loader) -> tuple[bool, Any, str]:
    names = _field_names(load("vllm.v1.kv_cache_interface", "KVCacheTensor"))
    field = _first_present(names, ("layers", "shared_by"))
    if field is None:
        return False, None, f"KVCacheTensor has neither 'layers' nor 'shared_by' (fields: {sorted(names)})"
    return True, field, f"KVCacheTensor.{field}"


def _probe_kv_tensor_strides(load: Loader) -> tuple[bool, Any, str]:
    names = _field_names(load("vllm.v1.kv_cache_interface", "KVCacheTensor"))
    present = {"layer_stride", "block_stride", "offset"} & names
    return True, sorted(present), f"stride fields present: {sorted(present) or 'none'}"


def _probe_kv_tensor_host_resident(load: Loader) -> tuple[bool, Any, str]:
    has = "host_resident" in _field_names(load("vllm.v1.kv_cache_interface", "KVCacheTensor"))
    return True, has, "KVCacheTensor.host_resident" + ("" if has else " absent")


def _probe_mla_ratio_field(load: Loader) -> tuple[bool, Any, str]:
    names = _field_names(load("vllm.v1.kv_cache_interface", "MLAAttentionSpec"))
    field = _first_present(names, ("tokens_per_state", "compress_ratio"))
    if field is None:
        return False, None, "MLAAttentionSpec has neither 'tokens_per_state' nor 'compress_ratio'"
    return True, field, f"MLAAttentionSpec.{field}"


def _probe_planner_module(load: Loader) -> tuple[bool, Any, str]:
    for mod in ("vllm.v1.core.kv_cache_planning", "vllm.v1.core.kv_cache_utils"):
        if module_exists(mod):
            planner = load(mod, None)
            if hasattr(planner, "get_kv_cache_config_from_groups") or hasattr(planner, "KVCacheConfigBuilder"):
                return True, mod, mod
    return False, None, "no KV planner module (kv_cache_planning / kv_cache_utils with get_kv_cache_config_from_groups)"


def _probe_kv_cache_layout(load: Loader) -> tuple[bool, Any, str]:
    ok = module_exists("vllm.v1.kv_cache_layout")
    return True, ok, "vllm.v1.kv_cache_layout" + ("" if ok else " absent (legacy per-backend shapes)")


def _probe_shared_allocate(load: Loader) -> tuple[bool, Any, str]:
    has = hasattr(load("vllm.v1.worker.utils", None), "allocate_kv_cache")
    return True, has, "vllm.v1.worker.utils.allocate_kv_cache" + ("" if has else " absent")


_DP_ARGS = ("dp_sync_state", "dp_sync", "num_tokens_across_dp")


def _probe_speculator_dp_arg(load: Loader) -> tuple[bool, Any, str]:
    mod = "vllm.v1.worker.gpu.spec_decode.speculator"
    if not module_exists(mod):
        return True, None, f"{mod} absent (no MRV2 speculators)"
    params = inspect.signature(load(mod, "BaseSpeculator").propose).parameters
    arg = _first_present(set(params), _DP_ARGS)
    if arg is None:
        return False, None, f"BaseSpeculator.propose takes none of {list(_DP_ARGS)}"
    return True, arg, f"BaseSpeculator.propose({arg}=...)"


def _probe_logits_skip_gather(load: Loader) -> tuple[bool, Any, str]:
    cls = load("vllm.model_executor.layers.logits_processor", "LogitsProcessor")
    has = "skip_gather" in inspect.signature(cls.forward).parameters
    return True, has, "LogitsProcessor.forward(skip_gather=...)" + ("" if has else " absent")


def _probe_connector_unregister(load: Loader) -> tuple[bool, Any, str]:
    cls = load("vllm.distributed.kv_transfer.kv_connector.v1.base", "KVConnectorBase_V1")
    has = hasattr(cls, "unregister_kv_caches")
    return True, has, "KVConnectorBase_V1.unregister_kv_caches" + ("" if has else " absent")


def _probe_kv_spec_registry(load: Loader) -> tuple[bool, Any, str]:
    ok = module_exists("vllm.v1.kv_cache_spec_registry")
    return True, ok, "vllm.v1.kv_cache_spec_registry" + ("" if ok else " absent")


_BIND_MODULE = "vllm.v1.worker.utils"
_MRV2_ATTN_MODULE = "vllm.v1.worker.gpu.attn_utils"
# What Ascend's MRV2 runner (ascend_platform.worker.model_runner_v2) calls or patches, by name.
_MRV2_INIT_KV_CACHE_PARAMS = ("kv_cache_allocation_context", "block_tables", "attn_groups")


def function_params(load: Loader, module: str, name: str) -> list[str] | None:
    """Parameter names of `module.name`, or None when the module does not define it.

    A module not imported yet is read from its source (ast) instead: importing vLLM's runner modules imports
    Triton, which must not happen before the simulated platform has decided how Triton runs.
    """
    if load is not default_loader or module in sys.modules:
        fn = getattr(load(module, None), name, None)
        return None if fn is None else list(inspect.signature(fn).parameters)
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        raise ModuleNotFoundError(f"no module named {module!r}")
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            a = node.args
            return [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    return None


def probe_mrv2_kv_hooks(load: Loader) -> tuple[bool, Any, str]:
    """Whether Ascend's MRV2 runner can allocate and bind its KV cache on this vLLM (value True/False).

    Always ok (MRV2 is optional: the V1 runner serves without it); the detail names what is missing.
    """
    if not module_exists(_MRV2_ATTN_MODULE):
        return True, False, f"{_MRV2_ATTN_MODULE} absent (no Model Runner V2)"
    missing = []
    if function_params(load, _BIND_MODULE, "bind_kv_cache_to_layers") is None:
        missing.append(f"{_BIND_MODULE}.bind_kv_cache_to_layers")
    params = function_params(load, _MRV2_ATTN_MODULE, "init_kv_cache")
    if params is None:
        missing.append(f"{_MRV2_ATTN_MODULE}.init_kv_cache")
    else:
        missing += [f"init_kv_cache({p}=...)" for p in _MRV2_INIT_KV_CACHE_PARAMS if p not in params]
    if missing:
        return True, False, "Ascend's Model Runner V2 needs what this vLLM lacks: " + ", ".join(missing)
    return True, True, "init_kv_cache(kv_cache_allocation_context, block_tables, attn_groups), bind_kv_cache_to_layers"


# (name, required, probe). Required probes are those without which no lane adapter can work.
PROBES: tuple[tuple[str, bool, Callable[[Loader], tuple[bool, Any, str]]], ...] = (
    ("kv_tensor_layer_field", True, _probe_kv_tensor_layer_field),
    ("kv_tensor_strides", False, _probe_kv_tensor_strides),
    ("kv_tensor_host_resident", False, _probe_kv_tensor_host_resident),
    ("mla_ratio_field", True, _probe_mla_ratio_field),
    ("planner_module", True, _probe_planner_module),
    ("kv_cache_layout_module", False, _probe_kv_cache_layout),
    ("shared_allocate_kv_cache", False, _probe_shared_allocate),
    ("speculator_dp_arg", False, _probe_speculator_dp_arg),
    ("logits_skip_gather", False, _probe_logits_skip_gather),
    ("connector_unregister_kv_caches", False, _probe_connector_unregister),
    ("kv_spec_registry", False, _probe_kv_spec_registry),
    ("mrv2_kv_hooks", False, probe_mrv2_kv_hooks),
)


def run_probes(loader: Loader = default_loader) -> list[ProbeResult]:
    """Run every probe; an exception inside a probe is that probe's failure, never the caller's."""
    results = []
    for name, required, probe in PROBES:
        try:
            ok, value, detail = probe(loader)
        except Exception as exc:  # a missing module or attribute is exactly what a probe reports
            ok, value, detail = False, None, f"{type(exc).__name__}: {exc}"
        results.append(ProbeResult(name, ok, value, detail, required))
    return results
