/* Per-token layer ops of the reference backend as single loops over host memory: RMSNorm (with the fused residual
 * add), rotary embedding, SiLU-and-mul and the paged KV cache write. The torch formulation in reference/layers.py is what these are held to (same float32
 * arithmetic, results rounded once into the tensor's dtype, round-to-nearest-even as torch rounds); they exist
 * because that formulation is 4-6 eager torch ops a call, and a small batch pays ~3-5 us per op where one loop pays
 * less than one.
 *
 * Built at first use by ascend_kernels.reference.native_build (cc -O3 -march=native -fopenmp) and called through
 * ctypes with tensors' data pointers and element strides; the caller checks dtypes, devices and layouts. Linked
 * against libgomp.so.1, which resolves to the copy torch already loaded: one OpenMP runtime, one thread pool.
 * Return value: 0, or 1 + the index of the first out-of-range position (rotary).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static inline const char *ak_row(const void *base, int dt, int64_t row, int64_t stride) {
    return (const char *)base + (size_t)(row * stride) * ak_size(dt);
}

#define AK_NAME(f) f##_f32
#define AK_T float
#define AK_GET(v) (v)
#define AK_PUT(v) (v)
#include "layers_typed.h"
#undef AK_NAME
#undef AK_T
#undef AK_GET
#undef AK_PUT

#define AK_NAME(f) f##_bf16
#define AK_T uint16_t
#define AK_GET(v) ak_bf16_to_f32(v)
#define AK_PUT(v) ak_f32_to_bf16(v)
#include "layers_typed.h"
#undef AK_NAME
#undef AK_T
#undef AK_GET
#undef AK_PUT

#define AK_NAME(f) f##_f16
#define AK_T _Float16
#define AK_GET(v) ((float)(v))
#define AK_PUT(v) ((_Float16)(v))
#include "layers_typed.h"
#undef AK_NAME
#undef AK_T
#undef AK_GET
#undef AK_PUT

#if defined(__AVX2__)
#include "bf16_avx2.h"

/* ak_rms_row_bf16 sixteen elements a step (bf16_avx2.h says why); the same results but for the order of the sum of
 * squares. */
AK_UNFUSED static void ak_rms_row_bf16_avx2(const uint16_t *x, const uint16_t *res, const float *wf, uint16_t *out,
                                            uint16_t *h_out, int64_t n, float eps) {
    const int64_t body = n - n % 16;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t i = 0; i < body; i += 16) {
        __m256 a0 = ak_v8_from_bf16(x + i), a1 = ak_v8_from_bf16(x + i + 8);
        if (res != NULL) {
            a0 = _mm256_add_ps(a0, ak_v8_from_bf16(res + i));
            a1 = _mm256_add_ps(a1, ak_v8_from_bf16(res + i + 8));
            ak_v16_store_bf16(h_out + i, ak_v8_round_bf16(a0), ak_v8_round_bf16(a1));
        }
        acc0 = _mm256_add_ps(acc0, _mm256_mul_ps(a0, a0));
        acc1 = _mm256_add_ps(acc1, _mm256_mul_ps(a1, a1));
    }
    float ss = ak_v8_sum(_mm256_add_ps(acc0, acc1));
    for (int64_t i = body; i < n; i++) {
        const float a = res == NULL ? ak_bf16_to_f32(x[i]) : ak_bf16_to_f32(x[i]) + ak_bf16_to_f32(res[i]);
        if (res != NULL) h_out[i] = ak_f32_to_bf16(a);
        ss += a * a;
    }
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    const __m256 vinv = _mm256_set1_ps(inv);
    for (int64_t i = 0; i < body; i += 16) {
        __m256 a0 = ak_v8_from_bf16(x + i), a1 = ak_v8_from_bf16(x + i + 8);
        if (res != NULL) {
            a0 = _mm256_add_ps(a0, ak_v8_from_bf16(res + i));
            a1 = _mm256_add_ps(a1, ak_v8_from_bf16(res + i + 8));
        }
        a0 = _mm256_mul_ps(_mm256_mul_ps(a0, vinv), _mm256_loadu_ps(wf + i));
        a1 = _mm256_mul_ps(_mm256_mul_ps(a1, vinv), _mm256_loadu_ps(wf + i + 8));
        ak_v16_store_bf16(out + i, ak_v8_round_bf16(a0), ak_v8_round_bf16(a1));
    }
    for (int64_t i = body; i < n; i++) {
        const float a = res == NULL ? ak_bf16_to_f32(x[i]) : ak_bf16_to_f32(x[i]) + ak_bf16_to_f32(res[i]);
        out[i] = ak_f32_to_bf16(a * inv * wf[i]);
    }
}

