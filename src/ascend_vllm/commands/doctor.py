"""`ascend-vllm doctor`: what this machine offers the plugin, and why something is missing."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import sys
from typing import Any

from ascend_vllm.commands import _doctor_kernels as doctor_kernels

HELP = ("Report torch, torch_npu, CANN, vLLM and its probed lane, Mooncake, the entry points vLLM sees, and whether "
        "the simulated-NPU lane can run Model Runner V2.")

OUR_ENTRY_POINTS = {
    "vllm.platform_plugins": {"ascend": "ascend_platform.registration:register"},
    "vllm.general_plugins": {"ascend_kv_transfer": "ascend_kv_transfer.registration:register"},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the readable report")


def _torch() -> dict[str, Any]:
    try:
        import torch
    except Exception as exc:
        return {"ok": False, "version": None, "detail": f"import torch failed: {exc}"}
    return {"ok": True, "version": torch.__version__, "detail": ""}


def _torch_npu() -> dict[str, Any]:
    from ascend_kernels.npu_probe import torch_npu_status

    s = torch_npu_status()
    return {"ok": s.usable, "importable": s.importable, "version": s.version, "devices": s.device_count,
            "detail": s.reason or f"{s.device_count} NPU device(s)"}


def _cann() -> dict[str, Any]:
    home = os.environ.get("ASCEND_TOOLKIT_HOME") or os.environ.get("ASCEND_HOME_PATH")
    default = "/usr/local/Ascend/ascend-toolkit/latest"
    path = home or (default if os.path.isdir(default) else None)
    if not path:
        return {"ok": False, "path": None, "detail": "no CANN toolkit (ASCEND_TOOLKIT_HOME unset, no " + default + ")"}
    return {"ok": os.path.isdir(path), "path": path, "detail": "" if os.path.isdir(path) else "path does not exist"}


def _vllm() -> dict[str, Any]:
    from ascend_core.upstream import (
        ENGINE_TESTED,
        STATIC_ONLY,
        SUPPORTED_RANGE,
        UpstreamContractError,
        capabilities,
        installed_vllm_version,
        support_level,
    )

    version = installed_vllm_version()
    support = {"level": support_level(version), "engine_tested": dict(ENGINE_TESTED),
               "static_only": list(STATIC_ONLY), "detail": SUPPORTED_RANGE}
    try:
        caps = capabilities()
    except UpstreamContractError as exc:
        return {"ok": False, "version": version, "lane": None, "detail": str(exc), "support": support,
                "probes": [{"name": p.name, "ok": p.ok, "value": p.value, "detail": p.detail} for p in exc.failed]}
    return {"ok": True, "version": version, "lane": caps.lane.value, "detail": "", "support": support,
            "probes": [{"name": p.name, "ok": p.ok, "value": p.value, "detail": p.detail, "required": p.required}
                       for p in caps.probes]}


def _mooncake() -> dict[str, Any]:
    if importlib.util.find_spec("mooncake") is None:
        return {"ok": False, "detail": "not installed (pip install 'ascend-kv-transfer[mooncake]')"}
    try:
        from mooncake.engine import TransferEngine  # noqa: F401
    except Exception as exc:  # e.g. libibverbs1 missing
        return {"ok": False, "detail": f"import mooncake.engine failed: {exc}"}
    names = ("mooncake-transfer-engine-npu", "mooncake-transfer-engine-non-cuda", "mooncake-transfer-engine")
    dists = [d for d in names if _dist_version(d)]
    return {"ok": True, "detail": ", ".join(f"{d} {_dist_version(d)}" for d in dists)}


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _entry_points() -> dict[str, Any]:
    """Which of our entry points vLLM's own loader finds and loads (honouring VLLM_PLUGINS)."""
    try:
        from vllm.plugins import load_plugins_by_group
    except Exception as exc:
        return {"ok": False, "detail": f"vLLM's plugin loader unavailable: {exc}", "groups": {}}
    groups = {}
    ok = True
    for group, ours in OUR_ENTRY_POINTS.items():
        loaded = load_plugins_by_group(group)
        for name in ours:
            seen = name in loaded
            entry: dict[str, Any] = {"seen": seen}
            if seen and group == "vllm.platform_plugins":
                entry["register_returns"] = loaded[name]()
            groups.setdefault(group, {})[name] = entry
            ok = ok and seen
    return {"ok": ok, "detail": "" if ok else "an entry point is not visible to vLLM", "groups": groups}


