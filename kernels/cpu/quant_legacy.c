/* Row functions of the 32-element "legacy" block types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL
 * (layouts and formulas: MODEL-SPEC.md §5.1). The scalar decoders evaluate exactly ggml's
 * expressions (d*q, d*q + m) so results are bit-identical to dequantize_row_*; the AVX2 dots
 * factor the block scale out (d * sum(q*x) [+ m * sum(x)]), which is a reassociation of the
 * dequantized dot. The quantizers are simple round-to-nearest ones for tests and mkmodel. */
#include <math.h>

#include "kernels/cpu/quant_impl.h"

#define QK 32

const int8_t quant_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                       1,    13,   25,  38,  53,  69,  89,  113};

/* element q values of one block -> nibbles: element j in the low nibble of byte j, element j+16
 * in the high nibble (the layout shared by Q4_0/Q4_1/Q5_x/IQ4_NL) */
static void pack_nibbles(const int *q, uint8_t *qs)
{
	for (int j = 0; j < QK / 2; j++)
		qs[j] = (uint8_t)((q[j] & 15) | ((q[j + QK / 2] & 15) << 4));
}

static uint32_t pack_high_bits(const int *q)
{
	uint32_t qh = 0;

	for (int j = 0; j < QK; j++)
		qh |= (uint32_t)((q[j] >> 4) & 1) << j;
	return qh;
}

static int clampi(int v, int lo, int hi)
{
	return v < lo ? lo : v > hi ? hi : v;
}

/* the element with the largest magnitude, with its sign */
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

/* ---- Q8_0: d, qs[32] int8 ------------------------------------------------------------------ */

static void q8_0_dequant_ref(const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;

	for (int64_t i = 0; i < n / QK; i++, b += 34) {
		float d = quant_fp16(b);
		for (int j = 0; j < QK; j++)
			dst[i * QK + j] = d * (float)(int8_t)b[2 + j];
	}
}

static void q8_0_quantize(const float *src, void *dst, int64_t n)
{
	uint8_t *b = dst;

	for (int64_t i = 0; i < n / QK; i++, b += 34) {
		const float *x = src + i * QK;
		float amax = fabsf(signed_absmax(x, QK));
		uint16_t dh = kf32_to_fp16(amax / 127.0f);
		float d = kfp16_to_f32(dh);
		float id = d != 0.0f ? 1.0f / d : 0.0f;

		quant_wr16(b, dh);
		for (int j = 0; j < QK; j++)
			b[2 + j] = (uint8_t)(int8_t)clampi(quant_nearest(x[j] * id), -128, 127);
	}
}

/* ---- Q4_0: d, qs[16]; x = d * (nibble - 8) -------------------------------------------------- */

static void q4_0_dequant_ref(const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;

	for (int64_t i = 0; i < n / QK; i++, b += 18) {
		float d = quant_fp16(b);
		const uint8_t *qs = b + 2;
		for (int j = 0; j < QK / 2; j++) {
			dst[i * QK + j] = (float)((qs[j] & 15) - 8) * d;
			dst[i * QK + j + QK / 2] = (float)((qs[j] >> 4) - 8) * d;
		}
	}
}

static void q4_0_quantize(const float *src, void *dst, int64_t n)
{
	uint8_t *b = dst;
	int q[QK];

	for (int64_t i = 0; i < n / QK; i++, b += 18) {
		const float *x = src + i * QK;
		uint16_t dh = kf32_to_fp16(signed_absmax(x, QK) / -8.0f);
		float d = kfp16_to_f32(dh);
		float id = d != 0.0f ? 1.0f / d : 0.0f;

		for (int j = 0; j < QK; j++)
			q[j] = clampi(quant_nearest(x[j] * id) + 8, 0, 15);
		quant_wr16(b, dh);
		pack_nibbles(q, b + 2);
	}
}

/* ---- Q4_1: d, m, qs[16]; x = d * nibble + m ------------------------------------------------- */

static void q4_1_dequant_ref(const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;

	for (int64_t i = 0; i < n / QK; i++, b += 20) {
		float d = quant_fp16(b), m = quant_fp16(b + 2);
		const uint8_t *qs = b + 4;
		for (int j = 0; j < QK / 2; j++) {
			dst[i * QK + j] = (float)(qs[j] & 15) * d + m;
			dst[i * QK + j + QK / 2] = (float)(qs[j] >> 4) * d + m;
		}
	}
}