/* ak_rope_head_bf16's neox rotation sixteen pairs a step; GPT-J's interleaved pairs keep the scalar loop (which, as
 * every loop of layers_typed.h, GCC may fuse: exact alike for a bfloat16 cache, whose products are exact). */
AK_UNFUSED static void ak_rope_head_bf16_avx2(uint16_t *head, const float *cs, const float *sn, int64_t half,
                                              int neox) {
    if (!neox || half < 16) {
        ak_rope_head_bf16(head, cs, sn, half, neox);
        return;
    }
    uint16_t *second = head + half; /* half >= 16: a step's reads of one half never meet its writes of the other */
    const int64_t body = half - half % 16;
    for (int64_t i = 0; i < body; i += 16) {
        __m256i x[2], y[2];
        for (int j = 0; j < 2; j++) {
            const __m256 a = ak_v8_from_bf16(head + i + 8 * j), b = ak_v8_from_bf16(second + i + 8 * j);
            const __m256 c = _mm256_loadu_ps(cs + i + 8 * j), s = _mm256_loadu_ps(sn + i + 8 * j);
            x[j] = ak_v8_round_bf16(_mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, s)));
            y[j] = ak_v8_round_bf16(_mm256_add_ps(_mm256_mul_ps(b, c), _mm256_mul_ps(a, s)));
        }
        ak_v16_store_bf16(head + i, x[0], x[1]);
        ak_v16_store_bf16(second + i, y[0], y[1]);
    }
    for (int64_t i = body; i < half; i++) {
        const float a = ak_bf16_to_f32(head[i]), b = ak_bf16_to_f32(second[i]);
        head[i] = ak_f32_to_bf16(a * cs[i] - b * sn[i]);
        second[i] = ak_f32_to_bf16(b * cs[i] + a * sn[i]);
    }
}
#define AK_RMS_ROW_BF16 ak_rms_row_bf16_avx2
#define AK_ROPE_HEAD_BF16 ak_rope_head_bf16_avx2
#else
#define AK_RMS_ROW_BF16 ak_rms_row_bf16
#define AK_ROPE_HEAD_BF16 ak_rope_head_bf16
#endif

/* out[r] = h[r] * rsqrt(mean(h[r]^2) + eps) * w, h = x (+ residual, also written to h_out); x, residual, out and
 * h_out of dtype x_dt, the weight of w_dt. Strides are in elements; rows of n contiguous elements. res / h_out are
 * NULL without a residual. */
