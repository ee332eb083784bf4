/* Prefill, verify and mixed-batch attention of the reference backend as one tiled loop over the paged caches
 * (flash-attention style: a tile of query rows against a tile of keys at a time, the softmax kept online), float32
 * arithmetic. reference/attention.py's torch formulation is what this is held to; it exists because that formulation
 * runs torch's fused attention over gathered keys, whose CPU kernel and its [rows, keys] buffers leave this host at a
 * third of vLLM's CPU attention (512-token prefill, 2 threads), and small verify batches pay torch's per-op cost.
 *
 * The products are written with GCC's vector extensions (AK_VW floats a vector) so that any target gets register
 * tiles: 4 keys x 4 vectors of query rows for the scores (against the query tile transposed once per work item, so a
 * key value is one broadcast), 4 rows x 4 vectors of value dims for the weighted sum. float32 keys and values are read
 * in place; other dtypes are converted into float32 tiles once per key tile.
 *
 * Built with layers.c into one library (see ascend_kernels.reference.native_build); the caller checks dtypes and
 * layouts.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define AK_KB 64        /* keys a tile */
#define AK_TILE_ROWS 64 /* query rows (tokens x the query heads of one KV head) a tile, about */
/* floats a vector: a 4 x 4 register tile of 16-float vectors fills AVX-512's 32 registers; on a host without it
 * (16 AVX2 registers, or SSE / NEON) the same tile spilled to memory and ran ~40x slower, so there a vector is 8 */
#ifdef __AVX512F__
#define AK_VW 16
#else
#define AK_VW 8
#endif

/* AK_VW floats; aligned(4): loads straight from a cache row need not be vector-aligned */
typedef float ak_vec __attribute__((vector_size(AK_VW * sizeof(float)), aligned(4)));

static inline int64_t ak_round16(int64_t n) { return (n + AK_VW - 1) / AK_VW * AK_VW; }

/* st[j][r0 : r0 + 16 NV] = k_j . qT[:, r0 : ...] for J keys (rows kp[j], d values) against the transposed query tile
 * qT (d x rp): the score tile is keys x rows, so each key value is one broadcast against vectors of query rows. */
static inline __attribute__((always_inline)) void ak_scores(const float *const *kp, const float *qT, int64_t rp,
                                                            int64_t d, float *st, int64_t r0, const int J,
                                                            const int NV) {
    ak_vec a[4][4];
    for (int j = 0; j < J; j++)
        for (int u = 0; u < NV; u++) a[j][u] = (ak_vec){0};
    for (int64_t c = 0; c < d; c++) {
        const ak_vec *qv = (const ak_vec *)(qT + c * rp + r0);
        ak_vec w[4];
        for (int u = 0; u < NV; u++) w[u] = qv[u];
#pragma GCC unroll 4
        for (int j = 0; j < J; j++) {
            const float x = kp[j][c];
            for (int u = 0; u < NV; u++) a[j][u] += x * w[u];
        }
    }
    for (int j = 0; j < J; j++)
        for (int u = 0; u < NV; u++) ((ak_vec *)(st + j * rp + r0))[u] = a[j][u];
}

/* acc[r][c0 : c0 + 16 NV] += sum_j pt[j][r] v_j[c0 : ...] for R rows over nk keys (value rows vp[j]). */
static inline __attribute__((always_inline)) void ak_weighted(const float *pt, int64_t rp, const float *const *vp,
                                                              int64_t nk, float *acc, int64_t dvp, int64_t r0,
                                                              int64_t c0, const int R, const int NV) {
    ak_vec a[4][4];
    for (int r = 0; r < R; r++)
        for (int u = 0; u < NV; u++) a[r][u] = ((const ak_vec *)(acc + (r0 + r) * dvp + c0))[u];
    for (int64_t j = 0; j < nk; j++) {
        const ak_vec *v = (const ak_vec *)(vp[j] + c0);
        ak_vec w[4];
        for (int u = 0; u < NV; u++) w[u] = v[u];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const float x = pt[j * rp + r0 + r];
            for (int u = 0; u < NV; u++) a[r][u] += x * w[u];
        }
    }
    for (int r = 0; r < R; r++)
        for (int u = 0; u < NV; u++) ((ak_vec *)(acc + (r0 + r) * dvp + c0))[u] = a[r][u];
}