/* min/max affine quantizer shared by Q4_1 and Q5_1 (levels = 15 or 31) */
static void quantize_affine_block(const float *x, int levels, uint16_t *dh, uint16_t *mh, int *q)
{
	float min = x[0], max = x[0];

	for (int j = 1; j < QK; j++) {
		min = fminf(min, x[j]);
		max = fmaxf(max, x[j]);
	}
	*dh = kf32_to_fp16((max - min) / (float)levels);
	*mh = kf32_to_fp16(min);
	float d = kfp16_to_f32(*dh), m = kfp16_to_f32(*mh);
	float id = d != 0.0f ? 1.0f / d : 0.0f;
	for (int j = 0; j < QK; j++)
		q[j] = clampi(quant_nearest((x[j] - m) * id), 0, levels);
}

static void q4_1_quantize(const float *src, void *dst, int64_t n)
{
	uint8_t *b = dst;
	int q[QK];
	uint16_t dh, mh;

	for (int64_t i = 0; i < n / QK; i++, b += 20) {
		quantize_affine_block(src + i * QK, 15, &dh, &mh, q);
		quant_wr16(b, dh);
		quant_wr16(b + 2, mh);
		pack_nibbles(q, b + 4);
	}
}

/* ---- Q5_0: d, qh (u32), qs[16]; x = d * (q - 16) ----------------------------------------- */

static void q5_0_dequant_ref(const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;

	for (int64_t i = 0; i < n / QK; i++, b += 22) {
		float d = quant_fp16(b);
		uint32_t qh = quant_rd32(b + 2);
		const uint8_t *qs = b + 6;
		for (int j = 0; j < QK / 2; j++) {
			int x0 = (int)((qs[j] & 15) | (((qh >> j) & 1) << 4)) - 16;
			int x1 = (int)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
			dst[i * QK + j] = (float)x0 * d;
			dst[i * QK + j + QK / 2] = (float)x1 * d;
		}
	}
}

static void q5_0_quantize(const float *src, void *dst, int64_t n)
{
	uint8_t *b = dst;
	int q[QK];

	for (int64_t i = 0; i < n / QK; i++, b += 22) {
		const float *x = src + i * QK;
		uint16_t dh = kf32_to_fp16(signed_absmax(x, QK) / -16.0f);
		float d = kfp16_to_f32(dh);
		float id = d != 0.0f ? 1.0f / d : 0.0f;

		for (int j = 0; j < QK; j++)
			q[j] = clampi(quant_nearest(x[j] * id) + 16, 0, 31);
		quant_wr16(b, dh);
		uint32_t qh = pack_high_bits(q);
		for (int k = 0; k < 4; k++)
			b[2 + k] = (uint8_t)(qh >> (8 * k));
		pack_nibbles(q, b + 6);
	}
}

/* ---- Q5_1: d, m, qh (u32), qs[16]; x = d * q + m ----------------------------------------- */

static void q5_1_dequant_ref(const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;

	for (int64_t i = 0; i < n / QK; i++, b += 24) {
		float d = quant_fp16(b), m = quant_fp16(b + 2);
		uint32_t qh = quant_rd32(b + 4);
		const uint8_t *qs = b + 8;
		for (int j = 0; j < QK / 2; j++) {
			int x0 = (int)((qs[j] & 15) | (((qh >> j) & 1) << 4));
			int x1 = (int)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
			dst[i * QK + j] = (float)x0 * d + m;
			dst[i * QK + j + QK / 2] = (float)x1 * d + m;
		}
	}
}

static void q5_1_quantize(const float *src, void *dst, int64_t n)
{
	uint8_t *b = dst;
	int q[QK];
	uint16_t dh, mh;

	for (int64_t i = 0; i < n / QK; i++, b += 24) {
		quantize_affine_block(src + i * QK, 31, &dh, &mh, q);
		quant_wr16(b, dh);
		quant_wr16(b + 2, mh);
		uint32_t qh = pack_high_bits(q);
		for (int k = 0; k < 4; k++)
			b[4 + k] = (uint8_t)(qh >> (8 * k));
		pack_nibbles(q, b + 8);
	}
}

