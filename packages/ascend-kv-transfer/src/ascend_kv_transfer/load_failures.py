"""What a connector's worker half tells vLLM about KV that did not arrive: blocks to recompute, or whole requests.

vLLM recomputes the blocks a connector names (`get_block_ids_with_load_errors`), but a block id names a different
block in each KV cache group, so with several groups a request with any failed block is reported whole instead
(`failed_recving`): vLLM then recomputes its prompt. Both the P2P and the pool worker record their load results here
on the engine's thread; the connector takes them once per step.
"""

from __future__ import annotations

from collections.abc import Iterable


class LoadFailures:
    def __init__(self, num_groups: int) -> None:
        self.num_groups = num_groups
        self._blocks: set[int] = set()
        self._requests: set[str] = set()

    def record(self, req_id: str, failed_block_ids: Iterable[int]) -> None:
        """`failed_block_ids`: the request's blocks whose KV did not load (every group's; empty when all loaded)."""
        failed = set(failed_block_ids)
        if not failed:
            return
        if self.num_groups > 1:
            self._requests.add(req_id)
        else:
            self._blocks |= failed

    def take_failed_reqs(self) -> set[str]:
        failed, self._requests = self._requests, set()
        return failed

    def take_invalid_blocks(self) -> set[int]:
        invalid, self._blocks = self._blocks, set()
        return invalid
