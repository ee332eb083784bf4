"""Coverage of engine processes only: the environment that makes a process (and its subprocesses) record it.

`ASCEND_TESTKIT_REACH=<folder>` in the test session's environment turns it on: `reach_env()` then gives each engine
host (and each server or router a test starts) `COVERAGE_PROCESS_START`, which coverage's own `.pth` hook reads at
interpreter start-up, so vLLM's worker processes record too (forked ones through coverage's fork patch). The pytest
process itself is not measured: a module reached only by a unit test does not count.
"""

from __future__ import annotations

import os
from pathlib import Path

REACH_ENV = "ASCEND_TESTKIT_REACH"
RUNTIME_PACKAGES = ("ascend_kernels", "ascend_core", "ascend_kv_transfer", "ascend_specdecode", "ascend_platform",
                    "ascend_vllm")


def rcfile(folder: str | os.PathLike) -> Path:
    """Write (once) and return the coverage configuration every measured process reads."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "coveragerc"
    if not path.exists():
        path.write_text("\n".join([
            "[run]",
            f"data_file = {folder / '.coverage'}",
            "parallel = true",
            f"source_pkgs = {', '.join(RUNTIME_PACKAGES)}",
            # Subprocesses through the .pth hook; forked workers re-start their data; os._exit and SIGTERM save it.
            "patch = subprocess, fork, _exit",
            "sigterm = true",
            "disable_warnings = no-data-collected, module-not-measured, module-not-imported",
            # What runs while a runtime module is imported is told apart (the "import" context): it proves nothing.
            "plugins = ascend_testkit.reach.import_context",
            "",
        ]))
    return path


def reach_env() -> dict[str, str]:
    """Environment entries that make a process record reach, or {} when the session does not collect it."""
    folder = os.environ.get(REACH_ENV)
    return {"COVERAGE_PROCESS_START": str(rcfile(folder))} if folder else {}