static void ak_scores_tile(const float *const *kp, int64_t nk, const float *qT, int64_t rp, int64_t d, float *st) {
    int64_t j = 0;
    for (; j + 4 <= nk; j += 4) {
        int64_t r = 0;
        for (; r + 4 * AK_VW <= rp; r += 4 * AK_VW) ak_scores(kp + j, qT, rp, d, st + j * rp, r, 4, 4);
        for (; r < rp; r += AK_VW) ak_scores(kp + j, qT, rp, d, st + j * rp, r, 4, 1);
    }
    for (; j < nk; j++) {
        int64_t r = 0;
        for (; r + 4 * AK_VW <= rp; r += 4 * AK_VW) ak_scores(kp + j, qT, rp, d, st + j * rp, r, 1, 4);
        for (; r < rp; r += AK_VW) ak_scores(kp + j, qT, rp, d, st + j * rp, r, 1, 1);
    }
}

static void ak_weighted_tile(const float *pt, int64_t rp, int64_t rows, const float *const *vp, int64_t nk,
                             float *acc, int64_t dvp) {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) {
        int64_t c = 0;
        for (; c + 4 * AK_VW <= dvp; c += 4 * AK_VW) ak_weighted(pt, rp, vp, nk, acc, dvp, r, c, 4, 4);
        for (; c < dvp; c += AK_VW) ak_weighted(pt, rp, vp, nk, acc, dvp, r, c, 4, 1);
    }
    for (; r < rows; r++) {
        int64_t c = 0;
        for (; c + 4 * AK_VW <= dvp; c += 4 * AK_VW) ak_weighted(pt, rp, vp, nk, acc, dvp, r, c, 1, 4);
        for (; c < dvp; c += AK_VW) ak_weighted(pt, rp, vp, nk, acc, dvp, r, c, 1, 1);
    }
}

/* A score tile (keys x rows) turned into weights: keys a row does not see (key position kb + j outside [lo[r], hi[r]])
 * weigh 0, the rest exp(s - m) against each row's running maximum m, first raised to the tile's maximum (the running
 * sums l and the accumulator rows rescaled to it). Vectorized across rows; mx is a row of scratch. */