int ak_rms_norm(const void *x, int64_t x_rs, int x_dt, const void *res, int64_t res_rs, const void *w,
                int w_dt, void *out, int64_t out_rs, void *h_out, int64_t h_rs, int64_t rows, int64_t n, float eps,
                int threads) {
    float *wf = w_dt == AK_F32 ? NULL : (float *)malloc((size_t)n * 4);
    if (w_dt != AK_F32) {
        if (wf == NULL) return -1;
        ak_load(w, w_dt, wf, n);
    }
    const float *wr = wf == NULL ? (const float *)w : wf;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && rows > 1 && rows * n >= AK_PARALLEL_MIN_ELEMS)
    for (int64_t r = 0; r < rows; r++) {
        const void *xr = ak_row(x, x_dt, r, x_rs);
        const void *rr = res == NULL ? NULL : ak_row(res, x_dt, r, res_rs);
        void *o = (void *)ak_row(out, x_dt, r, out_rs);
        void *ho = h_out == NULL ? NULL : (void *)ak_row(h_out, x_dt, r, h_rs);
        if (x_dt == AK_F32)
            ak_rms_row_f32(xr, rr, wr, o, ho, n, eps);
        else if (x_dt == AK_BF16)
            AK_RMS_ROW_BF16(xr, rr, wr, o, ho, n, eps);
        else
            ak_rms_row_f16(xr, rr, wr, o, ho, n, eps);
    }
    free(wf);
    return 0;
}

/* Rotate in place every head of q and k (k NULL: none) at each token by the angle its position selects from cache
 * (`[max_position, rot]`: cos half, then sin half): x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin, over the first rot
 * dims of each head; neox pairs dims (i, i + rot/2), GPT-J (2i, 2i + 1). q and k of dtype x_dt; strides (token,
 * head) in elements. Nothing is written when a position is out of range. */
int64_t ak_rotary(const int64_t *pos, int64_t tokens, const void *cache, int c_dt, int64_t c_rs, int64_t c_rows,
                  void *q, int64_t q_ts, int64_t q_hs, int64_t q_heads, void *k, int64_t k_ts, int64_t k_hs,
                  int64_t k_heads, int x_dt, int64_t rot, int neox, int threads) {
    for (int64_t t = 0; t < tokens; t++)
        if (pos[t] < 0 || pos[t] >= c_rows) return 1 + t;
    const int64_t half = rot / 2;
    const int64_t heads = q_heads + (k == NULL ? 0 : k_heads);
    const size_t esize = ak_size(x_dt);
    int failed = 0;
#pragma omp parallel num_threads(threads) if (threads > 1 && tokens > 1 && tokens * heads * rot >= AK_PARALLEL_MIN_ELEMS)
    {
        /* a float32 cache is read in place; another dtype's row is converted into this scratch */
        float *buf = c_dt == AK_F32 ? NULL : (float *)malloc((size_t)half * 4 * 2);
        if (c_dt != AK_F32 && buf == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tokens; t++) {
            if (c_dt != AK_F32 && buf == NULL) continue;
            const char *row = ak_row(cache, c_dt, pos[t], c_rs);
            const float *cs = (const float *)row, *sn = (const float *)row + half;
            if (buf != NULL) {
                ak_load(row, c_dt, buf, half);
                ak_load(row + (size_t)half * ak_size(c_dt), c_dt, buf + half, half);
                cs = buf;
                sn = buf + half;
            }
            for (int64_t hd = 0; hd < heads; hd++) {
                char *head = hd < q_heads ? (char *)q + (size_t)(t * q_ts + hd * q_hs) * esize
                                          : (char *)k + (size_t)(t * k_ts + (hd - q_heads) * k_hs) * esize;
                if (x_dt == AK_F32)
                    ak_rope_head_f32((float *)head, cs, sn, half, neox);
                else if (x_dt == AK_BF16)
                    AK_ROPE_HEAD_BF16((uint16_t *)head, cs, sn, half, neox);
                else
                    ak_rope_head_f16((_Float16 *)head, cs, sn, half, neox);
            }
        }
        free(buf);
    }
    return failed ? -1 : 0;
}

