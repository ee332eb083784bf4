/* Decode attention of the reference backend as one loop over the paged caches: every request's single query token
 * against its context's keys, read in place through the caches' strides (no gather copy), float32 arithmetic.
 * reference/attention.py's torch formulation is what this is held to; it exists because that formulation is a gather
 * plus a fused-attention call (a small batch pays torch's per-op cost, a large one the gathered copy).
 *
 * Built with layers.c into one library (see ascend_kernels.reference.native_build); the caller checks dtypes,
 * layouts and that every block the lengths reach is in the table.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define AK_NAME(f) f##_f32
#define AK_T float
#define AK_GET(v) (v)
#include "attention_typed.h"
#undef AK_NAME
#undef AK_T
#undef AK_GET

#define AK_NAME(f) f##_bf16
#define AK_T uint16_t
#define AK_GET(v) ak_bf16_to_f32(v)
#include "attention_typed.h"
#undef AK_NAME
#undef AK_T
#undef AK_GET

#define AK_NAME(f) f##_f16
#define AK_T _Float16
#define AK_GET(v) ((float)(v))
#include "attention_typed.h"
#undef AK_NAME
#undef AK_T
#undef AK_GET

/* out[r, h] = softmax(scale q[r, h] . K[r, kv(h)]^T (+ sink[h])) V[r, kv(h)] over keys [max(0, len - window), len) of
 * request r's blocks (table row r; ids clamped into [0, num_blocks) as the torch formulation clamps them).
 * Strides in elements: q (token, head), caches (block, slot, head), out (token, head); the last dims contiguous.
 * q, caches and out share dtype dt; sinks NULL or hq float32 logits; window 0 means none; lens int32 or int64, table
 * int32 or int64 (row stride t_rs, t_cols blocks a row). max_len bounds every request's visible keys. Returns 0,
 * -1 when scratch could not be allocated, or 1 + the first request whose length is below 1, past max_len visible
 * keys or past its table row (then nothing is written). */
