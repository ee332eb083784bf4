/* Gumbel-max sampling with counter-based noise (reference/gumbel.py's float32 formulation) as one loop per row.
 *
 * The torch formulation builds ~40 [rows, vocab] temporaries (the 32-bit hash in int64 tensors, the series, two
 * logs): 4 rows of a 151,936-token vocabulary cost ~24-27 ms a step on the host, the step's whole budget. Here each
 * token's noise is computed in registers: the same murmur3-style hash of (the row's mixed seed and position, the
 * token id), the same uniform u and the same float32 operations in the same order (this file is built without
 * contracting a * b + c into one rounding, as torch rounds each op), except the two logarithms, which are a
 * polynomial here (Cephes' logf, within 1 ulp) where torch calls its vectorised log (also within 1 ulp). The two can
 * differ in the last bit of a token's noise, which changes the winner only where two tokens' scores tie to within
 * that bit. The row's seed and position are mixed on the Python side (`_row_state`, a few rows).
 *
 * A row of temperature 0 takes torch's argmax of its float32 logits. Scores go to a scratch row, then the shared
 * argmax loop picks the winner (the lowest id among equal maxima, the first NaN). */
#pragma GCC optimize("fp-contract=off")

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "argmax.h"
#include "common.h"

static inline uint32_t ak_rotl32(uint32_t x, int s) { return (x << s) | (x >> (32 - s)); }

/* log(x) for a positive normal float (Cephes' logf): x = m 2^e with m in [sqrt(1/2), sqrt(2)), then
 * log(m) = f - f^2 / 2 + f^3 P(f) with f = m - 1, plus e log(2) in two parts. No branches: the loops vectorize. */
static inline float ak_logf_pos(float x) {
    const uint32_t bits = ak_bits_of_f32(x);
    int32_t e = (int32_t)(bits >> 23) - 127;
    float m = ak_f32_from_bits((bits & 0x007FFFFFu) | 0x3F800000u); /* [1, 2) */
    const int big = m > 1.41421356237309504880f;
    m = big ? m * 0.5f : m;
    e += big;
    const float f = m - 1.0f;
    const float z = f * f;
    float p = 7.0376836292E-2f;
    p = p * f + -1.1514610310E-1f;
    p = p * f + 1.1676998740E-1f;
    p = p * f + -1.2420140846E-1f;
    p = p * f + 1.4249322787E-1f;
    p = p * f + -1.6668057665E-1f;
    p = p * f + 2.0000714765E-1f;
    p = p * f + -2.4999993993E-1f;
    p = p * f + 3.3333331174E-1f;
    const float fe = (float)e;
    float y = f * z * p;
    y += -2.12194440e-4f * fe;
    y += -0.5f * z;
    return f + y + 0.693359375f * fe;
}

/* Score of token j: x / temperature (when applied) + -log(-log(1 - u)), u from the hash of (state, j). */
static inline float ak_gumbel_score(float x, uint32_t state, uint32_t j, float temperature, int apply) {
    uint32_t key = ak_rotl32(j * 0xCC9E2D51u, 15) * 0x1B873593u;
    uint32_t h = ak_rotl32(state ^ key, 13) * 5u + 0xE6546B64u;
    h ^= 16u;
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    const float u = (float)(h >> 16) * 1.52587890625e-05f + ((float)(h & 0xFFFFu) + 0.5f) * 2.3283064365386963e-10f;
    /* log(1 - u): vLLM's degree-8 series below 0.25, a clamped log above (both computed, one kept) */
    float poly = 0.125f;
    poly = (float)(1.0 / 7.0) + u * poly;
    poly = (float)(1.0 / 6.0) + u * poly;
    poly = 0.2f + u * poly;
    poly = 0.25f + u * poly;
    poly = (float)(1.0 / 3.0) + u * poly;
    poly = 0.5f + u * poly;
    poly = 1.0f + u * poly;
    const float series = -u * poly;
    const float one_minus = 1.0f - u;
    const float direct = ak_logf_pos(one_minus < 5.960464477539063e-08f ? 5.960464477539063e-08f : one_minus);
    const float log1m = u < 0.25f ? series : direct;
    const float noise = -ak_logf_pos(-log1m);
    return (apply ? x / temperature : x) + noise;
}

/* rows of logits (dtype dt, `row_stride` elements apart, `vocab` wide, vocab < 2^31) -> winners[rows]: a row of
 * temperature[r] 0 its argmax, else argmax of its scores with state[r] the row's mixed seed and position. Returns 0,
 * or -2 when a scratch row could not be allocated (nothing useful written). */
int64_t ak_gumbel_sample(const void *logits, int dt, int64_t row_stride, int64_t rows, int64_t vocab,
                         const float *temperature, const uint32_t *state, int apply_temperature, int64_t *winners,
                         int threads) {
    int failed = 0;
#pragma omp parallel num_threads(threads) if (threads > 1 && rows > 1 && rows * vocab >= 4 * AK_PARALLEL_MIN_ELEMS)
    {
        float *scores = (float *)malloc((size_t)vocab * sizeof(float));
        if (scores == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (scores == NULL) continue;
            const char *row = (const char *)logits + (size_t)(r * row_stride) * ak_size(dt);
            const float *x = (const float *)row;
            if (dt != AK_F32) {
                ak_load(row, dt, scores, vocab);
                x = scores;
            }
            const float t = temperature[r];
            if (t != 0.0f) {
                const uint32_t s = state[r];
#pragma omp simd
                for (int64_t j = 0; j < vocab; j++)
                    scores[j] = ak_gumbel_score(x[j], s, (uint32_t)j, t, apply_temperature);
                x = scores;
            }
            winners[r] = ak_argmax_f32(x, vocab);
        }
        free(scores);
    }
    return failed ? -2 : 0;
}
