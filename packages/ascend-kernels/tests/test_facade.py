"""Backend selection, capability queries and the facade's argument validation."""

from __future__ import annotations

import pytest
import torch

import ascend_kernels
from ascend_kernels import op_registry, ops
from ascend_kernels.npu_probe import torch_npu_status


def test_every_op_is_exposed_and_the_reference_backend_runs_here():
    assert set(ascend_kernels.OP_NAMES) <= set(dir(ops))
    assert ascend_kernels.available_backends()["reference"] is None
    assert ascend_kernels.get_backend() == "reference"
    assert set(ascend_kernels.implementations("reference")) == set(ascend_kernels.OP_NAMES)
    assert set(ascend_kernels.implementations("npu")) == set(ascend_kernels.OP_NAMES)


def test_default_is_npu_only_when_torch_npu_is_usable():
    expected = "npu" if torch_npu_status().usable else "reference"
    assert ascend_kernels.default_backend_name() == expected


@pytest.mark.skipif(torch_npu_status().usable, reason="an NPU is present")
def test_asking_for_npu_without_torch_npu_says_why():
    reason = torch_npu_status().reason
    with pytest.raises(ascend_kernels.BackendUnavailableError) as info:
        ascend_kernels.set_backend("npu")
    assert reason and reason in str(info.value)
    assert ascend_kernels.get_backend() == "reference"  # a failed switch keeps the selection
    assert ascend_kernels.available_backends()["npu"] == str(info.value)


def test_unknown_backend_and_op_are_errors_naming_them():
    with pytest.raises(ValueError, match="'tpu'"):
        ascend_kernels.set_backend("tpu")
    with pytest.raises(ValueError, match="'tpu'"):
        ascend_kernels.implementations("tpu")
    with pytest.raises(ValueError, match="'flash_attn'"):
        op_registry.declaration("flash_attn")


def test_use_backend_restores_the_previous_selection():
    with ascend_kernels.use_backend("reference"):
        assert ascend_kernels.get_backend() == "reference"
    assert ascend_kernels.get_backend() == "reference"


def _attention_args(**over):
    args = dict(
        query=torch.randn(3, 8, 32),
        key_cache=torch.randn(4, 16, 2, 32),
        value_cache=torch.randn(4, 16, 2, 32),
        block_table=torch.zeros(2, 4, dtype=torch.int32),
        query_start_loc=torch.tensor([0, 2, 3], dtype=torch.int32),
        seq_lens=torch.tensor([5, 9], dtype=torch.int32),
    )
    args.update(over)
    return args


@pytest.mark.parametrize(
    ("override", "argument", "expected"),
    [
        (dict(query=torch.randn(3, 256)), "query", "[num_tokens, num_heads, head_size]"),
        (dict(key_cache=torch.randn(4, 16, 2, 64)), "key_cache", "32]"),
        (dict(key_cache=torch.randn(4, 16, 3, 32)), "key_cache", "dividing 8"),
        (dict(value_cache=torch.randn(4, 8, 2, 32)), "value_cache", "[4, 16, 2, head_size_v]"),
        (dict(key_cache=torch.randn(4, 16, 2, 32, dtype=torch.bfloat16)), "key_cache", "torch.float32"),
        (dict(block_table=torch.zeros(2, 4)), "block_table", "int32 or int64"),
        (dict(query_start_loc=torch.tensor([0, 3], dtype=torch.int32)), "query_start_loc", "[3]"),
        (dict(seq_lens=torch.tensor([5], dtype=torch.int32)), "seq_lens", "[2]"),
        (dict(seq_lens=torch.tensor([5, 9], dtype=torch.int32, device="meta")), "seq_lens", "on device cpu"),
    ],
)
def test_paged_attention_validation_names_argument_shape_and_expectation(override, argument, expected):
    args = _attention_args(**override)
    with pytest.raises(ValueError) as info:
        ops.paged_attention(**args, scale=0.1)
    message = str(info.value)
    assert f"argument '{argument}'" in message
    assert str(tuple(args[argument].shape)) in message
    assert expected in message


def test_keyword_arguments_are_validated_too():
    with pytest.raises(ValueError, match="'sinks'.*\\[8\\]"):
        ops.paged_attention(**_attention_args(), scale=0.1, sinks=torch.zeros(2))
    with pytest.raises(ValueError, match="'sliding_window'"):
        ops.paged_attention(**_attention_args(), scale=0.1, sliding_window=0)
    with pytest.raises(ValueError, match="'scale'"):
        ops.paged_attention(**_attention_args(), scale=-1.0)


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: ops.rms_norm(torch.randn(2, 8), torch.ones(7), 1e-6), "weight"),
        (lambda: ops.rms_norm(torch.randn(2, 8), torch.ones(8), 1e-6, residual=torch.randn(2, 4)), "residual"),
        (lambda: ops.silu_and_mul(torch.randn(2, 7)), "x"),
        (lambda: ops.moe_gating_topk(torch.randn(2, 4), 5), "topk"),
        (lambda: ops.sample_greedy(torch.randn(4)), "logits"),
        (lambda: ops.top_k_top_p(torch.randn(2, 5), top_p=torch.ones(3)), "top_p"),
        (lambda: ops.top_k_top_p(torch.randn(2, 5), top_p=0.9), "top_p"),
        (lambda: ops.top_k_top_p(torch.randn(2, 5), top_k=torch.ones(2)), "top_k"),
        (
            lambda: ops.reshape_and_cache(
                torch.randn(2, 2, 8),
                torch.randn(2, 2, 8),
                torch.zeros(3, 4, 2, 8),
                torch.zeros(3, 4, 2, 8),
                torch.zeros(2),
            ),
            "slot_mapping",
        ),
        (
            lambda: ops.rotary_embedding(
                torch.arange(2),
                torch.randn(2, 2, 8),
                None,
                torch.randn(10, 6),
                head_size=8,
                rotary_dim=8,
                is_neox=True,
            ),
            "cos_sin_cache",
        ),
        (
            lambda: ops.rejection_sample(
                torch.zeros(2, 3, dtype=torch.long), None, torch.randn(2, 2, 5), torch.zeros(2, dtype=torch.long)
            ),
            "target_logits",
        ),
    ],
)
def test_other_ops_validate_their_arguments(call, argument):
    with pytest.raises(ValueError, match=f"argument '{argument}'"):
        call()


def test_validation_can_be_switched_off():
    ascend_kernels.set_validation(False)
    try:
        assert not ascend_kernels.validation_enabled()
        # Without checks a bad weight reaches the kernel and fails there, not with the facade's ValueError.
        with pytest.raises(RuntimeError):
            ops.rms_norm(torch.randn(2, 8), torch.ones(7), 1e-6)
    finally:
        ascend_kernels.set_validation(True)
