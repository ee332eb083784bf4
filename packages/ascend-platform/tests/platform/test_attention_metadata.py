"""The ASCEND metadata builder puts the step's lengths on the host once per step, for every layer's kernels.

Real vLLM `CommonAttentionMetadata`; the device lengths are a tensor that fails the test when read back to the host.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.kv_cache_interface import FullAttentionSpec


class DeviceLengths(torch.Tensor):
    def _read_back(self, *args, **kwargs):
        raise AssertionError("lengths were read back from the device")

    tolist = item = cpu = numpy = __int__ = __index__ = __bool__ = _read_back


def _common(*, upper_bound: bool = True, device_only: bool = True) -> CommonAttentionMetadata:
    starts, lens = [0, 1, 4], [20, 7]
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32).as_subclass(DeviceLengths),
        query_start_loc_cpu=torch.tensor(starts, dtype=torch.int32),
        seq_lens=seq_lens.as_subclass(DeviceLengths) if device_only else seq_lens,
        seq_lens_cpu_upper_bound=torch.tensor(lens, dtype=torch.int32) if upper_bound else None,
        num_reqs=2, num_actual_tokens=4, max_query_len=3, max_seq_len=20,
        block_table_tensor=torch.zeros(2, 2, dtype=torch.int32), slot_mapping=torch.zeros(4, dtype=torch.int64))


def _builder(speculative: bool = False):
    from ascend_platform.attention.backend import AscendAttentionMetadataBuilder

    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=32, dtype=torch.float32)
    config = SimpleNamespace(speculative_config=object() if speculative else None)
    return AscendAttentionMetadataBuilder(spec, ["layer.0"], config, torch.device("cpu"))


def test_host_lengths_come_from_vllms_host_copies_without_a_read_back():
    metadata = _builder().build(0, _common())
    assert metadata.query_start_loc_host == [0, 1, 4] and metadata.seq_lens_host == [20, 7]


@pytest.mark.parametrize(("speculative", "upper_bound"), [(True, True), (False, False)])
def test_inexact_host_lengths_are_read_back_once_per_step(speculative, upper_bound):
    from ascend_platform import usage

    before = usage.snapshot()["counts"].get("attention.ascend.seq_lens_read_back", 0)
    builder = _builder(speculative=speculative)
    with pytest.raises(AssertionError, match="read back"):  # the device lengths are what it reads
        builder.build(0, _common(upper_bound=upper_bound))
    metadata = builder.build(0, _common(upper_bound=upper_bound, device_only=False))
    assert metadata.seq_lens_host == [20, 7]
    assert usage.snapshot()["counts"]["attention.ascend.seq_lens_read_back"] == before + 2


def test_metadata_a_graph_captures_has_no_host_lengths():
    metadata = _builder().build_for_cudagraph_capture(_common())
    assert metadata.query_start_loc_host is None and metadata.seq_lens_host is None


def test_mla_metadata_carries_the_decode_and_prefill_host_lengths():
    """A decode (1 query, 20 cached) then a prefill chunk (3 queries continuing 4 cached tokens)."""
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    from ascend_platform.attention.mla_backend import AscendMLAMetadataBuilder

    spec = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype=torch.float32)
    builder = AscendMLAMetadataBuilder(spec, ["layer.0"], SimpleNamespace(speculative_config=None),
                                       torch.device("cpu"))
    metadata = builder.build(0, _common())
    assert metadata.decode.seq_lens_host == [20]
    prefill = metadata.prefill
    assert prefill.query_start_loc_host == [0, 3] and prefill.seq_lens_host == [7]
    assert prefill.kv_start_loc_host == [0, 7] and prefill.has_context and prefill.max_query_len == 3


def test_sfa_metadata_carries_the_host_lengths_and_counts_full_selections_from_them():
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    from ascend_kernels import ops
    from ascend_platform.attention.sfa_backend import AscendSFAMetadataBuilder
    from ascend_platform.attention.sfa_indexer import full_selections

    spec = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype=torch.float32)
    builder = AscendSFAMetadataBuilder(spec, ["layer.0"], SimpleNamespace(speculative_config=None),
                                       torch.device("cpu"))
    metadata = builder.build(0, _common())
    assert metadata.query_start_loc_host == [0, 1, 4] and metadata.seq_lens_host == [20, 7]
    # The count from lengths equals what the indexer selects: rows whose last pick is a position, not -1.
    raw = torch.zeros(4, 16, 132, dtype=torch.uint8)
    keys, scales = raw[..., :128].view(torch.float8_e4m3fn).unsqueeze(2), raw[..., 128:].view(torch.float32)
    ops.indexer_cache_write(torch.randn(40, 128), keys, scales.unsqueeze(2), torch.arange(40) + 24)
    qsl, lens = [0, 1, 4, 9], [20, 7, 6]
    for topk in (4, 6, 7, 8, 21):
        picks = ops.indexer_topk(torch.randn(9, 2, 128), torch.randn(9, 2), keys, scales.unsqueeze(2),
                                 torch.tensor([[1, 2], [2, 3], [3, 0]], dtype=torch.int32),
                                 torch.tensor(qsl, dtype=torch.int32), torch.tensor(lens, dtype=torch.int32), topk=topk)
        assert full_selections(qsl, lens, topk) == int((picks[:, -1] >= 0).sum()), topk
