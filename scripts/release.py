"""Build the release artefacts, check their metadata, and say (or record) what would be published.

1. The release check (scripts/release_check.py) must be clean.
2. `uv build --all-packages --no-sources` builds every package's wheel and sdist (no workspace sources: each must
   build as a user's pip would).
3. Each artefact's core metadata (wheel METADATA, sdist PKG-INFO) is validated by `packaging.metadata` (the
   parser twine check's own metadata checks are built on; twine itself is not in the lock and this runs offline),
   and must carry the version of its pyproject and a non-empty long description of a declared content type.
4. A package is released when its version differs from its record in releases.toml; the development-only testkit
   is never published. --dry-run prints the plan; without it the record is updated for the released packages and
   the tag and `uv publish` commands to run are printed (publishing needs credentials this script never reads).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from packaging.metadata import Metadata
from release_check import RECORD, digest, problems, read_record, workspace

DEV_ONLY = {"ascend-testkit", "ascend-contracts"}


def core_metadata(artefact: Path) -> str:
    if artefact.suffix == ".whl":
        with zipfile.ZipFile(artefact) as whl:
            return whl.read(next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    with tarfile.open(artefact) as sdist:
        member = next(m for m in sdist.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO"))
        return sdist.extractfile(member).read().decode()


def check_artefact(artefact: Path, expected_name: str, expected_version: str) -> list[str]:
    try:
        meta = Metadata.from_email(core_metadata(artefact), validate=True)
    except Exception as exc:  # ExceptionGroup of every invalid field, or a missing file in the artefact
        return [f"{artefact.name}: invalid core metadata: {exc!r}"]
    out = []
    if meta.name != expected_name or str(meta.version) != expected_version:
        out.append(f"{artefact.name}: metadata says {meta.name} {meta.version}, pyproject {expected_name} "
                   f"{expected_version}")
    if not (meta.description or "").strip() or meta.description_content_type is None:
        out.append(f"{artefact.name}: no long description or no Description-Content-Type")
    return out


def build(root: Path, out: Path) -> None:
    subprocess.run(["uv", "build", "--all-packages", "--no-sources", "-q", "-o", str(out)], cwd=root, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="build and check, print the plan, change nothing")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--out", type=Path, help="where the artefacts go (default: a temporary folder)")
    args = parser.parse_args(argv)
    root = args.root.resolve()

    found = problems(root)
    if found:
        print("\n".join(found) + "\nrelease: the release check failed; nothing built", file=sys.stderr)
        return 1
    out = args.out or Path(tempfile.mkdtemp(prefix="ascend-release-"))
    build(root, out)
    packages = workspace(root)
    record = read_record(root)
    bad, plan = [], []
    for name, package in sorted(packages.items()):
        version = str(package.version)
        stem = f"{name.replace('-', '_')}-{version}"
        artefacts = sorted(out.glob(f"{stem}-*.whl")) + sorted(out.glob(f"{stem}.tar.gz"))
        if len(artefacts) != 2:
            found_names = [a.name for a in artefacts]
            bad.append(f"{name} {version}: expected one wheel and one sdist in {out}, found {found_names}")
            continue
        for artefact in artefacts:
            bad.extend(check_artefact(artefact, name, version))
        last = record.get(name, {}).get("version")
        if name in DEV_ONLY:
            state = "not published (development only)"
        elif last == version:
            state = f"unchanged since its release {last}: not published"
        else:
            state = f"publish (last release {last or 'none'}), tag {name}-v{version}"
            plan.append((package, artefacts))
        print(f"{name:20} {version:8} {state}")
        for artefact in artefacts:
            print(f"    {artefact.name}")
    if bad:
        print("\n".join(bad) + "\nrelease: metadata check failed", file=sys.stderr)
        return 1
    print(f"metadata: {2 * len(packages)} artefacts valid (packaging.metadata, validate=True); artefacts in {out}")
    files = " ".join(str(a) for _, artefacts in plan for a in artefacts)
    if args.dry_run:
        print(f"dry run: would publish {len(plan)} package(s): uv publish {files}" if plan else
              "dry run: nothing to publish")
        return 0
    _record(root / RECORD, record, plan)
    print(f"recorded in {RECORD}; now run:")
    for package, _ in plan:
        print(f"  git tag {package.name}-v{package.version}")
    print(f"  uv publish {files}")
    return 0


def _record(path: Path, record: dict, plan: list) -> None:
    for package, _ in plan:
        record[package.name] = {"version": str(package.version), "digest": digest(package)}
    header = [line for line in path.read_text().splitlines() if line.startswith("#")] if path.exists() else []
    body = [f'\n[package.{name}]\nversion = "{entry["version"]}"\ndigest = "{entry["digest"]}"'
            for name, entry in record.items()]
    path.write_text("\n".join(header) + "\n" + "\n".join(body) + "\n")


if __name__ == "__main__":
    sys.exit(main())
