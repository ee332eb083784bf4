"""`ascend-vllm contracts check --torch-npu` and `pin-torch-npu`: our pins and call sites on the 2.13.0 wheel, and a
synthetic workspace with planted drift, a wrong call and an unpinned one."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from ascend_contracts.cli import main
from ascend_contracts.torch_npu_check import Sources, generate_pins
from ascend_contracts.torch_npu_pins import TORCH_NPU_PINS_FILE, load_op_pins, render_op_pins
from ascend_contracts.torch_npu_wheel import TorchNpuWheel

WORKSPACE = Path(__file__).resolve().parents[3]
KERNEL_PINS = WORKSPACE / "packages/ascend-kernels/src/ascend_kernels" / TORCH_NPU_PINS_FILE


def test_our_call_sites_and_pins_are_clean_on_the_pinned_release(wheel: TorchNpuWheel,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["check", "--torch-npu", str(wheel.path), "--root", str(WORKSPACE),
                             "--json"])
    data = json.loads(capsys.readouterr().out)
    assert (code, data["findings"], data["uncovered"], data["blocking"]) == (0, [], [], 0)
    pinned = load_op_pins(KERNEL_PINS)
    assert data["torch_npu_version"] == "2.13.0" and data["pinned_from"] == [pinned.torch_npu]
    assert data["pins_checked"] == len(pinned.ops) >= 10 and data["calls_checked"] >= len(pinned.ops)


def test_the_kernel_pins_file_is_what_the_generator_writes(wheel: TorchNpuWheel) -> None:
    rows = generate_pins(wheel, Sources.of_workspace(WORKSPACE))
    assert set(rows) == {"ascend_kernels"}  # torch_npu is called from the NPU backend only
    assert render_op_pins("ascend_kernels", wheel.version, rows["ascend_kernels"]) == KERNEL_PINS.read_text(), \
        "the pins are stale: run `ascend-vllm contracts pin-torch-npu --write`"
    ops = {p.op: p for p in load_op_pins(KERNEL_PINS).ops}
    assert ops["npu_rms_norm"].called_by == ("rms_norm",) and ops["npu_rms_norm"].uses == ("input", "gamma",
                                                                                            "epsilon")
    assert ops["npu_paged_cache_load.out"].via == "torch_npu.atb"


CALLER = """
import importlib

def _torch_npu():
    return importlib.import_module("torch_npu")

def rms_norm(x, w, eps):
    return _torch_npu().npu_rms_norm(x, w, eps)[0]

def silu_and_mul(x):
    return _torch_npu().npu_swiglu(x, dim=-1)

OPS = {"rms_norm": rms_norm, "silu_and_mul": silu_and_mul}
"""


def _workspace(root: Path, source: str) -> Path:
    pkg = root / "packages" / "ascend-x" / "src" / "ascend_x"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "npu.py").write_text(textwrap.dedent(source))
    return pkg


def test_drift_wrong_calls_and_unpinned_ops_exit_1(wheel: TorchNpuWheel, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    pkg = _workspace(tmp_path, CALLER)
    assert main(["pin-torch-npu", "--torch-npu", str(wheel.path), "--root", str(tmp_path), "--write"]) == 0
    pins = pkg / TORCH_NPU_PINS_FILE
    assert "wrote" in capsys.readouterr().out and [p.op for p in load_op_pins(pins).ops] == ["npu_rms_norm",
                                                                                             "npu_swiglu"]
    # As if the pins came from a release where epsilon defaulted to 1e-05 and an op existed that is gone now.
    text = pins.read_text().replace("float epsilon=1e-06", "float epsilon=1e-05")
    text += '\n[[ops]]\nop = "npu_gone"\nvia = "torch_npu"\nnamespace = "npu"\n' \
            'schema = "npu_gone(Tensor x) -> Tensor"\ncalled_by = ["gone"]\nuses = ["x"]\n'
    pins.write_text(text)
    (pkg / "npu.py").write_text(textwrap.dedent(CALLER).replace("dim=-1", 'dim="-1"')
                                + "\ndef top(x):\n    return _torch_npu().npu_top_k_top_p(x)\n")
    assert main(["check", "--torch-npu", str(wheel.path), "--root", str(tmp_path), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    found = {(f["severity"], f["check"], f["symbol"], f["detail"]) for f in data["findings"]}
    assert found >= {
        ("P0", "pins", "torch_npu.npu_gone", "op gone in torch_npu 2.13.0 (pinned: npu_gone(Tensor x) -> Tensor)"),
        ("P1", "pins", "torch_npu.npu_rms_norm(epsilon)", "default 1e-05 -> 1e-06"),
        ("P1", "call", "torch_npu.npu_swiglu(dim)", "'dim' is int, given a literal str"),
        ("P2", "coverage", "torch_npu.npu_gone", "pinned but no call site calls it (regenerate the pins)"),
    }
    stale = [f["detail"] for f in data["findings"] if f["symbol"] == "torch_npu.npu_rms_norm" and f["severity"] == "P2"]
    assert len(stale) == 1 and stale[0].startswith("pins differ from what regenerating them from torch_npu 2.13.0 "
                                                   "gives (schema 'npu_rms_norm(Tensor input, Tensor gamma, float "
                                                   "epsilon=1e-05)")
    assert [(u["op"], u["package"], u["where"]) for u in data["uncovered"]] == \
        [("npu_top_k_top_p", "ascend_x", "ascend_x/npu.py:16 in top()")]
    assert data["blocking"] == sum(1 for f in data["findings"] if f["severity"] in ("P0", "P1"))


def test_pin_generation_prints_unless_told_to_write(wheel: TorchNpuWheel, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    pkg = _workspace(tmp_path, CALLER)
    assert main(["pin-torch-npu", "--torch-npu", str(wheel.path), "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert not (pkg / TORCH_NPU_PINS_FILE).exists()
    assert 'called_by = ["silu_and_mul"]' in out and 'uses = ["input", "dim"]' in out
    assert "# GENERATED, do not edit" in out


def test_bad_torch_npu_arguments_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--torch-npu", "2.13.0", "--vllm", "0.33.0"]) == 2
    assert "check --vllm/--baseline in a separate run" in capsys.readouterr().err
    assert main(["check", "--torch-npu", "not-a-release", "--root", str(tmp_path)]) == 2
    assert "not a torch_npu version nor an existing path: 'not-a-release'" in capsys.readouterr().err
    bad = tmp_path / "ascend_y" / TORCH_NPU_PINS_FILE
    bad.parent.mkdir()
    bad.write_text('torch_npu = "2.13.0"\n[[ops]]\nop = "npu_x"\nvia = "torch_npu"\nnamespace = "npu"\n'
                   'schema = "npu_x(Tensor a) -> Tensor"\nuses = ["b"]\n')
    assert main(["check", "--torch-npu", "2.13.0", "--pins", str(bad), "--root", str(tmp_path)]) == 2
    assert "uses ['b'] are not parameters of its schema" in capsys.readouterr().err
