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

#include "argmax.h"

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