int ak_paged_decode(const void *q, int64_t q_ts, int64_t q_hs, const void *kc, int64_t k_bs, int64_t k_ss,
                    int64_t k_hs, const void *vc, int64_t v_bs, int64_t v_ss, int64_t v_hs, int dt, const void *table,
                    int table_i64, int64_t t_rs, int64_t t_cols, int64_t num_blocks, const void *lens, int lens_i64,
                    int64_t reqs, int64_t hq, int64_t hkv, int64_t d, int64_t dv, int64_t block_size, float scale, int64_t window,
                    const float *sinks, void *out, int64_t o_ts, int64_t o_hs, int64_t max_len, int threads) {
    /* The lengths are read here, the scratch was sized from the caller's host copy: a disagreement is refused. */
    for (int64_t r = 0; r < reqs; r++) {
        const int64_t len = ak_index(lens, lens_i64, r);
        const int64_t visible = window > 0 && len > window ? window : len;
        if (len < 1 || visible > max_len || len > t_cols * block_size) return 1 + r;
    }
    const int64_t g = hq / hkv;
    const size_t esize = ak_size(dt);
    /* A work item is one request's run of KV heads, walked slot by slot: the device layout keeps a slot's heads
     * side by side, so a run reads each slot's bytes in one sweep (a head at a time would touch a new page per slot).
     * Requests are split into runs only as far as it takes to give every thread work. */
    int64_t parts = (2 * (int64_t)threads + reqs - 1) / reqs;
    parts = parts < 1 ? 1 : (parts > hkv ? hkv : parts);
    const int64_t run = (hkv + parts - 1) / parts;
    parts = (hkv + run - 1) / run;
    const int64_t gq = run * g; /* query heads of a run, at most */
    int failed = 0;
#pragma omp parallel num_threads(threads) if (threads > 1 && reqs * parts > 1 && reqs * hq * max_len * d >= 65536)
    {
        float *scratch = (float *)malloc(sizeof(float) * (size_t)(gq * d + gq * max_len + gq * dv + gq));
        int64_t *blk_of = (int64_t *)malloc(sizeof(int64_t) * (size_t)(2 * max_len));
        int64_t *slot_of = blk_of == NULL ? NULL : blk_of + max_len;
        if (scratch == NULL || blk_of == NULL) {
#pragma omp atomic write
            failed = 1;
        }
        float *qf = scratch, *s = qf + gq * d, *acc = s + gq * max_len, *total = acc + gq * dv;
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < reqs * parts; item++) {
            if (scratch == NULL || blk_of == NULL) continue;
            const int64_t r = item / parts, kh0 = (item % parts) * run;
            const int64_t kh1 = kh0 + run < hkv ? kh0 + run : hkv;
            const int64_t h0 = kh0 * g, nq = (kh1 - kh0) * g;
            const int64_t len = ak_index(lens, lens_i64, r);
            const int64_t start = window > 0 && len > window ? len - window : 0;
            const int64_t n = len - start;
            for (int64_t i = 0; i < nq; i++) {
                ak_load((const char *)q + (size_t)(r * q_ts + (h0 + i) * q_hs) * esize, dt, qf + i * d, d);
                for (int64_t c = 0; c < d; c++) qf[i * d + c] *= scale;
            }
            ak_key_slots(table, table_i64, r * t_rs, num_blocks, block_size, start, len, blk_of, slot_of);
            for (int64_t j = 0; j < n; j++) {
                for (int64_t kh = kh0; kh < kh1; kh++) {
                    const char *k = (const char *)kc + (size_t)(blk_of[j] * k_bs + slot_of[j] * k_ss + kh * k_hs) * esize;
                    const int64_t i = (kh - kh0) * g;
                    if (dt == AK_F32)
                        ak_dots_f32(qf + i * d, g, (const float *)k, d, s + i * max_len + j, max_len);
                    else if (dt == AK_BF16)
                        ak_dots_bf16(qf + i * d, g, (const uint16_t *)k, d, s + i * max_len + j, max_len);
                    else
                        ak_dots_f16(qf + i * d, g, (const _Float16 *)k, d, s + i * max_len + j, max_len);
                }
            }
            for (int64_t i = 0; i < nq; i++) {
                float *si = s + i * max_len;
                float m = sinks != NULL ? sinks[h0 + i] : -INFINITY;
#pragma omp simd reduction(max : m)
                for (int64_t j = 0; j < n; j++) m = si[j] > m ? si[j] : m;
                float sum = sinks != NULL ? ak_exp_nonpositive(sinks[h0 + i] - m) : 0.0f;
#pragma omp simd reduction(+ : sum)
                for (int64_t j = 0; j < n; j++) {
                    si[j] = ak_exp_nonpositive(si[j] - m);
                    sum += si[j];
                }
                total[i] = sum;
            }
            memset(acc, 0, sizeof(float) * (size_t)(nq * dv));
            for (int64_t j = 0; j < n; j++) {
                for (int64_t kh = kh0; kh < kh1; kh++) {
                    const char *v = (const char *)vc + (size_t)(blk_of[j] * v_bs + slot_of[j] * v_ss + kh * v_hs) * esize;
                    const int64_t i = (kh - kh0) * g;
                    if (dt == AK_F32)
                        ak_axpys_f32(s + i * max_len + j, max_len, g, (const float *)v, dv, acc + i * dv);
                    else if (dt == AK_BF16)
                        ak_axpys_bf16(s + i * max_len + j, max_len, g, (const uint16_t *)v, dv, acc + i * dv);
                    else
                        ak_axpys_f16(s + i * max_len + j, max_len, g, (const _Float16 *)v, dv, acc + i * dv);
                }
            }
            for (int64_t i = 0; i < nq; i++) {
                const float inv = 1.0f / total[i];
                float *a = acc + i * dv;
                for (int64_t c = 0; c < dv; c++) a[c] *= inv;
                ak_store((char *)out + (size_t)(r * o_ts + (h0 + i) * o_hs) * esize, dt, a, dv);
            }
        }
        free(scratch);
        free(blk_of);
    }
    return failed ? -1 : 0;
}
