"""Importing any runtime module changes nothing: no environment variable written, no function of vLLM, torch or
Triton replaced. Patches go through `ascend_platform.patches` and are applied where their contract says, never as
a side effect of an import.

One fresh interpreter first imports every vLLM module our sources import (some of vLLM's own modules patch torch
when imported, e.g. its CPU shared-memory helpers: that is vLLM's doing, not ours), records the environment and
every function and class of vLLM, torch and Triton, then imports our runtime modules one at a time and compares
after each; a change is reported with the modules that import brought in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [str(p) for p in sorted(ROOT.glob("packages/ascend-*/src/ascend_*")) if p.name != "ascend_testkit"]
SOURCES.append(str(ROOT / "src" / "ascend_vllm"))

PROBE = r"""
import importlib, json, os, pkgutil, sys, types

def snapshot():
    seen = {}
    for name, mod in list(sys.modules.items()):
        if not isinstance(mod, types.ModuleType) or not name.split(".")[0] in ("vllm", "torch", "triton"):
            continue
        for attr, value in list(vars(mod).items()):
            if callable(value) and not isinstance(value, types.ModuleType):
                seen[(name, attr)] = id(value)
    return seen

import ast, pathlib
import torch, triton, vllm  # noqa: E401
for src in json.loads(sys.argv[1]):
    for path in pathlib.Path(src).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                     else [])
            for n in names:
                if n.split(".")[0] == "vllm":
                    try:
                        importlib.import_module(n)
                    except Exception:
                        pass
env0, funcs0 = dict(os.environ), snapshot()
found, modules = [], []
for root in ["ascend_kernels", "ascend_core", "ascend_kv_transfer", "ascend_specdecode", "ascend_platform",
             "ascend_vllm"]:
    pkg = importlib.import_module(root)
    modules.append(root)
    modules += [m.name for m in pkgutil.walk_packages(pkg.__path__, root + ".")]
for name in modules:
    before = set(sys.modules)
    try:
        importlib.import_module(name)
    except Exception as exc:
        found.append({"module": name, "error": f"{type(exc).__name__}: {exc}"})
        continue
    env, funcs = dict(os.environ), snapshot()
    changed_env = sorted(k for k in set(env) | set(env0) if env.get(k) != env0.get(k))
    patched = sorted(f"{m}.{a}" for (m, a), i in funcs.items() if (m, a) in funcs0 and funcs0[(m, a)] != i)
    if changed_env or patched:
        new = sorted(m for m in set(sys.modules) - before if m.startswith("ascend_"))
        found.append({"module": name, "env": changed_env, "patched": patched, "imported": new})
        env0, funcs0 = env, funcs
print("SIDE_EFFECTS " + json.dumps({"checked": len(modules), "found": found}))
"""


def test_importing_a_runtime_module_changes_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_VLLM_SIMULATE", "VLLM_", "COVERAGE_"))}
    env.update(HF_HUB_OFFLINE="1", VLLM_CACHE_ROOT=str(tmp_path / "vllm-cache"))
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(SOURCES)], capture_output=True, text=True,
                         timeout=600, env=env, cwd=tmp_path)
    lines = [line for line in out.stdout.splitlines() if line.startswith("SIDE_EFFECTS ")]
    assert lines, out.stdout[-2000:] + out.stderr[-4000:]
    result = json.loads(lines[-1].removeprefix("SIDE_EFFECTS "))
    assert result["checked"] > 100, result  # every runtime module was imported
    assert not result["found"], json.dumps(result["found"], indent=1)