static void ak_online_softmax(float *st, int64_t rp, int64_t rows, int64_t kb, int64_t nk, const int64_t *lo,
                              const int64_t *hi, float *m, float *l, float *mx, float *acc, int64_t dvp) {
    for (int64_t r = 0; r < rp; r++) mx[r] = m[r];
    for (int64_t j = 0; j < nk; j++) {
        const float *sj = st + j * rp;
        const int64_t pos = kb + j;
#pragma omp simd
        for (int64_t r = 0; r < rp; r++) {
            const float v = pos >= lo[r] && pos <= hi[r] ? sj[r] : -INFINITY;
            mx[r] = v > mx[r] ? v : mx[r];
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        if (mx[r] == m[r]) continue;
        const float alpha = m[r] == -INFINITY ? 0.0f : ak_exp_nonpositive(m[r] - mx[r]);
        float *ar = acc + r * dvp;
#pragma omp simd
        for (int64_t c = 0; c < dvp; c++) ar[c] *= alpha;
        l[r] *= alpha;
        m[r] = mx[r];
    }
    for (int64_t j = 0; j < nk; j++) {
        float *sj = st + j * rp;
        const int64_t pos = kb + j;
#pragma omp simd
        for (int64_t r = 0; r < rp; r++) {
            const float w = pos >= lo[r] && pos <= hi[r] ? ak_exp_nonpositive(sj[r] - m[r]) : 0.0f;
            sj[r] = w;
            l[r] += w;
        }
    }
}

/* out[t, h] for every query token t of every request: request r's tokens [starts[r], starts[r + 1]) sit at positions
 * lens[r] - q_len ... lens[r] - 1 and see keys j <= p (every j < lens[r] when not causal), j > p - window when
 * window > 0, of table row r; softmax(scale q . k (+ sink[h])) v in float32. starts / lens: the caller's host lists as
 * int64. Strides in elements as ak_paged_decode's. With lse (float32, token stride lse_ts, heads dense; NULL for
 * none) each row's log-sum-exp of its scaled scores too (the sink's term included when there is one), as context
 * parallelism merges partial results by it.
 * Returns 0, -1 when scratch could not be allocated, or 1 + the first request whose length is below its query count
 * or past its table row (then nothing is written). */
int64_t ak_paged_tiled(const void *q, int64_t q_ts, int64_t q_hs, const void *kc, int64_t k_bs, int64_t k_ss,
                       int64_t k_hs, const void *vc, int64_t v_bs, int64_t v_ss, int64_t v_hs, int dt,
                       const void *table, int table_i64, int64_t t_rs, int64_t t_cols, int64_t num_blocks,
                       const int64_t *starts, const int64_t *lens, int64_t reqs, int64_t hq, int64_t hkv, int64_t d,
                       int64_t dv, int64_t block_size, float scale, int causal, int64_t window, const float *sinks,
                       void *out, int64_t o_ts, int64_t o_hs, float *lse, int64_t lse_ts, int threads) {
    const int64_t g = hq / hkv;
    const int64_t tq = AK_TILE_ROWS / g > 0 ? AK_TILE_ROWS / g : 1; /* query tokens a tile */
    int64_t tiles = 0;
    for (int64_t r = 0; r < reqs; r++) {
        const int64_t qlen = starts[r + 1] - starts[r];
        if (qlen < 0 || (qlen > 0 && (lens[r] < qlen || lens[r] > t_cols * block_size))) return 1 + r;
        tiles += (qlen + tq - 1) / tq;
    }
    /* work items (request, query tile), the later (longer) tiles of a request first; each taken per KV head */
    int64_t *items = (int64_t *)malloc(sizeof(int64_t) * (size_t)(2 * tiles + 1));
    if (items == NULL) return -1;
    int64_t n_items = 0;
    for (int64_t r = 0; r < reqs; r++) {
        const int64_t qlen = starts[r + 1] - starts[r];
        for (int64_t t = (qlen + tq - 1) / tq - 1; t >= 0; t--) {
            items[2 * n_items] = r;
            items[2 * n_items + 1] = t;
            n_items++;
        }
    }
    const int64_t rp = ak_round16(tq * g), dvp = ak_round16(dv);
    /* f32 keys are read in place; value rows too when a whole number of vectors wide (no read past a row's end) */
    const int keys_in_place = dt == AK_F32, values_in_place = dt == AK_F32 && dv == dvp;
    const size_t esize = ak_size(dt);
    /* per thread: the transposed query tile, scores, accumulators, key and value tiles, row maxima / sums / bounds */
    const size_t floats = (size_t)(d * rp + AK_KB * rp + rp * dvp + AK_KB * d + AK_KB * dvp + 3 * rp + 2 * rp * 2);
    int failed = 0;
#pragma omp parallel num_threads(threads) if (threads > 1 && n_items * hkv > 1)
    {
        float *buf = (float *)aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
        if (buf == NULL) {
#pragma omp atomic write
            failed = 1;
        }
        const float *kp[AK_KB], *vp[AK_KB]; /* the key tile's key and value rows as float32 */
        int64_t blk_of[AK_KB], slot_of[AK_KB];
        float *qT = buf, *st = qT + d * rp, *acc = st + AK_KB * rp, *kt = acc + rp * dvp, *vt = kt + AK_KB * d;
        float *m = vt + AK_KB * dvp, *l = m + rp, *mx = l + rp;
        int64_t *lo = (int64_t *)(mx + rp), *hi = lo + rp;
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < n_items * hkv; it++) {
            if (buf == NULL) continue;
            const int64_t r = items[2 * (it / hkv)], t0 = items[2 * (it / hkv) + 1] * tq, kh = it % hkv;
            const int64_t qlen = starts[r + 1] - starts[r], len = lens[r];
            const int64_t nt = qlen - t0 < tq ? qlen - t0 : tq, rows = nt * g, h0 = kh * g;
            const int64_t p0 = len - qlen + t0, p_last = p0 + nt - 1;
            memset(qT, 0, sizeof(float) * (size_t)(d * rp));
            for (int64_t i = 0; i < rows; i++) {
                const int64_t t = i / g;
                ak_load((const char *)q + (size_t)((starts[r] + t0 + t) * q_ts + (h0 + i % g) * q_hs) * esize, dt,
                        kt, d); /* kt: free until the first key tile */
                for (int64_t c = 0; c < d; c++) qT[c * rp + i] = kt[c] * scale;
            }
            for (int64_t i = 0; i < rp; i++) {
                const int64_t p = p0 + i / g;
                lo[i] = i >= rows ? 1 : (window > 0 && p - window + 1 > 0 ? p - window + 1 : 0);
                hi[i] = i >= rows ? 0 : (causal ? p : len - 1); /* padding rows see nothing */
                m[i] = i < rows && sinks != NULL ? sinks[h0 + i % g] : -INFINITY;
                l[i] = i < rows && sinks != NULL ? 1.0f : 0.0f;
            }
            memset(acc, 0, sizeof(float) * (size_t)(rows * dvp));
            const int64_t k_hi = causal ? p_last + 1 : len;
            const int64_t k_lo = window > 0 && p0 - window + 1 > 0 ? p0 - window + 1 : 0;
            for (int64_t kb = k_lo; kb < k_hi; kb += AK_KB) {
                const int64_t nk = k_hi - kb < AK_KB ? k_hi - kb : AK_KB;
                ak_key_slots(table, table_i64, r * t_rs, num_blocks, block_size, kb, kb + nk, blk_of, slot_of);
                for (int64_t j = 0; j < nk; j++) {
                    const int64_t koff = blk_of[j] * k_bs + slot_of[j] * k_ss + kh * k_hs;
                    const int64_t voff = blk_of[j] * v_bs + slot_of[j] * v_ss + kh * v_hs;
                    if (keys_in_place) {
                        kp[j] = (const float *)kc + koff;
                    } else {
                        ak_load((const char *)kc + (size_t)koff * esize, dt, kt + j * d, d);
                        kp[j] = kt + j * d;
                    }
                    if (values_in_place) {
                        vp[j] = (const float *)vc + voff;
                    } else {
                        float *vr = vt + j * dvp;
                        ak_load((const char *)vc + (size_t)voff * esize, dt, vr, dv);
                        for (int64_t c = dv; c < dvp; c++) vr[c] = 0.0f;
                        vp[j] = vr;
                    }
                }
                ak_scores_tile(kp, nk, qT, rp, d, st);
                ak_online_softmax(st, rp, rows, kb, nk, lo, hi, m, l, mx, acc, dvp);
                ak_weighted_tile(st, rp, rows, vp, nk, acc, dvp);
            }
            for (int64_t i = 0; i < rows; i++) {
                float *a = acc + i * dvp;
                const float inv = 1.0f / l[i];
                for (int64_t c = 0; c < dv; c++) a[c] *= inv;
                ak_store((char *)out + (size_t)((starts[r] + t0 + i / g) * o_ts + (h0 + i % g) * o_hs) * esize, dt,
                         a, dv);
                if (lse != NULL) lse[(starts[r] + t0 + i / g) * lse_ts + h0 + i % g] = m[i] + logf(l[i]);
            }
        }
        free(buf);
    }
    free(items);
    return failed ? -1 : 0;
}
