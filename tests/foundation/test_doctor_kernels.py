"""The doctor's kernel section: each backend's availability and, per facade op, what the npu backend runs."""

from __future__ import annotations


def test_the_doctor_says_what_the_npu_backend_runs_per_op_and_why_it_cannot_run_here():
    from ascend_kernels import OP_NAMES
    from ascend_vllm.commands import _doctor_kernels

    section = _doctor_kernels.collect()
    assert section["available"]["reference"] is None
    assert "torch_npu is not installed" in section["available"]["npu"]
    assert set(section["npu"]) == set(OP_NAMES)
    assert section["npu"]["paged_attention"]["kind"] == "torch_npu"
    assert section["npu"]["paged_attention"]["target"] == "torch_npu.npu_fused_infer_attention_score_v2"
    assert section["npu"]["sample_greedy"]["kind"] == "torch"
    lines = _doctor_kernels.render(section)
    kernels = sum(info["kind"] == "torch_npu" for info in section["npu"].values())
    assert f"npu backend: {kernels} facade ops on torch_npu kernels, {len(OP_NAMES) - kernels} as the reference" \
        in "\n".join(lines)
    assert any(line.split()[:2] == ["paged_attention", "torch_npu.npu_fused_infer_attention_score_v2"]
               for line in lines)
    assert any("dsv4_* (12 ops)" in line and "sample_greedy" in line for line in lines)
    # one line per backend, a header, one line per torch_npu kernel, the reference ops on one line by name, a footer
    assert len(lines) == len(section["available"]) + 1 + kernels + 2, lines
