/* Row functions of the K-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K: 256-element super-blocks with
 * 16 or 8 sub-blocks, each with a quantized scale (and min), under an fp16 super-scale (layouts:
 * MODEL-SPEC.md §5.2). The scalar decoders evaluate ggml's expressions in ggml's order, as float
 * products: (d*sc)*q - (dmin*m), so dequantization is bit-exact with dequantize_row_q*_K and with
 * gguf-py (which produced the test references). The AVX2 dequantizers do the same products lane
 * by lane (mul then sub, never fused) and are checked bit for bit against the scalar ones. The
 * AVX2 dots factor each sub-block's scale out: (d*sc)*sum(q*x) - (dmin*m)*sum(x).
 * The quantizers are plain min/max (or abs-max) per sub-block followed by 6/4/8-bit rounding of
 * the sub-block scales; good enough for tests and mkmodel, not ggml's error-minimizing search. */
#include <math.h>

#include "kernels/cpu/quant_impl.h"

#define QK_K 256

static int clampi(int v, int lo, int hi)
{
	return v < lo ? lo : v > hi ? hi : v;
}

/* 6-bit scale and min of sub-block j of a Q4_K/Q5_K block (ggml get_scale_min_k4) */
static inline void scale_min_k4(int j, const uint8_t *q, int *sc, int *m)
{
	if (j < 4) {
		*sc = q[j] & 63;
		*m = q[j + 4] & 63;
	} else {
		*sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
		*m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
	}
}

/* 16 signed 6-bit scales (already minus 32) of a Q3_K block */
static void q3_k_scales(const uint8_t *b, int *s)
{
	for (int k = 0; k < 16; k++) {
		int low4 = k < 8 ? b[k] & 15 : b[k - 8] >> 4;
		int hi2 = (b[8 + (k & 3)] >> (2 * (k >> 2))) & 3;
		s[k] = (low4 | (hi2 << 4)) - 32;
	}
}

static float signed_absmax(const float *x, int n)
{
	float amax = 0.0f, max = 0.0f;

	for (int j = 0; j < n; j++) {
		if (fabsf(x[j]) > amax) {
			amax = fabsf(x[j]);
			max = x[j];
		}
	}
	return max;
}

/* Min/max sub-block quantization for the affine K-quants (Q2_K: 16 x 16, levels 3, 4-bit scales;
 * Q4_K/Q5_K: 8 x 32, levels 15/31, 6-bit scales). Picks per-sub-block scale and min (min <= 0 so
 * the stored min is non-negative, as ggml does), quantizes those under fp16 super-scales d and
 * dmin, then rounds the elements against the scales actually stored. */
static void quantize_affine_k(const float *x, int n_sub, int sub_len, int levels, int scale_max, uint16_t *dh,
                              uint16_t *dminh, int *sc, int *mn, int *q)
{
	float scale[16], mins[16], max_scale = 0.0f, max_min = 0.0f;

	for (int s = 0; s < n_sub; s++) {
		const float *xs = x + s * sub_len;
		float lo = xs[0], hi = xs[0];
		for (int j = 1; j < sub_len; j++) {
			lo = fminf(lo, xs[j]);
			hi = fmaxf(hi, xs[j]);
		}
		if (lo > 0.0f)
			lo = 0.0f;
		scale[s] = (hi - lo) / (float)levels;
		mins[s] = -lo;
		max_scale = fmaxf(max_scale, scale[s]);
		max_min = fmaxf(max_min, mins[s]);
	}
	*dh = kf32_to_fp16(max_scale / (float)scale_max);
	*dminh = kf32_to_fp16(max_min / (float)scale_max);
	float d = kfp16_to_f32(*dh), dmin = kfp16_to_f32(*dminh);
	for (int s = 0; s < n_sub; s++) {
		sc[s] = d > 0.0f ? clampi(quant_nearest(scale[s] / d), 0, scale_max) : 0;
		mn[s] = dmin > 0.0f ? clampi(quant_nearest(mins[s] / dmin), 0, scale_max) : 0;
		/* a zero scale with a non-zero range would flatten the sub-block; use the smallest */
		if (sc[s] == 0 && scale[s] > 0.0f && d > 0.0f)
			sc[s] = 1;
		float ds = d * (float)sc[s], dm = dmin * (float)mn[s];
		for (int j = 0; j < sub_len; j++) {
			int e = s * sub_len + j;
			q[e] = ds > 0.0f ? clampi(quant_nearest((x[e] + dm) / ds), 0, levels) : 0;
		}
	}
}

/* ---- Q2_K: scales[16] (lo nibble scale, hi nibble min), qs[64], d, dmin --------------------- */

static void q2_k_dequant_ref(const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;

	for (int64_t i = 0; i < n / QK_K; i++, b += 84) {
		const uint8_t *scales = b, *q = b + 16;
		float d = quant_fp16(b + 80), min = quant_fp16(b + 82);
		float *y = dst + i * QK_K;
		int is = 0;
		for (int c = 0; c < 2; c++, q += 32) {
			for (int j = 0; j < 4; j++) {
				for (int h = 0; h < 2; h++) {
					int sc = scales[is++];
					float dl = d * (float)(sc & 15), ml = min * (float)(sc >> 4);
					for (int l = 0; l < 16; l++)
						*y++ = dl * (float)((q[16 * h + l] >> (2 * j)) & 3) - ml;
				}
			}
		}
	}
}

