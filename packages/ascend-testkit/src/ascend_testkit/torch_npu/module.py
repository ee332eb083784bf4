"""The module object that stands in for `torch_npu` in `sys.modules`.

Ops are exposed where torch_npu exposes them (`torch_npu.<op>` for the `npu` library and ATB's API_LIST,
`torch_npu.atb.<op>` for ATB_API_LIST) as the `torch.ops.<ns>.<op>` packets, so every call goes through the
dispatcher and binds to the wheel's schema. `torch_npu.npu` answers the device questions torch_npu's own Python
asks (`device_count`, the CANN and SoC versions its meta functions branch on).
"""

from __future__ import annotations

import enum
import importlib.machinery
import types

import torch

from ascend_contracts.torch_npu_wheel import TorchNpuWheel
from ascend_testkit.torch_npu import card

MODULE_NAMES = ("torch_npu", "torch_npu.npu", "torch_npu.npu.utils", "torch_npu.npu._backends", "torch_npu.atb",
                "torch_npu.utils", "torch_npu.utils._error_code")


class ErrCode(enum.Enum):
    """The error codes torch_npu's meta functions append to their messages (torch_npu.utils._error_code)."""

    PARAM = (1, "invalid parameter")
    TYPE = (2, "invalid type")
    VALUE = (3, "invalid value")
    INTERNAL = (5, "internal error")
    NOT_SUPPORT = (7, "feature not supported")
    NOT_FOUND = (8, "resource not found")


def ops_error(error: ErrCode) -> str:
    return f"\n[ERROR] ERR01{error.value[0]:03d} OPS {error.value[1]} (testkit torch_npu)"


def _submodule(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    # A spec makes `importlib.util.find_spec("torch_npu")` (the NPU probe's first question) answer as if installed.
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    module.__dict__.update(attrs)
    return module


def build_module(wheel: TorchNpuWheel, ops: list[str]) -> types.ModuleType:
    """`ops`: the op keys (default overloads) the fake defined; each becomes an attribute where torch_npu puts it."""
    module = _submodule("torch_npu", __version__=wheel.version, __file__=f"{wheel.path}!torch_npu/__init__.py")
    module.__testkit_fake__ = True
    utils = _submodule("torch_npu.npu.utils", get_cann_version=card.get_cann_version,
                       _is_gte_cann_version=card.is_gte_cann_version)
    backends = _submodule("torch_npu.npu._backends", get_soc_version=card.get_soc_version)
    module.npu = _submodule(
        "torch_npu.npu", device_count=lambda: card.DEVICE_COUNT, is_available=lambda: card.DEVICE_COUNT > 0,
        current_device=lambda: 0, get_device_name=lambda device=None: card.SOC_NAME, utils=utils, _backends=backends,
        synchronize=lambda device=None: None)
    module.utils = _submodule("torch_npu.utils", _error_code=_submodule(
        "torch_npu.utils._error_code", ErrCode=ErrCode, ops_error=ops_error))
    module.atb = _submodule("torch_npu.atb")
    for op in ops:
        namespace = wheel.namespaces[op]
        packet = getattr(getattr(torch.ops, namespace), op)
        home = module.atb if wheel.atb_exposure.get(op) == "torch_npu.atb" else module
        if namespace == "atb" and op not in wheel.atb_exposure:
            continue  # registered by the ATB library but not exposed by torch_npu
        setattr(home, op, packet)
    return module


def module_tree(module: types.ModuleType) -> dict[str, types.ModuleType]:
    return {"torch_npu": module, "torch_npu.npu": module.npu, "torch_npu.npu.utils": module.npu.utils,
            "torch_npu.npu._backends": module.npu._backends, "torch_npu.atb": module.atb,
            "torch_npu.utils": module.utils, "torch_npu.utils._error_code": module.utils._error_code}
