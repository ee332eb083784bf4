"""transformers' DeepSeek-V4 in float64, the reference for tiny V4 checkpoints (`ascend_testkit.models.deepseek_v4`).

It runs the whole sequence every step (no cache to differ) with eager attention and eager experts (transformers'
grouped-mm experts take no float64). Its indexer scores in full precision; vLLM's scores fp8-quantized queries and
keys and its KV cache holds the latent in DeepSeek's fp8_ds_mla format, so an engine is expected to match this only
where no score or logit sits on a rounding edge; `storage="fp8_ds_mla"` rounds the cached rows as the engine stores
them (`deepseek_v4_storage`).
"""

from __future__ import annotations


def load_float64_v4(model, *, index_topk: int | None = None, storage: str | None = None):
    """The checkpoint as transformers' DeepseekV4ForCausalLM in float64; `index_topk` overrides every indexer's
    (a value above every compressed length makes the compressed-sparse layers dense); `storage` rounds the rows an
    engine caches as that cache format holds them (`deepseek_v4_storage.STORAGES`)."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float64, attn_implementation="eager",
                                              experts_implementation="eager").eval()
    if index_topk is not None:
        for layer in hf.model.layers:
            indexer = getattr(getattr(layer.self_attn, "compressor", None), "indexer", None)
            if indexer is not None:
                indexer.index_topk = index_topk
    if storage is not None:
        from ascend_testkit.models.deepseek_v4_storage import store_like

        store_like(hf, storage)
    return hf


def float64_v4_outputs(model, prompts: list[str], max_tokens: int, logprobs: int, *,
                       index_topk: int | None = None, storage: str | None = None) -> list[dict]:
    """Greedy generation with transformers' DeepSeek-V4 in float64, in the engine harness's output format."""
    from transformers import AutoTokenizer

    from ascend_testkit.compare import greedy_float64

    return greedy_float64(load_float64_v4(model, index_topk=index_topk, storage=storage),
                          AutoTokenizer.from_pretrained(model), prompts, max_tokens, logprobs)
