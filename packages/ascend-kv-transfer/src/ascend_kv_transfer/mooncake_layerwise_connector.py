"""`AscendMooncakeLayerwiseConnector`: the prefill engine pushes each layer's KV to the decode engine as soon as the
layer is computed (from `save_kv_layer`), overlapping the transfer with the rest of the prefill.

The decode request goes first (it allocates the destination blocks and sends them to the prefill worker); the
prefill request follows with the same `transfer_id`. Same `kv_transfer_params` and options as
`AscendMooncakeConnector`; load it by name or with
`kv_connector_module_path="ascend_kv_transfer.mooncake_layerwise_connector"`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ascend_core.upstream import connector_kv_manager_unavailable_reason
from ascend_kv_transfer.mooncake_connector import AscendMooncakeConnector
from ascend_kv_transfer.p2p.layerwise_sides import LayerwiseScheduler, LayerwiseWorker
from ascend_kv_transfer.split_role_connector import StepMetadata

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig


class AscendMooncakeLayerwiseConnector(AscendMooncakeConnector):
    scheduler_cls = LayerwiseScheduler
    worker_cls = LayerwiseWorker

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig):
        refused = connector_kv_manager_unavailable_reason()
        if refused is not None:  # layer pushes are planned from the manager's block ids: without it, none would be
            raise ValueError(f"AscendMooncakeLayerwiseConnector cannot run on this vLLM: {refused}")
        super().__init__(vllm_config, role, kv_cache_config)

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        return True  # save_kv_layer must run between the layers of a captured graph

    def bind_kv_cache_manager(self, kv_cache_manager: KVCacheManager) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        assert isinstance(self._scheduler, LayerwiseScheduler)
        self._scheduler.kv_cache_manager = kv_cache_manager

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> StepMetadata:
        assert isinstance(self._scheduler, LayerwiseScheduler)
        return StepMetadata(self._scheduler.build_layerwise_step(scheduler_output.num_scheduled_tokens))

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata,
                      **kwargs: Any) -> None:
        assert isinstance(self._worker, LayerwiseWorker)
        self._worker.save_layer(layer_name, kv_layer, self._step())

    def wait_for_save(self) -> None:
        assert isinstance(self._worker, LayerwiseWorker)
        self._worker.end_step(self._step())