/* ---- IQ4_NL: d, qs[16]; x = d * T[nibble] --------------------------------------------------- */

static void iq4_nl_dequant_ref(const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;

	for (int64_t i = 0; i < n / QK; i++, b += 18) {
		float d = quant_fp16(b);
		const uint8_t *qs = b + 2;
		for (int j = 0; j < QK / 2; j++) {
			dst[i * QK + j] = d * (float)quant_iq4nl_values[qs[j] & 15];
			dst[i * QK + j + QK / 2] = d * (float)quant_iq4nl_values[qs[j] >> 4];
		}
	}
}

int quant_iq4nl_nearest(float v)
{
	/* midpoints between neighbouring levels; a 4-step binary search over them */
	static const float mid[15] = {-115.5f, -93.5f, -74.0f, -57.0f, -42.0f, -28.5f, -16.0f, -4.5f,
	                              7.0f,    19.0f,  31.5f,  45.5f,  61.0f,  79.0f,  101.0f};
	int lo = v > mid[7] ? 8 : 0;
	lo += v > mid[lo + 3] ? 4 : 0;
	lo += v > mid[lo + 1] ? 2 : 0;
	lo += v > mid[lo] ? 1 : 0;
	return lo;
}

/* Chooses a scale for `len` values on the IQ4_NL grid: tries scales around max/-127, refines each
 * by least squares for its assignment, keeps the best. Returns the scale; q gets grid indices.
 * IQ4_XS (quant_iq.c) uses it for its sub-blocks. */
float quant_iq4nl_fit(const float *x, int len, int *q)
{
	float max = signed_absmax(x, len);
	float best_d = 0.0f, best_gain = -1.0f;
	int tq[32];

	if (max == 0.0f) {
		for (int j = 0; j < len; j++)
			q[j] = quant_iq4nl_nearest(0.0f);
		return 0.0f;
	}
	for (int k = -7; k <= 7; k++) {
		float d = max / ((float)quant_iq4nl_values[0] + 1.5f * (float)k);
		float id = 1.0f / d, sxt = 0.0f, stt = 0.0f;
		for (int j = 0; j < len; j++) {
			tq[j] = quant_iq4nl_nearest(x[j] * id);
			float t = (float)quant_iq4nl_values[tq[j]];
			sxt += x[j] * t;
			stt += t * t;
		}
		/* with the least-squares scale d = sxt / stt the squared error is
		 * sum(x^2) - sxt^2 / stt, so the best assignment maximizes sxt^2 / stt */
		float gain = stt > 0.0f ? sxt * sxt / stt : 0.0f;
		if (gain > best_gain) {
			best_gain = gain;
			best_d = stt > 0.0f ? sxt / stt : d;
			memcpy(q, tq, sizeof(int) * (size_t)len);
		}
	}
	return best_d;
}

static void iq4_nl_quantize(const float *src, void *dst, int64_t n)
{
	uint8_t *b = dst;
	int q[QK];

	for (int64_t i = 0; i < n / QK; i++, b += 18) {
		const float *x = src + i * QK;
		uint16_t dh = kf32_to_fp16(quant_iq4nl_fit(x, QK, q));
		float d = kfp16_to_f32(dh);
		float id = d != 0.0f ? 1.0f / d : 0.0f;

		/* reassign against the fp16-rounded scale actually stored */
		for (int j = 0; j < QK; j++)
			q[j] = quant_iq4nl_nearest(x[j] * id);
		quant_wr16(b, dh);
		pack_nibbles(q, b + 2);
	}
}

/* ---- AVX2 dots ------------------------------------------------------------------------------ */
#if QUANT_AVX2

/* bit j of the 16-bit b -> byte j = 0xff if set, 0 otherwise */
static inline __m128i expand_bits16(uint32_t b)
{
	__m128i v = _mm_set1_epi16((short)(b & 0xffff));
	v = _mm_shuffle_epi8(v, _mm_set_epi8(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0));
	const __m128i sel = _mm_set1_epi64x((long long)0x8040201008040201ULL);
	return _mm_cmpeq_epi8(_mm_and_si128(v, sel), sel);
}

