"""Build and load the reference backend's native loops (`reference/native/*.c`) once per machine.

The C sources ship in the package; the first process that needs it compiles it with the host's C compiler
(`$CC`, else `cc`) for this CPU (`-march=native`) into the cache directory (`$ASCEND_VLLM_CACHE/native`, else
`~/.cache/ascend-vllm/native`), named by a hash of the source, the compiler's version, the flags and the CPU's feature
flags, so a changed source, compiler or machine builds anew and everyone else only loads it. The library is written
under a temporary name and renamed into place: processes building at once (engine workers, test shards) each end
with a whole file.

Without a compiler, or with `ASCEND_VLLM_NATIVE_KERNELS=0`, nothing is built and the reference ops run their torch
formulation; `status()` says which and why (the usage report and the tests read it).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

NATIVE_DIR = Path(__file__).with_name("native")
SOURCES = (NATIVE_DIR / "layers.c", NATIVE_DIR / "attention.c", NATIVE_DIR / "attention_tiled.c",
           NATIVE_DIR / "batch_prep.c", NATIVE_DIR / "mrv2_step.c", NATIVE_DIR / "mrv2_greedy.c",
           NATIVE_DIR / "gumbel.c")  # one library
# included by them: part of what names a build
HEADERS = (NATIVE_DIR / "common.h", NATIVE_DIR / "layers_typed.h", NATIVE_DIR / "attention_typed.h",
           NATIVE_DIR / "argmax.h", NATIVE_DIR / "bf16_avx2.h")
# -fno-trapping-math: without it GCC keeps nearbyintf a libm call (it may not drop the inexact flag), and every loop
# through ak_exp_nonpositive (silu, the softmax rows) stays scalar. Values are unchanged: only FP exception flags,
# which nothing here reads, may differ.
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-std=gnu11", "-shared",
         "-fPIC")
COMPILE_TIMEOUT_S = 180.0
ENV_SWITCH = "ASCEND_VLLM_NATIVE_KERNELS"
# The facade ops the loops take calls of.
CALLED_OPS = ("rms_norm", "rotary_embedding", "silu_and_mul", "reshape_and_cache", "paged_attention",
              "compute_slot_mapping", "gumbel_sample")

_c_i64, _c_int, _c_float, _ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_void_p
# Each exported function's C signature (layers.c), so ctypes converts arguments instead of guessing.
SIGNATURES: dict[str, tuple[type, list[type]]] = {
    "ak_rms_norm": (_c_int, [_ptr, _c_i64, _c_int, _ptr, _c_i64, _ptr, _c_int, _ptr, _c_i64, _ptr, _c_i64, _c_i64,
                             _c_i64, _c_float, _c_int]),
    "ak_paged_decode": (_c_int, [_ptr, _c_i64, _c_i64, _ptr, _c_i64, _c_i64, _c_i64, _ptr, _c_i64, _c_i64, _c_i64,
                                 _c_int, _ptr, _c_int, _c_i64, _c_i64, _c_i64, _ptr, _c_int, _c_i64, _c_i64, _c_i64,
                                 _c_i64, _c_i64, _c_i64, _c_float, _c_i64, _ptr, _ptr, _c_i64, _c_i64, _c_i64,
                                 _c_int]),
    "ak_paged_tiled": (_c_i64, [_ptr, _c_i64, _c_i64, _ptr, _c_i64, _c_i64, _c_i64, _ptr, _c_i64, _c_i64, _c_i64,
                                _c_int, _ptr, _c_int, _c_i64, _c_i64, _c_i64, _ptr, _ptr, _c_i64, _c_i64, _c_i64,
                                _c_i64, _c_i64, _c_i64, _c_float, _c_int, _c_i64, _ptr, _ptr, _c_i64, _c_i64, _ptr,
                                _c_i64, _c_int]),
    "ak_silu_and_mul": (_c_int, [_ptr, _c_i64, _c_int, _ptr, _c_i64, _c_i64, _c_i64, _c_int]),
    "ak_cache_write": (_c_i64, [_ptr, _c_int, _c_i64, _ptr, _c_i64, _c_i64, _ptr, _c_i64, _c_i64, _c_int, _ptr, _c_i64,
                                _c_i64, _c_i64, _ptr, _c_i64, _c_i64, _c_i64, _c_int, _c_i64, _c_i64, _c_i64, _c_i64,
                                _c_i64, _c_int]),
    "ak_slot_mapping": (_c_i64, [_ptr, _c_int, _c_i64, _c_i64, _ptr, _c_int, _ptr, _c_int, _c_i64, _ptr, _c_int,
                                 _c_i64, _ptr, _c_i64]),
    "ak_mrv2_pos_seq_lens": (_c_i64, [_ptr, _c_int, _c_i64, _ptr, _c_int, _c_i64, _ptr, _c_int, _ptr, _c_int, _ptr,
                                      _c_int, _c_i64, _c_i64, _c_i64]),
    "ak_mrv2_combine_tokens": (_c_i64, [_ptr, _c_int, _c_i64, _ptr, _c_int, _ptr, _c_int, _c_i64, _ptr, _c_int, _ptr,
                                        _c_int, _ptr, _c_int, _ptr, _c_int, _c_i64, _c_i64, _ptr, _c_int, _ptr, _c_int,
                                        _c_i64, _c_i64, _c_i64]),
    "ak_mrv2_num_sampled": (_c_i64, [_ptr, _c_int, _ptr, _c_int, _ptr, _c_int, _ptr, _c_int, _ptr, _c_int, _ptr, _c_int,
                                     _c_i64, _c_i64]),
    "ak_mrv2_post_update": (_c_i64, [_ptr, _c_int, _ptr, _c_int, _ptr, _c_int, _c_i64, _ptr, _c_int, _c_i64, _ptr,
                                     _c_int, _c_i64, _ptr, _c_int, _ptr, _c_int, _ptr, _c_int, _ptr, _c_int, _c_i64,
                                     _ptr, _c_int, _c_i64]),
    "ak_mrv2_gather_block_table": (_c_i64, [_ptr, _c_int, _c_i64, _ptr, _c_int, _c_i64, _ptr, _c_int, _c_i64, _ptr,
                                            _c_int, _c_i64, _c_i64, _c_i64]),
    "ak_mrv2_gumbel_greedy": (_c_i64, [_ptr, _c_int, _c_i64, _c_i64, _c_i64, _ptr, _c_int, _ptr, _c_i64, _ptr, _c_i64,
                                       _ptr, _c_int, _c_i64, _c_i64]),
    "ak_gumbel_sample": (_c_i64, [_ptr, _c_int, _c_i64, _c_i64, _c_i64, _ptr, _ptr, _c_int, _ptr, _c_int]),
    "ak_rotary": (_c_i64, [_ptr, _c_i64, _ptr, _c_int, _c_i64, _c_i64, _ptr, _c_i64, _c_i64, _c_i64, _ptr, _c_i64,
                           _c_i64, _c_i64, _c_int, _c_i64, _c_int, _c_int]),
}


@dataclass(frozen=True)
class NativeStatus:
    available: bool
    reason: str  # what was loaded, or why nothing was
    library: str | None = None
    build_s: float | None = None  # seconds this process spent compiling (None: loaded from the cache)


_LOCK = threading.Lock()
_SUSPENDED = [False]
_STATE: dict[str, object] = {}
# Calls the loops took, per facade op, for this process's usage report (the torch formulation's are the rest).
_CALLS: dict[str, int] = {}


def cache_dir() -> Path:
    root = os.environ.get("ASCEND_VLLM_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "ascend-vllm")
    return Path(root) / "native"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def _compiler() -> tuple[str | None, str]:
    """(the compiler's path, or None and why)."""
    chosen = os.environ.get("CC", "").strip()
    if chosen:
        found = shutil.which(chosen)
        return (found, "") if found else (None, f"CC={chosen!r} is not an executable on PATH")
    found = shutil.which("cc") or shutil.which("gcc")
    return (found, "") if found else (None, "no C compiler found (cc, gcc; or set CC)")


def _compiler_version(cc: str) -> str:
    done = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30, check=False)
    return done.stdout


