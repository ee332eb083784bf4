"""FIA's sparse_mode: which keys each query row sees, and the atten_mask form each mode demands.

Mask convention (torch_npu's): True / 1 masks a position out. Modes, with i the query row and j the key of one
request of q_len queries over kv_len keys:
  0  defaultMask: no mask -> everything (pre/next ignored); a full mask -> ~mask and -pre <= j - i <= next
  1  allMask: a full mask, pre/next ignored
  2  leftUpCausal: j <= i                                       (the compressed 2048x2048 mask)
  3  rightDownCausal: j <= i + kv_len - q_len                   (the compressed 2048x2048 mask)
  4  band from the bottom-right corner: -pre <= j - i - (kv_len - q_len) <= next   (the compressed mask)
A full mask is (1, Q_S, KV_S), (B, 1, Q_S, KV_S) or (1, 1, Q_S, KV_S), padded sizes allowed, plus (Q_S, KV_S) when
Q_S > 1 and (B, KV_S) when Q_S = 1 for BSH/BSND/BNSD without rope. The compressed mask is the strictly upper
triangle of a 2048x2048 matrix, (2048, 2048), (1, 2048, 2048) or (1, 1, 2048, 2048). TND takes only mode 0 without a
mask, 3 or 4. With a batch-major query of S = 1 and no rope (the IncreFlashAttention branch) sparse_mode, pre_tokens
and next_tokens have no effect.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ascend_testkit.torch_npu.attention.refusals import refuse, require_contiguous, require_dtype, unmodelled

COMPRESSED_MASK_SIZE = 2048
MASK_DTYPES = (torch.bool, torch.int8, torch.uint8)
SPARSE_DEFAULT, SPARSE_ALL, SPARSE_LEFT_UP, SPARSE_RIGHT_DOWN, SPARSE_BAND = 0, 1, 2, 3, 4
_COMPRESSED_MODES = (SPARSE_LEFT_UP, SPARSE_RIGHT_DOWN, SPARSE_BAND)


@dataclass(frozen=True)
class Visibility:
    mode: int  # the mode in effect (0 when the incremental branch ignores the one given)
    pre_tokens: int
    next_tokens: int
    full_mask: torch.Tensor | None  # [B or 1, Q_S, KV_S] bool, True = masked

    def visible(self, request: int, q_len: int, kv_len: int) -> torch.Tensor:
        """[q_len, kv_len] bool, True where query row i may attend key j."""
        i = torch.arange(q_len).unsqueeze(1)
        j = torch.arange(kv_len).unsqueeze(0)
        offset = j - i
        if self.mode == SPARSE_LEFT_UP:
            return offset <= 0
        if self.mode == SPARSE_RIGHT_DOWN:
            return offset <= kv_len - q_len
        if self.mode == SPARSE_BAND:
            shifted = offset - (kv_len - q_len)
            return (shifted >= -self.pre_tokens) & (shifted <= self.next_tokens)
        seen = torch.ones(q_len, kv_len, dtype=torch.bool)
        if self.full_mask is not None:
            mask = self.full_mask[request if self.full_mask.shape[0] > 1 else 0]
            seen = ~mask[:q_len, :kv_len]
            if self.mode == SPARSE_DEFAULT:
                seen &= (offset >= -self.pre_tokens) & (offset <= self.next_tokens)
        return seen


@functools.cache
def _compressed_reference() -> torch.Tensor:
    ones = torch.ones(COMPRESSED_MASK_SIZE, COMPRESSED_MASK_SIZE, dtype=torch.bool)
    return torch.triu(ones, diagonal=1)


def _check_compressed(op: str, mask: torch.Tensor, mode: int) -> None:
    size = COMPRESSED_MASK_SIZE
    if tuple(mask.shape) not in ((size, size), (1, size, size), (1, 1, size, size)):
        refuse(op, f"sparse_mode={mode} needs the compressed {size}x{size} atten_mask ((S, S), (1, S, S) or "
               f"(1, 1, S, S) with S = {size}), got shape {tuple(mask.shape)}")
    if not torch.equal(mask.reshape(size, size).bool(), _compressed_reference()):
        refuse(op, f"sparse_mode={mode} needs atten_mask = triu(ones({size}, {size}), diagonal=1) (True above the "
               "diagonal); the one given differs")


def _full_mask(op: str, mask: torch.Tensor, *, batch: int, q_rows: int, kv_cols: int, short_forms: bool,
               incremental: bool) -> torch.Tensor:
    shape = tuple(mask.shape)
    if mask.dim() == 4 and shape[1] == 1 and shape[0] in (1, batch):
        canonical = mask[:, 0]
    elif mask.dim() == 3 and shape[0] == 1:
        canonical = mask
    elif mask.dim() == 2 and short_forms and not incremental:
        canonical = mask.unsqueeze(0)
    elif mask.dim() == 2 and short_forms and incremental and shape[0] == batch:
        canonical = mask.unsqueeze(1)
    else:
        refuse(op, f"atten_mask shape {shape} is not a full mask form: (1, Q_S, KV_S), (B, 1, Q_S, KV_S), "
               "(1, 1, Q_S, KV_S)" + (", (Q_S, KV_S) or (B, KV_S)" if short_forms else "")
               + f" with B={batch}")
    if canonical.shape[1] < q_rows or canonical.shape[2] < kv_cols:
        refuse(op, f"atten_mask shape {shape} must cover {q_rows} query rows and {kv_cols} key columns")
    return canonical.bool()


def resolve_visibility(op: str, *, sparse_mode: int, atten_mask: torch.Tensor | None, pre_tokens: int,
                       next_tokens: int, token_major: bool, incremental: bool, has_rope: bool, batch: int,
                       q_rows: int, kv_cols: int, q_lens: list[int], kv_lens: list[int],
                       short_mask_forms: bool) -> Visibility:
    if sparse_mode == 9:
        if has_rope:
            unmodelled(op, "sparse_mode", sparse_mode)
        refuse(op, "sparse_mode=9 (tree mask) needs query_rope and key_rope")
    if sparse_mode in (5, 6, 7, 8):
        refuse(op, f"sparse_mode={sparse_mode} is not implemented by FIA (only 0, 1, 2, 3, 4 and 9)")
    if sparse_mode not in (0, 1, 2, 3, 4):
        refuse(op, f"sparse_mode must be 0, 1, 2, 3, 4 or 9, got {sparse_mode}")
    if atten_mask is not None:
        require_dtype(op, "atten_mask", atten_mask, MASK_DTYPES)
        require_contiguous(op, "atten_mask", atten_mask)
    if token_major and not ((sparse_mode == 0 and atten_mask is None) or sparse_mode in (3, 4)):
        refuse(op, f"TND/NTD take sparse_mode 0 without atten_mask, 3 or 4; got sparse_mode={sparse_mode} "
               f"with atten_mask {'given' if atten_mask is not None else 'None'}")
    if sparse_mode in _COMPRESSED_MODES:
        if atten_mask is None:
            refuse(op, f"sparse_mode={sparse_mode} needs the compressed {COMPRESSED_MASK_SIZE}x"
                   f"{COMPRESSED_MASK_SIZE} atten_mask, got None")
        _check_compressed(op, atten_mask, sparse_mode)
    if sparse_mode == SPARSE_ALL and atten_mask is None:
        refuse(op, "sparse_mode=1 (allMask) needs a full atten_mask, got None")
    if sparse_mode == SPARSE_BAND:
        if pre_tokens + next_tokens < 0:
            refuse(op, f"sparse_mode=4 needs a non-empty band: pre_tokens + next_tokens >= 0, got pre_tokens="
                   f"{pre_tokens}, next_tokens={next_tokens}")
        if token_major:
            for index, (q_len, kv_len) in enumerate(zip(q_lens, kv_lens, strict=True)):
                if pre_tokens < -q_len or next_tokens < -kv_len:
                    refuse(op, f"sparse_mode=4 with TND needs pre_tokens >= -q_len and next_tokens >= -kv_len; "
                           f"batch {index} has q_len={q_len}, kv_len={kv_len}, pre_tokens={pre_tokens}, "
                           f"next_tokens={next_tokens}")
    if sparse_mode == SPARSE_RIGHT_DOWN and token_major:
        for index, (q_len, kv_len) in enumerate(zip(q_lens, kv_lens, strict=True)):
            if q_len > kv_len:
                refuse(op, f"sparse_mode=3 with TND needs each batch's query length <= its kv length; batch "
                       f"{index} has {q_len} queries over {kv_len} keys")
    full = None
    if sparse_mode in (SPARSE_DEFAULT, SPARSE_ALL) and atten_mask is not None:
        full = _full_mask(op, atten_mask, batch=batch, q_rows=q_rows, kv_cols=kv_cols,
                          short_forms=short_mask_forms, incremental=incremental)
    if incremental and not has_rope:
        return Visibility(SPARSE_DEFAULT if full is None else SPARSE_ALL, 2**31 - 1, 2**31 - 1, full)
    if sparse_mode == SPARSE_DEFAULT and full is None:
        return Visibility(SPARSE_DEFAULT, 2**31 - 1, 2**31 - 1, None)
    return Visibility(sparse_mode, pre_tokens, next_tokens, full)
