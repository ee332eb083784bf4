"""`AscendOffloadingConnector`: KV blocks kept in a host-memory tier keyed by block hash, reloaded on a prefix hit.

Runs wherever torch can copy between the device and host memory (vLLM's own OffloadingConnector and
SimpleCPUOffloadConnector refuse vLLM's CPU build). One KV cache group only; options: `host_bytes`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.logger import init_logger

from ascend_core.upstream import cache_hit_source
from ascend_kv_transfer.offload.lru import HostTierIndex
from ascend_kv_transfer.offload.scheduler_side import OffloadScheduler
from ascend_kv_transfer.offload.worker_side import OffloadWorker
from ascend_kv_transfer.options import OffloadOptions, parse_options
from ascend_kv_transfer.split_role_connector import SplitRoleConnector, StepMetadata
from ascend_kv_transfer.stats import AscendKVConnectorStats, CounterDeltas
from ascend_kv_transfer.vllm_config_info import bytes_per_block, layer_groups

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig

logger = init_logger(__name__)


class AscendOffloadingConnector(SplitRoleConnector):
    _cache_hit_source = cache_hit_source("HOST")

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig):
        super().__init__(vllm_config, role, kv_cache_config)
        options = parse_options(OffloadOptions, vllm_config.kv_transfer_config.kv_connector_extra_config)
        if len(kv_cache_config.kv_cache_groups) != 1:
            raise ValueError(f"AscendOffloadingConnector supports one KV cache group, this model has "
                             f"{len(kv_cache_config.kv_cache_groups)}")
        per_block = bytes_per_block(kv_cache_config)
        index = HostTierIndex(options.host_bytes, per_block)
        self._scheduler: OffloadScheduler | None = None
        self._worker: OffloadWorker | None = None
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = OffloadScheduler(index=index, block_size=vllm_config.cache_config.block_size)
        else:
            self._worker = OffloadWorker(num_slots=index.num_slots, num_blocks=kv_cache_config.num_blocks,
                                         layers=set(layer_groups(kv_cache_config)))
        self._deltas = CounterDeltas()

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a dropped store is only a future cache miss

    # ---- scheduler ----------------------------------------------------------------------------------------------
    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> StepMetadata:
        assert self._scheduler is not None
        return StepMetadata(self._scheduler.build_step())

    # ---- worker -------------------------------------------------------------------------------------------------
    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        assert self._worker is not None
        self._worker.run_step(self._step())

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        assert self._worker is not None
        return self._worker.take_finished_stores() or None, None

    def get_kv_connector_stats(self) -> AscendKVConnectorStats | None:
        return self._deltas.take(dict(self._worker.stats.__dict__)) if self._worker is not None else None

    def connector_stats(self) -> dict[str, Any]:
        if self._worker is not None:
            return dict(self._worker.stats.__dict__) | {"registrations": self._worker.registrations,
                                                        "registered": self._worker.registered()}
        assert self._scheduler is not None
        return dict(self._scheduler.stats.__dict__) | {"tier_blocks": len(self._scheduler.index),
                                                      "evictions": self._scheduler.index.evictions}
