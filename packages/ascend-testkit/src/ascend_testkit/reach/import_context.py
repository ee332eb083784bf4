"""Coverage plug-in of the reach check: what runs while a runtime module is being imported is recorded under the
dynamic context "import", so the check tells code an engine ran from code an import ran (a module-level
`NPUPlatform = _lane_class()` runs a function body that no engine asked for).

The coverage configuration every measured process reads (`collect.rcfile`) names this module as a plug-in; coverage
imports it when it starts (at interpreter start-up, through its `.pth` hook), before any runtime module is imported,
and `coverage_init` puts a finder first on `sys.meta_path` that wraps the loader of each runtime module (the
packages named in the plug-in's options): its `exec_module` runs in the "import" context. At that point of start-up
the workspace's editable source folders are not on `sys.path` yet (their `.pth` files sort after coverage's), so
`collect.rcfile` copies this file, which imports nothing of ours, into the reach folder and `collect.reach_env` puts
that folder on the measured processes' `PYTHONPATH`. Each switch flushes coverage's collected lines, about two per
runtime module imported. Other threads' lines during an import window are labelled "import" too (one context per
process): that can only under-count, never credit an engine with what it did not run.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any

IMPORT_CONTEXT = "import"
RUNTIME_PACKAGES: tuple[str, ...] = ()  # set by coverage_init from the plug-in's options

_lock = threading.Lock()
_depth = [0]


def _switch(label: str | None) -> None:
    import coverage

    cov = coverage.Coverage.current()
    if cov is None:
        return
    with contextlib.suppress(coverage.CoverageException):  # not started (yet, or any more): nothing is recorded
        cov.switch_context(label)


class _ImportingLoader:
    """The module's own loader, but its body runs in the "import" context (everything else is the loader's)."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        with _lock:
            _depth[0] += 1
            if _depth[0] == 1:
                _switch(IMPORT_CONTEXT)
        try:
            self._loader.exec_module(module)
        finally:
            with _lock:
                _depth[0] -= 1
                if _depth[0] == 0:
                    _switch(None)

    def __getattr__(self, name: str) -> Any:  # get_source, get_resource_reader, is_package, ...
        return getattr(self._loader, name)


class _RuntimeModuleFinder:
    """First on `sys.meta_path`: asks the finders after it, and wraps the loader of our runtime modules."""

    def find_spec(self, fullname: str, path, target=None):
        if fullname.partition(".")[0] not in RUNTIME_PACKAGES:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ImportingLoader(spec.loader)
                return spec
        return None


def install() -> None:
    if not any(isinstance(f, _RuntimeModuleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _RuntimeModuleFinder())


def coverage_init(reg, options) -> None:  # coverage's plug-in entry point
    global RUNTIME_PACKAGES
    RUNTIME_PACKAGES = tuple(options.get("packages", "").split())
    install()
