"""torch_npu contract pins: each op our code calls, with its schema as one torch_npu release declares it.

A package that calls torch_npu keeps `torch_npu_pins.toml` next to its `__init__.py` (ascend-kernels' NPU backend
does). The file is generated from the scan of our call sites and the wheel (`ascend-vllm contracts pin-torch-npu
--write`), never typed; its format is described at its top (`HEADER`). Loading validates every entry and parses
every schema, so a hand edit that breaks one is an error naming the file and the op.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ascend_contracts.pins import PinsError, package_dir, read_pins_toml
from ascend_contracts.torch_npu_calls import OP_OWNERS, NpuCall, bound_parameters
from ascend_contracts.torch_npu_schema import Schema, SchemaError, parse_schema

TORCH_NPU_PINS_FILE = "torch_npu_pins.toml"
# The release the pins are generated from unless a pins file already names one.
DEFAULT_TORCH_NPU = "2.13.0"
NAMESPACES = frozenset({"npu", "atb"})
_KEYS = frozenset({"op", "via", "namespace", "schema", "called_by", "uses"})

HEADER = """\
# torch_npu ops {package} calls, with their schemas as the torch_npu {version} wheel declares them.
# GENERATED, do not edit: `ascend-vllm contracts pin-torch-npu --write` rescans our call sites and re-reads the wheel.
# `ascend-vllm contracts check --torch-npu VERSION_OR_WHEEL` grades another release against these pins (P0 an op
# gone; P1 a parameter in `uses` changed, or a required one added; P2 the rest) and every call site against that
# release's schemas (unknown keyword, extra positional, keyword-only by position, required missing, literal type,
# result arity), and lists ops called but not pinned.
#
#   torch_npu   the release the schemas below were read from
#   [[ops]]     one per op (overload) our calls resolve to
#   op          the op as torch_npu exposes it; `name.overload` when our calls resolve to a non-default overload
#               (torch_npu dispatches `torch_npu.atb.npu_paged_cache_load(..., key=k, value=v)` to `.out`)
#   via         how our code reaches it: torch_npu.<op>, torch_npu.atb.<op>, torch.ops.npu.<op>, torch.ops.atb.<op>
#   namespace   the library registering the schema: "npu" (libtorch_npu.so) or "atb" (libop_plugin_atb.so)
#   schema      the registered schema, verbatim from the wheel
#   called_by   the facade ops (ascend_kernels.ops names) whose NPU binding calls it; `function()` for a helper
#   uses        the parameters our calls bind, by position or keyword (a `**kwargs` dict's literal keys included)
"""


@dataclass(frozen=True)
class OpPin:
    op: str  # "npu_rms_norm" or "npu_paged_cache_load.out"
    via: str
    namespace: str
    schema: Schema
    called_by: tuple[str, ...] = ()
    uses: tuple[str, ...] = ()
    package: str = ""
    source: str = ""

    @property
    def name(self) -> str:
        return self.op.split(".", 1)[0]


def _strings(value: object, where: str, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PinsError(f"{where}: {key!r} must be a list of strings, got {value!r}")
    return tuple(value)


def _pin(table: dict, where: str, package: str, source: str) -> OpPin:
    unknown = set(table) - _KEYS
    if unknown:
        raise PinsError(f"{where}: unknown key(s) {sorted(unknown)}; known: {sorted(_KEYS)}")
    op = table.get("op")
    if not isinstance(op, str) or not op.replace(".", "_").isidentifier():
        raise PinsError(f"{where}: 'op' must be an op name such as 'npu_rms_norm', got {op!r}")
    via = table.get("via")
    if via not in OP_OWNERS:
        raise PinsError(f"{where} ({op}): via {via!r} is not one of {sorted(OP_OWNERS)}")
    namespace = table.get("namespace")
    if namespace not in NAMESPACES:
        raise PinsError(f"{where} ({op}): namespace {namespace!r} is not one of {sorted(NAMESPACES)}")
    text = table.get("schema")
    if not isinstance(text, str):
        raise PinsError(f"{where} ({op}): 'schema' must be the schema string, got {text!r}")
    try:
        schema = parse_schema(text)
    except SchemaError as exc:
        raise PinsError(f"{where} ({op}): {exc}") from exc
    declared = schema.name + (f".{schema.overload}" if schema.overload else "")
    if declared != op:
        raise PinsError(f"{where}: op {op!r} does not match its schema's name {declared!r}")
    uses = _strings(table.get("uses", []), where, "uses")
    stray = [u for u in uses if schema.param(u) is None]
    if stray:
        raise PinsError(f"{where} ({op}): uses {stray} are not parameters of its schema")
    return OpPin(op=op, via=via, namespace=namespace, schema=schema, uses=uses, package=package, source=source,
                 called_by=_strings(table.get("called_by", []), where, "called_by"))


@dataclass(frozen=True)
class OpPins:
    torch_npu: str
    ops: tuple[OpPin, ...]


def load_op_pins(path: str | Path, package: str | None = None) -> OpPins:
    """One `torch_npu_pins.toml`; `package` defaults to the folder the file sits in (the import name)."""
    path = Path(path)
    package = package or path.parent.name
    data = read_pins_toml(path)
    version = data.get("torch_npu")
    if not isinstance(version, str):
        raise PinsError(f"{path}: 'torch_npu' must name the release the schemas come from, got {version!r}")
    tables = data.get("ops", [])
    if not isinstance(tables, list):
        raise PinsError(f"{path}: 'ops' must be an array of tables ([[ops]])")
    ops = tuple(_pin(t, f"{path}: ops[{i}]", package, str(path)) for i, t in enumerate(tables))
    seen: set[str] = set()
    for pin in ops:
        if pin.op in seen:
            raise PinsError(f"{path}: {pin.op} is pinned twice; regenerate the file")
        seen.add(pin.op)
    return OpPins(torch_npu=version, ops=ops)


def discover_op_pins_files(packages: Iterable[str]) -> dict[str, Path]:
    """`{import name: torch_npu pins file}` for each installed package of `packages` that has one."""
    found = {}
    for name in packages:
        folder = package_dir(name)
        if folder is not None and (folder / TORCH_NPU_PINS_FILE).is_file():
            found[name] = folder / TORCH_NPU_PINS_FILE
    return found


@dataclass(frozen=True)
class ResolvedCall:
    """A call site with the overload key of the wheel its arguments resolve to (None: no overload accepts it)."""

    call: NpuCall
    package: str
    op: str | None
    namespace: str | None
    callers: tuple[str, ...]  # facade op names (or `function()`) the enclosing function serves


def build_op_pins(resolved: Iterable[ResolvedCall], schemas: dict[str, str]) -> dict[str, list[dict]]:
    """`{package: [ops table, ...]}` for the calls that resolve to an op of the wheel (`schemas`: key -> text)."""
    by_package: dict[str, dict[str, dict]] = {}
    for r in resolved:
        if r.op is None:
            continue
        schema = parse_schema(schemas[r.op])
        entry = by_package.setdefault(r.package, {}).setdefault(r.op, {
            "op": r.op, "via": r.call.via, "namespace": r.namespace, "schema": schemas[r.op],
            "called_by": [], "uses": set()})
        entry["called_by"] += [c for c in r.callers if c not in entry["called_by"]]
        entry["uses"] |= set(bound_parameters(r.call, schema))
    out = {}
    for package, entries in by_package.items():
        rows = []
        for op in sorted(entries):
            entry = entries[op]
            order = [p.name for p in parse_schema(entry["schema"]).params]
            rows.append({**entry, "called_by": sorted(entry["called_by"]),
                         "uses": [n for n in order if n in entry["uses"]]})
        out[package] = rows
    return out


def render_op_pins(package: str, version: str, rows: list[dict]) -> str:
    """The TOML text of one package's pins file (strings JSON-quoted: TOML basic strings take the same escapes)."""
    lines = [HEADER.format(package=package, version=version), f"torch_npu = {json.dumps(version)}"]
    for row in rows:
        lines += ["", "[[ops]]"]
        for key in ("op", "via", "namespace", "schema"):
            lines.append(f"{key} = {json.dumps(row[key])}")
        for key in ("called_by", "uses"):
            lines.append(f"{key} = [{', '.join(json.dumps(v) for v in row[key])}]")
    return "\n".join(lines) + "\n"
