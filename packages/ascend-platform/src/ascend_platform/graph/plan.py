"""Graph-capture planning: which batch shapes get a captured graph, and which one a given batch replays.

The plan is data computed from the configuration (capture sizes and `CUDAGraphMode` from the compilation config,
`max_num_seqs`, the decode query length). It knows three rules:

* capture sizes: the configured sizes up to `max_cudagraph_capture_size`; none when graphs are off;
* descriptor choice: FULL only for a decode-only batch, and only when the mode captures FULL decode graphs;
  PIECEWISE for any other batch when the mode has piecewise graphs; otherwise, or when the batch is larger than
  the largest capture size, NONE (eager);
* padding: a batch pads its tokens up to the smallest captured size that holds it; FULL graphs also pad the
  request count (decodes carry `decode_query_len` tokens each), PIECEWISE graphs do not (`num_reqs=None`).

Under PCP the token count to plan for is the largest rank-local count (`AscendPCPManager.num_tokens_for_dispatch`),
and the manager still keeps every real token if a descriptor turns out too small. The descriptors are vLLM's own
`BatchExecutionDescriptor`, so the MRV2 runner and the PCP manager consume them unchanged. The same plan drives
ACL graphs on an NPU and eager, recorded "graphs" in the simulated lane (`ascend_platform.graph.manager`).
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Any

from vllm.config import CUDAGraphMode
from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def default_capture_sizes(max_size: int) -> list[int]:
    """vLLM's documented default ladder: 1, 2, 4, then steps of 8 to 256, then steps of 16, up to `max_size`."""
    ladder = [1, 2, 4, *range(8, 256, 8), *range(256, max_size + 1, 16)]
    return [s for s in ladder if s <= max_size]


