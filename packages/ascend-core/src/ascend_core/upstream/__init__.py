"""The one module that knows how vLLM releases differ.

Everything else in the plugin asks this package: probes computed once per process (`capabilities()`), the lane,
and small adapters for each known difference. Nothing outside it compares version strings.
"""

from ascend_core.upstream.attention_names import register_attention_backend
from ascend_core.upstream.connector import (
    cache_hit_source,
    connector_kv_manager_unavailable_reason,
    kv_config_layout,
    transfer_results,
)
from ascend_core.upstream.deepseek_v4 import deepseek_v4_unavailable_reason
from ascend_core.upstream.deepseek_v41 import deepseek_v41_unavailable_reason, forget_resolved_model_architectures
from ascend_core.upstream.errors import ENGINE_TESTED, STATIC_ONLY, SUPPORTED_RANGE, UpstreamContractError
from ascend_core.upstream.kv_connector import unregister_connector_kv_caches
from ascend_core.upstream.kv_layout import kv_cache_layouts
from ascend_core.upstream.kv_page import kv_spec_page_shape, kv_tensor_shares_config_backing
from ascend_core.upstream.kv_tensor import kv_tensor_cls, kv_tensor_geometry, kv_tensor_layers, make_kv_tensor
from ascend_core.upstream.lane import Capabilities, Lane, capabilities, detect_capabilities
from ascend_core.upstream.logits import logits_forward_kwargs, logits_skip_gather_supported
from ascend_core.upstream.mla import mla_hooks_unavailable_reason, mla_ratio, mla_ratio_field, mla_ratio_kwargs
from ascend_core.upstream.npu_worker import npu_worker_unavailable_reason
from ascend_core.upstream.pcp import (
    pcp_has_capture_buffers,
    pcp_init_kwargs,
    pcp_partition_arg,
    pcp_partition_kwargs,
    upstream_pcp_manager_cls,
)
from ascend_core.upstream.planner import planner_function
from ascend_core.upstream.probes import ProbeResult, default_loader, run_probes
from ascend_core.upstream.quantization import (
    kv_cache_quantization_api,
    quantization_api,
    rebuild_quant_config,
    set_layer_kv_cache_dtype,
)
from ascend_core.upstream.runner import bind_kv_cache_kwargs, mrv2_unavailable_reason, resolved_kv_cache_layout
from ascend_core.upstream.speculator import (
    DP_ARG_NAMES,
    dflash2_unavailable_reason,
    pop_speculator_dp,
    speculator_dp_arg,
    speculator_dp_kwargs,
)
from ascend_core.upstream.version import installed_vllm_version, public_version, support_level, vllm_version_is

__all__ = [
    "kv_cache_quantization_api",
    "quantization_api",
    "rebuild_quant_config",
    "set_layer_kv_cache_dtype",
    "DP_ARG_NAMES",
    "ENGINE_TESTED",
    "STATIC_ONLY",
    "SUPPORTED_RANGE",
    "Capabilities",
    "Lane",
    "ProbeResult",
    "UpstreamContractError",
    "bind_kv_cache_kwargs",
    "cache_hit_source",
    "capabilities",
    "connector_kv_manager_unavailable_reason",
    "deepseek_v4_unavailable_reason",
    "deepseek_v41_unavailable_reason",
    "default_loader",
    "detect_capabilities",
    "dflash2_unavailable_reason",
    "forget_resolved_model_architectures",
    "installed_vllm_version",
    "kv_cache_layouts",
    "kv_config_layout",
    "kv_spec_page_shape",
    "kv_tensor_cls",
    "kv_tensor_geometry",
    "kv_tensor_layers",
    "kv_tensor_shares_config_backing",
    "logits_forward_kwargs",
    "logits_skip_gather_supported",
    "make_kv_tensor",
    "mla_hooks_unavailable_reason",
    "npu_worker_unavailable_reason",
    "mla_ratio",
    "mla_ratio_field",
    "mla_ratio_kwargs",
    "mrv2_unavailable_reason",
    "pcp_has_capture_buffers",
    "pcp_init_kwargs",
    "pcp_partition_arg",
    "pcp_partition_kwargs",
    "planner_function",
    "pop_speculator_dp",
    "public_version",
    "register_attention_backend",
    "resolved_kv_cache_layout",
    "run_probes",
    "speculator_dp_arg",
    "speculator_dp_kwargs",
    "support_level",
    "transfer_results",
    "unregister_connector_kv_caches",
    "upstream_pcp_manager_cls",
    "vllm_version_is",
]
