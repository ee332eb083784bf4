"""Model Runner V2's logit-bias and bad-words kernels (`vllm/v1/worker/gpu/sample/logit_bias.py`, `bad_words.py`).

`_bias_kernel` does three things per logits row, in this order: allowed token ids (every other token -inf), logit
bias (added), and min tokens (stop tokens -inf until the request has min_tokens outputs; with
CHECK_ALL_MASKED_ROWS, a structured-output request whose row would then be all -inf gets its stop tokens back).
`_bad_words_kernel` bans a bad word's last token when the tokens before it end the request's output so far (a
verify row also counts the draft tokens before it). Rows are few and the per-request lists short, so the stand-ins
gather each request's list into a padded `[rows, width]` block and mask the row in one scatter.
"""

from __future__ import annotations

import torch

from ascend_platform.simulated.mrv2_kernels.common import flat

_NEG_INF = float("-inf")


def _lists(count: torch.Tensor, table: torch.Tensor, reqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each selected request's first `count[req]` entries of its `table` row: `[rows, width]` and a validity mask."""
    width = int(count.max())
    values = table[reqs, :width]
    valid = torch.arange(width, device=table.device)[None, :] < count[:, None]
    return values, valid


def _scatter_mask(ids: torch.Tensor, valid: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool `[rows, vocab]`: True at each row's valid ids (invalid entries land in a dropped spare column)."""
    hits = torch.zeros(ids.shape[0], vocab_size + 1, dtype=torch.bool, device=ids.device)
    hits.scatter_(1, torch.where(valid, ids.long(), vocab_size), True)
    return hits[:, :vocab_size]


def logit_bias(logits_ptr, logits_stride, vocab_size, expanded_idx_mapping_ptr, num_allowed_token_ids_ptr,
               allowed_token_ids_ptr, allowed_token_ids_stride, num_logit_bias_ptr, bias_token_ids_ptr,
               bias_token_ids_stride, bias_ptr, bias_stride, pos_ptr, min_lens_ptr, num_stop_token_ids_ptr,
               restore_when_all_masked_ptr, stop_token_ids_ptr, stop_token_ids_stride, BLOCK_SIZE=None,
               LOGITS_BLOCK_SIZE=None, CHECK_ALL_MASKED_ROWS=False, **_launch):
    """`_bias_kernel`: allowed token ids, then logit bias, then min tokens, per logits row."""
    reqs = expanded_idx_mapping_ptr.long()
    view = logits_ptr[:, :vocab_size]

    n_allowed = flat(num_allowed_token_ids_ptr)[reqs].long()
    rows = (n_allowed > 0).nonzero().view(-1)
    if rows.numel():
        ids, valid = _lists(n_allowed[rows], allowed_token_ids_ptr, reqs[rows])
        view[rows] = view[rows].masked_fill(~_scatter_mask(ids, valid, vocab_size), _NEG_INF)

    n_bias = flat(num_logit_bias_ptr)[reqs].long()
    rows = (n_bias > 0).nonzero().view(-1)
    if rows.numel():
        ids, valid = _lists(n_bias[rows], bias_token_ids_ptr, reqs[rows])
        bias, _ = _lists(n_bias[rows], bias_ptr, reqs[rows])
        # The kernel loads the biased logits, adds and stores: each listed token gets logit + its bias once.
        added = torch.zeros(rows.numel(), vocab_size + 1, dtype=view.dtype, device=view.device)
        added.scatter_(1, torch.where(valid, ids.long(), vocab_size), bias.to(view.dtype))  # spare column dropped
        view[rows] = view[rows] + added[:, :vocab_size]

    n_stop = flat(num_stop_token_ids_ptr)[reqs].long()
    positions = pos_ptr[: reqs.shape[0]].long()
    rows = ((n_stop > 0) & (positions + 1 < flat(min_lens_ptr)[reqs].long())).nonzero().view(-1)
    if rows.numel() == 0:
        return
    ids, valid = _lists(n_stop[rows], stop_token_ids_ptr, reqs[rows])
    stop = _scatter_mask(ids, valid, vocab_size)
    before = view[rows]
    after = before.masked_fill(stop, _NEG_INF)
    if CHECK_ALL_MASKED_ROWS:
        restore = flat(restore_when_all_masked_ptr)[reqs[rows]] != 0
        # A row left with nothing to sample gets its finite stop logits back (a grammar that must end now).
        emptied = restore & (after.max(dim=-1).values == _NEG_INF)
        back = stop & emptied[:, None] & torch.isfinite(before)
        after = torch.where(back, before, after)
    view[rows] = after


def bad_words(logits_ptr, logits_stride, expanded_idx_mapping_ptr, bad_word_token_ids_ptr,
              bad_word_token_ids_stride, bad_word_offsets_ptr, bad_word_offsets_stride, num_bad_words_ptr,
              all_token_ids_ptr, all_token_ids_stride, prompt_len_ptr, total_len_ptr, input_ids_ptr,
              expanded_local_pos_ptr, **_launch):
    """`_bad_words_kernel`: -inf for a bad word's last token where its other tokens end the output so far."""
    reqs = expanded_idx_mapping_ptr.long()
    counts = flat(num_bad_words_ptr)[reqs]
    rows = (counts > 0).nonzero().view(-1).tolist()
    banned_rows: list[int] = []
    banned_tokens: list[int] = []
    prompt_lens, total_lens = flat(prompt_len_ptr), flat(total_len_ptr)
    for row in rows:  # only requests that carry bad words; each has a few short words
        req, n = int(reqs[row]), int(counts[row])
        offsets = bad_word_offsets_ptr[req, : n + 1].tolist()
        words = bad_word_token_ids_ptr[req, : offsets[-1]].tolist()
        local = int(expanded_local_pos_ptr[row])
        prompt_len = int(prompt_lens[req])
        output_len = int(total_lens[req]) - prompt_len
        longest = max(offsets[w + 1] - offsets[w] for w in range(n)) - 1
        # The output so far as the kernel reads it: committed tokens, then this row's drafts from input_ids.
        start = prompt_len + max(0, output_len - longest)
        context = all_token_ids_ptr[req, start : prompt_len + output_len].tolist()
        context += input_ids_ptr[row - local + 1 : row + 1].tolist() if local else []
        for w in range(n):
            word = words[offsets[w] : offsets[w + 1]]
            prefix = len(word) - 1
            if prefix > output_len + local:
                continue
            if prefix == 0 or context[len(context) - prefix :] == word[:-1]:
                banned_rows.append(row)
                banned_tokens.append(word[-1])
    if banned_rows:
        device = logits_ptr.device
        logits_ptr[torch.tensor(banned_rows, device=device), torch.tensor(banned_tokens, device=device)] = _NEG_INF