static void q2_k_quantize(const float *src, void *dst, int64_t n)
{
	uint8_t *b = dst;
	int sc[16], mn[16], q[QK_K];
	uint16_t dh, dminh;

	for (int64_t i = 0; i < n / QK_K; i++, b += 84) {
		quantize_affine_k(src + i * QK_K, 16, 16, 3, 15, &dh, &dminh, sc, mn, q);
		memset(b, 0, 84);
		for (int s = 0; s < 16; s++)
			b[s] = (uint8_t)(sc[s] | (mn[s] << 4));
		for (int e = 0; e < QK_K; e++) {
			int c = e / 128, j = (e % 128) / 32, r = e % 32;
			b[16 + 32 * c + r] |= (uint8_t)(q[e] << (2 * j));
		}
		quant_wr16(b + 80, dh);
		quant_wr16(b + 82, dminh);
	}
}

/* ---- Q3_K: hmask[32], qs[64], scales[12], d ------------------------------------------------ */

static void q3_k_dequant_ref(const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;
	int s[16];

	for (int64_t i = 0; i < n / QK_K; i++, b += 110) {
		const uint8_t *hm = b, *q = b + 32;
		float d = quant_fp16(b + 108);
		float *y = dst + i * QK_K;
		int is = 0;
		uint8_t m = 1;
		q3_k_scales(b + 96, s);
		for (int c = 0; c < 2; c++, q += 32) {
			for (int j = 0; j < 4; j++, m = (uint8_t)(m << 1)) {
				for (int h = 0; h < 2; h++) {
					float dl = d * (float)s[is++];
					for (int l = 0; l < 16; l++) {
						int v = ((q[16 * h + l] >> (2 * j)) & 3) -
						        ((hm[16 * h + l] & m) ? 0 : 4);
						*y++ = dl * (float)v;
					}
				}
			}
		}
	}
}

static void q3_k_quantize(const float *src, void *dst, int64_t n)
{
	uint8_t *b = dst;
	float scale[16];
	int q[QK_K];

	for (int64_t i = 0; i < n / QK_K; i++, b += 110) {
		const float *x = src + i * QK_K;
		float max_scale = 0.0f;
		for (int s = 0; s < 16; s++) {
			scale[s] = signed_absmax(x + 16 * s, 16) / -4.0f;
			if (fabsf(scale[s]) > fabsf(max_scale))
				max_scale = scale[s];
		}
		uint16_t dh = kf32_to_fp16(max_scale / -32.0f);
		float d = kfp16_to_f32(dh);
		memset(b, 0, 110);
		for (int s = 0; s < 16; s++) {
			int S = d != 0.0f ? clampi(quant_nearest(scale[s] / d), -32, 31) : 0;
			int v = S + 32;
			b[96 + (s < 8 ? s : s - 8)] |= (uint8_t)((v & 15) << (s < 8 ? 0 : 4));
			b[96 + 8 + (s & 3)] |= (uint8_t)((v >> 4) << (2 * (s >> 2)));
			float ds = d * (float)S;
			for (int l = 0; l < 16; l++) {
				int e = 16 * s + l;
				q[e] = ds != 0.0f ? clampi(quant_nearest(x[e] / ds), -4, 3) : 0;
			}
		}
		for (int e = 0; e < QK_K; e++) {
			int c = e / 128, j = (e % 128) / 32, r = e % 32;
			int u = q[e] + 4;
			b[32 + 32 * c + r] |= (uint8_t)((u & 3) << (2 * j));
			if (u >= 4)
				b[r] |= (uint8_t)(1u << (4 * c + j));
		}
		quant_wr16(b + 108, dh);
	}
}

/* ---- Q4_K: d, dmin, scales[12], qs[128] ----------------------------------------------------- */