@dataclasses.dataclass(frozen=True, kw_only=True)
class GraphCapturePlan:
    mode: CUDAGraphMode
    capture_sizes: tuple[int, ...]
    max_num_reqs: int
    decode_query_len: int = 1

    def __post_init__(self) -> None:
        if list(self.capture_sizes) != sorted(set(self.capture_sizes)) or any(s <= 0 for s in self.capture_sizes):
            raise ValueError(f"capture sizes must be positive, unique and ascending, got {list(self.capture_sizes)}")
        if self.max_num_reqs < 1 or self.decode_query_len < 1:
            raise ValueError(
                f"max_num_reqs and decode_query_len must be >= 1, got {self.max_num_reqs}, {self.decode_query_len}"
            )

    @classmethod
    def from_vllm_config(cls, vllm_config: Any, decode_query_len: int = 1) -> GraphCapturePlan:
        """The plan of a `VllmConfig`: its compilation config's graph mode and sizes, and `max_num_seqs`."""
        return cls.from_compilation_config(
            vllm_config.compilation_config, vllm_config.scheduler_config.max_num_seqs, decode_query_len
        )

    @classmethod
    def from_compilation_config(
        cls, compilation: Any, max_num_reqs: int, decode_query_len: int = 1, mode: CUDAGraphMode | None = None
    ) -> GraphCapturePlan:
        """Sizes from `cudagraph_capture_sizes`, else vLLM's default ladder up to `max_cudagraph_capture_size`;
        the mode is the config's unless given (the runner passes the mode vLLM resolved for its backends)."""
        mode = mode if mode is not None else (compilation.cudagraph_mode or CUDAGraphMode.NONE)
        limit = compilation.max_cudagraph_capture_size
        sizes = compilation.cudagraph_capture_sizes
        if sizes is None:
            sizes = default_capture_sizes(limit) if limit else []
        if limit is not None:
            sizes = [s for s in sizes if s <= limit]
        return cls(
            mode=mode,
            capture_sizes=tuple(sorted(set(sizes))) if mode else (),
            max_num_reqs=max_num_reqs,
            decode_query_len=decode_query_len,
        )

    @property
    def max_capture_size(self) -> int:
        return self.capture_sizes[-1] if self.capture_sizes else 0

    def padded_num_tokens(self, num_tokens: int) -> int | None:
        """Smallest capture size holding `num_tokens`, or None when no captured graph can."""
        i = bisect.bisect_left(self.capture_sizes, num_tokens)
        return self.capture_sizes[i] if i < len(self.capture_sizes) else None

    def _full_decode_desc(self, size: int) -> BatchExecutionDescriptor | None:
        tokens = _round_up(size, self.decode_query_len)
        reqs = tokens // self.decode_query_len
        if tokens > self.max_capture_size or reqs > self.max_num_reqs:
            return None
        uniform = self.decode_query_len if self.mode.separate_routine() else None
        return BatchExecutionDescriptor(
            cg_mode=CUDAGraphMode.FULL, num_tokens=tokens, num_reqs=reqs, uniform_token_count=uniform
        )

    def _mixed_desc(self, size: int) -> BatchExecutionDescriptor:
        return BatchExecutionDescriptor(cg_mode=CUDAGraphMode.PIECEWISE, num_tokens=size, num_reqs=None)

    @property
    def _full_decode(self) -> bool:
        return self.mode.decode_mode() == CUDAGraphMode.FULL

    @property
    def _piecewise_mixed(self) -> bool:
        return self.mode.mixed_mode() == CUDAGraphMode.PIECEWISE

    def capture_descriptors(self) -> list[BatchExecutionDescriptor]:
        """Every descriptor to capture, largest first (later, smaller graphs reuse the larger ones' memory pool)."""
        descs: list[BatchExecutionDescriptor] = []
        for size in self.capture_sizes:
            if self._full_decode:
                full = self._full_decode_desc(size)
                if full is not None and full not in descs:
                    descs.append(full)
            if self._piecewise_mixed:
                descs.append(self._mixed_desc(size))
        return sorted(descs, key=lambda d: (d.num_tokens, d.cg_mode.value), reverse=True)

    def descriptors_by_mode(self) -> dict[CUDAGraphMode, list[BatchExecutionDescriptor]]:
        """`capture_descriptors()` grouped by mode (each largest first), the shape vLLM's graph manager keeps."""
        out: dict[CUDAGraphMode, list[BatchExecutionDescriptor]] = {}
        for desc in self.capture_descriptors():
            out.setdefault(desc.cg_mode, []).append(desc)
        return out

    @staticmethod
    def batch_kind(*, decode_only: bool) -> str:
        """How the plan names a batch: "uniform_decode" (may take a FULL graph) or "mixed"."""
        return "uniform_decode" if decode_only else "mixed"

    def descriptor_for(
        self, num_reqs: int, num_tokens: int, *, decode_only: bool, uniform: bool | None = None
    ) -> BatchExecutionDescriptor:
        """The descriptor a batch of `num_reqs` requests and `num_tokens` tokens runs with.

        `uniform` (every request has `decode_query_len` tokens) defaults to what the counts say; under PCP the
        runner passes it from the global batch, since `num_tokens` is then a rank's local count.
        """
        if num_tokens < 0 or num_reqs < 0:
            raise ValueError(f"batch sizes must be >= 0, got {num_reqs} requests, {num_tokens} tokens")
        eager = BatchExecutionDescriptor(cg_mode=CUDAGraphMode.NONE, num_tokens=num_tokens, num_reqs=num_reqs)
        padded = self.padded_num_tokens(num_tokens) if num_tokens > 0 else None
        if padded is None:
            return eager
        if uniform is None:
            uniform = num_tokens == num_reqs * self.decode_query_len
        if decode_only and uniform and self._full_decode:
            candidates = [d for d in self.capture_descriptors() if d.cg_mode == CUDAGraphMode.FULL]
            fitting = [d for d in candidates if d.num_tokens >= num_tokens and d.num_reqs >= num_reqs]
            if fitting:
                return min(fitting, key=lambda d: d.num_tokens)
        if self._piecewise_mixed:
            return self._mixed_desc(padded)
        return eager
