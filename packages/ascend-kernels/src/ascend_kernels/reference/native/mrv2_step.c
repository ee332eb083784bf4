/* Model Runner V2's per-step batch bookkeeping (vLLM's `_prepare_pos_seq_lens_kernel`,
 * `_combine_sampled_and_draft_tokens_kernel`, `_get_num_sampled_and_rejected_kernel` and `_post_update_kernel` in
 * vllm/v1/worker/gpu/input_batch.py, and block_table.py's `_gather_block_tables_kernel` one KV cache group a call)
 * as loops over host memory, for the simulated lane's stand-ins of those Triton kernels. A step launches them on a
 * handful of requests: the work is a few dozen integers and a Python formulation's cost is its op count (~170 us a
 * step over the four, measured on the tiny Llama's decode), this one call each. Every integer array comes as
 * (pointer, is int64, length); each function checks every index it will follow before it writes anything, and
 * returns 0, or 1 + the batch row whose request or tokens reach past an array (-1: query_start_loc / cu_num_logits
 * not non-decreasing within their output; the gather: a padded row count past its table, which its Python wrapper
 * refuses first). Built with layers.c (native_build). */
#include <stdint.h>

#include "common.h"

/* seq_lens[r] = computed[req] + query length; positions of the request's query tokens continue from computed[req];
 * seq_lens[nr:max_num_reqs] = 0. */
int64_t ak_mrv2_pos_seq_lens(void *pos, int pos_i64, int64_t n_pos, void *seq_lens, int sl_i64, int64_t n_sl,
                             const void *idx, int idx_i64, const void *qsl, int qsl_i64, const void *computed,
                             int c_i64, int64_t n_computed, int64_t nr, int64_t max_num_reqs) {
    if (max_num_reqs > n_sl || nr > max_num_reqs || !ak_offsets_ok(qsl, qsl_i64, nr, n_pos)) return -1;
    for (int64_t r = 0; r < nr; r++) {
        const int64_t req = ak_index(idx, idx_i64, r);
        if (req < 0 || req >= n_computed) return 1 + r;
    }
    for (int64_t r = 0; r < nr; r++) {
        const int64_t c = ak_index(computed, c_i64, ak_index(idx, idx_i64, r));
        const int64_t start = ak_index(qsl, qsl_i64, r), end = ak_index(qsl, qsl_i64, r + 1);
        ak_set(seq_lens, sl_i64, r, c + end - start);
        for (int64_t t = start; t < end; t++) ak_set(pos, pos_i64, t, c + t - start);
    }
    for (int64_t r = nr; r < max_num_reqs; r++) ak_set(seq_lens, sl_i64, r, 0);
    return 0;
}

/* Logits indices (each request's last num_logits query tokens), then, for requests past their prompt, the last
 * sampled token (when new_sampled and the first logit is past the prompt) and the drafts into input_ids. */
int64_t ak_mrv2_combine_tokens(void *input_ids, int ids_i64, int64_t n_ids, const void *idx, int idx_i64,
                               const void *last_sampled, int ls_i64, int64_t n_state, const void *qsl, int qsl_i64,
                               const void *seq_lens, int sl_i64, const void *prefill_len, int pl_i64,
                               const void *drafts, int d_i64, int64_t d_stride, int64_t n_drafts, const void *cu,
                               int cu_i64, void *indices, int ind_i64, int64_t n_indices, int64_t nr,
                               int64_t new_sampled) {
    if (!ak_offsets_ok(cu, cu_i64, nr, n_indices) || !ak_offsets_ok(qsl, qsl_i64, nr, n_ids)) return -1;
    for (int64_t r = 0; r < nr; r++) {
        const int64_t req = ak_index(idx, idx_i64, r);
        const int64_t num_logits = ak_index(cu, cu_i64, r + 1) - ak_index(cu, cu_i64, r);
        const int64_t query_end = ak_index(qsl, qsl_i64, r + 1);
        const int64_t num_drafts = num_logits - new_sampled;
        if (req < 0 || req >= n_state || num_logits > query_end) return 1 + r;
        if (num_drafts > 0 && (drafts == NULL || num_drafts > d_stride || (req + 1) * d_stride > n_drafts)) return 1 + r;
    }
    for (int64_t r = 0; r < nr; r++) {
        const int64_t req = ak_index(idx, idx_i64, r);
        const int64_t first = ak_index(cu, cu_i64, r), num_logits = ak_index(cu, cu_i64, r + 1) - first;
        const int64_t query_end = ak_index(qsl, qsl_i64, r + 1), logits_start = query_end - num_logits;
        for (int64_t j = 0; j < num_logits; j++) ak_set(indices, ind_i64, first + j, logits_start + j);
        const int64_t seq_len = ak_index(seq_lens, sl_i64, r), prefill = ak_index(prefill_len, pl_i64, req);
        if (seq_len <= prefill) continue; /* still in its prompt: no sampled or draft tokens */
        if (new_sampled > 0 && seq_len - num_logits >= prefill)
            ak_set(input_ids, ids_i64, logits_start, ak_index(last_sampled, ls_i64, req));
        const int64_t num_drafts = num_logits - new_sampled;
        for (int64_t j = 0; j < num_drafts; j++)
            ak_set(input_ids, ids_i64, query_end - num_drafts + j, ak_index(drafts, d_i64, req * d_stride + j));
    }
    return 0;
}

/* A request still in a chunked prefill (seq_len < prefill_len) samples and rejects nothing; the others reject their
 * logits not sampled. */
