"""Graph-capture planning: sizes from the config, FULL only for decode-only batches, padding rules."""

from __future__ import annotations

import pytest
from vllm.config import CompilationConfig, CUDAGraphMode, VllmConfig

from ascend_platform.graph import GraphCapturePlan
from ascend_platform.graph.plan import default_capture_sizes

NONE, PIECEWISE, FULL = CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL


def plan(mode, sizes=(1, 2, 4, 8, 16, 32, 64, 128), max_num_reqs=16, decode_query_len=1):
    return GraphCapturePlan(
        mode=mode, capture_sizes=sizes, max_num_reqs=max_num_reqs, decode_query_len=decode_query_len
    )


def test_sizes_from_the_compilation_config():
    explicit = CompilationConfig(cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE, cudagraph_capture_sizes=[16, 4, 8])
    p = GraphCapturePlan.from_compilation_config(explicit, max_num_reqs=8)
    assert p.capture_sizes == (4, 8, 16) and p.mode == CUDAGraphMode.FULL_AND_PIECEWISE
    ladder = CompilationConfig(cudagraph_mode=PIECEWISE, max_cudagraph_capture_size=300)
    p = GraphCapturePlan.from_compilation_config(ladder, max_num_reqs=8)
    assert p.capture_sizes[:5] == (1, 2, 4, 8, 16) and p.capture_sizes[-2:] == (272, 288)
    assert default_capture_sizes(20) == [1, 2, 4, 8, 16]
    off = CompilationConfig(cudagraph_mode=NONE, cudagraph_capture_sizes=[8, 16])
    assert GraphCapturePlan.from_compilation_config(off, max_num_reqs=8).capture_sizes == ()


def test_from_a_real_vllm_config_on_this_cpu_build():
    # vLLM's CPU platform turns graphs off, so the simulated lane plans every batch eager.
    p = GraphCapturePlan.from_vllm_config(VllmConfig())
    assert p.capture_sizes == () and p.max_num_reqs == VllmConfig().scheduler_config.max_num_seqs
    d = p.descriptor_for(4, 100, decode_only=False)
    assert (d.cg_mode, d.num_tokens) == (NONE, 100)


def test_capture_descriptors_largest_first():
    p = plan(CUDAGraphMode.FULL_AND_PIECEWISE, sizes=(8, 16, 32), max_num_reqs=16)
    descs = [(d.cg_mode, d.num_tokens, d.num_reqs) for d in p.capture_descriptors()]
    # FULL decode graphs stop at max_num_reqs decodes (FULL first at equal size); PIECEWISE pads no request count.
    assert descs == [(PIECEWISE, 32, None), (FULL, 16, 16), (PIECEWISE, 16, None), (FULL, 8, 8), (PIECEWISE, 8, None)]
    assert [d.num_tokens for d in plan(PIECEWISE, sizes=(8, 16)).capture_descriptors()] == [16, 8]
    assert plan(NONE, sizes=()).capture_descriptors() == []


@pytest.mark.parametrize(
    ("mode", "decode_only", "n_reqs", "n_tokens", "expected"),
    [
        (CUDAGraphMode.FULL_AND_PIECEWISE, True, 5, 5, (FULL, 8, 8)),  # decodes: FULL, requests padded too
        (CUDAGraphMode.FULL_AND_PIECEWISE, False, 2, 37, (PIECEWISE, 64, None)),  # mixed: PIECEWISE
        (CUDAGraphMode.FULL_AND_PIECEWISE, True, 20, 20, (PIECEWISE, 32, None)),  # more decodes than FULL covers
        (CUDAGraphMode.FULL_DECODE_ONLY, False, 2, 37, (NONE, 37, 2)),  # no mixed graphs: eager
        (CUDAGraphMode.FULL_DECODE_ONLY, True, 3, 3, (FULL, 4, 4)),
        (FULL, False, 2, 37, (NONE, 37, 2)),  # FULL never captures a prefill
        (FULL, True, 3, 3, (FULL, 4, 4)),
        (PIECEWISE, True, 3, 3, (PIECEWISE, 4, None)),
        (PIECEWISE, False, 1, 129, (NONE, 129, 1)),  # past the largest capture size: eager
        (NONE, False, 1, 8, (NONE, 8, 1)),
    ],
)
def test_descriptor_choice(mode, decode_only, n_reqs, n_tokens, expected):
    d = plan(mode).descriptor_for(n_reqs, n_tokens, decode_only=decode_only)
    assert (d.cg_mode, d.num_tokens, d.num_reqs) == expected
    assert d.num_tokens >= n_tokens  # padding only ever adds


def test_spec_decode_rounds_full_graphs_to_the_query_length():
    p = plan(CUDAGraphMode.FULL_AND_PIECEWISE, sizes=(4, 8, 16), max_num_reqs=8, decode_query_len=3)
    full = [(d.num_tokens, d.num_reqs, d.uniform_token_count) for d in p.capture_descriptors() if d.cg_mode == FULL]
    assert full == [(9, 3, 3), (6, 2, 3)]  # 4 -> 6 and 8 -> 9 tokens; 16 -> 18 exceeds the largest size
    d = p.descriptor_for(2, 6, decode_only=True)
    assert (d.cg_mode, d.num_tokens, d.num_reqs) == (FULL, 6, 2)
    assert p.descriptor_for(2, 5, decode_only=True).cg_mode == PIECEWISE  # not uniform: no FULL graph


def test_bad_plans_are_refused():
    with pytest.raises(ValueError, match="ascending"):
        plan(PIECEWISE, sizes=(16, 8))
    with pytest.raises(ValueError, match="max_num_reqs"):
        plan(PIECEWISE, max_num_reqs=0)


def test_pcp_decodes_take_a_full_graph_holding_every_global_request():
    # PCP=2 shards 4 decodes over the ranks: 2 local tokens, 4 global requests, a uniform batch. The FULL graph
    # must hold all 4 requests (the runner pads the global batch to it), so 4 tokens, not 2.
    p = plan(CUDAGraphMode.FULL_AND_PIECEWISE, sizes=(2, 4, 8))
    d = p.descriptor_for(4, 2, decode_only=True, uniform=True)
    assert (d.cg_mode, d.num_tokens, d.num_reqs) == (FULL, 4, 4)
    assert p.descriptor_for(4, 2, decode_only=True).cg_mode == PIECEWISE  # counts alone say "not uniform"
    by_mode = p.descriptors_by_mode()
    assert [d.num_tokens for d in by_mode[FULL]] == [8, 4, 2]
    assert [d.num_tokens for d in by_mode[PIECEWISE]] == [8, 4, 2]
    assert p.batch_kind(decode_only=True) == "uniform_decode" and p.batch_kind(decode_only=False) == "mixed"
