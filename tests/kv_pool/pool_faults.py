"""`FaultInjectingStoreConnector`: `AscendStoreConnector` plus faults a test switches on by creating files.

Test code, loaded by an engine through `kv_connector_module_path="pool_faults"` (this folder on PYTHONPATH). The
faults act on the real store, at the points the issue reports break the reference plugin:

- `$ASCEND_POOL_FAULTS_DIR/remove_after_lookup`: once a lookup has found blocks, they are removed from the store
  (forced, as eviction or lease expiry would) before the worker reads them;
- `$ASCEND_POOL_FAULTS_DIR/put_raises`: the Mooncake binding's batch put raises.
"""

from __future__ import annotations

import os
from pathlib import Path

from ascend_kv_transfer.store_connector import AscendStoreConnector


class _RaisingPuts:
    def __init__(self, store, switch: Path):
        self._store = store
        self._switch = switch

    def __getattr__(self, name):
        return getattr(self._store, name)

    def batch_put_from_multi_buffers(self, *args, **kwargs):
        if self._switch.exists():
            raise RuntimeError("injected fault: batch_put_from_multi_buffers raised")
        return self._store.batch_put_from_multi_buffers(*args, **kwargs)


class FaultInjectingStoreConnector(AscendStoreConnector):
    def __init__(self, vllm_config, role, kv_cache_config):
        super().__init__(vllm_config, role, kv_cache_config)
        self._faults = Path(os.environ["ASCEND_POOL_FAULTS_DIR"])
        self.removed_after_lookup = 0
        if self._worker is not None:
            self._worker.client.store = _RaisingPuts(self._worker.client.store, self._faults / "put_raises")

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        tokens, load_async = super().get_num_new_matched_tokens(request, num_computed_tokens)
        if tokens and (self._faults / "remove_after_lookup").exists():
            sched = self._scheduler
            first = num_computed_tokens // sched.block_size
            hashes = sched.hashes.get(request, first + tokens // sched.block_size)[first:]
            keys = [k for h in hashes for k in sched.keys.block_keys(sched.ranks, sched.groups, h)]
            sched.client.remove(keys)
            self.removed_after_lookup += len(keys)
        return tokens, load_async

    def connector_stats(self):
        stats = super().connector_stats()
        if self._scheduler is not None:
            stats["removed_after_lookup"] = self.removed_after_lookup
        return stats
