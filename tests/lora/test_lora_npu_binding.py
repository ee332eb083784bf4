"""What the LoRA ops run on an NPU, held to the torch_npu wheel: 2.13.0 declares no LoRA op (vllm-ascend's
`bgmv_shrink` / `bgmv_expand` / `sgmv_shrink` / `sgmv_expand` are custom ops of its own CANN kernels, not torch_npu's),
so ascend_kernels declares each LoRA op's NPU binding as its reference on the device. A torch_npu release that adds a
LoRA op fails the first test: time to bind it."""

from __future__ import annotations

LORA_OPS = ("bgmv_shrink", "bgmv_expand", "sgmv_shrink", "sgmv_expand")
WORDS = ("lora", "bgmv", "sgmv", "punica")


def test_torch_npu_declares_no_lora_op():
    from ascend_contracts.torch_npu_wheel import open_torch_npu_wheel

    wheel = open_torch_npu_wheel("2.13.0")
    assert len(wheel.schemas) > 100  # the wheel's op schemas were read
    found = {name: schema for name, schema in wheel.schemas.items() if any(w in schema.lower() for w in WORDS)}
    assert not found, f"torch_npu {wheel.version} now declares LoRA ops: {found}"


def test_lora_ops_run_the_reference_on_the_npu_device():
    import ascend_kernels
    from ascend_kernels import op_registry

    npu = ascend_kernels.implementations("npu")
    bindings = op_registry.npu_bindings()
    for op in LORA_OPS:
        assert npu[op] == "ascend_kernels.reference.lora on the NPU device", (op, npu[op])
        assert bindings[op].kind == "torch" and bindings[op].impl is None
        assert "no LoRA op" in bindings[op].note
