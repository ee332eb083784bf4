"""Mixture of experts on Ascend: routed experts through `ascend_kernels`, expert parallelism and EPLB.

- `routed_experts`: the Ascend routed-experts layer (plugged in for vLLM's `RoutedExperts`) and its composition with
  a model's own `RoutedExperts` subclass.
- `method`: `AscendMoEMethod`, the unquantized MoE method (experts through `ascend_kernels.fused_moe`).
- `routing`: the gating variants (softmax / sigmoid, grouped, biased) through `ascend_kernels.moe_gating_topk`.
- `placement`, `eplb_policy`, `eplb_transfer`, `eplb`: expert placement with redundant experts, the rebalancing
  policy, moving expert weights between EP ranks, and the per-model controller.
"""
