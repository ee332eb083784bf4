"""The doctor's kernel section: which `ascend_kernels` backends can run here, and what the npu backend runs per facade
op (a torch_npu kernel, or the reference on the device) with the cases where a binding falls back to the reference.

Read from the backend's own table (`implementations("npu")` and the binding notes), so it answers on a machine
without torch_npu as it would on a card.
"""

from __future__ import annotations

from typing import Any


def collect() -> dict[str, Any]:
    import ascend_kernels
    from ascend_kernels.npu_backend import NPU_BINDINGS

    targets = ascend_kernels.implementations("npu")
    ops = {name: {"target": targets[name], "kind": binding.kind, "note": binding.note}
           for name, binding in NPU_BINDINGS.items()}
    return {"ok": True, "available": ascend_kernels.available_backends(), "npu": ops}


def render(section: dict[str, Any]) -> list[str]:
    """A few lines: each backend's availability, the torch_npu kernel of each op that has one (and its note), then
    the ops that run the reference on the device, by name only."""
    lines = []
    for name, refused in section["available"].items():
        lines.append(f"{'ok ' if refused is None else '-- '}kernels     {name}: {refused or 'can run here'}")
    kernels = {op: info for op, info in section["npu"].items() if info["kind"] == "torch_npu"}
    on_device = sorted(op for op, info in section["npu"].items() if info["kind"] != "torch_npu")
    lines.append(f"      npu backend: {len(kernels)} facade ops on torch_npu kernels, {len(on_device)} as the "
                 "reference on the device")
    for op, info in kernels.items():
        note = f"  ({info['note']})" if info["note"] else ""
        lines.append(f"        {op:<26} {info['target']}{note}")
    lines.append(f"        reference on the device: {', '.join(_grouped(on_device))}")
    lines.append("      a binding that cannot take its inputs runs the reference, counted with the reason in the "
                 "worker's ascend_usage() ('fallbacks', 'fallback_reasons')")
    return lines


def _grouped(ops: list[str]) -> list[str]:
    """The DeepSeek V4 / V4.1 ops as one entry per family: their names say nothing more here."""
    families = {"dsv41_": 0, "dsv4_": 0}
    rest = []
    for op in ops:
        family = next((f for f in families if op.startswith(f)), None)
        if family is None:
            rest.append(op)
        else:
            families[family] += 1
    return rest + [f"{family}* ({n} ops)" for family, n in families.items() if n]