static void pack_scales_k4(const int *sc, const int *mn, uint8_t *b)
{
	for (int j = 0; j < 4; j++) {
		b[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
		b[j + 4] = (uint8_t)(mn[j] | ((mn[j + 4] >> 4) << 6));
		b[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
	}
}

static void q4_k_dequant_ref(const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;

	for (int64_t i = 0; i < n / QK_K; i++, b += 144) {
		float d = quant_fp16(b), min = quant_fp16(b + 2);
		const uint8_t *scales = b + 4, *q = b + 16;
		float *y = dst + i * QK_K;
		for (int c = 0; c < 4; c++, q += 32) {
			int sc, m;
			scale_min_k4(2 * c, scales, &sc, &m);
			float d1 = d * (float)sc, m1 = min * (float)m;
			scale_min_k4(2 * c + 1, scales, &sc, &m);
			float d2 = d * (float)sc, m2 = min * (float)m;
			for (int l = 0; l < 32; l++)
				*y++ = d1 * (float)(q[l] & 15) - m1;
			for (int l = 0; l < 32; l++)
				*y++ = d2 * (float)(q[l] >> 4) - m2;
		}
	}
}

static void q4_k_quantize(const float *src, void *dst, int64_t n)
{
	uint8_t *b = dst;
	int sc[8], mn[8], q[QK_K];
	uint16_t dh, dminh;

	for (int64_t i = 0; i < n / QK_K; i++, b += 144) {
		quantize_affine_k(src + i * QK_K, 8, 32, 15, 63, &dh, &dminh, sc, mn, q);
		quant_wr16(b, dh);
		quant_wr16(b + 2, dminh);
		pack_scales_k4(sc, mn, b + 4);
		for (int c = 0; c < 4; c++)
			for (int l = 0; l < 32; l++)
				b[16 + 32 * c + l] = (uint8_t)(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
	}
}

/* ---- Q5_K: d, dmin, scales[12], qh[32], qs[128] --------------------------------------------- */

static void q5_k_dequant_ref(const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;

	for (int64_t i = 0; i < n / QK_K; i++, b += 176) {
		float d = quant_fp16(b), min = quant_fp16(b + 2);
		const uint8_t *scales = b + 4, *qh = b + 16, *ql = b + 48;
		float *y = dst + i * QK_K;
		uint8_t u1 = 1, u2 = 2;
		for (int c = 0; c < 4; c++, ql += 32, u1 = (uint8_t)(u1 << 2), u2 = (uint8_t)(u2 << 2)) {
			int sc, m;
			scale_min_k4(2 * c, scales, &sc, &m);
			float d1 = d * (float)sc, m1 = min * (float)m;
			scale_min_k4(2 * c + 1, scales, &sc, &m);
			float d2 = d * (float)sc, m2 = min * (float)m;
			for (int l = 0; l < 32; l++)
				*y++ = d1 * (float)((ql[l] & 15) + (qh[l] & u1 ? 16 : 0)) - m1;
			for (int l = 0; l < 32; l++)
				*y++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
		}
	}
}

static void q5_k_quantize(const float *src, void *dst, int64_t n)
{
	uint8_t *b = dst;
	int sc[8], mn[8], q[QK_K];
	uint16_t dh, dminh;

	for (int64_t i = 0; i < n / QK_K; i++, b += 176) {
		quantize_affine_k(src + i * QK_K, 8, 32, 31, 63, &dh, &dminh, sc, mn, q);
		quant_wr16(b, dh);
		quant_wr16(b + 2, dminh);
		pack_scales_k4(sc, mn, b + 4);
		memset(b + 16, 0, 32);
		for (int c = 0; c < 4; c++) {
			for (int l = 0; l < 32; l++) {
				int q0 = q[64 * c + l], q1 = q[64 * c + 32 + l];
				b[48 + 32 * c + l] = (uint8_t)((q0 & 15) | ((q1 & 15) << 4));
				b[16 + l] |= (uint8_t)(((q0 >> 4) << (2 * c)) | ((q1 >> 4) << (2 * c + 1)));
			}
		}
	}
}

/* ---- Q6_K: ql[128], qh[64], scales[16] int8, d ------------------------------------------- */

static void q6_k_dequant_ref(const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;

	for (int64_t i = 0; i < n / QK_K; i++, b += 210) {
		const uint8_t *ql = b, *qh = b + 128;
		const int8_t *sc = (const int8_t *)(b + 192);
		float d = quant_fp16(b + 208);
		float *y = dst + i * QK_K;
		for (int c = 0; c < 2; c++, y += 128, ql += 64, qh += 32, sc += 8) {
			for (int l = 0; l < 32; l++) {
				int is = l / 16;
				int q1 = ((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32;
				int q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
				int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
				int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
				y[l] = d * (float)sc[is] * (float)q1;
				y[l + 32] = d * (float)sc[is + 2] * (float)q2;
				y[l + 64] = d * (float)sc[is + 4] * (float)q3;
				y[l + 96] = d * (float)sc[is + 6] * (float)q4;
			}
		}
	}
}

static void q6_k_quantize(const float *src, void *dst, int64_t n)
{
	uint8_t *b = dst;
	float scale[16];
	int q[QK_K];

	for (int64_t i = 0; i < n / QK_K; i++, b += 210) {
		const float *x = src + i * QK_K;
		float max_scale = 0.0f;
		for (int s = 0; s < 16; s++) {
			scale[s] = signed_absmax(x + 16 * s, 16) / -32.0f;
			if (fabsf(scale[s]) > fabsf(max_scale))
				max_scale = scale[s];
		}
		uint16_t dh = kf32_to_fp16(max_scale / -128.0f);
		float d = kfp16_to_f32(dh);
		for (int s = 0; s < 16; s++) {
			int S = d != 0.0f ? clampi(quant_nearest(scale[s] / d), -128, 127) : 0;
			b[192 + s] = (uint8_t)(int8_t)S;
			float ds = d * (float)S;
			for (int l = 0; l < 16; l++) {
				int e = 16 * s + l;
				q[e] = (ds != 0.0f ? clampi(quant_nearest(x[e] / ds), -32, 31) : 0) + 32;
			}
		}
		for (int c = 0; c < 2; c++) {
			const int *qc = q + 128 * c;
			for (int l = 0; l < 32; l++) {
				b[64 * c + l] = (uint8_t)((qc[l] & 15) | ((qc[l + 64] & 15) << 4));
				b[64 * c + l + 32] = (uint8_t)((qc[l + 32] & 15) | ((qc[l + 96] & 15) << 4));
				b[128 + 32 * c + l] =
				    (uint8_t)((qc[l] >> 4) | ((qc[l + 32] >> 4) << 2) |
				              ((qc[l + 64] >> 4) << 4) | ((qc[l + 96] >> 4) << 6));
			}
		}
		quant_wr16(b + 208, dh);
	}
}

/* ---- AVX2 ------------------------------------------------------------------------------------ */
#if QUANT_AVX2

static inline __m128i lo128(__m256i v)
{
	return _mm256_castsi256_si128(v);
}

static inline __m128i hi128(__m256i v)
{
	return _mm256_extracti128_si256(v, 1);
}

/* 32 x 2-bit fields (bits 2j..2j+1 of each byte) */
static inline __m256i crumbs(__m256i v, int j)
{
	return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * j)), _mm256_set1_epi8(3));
}

static float q2_k_dot(const void *row, const float *x, int64_t n)
{
	const uint8_t *b = row;
	__m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
	__m256 acc2 = _mm256_setzero_ps(), accm2 = _mm256_setzero_ps();

	for (int64_t i = 0; i < n / QK_K; i++, b += 84) {
		float d = quant_fp16(b + 80), min = quant_fp16(b + 82);
		for (int c = 0; c < 2; c++) {
			__m256i v = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * c));
			for (int j = 0; j < 4; j++, x += 32) {
				__m256i q = crumbs(v, j);
				int s0 = b[8 * c + 2 * j], s1 = b[8 * c + 2 * j + 1];
				__m256 a0 = quant_fma16_i8(lo128(q), x, _mm256_setzero_ps());
				__m256 a1 = quant_fma16_i8(hi128(q), x + 16, _mm256_setzero_ps());
				acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)(s0 & 15)), a0, acc);
				acc2 = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)(s1 & 15)), a1, acc2);
				accm = _mm256_fmadd_ps(_mm256_set1_ps(min * (float)(s0 >> 4)), quant_sum16(x),
				                       accm);
				accm2 = _mm256_fmadd_ps(_mm256_set1_ps(min * (float)(s1 >> 4)),
				                        quant_sum16(x + 16), accm2);
			}
		}
	}
	return quant_hsum(_mm256_sub_ps(_mm256_add_ps(acc, acc2), _mm256_add_ps(accm, accm2)));
}

