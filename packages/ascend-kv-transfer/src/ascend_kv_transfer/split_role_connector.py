"""The part of vLLM's KV connector API that every Ascend connector only forwards to its scheduler or worker half.

A connector subclass builds `_scheduler` (scheduler role) or `_worker` (worker role) in `__init__` and writes the
hooks where the halves differ: `build_connector_meta` (the scheduler half's step, as `StepMetadata`), `start_load_kv`
(the worker half runs `_step()`), `get_finished` and its statistics. `LoadResults` adds the hooks of a worker half
that loads KV asynchronously and books its failures (`load_failures.LoadFailures`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata, SupportsHMA

from ascend_core.upstream import transfer_results
from ascend_kv_transfer.stats import AscendKVConnectorStats, AscendPromMetrics

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.request import Request


class StepMetadata(KVConnectorMetadata):
    """What the scheduler half planned for one engine step, handed to the worker half by vLLM."""

    def __init__(self, step: Any):
        self.step = step


def block_major_layout(vllm_config: VllmConfig) -> str | None:
    """`get_required_kvcache_layout` of the Mooncake connectors: layer-outer, block-major pages, so each layer's
    blocks are back to back and a run of blocks (or a block's page of a layer) is one contiguous transfer; MLA's
    latent cache has no head axis to lay out."""
    model = vllm_config.model_config
    if model is None or model.use_mla:
        return None
    return "LBHNC"


class SplitRoleConnector(KVConnectorBase_V1, SupportsHMA):
    _scheduler: Any = None
    _worker: Any = None

    def _step(self) -> Any:
        """The step the scheduler half planned for the step now running (worker role)."""
        metadata = self._get_connector_metadata()
        assert isinstance(metadata, StepMetadata)
        return metadata.step

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> AscendKVConnectorStats:
        return AscendKVConnectorStats(data=data or {})

    @classmethod
    def build_prom_metrics(cls, vllm_config: Any, metric_types: dict, labelnames: list[str],
                           per_engine_labelvalues: dict[int, list[object]]) -> AscendPromMetrics:
        return AscendPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues, cls.__name__)

    # ---- scheduler ----------------------------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        assert self._scheduler is not None
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        assert self._scheduler is not None
        self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        assert self._scheduler is not None
        return self._scheduler.request_finished(request, (block_ids,))

    def request_finished_all_groups(self, request: Request,
                                    block_ids: tuple[list[int], ...]) -> tuple[bool, dict[str, Any] | None]:
        assert self._scheduler is not None
        return self._scheduler.request_finished(request, block_ids)

    # ---- worker -------------------------------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        assert self._worker is not None
        self._worker.register_kv_caches(kv_caches)

    def unregister_kv_caches(self) -> None:
        """Before the KV memory is freed (sleep; vLLM 0.33's hook, called by the Ascend platform on every release):
        drop what refers to it. Idempotent."""
        release = getattr(self._worker, "unregister_kv_caches", None)
        if release is not None:
            release()

    def restore_kv_caches(self) -> None:
        """After a wake-up that kept the KV memory's addresses (vLLM 0.33's hook); a wake-up that moved it calls
        `register_kv_caches` with the new tensors instead. Idempotent."""
        restore = getattr(self._worker, "restore_kv_caches", None)
        if restore is not None:
            restore()

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata,
                      **kwargs: Any) -> None:
        return

    def wait_for_save(self) -> None:
        return

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()


class LoadResults:
    """The worker hooks of a connector whose worker half loads asynchronously: `get_finished()` gives (sending,
    recving) and `load_failures` what did not arrive, blocks to recompute or whole requests."""

    _worker: Any

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        assert self._worker is not None
        sending, recving = self._worker.get_finished()
        return sending or None, recving or None

    def get_transfer_results(self, finished_req_ids: set[str]) -> Any:  # KVConnectorTransferResults (0.29+)
        assert self._worker is not None
        sending, recving = self._worker.get_finished()
        return transfer_results(finished_sending=sending, finished_recving=recving,
                                failed_recving=self._worker.load_failures.take_failed_reqs())

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.load_failures.take_invalid_blocks() if self._worker is not None else set()
