"""Tiny LoRA adapters for the tiny Llama, written in PEFT's folder format without PEFT: `adapter_config.json` plus
`adapter_model.safetensors` holding `base_model.model.model.layers.N.<module>.<proj>.lora_A.weight` (rank x in) and
`...lora_B.weight` (out x rank), as `peft.PeftModel.save_pretrained` writes them and vLLM's LoRA loader reads them.

The factors are random and large enough that an adapter changes the tiny model's greedy tokens (a test can tell
an adapter that was applied from one that was ignored).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ascend_testkit.models.checkpoint_cache import default_cache_dir
from ascend_testkit.models.tiny_llama import TinyModelSpec

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraSpec:
    base: TinyModelSpec = field(default_factory=TinyModelSpec)
    rank: int = 8
    alpha: int = 16
    targets: tuple[str, ...] = ATTENTION + MLP
    std: float = 0.5
    seed: int = 1

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def _shapes(spec: TinyModelSpec) -> dict[str, tuple[int, int]]:
    """(in, out) features of each projection."""
    h, i = spec.hidden_size, spec.intermediate_size
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def build_lora_adapter(path: str | os.PathLike, spec: LoraSpec = LoraSpec(), base_model: str = "") -> Path:
    import torch
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    shapes = _shapes(spec.base)
    unknown = set(spec.targets) - set(shapes)
    if unknown:
        raise ValueError(f"unknown LoRA target modules {sorted(unknown)} (known: {sorted(shapes)})")
    gen = torch.Generator().manual_seed(spec.seed)
    tensors = {}
    for layer in range(spec.base.num_layers):
        for module in spec.targets:
            fan_in, fan_out = shapes[module]
            prefix = f"base_model.model.model.layers.{layer}.{'self_attn' if module in ATTENTION else 'mlp'}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(spec.rank, fan_in, generator=gen) * spec.std
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, spec.rank, generator=gen) * spec.std
    save_file(tensors, str(path / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": spec.rank, "lora_alpha": spec.alpha,
              "lora_dropout": 0.0, "target_modules": list(spec.targets), "bias": "none", "fan_in_fan_out": False,
              "modules_to_save": None, "use_rslora": False, "use_dora": False, "base_model_name_or_path": base_model}
    (path / "adapter_config.json").write_text(json.dumps(config, indent=1))
    return path


def cached_lora_adapter(spec: LoraSpec = LoraSpec(), cache_dir: str | os.PathLike | None = None,
                        base_model: str = "") -> Path:
    """The adapter for `spec`, built once into the cache (the folder name carries the spec's hash)."""
    folder = Path(cache_dir or default_cache_dir()) / f"tiny-lora-{spec.key()}"
    if (folder / "adapter_config.json").exists() and (folder / "adapter_model.safetensors").exists():
        return folder
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    build_lora_adapter(tmp, spec, base_model)
    try:
        tmp.rename(folder)
    except OSError:  # another process built the same adapter first; its copy is identical
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
