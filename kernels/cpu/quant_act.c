/* Activation quantization for the approximate fast path (kcpu_matmul_fast): each block of 256
 * fp32 activations becomes int8 values with one fp32 scale d = max|x| / 127 (round to nearest
 * even), plus the sums of each 16 int8 values (used by weight types with mins or offsets). The
 * reference path never quantizes activations; this trades about 0.5% relative error per dot
 * (test_matmul prints it) for integer multiply-adds (AVX2 maddubs). Also the dispatch of the
 * per-type integer dots. */
#include <math.h>

#include "kernels/cpu/quant_impl.h"

static const struct quant_ops *const xq8_ops[KT_COUNT] = {
    [KT_Q8_0] = &quant_ops_q8_0,
    [KT_Q4_K] = &quant_ops_q4_k,
    [KT_Q5_K] = &quant_ops_q5_k,
    [KT_Q6_K] = &quant_ops_q6_k,
};

bool quant_has_xq8(int type)
{
	return type >= 0 && type < KT_COUNT && xq8_ops[type] && xq8_ops[type]->dot_xq8;
}

float quant_dot_xq8(int type, const void *row, const struct quant_xq8 *x, int64_t n)
{
	return xq8_ops[type]->dot_xq8(row, x, n);
}

void quant_xq8_row(const float *x, struct quant_xq8 *out, int64_t n)
{
	for (int64_t b = 0; b < n / 256; b++, x += 256, out++) {
#if QUANT_AVX2
		const __m256 sign = _mm256_set1_ps(-0.0f);
		__m256 m = _mm256_setzero_ps();
		for (int k = 0; k < 256; k += 8)
			m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + k)));
		__m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
		h = _mm_max_ps(h, _mm_movehl_ps(h, h));
		h = _mm_max_ss(h, _mm_movehdup_ps(h));
		float amax = _mm_cvtss_f32(h);
		__m256 vid = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
		out->d = amax / 127.0f;
		for (int k = 0; k < 256; k += 32) {
			__m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k), vid));
			__m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k + 8), vid));
			__m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k + 16), vid));
			__m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k + 24), vid));
			/* sums of elements k..k+15 and k+16..k+31 (exact in int32) */
			__m256i s01 = _mm256_add_epi32(i0, i1), s23 = _mm256_add_epi32(i2, i3);
			__m256i hs = _mm256_hadd_epi32(s01, s23); /* pairs within lanes */
			hs = _mm256_hadd_epi32(hs, hs);
			/* lane 0: [s01 lo-half pairs.., s23 ..], reduce to the two 16-sums */
			int32_t t[8];
			_mm256_storeu_si256((__m256i *)t, hs);
			out->bsums[k / 16] = (int16_t)(t[0] + t[4]);
			out->bsums[k / 16 + 1] = (int16_t)(t[1] + t[5]);
			/* packs interleave 128-bit lanes; the permute restores element order */
			__m256i p01 = _mm256_packs_epi32(i0, i1), p23 = _mm256_packs_epi32(i2, i3);
			__m256i p = _mm256_packs_epi16(p01, p23);
			p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
			_mm256_storeu_si256((__m256i *)(out->q + k), p);
		}
#else
		float amax = 0.0f;
		for (int j = 0; j < 256; j++)
			amax = fmaxf(amax, fabsf(x[j]));
		float id = amax > 0.0f ? 127.0f / amax : 0.0f;
		out->d = amax / 127.0f;
		for (int g = 0; g < 16; g++) {
			int sum = 0;
			for (int j = 16 * g; j < 16 * g + 16; j++) {
				out->q[j] = (int8_t)lrintf(x[j] * id);
				sum += out->q[j];
			}
			out->bsums[g] = (int16_t)sum;
		}
#endif
	}
}