int64_t ak_mrv2_num_sampled(void *num_sampled, int ns_i64, void *num_rejected, int nrj_i64, const void *seq_lens,
                            int sl_i64, const void *cu, int cu_i64, const void *idx, int idx_i64,
                            const void *prefill_len, int pl_i64, int64_t n_state, int64_t nr) {
    for (int64_t r = 0; r < nr; r++) {
        const int64_t req = ak_index(idx, idx_i64, r);
        if (req < 0 || req >= n_state) return 1 + r;
    }
    for (int64_t r = 0; r < nr; r++) {
        const int64_t req = ak_index(idx, idx_i64, r);
        if (ak_index(seq_lens, sl_i64, r) < ak_index(prefill_len, pl_i64, req)) {
            ak_set(num_sampled, ns_i64, r, 0);
            ak_set(num_rejected, nrj_i64, r, 0);
        } else {
            const int64_t num_logits = ak_index(cu, cu_i64, r + 1) - ak_index(cu, cu_i64, r);
            ak_set(num_rejected, nrj_i64, r, num_logits - ak_index(num_sampled, ns_i64, r));
        }
    }
    return 0;
}

/* After sampling, per batch row of a request (rows of request index < 0 skipped): its sampled tokens appended to its
 * history (all_token_ids from total_len on) and counted in output_bin_counts (when given), the last one kept, and
 * num_computed_tokens advanced by the query length (0 without query_start_loc) less the rejected drafts. */
int64_t ak_mrv2_post_update(const void *idx, int idx_i64, void *computed, int c_i64, void *last_sampled, int ls_i64,
                            int64_t n_state, void *bin_counts, int bc_i64, int64_t bc_stride, const void *sampled,
                            int s_i64, int64_t s_stride, const void *num_sampled, int ns_i64, const void *num_rejected,
                            int nrj_i64, const void *qsl, int qsl_i64, void *history, int h_i64, int64_t h_stride,
                            void *total_len, int tl_i64, int64_t nr) {
    for (int64_t r = 0; r < nr; r++) {
        const int64_t req = ak_index(idx, idx_i64, r);
        if (req < 0) continue;
        const int64_t n = ak_index(num_sampled, ns_i64, r);
        if (req >= n_state || n < 0 || n > s_stride) return 1 + r;
        const int64_t start = ak_index(total_len, tl_i64, req);
        if (start < 0 || start + n > h_stride) return 1 + r;
        for (int64_t j = 0; bin_counts != NULL && j < n; j++) {
            const int64_t token = ak_index(sampled, s_i64, r * s_stride + j);
            if (token < 0 || token >= bc_stride) return 1 + r;
        }
    }
    for (int64_t r = 0; r < nr; r++) {
        const int64_t req = ak_index(idx, idx_i64, r);
        if (req < 0) continue;
        const int64_t n = ak_index(num_sampled, ns_i64, r), start = ak_index(total_len, tl_i64, req);
        for (int64_t j = 0; j < n; j++) {
            const int64_t token = ak_index(sampled, s_i64, r * s_stride + j);
            ak_set(history, h_i64, req * h_stride + start + j, token);
            if (bin_counts != NULL) {
                const int64_t at = req * bc_stride + token;
                ak_set(bin_counts, bc_i64, at, ak_index(bin_counts, bc_i64, at) + 1);
            }
        }
        if (n > 0) {
            ak_set(last_sampled, ls_i64, req, ak_index(sampled, s_i64, r * s_stride + n - 1));
            ak_set(total_len, tl_i64, req, start + n);
        }
        const int64_t query_len = qsl == NULL ? 0 : ak_index(qsl, qsl_i64, r + 1) - ak_index(qsl, qsl_i64, r);
        const int64_t delta = query_len - ak_index(num_rejected, nrj_i64, r);
        if (delta != 0) ak_set(computed, c_i64, req, ak_index(computed, c_i64, req) + delta);
    }
    return 0;
}

/* vLLM's `_gather_block_tables_kernel` (vllm/v1/worker/gpu/block_table.py) for one KV cache group: dst row r takes
 * the first counts[idx[r]] entries of src row idx[r] (at most width; the rest of the row as it was), and rows
 * [nr, padded) are zeroed. Tables are dense rows of `width` entries. */
int64_t ak_mrv2_gather_block_table(const void *src, int s_i64, int64_t s_rows, const void *counts, int c_i64,
                                   int64_t n_counts, const void *idx, int idx_i64, int64_t nr, void *dst, int d_i64,
                                   int64_t d_rows, int64_t width, int64_t padded) {
    if (padded > d_rows || nr > padded) return -1;
    for (int64_t r = 0; r < nr; r++) {
        const int64_t req = ak_index(idx, idx_i64, r);
        if (req < 0 || req >= s_rows || req >= n_counts) return 1 + r;
    }
    for (int64_t r = 0; r < nr; r++) {
        const int64_t req = ak_index(idx, idx_i64, r), count = ak_index(counts, c_i64, req);
        const int64_t n = count < 0 ? 0 : (count > width ? width : count);
        for (int64_t j = 0; j < n; j++) ak_set(dst, d_i64, r * width + j, ak_index(src, s_i64, req * width + j));
    }
    for (int64_t r = nr; r < padded; r++)
        for (int64_t j = 0; j < width; j++) ak_set(dst, d_i64, r * width + j, 0);
    return 0;
}
