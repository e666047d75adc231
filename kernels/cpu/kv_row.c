/* Dot products and axpy of fp32 activations with KV-cache rows (fp32 or bf16): the inner loops of
 * the MLA attention and the DSA indexer. AVX2/FMA with two 8-lane accumulators when compiled for
 * it, a scalar 8-partial-sum version otherwise (both accumulate in fp32). */
#include "kernels/kernels.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

static inline float hsum(__m256 v)
{
	__m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	a = _mm_add_ps(a, _mm_movehl_ps(a, a));
	a = _mm_add_ss(a, _mm_movehdup_ps(a));
	return _mm_cvtss_f32(a);
}

static inline __m256 bf16x8(const uint16_t *p)
{
	__m128i h = _mm_loadu_si128((const __m128i *)p);
	return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static float dot_f32(const float *a, const float *b, int64_t n)
{
	__m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
	int64_t i = 0;
	for (; i + 16 <= n; i += 16) {
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
		s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
	}
	for (; i + 8 <= n; i += 8)
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
	float r = hsum(_mm256_add_ps(s0, s1));
	for (; i < n; i++)
		r += a[i] * b[i];
	return r;
}

static float dot_bf16(const float *a, const uint16_t *b, int64_t n)
{
	__m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
	int64_t i = 0;
	for (; i + 16 <= n; i += 16) {
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), bf16x8(b + i), s0);
		s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), bf16x8(b + i + 8), s1);
	}
	for (; i + 8 <= n; i += 8)
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), bf16x8(b + i), s0);
	float r = hsum(_mm256_add_ps(s0, s1));
	for (; i < n; i++)
		r += a[i] * kbf16_to_f32(b[i]);
	return r;
}

/* out += p * row */
static void axpy_f32(float *out, float p, const float *row, int64_t n)
{
	__m256 vp = _mm256_set1_ps(p);
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(out + i,
		                 _mm256_fmadd_ps(vp, _mm256_loadu_ps(row + i), _mm256_loadu_ps(out + i)));
	for (; i < n; i++)
		out[i] += p * row[i];
}

static void axpy_bf16(float *out, float p, const uint16_t *row, int64_t n)
{
	__m256 vp = _mm256_set1_ps(p);
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(out + i, _mm256_fmadd_ps(vp, bf16x8(row + i), _mm256_loadu_ps(out + i)));
	for (; i < n; i++)
		out[i] += p * kbf16_to_f32(row[i]);
}
#else
static float dot_f32(const float *a, const float *b, int64_t n)
{
	/* 8 partial sums: less rounding than one chain */
	float s[8] = {0};
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (int j = 0; j < 8; j++)
			s[j] += a[i + j] * b[i + j];
	float r = 0;
	for (; i < n; i++)
		r += a[i] * b[i];
	return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])) + r;
}

static float dot_bf16(const float *a, const uint16_t *b, int64_t n)
{
	float s[8] = {0};
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (int j = 0; j < 8; j++)
			s[j] += a[i + j] * kbf16_to_f32(b[i + j]);
	float r = 0;
	for (; i < n; i++)
		r += a[i] * kbf16_to_f32(b[i]);
	return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])) + r;
}

static void axpy_f32(float *out, float p, const float *row, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		out[i] += p * row[i];
}

static void axpy_bf16(float *out, float p, const uint16_t *row, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		out[i] += p * kbf16_to_f32(row[i]);
}
#endif

float kcpu_kv_dot(const float *a, const void *row, int bf16, int64_t n)
{
	return bf16 ? dot_bf16(a, row, n) : dot_f32(a, row, n);
}

void kcpu_kv_axpy(float *out, float p, const void *row, int bf16, int64_t n)
{
	if (bf16)
		axpy_bf16(out, p, row, n);
	else
		axpy_f32(out, p, row, n);
}
