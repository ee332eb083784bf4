/* What the native loops share: the dtype codes the Python side passes, float32 <-> bfloat16 / float16 conversion
 * as torch rounds, row loads and stores through those conversions, and block-table reads. */
#ifndef AK_COMMON_H
#define AK_COMMON_H

#include <math.h>
#include <stdint.h>
#include <string.h>

enum { AK_F32 = 0, AK_BF16 = 1, AK_F16 = 2 };

/* Below this many elements a call stays on the calling thread: waking the pool costs more than the work. */
#define AK_PARALLEL_MIN_ELEMS 32768

static inline size_t ak_size(int dt) { return dt == AK_F32 ? 4 : 2; }

static inline float ak_f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t ak_bits_of_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float ak_bf16_to_f32(uint16_t b) { return ak_f32_from_bits((uint32_t)b << 16); }

static inline uint16_t ak_f32_to_bf16(float f) {
    const uint32_t u = ak_bits_of_f32(f);
    uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    return (u & 0x7FFFFFFFu) > 0x7F800000u ? (uint16_t)0x7FC0 : (uint16_t)rounded; /* NaN as torch writes it */
}

/* n elements of dtype dt at src into float32 dst. */
static inline void ak_load(const void *src, int dt, float *dst, int64_t n) {
    if (dt == AK_F32) {
        memcpy(dst, src, (size_t)n * 4);
    } else if (dt == AK_BF16) {
        const uint16_t *s = (const uint16_t *)src;
        for (int64_t i = 0; i < n; i++) dst[i] = ak_bf16_to_f32(s[i]);
    } else {
        const _Float16 *s = (const _Float16 *)src;
        for (int64_t i = 0; i < n; i++) dst[i] = (float)s[i];
    }
}

/* n float32 values at src into dtype dt at dst (rounded to nearest even). */
static inline void ak_store(void *dst, int dt, const float *src, int64_t n) {
    if (dt == AK_F32) {
        memcpy(dst, src, (size_t)n * 4);
    } else if (dt == AK_BF16) {
        uint16_t *d = (uint16_t *)dst;
        for (int64_t i = 0; i < n; i++) d[i] = ak_f32_to_bf16(src[i]);
    } else {
        _Float16 *d = (_Float16 *)dst;
        for (int64_t i = 0; i < n; i++) d[i] = (_Float16)src[i];
    }
}

/* exp(x) for x <= 0 (softmax after subtracting the maximum) without a libm call, so the loop over a row's scores
 * vectorizes: 2^n * 2^f with n = round(x log2 e), |f| <= 1/2, 2^f by its degree-7 Taylor polynomial (relative
 * error ~5e-9, below float32's rounding). */
static inline float ak_exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float t = x * 1.4426950408889634f;
    const float n = nearbyintf(t);
    const float f = (t - n) * 0.6931471805599453f; /* f ln 2 in [-ln2/2, ln2/2] */
    float p = 1.0f / 5040.0f;
    p = p * f + 1.0f / 720.0f;
    p = p * f + 1.0f / 120.0f;
    p = p * f + 1.0f / 24.0f;
    p = p * f + 1.0f / 6.0f;
    p = p * f + 0.5f;
    p = p * f + 1.0f;
    p = p * f + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}

/* Entry i of an int32 or int64 array (lengths, offsets, block tables). */
static inline int64_t ak_index(const void *p, int is_i64, int64_t i) {
    return is_i64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

/* Store v as entry i of an int32 or int64 array. */
static inline void ak_set(void *p, int is_i64, int64_t i, int64_t v) {
    if (is_i64)
        ((int64_t *)p)[i] = v;
    else
        ((int32_t *)p)[i] = (int32_t)v;
}

/* Rows [0, nr) of an offsets array of nr + 1 entries non-decreasing from its first entry up to at most `limit`. */
static inline int ak_offsets_ok(const void *off, int off_i64, int64_t nr, int64_t limit) {
    for (int64_t r = 0; r < nr; r++) {
        const int64_t a = ak_index(off, off_i64, r), b = ak_index(off, off_i64, r + 1);
        if (a < 0 || b < a || b > limit) return 0;
    }
    return 1;
}

/* Block id `at` of the table, clamped into [0, num_blocks) as the torch formulation clamps it. */
static inline int64_t ak_block(const void *table, int is_i64, int64_t at, int64_t num_blocks) {
    const int64_t blk = ak_index(table, is_i64, at);
    return blk < 0 ? 0 : (blk >= num_blocks ? num_blocks - 1 : blk);
}

/* The block id and the slot in it of each of a request's keys [start, len) (its table row starting at `row`): one
 * table read per block, no division per key; both the key and the value reads walk these. */
static inline void ak_key_slots(const void *table, int table_i64, int64_t row, int64_t num_blocks,
                                int64_t block_size, int64_t start, int64_t len, int64_t *blk_of, int64_t *slot_of) {
    for (int64_t pos = start, j = 0; pos < len;) {
        const int64_t blk = ak_block(table, table_i64, row + pos / block_size, num_blocks);
        const int64_t edge = (pos / block_size + 1) * block_size, end = edge < len ? edge : len;
        for (int64_t slot = pos % block_size; pos < end; pos++, slot++, j++) {
            blk_of[j] = blk;
            slot_of[j] = slot;
        }
    }
}

#endif
