"""Disaggregated prefill of DeepSeek V4 over Mooncake: the decode engine continues from every cache kind a prompt
left behind on the prefill engine, and generates what a single engine generates, recomputing nothing.

The tiny V4 (`ascend_testkit.models.deepseek_v4`: layer 0 sliding-window only, layer 1 compressed with ratio 4 and
the lightning indexer keeping 4 compressed entries; window 16) runs in the simulated lane with four KV cache groups
of different block sizes and page sizes (on the lane's default runner, MRV2, sharing the MLA PD tests' hosts):

- the sliding-window latent cache of each layer (fp8_ds_mla rows, 64-token blocks, window 16), one group per layer;
- the compressed latent cache and the indexer's fp8 key cache of the compressed layer (256-token blocks, one
  compressed entry per 4 tokens);
- the state caches of the two compressors (float32 kv + score rows of the uncompressed tokens, 4-token blocks,
  window 8: the two overlapping groups of 4 a compression reads).

The sliding-window groups keep only their window's blocks on both sides: the prefill hands over its block table with
the out-of-window blocks already freed (null), the decode engine allocates only the window's blocks, and the
connector moves exactly those. The prompts cross the window (17), several compressions past the indexer's reach
(40), a sliding-window block edge (65), and a compressed block edge with out-of-window latent blocks left behind
(260), so the decode's first tokens read the moved window rows, the moved compressor states (the compression the
decode completes at position 67 overlaps 4 prompt tokens), and the moved compressed entries through the indexer's
selection among more entries than it keeps.

The bytes each layer moved are held against the layout (the views' rows per block times the blocks each group keeps),
and each kind is shown to matter: with the decode's pulls leaving that kind's layer behind
(`ascend_testkit.kv_transfer_faults`), some prompt's tokens change, while a control run that leaves nothing behind
gives the single engine's tokens.
"""

from __future__ import annotations

import re

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.mooncake]

PREFILL_PORT = 25100
DECODE_PORT = 25150
MAX_TOKENS = 8
LENGTHS = (17, 40, 65, 260)
KNOCKOUT_LENGTHS = LENGTHS[:-1]  # the 260-token prompt adds run time, not a kind the shorter ones miss
ENGINE = dict(dtype="float32", enforce_eager=True, seed=0, max_model_len=512, max_num_seqs=4)


@pytest.fixture(scope="module")
def v4_model(cache_root):
    from ascend_testkit.models.deepseek_v4 import cached_tiny_deepseek_v4

    return cached_tiny_deepseek_v4(cache_dir=cache_root / "models")


@pytest.fixture(scope="module")
def dsv4_pd_engines(pd_pair, v4_model):
    with pd_pair(v4_model, "dsv4", (PREFILL_PORT, DECODE_PORT), **ENGINE) as pair:
        yield pair


# Each cache kind as a pattern over the layer names vLLM's V4 gives its cache layers.
KINDS = {
    "sliding-window latent, layer 0": r"model\.layers\.0\.attn\.swa_cache",
    "sliding-window latent, layer 1": r"model\.layers\.1\.attn\.swa_cache",
    "compressed latent": r"model\.layers\.\d+\.attn",
    "indexer keys": r"model\.layers\.\d+\.attn\.indexer\.k_cache",
    "compressor state": r"model\.layers\.\d+\.attn\.compressor\.state_cache",
    "indexer compressor state": r"model\.layers\.\d+\.attn\.indexer\.compressor\.state_cache",
}


def kind_of(layer: str) -> str:
    (kind,) = [k for k, pattern in KINDS.items() if re.fullmatch(pattern, layer)]
    return kind