/* signed values of chunk c, 2-bit field j: q2 - (hmask bit ? 0 : 4) */
static inline __m256i q3_vals(__m256i v, __m256i hm, int c, int j)
{
	__m256i bit = _mm256_set1_epi8((char)(1 << (4 * c + j)));
	__m256i has = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit);
	__m256i sub = _mm256_andnot_si256(has, _mm256_set1_epi8(4));
	return _mm256_sub_epi8(crumbs(v, j), sub);
}

static float q3_k_dot(const void *row, const float *x, int64_t n)
{
	const uint8_t *b = row;
	__m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();
	int s[16];

	for (int64_t i = 0; i < n / QK_K; i++, b += 110) {
		float d = quant_fp16(b + 108);
		__m256i hm = _mm256_loadu_si256((const __m256i *)b);
		q3_k_scales(b + 96, s);
		for (int c = 0; c < 2; c++) {
			__m256i v = _mm256_loadu_si256((const __m256i *)(b + 32 + 32 * c));
			for (int j = 0; j < 4; j++, x += 32) {
				__m256i q = q3_vals(v, hm, c, j);
				__m256 a0 = quant_fma16_i8(lo128(q), x, _mm256_setzero_ps());
				__m256 a1 = quant_fma16_i8(hi128(q), x + 16, _mm256_setzero_ps());
				acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)s[8 * c + 2 * j]), a0, acc);
				acc2 = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)s[8 * c + 2 * j + 1]), a1,
				                       acc2);
			}
		}
	}
	return quant_hsum(_mm256_add_ps(acc, acc2));
}

/* 32 unsigned values times x[0..31] */
static inline __m256 fma32(__m256i q, const float *x, __m256 acc)
{
	acc = quant_fma16_i8(lo128(q), x, acc);
	return quant_fma16_i8(hi128(q), x + 16, acc);
}

/* Q4_K / Q5_K share the scale layout; qh is NULL for Q4_K */
/* The 12 scale bytes of a Q4_K/Q5_K block as 16 int16: [sc0..sc7, m0..m7] (§5.2 unpacking done
 * on 32-bit words) */
