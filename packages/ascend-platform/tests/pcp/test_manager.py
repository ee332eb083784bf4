"""AscendPCPManager on real vLLM input batches: partition, padding, the seed regression, persistent buffers, capture."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm.config import CUDAGraphMode
from vllm.v1.attention.backends.utils import PAD_SLOT_ID
from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor
from vllm.v1.worker.gpu.input_batch import InputBuffers
from vllm.v1.worker.gpu.pcp_manager import PCPManager

from ascend_platform.pcp import AscendPCPManager, PCPInputBuffers
from ascend_testkit.pcp_batches import step_input_batch

CPU = torch.device("cpu")
MAX_REQS, MAX_TOKENS = 4, 512


def piecewise(n: int) -> BatchExecutionDescriptor:
    return BatchExecutionDescriptor(cg_mode=CUDAGraphMode.PIECEWISE, num_tokens=n, num_reqs=None)


def managers(pcp: int = 2) -> list[AscendPCPManager]:
    return [
        AscendPCPManager(pcp, r, CPU, max_num_reqs=MAX_REQS, max_num_tokens=MAX_TOKENS, max_num_blocks_per_group=[16])
        for r in range(pcp)
    ]


def global_batch(lens, start=1000):
    total = sum(lens)
    ids = torch.arange(start, start + total, dtype=torch.int32)
    return step_input_batch(InputBuffers(MAX_REQS, MAX_TOKENS, CPU), list(lens), token_ids=ids), ids


def test_ranks_together_hold_every_token_once():
    batch, ids = global_batch([37, 101, 5])
    seen = []
    for m in managers():
        local = m.partition_batch(batch, piecewise(128))
        assert local.num_tokens_after_padding == 128
        assert bool(local.is_padding[local.num_tokens :].all()) and not bool(local.is_padding[: local.num_tokens].any())
        seen += local.input_ids[: local.num_tokens].tolist()
        # Positions stay global: the tail chunk of a request continues where the request's tokens are.
        qsl = local.query_start_loc_np
        for row in range(local.num_reqs):
            pos = local.positions[qsl[row] : qsl[row + 1]]
            assert torch.equal(pos, torch.arange(int(pos[0]), int(pos[0]) + len(pos)))
    assert sorted(seen) == ids.tolist()


def test_seed_regression_151_tokens_against_a_76_token_descriptor():
    # PCP=2, prefills of 298 and 2 tokens: rank 1 holds 150 + 1 = 151 real tokens.
    batch, _ = global_batch([298, 2])
    m0, m1 = managers()
    local = m1.partition_batch(batch, piecewise(76))
    assert local.num_tokens == 151
    assert local.num_tokens_after_padding == 151
    assert m1.last_plan.widened and m1.last_plan.descriptor_tokens == 76
    assert m1.effective_descriptor(batch, piecewise(76)).cg_mode == CUDAGraphMode.NONE
    assert m0.partition_batch(batch, piecewise(76)).num_tokens_after_padding == 151  # ranks agree for the all-gather
    # The single-rank form of the seed: every token on one rank, 151 of them, still kept whole.
    solo = AscendPCPManager(1, 0, CPU, max_num_reqs=MAX_REQS, max_num_tokens=MAX_TOKENS)
    batch151, ids151 = global_batch([151])
    kept = solo.partition_batch(batch151, piecewise(76))
    assert kept.num_tokens_after_padding == 151
    assert sorted(kept.input_ids[:151].tolist()) == ids151.tolist()


def test_upstream_manager_alone_refuses_the_seed_batch():
    # What the Ascend override exists for: vLLM's manager rejects a descriptor below the real local tokens.
    upstream = PCPManager(2, 1, CPU, False, max_num_reqs=MAX_REQS, max_num_tokens=MAX_TOKENS)
    batch, _ = global_batch([298, 2])
    with pytest.raises(ValueError, match="smaller than the largest rank-local batch: 76 < 151"):
        upstream.partition_batch(batch, piecewise(76))


def test_buffers_persist_across_steps_and_captures():
    m = managers()[0]
    before = m.buffers.addresses()
    for lens in ([64, 32], [7], [300], [1, 2, 3]):
        batch, _ = global_batch(lens)
        local = m.partition_batch(batch, piecewise(256))
        assert local.input_ids.data_ptr() == before["input_ids"]
        assert local.positions.data_ptr() == before["positions"]
        assert local.query_start_loc.data_ptr() == before["query_start_loc"]
        assert local.seq_lens.data_ptr() == before["seq_lens"]
        assert m.buffers.addresses() == before
    for n in (128, 64, 8):
        staged = m.stage_capture_batch(n)
        assert staged.batch.input_ids.data_ptr() == before["input_ids"]
        assert staged.block_tables[0].data_ptr() == before["block_table[0]"]
        assert staged.slot_mappings.data_ptr() == before["gathered_slot_mappings"]
        assert m.buffers.addresses() == before


def test_query_offsets_and_host_sequence_lengths():
    m = managers()[1]
    buffers = m.buffers
    assert isinstance(buffers, PCPInputBuffers)
    local_rows = 2 * MAX_REQS  # a prefill's head and tail chunks are two local rows
    assert buffers.query_start_loc.shape == (local_rows + 1,)
    assert buffers.query_start_loc_storage.shape == (local_rows + 1 + buffers.query_pad_slots,)
    assert buffers.query_start_loc.data_ptr() == buffers.query_start_loc_storage.data_ptr()
    assert buffers.seq_lens_cpu.device.type == "cpu"
    batch, _ = global_batch([37, 101, 5])
    local = m.partition_batch(batch, None)
    n = local.num_reqs
    assert buffers.seq_lens_cpu[:n].tolist() == local.seq_lens.tolist()[:n]
    assert buffers.seq_lens_cpu[n:].eq(0).all()


def test_capture_inputs_are_padding_views_of_the_local_buffers():
    m = managers()[0]
    m.buffers.block_tables[0].fill_(7)
    staged = m.stage_capture_batch(32, 4)
    assert staged.batch.num_tokens_after_padding == 32 and staged.batch.num_reqs == 4
    assert staged.block_tables[0].shape == (4, 16) and staged.block_tables[0].eq(0).all()
    assert staged.slot_mappings.shape == (1, 32 * 2)  # the KV gathered from both ranks
    assert m.buffers.gathered_slot_mappings.eq(PAD_SLOT_ID).all()
    assert m.buffers.seq_lens_cpu[:4].tolist() == staged.batch.seq_lens.tolist()
    with pytest.raises(ValueError, match="exceeds the 512 buffer"):
        m.get_dummy_slot_mappings(513)


def test_constructor_errors_name_the_bad_value():
    with pytest.raises(ValueError, match="max_num_reqs and max_num_tokens"):
        AscendPCPManager(2, 0, CPU)
    with pytest.raises(ValueError, match="pcp_rank 2 is outside the PCP group of size 2"):
        AscendPCPManager(2, 2, CPU, max_num_reqs=4, max_num_tokens=64)
    with pytest.raises(ValueError, match="decode context parallel \\(dcp_world_size=2\\)"):
        AscendPCPManager(2, 0, CPU, max_num_reqs=4, max_num_tokens=64, dcp_world_size=2)


def test_legacy_padded_count_keyword_is_a_piecewise_descriptor():
    batch, _ = global_batch([40, 9])
    m = managers()[0]
    assert m.partition_batch(batch, padded_num_tokens=64).num_tokens_after_padding == 64
    assert m.partition_batch(batch, padded_num_tokens=8).num_tokens_after_padding == 26  # rank 1: 20 + 6 real tokens


def test_full_descriptor_for_prefill_is_refused_by_the_partition():
    m = managers()[0]
    batch, _ = global_batch([20])
    full = dataclasses.replace(piecewise(32), cg_mode=CUDAGraphMode.FULL, num_reqs=4)
    with pytest.raises(RuntimeError, match="decode-only"):
        m.partition_batch(batch, full)


@settings(max_examples=30, deadline=None)
@given(
    lens=st.lists(st.integers(1, 120), min_size=1, max_size=4),
    descriptor=st.one_of(st.none(), st.integers(1, 256)),
)
def test_no_descriptor_ever_drops_a_real_token(lens, descriptor):
    batch, ids = global_batch(lens)
    desc = None if descriptor is None else piecewise(descriptor)
    seen, padded = [], set()
    for m in managers():
        local = m.partition_batch(batch, desc)
        assert local.num_tokens_after_padding >= local.num_tokens
        if descriptor is not None:
            assert local.num_tokens_after_padding >= descriptor
        seen += local.input_ids[: local.num_tokens].tolist()
        padded.add(local.num_tokens_after_padding)
    assert sorted(seen) == ids.tolist()
    assert len(padded) == 1  # every rank pads to the same count, as the all-gathers need
