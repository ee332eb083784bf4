"""Coverage of engine processes only: the environment that makes a process (and its subprocesses) record it.

`ASCEND_TESTKIT_REACH=<folder>` in the test session's environment turns it on: `reach_env()` then gives each engine
host (and each server or router a test starts) `COVERAGE_PROCESS_START`, which coverage's own `.pth` hook reads at
interpreter start-up, so vLLM's worker processes record too (forked ones through coverage's fork patch), and the
reach folder on `PYTHONPATH`, where coverage finds the `import_context` plug-in at that early point. The pytest
process itself is not measured: a module reached only by a unit test does not count.
"""

from __future__ import annotations

import os
from pathlib import Path

REACH_ENV = "ASCEND_TESTKIT_REACH"
PLUGIN_MODULE = "ascend_reach_import_context"  # import_context, as the measured processes import it
RUNTIME_PACKAGES = ("ascend_kernels", "ascend_core", "ascend_kv_transfer", "ascend_specdecode", "ascend_platform",
                    "ascend_vllm")


def rcfile(folder: str | os.PathLike) -> Path:
    """Write (once) and return the coverage configuration every measured process reads."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "coveragerc"
    plugin = folder / f"{PLUGIN_MODULE}.py"
    if not plugin.exists():  # importable at interpreter start-up, through PYTHONPATH (see import_context)
        plugin.write_text((Path(__file__).parent / "import_context.py").read_text())
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
            f"plugins = {PLUGIN_MODULE}",
            "",
            f"[{PLUGIN_MODULE}]",
            f"packages = {' '.join(RUNTIME_PACKAGES)}",
            "",
        ]))
    return path


def reach_env() -> dict[str, str]:
    """Environment entries that make a process record reach, or {} when the session does not collect it."""
    folder = os.environ.get(REACH_ENV)
    if not folder:
        return {}
    config = rcfile(folder)
    path = os.pathsep.join(p for p in (str(config.parent), os.environ.get("PYTHONPATH", "")) if p)
    return {"COVERAGE_PROCESS_START": str(config), "PYTHONPATH": path}


def with_reach(env: dict[str, str], extra: dict[str, str] | None) -> dict[str, str]:
    """`env` with the reach entries, then `extra`, on top; an `extra` PYTHONPATH is put before the reach folder's
    instead of replacing it (coverage finds its plug-in there at interpreter start-up)."""
    reach = reach_env()
    env.update(reach)
    env.update(extra or {})
    if reach and extra and "PYTHONPATH" in extra:
        parts = [*extra["PYTHONPATH"].split(os.pathsep), *reach["PYTHONPATH"].split(os.pathsep)]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in parts if p))
    return env
