"""The reference's native loops (`reference/native/layers.c`): equal to the torch formulation on the layouts vLLM's
layers pass, out of the calls they must not take, and built once per machine into the cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ascend_kernels import ops
from ascend_kernels.reference import layers, native_build, native_layers

pytestmark = pytest.mark.usefixtures("native_loops")


def _torch_formulation(monkeypatch, fn):
    """fn() with the loops switched off (the torch formulation), the loaded state restored after."""
    with monkeypatch.context() as m:
        m.setenv(native_build.ENV_SWITCH, "0")
        m.setattr(native_build, "_STATE", {})
        return fn()


def _cache(max_pos, rot, dtype):
    inv = 1.0 / 10000 ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv
    return torch.cat([ang.cos(), ang.sin()], -1).to(dtype)


# (head_size, rotary_dim, q heads, k heads, key as [tokens, heads, head] with a padded head stride)
# (40, 40): 20 pairs a head, one vector step of sixteen and a scalar tail on AVX2 hosts
ROTARY_LAYOUTS = [(64, 64, 4, 2, False), (64, 32, 4, 1, True), (128, 128, 8, 8, True), (80, 64, 3, 1, False),
                  (40, 40, 3, 1, False)]


@pytest.mark.parametrize(("head_size", "rot", "hq", "hk", "padded_key"), ROTARY_LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("tokens", [1, 4, 300])  # 300 tokens of 8 + 8 heads of 128: the threaded region
def test_rotary_loops_equal_the_torch_formulation(monkeypatch, head_size, rot, hq, hk, padded_key, dtype, is_neox,
                                                  tokens):
    gen = torch.Generator().manual_seed(tokens + head_size)
    positions = torch.randint(0, 512, (tokens,), generator=gen)
    cache = _cache(512, rot, torch.bfloat16 if dtype == torch.bfloat16 else torch.float32)
    qkv = torch.randn(tokens, (hq + 2 * hk) * head_size + 16, generator=gen).to(dtype)  # 16 columns past the v
    if padded_key:  # each key head padded to head_size + 8: a head stride other than head_size
        keys = torch.randn(tokens, hk, head_size + 8, generator=gen).to(dtype)
        key = keys[..., :head_size]
    else:
        key = qkv[:, hq * head_size : (hq + hk) * head_size]
    query = qkv[:, : hq * head_size]
    before = native_build.calls()

    def run(q, k):
        ops.rotary_embedding(positions, q, k, cache, head_size=head_size, rotary_dim=rot, is_neox=is_neox)
        return q, k

    expected_q, expected_k = _torch_formulation(monkeypatch, lambda: run(query.clone(), key.clone()))
    untouched = qkv[:, (hq + hk) * head_size :].clone()
    key_pad = keys[..., head_size:].clone() if padded_key else None
    run(query, key)
    assert native_build.calls()["rotary_embedding"] == before["rotary_embedding"] + 1
    # float32 arithmetic both ways; a fused multiply-add may round the last bit differently
    tol = dict(rtol=0, atol=0) if dtype == torch.bfloat16 else dict(rtol=1e-6, atol=1e-6)
    if dtype == torch.float16:
        tol = dict(rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(query, expected_q, **tol)
    torch.testing.assert_close(key, expected_k, **tol)
    assert torch.equal(qkv[:, (hq + hk) * head_size :], untouched)
    if padded_key:
        assert torch.equal(keys[..., head_size:], key_pad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 8), (5, 3, 96), (300, 1024), (3, 100)])  # a 3-d batch; 300 rows: threads;
# 100: vector steps of sixteen and a scalar tail
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_loops_equal_the_torch_formulation(monkeypatch, dtype, shape, with_residual):
    gen = torch.Generator().manual_seed(shape[-1])
    x = torch.randn(shape, generator=gen).to(dtype)
    weight = torch.randn(shape[-1], generator=gen).to(dtype)
    residual = torch.randn(shape, generator=gen).to(dtype) if with_residual else None
    expected = _torch_formulation(monkeypatch, lambda: ops.rms_norm(x, weight, 1e-5, residual))
    before = native_build.calls()
    got = ops.rms_norm(x, weight, 1e-5, residual)
    assert native_build.calls()["rms_norm"] == before["rms_norm"] + 1
    # the torch formulation sums squares in another order; one rounding of the reduced dtype may differ
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    for a, b in zip(got if with_residual else (got,), expected if with_residual else (expected,), strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b, **tol)


def _same_bits_or_both_nan(got: torch.Tensor, expected: torch.Tensor) -> bool:
    nan = expected.isnan()
    same = got.contiguous().view(torch.int16) == expected.contiguous().view(torch.int16)
    return bool(torch.equal(got.isnan(), nan) and same[~nan].all())


def test_bfloat16_stores_round_ties_to_even_and_write_nan_as_torch(monkeypatch):
    """The bfloat16 stores (a vector path on AVX2 hosts) against torch's rounding bit for bit: ties to even,
    infinities kept, NaN where torch has NaN (its bits differ by path: 0x7FC0 scalar, 0xFFFF vectorized). A rotation
    by cos 1, sin 2^-8 of pairs (1, b) gives 1 - b / 256: ties for negative odd b."""
    half = 32
    cache = torch.cat([torch.ones(1, half), torch.full((1, half), 2.0**-8)], -1).to(torch.bfloat16)
    b = torch.tensor([-1.0, -3.0, 1.0, 3.0, -5.0, float("nan"), float("inf"), -7.0] * 4)
    query = torch.cat([torch.ones(2, half), b.expand(2, half)], -1).to(torch.bfloat16)  # [2 tokens, one head]
    key = query.clone()
    positions = torch.zeros(2, dtype=torch.long)

    def run(q, k):
        ops.rotary_embedding(positions, q, k, cache, head_size=2 * half, rotary_dim=2 * half, is_neox=True)
        return q, k

    expected_q, _ = _torch_formulation(monkeypatch, lambda: run(query.clone(), key.clone()))
    assert expected_q[0, 1].item() == 1.0 + 2.0**-6  # 1 + 3/256, a tie: to even (truncation gives 1 + 2^-7)
    assert expected_q[0, 5].isnan() and expected_q[0, half + 6].isinf()
    run(query, key)
    for got in (query, key):
        assert _same_bits_or_both_nan(got, expected_q)

    gen = torch.Generator().manual_seed(48)
    x = torch.randn(3, 48, generator=gen).to(torch.bfloat16)
    x[1, 20] = float("nan")  # a NaN in row 1: its sum (NaN), its norm all NaN
    residual = torch.randn(3, 48, generator=gen).to(torch.bfloat16)
    weight = torch.randn(48, generator=gen).to(torch.bfloat16)
    for res in (None, residual):
        expected = _torch_formulation(monkeypatch, lambda res=res: ops.rms_norm(x, weight, 1e-5, res))
        got = ops.rms_norm(x, weight, 1e-5, res)
        out, want = (got[0], expected[0]) if res is not None else (got, expected)
        assert want[1].isnan().all() and out[1].isnan().all()
        # the other rows' scale comes from a sum in another order: one bfloat16 rounding may differ
        torch.testing.assert_close(out[[0, 2]], want[[0, 2]], rtol=1e-2, atol=1e-2)
        if res is not None:  # h = x + residual: one float32 sum, one rounding on both paths
            assert _same_bits_or_both_nan(got[1], expected[1]) and expected[1][1].isnan().any()


def test_rms_norm_strided_rows_and_a_float32_weight():
    """Rows of a wider buffer (a row stride past the width) and a float32 weight beside bfloat16 activations."""
    wide = torch.randn(6, 200).to(torch.bfloat16)
    x, weight = wide[:, :128], torch.randn(128)
    before = native_build.calls()
    got = ops.rms_norm(x, weight, 1e-6)
    assert native_build.calls()["rms_norm"] == before["rms_norm"] + 1
    h = x.double()
    expected = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.double()
    torch.testing.assert_close(got.double(), expected, rtol=2e-2, atol=2e-2)


def test_rotary_position_out_of_range_names_it_and_writes_nothing():
    query, key = torch.randn(3, 64), torch.randn(3, 64)
    q0, k0 = query.clone(), key.clone()
    with pytest.raises(IndexError, match=r"positions\[2\] = 40 is outside cos_sin_cache's 32 rows"):
        layers.rotary_embedding(torch.tensor([0, 5, 40]), query, key, _cache(32, 64, torch.float32), head_size=64,
                                rotary_dim=64, is_neox=True)
    assert torch.equal(query, q0) and torch.equal(key, k0)


def test_calls_the_loops_do_not_take_run_the_torch_formulation():
    """float64, autograd recording, a non-contiguous batch, a residual of another dtype, 2-d positions: the torch
    formulation runs (counted nowhere) and still gives the right answer."""
    before = native_build.calls()
    x64, w64 = torch.randn(4, 32, dtype=torch.float64), torch.randn(32, dtype=torch.float64)
    out = ops.rms_norm(x64, w64, 1e-6)
    assert out.dtype == torch.float64
    expected = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * w64
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)  # float32 arithmetic, as every dtype gets
    leaf = torch.randn(4, 32, requires_grad=True)  # the loops would leave autograd nothing to record
    assert native_layers.rms_norm(leaf, torch.randn(32), 1e-6) is None
    with torch.no_grad():
        assert native_layers.rms_norm(leaf, torch.randn(32), 1e-6) is not None
    before["rms_norm"] += 1
    batch = torch.randn(4, 3, 32).transpose(0, 1)  # [3, 4, 32], not contiguous
    assert native_layers.rms_norm(batch, torch.randn(32), 1e-6) is None
    assert native_layers.rms_norm(torch.randn(2, 32), torch.randn(32), 1e-6,
                                  torch.randn(2, 32).to(torch.bfloat16)) is None
    assert not native_layers.rotary_embedding(torch.zeros(3, 2, dtype=torch.long), torch.randn(2, 64), None,
                                              _cache(8, 64, torch.float32), 64, 64, True)
    assert native_build.calls() == before


def _load_in_subprocess(env: dict[str, str]) -> dict:
    code = ("import json; from ascend_kernels.reference import native_build as b; s = b.status(); "
            "print(json.dumps({'available': s.available, 'reason': s.reason, 'library': s.library, "
            "'build_s': s.build_s}))")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_built_once_per_machine_then_loaded(tmp_path):
    """Two processes starting at once on an empty cache both end with the library (each builds under its own
    temporary name and renames it into place); a third loads it without building."""
    env = {"ASCEND_VLLM_CACHE": str(tmp_path)}
    code = ("import json; from ascend_kernels.reference import native_build as b; s = b.status(); "
            "print(json.dumps({'available': s.available, 'library': s.library, 'build_s': s.build_s}))")
    procs = [subprocess.Popen([sys.executable, "-c", code], env={**os.environ, **env}, stdout=subprocess.PIPE,
                              text=True) for _ in range(2)]
    firsts = [json.loads(p.communicate(timeout=300)[0].strip().splitlines()[-1]) for p in procs]
    assert all(f["available"] and f["build_s"] is not None for f in firsts), firsts
    assert firsts[0]["library"] == firsts[1]["library"]
    assert [p.name for p in (tmp_path / "native").iterdir()] == [Path(firsts[0]["library"]).name]  # no temporaries
    third = _load_in_subprocess(env)
    assert third["available"] and third["build_s"] is None and third["library"] == firsts[0]["library"]


@pytest.mark.parametrize(("env", "reason"), [
    ({native_build.ENV_SWITCH: "0"}, "disabled by ASCEND_VLLM_NATIVE_KERNELS=0"),
    ({"CC": "no-such-compiler-here"}, "CC='no-such-compiler-here' is not an executable on PATH"),
    ({"CC": "false"}, "build or load failed: "),  # a compiler that fails: its exit code is in the reason
])
def test_without_the_loops_the_status_says_why_and_ops_still_run(tmp_path, env, reason):
    code = ("import json, torch; from ascend_kernels import ops; from ascend_kernels.reference import native_build "
            "as b; x = torch.randn(3, 16); out = ops.rms_norm(x, torch.ones(16), 1e-6); s = b.status(); "
            "print(json.dumps({'available': s.available, 'reason': s.reason, 'ok': bool(torch.isfinite(out).all())}))")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "ASCEND_VLLM_CACHE": str(tmp_path), **env},
                          capture_output=True, text=True, timeout=300, check=True)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["available"] is False and reason in got["reason"] and got["ok"], got
    assert "torch formulation used" in done.stderr or env.get(native_build.ENV_SWITCH) == "0", done.stderr


def test_a_torch_compile_trace_runs_the_torch_formulation(monkeypatch):
    """vLLM's compiled graphs trace the reference (the device lane's fallbacks, a compiled simulated engine): the
    trace sees the torch formulation whole, never the library's lock or a data pointer (fullgraph: a graph break
    fails), and the compiled result equals the loops'. The library is not loaded yet when the trace starts, as in
    an engine whose first layer call is traced."""
    x, weight, residual = torch.randn(4, 64), torch.randn(64), torch.randn(4, 64)
    positions, cache = torch.tensor([0, 3, 7, 1]), _cache(16, 32, torch.float32)
    qkv = torch.randn(4, 3 * 32)

    def layer(x, weight, residual, qkv):
        out, h = ops.rms_norm(x, weight, 1e-6, residual)
        q, k = qkv[:, :32], qkv[:, 32:64]
        ops.rotary_embedding(positions, q, k, cache, head_size=32, rotary_dim=32, is_neox=True)
        return out, h, ops.silu_and_mul(torch.cat([out, h], -1)), q * 1, k * 1

    monkeypatch.setattr(native_build, "_STATE", {})
    before = native_build.calls()
    compiled = torch.compile(layer, backend="eager", fullgraph=True)(x, weight, residual, qkv.clone())
    assert native_build.calls() == before  # nothing of the trace ran the loops
    eager = layer(x, weight, residual, qkv.clone())
    assert native_build.calls() != before
    for a, b in zip(compiled, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