static inline __m256i k4_scales_mins(const uint8_t *scales)
{
	uint32_t u[4];
	memcpy(u, scales, 12);
	const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, m2 = 0x03030303;
	u[3] = ((u[2] >> 4) & m4) | (((u[1] >> 6) & m2) << 4); /* mins 4..7 */
	uint32_t mins_lo = u[1] & m6; /* mins 0..3 */
	u[1] = (u[2] & m4) | (((u[0] >> 6) & m2) << 4); /* scales 4..7 */
	u[2] = mins_lo;
	u[0] &= m6; /* scales 0..3 */
	return _mm256_cvtepu8_epi16(_mm_setr_epi32((int)u[0], (int)u[1], (int)u[2], (int)u[3]));
}

/* Q4_K / Q5_K fp32 dot. Scales and mins are unpacked for the whole block at once (as floats
 * d*sc and dmin*m); xs, when given, holds sum(x) per 32 elements (precomputed once per activation
 * row by the matmul), which turns the mins into one FMA per block instead of a running sum of x. */
static inline float k4_dot_impl(const uint8_t *b, size_t block_bytes, const float *x, const float *xs,
                                int64_t n, bool five)
{
	const __m256i m4 = _mm256_set1_epi8(15), b16 = _mm256_set1_epi8(16);
	__m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(), accm = _mm256_setzero_ps();

	for (int64_t i = 0; i < n / QK_K; i++, b += block_bytes) {
		const uint8_t *ql = b + (five ? 48 : 16);
		__m256i qh = five ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
		__m256i sm = k4_scales_mins(b + 4);
		__m256 dsc =
		    _mm256_mul_ps(_mm256_set1_ps(quant_fp16(b)),
		                  _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(sm))));
		__m256 dmn =
		    _mm256_mul_ps(_mm256_set1_ps(quant_fp16(b + 2)),
		                  _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(sm, 1))));
		if (xs)
			accm = _mm256_fmadd_ps(dmn, _mm256_loadu_ps(xs + 8 * i), accm);
		for (int c = 0; c < 4; c++, x += 64) {
			__m256i v = _mm256_loadu_si256((const __m256i *)(ql + 32 * c));
			__m256i lo = _mm256_and_si256(v, m4);
			__m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
			if (five) {
				__m256i u1 = _mm256_set1_epi8((char)(1 << (2 * c)));
				__m256i u2 = _mm256_set1_epi8((char)(2 << (2 * c)));
				lo = _mm256_or_si256(
				    lo,
				    _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, u1), u1), b16));
				hi = _mm256_or_si256(
				    hi,
				    _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, u2), u2), b16));
			}
			__m256i j0 = _mm256_set1_epi32(2 * c), j1 = _mm256_set1_epi32(2 * c + 1);
			__m256 a0 = fma32(lo, x, _mm256_setzero_ps());
			__m256 a1 = fma32(hi, x + 32, _mm256_setzero_ps());
			acc = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(dsc, j0), a0, acc);
			acc2 = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(dsc, j1), a1, acc2);
			if (!xs) {
				accm =
				    _mm256_fmadd_ps(_mm256_permutevar8x32_ps(dmn, j0), quant_sum32(x), accm);
				accm = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(dmn, j1), quant_sum32(x + 32),
				                       accm);
			}
		}
	}
	return quant_hsum(_mm256_sub_ps(_mm256_add_ps(acc, acc2), accm));
}

static float q4_k_dot_xsum(const void *row, const float *x, const float *xs, int64_t n)
{
	return k4_dot_impl(row, 144, x, xs, n, false);
}

static float q5_k_dot_xsum(const void *row, const float *x, const float *xs, int64_t n)
{
	return k4_dot_impl(row, 176, x, xs, n, true);
}

static inline float k4_dot(const uint8_t *b, size_t block_bytes, const float *x, int64_t n, bool five)
{
	return k4_dot_impl(b, block_bytes, x, NULL, n, five);
}

static float q4_k_dot(const void *row, const float *x, int64_t n)
{
	return k4_dot(row, 144, x, n, false);
}

static float q5_k_dot(const void *row, const float *x, int64_t n)
{
	return k4_dot(row, 176, x, n, true);
}

/* the four unsigned 6-bit streams (0..63) of one 128-element half of a Q6_K block */
static inline void q6_uvals(const uint8_t *ql, const uint8_t *qh, __m256i *q)
{
	const __m256i m4 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3), m30 = _mm256_set1_epi8(0x30);
	__m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
	__m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
	__m256i h = _mm256_loadu_si256((const __m256i *)qh);

	q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m3), 4));
	q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
	                       _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m3), 4));
	q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(h, m30));
	q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
	                       _mm256_and_si256(_mm256_srli_epi16(h, 2), m30));
}

/* the same streams as signed q - 32 */
static inline void q6_vals(const uint8_t *ql, const uint8_t *qh, __m256i *q)
{
	const __m256i off = _mm256_set1_epi8(32);

	q6_uvals(ql, qh, q);
	for (int k = 0; k < 4; k++)
		q[k] = _mm256_sub_epi8(q[k], off);
}

