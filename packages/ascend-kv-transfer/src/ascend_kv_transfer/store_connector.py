"""`AscendStoreConnector`: a KV pool over Mooncake Store; engines save full blocks by content hash, any engine loads.

Works on any vLLM platform. Each worker registers its KV memory with a Mooncake Store client once and moves one
object per block per rank per KV cache group with zero-copy batched gets and puts; the scheduler looks prefixes up
with `batch_is_exist` through its own client (no lookup port, no memory lent). Loads are asynchronous, a failed
get is a load error vLLM recomputes (`kv_load_failure_policy="recompute"` is required), a master that goes away
turns the pool off with a warning. Options: `ascend_kv_transfer.pool.options.StoreOptions` (README, KV pool).
Composes with the P2P connector under vLLM's `MultiConnector` (prefill saves to the pool, decode pulls P2P).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.logger import init_logger

from ascend_core.upstream import connector_kv_manager_unavailable_reason
from ascend_kv_transfer.pool.config_info import (
    engine_rank_sizes,
    layer_order,
    namespace,
    pool_block_tokens,
    saves_objects,
    tp_replicated,
    worker_rank,
)
from ascend_kv_transfer.pool.keys import PoolKeys
from ascend_kv_transfer.pool.options import StoreOptions, parse_store_options
from ascend_kv_transfer.pool.scheduler_side import PoolScheduler
from ascend_kv_transfer.pool.store_client import StoreClient
from ascend_kv_transfer.pool.worker_side import PoolWorker
from ascend_kv_transfer.split_role_connector import LoadResults, SplitRoleConnector, StepMetadata, block_major_layout
from ascend_kv_transfer.stats import GAUGE_KEYS, AscendKVConnectorStats, CounterDeltas
from ascend_kv_transfer.vllm_config_info import layer_groups

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

logger = init_logger(__name__)


def _check_failure_policy(transfer: Any) -> None:
    policy = getattr(transfer, "kv_load_failure_policy", "recompute")
    if policy != "recompute":
        raise ValueError(
            f"AscendStoreConnector needs kv_transfer_config.kv_load_failure_policy='recompute', got {policy!r}: a "
            "block the lookup found can be evicted or expire before it is read, and with 'fail' vLLM would fail that "
            "request instead of recomputing the block. Under MultiConnector, set it both at the top level (vLLM "
            "reads it there) and in this connector's entry (the only config this connector sees).")


class AscendStoreConnector(LoadResults, SplitRoleConnector):
    store_client_cls: type[StoreClient] = StoreClient

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig):
        refused = connector_kv_manager_unavailable_reason()
        if refused is not None:  # saves are planned from the manager's block ids: without it, none could be
            raise ValueError(f"AscendStoreConnector cannot run on this vLLM: {refused}")
        super().__init__(vllm_config, role, kv_cache_config)
        transfer = vllm_config.kv_transfer_config
        self.options: StoreOptions = parse_store_options(transfer.kv_connector_extra_config)
        block_tokens = pool_block_tokens(vllm_config, kv_cache_config)
        keys = PoolKeys(namespace(vllm_config, kv_cache_config, self.options.model_key, block_tokens))
        replicated = tp_replicated(vllm_config, kv_cache_config)
        order = layer_order(kv_cache_config)
        self._scheduler: PoolScheduler | None = None
        self._worker: PoolWorker | None = None
        if role == KVConnectorRole.SCHEDULER:
            _check_failure_policy(transfer)
            client = self.store_client_cls(self.options, contribute=False, name="scheduler")
            self._scheduler = PoolScheduler(
                client=client, keys=keys, ranks=engine_rank_sizes(vllm_config, replicated=replicated).all_ranks(),
                groups=sorted(order),
                block_size=block_tokens, save=(transfer.kv_role or "kv_both") != "kv_consumer",
                save_output_blocks=self.options.save_output_blocks)
        else:
            client = self.store_client_cls(self.options, contribute=True, name="worker")
            self._worker = PoolWorker(
                client=client, keys=keys, rank=worker_rank(vllm_config, replicated=replicated),
                layer_groups=layer_groups(kv_cache_config), layer_order=order, num_blocks=kv_cache_config.num_blocks,
                inline_load_max_bytes=self.options.inline_load_max_bytes,
                save_wait_timeout_s=self.options.save_wait_timeout_s, saves=saves_objects(replicated))
        logger.info("AscendStoreConnector (%s): pool namespace %s, %d tokens per block", role.name, keys.namespace,
                    block_tokens)
        self._deltas = CounterDeltas()

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a cache: a dropped save is only a future miss

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> str | None:
        # A block's page of a layer must be one contiguous run of bytes (an object is a list of pages); the same
        # layout as the P2P connector's, so the two agree under MultiConnector.
        return block_major_layout(vllm_config)

    # ---- scheduler ----------------------------------------------------------------------------------------------
    def bind_kv_cache_manager(self, kv_cache_manager: KVCacheManager) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        if self._scheduler is not None:
            self._scheduler.kv_cache_manager = kv_cache_manager

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        assert self._scheduler is not None
        return self._scheduler.request_finished(request)

    def request_finished_all_groups(self, request: Request,
                                    block_ids: tuple[list[int], ...]) -> tuple[bool, dict[str, Any] | None]:
        assert self._scheduler is not None
        return self._scheduler.request_finished(request)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> StepMetadata:
        assert self._scheduler is not None
        return StepMetadata(self._scheduler.build_step(scheduler_output))

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        if self._scheduler is not None and connector_output.finished_sending:
            self._scheduler.finished_sending(set(connector_output.finished_sending))

    def shutdown(self) -> None:
        if self._scheduler is not None:
            self._scheduler.client.close()
        super().shutdown()

    # ---- worker -------------------------------------------------------------------------------------------------
    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        assert self._worker is not None and isinstance(kv_connector_metadata, StepMetadata)
        if kv_connector_metadata.step.preempted:
            self._worker.wait_for_saves(kv_connector_metadata.step.preempted)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        assert self._worker is not None
        self._worker.start_step(self._step())

    def wait_for_save(self) -> None:
        assert self._worker is not None
        self._worker.start_saves(self._step().saves)

    def get_kv_connector_stats(self) -> AscendKVConnectorStats | None:
        if self._worker is None:
            return None
        return self._deltas.take({k: v for k, v in self._worker.stats_dict().items() if k not in GAUGE_KEYS})

    def connector_stats(self) -> dict[str, Any]:
        """Cumulative counters of this half (scheduler: lookups and hits; worker: loads, saves, failures)."""
        if self._worker is not None:
            return self._worker.stats_dict() | {"recent_loads": dict(self._worker.recent_loads)}
        assert self._scheduler is not None
        stats = dict(self._scheduler.stats.__dict__)
        stats["per_request_hits"] = dict(stats["per_request_hits"])
        return stats | {"pool_enabled": self._scheduler.client.available, "namespace": self._scheduler.keys.namespace}
