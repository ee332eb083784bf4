"""Which runtime modules ran in the measured processes: a module counts when one of its functions ran.

A module with functions is reached only when a line inside one of them executed (importing it runs its `def`
lines, which proves nothing); a module without functions (data, re-exports) is reached when it was imported.
"""

from __future__ import annotations

import ast
import glob
import importlib.util
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ascend_testkit.reach.collect import RUNTIME_PACKAGES


@dataclass(frozen=True)
class Module:
    name: str
    path: Path

    def body_lines(self) -> set[int]:
        """Lines of statements inside function bodies (docstrings left out)."""
        tree = ast.parse(self.path.read_text(), filename=str(self.path))
        lines: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = node.body
                if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None),
                                                                         ast.Constant):
                    body = body[1:]
                for stmt in body:
                    lines.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
        return lines


def runtime_modules(packages: Iterable[str] = RUNTIME_PACKAGES) -> list[Module]:
    """Every module file of our runtime packages (found where they are installed: the workspace's src folders)."""
    found = []
    for package in packages:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError(f"runtime package {package!r} is not installed")
        root = Path(next(iter(spec.submodule_search_locations)))
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            parts = [package, *rel.parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found.append(Module(".".join(parts), path.resolve()))
    return found


def executed_lines(folder: str | os.PathLike) -> dict[str, set[int]]:
    """File path -> lines executed, over every coverage data file the measured processes wrote in `folder`.

    A process a test kills on purpose (fault injection) may leave a data file it never finished writing: that one
    process's reach is lost, so the file is skipped with a warning instead of failing the whole check.
    """
    from coverage import CoverageData
    from coverage.exceptions import DataError

    lines: dict[str, set[int]] = {}
    for data_file in sorted(glob.glob(os.path.join(folder, ".coverage*"))):
        if data_file.endswith(("-journal", "-wal", "-shm")):
            continue  # SQLite's side files of a data file
        data = CoverageData(basename=data_file)
        try:
            data.read()
        except DataError as exc:
            warnings.warn(f"skipped an unfinished coverage data file (its process was killed?): {exc}",
                          stacklevel=2)
            continue
        for measured in data.measured_files():
            lines.setdefault(str(Path(measured).resolve()), set()).update(data.lines(measured) or ())
    return lines


def reached(modules: Iterable[Module], executed: dict[str, set[int]]) -> dict[str, bool]:
    out = {}
    for module in modules:
        ran = executed.get(str(module.path), set())
        body = module.body_lines()
        out[module.name] = bool(ran & body) if body else bool(ran)
    return out
