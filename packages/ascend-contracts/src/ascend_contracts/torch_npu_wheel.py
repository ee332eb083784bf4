"""torch_npu as its published wheel declares it: the op schemas it registers and its Python sources.

A torch_npu wheel cannot be imported without CANN, but everything a contract needs is in it as data:
- `torch_npu/lib/libtorch_npu.so` holds each `npu` op's schema literal (`TORCH_LIBRARY(npu, m) { m.def("...") }`)
  as a plain string;
- `torch_npu/lib/libop_plugin_atb.so` registers the `atb` ops: long literals are plain strings, short ones are
  built in code and recovered by `atb_schema_literals`;
- `torch_npu/op_plugin/atb/_atb_ops.py` lists which atb ops torch_npu exposes and where (`torch_npu.<op>` for
  `API_LIST`, `torch_npu.atb.<op>` for `ATB_API_LIST`).

Only strings the schema grammar accepts count: libtorch_npu.so also carries C++-typed signature text in messages
(e.g. an `npu_fused_infer_attention_score(... SymIntArrayRef actual_seq_lengths=None, int64_t num_heads=1 ...)`),
which is not what the dispatcher registers (`SymInt[]? actual_seq_lengths=None, int num_heads=1`).
"""

from __future__ import annotations

import ast
import json
import os
import re
import tempfile
import threading
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from ascend_contracts.atb_schema_literals import recover_schema_literals
from ascend_contracts.wheels import fetch_wheel

PACKAGE = "torch-npu"
NPU_LIBRARY = "torch_npu/lib/libtorch_npu.so"
ATB_LIBRARY = "torch_npu/lib/libop_plugin_atb.so"
ATB_OPS = "torch_npu/op_plugin/atb/_atb_ops.py"
META_REGISTRATIONS = "torch_npu/op_plugin/meta/_meta_registrations.py"
ATB_META_REGISTRATIONS = "torch_npu/op_plugin/atb/_atb_meta_registrations.py"
_SIDECAR_FORMAT = 1  # bump when the parse changes, so stale sidecar files are re-read
_PRINTABLE = re.compile(rb"[\x20-\x7e]{12,}")
_SCHEMA = re.compile(r"^(_?npu_\w+)(?:\.(\w+))?\(.*\) -> .+$")


class TorchNpuWheelError(RuntimeError):
    """A torch_npu wheel (or unpacked tree) lacks something the reader needs; the message names it."""


@dataclass(frozen=True)
class TorchNpuWheel:
    """One torch_npu release. Keys of `schemas` are op names as torch_npu exposes them; an overload other than the
    default is keyed `name.overload` (e.g. `npu_paged_cache_load.out`)."""

    version: str
    path: Path
    schemas: dict[str, str]
    namespaces: dict[str, str]
    atb_exposure: dict[str, str] = field(default_factory=dict)  # atb op -> "torch_npu" or "torch_npu.atb"

    def text(self, member: str) -> str:
        """A text file of the wheel, e.g. `torch_npu/op_plugin/meta/_meta_registrations.py`."""
        return _read_member(self.path, member).decode("utf-8")


def _read_member(path: Path, member: str) -> bytes:
    if path.is_dir():
        file = path / member
        if not file.is_file():
            raise TorchNpuWheelError(f"{member} is not in the unpacked torch_npu tree {path}")
        return file.read_bytes()
    with zipfile.ZipFile(path) as zf:
        try:
            return zf.read(member)
        except KeyError:
            raise TorchNpuWheelError(f"{member} is not in the torch_npu wheel {path}") from None


def _version_of(path: Path) -> str:
    if path.is_file():
        # torch_npu-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl
        return path.name.split("-")[1]
    try:
        tree = ast.parse(_read_member(path, "torch_npu/version.py"))
        for node in tree.body:
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "__version__":
                return str(ast.literal_eval(node.value))
    except (TorchNpuWheelError, SyntaxError, ValueError):
        pass
    return "unknown"


def _parse_schema(text: str):
    import torch  # torch comes with ascend-core; imported late so the contract CLI starts quickly

    try:
        return torch._C.parse_schema(text)
    except RuntimeError:
        return None


def _schema_strings(blob: bytes) -> list[str]:
    return [m.group().decode("ascii") for m in _PRINTABLE.finditer(blob) if _SCHEMA.match(m.group().decode("ascii"))]


def _keyed(candidates: list[str], namespace: str, schemas: dict[str, str], namespaces: dict[str, str]) -> None:
    for text in candidates:
        parsed = _parse_schema(text)
        if parsed is None:
            continue
        key = parsed.name + (f".{parsed.overload_name}" if parsed.overload_name else "")
        if key in schemas and schemas[key] != text:
            raise TorchNpuWheelError(f"two registered schemas for {key}: {schemas[key]!r} and {text!r}")
        schemas[key] = text
        namespaces[key] = namespace


