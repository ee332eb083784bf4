"""The release check (scripts/release_check.py) passes on the workspace and fails on planted inconsistencies.

Planted cases run on a copy of what the check reads (pyprojects, sources, READMEs, changelogs, releases.toml),
with the copy's current state recorded as released first, as `scripts/release` records a published version.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import release_check  # noqa: E402 - scripts/ is not a package
from release_check import digest, problems, workspace  # noqa: E402


def _copy(dest: Path) -> Path:
    for name in ("pyproject.toml", "README.md", "CHANGELOG.md", release_check.RECORD):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "src", dest / "src", ignore=shutil.ignore_patterns("__pycache__"))
    for folder in sorted((ROOT / "packages").iterdir()):
        if (folder / "pyproject.toml").is_file():
            shutil.copytree(folder, dest / "packages" / folder.name,
                            ignore=shutil.ignore_patterns("__pycache__", "tests"))
    return dest


def _record_released(root: Path) -> None:
    lines = [f'[package.{name}]\nversion = "{p.version}"\ndigest = "{digest(p)}"\n'
             for name, p in workspace(root).items()]
    (root / release_check.RECORD).write_text("\n".join(lines))


@pytest.fixture
def released(tmp_path) -> Path:
    root = _copy(tmp_path)
    _record_released(root)
    assert problems(root) == []
    return root


def _bump(folder: Path, version: str, *, changelog: bool) -> None:
    pyproject = folder / "pyproject.toml"
    pyproject.write_text(re.sub(r'^version = ".*"$', f'version = "{version}"', pyproject.read_text(), count=1,
                                flags=re.MULTILINE))
    if changelog:
        path = folder / "CHANGELOG.md"
        head, _, rest = path.read_text().partition("\n## ")
        path.write_text(f"{head}\n## {version}\n\n- planted change\n\n## {rest}")


def test_the_workspace_passes():
    out = subprocess.run(["bash", "scripts/release-check"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("release check: ok"), out.stdout + out.stderr


def _version(root: Path, name: str) -> str:
    return str(workspace(root)[name].version)


def _next_minor(version: str) -> str:
    major, minor, _ = version.split(".")
    return f"{major}.{int(minor) + 1}.0"


def _next_patch(version: str) -> str:
    major, minor, patch = version.split(".")
    return f"{major}.{minor}.{int(patch) + 1}"


def test_a_changed_source_without_a_bump_fails(released):
    (released / "packages/ascend-core/src/ascend_core/planted.py").write_text("PLANTED = True\n")
    found = problems(released)
    released_at = _version(released, "ascend-core")
    assert len(found) == 1 and found[0].startswith(f"ascend-core: sources changed since its release {released_at}"), \
        found


def test_a_changed_readme_or_dependency_counts_as_a_change(released):
    readme = released / "packages/ascend-specdecode/README.md"
    readme.write_text(readme.read_text() + "\nplanted\n")
    assert [p.split(":")[0] for p in problems(released)] == ["ascend-specdecode"]


def test_a_bump_without_a_changelog_entry_fails(released):
    (released / "packages/ascend-testkit/src/ascend_testkit/planted.py").write_text("PLANTED = True\n")
    bumped = _next_patch(_version(released, "ascend-testkit"))
    _bump(released / "packages/ascend-testkit", bumped, changelog=False)
    assert problems(released) == [f"ascend-testkit: version {bumped} has no '## {bumped}' entry in "
                                  "ascend-testkit/CHANGELOG.md"]


def test_a_bump_with_its_changelog_entry_passes(released):
    (released / "packages/ascend-testkit/src/ascend_testkit/planted.py").write_text("PLANTED = True\n")
    _bump(released / "packages/ascend-testkit", _next_patch(_version(released, "ascend-testkit")), changelog=True)
    assert problems(released) == []


def test_a_member_bump_the_meta_pins_and_ranges_do_not_follow_fails(released):
    (released / "packages/ascend-kernels/src/ascend_kernels/planted.py").write_text("PLANTED = True\n")
    was = _version(released, "ascend-kernels")
    bumped = _next_minor(was)
    _bump(released / "packages/ascend-kernels", bumped, changelog=True)
    found = problems(released)
    assert f"ascend-vllm: pins 'ascend-kernels=={was}' but ascend-kernels is at {bumped} (expected =={bumped})" \
        in found, found
    assert any(p.startswith("ascend-core: requires 'ascend-kernels") and f"which excludes ascend-kernels's version "
               f"{bumped}" in p for p in found), found
    assert not any(p.startswith("ascend-kernels:") for p in found), found


def test_a_range_whose_oldest_version_is_untested_fails(released):
    pyproject = released / "packages/ascend-core/pyproject.toml"
    text = pyproject.read_text()
    widened = re.sub(r'"ascend-kernels>=[0-9.]+,<', '"ascend-kernels>=0.1,<', text, count=1)
    assert widened != text, "ascend-core no longer requires ascend-kernels with a lower bound"
    pyproject.write_text(widened)
    _bump(released / "packages/ascend-core", _next_patch(_version(released, "ascend-core")), changelog=True)
    found = problems(released)
    tested = _version(released, "ascend-kernels")
    assert any(f"oldest allowed ascend-kernels is 0.1; only {tested} is tested" in p for p in found), found


def test_a_version_older_than_its_release_fails(released):
    was = _version(released, "ascend-testkit")
    _bump(released / "packages/ascend-testkit", "0.1.9", changelog=True)
    assert f"ascend-testkit: version 0.1.9 is older than its last release {was}" in problems(released)


def test_the_release_dry_run_builds_and_validates_every_artefact_and_records_nothing(tmp_path):
    record_before = (ROOT / release_check.RECORD).read_bytes()
    out = subprocess.run(["bash", "scripts/release", "--dry-run", "--out", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    members = workspace(ROOT)
    assert f"metadata: {2 * len(members)} artefacts valid" in out.stdout, out.stdout
    for name, package in members.items():
        line = next(line for line in out.stdout.splitlines() if line.startswith(f"{name} "))
        assert str(package.version) in line, line
    testkit = next(line for line in out.stdout.splitlines() if line.startswith("ascend-testkit "))
    assert "not published (development only)" in testkit
    assert out.stdout.strip().splitlines()[-1].startswith("dry run: ")
    assert (ROOT / release_check.RECORD).read_bytes() == record_before

