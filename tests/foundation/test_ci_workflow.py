""".github/workflows/ci.yml matches the workspace: its package matrix is the members, each member's path filter is
its own folder plus every member it depends on (from the pyprojects, transitively; plus the dev-only members its
suite uses as test tools, read from scripts/test-package), and its jobs call the repository's scripts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github/workflows/ci.yml"
SHARED = {"uv.lock", "pyproject.toml", "scripts/test-package"}  # every package environment is made from these
META = "ascend-vllm"


def _projects() -> dict[str, tuple[str, dict]]:
    """name -> (folder relative to the root, [project] table), the meta-package included."""
    found = {}
    for pyproject in [ROOT / "pyproject.toml", *sorted((ROOT / "packages").glob("*/pyproject.toml"))]:
        project = tomllib.loads(pyproject.read_text())["project"]
        found[project["name"]] = (str(pyproject.parent.relative_to(ROOT)), project)
    return found


def _internal_deps(project: dict, names: set[str]) -> set[str]:
    reqs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        reqs.extend(extra)
    return {n for n in (re.split(r"[ \[<>=!~;]", r, maxsplit=1)[0].lower() for r in reqs) if n in names}


def _tool_members() -> dict[str, set[str]]:
    text = (ROOT / "scripts/test-package").read_text()
    block = re.search(r"declare -A TOOL_MEMBERS=\((.*?)\)\n", text).group(1)
    return {k: set(v.split()) for k, v in re.findall(r'\[([\w-]+)\]="([^"]*)"', block)}


def _closure(name: str, graph: dict[str, set[str]]) -> set[str]:
    seen, todo = set(), [name]
    while todo:
        for dep in graph[todo.pop()]:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def _flatten(items) -> list[str]:
    out = []
    for item in items:
        out.extend(_flatten(item) if isinstance(item, list) else [item])
    return out


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


@pytest.fixture(scope="module")
def filters(workflow) -> dict[str, set[str]]:
    step = next(s for s in workflow["jobs"]["changes"]["steps"] if s.get("id") == "filter")
    assert step["uses"].startswith("dorny/paths-filter@"), step
    return {name: set(_flatten(paths)) for name, paths in yaml.safe_load(step["with"]["filters"]).items()}


def test_the_package_filters_are_the_workspace_members(filters):
    members = {n for n in _projects() if n != META}
    assert set(filters) == members
    script = (ROOT / "scripts/test-package").read_text()
    listed = set(re.search(r"^MEMBERS=\((.*)\)$", script, flags=re.MULTILINE).group(1).split())
    assert listed == members, "scripts/test-package's MEMBERS differ from the workspace"


def test_a_change_to_a_member_runs_it_and_every_member_depending_on_it(filters):
    projects = _projects()
    names = set(projects)
    graph = {n: _internal_deps(p, names) for n, (_, p) in projects.items()}
    for name, tools in _tool_members().items():
        graph[name] |= tools
    for member, paths in filters.items():
        expected = {f"{projects[d][0]}/**" if d != META else "src/**" for d in {member} | _closure(member, graph)}
        own = paths - SHARED
        assert own == expected, f"{member}: the filter has {sorted(own)}, expected {sorted(expected)}"
        assert paths >= SHARED, f"{member}: the filter lacks {sorted(SHARED - paths)}"


def test_the_jobs_call_the_repository_scripts(workflow):
    jobs = workflow["jobs"]
    assert jobs["package"]["strategy"]["matrix"]["package"] == "${{ fromJSON(needs.changes.outputs.packages) }}"
    runs = {name: " ".join(s.get("run", "") for s in job["steps"]) for name, job in jobs.items()}
    assert "scripts/test-package ${{ matrix.package }}" in runs["package"]
    assert "scripts/test-all" in runs["cross-package"]
    assert jobs["cross-package"].get("needs") is None and jobs["cross-package"].get("if") is None, \
        "the cross-package stage runs on every change"
    assert jobs["cross-package"]["steps"][-1]["env"]["TEST_ALL_SKIP"] == "packages"
    assert "scripts/release_check.py" in runs["release-check"]
    for script in re.findall(r"scripts/[\w.-]+", " ".join(runs.values())):
        assert (ROOT / script).is_file(), f"the workflow calls {script}, which does not exist"
