"""`AscendMooncakeConnector`: vLLM's KV connector API over the P2P scheduler and worker halves.

The class only forwards: the scheduler half (`p2p.scheduler_side`) and the worker half (`p2p.worker_side`, built on
the vLLM-free `p2p.agent`) do the work. Load it by name once the package's general plugin ran, or with
`kv_connector_module_path="ascend_kv_transfer.mooncake_connector"`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.logger import init_logger

from ascend_core.upstream import cache_hit_source
from ascend_kv_transfer.options import MooncakeOptions, parse_options
from ascend_kv_transfer.p2p.scheduler_side import P2PScheduler
from ascend_kv_transfer.p2p.worker_side import P2PWorker
from ascend_kv_transfer.split_role_connector import LoadResults, SplitRoleConnector, StepMetadata, block_major_layout
from ascend_kv_transfer.stats import AscendKVConnectorStats, CounterDeltas
from ascend_kv_transfer.vllm_config_info import engine_ranks, kv_geometry, layer_groups, worker_ranks

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = init_logger(__name__)


class AscendMooncakeConnector(LoadResults, SplitRoleConnector):
    _cache_hit_source = cache_hit_source("P2P")
    scheduler_cls: type[P2PScheduler] = P2PScheduler
    worker_cls: type[P2PWorker] = P2PWorker

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig):
        super().__init__(vllm_config, role, kv_cache_config)
        transfer = vllm_config.kv_transfer_config
        if transfer.engine_id is None:
            raise ValueError("kv_transfer_config.engine_id must be set for AscendMooncakeConnector")
        options = parse_options(MooncakeOptions, transfer.kv_connector_extra_config)
        role_name = transfer.kv_role or "kv_both"
        self._scheduler: P2PScheduler | None = None
        self._worker: P2PWorker | None = None
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = self.scheduler_cls(engine_id=transfer.engine_id, role=role_name, options=options,
                                           ranks=engine_ranks(vllm_config),
                                           block_size=vllm_config.cache_config.block_size,
                                           state_groups=_has_state_groups(kv_cache_config))
        else:
            self._worker = self.worker_cls(engine_id=transfer.engine_id, role=role_name, options=options,
                                     ranks=worker_ranks(vllm_config),
                                     geometry=kv_geometry(vllm_config, kv_cache_config),
                                     num_blocks=kv_cache_config.num_blocks, layer_groups=layer_groups(kv_cache_config))
        self._deltas = CounterDeltas()

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> str | None:
        return block_major_layout(vllm_config)

    # ---- scheduler ----------------------------------------------------------------------------------------------
    def get_loaded_kv_cache_group_ids(self, request: Request) -> tuple[int, ...]:
        return self._kv_cache_config.transfer_group_ids

    def on_new_request(self, request: Request) -> None:
        assert self._scheduler is not None
        self._scheduler.on_new_request(request)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> StepMetadata:
        assert self._scheduler is not None
        return StepMetadata(self._scheduler.build_step())

    # ---- worker -------------------------------------------------------------------------------------------------
    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        assert self._worker is not None
        self._worker.start_step(self._step())

    def get_kv_connector_stats(self) -> AscendKVConnectorStats | None:
        return self._deltas.take(self._worker.stats()) if self._worker is not None else None

    def connector_stats(self) -> dict[str, Any]:
        """Cumulative counters of this half (worker: pulls, bytes, held blocks; scheduler: loaded tokens)."""
        if self._worker is not None:
            return self._worker.stats() | {"pulled": {k: v.__dict__ for k, v in self._worker.pulled.items()}}
        assert self._scheduler is not None
        return {"loaded_tokens": dict(self._scheduler.loaded_tokens)}


def _has_state_groups(kv_cache_config: KVCacheConfig) -> bool:
    """A KV cache group of recurrent states (vLLM's `MambaSpec` family: GDN, Mamba), one state per request."""
    from vllm.v1.kv_cache_interface import MambaSpec

    return any(isinstance(g.kv_cache_spec, MambaSpec) for g in kv_cache_config.kv_cache_groups)