static float q8_0_dot(const void *row, const float *x, int64_t n)
{
	const uint8_t *b = row;
	__m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();

	for (int64_t i = 0; i < n / QK; i++, b += 34, x += QK) {
		__m256 s = _mm256_setzero_ps();
		s = quant_fma16_i8(_mm_loadu_si128((const __m128i *)(b + 2)), x, s);
		s = quant_fma16_i8(_mm_loadu_si128((const __m128i *)(b + 18)), x + 16, s);
		acc = _mm256_fmadd_ps(_mm256_set1_ps(quant_fp16(b)), s, acc);
		/* two accumulators, swapped each block: halves the FMA latency chain */
		swap_ps(&acc, &acc2);
	}
	return quant_hsum(_mm256_add_ps(acc, acc2));
}

/* low / high nibbles of 16 bytes as two vectors of 16 bytes (elements 0..15 and 16..31) */
static inline void nibbles(const uint8_t *qs, __m128i *lo, __m128i *hi)
{
	const __m128i m4 = _mm_set1_epi8(15);
	__m128i q = _mm_loadu_si128((const __m128i *)qs);
	*lo = _mm_and_si128(q, m4);
	*hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
}

static float q4_0_dot(const void *row, const float *x, int64_t n)
{
	const uint8_t *b = row;
	const __m128i off = _mm_set1_epi8(8);
	__m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();

	for (int64_t i = 0; i < n / QK; i++, b += 18, x += QK) {
		__m128i lo, hi;
		nibbles(b + 2, &lo, &hi);
		__m256 s = quant_fma16_i8(_mm_sub_epi8(lo, off), x, _mm256_setzero_ps());
		s = quant_fma16_i8(_mm_sub_epi8(hi, off), x + 16, s);
		acc = _mm256_fmadd_ps(_mm256_set1_ps(quant_fp16(b)), s, acc);
		/* two accumulators, swapped each block: halves the FMA latency chain */
		swap_ps(&acc, &acc2);
	}
	return quant_hsum(_mm256_add_ps(acc, acc2));
}

static float q4_1_dot(const void *row, const float *x, int64_t n)
{
	const uint8_t *b = row;
	__m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
	__m256 acc2 = _mm256_setzero_ps(), accm2 = _mm256_setzero_ps();

	for (int64_t i = 0; i < n / QK; i++, b += 20, x += QK) {
		__m128i lo, hi;
		nibbles(b + 4, &lo, &hi);
		__m256 s = quant_fma16_i8(lo, x, _mm256_setzero_ps());
		s = quant_fma16_i8(hi, x + 16, s);
		acc = _mm256_fmadd_ps(_mm256_set1_ps(quant_fp16(b)), s, acc);
		accm = _mm256_fmadd_ps(_mm256_set1_ps(quant_fp16(b + 2)), quant_sum32(x), accm);
		/* two accumulators, swapped each block: halves the FMA latency chain */
		swap_ps(&acc, &acc2);
		swap_ps(&accm, &accm2);
	}
	return quant_hsum(_mm256_add_ps(_mm256_add_ps(acc, acc2), _mm256_add_ps(accm, accm2)));
}

static float q5_0_dot(const void *row, const float *x, int64_t n)
{
	const uint8_t *b = row;
	const __m128i off = _mm_set1_epi8(16);
	__m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();

	for (int64_t i = 0; i < n / QK; i++, b += 22, x += QK) {
		uint32_t qh = quant_rd32(b + 2);
		__m128i lo, hi;
		nibbles(b + 6, &lo, &hi);
		lo = _mm_or_si128(lo, _mm_and_si128(expand_bits16(qh), off));
		hi = _mm_or_si128(hi, _mm_and_si128(expand_bits16(qh >> 16), off));
		__m256 s = quant_fma16_i8(_mm_sub_epi8(lo, off), x, _mm256_setzero_ps());
		s = quant_fma16_i8(_mm_sub_epi8(hi, off), x + 16, s);
		acc = _mm256_fmadd_ps(_mm256_set1_ps(quant_fp16(b)), s, acc);
		/* two accumulators, swapped each block: halves the FMA latency chain */
		swap_ps(&acc, &acc2);
	}
	return quant_hsum(_mm256_add_ps(acc, acc2));
}