def _mrv2() -> dict[str, Any]:
    """Model Runner V2 in the simulated-NPU lane: Triton's interpreter, the kernel stand-ins and their patches."""
    from ascend_core.upstream import mrv2_unavailable_reason
    from ascend_platform.patches import REGISTRY
    from ascend_platform.simulated import mrv2_lane, triton_interpreter
    from ascend_platform.simulated.kernel_overrides import BLOCK_TABLE_KERNELS, STAND_INS

    lane = triton_interpreter.status()
    refused = mrv2_unavailable_reason()
    problems = REGISTRY.verify()
    patches = {name: problem for name, problem in problems.items() if name.startswith(("simulated.", "mrv2."))}
    requested = mrv2_lane.requested_runner()
    default = "v2" if lane.usable and refused is None else "v1"
    ok = lane.usable and refused is None and all(p is None for p in patches.values())
    if refused is not None:
        detail = f"MRV2 is refused on this vLLM (probe mrv2_kv_hooks): {refused}; the simulated lane uses the V1 runner"
    elif not lane.usable:
        detail = f"MRV2 cannot run in the simulated lane: {lane.reason}; it uses the V1 runner"
    elif lane.mode == "native":
        detail = f"Triton {lane.version} has a native CPU backend: vLLM's kernels compile as they are"
    else:
        replaced = len(STAND_INS) + len(BLOCK_TABLE_KERNELS)
        detail = (f"Triton {lane.version} runs vLLM's kernels in its interpreter; {replaced} MRV2 kernels run as "
                  "torch / ascend_kernels stand-ins")
    runner = {"default": f"default -> {default}", "v1": "v1 (VLLM_USE_V2_MODEL_RUNNER=0)",
              "v2": "v2 (VLLM_USE_V2_MODEL_RUNNER=1)"}[requested]
    return {"ok": ok, "detail": detail, "runner": runner, "refused": refused, "triton_version": lane.version,
            "mode": lane.mode,
            "stand_ins": [s.kernel for s in STAND_INS] + list(BLOCK_TABLE_KERNELS), "patches": patches,
            "interpreter_on_in_this_process": triton_interpreter.enabled()}


def collect() -> dict[str, Any]:
    from ascend_platform.registration import SIMULATE_ENV, simulate_requested

    return {
        "python": sys.version.split()[0],
        "torch": _torch(),
        "torch_npu": _torch_npu(),
        "cann": _cann(),
        "vllm": _vllm(),
        "mooncake": _mooncake(),
        "entry_points": _entry_points(),
        "mrv2_simulated": _mrv2(),
        "kernels": doctor_kernels.collect(),
        "simulated_npu": {"ok": True, "enabled": simulate_requested(),
                          "detail": f"{SIMULATE_ENV}={os.environ.get(SIMULATE_ENV, '')!r}"},
    }


def _mark(ok: bool) -> str:
    return "ok " if ok else "-- "


def render(report: dict[str, Any]) -> str:
    t, n, c, v, m, e = (report[k] for k in ("torch", "torch_npu", "cann", "vllm", "mooncake", "entry_points"))
    lines = [
        f"python      {report['python']}",
        f"{_mark(t['ok'])}torch       {t['version'] or ''} {t['detail']}".rstrip(),
        f"{_mark(n['ok'])}torch_npu   {n['version'] or ''} {n['detail']}".rstrip(),
        f"{_mark(c['ok'])}CANN        {c['path'] or ''} {c['detail']}".rstrip(),
        f"{_mark(v['ok'])}vLLM        {v['version'] or 'not installed'}  lane: {v['lane'] or 'unknown'}  "
        f"CI: {v['support']['level']}",
        f"      supported: {v['support']['detail']}",
    ]
    for p in v.get("probes", []):
        lines.append(f"      {_mark(p['ok'])}{p['name']:<32} {p['detail']}")
    if not v["ok"]:
        lines.append("      " + v["detail"].replace("\n", "\n      "))
    lines.append(f"{_mark(m['ok'])}Mooncake    {m['detail']}")
    lines.append(f"{_mark(e['ok'])}entry points seen by vLLM's plugin loader {e['detail']}".rstrip())
    for group, entries in e.get("groups", {}).items():
        for name, info in entries.items():
            extra = f" -> register() returns {info['register_returns']!r}" if "register_returns" in info else ""
            lines.append(f"      {_mark(info['seen'])}{group}: {name}{extra}")
    s = report["simulated_npu"]
    lines.append(f"    simulated NPU lane: {'on' if s['enabled'] else 'off'} ({s['detail']})")
    r = report["mrv2_simulated"]
    lines.append(f"{_mark(r['ok'])}MRV2 in the simulated lane: {r['detail']}; runner: {r['runner']}")
    for name, problem in r["patches"].items():
        lines.append(f"      {_mark(problem is None)}patch {name}{'' if problem is None else ': ' + problem}")
    lines.extend(doctor_kernels.render(report["kernels"]))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    report = collect()
    print(json.dumps(report, default=str) if args.json else render(report))
    return 0 if report["vllm"]["ok"] and report["entry_points"]["ok"] else 1
