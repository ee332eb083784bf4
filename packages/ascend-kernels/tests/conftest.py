"""Every test runs on the reference backend with validation on, and leaves the selection as it found it."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

import ascend_kernels


@pytest.fixture(autouse=True)
def _reference_backend():
    previous = ascend_kernels.validation_enabled()
    ascend_kernels.set_validation(True)
    with ascend_kernels.use_backend("reference"):
        yield
    ascend_kernels.set_validation(previous)


def _strided_caches(num_blocks, block_size, heads, head_size, head_size_v, dtype, *, layers=2, layer=1, seed=0):
    """K and V caches as the allocator builds them: non-contiguous views over one shared int8 backing.

    Backing bytes per block hold every layer's page `[heads, block_size, head_size + head_size_v]` (K and V packed
    per head), so the per-layer `[num_blocks, block_size, heads, head_size]` views are permuted and strided.
    """
    elem = torch.empty((), dtype=dtype).element_size()
    page = heads * block_size * (head_size + head_size_v)
    backing = torch.zeros(num_blocks * layers * page * elem, dtype=torch.int8)
    typed = backing.view(dtype).view(num_blocks, layers, heads, block_size, head_size + head_size_v)
    k = typed[:, layer, :, :, :head_size].permute(0, 2, 1, 3)
    v = typed[:, layer, :, :, head_size:].permute(0, 2, 1, 3)
    gen = torch.Generator().manual_seed(seed)
    k.copy_(torch.randn(k.shape, generator=gen))
    v.copy_(torch.randn(v.shape, generator=gen))
    assert not k.is_contiguous() and not v.is_contiguous()
    return backing, k, v


@pytest.fixture
def strided_caches():
    return _strided_caches


def _load_paged_cases() -> None:
    """`tests/paged_cases.py` as the module `paged_cases`, which both paged-attention test files import (the tests run
    with --import-mode=importlib, where a sibling module is not importable by name; this conftest runs first)."""
    import importlib.util
    import sys
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("paged_cases", Path(__file__).with_name("paged_cases.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["paged_cases"] = module
    spec.loader.exec_module(module)


_load_paged_cases()


# ------------------------------------------------------------------ DeepSeek V4: naive codecs of vLLM's byte layouts

_FP8_GRID = torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn).double()  # bytes 0..126: 0..448


def _fp8_bytes(x: torch.Tensor, *, flush: bool) -> torch.Tensor:
    """float64 values within +-448 -> e4m3fn bytes: the nearest grid value, ties to the even byte (mantissa LSB),
    values under 2^-6 to signed zero when `flush`. Independent of torch's own float8 cast."""
    a = x.double().abs().flatten()
    dist = (a.unsqueeze(1) - _FP8_GRID).abs()
    nearest = dist == dist.min(dim=1, keepdim=True).values
    even = nearest & (torch.arange(127) % 2 == 0)
    byte = torch.where(even.any(1), even.int().argmax(1), nearest.int().argmax(1))
    if flush:
        byte = torch.where(a < 2.0**-6, 0, byte)
    sign = (torch.signbit(x.double().flatten())).int() * 0x80
    return (byte | sign).to(torch.uint8).view(x.shape)