static float q5_1_dot(const void *row, const float *x, int64_t n)
{
	const uint8_t *b = row;
	const __m128i bit4 = _mm_set1_epi8(16);
	__m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
	__m256 acc2 = _mm256_setzero_ps(), accm2 = _mm256_setzero_ps();

	for (int64_t i = 0; i < n / QK; i++, b += 24, x += QK) {
		uint32_t qh = quant_rd32(b + 4);
		__m128i lo, hi;
		nibbles(b + 8, &lo, &hi);
		lo = _mm_or_si128(lo, _mm_and_si128(expand_bits16(qh), bit4));
		hi = _mm_or_si128(hi, _mm_and_si128(expand_bits16(qh >> 16), bit4));
		__m256 s = quant_fma16_i8(lo, x, _mm256_setzero_ps());
		s = quant_fma16_i8(hi, x + 16, s);
		acc = _mm256_fmadd_ps(_mm256_set1_ps(quant_fp16(b)), s, acc);
		accm = _mm256_fmadd_ps(_mm256_set1_ps(quant_fp16(b + 2)), quant_sum32(x), accm);
		/* two accumulators, swapped each block: halves the FMA latency chain */
		swap_ps(&acc, &acc2);
		swap_ps(&accm, &accm2);
	}
	return quant_hsum(_mm256_add_ps(_mm256_add_ps(acc, acc2), _mm256_add_ps(accm, accm2)));
}

static float iq4_nl_dot(const void *row, const float *x, int64_t n)
{
	const uint8_t *b = row;
	const __m128i tab = _mm_loadu_si128((const __m128i *)quant_iq4nl_values);
	__m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();

	for (int64_t i = 0; i < n / QK; i++, b += 18, x += QK) {
		__m128i lo, hi;
		nibbles(b + 2, &lo, &hi);
		__m256 s = quant_fma16_i8(_mm_shuffle_epi8(tab, lo), x, _mm256_setzero_ps());
		s = quant_fma16_i8(_mm_shuffle_epi8(tab, hi), x + 16, s);
		acc = _mm256_fmadd_ps(_mm256_set1_ps(quant_fp16(b)), s, acc);
		/* two accumulators, swapped each block: halves the FMA latency chain */
		swap_ps(&acc, &acc2);
	}
	return quant_hsum(_mm256_add_ps(acc, acc2));
}

/* Integer dot with 8-bit activations (fast path): sum over blocks of dw * dx * sum(qw * qx),
 * eight weight blocks per activation block. maddubs needs an unsigned operand: |qw| times qx
 * carrying qw's sign. */
static float q8_0_dot_xq8(const void *row, const struct quant_xq8 *x, int64_t n)
{
	const uint8_t *b = row;
	const __m256i ones = _mm256_set1_epi16(1);
	__m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();

	for (int64_t i = 0; i < n / 256; i++, x++) {
		for (int k = 0; k < 8; k += 2, b += 68) {
			quant_prefetch(b, 68);
			__m256i w0 = _mm256_loadu_si256((const __m256i *)(b + 2));
			__m256i w1 = _mm256_loadu_si256((const __m256i *)(b + 36));
			__m256i v0 = _mm256_loadu_si256((const __m256i *)(x->q + 32 * k));
			__m256i v1 = _mm256_loadu_si256((const __m256i *)(x->q + 32 * k + 32));
			__m256i p0 = _mm256_maddubs_epi16(_mm256_sign_epi8(w0, w0), _mm256_sign_epi8(v0, w0));
			__m256i p1 = _mm256_maddubs_epi16(_mm256_sign_epi8(w1, w1), _mm256_sign_epi8(v1, w1));
			acc0 = _mm256_fmadd_ps(_mm256_set1_ps(quant_fp16(b) * x->d),
			                       _mm256_cvtepi32_ps(_mm256_madd_epi16(p0, ones)), acc0);
			acc1 = _mm256_fmadd_ps(_mm256_set1_ps(quant_fp16(b + 34) * x->d),
			                       _mm256_cvtepi32_ps(_mm256_madd_epi16(p1, ones)), acc1);
		}
	}
	return quant_hsum(_mm256_add_ps(acc0, acc1));
}