def _build(cc: str, target: Path) -> float:
    """Compile SOURCES into target (atomically); returns the seconds it took."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    os.close(fd)
    start = time.monotonic()
    try:
        done = subprocess.run([cc, *FLAGS, *map(str, SOURCES), "-o", tmp], capture_output=True, text=True,
                              timeout=COMPILE_TIMEOUT_S, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{cc} exited with {done.returncode}: {done.stderr.strip()[-2000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return time.monotonic() - start


def _enabled() -> bool:
    value = os.environ.get(ENV_SWITCH, "1").strip().lower()
    if value in ("0", "false", "no", "off"):
        return False
    if value not in ("", "1", "true", "yes", "on"):
        logger.warning("ascend_kernels: %s=%r is not one of 0/1/false/true/no/yes/off/on; the native loops stay on",
                       ENV_SWITCH, value)
    return True


def _load() -> tuple[ctypes.CDLL | None, NativeStatus]:
    if not _enabled():
        return None, NativeStatus(False, f"disabled by {ENV_SWITCH}={os.environ[ENV_SWITCH]}")
    cc, why = _compiler()
    if cc is None:
        logger.warning("ascend_kernels: the reference's native loops are unavailable, torch formulation used: %s", why)
        return None, NativeStatus(False, why)
    try:
        sources = [path.read_bytes() for path in (*SOURCES, *HEADERS)]
        key = hashlib.sha256(b"\0".join([*sources, _compiler_version(cc).encode(), " ".join(FLAGS).encode(),
                                         _cpu_flags().encode()])).hexdigest()[:16]
        target = cache_dir() / f"reference-loops-{key}.so"
        build_s = None
        if not target.exists():
            build_s = _build(cc, target)
            logger.info("ascend_kernels: built the reference's native loops in %.1f s: %s", build_s, target)
        lib = ctypes.CDLL(str(target))
        for name, (restype, argtypes) in SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
    except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as exc:
        logger.warning("ascend_kernels: the reference's native loops are unavailable, torch formulation used: %s", exc)
        return None, NativeStatus(False, f"build or load failed: {exc}")
    return lib, NativeStatus(True, f"loaded {target.name}", str(target), build_s)


def library() -> ctypes.CDLL | None:
    """The loaded library, or None (see `status()`); built or loaded on the first call of this process. None while
    torch.compile traces the caller: the loops take data pointers, which a trace's fake tensors do not have (and the
    trace must not reach this module's lock); None inside `suspended()`."""
    if torch.compiler.is_compiling() or _SUSPENDED[-1]:
        return None
    return _loaded()


