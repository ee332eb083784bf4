"""`ascend-vllm contracts` as CI runs it on the installed vLLM: no uncovered P0/P1 drift, every used symbol pinned."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ascend_testkit.reach.collect import reach_env

ROOT = Path(__file__).resolve().parents[2]
CLI = shutil.which("ascend-vllm") or str(Path(sys.executable).with_name("ascend-vllm"))


def _run(*args: str, **extra_env: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "ASCEND_VLLM_SIMULATE"} | reach_env() | extra_env
    return subprocess.run([CLI, "contracts", *args], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)


def _json(stdout: str) -> dict:
    """The command's JSON document (vLLM may log to stdout before it)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("{"))
    return json.loads("\n".join(lines[start:]))


def test_installed_vllm_has_no_uncovered_p0_p1_drift():
    out = _run("check", "--json")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = _json(out.stdout)
    blocking = [f for f in report["findings"] if f["severity"] in ("P0", "P1") and not f.get("covered_by")]
    assert not blocking and report["blocking"] == 0, blocking


def test_every_vllm_symbol_our_sources_use_is_pinned():
    out = _run("scan", "--json")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = _json(out.stdout)
    assert set(result["usages"]) >= {"ascend_core", "ascend_platform", "ascend_vllm"}  # every package was read
    assert not any(result["unpinned"].values()), result["unpinned"]


def _vllm_tree(root: Path, edit=lambda text: text) -> Path:
    """A vLLM source folder holding the installed `vllm.v1.kv_cache_interface`, optionally edited (a 'release')."""
    import vllm

    installed = Path(vllm.__file__).parent
    for rel in ("__init__.py", "v1/__init__.py"):
        (root / "vllm" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "vllm" / rel).write_text((installed / rel).read_text())
    module = "v1/kv_cache_interface.py"
    (root / "vllm" / module).write_text(edit((installed / module).read_text()))
    return root


def test_drift_between_two_releases_names_the_removed_field_and_its_adapter(tmp_path):
    old = _vllm_tree(tmp_path / "old")
    new = _vllm_tree(tmp_path / "new", lambda text: text.replace("    host_resident: bool = False\n", "", 1))
    pins = Path(__file__).resolve().parents[2] / "packages/ascend-core/src/ascend_core/upstream_pins.toml"
    out = _run("check", "--pins", str(pins), "--baseline", str(old), "--vllm", str(new), "--json")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]  # the one change is covered by an adapter
    findings = _json(out.stdout)["findings"]
    removed = [f for f in findings if f["symbol"] == "vllm.v1.kv_cache_interface.KVCacheTensor.host_resident"]
    assert removed and removed[0]["severity"] == "P1" and "removed" in removed[0]["detail"], findings
    assert removed[0]["covered_by"] == "ascend_core.upstream.make_kv_tensor"
    assert all(f["symbol"].startswith("vllm.v1.kv_cache_interface.KVCacheTensor") for f in findings), findings


def test_scan_suggest_drafts_a_pin_for_an_unpinned_symbol(tmp_path):
    package = tmp_path / "packages/demo/src/demo"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "upstream_pins.toml").write_text(
        '[[pins]]\nsymbol = "vllm.v1.kv_cache_interface.KVCacheTensor"\nkind = "dataclass"\n')
    (package / "specs.py").write_text("from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheTensor\n\n"
                                      "SPEC, TENSOR = FullAttentionSpec, KVCacheTensor\n")
    out = _run("scan", "--root", str(tmp_path), "--suggest")
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "-- demo: 2 vLLM symbols used, 1 unpinned" in out.stdout, out.stdout
    draft = out.stdout.split("draft pins for demo", 1)[1]
    assert 'symbol = "vllm.v1.kv_cache_interface.FullAttentionSpec"' in draft and 'kind = "class"' in draft
    assert "KVCacheTensor" not in draft


def test_fetch_refuses_what_is_not_a_release_by_name():
    out = _run("fetch", "latest-main")
    assert out.returncode == 2 and "not a release version: 'latest-main'" in out.stderr, out.stderr


def test_torch_npu_call_sites_and_pins_hold_on_the_pinned_and_the_next_release(tmp_path):
    """`contracts check --torch-npu` as a user runs it: the wheel fetched (cached), every pinned op and every call
    site of the NPU backend held to that release's schemas."""
    from ascend_contracts.torch_npu_wheel import open_torch_npu_wheel

    pins = ROOT / "packages/ascend-kernels/src/ascend_kernels/torch_npu_pins.toml"
    # A wheel cache holding the wheel alone (no parsed-schema sidecar): the CLI reads the schemas from the wheel's
    # libraries itself, as it does the first time on a machine.
    shutil.copy(open_torch_npu_wheel("2.13.0").path, tmp_path)
    fresh = _run("check", "--torch-npu", "2.13.0", "--json", ASCEND_VLLM_WHEELS=str(tmp_path))
    assert fresh.returncode == 0 and _json(fresh.stdout)["findings"] == [], fresh.stdout[-3000:] + fresh.stderr[-3000:]
    assert list(tmp_path.glob("*.schemas.json")), "the CLI parsed the wheel and left its sidecar"
    generated = _run("pin-torch-npu")
    assert generated.returncode == 0, generated.stdout[-3000:] + generated.stderr[-3000:]
    assert pins.read_text() in generated.stdout  # the committed pins are what the generator writes
    for release in ("2.13.0", "2.14.0"):
        out = _run("check", "--torch-npu", release, "--json")
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        report = _json(out.stdout)
        assert report["torch_npu_version"] == release and report["calls_checked"] >= 20, report
        assert report["findings"] == [] and report["uncovered"] == [] and report["blocking"] == 0, report
    table = _run("check", "--torch-npu", "2.13.0")
    assert table.returncode == 0 and "0 blocking" in table.stdout, table.stdout[-2000:]
