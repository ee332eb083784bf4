/* torch's argmax of a float32 row on 8-lane vectors, shared by the greedy and the Gumbel sampling loops. */
#ifndef AK_ARGMAX_H
#define AK_ARGMAX_H

#include <math.h>
#include <stdint.h>

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

#endif