static float q6_k_dot(const void *row, const float *x, int64_t n)
{
	const uint8_t *b = row;
	__m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();
	__m256i q[4];

	for (int64_t i = 0; i < n / QK_K; i++, b += 210) {
		/* the 16 scales as floats d*sc, 8 per half block; lane j broadcast per sub-block */
		__m256 d = _mm256_set1_ps(quant_fp16(b + 208));
		__m128i sc8 = _mm_loadu_si128((const __m128i *)(b + 192));
		__m256 dsc[2] = {
		    _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc8))),
		    _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc8, 8))))};
		for (int c = 0; c < 2; c++, x += 128) {
			q6_vals(b + 64 * c, b + 128 + 32 * c, q);
			for (int k = 0; k < 4; k++) {
				__m256 a0 = quant_fma16_i8(lo128(q[k]), x + 32 * k, _mm256_setzero_ps());
				__m256 a1 = quant_fma16_i8(hi128(q[k]), x + 32 * k + 16, _mm256_setzero_ps());
				__m256 s0 = _mm256_permutevar8x32_ps(dsc[c], _mm256_set1_epi32(2 * k));
				__m256 s1 = _mm256_permutevar8x32_ps(dsc[c], _mm256_set1_epi32(2 * k + 1));
				acc = _mm256_fmadd_ps(s0, a0, acc);
				acc2 = _mm256_fmadd_ps(s1, a1, acc2);
				swap_ps(&acc, &acc2); /* two FMA chains instead of one */
			}
		}
	}
	return quant_hsum(_mm256_add_ps(acc, acc2));
}

/* ---- integer dots with 8-bit activations (fast path) ----------------------------------------
 * One activation scale per 256 (quant_xq8) matches the super-block, so a whole block is summed in
 * int32 with the sub-block scales applied by madd, and converted to float once:
 *   Q4_K/Q5_K: d*dx * sum_j sc_j * sum(q*qx) - dmin*dx * sum_j m_j * (sum of qx in j)
 *   Q6_K:      d*dx * (sum_s sc_s * sum(q*qx) - 32 * sum_s sc_s * (sum of qx in s))
 * Weights go into maddubs unsigned (q <= 63: at most 2*63*127 per int16 pair, no saturation);
 * per-lane int32 sums stay below 2^24. */
/* int16 element j of each 128-bit lane broadcast over the lane */
static inline __m256i bcast16(__m256i v, int j)
{
	return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)((2 * j) | ((2 * j + 1) << 8))));
}

static inline float k4_dot_xq8(const uint8_t *b, size_t block_bytes, const struct quant_xq8 *x, int64_t n,
                               bool five)
{
	const __m256i m4 = _mm256_set1_epi8(15), b16 = _mm256_set1_epi8(16);
	__m256 acc = _mm256_setzero_ps();
	__m128 accm = _mm_setzero_ps();

	for (int64_t i = 0; i < n / QK_K; i++, b += block_bytes, x++) {
		const uint8_t *ql = b + (five ? 48 : 16);
		quant_prefetch(b, (int)block_bytes);
		__m256i qh = five ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
		__m256i sm = k4_scales_mins(b + 4);
		__m256i sc = _mm256_permute2x128_si256(sm, sm, 0x00); /* scales in both lanes */
		/* mins: sum_j m_j * (bsums[2j] + bsums[2j+1]) */
		__m256i bs = _mm256_loadu_si256((const __m256i *)x->bsums);
		__m128i pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
		__m128i prod = _mm_madd_epi16(_mm256_extracti128_si256(sm, 1), pairs);
		accm = _mm_fmadd_ps(_mm_set1_ps(quant_fp16(b + 2) * x->d), _mm_cvtepi32_ps(prod), accm);

		__m256i sumi = _mm256_setzero_si256();
		for (int c = 0; c < 4; c++) {
			__m256i v = _mm256_loadu_si256((const __m256i *)(ql + 32 * c));
			__m256i lo = _mm256_and_si256(v, m4);
			__m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
			if (five) {
				__m256i u1 = _mm256_set1_epi8((char)(1 << (2 * c)));
				__m256i u2 = _mm256_set1_epi8((char)(2 << (2 * c)));
				lo = _mm256_or_si256(
				    lo,
				    _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, u1), u1), b16));
				hi = _mm256_or_si256(
				    hi,
				    _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, u2), u2), b16));
			}
			__m256i pl =
			    _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(x->q + 64 * c)));
			__m256i ph = _mm256_maddubs_epi16(
			    hi, _mm256_loadu_si256((const __m256i *)(x->q + 64 * c + 32)));
			pl = _mm256_madd_epi16(pl, bcast16(sc, 2 * c));
			ph = _mm256_madd_epi16(ph, bcast16(sc, 2 * c + 1));
			sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
		}
		acc = _mm256_fmadd_ps(_mm256_set1_ps(quant_fp16(b) * x->d), _mm256_cvtepi32_ps(sumi), acc);
	}
	accm = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
	accm = _mm_add_ss(accm, _mm_movehdup_ps(accm));
	return quant_hsum(acc) - _mm_cvtss_f32(accm);
}

