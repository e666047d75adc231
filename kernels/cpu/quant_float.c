/* Row functions of the plain float types F32, F16 and BF16: conversion to fp32 (exact) and fp32
 * dots with 4 independent 8-wide FMA accumulators (enough to hide FMA latency on AVX2 cores).
 * BF16 is the type of the reference GGUFs' unquantized weights. */
#include "kernels/cpu/quant_impl.h"

/* ---- F32 ---------------------------------------------------------------------------------- */

static void f32_dequant(const void *src, float *dst, int64_t n)
{
	memcpy(dst, src, (size_t)n * sizeof(float));
}

static void f32_quantize(const float *src, void *dst, int64_t n)
{
	memcpy(dst, src, (size_t)n * sizeof(float));
}

#if QUANT_AVX2
static float f32_dot(const void *row, const float *x, int64_t n)
{
	const float *w = row;
	__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
	int64_t i = 0;

	for (; i + 32 <= n; i += 32) {
		a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
		a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
		a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(x + i + 16), a2);
		a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(x + i + 24), a3);
	}
	for (; i + 8 <= n; i += 8)
		a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
	float s = quant_hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
	for (; i < n; i++)
		s += w[i] * x[i];
	return s;
}
#endif

const struct quant_ops quant_ops_f32 = {
    .dequant_ref = f32_dequant,
    .dequant = f32_dequant,
#if QUANT_AVX2
    .dot = f32_dot,
#endif
    .quantize = f32_quantize,
};

/* ---- F16 ---------------------------------------------------------------------------------- */

static void f16_dequant_ref(const void *src, float *dst, int64_t n)
{
	const uint8_t *p = src;

	for (int64_t i = 0; i < n; i++)
		dst[i] = quant_fp16(p + 2 * i);
}

static void f16_quantize(const float *src, void *dst, int64_t n)
{
	uint8_t *p = dst;

	for (int64_t i = 0; i < n; i++)
		quant_wr16(p + 2 * i, kf32_to_fp16(src[i]));
}

#if QUANT_AVX2
static inline __m256 f16x8(const uint8_t *p)
{
	return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static void f16_dequant(const void *src, float *dst, int64_t n)
{
	const uint8_t *p = src;
	int64_t i = 0;

	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(dst + i, f16x8(p + 2 * i));
	for (; i < n; i++)
		dst[i] = quant_fp16(p + 2 * i);
}

static float f16_dot(const void *row, const float *x, int64_t n)
{
	const uint8_t *p = row;
	__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
	int64_t i = 0;

	for (; i + 32 <= n; i += 32) {
		a0 = _mm256_fmadd_ps(f16x8(p + 2 * i), _mm256_loadu_ps(x + i), a0);
		a1 = _mm256_fmadd_ps(f16x8(p + 2 * i + 16), _mm256_loadu_ps(x + i + 8), a1);
		a2 = _mm256_fmadd_ps(f16x8(p + 2 * i + 32), _mm256_loadu_ps(x + i + 16), a2);
		a3 = _mm256_fmadd_ps(f16x8(p + 2 * i + 48), _mm256_loadu_ps(x + i + 24), a3);
	}
	for (; i + 8 <= n; i += 8)
		a0 = _mm256_fmadd_ps(f16x8(p + 2 * i), _mm256_loadu_ps(x + i), a0);
	float s = quant_hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
	for (; i < n; i++)
		s += quant_fp16(p + 2 * i) * x[i];
	return s;
}
#endif

const struct quant_ops quant_ops_f16 = {
    .dequant_ref = f16_dequant_ref,
#if QUANT_AVX2
    .dequant = f16_dequant,
    .dot = f16_dot,
#endif
    .quantize = f16_quantize,
};

/* ---- BF16 --------------------------------------------------------------------------------- */

static void bf16_dequant_ref(const void *src, float *dst, int64_t n)
{
	const uint8_t *p = src;

	for (int64_t i = 0; i < n; i++)
		dst[i] = kbf16_to_f32(quant_rd16(p + 2 * i));
}

static void bf16_quantize(const float *src, void *dst, int64_t n)
{
	uint8_t *p = dst;

	for (int64_t i = 0; i < n; i++)
		quant_wr16(p + 2 * i, kf32_to_bf16(src[i]));
}

#if QUANT_AVX2
static inline __m256 bf16x8(const uint8_t *p)
{
	__m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
	return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

static void bf16_dequant(const void *src, float *dst, int64_t n)
{
	const uint8_t *p = src;
	int64_t i = 0;

	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(dst + i, bf16x8(p + 2 * i));
	for (; i < n; i++)
		dst[i] = kbf16_to_f32(quant_rd16(p + 2 * i));
}

static float bf16_dot(const void *row, const float *x, int64_t n)
{
	const uint8_t *p = row;
	__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
	int64_t i = 0;

	for (; i + 32 <= n; i += 32) {
		a0 = _mm256_fmadd_ps(bf16x8(p + 2 * i), _mm256_loadu_ps(x + i), a0);
		a1 = _mm256_fmadd_ps(bf16x8(p + 2 * i + 16), _mm256_loadu_ps(x + i + 8), a1);
		a2 = _mm256_fmadd_ps(bf16x8(p + 2 * i + 32), _mm256_loadu_ps(x + i + 16), a2);
		a3 = _mm256_fmadd_ps(bf16x8(p + 2 * i + 48), _mm256_loadu_ps(x + i + 24), a3);
	}
	for (; i + 8 <= n; i += 8)
		a0 = _mm256_fmadd_ps(bf16x8(p + 2 * i), _mm256_loadu_ps(x + i), a0);
	float s = quant_hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
	for (; i < n; i++)
		s += kbf16_to_f32(quant_rd16(p + 2 * i)) * x[i];
	return s;
}
#endif

const struct quant_ops quant_ops_bf16 = {
    .dequant_ref = bf16_dequant_ref,
#if QUANT_AVX2
    .dequant = bf16_dequant,
    .dot = bf16_dot,
#endif
    .quantize = bf16_quantize,
};