def _atb_exposure(source: str) -> dict[str, str]:
    lists: dict[str, list[str]] = {}
    for node in ast.parse(source).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id in ("API_LIST", "ATB_API_LIST"):
            lists[target.id] = list(ast.literal_eval(node.value))
    if set(lists) != {"API_LIST", "ATB_API_LIST"}:
        raise TorchNpuWheelError(f"{ATB_OPS} no longer defines API_LIST and ATB_API_LIST (found {sorted(lists)})")
    return {**dict.fromkeys(lists["API_LIST"], "torch_npu"), **dict.fromkeys(lists["ATB_API_LIST"], "torch_npu.atb")}


def _atb_schemas(path: Path) -> list[str]:
    blob = _read_member(path, ATB_LIBRARY)
    found = _schema_strings(blob)
    if path.is_dir():
        found += recover_schema_literals(path / ATB_LIBRARY)
    else:
        with tempfile.TemporaryDirectory(prefix="torch-npu-atb-") as tmp:
            so = Path(tmp) / "libop_plugin_atb.so"
            so.write_bytes(blob)
            found += recover_schema_literals(so)
    return found


def _parse(path: Path) -> dict:
    schemas: dict[str, str] = {}
    namespaces: dict[str, str] = {}
    _keyed(_schema_strings(_read_member(path, NPU_LIBRARY)), "npu", schemas, namespaces)
    exposure = _atb_exposure(_read_member(path, ATB_OPS).decode("utf-8"))
    atb_schemas: dict[str, str] = {}
    atb_namespaces: dict[str, str] = {}
    _keyed(_atb_schemas(path), "atb", atb_schemas, atb_namespaces)
    for key, text in atb_schemas.items():
        # The same name in both libraries would make `torch_npu.<op>` ambiguous; torch_npu exposes the atb one.
        schemas[key] = text
        namespaces[key] = atb_namespaces[key]
    # Some exposed ops exist only as overloads (`_npu_paged_attention_v2.out`): the packet dispatches to them.
    overloaded = {key.split(".")[0] for key in atb_schemas}
    missing = [op for op in exposure if op not in overloaded]
    if missing:
        raise TorchNpuWheelError(f"{ATB_OPS} lists atb ops with no schema found in {ATB_LIBRARY}: {missing}")
    return {"format": _SIDECAR_FORMAT, "schemas": schemas, "namespaces": namespaces, "atb_exposure": exposure}


def _sidecar(path: Path) -> Path | None:
    return path.with_name(path.name + ".schemas.json") if path.is_file() else None


def _load_or_parse(path: Path) -> dict:
    side = _sidecar(path)
    stamp = [path.stat().st_size, path.stat().st_mtime_ns] if side else None
    if side is not None and side.is_file():
        try:
            cached = json.loads(side.read_text())
            if cached.get("format") == _SIDECAR_FORMAT and cached.get("stamp") == stamp:
                return cached
        except (OSError, ValueError):
            pass
    parsed = _parse(path)
    if side is not None:
        # A sidecar saves every later process (each engine worker installs the fake) the 100 MB string scan.
        try:
            with tempfile.NamedTemporaryFile("w", dir=side.parent, prefix=".schemas-", delete=False) as tmp:
                json.dump({**parsed, "stamp": stamp}, tmp)
            os.replace(tmp.name, side)
        except OSError:
            pass
    return parsed


_MEMO: dict[Path, TorchNpuWheel] = {}
_LOCK = threading.Lock()


def open_torch_npu_wheel(version_or_path: str | os.PathLike) -> TorchNpuWheel:
    """A torch_npu release by version (fetched with pip into the shared wheel cache) or by the path of a wheel file
    or an unpacked tree (a directory holding `torch_npu/`). Parsed once per path."""
    text = os.fspath(version_or_path)
    candidate = Path(text).expanduser()
    if candidate.exists():
        path = candidate.resolve()
    elif re.match(r"^\d+(\.\d+)+", text) and os.sep not in text:
        path = fetch_wheel(text, package=PACKAGE).resolve()
    else:
        raise TorchNpuWheelError(f"not a torch_npu version nor an existing path: {text!r}")
    with _LOCK:
        if path not in _MEMO:
            parsed = _load_or_parse(path)
            _MEMO[path] = TorchNpuWheel(version=_version_of(path), path=path, schemas=parsed["schemas"],
                                        namespaces=parsed["namespaces"], atb_exposure=parsed["atb_exposure"])
        return _MEMO[path]
