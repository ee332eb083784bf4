/* The greedy rows of Model Runner V2's sampler (vLLM's `_gumbel_sample_kernel` in
 * vllm/v1/worker/gpu/sample/gumbel.py, a row whose request has temperature 0, or a padding row) as one loop over host
 * memory, for the simulated lane's stand-in of that kernel. A decode step samples a handful of rows: a torch
 * formulation costs its op count (~100 us a step with the stand-in's bookkeeping, on the tiny Llama's decode), this
 * one call. The row's winner is the argmax of its float32 logits as torch's argmax picks it (the lowest id among
 * equal maxima; the first NaN where there is one), written to block column 0 of the launcher's per-block outputs
 * with the other columns at -inf, so the launcher's reduction over blocks picks it. Rows that sample (temperature not
 * 0) are not taken: the call returns -1 and writes nothing (the stand-in then runs the facade's Gumbel sampler). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "common.h"

#define AK_LANES 8

/* 8 floats / 8 int32s (one AVX2 register; wider vectors of comparisons are split lane by lane by GCC 12 without
 * AVX-512); aligned(4): loads straight from a logits row need not be vector-aligned. Comparisons give
 * -1 / 0 lanes and GCC's C has no vector `?:`, so a lane is kept or replaced by masking. */
typedef float ak_fv __attribute__((vector_size(AK_LANES * sizeof(float)), aligned(4)));
typedef int32_t ak_iv __attribute__((vector_size(AK_LANES * sizeof(int32_t)), aligned(4)));

/* torch's argmax of n float32 values (n >= 1, n < 2^31). */
static int64_t ak_argmax_f32(const float *x, int64_t n) {
    int64_t winner = 0;
    float top = x[0];
    int64_t j = 0;
    if (n >= 2 * AK_LANES) {
        /* Each lane keeps its first maximum; a lane sees ids in increasing order, so among lanes holding equal maxima
         * the lowest id wins. NaN never compares greater: it is looked for afterwards. */
        ak_fv best = *(const ak_fv *)x;
        ak_iv at, cur, nan_seen = best != best;
        for (int l = 0; l < AK_LANES; l++) at[l] = l;
        cur = at;
        for (j = AK_LANES; j + AK_LANES <= n; j += AK_LANES) {
            const ak_fv v = *(const ak_fv *)(x + j);
            cur += AK_LANES;
            const ak_iv more = v > best;
            best = (ak_fv)(((ak_iv)v & more) | ((ak_iv)best & ~more));
            at = (cur & more) | (at & ~more);
            nan_seen |= v != v;
        }
        int any_nan = 0;
        for (int l = 0; l < AK_LANES; l++) any_nan |= nan_seen[l] != 0;
        if (any_nan)
            for (int64_t k = 0; k < n; k++)
                if (isnan(x[k])) return k;
        winner = at[0];
        top = best[0];
        for (int l = 1; l < AK_LANES; l++)
            if (best[l] > top || (best[l] == top && at[l] < winner)) {
                top = best[l];
                winner = at[l];
            }
    }
    for (; j < n; j++) { /* a short row, or the tail after the lanes (ids past every lane's) */
        if (isnan(x[j])) return j;
        if (x[j] > top) {
            top = x[j];
            winner = j;
        }
    }
    return winner;
}

/* rows of logits (dtype dt, `row_stride` elements apart, `vocab` wide) sampled greedily: the request of row r is
 * idx[r] (< 0: a padding row, greedy), its temperature temperature[idx[r]]. Returns 0, 1 + the first row whose
 * request reaches past the temperatures (nothing written), -1 when a row samples (nothing written), -2 when a
 * conversion buffer could not be allocated (nothing written). */
int64_t ak_mrv2_gumbel_greedy(const void *logits, int dt, int64_t row_stride, int64_t rows, int64_t vocab,
                              const void *idx, int idx_i64, const float *temperature, int64_t n_temperature,
                              int64_t *local_argmax, int64_t argmax_stride, void *local_max, int max_f64,
                              int64_t max_stride, int64_t num_blocks) {
    for (int64_t r = 0; r < rows; r++) {
        const int64_t req = ak_index(idx, idx_i64, r);
        if (req >= n_temperature) return 1 + r;
        if (req >= 0 && temperature[req] != 0.0f) return -1;
    }
    float *converted = NULL;
    if (dt != AK_F32 && vocab > 0 && (converted = malloc((size_t)vocab * sizeof(float))) == NULL) return -2;
    for (int64_t r = 0; r < rows; r++) {
        const char *row = (const char *)logits + (size_t)(r * row_stride) * ak_size(dt);
        const float *x = (const float *)row;
        if (dt != AK_F32) {
            ak_load(row, dt, converted, vocab);
            x = converted;
        }
        local_argmax[r * argmax_stride] = vocab > 0 ? ak_argmax_f32(x, vocab) : 0;
        for (int64_t b = 0; b < num_blocks; b++) {
            const double v = b == 0 ? 0.0 : -INFINITY;
            if (max_f64)
                ((double *)local_max)[r * max_stride + b] = v;
            else
                ((float *)local_max)[r * max_stride + b] = (float)v;
        }
    }
    free(converted);
    return 0;
}