def _loaded() -> ctypes.CDLL | None:
    lib = _STATE.get("lib", False)
    if lib is not False:
        return lib  # type: ignore[return-value]
    with _LOCK:
        if "lib" not in _STATE:
            _STATE["lib"], _STATE["status"] = _load()
        return _STATE["lib"]  # type: ignore[return-value]


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Every op inside takes its torch formulation (what an emulated NPU's tensors take), for tests that hold both
    paths to one anchor. Process-wide while it lasts (every thread's calls), so for tests only."""
    _SUSPENDED.append(True)
    try:
        yield
    finally:
        _SUSPENDED.pop()


def status() -> NativeStatus:
    if not torch.compiler.is_compiling():
        _loaded()
    return _STATE["status"]  # type: ignore[return-value]


def record(op: str) -> None:
    """Count one call of `op` a loop took."""
    _CALLS[op] = _CALLS.get(op, 0) + 1


def calls_of(op: str) -> int:
    """Calls the loops took of one op, a facade op or one of Model Runner V2's step kernels (`native_mrv2_step`)."""
    return _CALLS.get(op, 0)


def calls() -> dict[str, int]:
    """Calls the loops took per op (ops that never took one are 0)."""
    return {op: _CALLS.get(op, 0) for op in CALLED_OPS}


def loaded_status() -> NativeStatus | None:
    """The status if this process has tried to load the library, else None (nothing is built by asking)."""
    return _STATE.get("status")  # type: ignore[return-value]


def reset() -> None:
    """Forget the loaded library (tests switching `ASCEND_VLLM_NATIVE_KERNELS`); the next call loads again."""
    with _LOCK:
        _STATE.clear()
