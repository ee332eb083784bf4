"""Every third-party module a runtime package imports (at the top or lazily) is declared in its own pyproject.

`pip install <one package>` must bring what it imports. Exempt by design: `vllm` (users install the vLLM build for
their device; `ascend_core.upstream` checks its contracts at import) and the modules that only exist beside vLLM
or torch (their own dependencies, named below with the reason).
"""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {  # import name -> folder holding pyproject.toml and src/
    "ascend_kernels": ROOT / "packages/ascend-kernels",
    "ascend_core": ROOT / "packages/ascend-core",
    "ascend_kv_transfer": ROOT / "packages/ascend-kv-transfer",
    "ascend_specdecode": ROOT / "packages/ascend-specdecode",
    "ascend_platform": ROOT / "packages/ascend-platform",
    "ascend_vllm": ROOT,
    "ascend_contracts": ROOT / "packages/ascend-contracts",  # development only, but installed alone all the same
}
OURS = {*PACKAGES, "ascend_testkit"}
# Imported only inside vLLM's process, where vLLM itself brings them: never declared by us.
BROUGHT_BY_VLLM = {"vllm", "triton"}
# Probed for presence (`find_spec` first, absence reported, not an error), through an extra of a member package.
PROBED = {("ascend_vllm", "mooncake"): "`ascend-vllm doctor` reports whether Mooncake imports ([mooncake] extra)"}


def _imports(src: Path) -> dict[str, str]:
    """Top-level module imported -> one file importing it."""
    found: dict[str, str] = {}
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return found


def _declared(folder: Path) -> set[str]:
    project = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
    reqs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        reqs.extend(extra)
    return {re.split(r"[ \[<>=!~;]", r, maxsplit=1)[0].lower().replace("_", "-") for r in reqs}


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_third_party_imports_are_declared(package):
    folder = PACKAGES[package]
    src = folder / "src" / package
    declared = _declared(folder)
    dists = packages_distributions()
    missing = []
    for module, where in sorted(_imports(src).items()):
        if (module in sys.stdlib_module_names or module in OURS or module in BROUGHT_BY_VLLM
                or module == "__future__" or (package, module) in PROBED):
            continue
        candidates = {d.lower().replace("_", "-") for d in dists.get(module, [module])}
        if not candidates & declared:
            missing.append(f"{module} (distribution {sorted(candidates)}, imported in {where})")
    assert not missing, f"{package} imports undeclared third-party modules: " + "; ".join(missing)
