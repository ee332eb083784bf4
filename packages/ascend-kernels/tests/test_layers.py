"""Rotary embedding, RMSNorm, SiLU-and-mul and the grouped MoE against naive formulations."""

from __future__ import annotations

import math

import pytest
import torch

from ascend_kernels import ops
from ascend_kernels.reference import native_build


def _took(op: str, before: dict[str, int]) -> bool:
    """Whether the native loops took a call of op since `before` (`native_build.calls()`)."""
    return native_build.calls()[op] > before[op]

DTYPES = pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.float32, dict(rtol=1e-5, atol=1e-5)), (torch.bfloat16, dict(rtol=2e-2, atol=2e-2))]
)


def _cos_sin_cache(max_pos, rotary_dim, base=10000.0):
    inv_freq = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).float()


def _naive_rope(x, positions, head_size, rotary_dim, is_neox, base=10000.0):
    """Rotate each pair of dims by position * base^(-2i/rotary_dim), pair by pair."""
    out = x.double().clone().view(x.shape[0], -1, head_size)
    half = rotary_dim // 2
    for t, pos in enumerate(positions.tolist()):
        for i in range(half):
            theta = pos * base ** (-2 * i / rotary_dim)
            a, b = (i, i + half) if is_neox else (2 * i, 2 * i + 1)
            xa, xb = out[t, :, a].clone(), out[t, :, b].clone()
            out[t, :, a] = xa * math.cos(theta) - xb * math.sin(theta)
            out[t, :, b] = xb * math.cos(theta) + xa * math.sin(theta)
    return out.view(x.shape)


@DTYPES
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rotary_dim", [16, 8])  # full and partial rotary
def test_rotary_embedding(dtype, tol, is_neox, rotary_dim, formulation):
    head_size, tokens = 16, 5
    positions = torch.tensor([0, 3, 7, 1, 30])
    qkv = torch.randn(tokens, 7 * head_size).to(dtype)
    query, key = qkv[:, : 4 * head_size], qkv[:, 4 * head_size : 6 * head_size].view(tokens, 2, head_size)
    expected_q = _naive_rope(query, positions, head_size, rotary_dim, is_neox)
    expected_k = _naive_rope(key, positions, head_size, rotary_dim, is_neox)
    untouched = qkv[:, 6 * head_size :].clone()
    before = native_build.calls()
    q_out, k_out = ops.rotary_embedding(
        positions,
        query,
        key,
        _cos_sin_cache(64, rotary_dim),
        head_size=head_size,
        rotary_dim=rotary_dim,
        is_neox=is_neox,
    )
    assert q_out is query and k_out is key  # in place, on views of one qkv buffer
    assert _took("rotary_embedding", before) == (formulation == "native")
    torch.testing.assert_close(query.double(), expected_q, **tol)
    torch.testing.assert_close(key.double(), expected_k, **tol)
    assert torch.equal(qkv[:, 6 * head_size :], untouched)


