/* The inner loops of attention.c for one cache element type, included once per type with
 *   AK_T          the element type,
 *   AK_GET(v)     an element as float32,
 *   AK_NAME(f)    f suffixed with the type's name.
 * Keys and values are read in their own dtype and converted in the loop: no converted copy of a row. */

static inline float AK_NAME(ak_dot)(const float *a, const AK_T *b, int64_t n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += a[i] * AK_GET(b[i]);
    return s;
}

/* out[i * stride] = q_i . k for the g query rows q_i of qf (g x n) sharing one key row: four at a time, so k is
 * read once per four and four independent sums hide the multiply-add latency. */
static inline void AK_NAME(ak_dots)(const float *qf, int64_t g, const AK_T *k, int64_t n, float *out,
                                    int64_t stride) {
    int64_t i = 0;
    for (; i + 4 <= g; i += 4) {
        const float *q0 = qf + i * n, *q1 = q0 + n, *q2 = q1 + n, *q3 = q2 + n;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
        for (int64_t c = 0; c < n; c++) {
            const float kv = AK_GET(k[c]);
            s0 += q0[c] * kv;
            s1 += q1[c] * kv;
            s2 += q2[c] * kv;
            s3 += q3[c] * kv;
        }
        out[i * stride] = s0;
        out[(i + 1) * stride] = s1;
        out[(i + 2) * stride] = s2;
        out[(i + 3) * stride] = s3;
    }
    for (; i < g; i++) out[i * stride] = AK_NAME(ak_dot)(qf + i * n, k, n);
}

/* acc_i += p[i * stride] * v for the g accumulator rows of acc (g x n) sharing one value row: four at a time. */
static inline void AK_NAME(ak_axpys)(const float *p, int64_t stride, int64_t g, const AK_T *v, int64_t n,
                                     float *acc) {
    int64_t i = 0;
    for (; i + 4 <= g; i += 4) {
        float *a0 = acc + i * n, *a1 = a0 + n, *a2 = a1 + n, *a3 = a2 + n;
        const float p0 = p[i * stride], p1 = p[(i + 1) * stride], p2 = p[(i + 2) * stride], p3 = p[(i + 3) * stride];
#pragma omp simd
        for (int64_t c = 0; c < n; c++) {
            const float vv = AK_GET(v[c]);
            a0[c] += p0 * vv;
            a1[c] += p1 * vv;
            a2[c] += p2 * vv;
            a3[c] += p3 * vv;
        }
    }
    for (; i < g; i++) {
        float *a = acc + i * n;
        const float pi = p[i * stride];
#pragma omp simd
        for (int64_t c = 0; c < n; c++) a[c] += pi * AK_GET(v[c]);
    }
}