static float q4_k_dot_xq8(const void *row, const struct quant_xq8 *x, int64_t n)
{
	return k4_dot_xq8(row, 144, x, n, false);
}

static float q5_k_dot_xq8(const void *row, const struct quant_xq8 *x, int64_t n)
{
	return k4_dot_xq8(row, 176, x, n, true);
}

/* byte shuffles picking Q6_K scales s = 2m (8 times) then 2m + 1 (8 times) */
static const uint8_t q6_scale_shuffle[8][16] = {
#define Q6S(m)                                                                                               \
	{                                                                                                    \
		2 * m, 2 * m, 2 * m, 2 * m, 2 * m, 2 * m, 2 * m, 2 * m, 2 * m + 1, 2 * m + 1, 2 * m + 1,     \
		    2 * m + 1, 2 * m + 1, 2 * m + 1, 2 * m + 1, 2 * m + 1                                    \
	}
    Q6S(0), Q6S(1), Q6S(2), Q6S(3), Q6S(4), Q6S(5), Q6S(6), Q6S(7),
#undef Q6S
};

static float q6_k_dot_xq8(const void *row, const struct quant_xq8 *x, int64_t n)
{
	const uint8_t *b = row;
	__m256 acc = _mm256_setzero_ps();
	__m256i q[4];

	for (int64_t i = 0; i < n / QK_K; i++, b += 210, x++) {
		quant_prefetch(b, 210);
		__m128i sc8 = _mm_loadu_si128((const __m128i *)(b + 192));
		/* the -32 offset: sum_s sc_s * (sum of qx over the 16 elements of s) */
		__m256i offv = _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8),
		                                 _mm256_loadu_si256((const __m256i *)x->bsums));
		__m256i sumi = _mm256_slli_epi32(offv, 5); /* 32 * offset, subtracted below */
		sumi = _mm256_sub_epi32(_mm256_setzero_si256(), sumi);
		for (int c = 0; c < 2; c++) {
			q6_uvals(b + 64 * c, b + 128 + 32 * c, q);
			for (int k = 0; k < 4; k++) {
				/* scales s = 8c + 2k (first 16 values) and s + 1, as [s x 8 | s+1 x 8] */
				__m128i sh = _mm_loadu_si128((const __m128i *)q6_scale_shuffle[4 * c + k]);
				__m256i scv = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, sh));
				__m256i v = _mm256_loadu_si256((const __m256i *)(x->q + 128 * c + 32 * k));
				sumi = _mm256_add_epi32(
				    sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], v), scv));
			}
		}
		acc = _mm256_fmadd_ps(_mm256_set1_ps(quant_fp16(b + 208) * x->d), _mm256_cvtepi32_ps(sumi),
		                      acc);
	}
	return quant_hsum(acc);
}

/* Exact SIMD dequantizers: the same float products as the scalar code, lane by lane. */

static void q4_k_dequant(const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;
	const __m256i m4 = _mm256_set1_epi8(15);

	for (int64_t i = 0; i < n / QK_K; i++, b += 144) {
		float d = quant_fp16(b), min = quant_fp16(b + 2);
		for (int c = 0; c < 4; c++, dst += 64) {
			__m256i v = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * c));
			__m256i lo = _mm256_and_si256(v, m4),
			        hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
			int sc, m;
			scale_min_k4(2 * c, b + 4, &sc, &m);
			__m256 d1 = _mm256_set1_ps(d * (float)sc), m1 = _mm256_set1_ps(min * (float)m);
			quant_store16_i8(lo128(lo), dst, d1, m1, true);
			quant_store16_i8(hi128(lo), dst + 16, d1, m1, true);
			scale_min_k4(2 * c + 1, b + 4, &sc, &m);
			__m256 d2 = _mm256_set1_ps(d * (float)sc), m2 = _mm256_set1_ps(min * (float)m);
			quant_store16_i8(lo128(hi), dst + 32, d2, m2, true);
			quant_store16_i8(hi128(hi), dst + 48, d2, m2, true);
		}
	}
}

static void q2_k_dequant(const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;

	for (int64_t i = 0; i < n / QK_K; i++, b += 84) {
		float d = quant_fp16(b + 80), min = quant_fp16(b + 82);
		for (int c = 0; c < 2; c++) {
			__m256i v = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * c));
			for (int j = 0; j < 4; j++, dst += 32) {
				__m256i q = crumbs(v, j);
				int s0 = b[8 * c + 2 * j], s1 = b[8 * c + 2 * j + 1];
				quant_store16_i8(lo128(q), dst, _mm256_set1_ps(d * (float)(s0 & 15)),
				                 _mm256_set1_ps(min * (float)(s0 >> 4)), true);
				quant_store16_i8(hi128(q), dst + 16, _mm256_set1_ps(d * (float)(s1 & 15)),
				                 _mm256_set1_ps(min * (float)(s1 >> 4)), true);
			}
		}
	}
}

