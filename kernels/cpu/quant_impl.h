/* Internal to kernels/cpu: the per-type row functions behind kcpu_dequant_row / kcpu_dot_row /
 * kcpu_quantize_row (dispatch in quant.c), and the small SIMD helpers the families share.
 * Nothing outside kernels/cpu includes this; the public interface is kernels/kernels.h. */
#ifndef TANDEM_KERNELS_CPU_QUANT_IMPL_H
#define TANDEM_KERNELS_CPU_QUANT_IMPL_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kernels.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define QUANT_AVX2 1
#include <immintrin.h>
#else
#define QUANT_AVX2 0
#endif

struct quant_xq8;

/* One type's row functions. n is always a positive multiple of the type's block size (checked by
 * the dispatcher). dequant_ref is the scalar, spec-literal decoder; dequant may be a SIMD version
 * that must give bit-identical results; dot is the fast fp32 dot (NULL: the dispatcher uses the
 * generic block-dequant-then-multiply reference); quantize writes n/blck blocks. */
struct quant_ops {
	void (*dequant_ref)(const void *src, float *dst, int64_t n);
	void (*dequant)(const void *src, float *dst, int64_t n);
	float (*dot)(const void *row, const float *x, int64_t n);
	void (*quantize)(const float *src, void *dst, int64_t n);
	/* fp32 dot given xs[j] = sum of x[32j .. 32j+31] (precomputed once per activation row by
	 * the matmul; types with mins use it instead of summing x per row; NULL: use dot) */
	float (*dot_xsum)(const void *row, const float *x, const float *xs, int64_t n);
	/* integer dot with 8-bit activations (fast path only; NULL: not available) */
	float (*dot_xq8)(const void *row, const struct quant_xq8 *x, int64_t n);
};

/* An activation block of the approximate fast path (kcpu_matmul_fast), like ggml's Q8_K: 256
 * values quantized to int8 with one fp32 scale, x ~= d * q, plus the sums of each 16 q values
 * (for the weight types that carry mins or offsets). One scale per 256 lets the K-quant dots
 * accumulate a whole super-block in integers. */
struct quant_xq8 {
	float d;
	int16_t bsums[16];
	int8_t q[256];
};

/* Quantizes n (a multiple of 256) activations into n / 256 blocks (quant_act.c). */
void quant_xq8_row(const float *x, struct quant_xq8 *out, int64_t n);
/* Integer dots of a weight row with quantized activations; NULL where a type has none. */
float quant_dot_xq8(int type, const void *row, const struct quant_xq8 *x, int64_t n);
bool quant_has_xq8(int type);

/* Instruction-set variants of the integer dots, selected once by CPUID (quant_act.c). Tests
 * force each one through quant_xq8_select; it returns ERR_UNSUPPORTED where the CPU (or build) lacks
 * the variant and leaves the selection unchanged. QUANT_XQ8_AUTO: the best the CPU has. */
enum { QUANT_XQ8_AUTO = 0, QUANT_XQ8_AVX2 = 1, QUANT_XQ8_AVX512 = 2 };
int quant_xq8_select(int isa);
int quant_xq8_selected(void); /* the variant in use (QUANT_XQ8_AVX2 / _AVX512), 0 if none */
const char *quant_xq8_isa_name(int isa);
/* AVX-512 VNNI dots (quant_xq8_avx512.c; only called where the CPU has them) */
float quant_q8_0_dot_xq8_avx512(const void *row, const struct quant_xq8 *x, int64_t n);
float quant_q4_k_dot_xq8_avx512(const void *row, const struct quant_xq8 *x, int64_t n);
float quant_q5_k_dot_xq8_avx512(const void *row, const struct quant_xq8 *x, int64_t n);
float quant_q6_k_dot_xq8_avx512(const void *row, const struct quant_xq8 *x, int64_t n);

extern const struct quant_ops quant_ops_f32, quant_ops_f16, quant_ops_bf16;
extern const struct quant_ops quant_ops_q4_0, quant_ops_q4_1, quant_ops_q5_0, quant_ops_q5_1, quant_ops_q8_0,
    quant_ops_iq4_nl;
extern const struct quant_ops quant_ops_q2_k, quant_ops_q3_k, quant_ops_q4_k, quant_ops_q5_k, quant_ops_q6_k;
extern const struct quant_ops quant_ops_iq4_xs;
extern const struct quant_ops quant_ops_iq2_xxs, quant_ops_iq2_xs, quant_ops_iq2_s, quant_ops_iq3_xxs,
    quant_ops_iq3_s, quant_ops_iq1_s, quant_ops_iq1_m;

/* Direct row functions for hot loops (quant.c): quant_dot_for returns the type's fast dot, or
 * NULL and sets *ref to the generic reference (which takes the type). The caller has checked the
 * type and that n is a multiple of the block size. */