def _ds_mla_record(cache_2d: torch.Tensor, block_size: int, slot: int, nope: int, rope: int = 64):
    """One fp8_ds_mla record, read byte by byte: (fp8 bytes [nope], exponent bytes [nope // 64], pad byte,
    rope float64 [rope], dequantized float64 [nope + rope])."""
    row = cache_2d[slot // block_size]
    p = slot % block_size
    token_bytes, scale_bytes = nope + 2 * rope, nope // 64 + 1
    record = row[p * token_bytes: (p + 1) * token_bytes].clone()
    scales = row[block_size * token_bytes + p * scale_bytes: block_size * token_bytes + (p + 1) * scale_bytes]
    values = record[:nope].view(torch.float8_e4m3fn).double()
    factor = torch.tensor([2.0 ** (int(e) - 127) for e in scales[:-1]], dtype=torch.float64)
    rope_values = record[nope:].view(torch.bfloat16).double()
    deq = torch.cat(((values.view(-1, 64) * factor.unsqueeze(1)).flatten(), rope_values))
    return record[:nope], scales[:-1].clone(), int(scales[-1]), rope_values, deq


def _indexer_record(cache_2d: torch.Tensor, block_size: int, slot: int, head_dim: int):
    """One indexer record: (fp8 bytes [head_dim], float32 scale as a Python float)."""
    row = cache_2d[slot // block_size]
    p = slot % block_size
    values = row[p * head_dim: (p + 1) * head_dim].clone()
    scale = row[block_size * head_dim + 4 * p: block_size * head_dim + 4 * p + 4].clone().view(torch.float32)
    return values, float(scale)


def _gptj(x: torch.Tensor, angle_cos: torch.Tensor, angle_sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs (x[2i], x[2i+1]) by the angle whose cos/sin are given per pair (float64)."""
    out = x.clone()
    for i in range(x.shape[-1] // 2):
        e, o = x[..., 2 * i], x[..., 2 * i + 1]
        out[..., 2 * i] = e * angle_cos[..., i] - o * angle_sin[..., i]
        out[..., 2 * i + 1] = e * angle_sin[..., i] + o * angle_cos[..., i]
    return out


def _rope_cache(max_pos: int, rope: int, base: float = 10000.0) -> torch.Tensor:
    inv = base ** (-torch.arange(0, rope, 2, dtype=torch.float64) / rope)
    angles = torch.arange(max_pos, dtype=torch.float64).unsqueeze(1) * inv
    return torch.cat((angles.cos(), angles.sin()), dim=1).float()


def _pow2_exponent(amax: float) -> int:
    """The smallest e with 2^e >= amax (amax > 0), from float64 without log2 rounding."""
    e = math.frexp(amax)[1]
    return e - 1 if amax == 2.0 ** (e - 1) else e


@pytest.fixture
def dsv4_naive():
    return SimpleNamespace(fp8_bytes=_fp8_bytes, ds_mla_record=_ds_mla_record, indexer_record=_indexer_record,
                           gptj=_gptj, rope_cache=_rope_cache, pow2_exponent=_pow2_exponent)


# ------------------------------------------------------------------ DeepSeek V4.1: vLLM's Triton kernels as anchors


def _load_vllm_triton():
    """`tests/vllm_triton.py` (loaded by path: the tests run with --import-mode=importlib), with Triton's interpreter
    switched on now: this conftest is imported before any test module, and a test module that imports vLLM imports
    Triton with it, after which the anchors could only skip."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("ascend_kernels_tests_vllm_triton",
                                                  Path(__file__).with_name("vllm_triton.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.switch_on()
    return module


_VLLM_TRITON = _load_vllm_triton()


@pytest.fixture(scope="session")
def vllm_triton():
    return _VLLM_TRITON


def _use_native(monkeypatch, on: bool) -> None:
    """Load the reference's native loops anew with their switch on or off; the loaded state comes back after the
    test. On, they must load: a host without a C compiler fails here, naming it (scripts/test-all installs gcc)."""
    from ascend_kernels.reference import native_build

    if on:
        monkeypatch.delenv(native_build.ENV_SWITCH, raising=False)
    else:
        monkeypatch.setenv(native_build.ENV_SWITCH, "0")
    monkeypatch.setattr(native_build, "_STATE", {})
    if on and not native_build.status().available:
        pytest.fail(f"the reference's native loops did not load: {native_build.status().reason} "
                    "(install a C compiler, e.g. apt-get install gcc)")


@pytest.fixture
def torch_formulation(monkeypatch) -> None:
    """The reference's torch formulation alone (its native loops switched off): for tests of that formulation's own
    paths (gathers, chunks, step plans), which the loops would otherwise take the calls from."""
    _use_native(monkeypatch, False)


@pytest.fixture(params=["native", "torch"])
def formulation(request, monkeypatch) -> str:
    """Each per-token layer op test runs twice: on the reference's native loops and on its torch formulation."""
    _use_native(monkeypatch, request.param == "native")
    return request.param


@pytest.fixture
def native_loops(monkeypatch) -> None:
    """The reference's native loops loaded anew (the switch cleared) for a test of the loops themselves."""
    _use_native(monkeypatch, True)