def kept_blocks(n: int, block_size: int, window: int | None) -> int:
    """Blocks of an n-token prompt a group keeps once it is computed: all of them, or for a sliding window those
    holding its last `window` tokens (vLLM frees the blocks before them, on both engines)."""
    blocks = -(-n // block_size)
    return blocks - (max(0, n - window + 1) // block_size if window else 0)


@pytest.fixture(scope="module")
def dsv4_pd_run(dsv4_pd_engines, prompt_token_ids, v4_model, disaggregate):
    prefill, decode = dsv4_pd_engines
    prompts = prompt_token_ids(v4_model, LENGTHS, 7)
    single, outs, stats = disaggregate(prefill, decode, prompts, MAX_TOKENS, "dsv4")
    groups = decode.rpc("ascend_testkit.kv_probes:kv_groups")[0]
    layer_kv = decode.rpc("ascend_testkit.kv_probes:layer_kv")[0]
    return {"prompts": prompts, "single": single, "outs": outs, "stats": stats, "groups": groups,
            "layer_kv": layer_kv}


@pytest.fixture(scope="module")
def dsv4_knockouts(dsv4_pd_engines, prompt_token_ids, v4_model, disaggregate):
    """Per cache kind: disaggregated runs (fresh prompts) whose pulls leave that kind's layers behind."""
    prefill, decode = dsv4_pd_engines
    out = {}
    try:
        # "nothing": the control, every layer read (fresh prompts give the single engine's tokens too).
        for stride, (kind, pattern) in enumerate([("nothing", None), *KINDS.items()], start=11):
            hit = decode.rpc("ascend_testkit.kv_transfer_faults:skip_layers_in_pulls", [pattern] if pattern else [])[0]
            prompts = prompt_token_ids(v4_model, KNOCKOUT_LENGTHS, stride)
            single, outs, stats = disaggregate(prefill, decode, prompts, MAX_TOKENS, f"dsv4-ko{stride}",
                                               sampling={"logprobs": 1})
            out[kind] = {"layers": hit, "single": single, "outs": outs, "stats": stats}
    finally:
        decode.rpc("ascend_testkit.kv_transfer_faults:skip_layers_in_pulls", [])
    return out


def test_disaggregated_v4_output_equals_single_engine(dsv4_pd_run, dsv4_pd_engines):
    run = dsv4_pd_run
    stats = run["stats"]
    for (k, ids), out, ref in zip(run["prompts"].items(), run["outs"], run["single"], strict=True):
        assert len(ids) == int(k.removeprefix("len"))
        assert len(ref["token_ids"]) == MAX_TOKENS
        assert out["token_ids"] == ref["token_ids"], k
        loaded = [v for r, v in stats["scheduler"]["loaded_tokens"].items() if r.startswith(f"d-{k}")]
        assert loaded == [len(ids)], (k, loaded)  # every cache came over Mooncake: nothing was recomputed
        pulled = [v for r, v in stats["worker"]["pulled"].items() if r.startswith(f"d-{k}")]
        assert len(pulled) == 1 and pulled[0]["ok"], pulled
    assert stats["worker"]["pulls_failed"] == 0
    counts = dsv4_pd_engines[1].usage()[0]["counts"]
    # The decode engine's indexer chose among more compressed entries than it keeps, over the keys that came over.
    assert counts.get("attention.ascend_dsa.indexed_tokens", 0) > 0, counts


def test_every_cache_kind_moved_exactly_its_kept_pages(dsv4_pd_run):
    run = dsv4_pd_run
    layers = {name: g for g in run["groups"] for name in g["layers"]}
    assert {kind_of(name) for name in layers} == set(KINDS)  # the four cache groups hold these six kinds
    assert all(g["enable_kv_transfer"] for g in run["groups"])
    totals: dict[str, int] = {}
    pulled = {}
    for k, ids in run["prompts"].items():
        (pulled[k],) = [v for r, v in run["stats"]["worker"]["pulled"].items() if r.startswith(f"d-{k}")]
        expected = {}
        for name, group in layers.items():
            view = run["layer_kv"][name]
            page = view["bytes_per_token"] * view["states_per_block"]  # a block's rows, as the views lay them out
            expected[name] = kept_blocks(len(ids), group["block_size"], group["sliding_window"]) * page
        assert pulled[k]["layer_bytes"] == expected, k
        assert pulled[k]["nbytes"] == sum(expected.values())
        for name, nbytes in expected.items():
            totals[kind_of(name)] = totals.get(kind_of(name), 0) + nbytes
    print("bytes moved per cache kind over", list(run["prompts"]), totals)
    # The windows' out-of-window pages stayed behind. 65 tokens: of the compressor's 17 state blocks (4 tokens of
    # 2 x 1024 float32 each) the window of 8 keeps 3; of the sliding-window latent's two 64-token blocks of 584-byte
    # rows the window of 16 keeps both (tokens 50-64); the compressed caches' one 256-token block holds 16 entries.
    len65 = pulled["len65"]["layer_bytes"]
    assert len65["model.layers.1.attn.compressor.state_cache"] == 3 * 4 * 2 * 1024 * 4
    assert len65["model.layers.0.attn.swa_cache"] == 2 * 64 * 584
    assert len65["model.layers.1.attn"] == 64 * 584
    # 17 tokens: the window of 8 keeps tokens 10-16, state blocks 2-4.
    assert pulled["len17"]["layer_bytes"]["model.layers.1.attn.compressor.state_cache"] == 3 * 4 * 8192
    # 260 tokens: the latent window (tokens 245-259) keeps 2 of 5 blocks, the compressor's (253-259) 2 of 65; the 65
    # compressed entries take two 256-token blocks (64 entries of 584 bytes each, the indexer's 132 bytes each).
    len260 = pulled["len260"]["layer_bytes"]
    assert len260["model.layers.1.attn.swa_cache"] == 2 * 64 * 584
    assert len260["model.layers.1.attn.compressor.state_cache"] == 2 * 4 * 8192
    assert len260["model.layers.1.attn"] == 2 * 64 * 584
    assert len260["model.layers.1.attn.indexer.k_cache"] == 2 * 64 * 132


def drift(run: dict) -> dict[int, float | str]:
    """Per prompt length: how far the decode strayed from the single engine ("tokens" if they differ, else the
    largest difference of the chosen tokens' logprobs)."""
    out: dict[int, float | str] = {}
    for n, o, r in zip(KNOCKOUT_LENGTHS, run["outs"], run["single"], strict=True):
        if o["token_ids"] != r["token_ids"]:
            out[n] = "tokens"
        else:
            out[n] = max(abs(a[str(t)] - b[str(t)]) for t, a, b in zip(o["token_ids"], o["logprobs"], r["logprobs"],
                                                                       strict=True))
    return out


def test_each_cache_kind_left_behind_changes_the_decode(dsv4_knockouts):
    runs = dict(dsv4_knockouts)
    control = runs.pop("nothing")
    assert control["layers"] == []
    assert [o["token_ids"] for o in control["outs"]] == [r["token_ids"] for r in control["single"]]
    # Decoding after a transfer is the single engine's decode up to float32 rounding (~1e-6 here).
    assert all(d < 1e-4 for d in drift(control).values()), drift(control)
    changed = {}
    for kind, run in runs.items():
        assert [kind_of(name) for name in run["layers"]] == [kind], run["layers"]  # one layer each in this model
        (layer,) = run["layers"]
        for p in list(run["stats"]["worker"]["pulled"].values())[-len(KNOCKOUT_LENGTHS):]:
            assert p["ok"] and layer not in p["layer_bytes"], p  # the pull ran, without that layer
        changed[kind] = drift(run)
    print("drift with the kind left behind:", changed)
    # Every kind is read by the decode: without it some prompt's tokens, or its chosen tokens' logprobs far past the
    # control's rounding, change. The compressor states reach the output only through the one or two compressed
    # entries the decode's first tokens complete (positions 19/23, 43/47, 67/71 overlap the prompt's last 4 states),
    # and the indexer compressor's only through the indexer's top-4 choice, so on some prompts they move logprobs
    # without flipping a token, or (indexer compressor state, 65 tokens) nothing visible.
    assert all(any(d == "tokens" or d > 1e-2 for d in drifts.values()) for drifts in changed.values()), changed
