"""Read vLLM's Python sources from a source tree or a release wheel (a zip), without installing or importing it.

Only the files a lookup asks for are read, so checking a few pins against a 336 MB wheel reads a handful of
members from the zip's central directory rather than unpacking it.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

# The release a source tree or wheel names in vllm/_version.py (setuptools-scm's two-name assignment, or a plain one);
# read for the report's heading only, never to decide anything.
_VERSION_RE = re.compile(r"""^__version__\s*(?::\s*str\s*)?=(?:\s*version\s*=)?\s*['"]([^'"]+)['"]""", re.M)


class SourceReader:
    """A vLLM source tree or wheel; module names are dotted (`vllm.v1.core.kv_cache_utils`)."""

    label: str

    def _exists(self, relpath: str) -> bool:
        raise NotImplementedError

    def _is_dir(self, relpath: str) -> bool:
        raise NotImplementedError

    def _read(self, relpath: str) -> str:
        raise NotImplementedError

    def _list_dir(self, relpath: str) -> list[str]:
        raise NotImplementedError

    def module_file(self, module: str) -> str | None:
        """The relative file defining `module` (its `__init__.py` for a package), or None."""
        base = module.replace(".", "/")
        for candidate in (f"{base}.py", f"{base}/__init__.py"):
            if self._exists(candidate):
                return candidate
        return None

    def is_package(self, module: str) -> bool:
        return self._is_dir(module.replace(".", "/"))

    def has_module(self, module: str) -> bool:
        return self.module_file(module) is not None or self.is_package(module)

    def read_module(self, module: str) -> tuple[str, str] | None:
        """`(source, relative file)`; a namespace package without `__init__.py` reads as empty."""
        relpath = self.module_file(module)
        if relpath is not None:
            return self._read(relpath), relpath
        if self.is_package(module):
            return "", module.replace(".", "/") + "/"
        return None

    def submodules(self, package: str) -> list[str]:
        """Direct submodules of `package` (files and sub-packages), sorted."""
        names = set()
        for entry in self._list_dir(package.replace(".", "/")):
            if entry.endswith(".py") and entry != "__init__.py":
                names.add(f"{package}.{entry[:-3]}")
            elif "." not in entry and entry != "__pycache__":
                names.add(f"{package}.{entry}")
        return sorted(names)

    def version(self) -> str | None:
        for relpath in ("vllm/_version.py", "vllm/version.py"):
            if self._exists(relpath):
                match = _VERSION_RE.search(self._read(relpath))
                if match:
                    return match.group(1)
        return None


class DirectorySource(SourceReader):
    """A folder that contains `vllm/` (a checkout, an unpacked wheel, or a site-packages)."""

    def __init__(self, root: Path):
        self.root = root
        self.label = str(root / "vllm")

    def _exists(self, relpath: str) -> bool:
        return (self.root / relpath).is_file()

    def _is_dir(self, relpath: str) -> bool:
        return (self.root / relpath).is_dir()

    def _read(self, relpath: str) -> str:
        return (self.root / relpath).read_text(encoding="utf-8")

    def _list_dir(self, relpath: str) -> list[str]:
        folder = self.root / relpath
        return [p.name for p in folder.iterdir()] if folder.is_dir() else []


class WheelSource(SourceReader):
    """A vLLM release `.whl`, read as a zip archive."""

    def __init__(self, path: Path):
        self.path = path
        self.label = path.name
        self._zip = zipfile.ZipFile(path)
        self._files = set(self._zip.namelist())
        self._dirs: dict[str, set[str]] = {}
        for name in self._files:
            parts = name.split("/")
            for depth in range(1, len(parts)):
                self._dirs.setdefault("/".join(parts[:depth]), set()).add(parts[depth])

    def _exists(self, relpath: str) -> bool:
        return relpath in self._files

    def _is_dir(self, relpath: str) -> bool:
        return relpath in self._dirs

    def _read(self, relpath: str) -> str:
        return self._zip.read(relpath).decode("utf-8")

    def _list_dir(self, relpath: str) -> list[str]:
        return sorted(self._dirs.get(relpath, ()))

    def version(self) -> str | None:
        # vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl: the second dash-separated part is the version.
        parts = self.path.name.split("-")
        return parts[1] if len(parts) > 2 else super().version()

    def close(self) -> None:
        self._zip.close()


def open_source(path: str | Path) -> SourceReader:
    """A reader for a `.whl`, a folder containing `vllm/`, or the `vllm/` package folder itself."""
    path = Path(path).expanduser()
    if path.is_file() and path.suffix == ".whl":
        return WheelSource(path)
    if (path / "vllm" / "__init__.py").is_file():
        return DirectorySource(path)
    if path.name == "vllm" and (path / "__init__.py").is_file():
        return DirectorySource(path.parent)
    raise FileNotFoundError(f"{path} is neither a vLLM wheel (.whl) nor a folder containing vllm/__init__.py")