static void q3_k_dequant(const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;
	int s[16];

	for (int64_t i = 0; i < n / QK_K; i++, b += 110) {
		float d = quant_fp16(b + 108);
		__m256i hm = _mm256_loadu_si256((const __m256i *)b);
		q3_k_scales(b + 96, s);
		for (int c = 0; c < 2; c++) {
			__m256i v = _mm256_loadu_si256((const __m256i *)(b + 32 + 32 * c));
			for (int j = 0; j < 4; j++, dst += 32) {
				__m256i q = q3_vals(v, hm, c, j);
				__m256 d0 = _mm256_set1_ps(d * (float)s[8 * c + 2 * j]);
				__m256 d1 = _mm256_set1_ps(d * (float)s[8 * c + 2 * j + 1]);
				quant_store16_i8(lo128(q), dst, d0, d0, false);
				quant_store16_i8(hi128(q), dst + 16, d1, d1, false);
			}
		}
	}
}

static void q5_k_dequant(const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;
	const __m256i m4 = _mm256_set1_epi8(15), b16 = _mm256_set1_epi8(16);

	for (int64_t i = 0; i < n / QK_K; i++, b += 176) {
		float d = quant_fp16(b), min = quant_fp16(b + 2);
		__m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
		for (int c = 0; c < 4; c++, dst += 64) {
			__m256i v = _mm256_loadu_si256((const __m256i *)(b + 48 + 32 * c));
			__m256i lo = _mm256_and_si256(v, m4),
			        hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
			__m256i u1 = _mm256_set1_epi8((char)(1 << (2 * c)));
			__m256i u2 = _mm256_set1_epi8((char)(2 << (2 * c)));
			lo = _mm256_or_si256(
			    lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, u1), u1), b16));
			hi = _mm256_or_si256(
			    hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, u2), u2), b16));
			int sc, m;
			scale_min_k4(2 * c, b + 4, &sc, &m);
			__m256 d1 = _mm256_set1_ps(d * (float)sc), m1 = _mm256_set1_ps(min * (float)m);
			quant_store16_i8(lo128(lo), dst, d1, m1, true);
			quant_store16_i8(hi128(lo), dst + 16, d1, m1, true);
			scale_min_k4(2 * c + 1, b + 4, &sc, &m);
			__m256 d2 = _mm256_set1_ps(d * (float)sc), m2 = _mm256_set1_ps(min * (float)m);
			quant_store16_i8(lo128(hi), dst + 32, d2, m2, true);
			quant_store16_i8(hi128(hi), dst + 48, d2, m2, true);
		}
	}
}

static void q6_k_dequant(const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;
	__m256i q[4];

	for (int64_t i = 0; i < n / QK_K; i++, b += 210) {
		float d = quant_fp16(b + 208);
		const int8_t *sc = (const int8_t *)(b + 192);
		for (int c = 0; c < 2; c++, dst += 128) {
			q6_vals(b + 64 * c, b + 128 + 32 * c, q);
			for (int k = 0; k < 4; k++) {
				/* (d * sc) * q, as ggml's d * sc[is] * q evaluates left to right */
				__m256 s0 = _mm256_set1_ps(d * (float)sc[8 * c + 2 * k]);
				__m256 s1 = _mm256_set1_ps(d * (float)sc[8 * c + 2 * k + 1]);
				quant_store16_i8(lo128(q[k]), dst + 32 * k, s0, s0, false);
				quant_store16_i8(hi128(q[k]), dst + 32 * k + 16, s1, s1, false);
			}
		}
	}
}
#endif

#if QUANT_AVX2
#define SIMD(f) f
#else
#define SIMD(f) NULL
#endif

const struct quant_ops quant_ops_q2_k = {.dequant_ref = q2_k_dequant_ref,
                                         .dequant = SIMD(q2_k_dequant),
                                         .dot = SIMD(q2_k_dot),
                                         .quantize = q2_k_quantize};
const struct quant_ops quant_ops_q3_k = {.dequant_ref = q3_k_dequant_ref,
                                         .dequant = SIMD(q3_k_dequant),
                                         .dot = SIMD(q3_k_dot),
                                         .quantize = q3_k_quantize};
const struct quant_ops quant_ops_q4_k = {.dequant_ref = q4_k_dequant_ref,
                                         .dequant = SIMD(q4_k_dequant),
                                         .dot = SIMD(q4_k_dot),
                                         .dot_xsum = SIMD(q4_k_dot_xsum),
                                         .quantize = q4_k_quantize,
                                         .dot_xq8 = SIMD(q4_k_dot_xq8)};
const struct quant_ops quant_ops_q5_k = {.dequant_ref = q5_k_dequant_ref,
                                         .dequant = SIMD(q5_k_dequant),
                                         .dot = SIMD(q5_k_dot),
                                         .dot_xsum = SIMD(q5_k_dot_xsum),
                                         .quantize = q5_k_quantize,
                                         .dot_xq8 = SIMD(q5_k_dot_xq8)};
const struct quant_ops quant_ops_q6_k = {.dequant_ref = q6_k_dequant_ref,
                                         .dequant = SIMD(q6_k_dequant),
                                         .dot = SIMD(q6_k_dot),
                                         .quantize = q6_k_quantize,
                                         .dot_xq8 = SIMD(q6_k_dot_xq8)};
