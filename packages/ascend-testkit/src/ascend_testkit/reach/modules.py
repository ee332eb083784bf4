"""Which runtime modules ran in the measured processes: a module counts when one of its functions ran.

A module with functions is reached only when a line inside one of them executed outside any import of a runtime
module (importing runs its `def` lines, and module-level calls run function bodies no engine asked for: neither proves
anything; `import_context` labels them); a module without functions (data, re-exports) is reached when it was
imported.
"""

from __future__ import annotations

import ast
import glob
import importlib.util
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ascend_testkit.reach.collect import RUNTIME_PACKAGES


class UnreadableReachData(RuntimeError):
    """A measured process's coverage data file is unreadable (written half, or corrupted)."""


@dataclass(frozen=True)
class Module:
    name: str
    path: Path

    def function_bodies(self) -> list[set[int]]:
        """The body lines of each function of the module (methods and nested functions too), docstrings left out."""
        tree = ast.parse(self.path.read_text(), filename=str(self.path))
        bodies = (_function_body_lines(node) for node in ast.walk(tree)
                  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))
        return [body for body in bodies if body]

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


    def class_methods(self) -> dict[str, list[set[int]]]:
        """Qualified name -> the body lines of each of its methods, for every class defined in the module (nested
        ones too), leaving out classes whose methods have no body lines (data, protocols, exceptions without
        methods)."""
        tree = ast.parse(self.path.read_text(), filename=str(self.path))
        out: dict[str, list[set[int]]] = {}

        def visit(node: ast.AST, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.ClassDef):
                    name = f"{prefix}{child.name}"
                    methods = [body for item in child.body
                               if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                               and (body := _function_body_lines(item))]
                    if methods:
                        out[name] = methods
                    visit(child, f"{name}.")
                elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    visit(child, f"{prefix}{child.name}.<locals>.")

        visit(tree, "")
        return out


def _function_body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> set[int]:
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]
    lines: set[int] = set()
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


def executed_lines(folder: str | os.PathLike, *, at_import: bool = False) -> dict[str, set[int]]:
    """File path -> lines executed, over every coverage data file the measured processes wrote in `folder`: lines
    that ran outside any import of a runtime module (`import_context`), or with `at_import` every line that ran.

    A data file that cannot be read fails the check (naming it): the reach it held is unknown, so "every module was
    reached" could not be claimed. Processes write their data at exit (SIGTERM included); one killed with SIGKILL
    writes none, and a test that kills one on purpose knows its reach is not recorded.
    """
    from coverage import CoverageData
    from coverage.exceptions import DataError

    from ascend_testkit.reach.import_context import IMPORT_CONTEXT

    lines: dict[str, set[int]] = {}
    for data_file in sorted(glob.glob(os.path.join(folder, ".coverage*"))):
        if data_file.endswith(("-journal", "-wal", "-shm")):
            continue  # SQLite's side files of a data file
        data = CoverageData(basename=data_file)
        try:
            data.read()
            if not at_import:  # every context but the import one (the default context is "")
                data.set_query_contexts([f"^(?!{IMPORT_CONTEXT}$)"])
            measured = {path: data.lines(path) for path in data.measured_files()}
        except DataError as exc:
            raise UnreadableReachData(f"coverage data file {data_file} cannot be read: {exc}") from exc
        for path, ran in measured.items():
            if ran:
                lines.setdefault(str(Path(path).resolve()), set()).update(ran)
    return lines


def reached_classes(modules: Iterable[Module], executed: dict[str, set[int]],
                    imported: dict[str, set[int]] | None = None) -> dict[str, bool]:
    """`module:Class` -> whether one of its methods ran outside imports (`executed`; a class does not count because
    its module's other code ran: the device lane's classes once passed because their simulated neighbours did).
    A class whose every method ran while its module was imported (`imported`), and none after, is a declaration
    the module builds at import (a registry's entries, a module's lock-and-table singleton): it counts as its
    module's import, as `reached` counts such modules; one of its methods that never ran still fails it."""
    imported = executed if imported is None else imported
    out = {}
    for module in modules:
        ran, seen = executed.get(str(module.path), set()), imported.get(str(module.path), set())
        for name, methods in module.class_methods().items():
            out[f"{module.name}:{name}"] = (any(body & ran for body in methods)
                                           or all(body & seen for body in methods))
    return out


def reached(modules: Iterable[Module], executed: dict[str, set[int]],
            imported: dict[str, set[int]] | None = None) -> dict[str, bool]:
    """Module -> reached: a line of one of its functions ran outside imports (`executed`). A module without
    functions (data, re-exports), or whose every function ran while it was imported (helpers building its
    declarations, such as `NPUPlatform = _lane_class()`), counts when it was imported (`imported`: every line that
    ran; default `executed`): its classes are held to the per-class check."""
    imported = executed if imported is None else imported
    out = {}
    for module in modules:
        ran, seen = executed.get(str(module.path), set()), imported.get(str(module.path), set())
        bodies = module.function_bodies()
        if any(body & ran for body in bodies):
            out[module.name] = True
        else:  # no function ran outside imports: reached only as a module whose functions all serve its import
            out[module.name] = bool(seen) and all(body & seen for body in bodies)
    return out