typedef float (*quant_dot_fn)(const void *row, const float *x, int64_t n);
typedef float (*quant_dot_ref_fn)(int type, const void *row, const float *x, int64_t n);
typedef void (*quant_dequant_fn)(const void *src, float *dst, int64_t n);
quant_dot_fn quant_dot_for(int type, quant_dot_ref_fn *ref);
typedef float (*quant_dot_xsum_fn)(const void *row, const float *x, const float *xs, int64_t n);
quant_dot_xsum_fn quant_dot_xsum_for(int type); /* NULL if the type has none */
quant_dequant_fn quant_dequant_for(int type);

/* The 16 non-uniform 4-bit levels of IQ4_NL / IQ4_XS (MODEL-SPEC.md §5.1). */
extern const int8_t quant_iq4nl_values[16];
/* Index of the level nearest to v (quant_legacy.c). */
int quant_iq4nl_nearest(float v);
/* Best scale for len (<= 32) values on that grid; q receives the grid indices (quant_legacy.c). */
float quant_iq4nl_fit(const float *x, int len, int *q);

/* Little-endian field readers (blocks are packed, fields may be unaligned). */
static inline uint16_t quant_rd16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (p[1] << 8));
}

static inline uint32_t quant_rd32(const uint8_t *p)
{
	return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline void quant_wr16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

/* fp16 block scale -> float. F16C gives exactly kfp16_to_f32's result (test_quant checks all
 * 65536 values) without a call per block. */
static inline float quant_h2f(uint16_t h)
{
#if QUANT_AVX2
	return _cvtsh_ss(h);
#else
	return kfp16_to_f32(h);
#endif
}

static inline float quant_fp16(const uint8_t *p)
{
	return quant_h2f(quant_rd16(p));
}

/* Round half away from zero, as ggml's nearest_int does for the values quantizers produce.
 * NaN gives 0 and huge values saturate (float -> int conversion of those is undefined). */
static inline int quant_nearest(float v)
{
	if (!(v > -1e9f && v < 1e9f))
		return v >= 1e9f ? 1000000000 : v <= -1e9f ? -1000000000 : 0;
	return (int)(v >= 0.0f ? v + 0.5f : v - 0.5f);
}

#if QUANT_AVX2
/* Software prefetch distance of the fast path's integer dots, in bytes (quant_act.c; a variable
 * so measurements can tune it). One thread streaming weights from DRAM keeps too few misses in
 * flight when the loop also has real work per byte (the Q6_K lm_head dot ran at 5.7 GB/s against
 * a 10-12 GB/s plain read); prefetching ahead overlaps the two. */
extern int quant_xq8_pf_dist;

/* prefetches the bytes quant_xq8_pf_dist after [p, p + bytes); prefetches never fault, so
 * running past the end of the matrix is harmless */
static inline void quant_prefetch(const void *p, int bytes)
{
	for (int o = 0; o < bytes; o += 64)
		_mm_prefetch((const char *)p + quant_xq8_pf_dist + o, _MM_HINT_T0);
}

static inline float quant_hsum(__m256 v)
{
	__m128 lo = _mm256_castps256_ps128(v);
	__m128 hi = _mm256_extractf128_ps(v, 1);
	lo = _mm_add_ps(lo, hi);
	lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
	lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
	return _mm_cvtss_f32(lo);
}

/* Exchanges two accumulators: alternating between them per block gives two independent FMA
 * chains (the swap itself is free: register renaming). */
static inline void swap_ps(__m256 *a, __m256 *b)
{
	__m256 t = *a;
	*a = *b;
	*b = t;
}

/* 8 signed bytes -> 8 floats */
static inline __m256 quant_i8x8_ps(const void *p)
{
	__m128i b = _mm_loadl_epi64((const __m128i *)p);
	return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}

/* 16 signed byte values (elements e..e+15) times x[e..e+15], accumulated into acc */
static inline __m256 quant_fma16_i8(__m128i q, const float *x, __m256 acc)
{
	__m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
	__m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)));
	acc = _mm256_fmadd_ps(f0, _mm256_loadu_ps(x), acc);
	return _mm256_fmadd_ps(f1, _mm256_loadu_ps(x + 8), acc);
}

/* sum of x[0..15] and x[0..31] as 8-wide partial sums */
static inline __m256 quant_sum16(const float *x)
{
	return _mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8));
}

static inline __m256 quant_sum32(const float *x)
{
	return _mm256_add_ps(quant_sum16(x), quant_sum16(x + 16));
}

/* 16 byte values -> 16 floats stored at dst (exact) */
static inline void quant_store16_i8(__m128i q, float *dst, __m256 scale, __m256 offset, bool sub)
{
	__m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
	__m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)));
	if (sub) {
		_mm256_storeu_ps(dst, _mm256_sub_ps(_mm256_mul_ps(scale, f0), offset));
		_mm256_storeu_ps(dst + 8, _mm256_sub_ps(_mm256_mul_ps(scale, f1), offset));
	} else {
		_mm256_storeu_ps(dst, _mm256_mul_ps(scale, f0));
		_mm256_storeu_ps(dst + 8, _mm256_mul_ps(scale, f1));
	}
}
#endif

#endif
