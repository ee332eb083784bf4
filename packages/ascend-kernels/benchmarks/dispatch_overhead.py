"""What the facade costs per call: `ops.rms_norm` / `ops.paged_attention` with every kernel replaced by a no-op, so
the figure is dispatch (plus the argument checks when on) and nothing else. Prints JSON: ns per call, best of 15.

    uv run --no-sync python packages/ascend-kernels/benchmarks/dispatch_overhead.py
"""

from __future__ import annotations

import json
import time

import torch

import ascend_kernels
from ascend_kernels import op_registry, ops


def _noop(*args, **kwargs):
    return None


def _ns_per_call(fn, n: int) -> float:
    best = float("inf")
    for _ in range(15):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n)
    return round(best * 1e9)


def main() -> dict:
    x, w = torch.randn(1, 16), torch.ones(16)
    kc, vc, q = torch.randn(4, 16, 2, 16), torch.randn(4, 16, 2, 16), torch.randn(2, 4, 16)
    bt = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    qsl, sl = torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([5, 9], dtype=torch.int32)

    def rms():
        ops.rms_norm(x, w, 1e-6)

    def paged():
        ops.paged_attention(q, kc, vc, bt, qsl, sl, scale=0.25, query_start_loc_host=[0, 1, 2], seq_lens_host=[5, 9])

    result = {"bare_noop_call": _ns_per_call(lambda: _noop(x, w, 1e-6), 20000)}
    previous = ascend_kernels.validation_enabled()
    try:
        with ascend_kernels.use_backend("reference"):
            for checks in (False, True):
                ascend_kernels.set_validation(checks)
                op_registry.bind(dict.fromkeys(ascend_kernels.OP_NAMES, _noop), checked=checks)
                label = "checks_on" if checks else "checks_off"
                result[f"rms_norm_{label}"] = _ns_per_call(rms, 20000)
                result[f"paged_attention_{label}"] = _ns_per_call(paged, 5000)
    finally:
        ascend_kernels.set_validation(previous)
    return result


if __name__ == "__main__":
    print(json.dumps(main()))
