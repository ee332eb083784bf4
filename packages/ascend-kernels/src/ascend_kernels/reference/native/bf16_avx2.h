/* bfloat16 loads and round-to-nearest-even stores eight lanes at a time on AVX2 hosts without AVX-512 BF16.
 *
 * Why by hand: GCC vectorizes common.h's scalar ak_f32_to_bf16 into ~11 operations per eight values (the NaN test
 * as and / min / compare, a mask of the packed halves), which made bfloat16 rotary 2x its float32 time; these take
 * 7 (NaN by one unordered compare, no mask before the saturating pack: the shifted values are below 2^16). Same
 * results bit for bit as ak_f32_to_bf16: NaN becomes 0x7FC0, everything else (u + 0x7FFF + lsb) >> 16.
 * Included only where __AVX2__ is defined; callers keep their scalar loop for other hosts and for tails. */
#ifndef AK_BF16_AVX2_H
#define AK_BF16_AVX2_H

#include <immintrin.h>
#include <stdint.h>

/* For the functions built on these: torch's float32 arithmetic is a multiply, then an add, each rounded; GCC would
 * fuse intrinsics' multiplies and adds (-ffp-contract=fast), and not alike in a function's vector body and its
 * scalar tail. */
#define AK_UNFUSED __attribute__((optimize("fp-contract=off")))

/* eight bfloat16 values as float32 */
static inline __m256 ak_v8_from_bf16(const uint16_t *p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* eight float32 values rounded to bfloat16, each in the low 16 bits of its 32-bit lane */
static inline __m256i ak_v8_round_bf16(__m256 v) {
    const __m256 quiet_nan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000));
    v = _mm256_blendv_ps(v, quiet_nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    return _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
}

/* sixteen rounded values (lo: elements 0-7, hi: 8-15) stored as bfloat16 */
static inline void ak_v16_store_bf16(uint16_t *p, __m256i lo, __m256i hi) {
    /* packus interleaves 128-bit lanes (lo0 hi0 lo1 hi1); the permute puts them back in order */
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8);
    _mm256_storeu_si256((__m256i *)p, packed);
}

/* the sum of a vector's eight lanes */
static inline float ak_v8_sum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#endif