/* Exact SIMD dequantizers (q * d per lane, as the scalar code) */
static void q8_0_dequant(const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;

	for (int64_t i = 0; i < n / QK; i++, b += 34, dst += QK) {
		__m256 d = _mm256_set1_ps(quant_fp16(b));
		quant_store16_i8(_mm_loadu_si128((const __m128i *)(b + 2)), dst, d, d, false);
		quant_store16_i8(_mm_loadu_si128((const __m128i *)(b + 18)), dst + 16, d, d, false);
	}
}

static void q4_0_dequant(const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;
	const __m128i off = _mm_set1_epi8(8);

	for (int64_t i = 0; i < n / QK; i++, b += 18, dst += QK) {
		__m256 d = _mm256_set1_ps(quant_fp16(b));
		__m128i lo, hi;
		nibbles(b + 2, &lo, &hi);
		quant_store16_i8(_mm_sub_epi8(lo, off), dst, d, d, false);
		quant_store16_i8(_mm_sub_epi8(hi, off), dst + 16, d, d, false);
	}
}

static void q5_0_dequant(const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;
	const __m128i off = _mm_set1_epi8(16);

	for (int64_t i = 0; i < n / QK; i++, b += 22, dst += QK) {
		__m256 d = _mm256_set1_ps(quant_fp16(b));
		uint32_t qh = quant_rd32(b + 2);
		__m128i lo, hi;
		nibbles(b + 6, &lo, &hi);
		lo = _mm_or_si128(lo, _mm_and_si128(expand_bits16(qh), off));
		hi = _mm_or_si128(hi, _mm_and_si128(expand_bits16(qh >> 16), off));
		quant_store16_i8(_mm_sub_epi8(lo, off), dst, d, d, false);
		quant_store16_i8(_mm_sub_epi8(hi, off), dst + 16, d, d, false);
	}
}

static void iq4_nl_dequant(const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;
	const __m128i tab = _mm_loadu_si128((const __m128i *)quant_iq4nl_values);

	for (int64_t i = 0; i < n / QK; i++, b += 18, dst += QK) {
		__m256 d = _mm256_set1_ps(quant_fp16(b));
		__m128i lo, hi;
		nibbles(b + 2, &lo, &hi);
		quant_store16_i8(_mm_shuffle_epi8(tab, lo), dst, d, d, false);
		quant_store16_i8(_mm_shuffle_epi8(tab, hi), dst + 16, d, d, false);
	}
}
#endif

#if QUANT_AVX2
#define DOT(f) .dot = f
#define DEQ(f) .dequant = f
#define XQ8(f) .dot_xq8 = f
#else
#define DOT(f) .dot = NULL
#define DEQ(f) .dequant = NULL
#define XQ8(f) .dot_xq8 = NULL
#endif

const struct quant_ops quant_ops_q8_0 = {.dequant_ref = q8_0_dequant_ref,
                                         DEQ(q8_0_dequant),
                                         DOT(q8_0_dot),
                                         .quantize = q8_0_quantize,
                                         XQ8(q8_0_dot_xq8)};
const struct quant_ops quant_ops_q4_0 = {
    .dequant_ref = q4_0_dequant_ref, DEQ(q4_0_dequant), DOT(q4_0_dot), .quantize = q4_0_quantize};
const struct quant_ops quant_ops_q4_1 = {
    .dequant_ref = q4_1_dequant_ref, DOT(q4_1_dot), .quantize = q4_1_quantize};
const struct quant_ops quant_ops_q5_0 = {
    .dequant_ref = q5_0_dequant_ref, DEQ(q5_0_dequant), DOT(q5_0_dot), .quantize = q5_0_quantize};
const struct quant_ops quant_ops_q5_1 = {
    .dequant_ref = q5_1_dequant_ref, DOT(q5_1_dot), .quantize = q5_1_quantize};
const struct quant_ops quant_ops_iq4_nl = {
    .dequant_ref = iq4_nl_dequant_ref, DEQ(iq4_nl_dequant), DOT(iq4_nl_dot), .quantize = iq4_nl_quantize};
