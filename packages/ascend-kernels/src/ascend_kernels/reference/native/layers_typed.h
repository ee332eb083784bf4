/* The per-row loops of layers.c for one element type, included once per type with
 *   AK_T          the element type,
 *   AK_GET(v)     an element as float32,
 *   AK_PUT(v)     a float32 rounded into the element type,
 *   AK_NAME(f)    f suffixed with the type's name.
 * One function per type keeps every loop free of dtype branches, so the compiler vectorizes each. */

/* h = x (+ res, written to h_out), then out = h * rsqrt(mean(h^2) + eps) * w. The second pass recomputes h from the
 * inputs (the same float32 sum) rather than keeping it: no scratch row, and the inputs are still in cache. */
__attribute__((unused)) /* bfloat16's: replaced by an AVX2 version where there is one */
static void AK_NAME(ak_rms_row)(const AK_T *x, const AK_T *res, const float *wf, AK_T *out, AK_T *h_out, int64_t n,
                                float eps) {
    float ss = 0.0f;
    if (res != NULL) {
#pragma omp simd reduction(+ : ss)
        for (int64_t i = 0; i < n; i++) {
            const float a = AK_GET(x[i]) + AK_GET(res[i]);
            h_out[i] = AK_PUT(a);
            ss += a * a;
        }
        const float inv = 1.0f / sqrtf(ss / (float)n + eps);
#pragma omp simd
        for (int64_t i = 0; i < n; i++) out[i] = AK_PUT((AK_GET(x[i]) + AK_GET(res[i])) * inv * wf[i]);
    } else {
#pragma omp simd reduction(+ : ss)
        for (int64_t i = 0; i < n; i++) {
            const float a = AK_GET(x[i]);
            ss += a * a;
        }
        const float inv = 1.0f / sqrtf(ss / (float)n + eps);
#pragma omp simd
        for (int64_t i = 0; i < n; i++) out[i] = AK_PUT(AK_GET(x[i]) * inv * wf[i]);
    }
}

/* One head's first 2 * half dims rotated in place: neox pairs (i, i + half), GPT-J (2i, 2i + 1). */
static void AK_NAME(ak_rope_head)(AK_T *head, const float *cs, const float *sn, int64_t half, int neox) {
    if (neox) {
        AK_T *second = head + half;
#pragma omp simd
        for (int64_t i = 0; i < half; i++) {
            const float a = AK_GET(head[i]), b = AK_GET(second[i]);
            head[i] = AK_PUT(a * cs[i] - b * sn[i]);
            second[i] = AK_PUT(b * cs[i] + a * sn[i]);
        }
    } else {
        for (int64_t i = 0; i < half; i++) {
            const float a = AK_GET(head[2 * i]), b = AK_GET(head[2 * i + 1]);
            head[2 * i] = AK_PUT(a * cs[i] - b * sn[i]);
            head[2 * i + 1] = AK_PUT(b * cs[i] + a * sn[i]);
        }
    }
}

/* out = silu(gate) * up over one row: silu(a) = a * sigmoid(a), the sigmoid from exp(-|a|) (never overflows). */
static void AK_NAME(ak_silu_row)(const AK_T *gate, const AK_T *up, AK_T *out, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        const float a = AK_GET(gate[i]);
        const float e = ak_exp_nonpositive(a < 0.0f ? a : -a);
        const float sig = a < 0.0f ? e / (1.0f + e) : 1.0f / (1.0f + e);
        out[i] = AK_PUT(a * sig * AK_GET(up[i]));
    }
}
