"""The plugin's typed configuration, built from vLLM's `additional_config`.

`additional_config` is a free-form dict on vLLM's side; here it becomes a frozen, validated model. An unknown key
or a bad value stops start-up with one line that names the key and what is allowed, instead of being ignored.
Every option is documented on its field; `ascend-vllm options` prints them (`describe_options()`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

ADDITIONAL_CONFIG_KEY = "ascend"  # options may also be nested under this key


class AscendConfigError(Exception):
    """A bad `additional_config`; the message is one line naming the key and the allowed values.

    Deliberately not a ValueError: it is raised while vLLM's pydantic `VllmConfig` is being built, and pydantic
    would fold a ValueError into a multi-line ValidationError.
    """


class AscendConfig(BaseModel):
    """Options of the Ascend plugin, read from `--additional-config` / `LLM(additional_config=...)`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    chip: Literal["auto", "A2", "A3", "310P"] = Field(
        "auto", description="Ascend chip family; 'auto' asks torch_npu. 310P selects its own attention backend "
        "and private per-layer KV buffers.")
    graph_mode: Literal["auto", "eager", "piecewise", "full", "full_and_piecewise"] = Field(
        "auto", description="Graph capture: 'piecewise', 'full' (FULL graphs for uniform decodes only) or "
        "'full_and_piecewise' (FULL for uniform decodes, PIECEWISE for mixed batches); 'auto' is eager when "
        "enforce_eager is set or in the simulated lane (which records what it would capture when a mode is given), "
        "piecewise otherwise.")
    graph_capture_sizes: tuple[int, ...] | None = Field(
        None, description="Batch sizes to capture graphs for (ascending, positive); default derived from "
        "max_num_seqs.")
    kv_cache_mode: Literal["auto", "shared", "private"] = Field(
        "auto", description="KV backing: 'shared' consumes vLLM's one backing buffer, 'private' gives each layer "
        "its own buffers; 'auto' is private on 310P, shared elsewhere.")
    kernel_backend: Literal["auto", "reference", "npu"] = Field(
        "auto", description="ascend_kernels backend: 'auto' is npu on a device and reference in the simulated lane; "
        "'npu' in the simulated lane needs a usable torch_npu in every engine process (the testkit's, "
        "ASCEND_TESTKIT_TORCH_NPU=1) and stops start-up with the reason otherwise.")
    kernel_checks: bool = Field(
        False, description="Check every ascend_kernels call's arguments (shapes, dtypes, devices); off on the hot "
        "path by default.")
    custom_ops: bool = Field(
        True, description="Replace vLLM's RMSNorm, SiluAndMul and RotaryEmbedding with ascend_kernels ops.")
    block_size: int | None = Field(
        None, description="KV block size when the user gave none (multiple of 16); default 128.")
    eplb: bool = Field(
        False, description="Expert-parallel load balancing of MoE models (needs enable_expert_parallel over >= 2 "
        "ranks): per-expert load recorded every step, experts re-placed with redundant copies and moved between "
        "ranks every eplb_interval steps.")
    eplb_redundant_experts: int = Field(
        0, ge=0, description="Extra expert slots for EPLB replicas (a multiple of the expert-parallel size).")
    eplb_interval: int = Field(
        3000, ge=0, description="Engine steps between EPLB rebalances; 0 rebalances only when asked "
        "(ascend_platform.moe.eplb.current_controller().rebalance()).")

    @field_validator("graph_capture_sizes")
    @classmethod
    def _sizes_positive_ascending(cls, v: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if v is not None and (not v or any(s <= 0 for s in v) or list(v) != sorted(set(v))):
            raise ValueError("must be a non-empty ascending list of distinct positive integers")
        return v

    @field_validator("block_size")
    @classmethod
    def _block_multiple_of_16(cls, v: int | None) -> int | None:
        if v is not None and (v <= 0 or v % 16):
            raise ValueError("must be a positive multiple of 16")
        return v


def _allowed(field: str) -> str:
    info = AscendConfig.model_fields[field]
    args = getattr(info.annotation, "__args__", ())
    literals = [a for a in args if isinstance(a, str)]
    if literals:
        return ", ".join(repr(a) for a in literals)
    return info.description or str(info.annotation)


def _one_line(exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "<root>"
        top = str(err["loc"][0]) if err["loc"] else ""
        if err["type"] == "extra_forbidden":
            problems.append(f"unknown key {key!r} (known keys: {', '.join(sorted(AscendConfig.model_fields))})")
        elif top in AscendConfig.model_fields and err["type"] == "literal_error":
            problems.append(f"bad value {err.get('input')!r} for key {key!r} (allowed: {_allowed(top)})")
        elif top in AscendConfig.model_fields:
            problems.append(f"bad value {err.get('input')!r} for key {key!r} ({err['msg']}; {_allowed(top)})")
        else:
            problems.append(f"{key}: {err['msg']}")
    return "Invalid Ascend additional_config: " + "; ".join(problems)


def parse_ascend_config(additional_config: Mapping[str, Any] | None) -> AscendConfig:
    """Validate `additional_config` (flat, or nested under the 'ascend' key) into an `AscendConfig`."""
    raw = dict(additional_config or {})
    if ADDITIONAL_CONFIG_KEY in raw:
        nested = raw.pop(ADDITIONAL_CONFIG_KEY)
        if not isinstance(nested, Mapping):
            raise AscendConfigError(
                f"Invalid Ascend additional_config: key {ADDITIONAL_CONFIG_KEY!r} must be a mapping")
        raw.update(nested)
    try:
        return AscendConfig(**raw)
    except ValidationError as exc:
        raise AscendConfigError(_one_line(exc)) from None


def describe_options() -> list[tuple[str, str, str]]:
    """(key, default, doc) for every option, for docs and `--help` text."""
    return [(name, repr(f.default), f.description or "") for name, f in AscendConfig.model_fields.items()]
