"""The one module that knows how vLLM releases differ.

Everything else in the plugin asks this package: probes computed once per process (`capabilities()`), the lane,
and small adapters for each known difference. Nothing outside it compares version strings.
"""

from ascend_core.upstream.errors import SUPPORTED_RANGE, UpstreamContractError
from ascend_core.upstream.kv_connector import unregister_connector_kv_caches
from ascend_core.upstream.kv_layout import kv_cache_layouts
from ascend_core.upstream.kv_page import kv_spec_page_shape, kv_tensor_shares_config_backing
from ascend_core.upstream.kv_tensor import kv_tensor_cls, kv_tensor_geometry, kv_tensor_layers, make_kv_tensor
from ascend_core.upstream.lane import Capabilities, Lane, capabilities, detect_capabilities
from ascend_core.upstream.logits import logits_forward_kwargs, logits_skip_gather_supported
from ascend_core.upstream.mla import mla_ratio, mla_ratio_field, mla_ratio_kwargs
from ascend_core.upstream.pcp import (
    pcp_has_capture_buffers,
    pcp_init_kwargs,
    pcp_partition_arg,
    pcp_partition_kwargs,
    upstream_pcp_manager_cls,
)
from ascend_core.upstream.planner import planner_function
from ascend_core.upstream.probes import ProbeResult, default_loader, run_probes
from ascend_core.upstream.speculator import (
    DP_ARG_NAMES,
    pop_speculator_dp,
    speculator_dp_arg,
    speculator_dp_kwargs,
)
from ascend_core.upstream.version import installed_vllm_version, public_version, vllm_version_is

__all__ = [
    "DP_ARG_NAMES",
    "SUPPORTED_RANGE",
    "Capabilities",
    "Lane",
    "ProbeResult",
    "UpstreamContractError",
    "capabilities",
    "default_loader",
    "detect_capabilities",
    "installed_vllm_version",
    "kv_cache_layouts",
    "kv_spec_page_shape",
    "kv_tensor_cls",
    "kv_tensor_geometry",
    "kv_tensor_layers",
    "kv_tensor_shares_config_backing",
    "logits_forward_kwargs",
    "logits_skip_gather_supported",
    "make_kv_tensor",
    "mla_ratio",
    "mla_ratio_field",
    "mla_ratio_kwargs",
    "pcp_has_capture_buffers",
    "pcp_init_kwargs",
    "pcp_partition_arg",
    "pcp_partition_kwargs",
    "planner_function",
    "pop_speculator_dp",
    "public_version",
    "run_probes",
    "speculator_dp_arg",
    "speculator_dp_kwargs",
    "unregister_connector_kv_caches",
    "upstream_pcp_manager_cls",
    "vllm_version_is",
]
