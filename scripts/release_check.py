"""Release check: every package's version, changelog, pins and ranges agree with what was last released.

"Last release" of a package is its entry in `releases.toml` at the workspace root (written by `scripts/release`
when a version is published, beside the git tag `NAME-vX.Y.Z`): the version and a digest of what goes into the
wheel (the package's `src/` files, its README and its pyproject's `[project]` table). The record is a file, not the
tags, because CI runs on a clean clone whose tags may not have been fetched. Fails, naming the package and value:
- the digest differs from the record but the version is the recorded one (changed without a bump);
- the version differs from the record but is not newer, or CHANGELOG.md has no `## <version>` heading;
- the meta-package's `==` pins (dependencies and extras) differ from a member's version;
- a member's range of an internal dependency does not hold that dependency's version, or its lower bound is not
  that version: the only version of an internal dependency the workspace tests against is the one in it, so the
  oldest a range allows must be that one.

Usage: release_check.py [--root DIR] [--json]; exit 0 when clean, 1 with one line per problem.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

META = "ascend-vllm"
RECORD = "releases.toml"


@dataclass(frozen=True)
class Package:
    name: str
    folder: Path  # holds pyproject.toml, README.md, CHANGELOG.md
    src: Path  # the import package's folder
    project: dict

    @property
    def version(self) -> Version:
        return Version(self.project["version"])

    def requirements(self) -> list[Requirement]:
        reqs = [Requirement(r) for r in self.project.get("dependencies", [])]
        for extra in self.project.get("optional-dependencies", {}).values():
            reqs.extend(Requirement(r) for r in extra)
        return reqs


def workspace(root: Path) -> dict[str, Package]:
    """The meta-package and every member under packages/, read from their pyprojects."""
    found = {}
    for pyproject in [root / "pyproject.toml", *sorted((root / "packages").glob("*/pyproject.toml"))]:
        project = tomllib.loads(pyproject.read_text())["project"]
        name = project["name"]
        found[name] = Package(name, pyproject.parent, pyproject.parent / "src" / name.replace("-", "_"), project)
    return found


def digest(package: Package) -> str:
    """sha256 over what the wheel is made of: src/ files (no bytecode), the README, the [project] table."""
    h = hashlib.sha256()
    h.update(json.dumps(package.project, sort_keys=True).encode())
    files = [p for p in package.src.rglob("*") if p.is_file() and "__pycache__" not in p.parts
             and p.suffix not in (".pyc", ".pyo")]
    readme = package.folder / package.project.get("readme", "README.md")
    for path in sorted(files) + ([readme] if readme.is_file() else []):
        h.update(str(path.relative_to(package.folder)).encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def changelog_versions(package: Package) -> list[str]:
    path = package.folder / "CHANGELOG.md"
    if not path.is_file():
        return []
    return re.findall(r"^## +v?([0-9][^\s]*)", path.read_text(), flags=re.MULTILINE)


def read_record(root: Path) -> dict[str, dict]:
    path = root / RECORD
    return tomllib.loads(path.read_text()).get("package", {}) if path.is_file() else {}


def problems(root: Path) -> list[str]:
    packages = workspace(root)
    record = read_record(root)
    found: list[str] = []
    for name in sorted(record.keys() - packages.keys()):
        found.append(f"{RECORD}: '{name}' is recorded but no workspace package has that name")
    for name, package in sorted(packages.items()):
        found.extend(_version_problems(package, record.get(name)))
        found.extend(_dependency_problems(package, packages))
    return found


def _version_problems(package: Package, released: dict | None) -> list[str]:
    name, version = package.name, package.version
    out = []
    if str(version) not in changelog_versions(package):
        out.append(f"{name}: version {version} has no '## {version}' entry in {package.folder.name}/CHANGELOG.md")
    if released is None:
        return out  # never released: nothing to compare against
    last = Version(released["version"])
    if version == last and digest(package) != released["digest"]:
        out.append(f"{name}: sources changed since its release {last} ({RECORD}) but the version is still {version}"
                   f": bump it in {package.folder.name}/pyproject.toml and add a changelog entry")
    elif version < last:
        out.append(f"{name}: version {version} is older than its last release {last}")
    return out


def _dependency_problems(package: Package, packages: dict[str, Package]) -> list[str]:
    out = []
    for req in package.requirements():
        dep = packages.get(req.name)
        if dep is None:
            continue
        specs = list(req.specifier)
        if package.name == META:
            if [(s.operator, Version(s.version)) for s in specs] != [("==", dep.version)]:
                out.append(f"{META}: pins '{req}' but {dep.name} is at {dep.version} (expected =={dep.version})")
            continue
        if dep.version not in req.specifier:
            out.append(f"{package.name}: requires '{req}', which excludes {dep.name}'s version {dep.version}")
        lower = [Version(s.version) for s in specs if s.operator in (">=", "==", "~=")]
        if not lower or min(lower) != dep.version:
            out.append(f"{package.name}: requires '{req}', whose oldest allowed {dep.name} is "
                       f"{min(lower) if lower else 'unbounded'}; only {dep.version} is tested (use >={dep.version})")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--json", action="store_true", help="print the versions, digests and problems as JSON")
    args = parser.parse_args(argv)
    found = problems(args.root)
    if args.json:
        packages = workspace(args.root)
        print(json.dumps({"packages": {n: {"version": str(p.version), "digest": digest(p)}
                                       for n, p in sorted(packages.items())},
                          "released": read_record(args.root), "problems": found}, indent=2))
    else:
        for line in found:
            print(line)
        print(f"release check: {len(found)} problem(s)" if found else "release check: ok")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