/* out[r] = silu(x[r, :d]) * x[r, d:]; x rows of 2d, out rows of d, one dtype; strides in elements. */
int ak_silu_and_mul(const void *x, int64_t x_rs, int dt, void *out, int64_t o_rs, int64_t rows, int64_t d,
                    int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && rows > 1 && rows * d >= AK_PARALLEL_MIN_ELEMS)
    for (int64_t r = 0; r < rows; r++) {
        const char *xr = ak_row(x, dt, r, x_rs);
        char *o = (char *)ak_row(out, dt, r, o_rs);
        if (dt == AK_F32)
            ak_silu_row_f32((const float *)xr, (const float *)xr + d, (float *)o, d);
        else if (dt == AK_BF16)
            ak_silu_row_bf16((const uint16_t *)xr, (const uint16_t *)xr + d, (uint16_t *)o, d);
        else
            ak_silu_row_f16((const _Float16 *)xr, (const _Float16 *)xr + d, (_Float16 *)o, d);
    }
    return 0;
}

/* One token's heads (src: token row at s, head stride s_hs; dst: slot row at c, head stride c_hs), n elements a head,
 * converted from dtype s_dt into c_dt (rounded to nearest even, as torch's .to() rounds). */
static void ak_copy_heads(const char *s, int64_t s_hs, int s_dt, char *c, int64_t c_hs, int c_dt, int64_t heads,
                          int64_t n, float *buf) {
    for (int64_t h = 0; h < heads; h++) {
        const char *sh = s + (size_t)(h * s_hs) * ak_size(s_dt);
        char *ch = c + (size_t)(h * c_hs) * ak_size(c_dt);
        if (s_dt == c_dt) {
            memcpy(ch, sh, (size_t)n * ak_size(c_dt));
        } else {
            ak_load(sh, s_dt, buf, n);
            ak_store(ch, c_dt, buf, n);
        }
    }
}

/* Write each token's K and V heads into the caches at its slot (block = slot / block_size, offset = slot % block_size)
 * through the caches' strides (block, slot, head); a negative slot (padding) writes nothing. Returns 0, or 1 + the
 * index of the first slot past the caches (then nothing is written). */
int64_t ak_cache_write(const void *slots, int slots_i64, int64_t n, const void *k, int64_t k_ts, int64_t k_hs,
                       const void *v, int64_t v_ts, int64_t v_hs, int src_dt, void *kc, int64_t kc_bs, int64_t kc_ss,
                       int64_t kc_hs, void *vc, int64_t vc_bs, int64_t vc_ss, int64_t vc_hs, int cache_dt,
                       int64_t heads, int64_t d, int64_t dv, int64_t block_size, int64_t num_blocks, int threads) {
    for (int64_t t = 0; t < n; t++) {
        const int64_t slot = slots_i64 ? ((const int64_t *)slots)[t] : ((const int32_t *)slots)[t];
        if (slot >= num_blocks * block_size) return 1 + t;
    }
    const int64_t width = d > dv ? d : dv;
    int failed = 0;
#pragma omp parallel num_threads(threads) if (threads > 1 && n > 1 && n * heads * (d + dv) >= 2 * AK_PARALLEL_MIN_ELEMS)
    {
        float *buf = src_dt == cache_dt ? NULL : (float *)malloc(sizeof(float) * (size_t)width);
        if (src_dt != cache_dt && buf == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < n; t++) {
            const int64_t slot = slots_i64 ? ((const int64_t *)slots)[t] : ((const int32_t *)slots)[t];
            if (slot < 0 || (src_dt != cache_dt && buf == NULL)) continue;
            const int64_t blk = slot / block_size, off = slot % block_size;
            ak_copy_heads((const char *)k + (size_t)(t * k_ts) * ak_size(src_dt), k_hs, src_dt,
                          (char *)kc + (size_t)(blk * kc_bs + off * kc_ss) * ak_size(cache_dt), kc_hs, cache_dt, heads,
                          d, buf);
            ak_copy_heads((const char *)v + (size_t)(t * v_ts) * ak_size(src_dt), v_hs, src_dt,
                          (char *)vc + (size_t)(blk * vc_bs + off * vc_ss) * ak_size(cache_dt), vc_hs, cache_dt, heads,
                          dv, buf);
        }
        free(buf);
    }
    return failed ? -1 : 0;
}
