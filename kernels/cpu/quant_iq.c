/* Row functions of IQ4_XS: 256-element super-blocks of 8 sub-blocks of 32, each with a 6-bit
 * signed scale under an fp16 super-scale, elements on the non-uniform IQ4_NL grid (MODEL-SPEC.md
 * §5.2). The scalar decoder evaluates ggml's dl = d * (ls - 32); y = dl * T[q] exactly; the AVX2
 * dot looks the grid values up with a byte shuffle and factors dl out of each sub-block. The
 * codebook types (IQ2_*, IQ3_*, IQ1_*) are in quant_iqg.c. */
#include <math.h>

#include "kernels/cpu/quant_impl.h"

#define QK_K 256

static int clampi(int v, int lo, int hi)
{
	return v < lo ? lo : v > hi ? hi : v;
}

static inline int iq4xs_ls(const uint8_t *b, int ib)
{
	uint16_t scales_h = quant_rd16(b + 2);
	const uint8_t *scales_l = b + 4;
	return ((scales_l[ib / 2] >> (4 * (ib % 2))) & 15) | (((scales_h >> (2 * ib)) & 3) << 4);
}

static void iq4_xs_dequant_ref(const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;

	for (int64_t i = 0; i < n / QK_K; i++, b += 136) {
		float d = quant_fp16(b);
		const uint8_t *qs = b + 8;
		float *y = dst + i * QK_K;
		for (int ib = 0; ib < 8; ib++, qs += 16, y += 32) {
			float dl = d * (float)(iq4xs_ls(b, ib) - 32);
			for (int j = 0; j < 16; j++) {
				y[j] = dl * (float)quant_iq4nl_values[qs[j] & 15];
				y[j + 16] = dl * (float)quant_iq4nl_values[qs[j] >> 4];
			}
		}
	}
}

static void iq4_xs_quantize(const float *src, void *dst, int64_t n)
{
	uint8_t *b = dst;
	float scale[8];
	int q[32];

	for (int64_t i = 0; i < n / QK_K; i++, b += 136) {
		const float *x = src + i * QK_K;
		float max_scale = 0.0f;
		for (int ib = 0; ib < 8; ib++) {
			scale[ib] = quant_iq4nl_fit(x + 32 * ib, 32, q);
			if (fabsf(scale[ib]) > fabsf(max_scale))
				max_scale = scale[ib];
		}
		/* the largest scale maps to -32 (the 6-bit range is -32..31) */
		uint16_t dh = kf32_to_fp16(max_scale / -32.0f);
		float d = kfp16_to_f32(dh);
		uint16_t scales_h = 0;
		memset(b, 0, 136);
		quant_wr16(b, dh);
		for (int ib = 0; ib < 8; ib++) {
			int ls = d != 0.0f ? clampi(quant_nearest(scale[ib] / d), -32, 31) + 32 : 32;
			b[4 + ib / 2] |= (uint8_t)((ls & 15) << (4 * (ib % 2)));
			scales_h |= (uint16_t)((ls >> 4) << (2 * ib));
			float dl = d * (float)(ls - 32);
			float idl = dl != 0.0f ? 1.0f / dl : 0.0f;
			for (int j = 0; j < 32; j++)
				q[j] = quant_iq4nl_nearest(x[32 * ib + j] * idl);
			for (int j = 0; j < 16; j++)
				b[8 + 16 * ib + j] = (uint8_t)(q[j] | (q[j + 16] << 4));
		}
		quant_wr16(b + 2, scales_h);
	}
}

#if QUANT_AVX2
static float iq4_xs_dot(const void *row, const float *x, int64_t n)
{
	const uint8_t *b = row;
	const __m128i tab = _mm_loadu_si128((const __m128i *)quant_iq4nl_values);
	const __m128i m4 = _mm_set1_epi8(15);
	__m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();

	for (int64_t i = 0; i < n / QK_K; i++, b += 136) {
		float d = quant_fp16(b);
		for (int ib = 0; ib < 8; ib++, x += 32) {
			__m128i v = _mm_loadu_si128((const __m128i *)(b + 8 + 16 * ib));
			__m128i lo = _mm_shuffle_epi8(tab, _mm_and_si128(v, m4));
			__m128i hi = _mm_shuffle_epi8(tab, _mm_and_si128(_mm_srli_epi16(v, 4), m4));
			__m256 s = quant_fma16_i8(lo, x, _mm256_setzero_ps());
			s = quant_fma16_i8(hi, x + 16, s);
			acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)(iq4xs_ls(b, ib) - 32)), s, acc);
			swap_ps(&acc, &acc2); /* two FMA chains instead of one */
		}
	}
	return quant_hsum(_mm256_add_ps(acc, acc2));
}

static void iq4_xs_dequant(const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;
	const __m128i tab = _mm_loadu_si128((const __m128i *)quant_iq4nl_values);
	const __m128i m4 = _mm_set1_epi8(15);

	for (int64_t i = 0; i < n / QK_K; i++, b += 136) {
		float d = quant_fp16(b);
		for (int ib = 0; ib < 8; ib++, dst += 32) {
			__m128i v = _mm_loadu_si128((const __m128i *)(b + 8 + 16 * ib));
			__m256 dl = _mm256_set1_ps(d * (float)(iq4xs_ls(b, ib) - 32));
			quant_store16_i8(_mm_shuffle_epi8(tab, _mm_and_si128(v, m4)), dst, dl, dl, false);
			quant_store16_i8(_mm_shuffle_epi8(tab, _mm_and_si128(_mm_srli_epi16(v, 4), m4)),
			                 dst + 16, dl, dl, false);
		}
	}
}
#endif

const struct quant_ops quant_ops_iq4_xs = {
    .dequant_ref = iq4_xs_dequant_ref,
#if QUANT_AVX2
    .dequant = iq4_xs_dequant,
    .dot = iq4_xs_dot,
#endif
    .quantize = iq4_xs_quantize,
};
