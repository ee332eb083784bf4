"""The dequantized float twin of a quantized ModelSlim MoE checkpoint (`models.quantized_moe`), for plain vLLM CPU.

Plain vLLM CPU cannot serve int8 / int4 experts on a host without AMX, so the anchor of the quantized MoE engines is
vLLM's own CPU model (float32) on the checkpoint's integers made float: every quantized weight replaced by its
dequantized value (int8, or int4 unpacked here from the checkpoint's bytes, times its per-channel scale, in float64,
stored float32), everything else as written. (transformers in float64 on the twin gives the same tokens.) What the
twin leaves out is the engines' bfloat16 and per-token int8 activations; the checkpoints are conditioned to keep that
noise below their logit margins (`ascend_testkit.models.quantized_moe`). Nothing here calls `ascend_kernels`, and
scale_bias is not read: the engines' int4 kernels depend on it being right, the twin does not.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ascend_testkit.models.checkpoint_cache import built_once
from ascend_testkit.models.quantized import DESCRIPTION_FILE

_QUANT_SUFFIXES = (".weight_scale", ".weight_offset", ".scale_bias")


def _unpack_rows(packed):
    """[N / 2, K] int8 (row 2j low nibble, 2j + 1 high) -> [N, K] int4 values as float64."""
    import torch

    u = packed.view(torch.uint8).to(torch.int16)
    low, high = u & 0xF, u >> 4
    rows = torch.stack([low, high], dim=1).flatten(0, 1)
    return torch.where(rows >= 8, rows - 16, rows).double()


def dequantized(tensors: dict, module: str, kind: str):
    """The float64 weight [N, K] of `module` as the checkpoint stores it at `kind`."""
    q = tensors[f"{module}.weight"]
    scale = tensors[f"{module}.weight_scale"].double()
    values = _unpack_rows(q) if kind == "W4A8_DYNAMIC" else q.double()
    return values * scale.reshape(-1, 1)


def build_dequantized_twin(path: str | os.PathLike, quant_dir: str | os.PathLike) -> Path:
    """Write the float32 twin of the ModelSlim checkpoint `quant_dir` to `path`."""
    from safetensors.torch import load_file, save_file

    path, quant_dir = Path(path), Path(quant_dir)
    path.mkdir(parents=True, exist_ok=True)
    kinds = json.loads((quant_dir / DESCRIPTION_FILE).read_text())
    tensors = {k: v for f in sorted(quant_dir.glob("*.safetensors")) for k, v in load_file(str(f)).items()}
    out = {}
    for key, tensor in tensors.items():
        kind = kinds[key]
        if kind == "FLOAT":
            out[key] = tensor.float()
        elif key.endswith(".weight"):
            out[key] = dequantized(tensors, key.removesuffix(".weight"), kind).float()
        elif not key.endswith(_QUANT_SUFFIXES):
            raise ValueError(f"{key} ({kind}): not a tensor this twin knows how to dequantize")
    save_file(out, str(path / "model.safetensors"))
    config = json.loads((quant_dir / "config.json").read_text())
    config["torch_dtype"] = "float32"
    (path / "config.json").write_text(json.dumps(config, indent=1))
    for item in quant_dir.iterdir():
        if item.suffix != ".safetensors" and item.name not in ("config.json", DESCRIPTION_FILE):
            shutil.copy(item, path / item.name)
    return path


def cached_dequantized_twin(quant_dir: str | os.PathLike) -> Path:
    quant_dir = Path(quant_dir)
    folder = quant_dir.with_name(quant_dir.name + "-dequantized")
    return built_once(folder, lambda tmp: build_dequantized_twin(tmp, quant_dir))