@pytest.mark.parametrize(("layout", "passes"), [("fused", 1), ("key_first", 2), ("gap", 2), ("separate", 2)])
def test_rotary_rotates_adjacent_query_and_key_as_one(monkeypatch, layout, passes):
    """The torch formulation: a key directly after its query in one buffer is rotated with it in one pass; a key
    before the query, a gap between them, or two buffers take a pass each. All equal the naive rotation and leave
    other columns alone."""
    from ascend_kernels.reference import layers, native_build

    head_size, tokens = 16, 5
    positions = torch.tensor([0, 3, 7, 1, 30])
    qkv = torch.randn(tokens, 8 * head_size)
    spans = {"fused": ((0, 4), (4, 6)), "key_first": ((2, 6), (0, 2)), "gap": ((0, 4), (5, 7))}
    if layout == "separate":
        query, key = torch.randn(tokens, 4 * head_size), torch.randn(tokens, 2, head_size)
    else:
        (q0, q1), (k0, k1) = spans[layout]
        query = qkv[:, q0 * head_size : q1 * head_size]
        key = qkv[:, k0 * head_size : k1 * head_size].view(tokens, k1 - k0, head_size)
    before = qkv.clone()
    expected_q = _naive_rope(query, positions, head_size, head_size, True)
    expected_k = _naive_rope(key, positions, head_size, head_size, True)
    monkeypatch.setenv(native_build.ENV_SWITCH, "0")
    monkeypatch.setattr(native_build, "_STATE", {})  # loaded anew (switched off); the loaded state comes back after
    rotations = []
    rotate = layers._rotate_in_place
    monkeypatch.setattr(layers, "_rotate_in_place", lambda *a: rotations.append(1) or rotate(*a))
    ops.rotary_embedding(positions, query, key, _cos_sin_cache(64, head_size), head_size=head_size,
                         rotary_dim=head_size, is_neox=True)
    assert len(rotations) == passes
    torch.testing.assert_close(query.double(), expected_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(key.double(), expected_k, rtol=1e-5, atol=1e-5)
    if layout != "separate":
        touched = torch.zeros(8 * head_size, dtype=torch.bool)
        for a, b in spans[layout]:
            touched[a * head_size : b * head_size] = True
        assert torch.equal(qkv[:, ~touched], before[:, ~touched])


def test_rotary_embedding_empty_and_keyless():
    q = torch.randn(0, 32)
    assert (
        ops.rotary_embedding(
            torch.arange(0), q, None, _cos_sin_cache(4, 32), head_size=32, rotary_dim=32, is_neox=True
        )[1]
        is None
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_leaves_inputs_alone(dtype, with_residual, formulation):
    """The reference scales in place where it holds a float32 copy: never the caller's x, residual or weight."""
    x, weight = torch.randn(3, 32).to(dtype), torch.randn(32).to(dtype)
    residual = torch.randn(3, 32).to(dtype) if with_residual else None
    inputs = [t for t in (x, weight, residual) if t is not None]
    before = [t.clone() for t in inputs]
    result = ops.rms_norm(x, weight, 1e-6, residual)
    outputs = result if with_residual else (result,)
    for original, kept in zip(inputs, before, strict=True):
        assert torch.equal(original, kept)
    for out in outputs:  # fresh tensors, not views of an input a later in-place op would reach
        assert all(out.untyped_storage().data_ptr() != t.untyped_storage().data_ptr() for t in inputs)


@DTYPES
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("tokens", [0, 1, 7])
def test_rms_norm(dtype, tol, with_residual, tokens, formulation):
    x, weight = torch.randn(tokens, 64).to(dtype), torch.randn(64).to(dtype)
    residual = torch.randn(tokens, 64).to(dtype) if with_residual else None
    h = x.double() + (residual.double() if with_residual else 0)
    expected = torch.stack([row / math.sqrt((row * row).mean().item() + 1e-6) for row in h]) if tokens else h
    expected = expected * weight.double()
    before = native_build.calls()
    result = ops.rms_norm(x, weight, 1e-6, residual)
    assert _took("rms_norm", before) == (formulation == "native" and tokens > 0)
    if with_residual:
        result, new_residual = result
        torch.testing.assert_close(new_residual.double(), h, **tol)
    torch.testing.assert_close(result.double(), expected, **tol)
    assert result.dtype == dtype


@DTYPES
@pytest.mark.parametrize("shape", [(3, 5, 16), (300, 512)])  # 300 rows: the native loop's threaded region
def test_silu_and_mul(dtype, tol, shape, formulation):
    x = (torch.randn(shape) * 8).to(dtype)  # far into both tails of the sigmoid
    d = shape[-1] // 2
    gate, up = x[..., :d].double(), x[..., d:].double()
    before = native_build.calls()
    out = ops.silu_and_mul(x)
    assert _took("silu_and_mul", before) == (formulation == "native")
    assert out.dtype == dtype and out.shape == (*shape[:-1], d)
    torch.testing.assert_close(out.double(), gate / (1 + torch.exp(-gate)) * up, **tol)


@DTYPES
def test_fused_moe_matches_per_token_experts(dtype, tol):
    tokens, hidden, inter, experts, k = 9, 16, 8, 4, 2
    x = torch.randn(tokens, hidden).to(dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden) / 4).to(dtype)
    w2 = (torch.randn(experts, hidden, inter) / 4).to(dtype)
    weights, ids = ops.moe_gating_topk(torch.randn(tokens, experts), k)
    ids[0] = torch.tensor([3, 3], dtype=torch.int32)  # the same expert twice for one token
    out = ops.fused_moe(x, w13, w2, weights, ids)
    expected = torch.zeros(tokens, hidden, dtype=torch.float64)
    for t in range(tokens):
        for i in range(k):
            e = int(ids[t, i])
            gate_up = w13[e].double() @ x[t].double()
            gate, up = gate_up[:inter], gate_up[inter:]
            expected[t] += weights[t, i].double() * (w2[e].double() @ (gate / (1 + torch.exp(-gate)) * up))
    torch.testing.assert_close(out.double(), expected, **tol)
    assert ops.fused_moe(x[:0], w13, w2, weights[:0], ids[:0]).shape == (0, hidden)
