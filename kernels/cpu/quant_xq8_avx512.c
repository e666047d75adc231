/* AVX-512 VNNI versions of the fast path's integer dots (weights x int8 activations, quant_xq8):
 * Q8_0, Q4_K, Q5_K, Q6_K. Compiled in the baseline x86-64-v3 build through per-function target
 * attributes, so the binary still runs on AVX2-only CPUs; quant_act.c selects these at run time
 * only where CPUID reports AVX-512F/BW/VL/VNNI. The integer sums equal the AVX2 dots' (every
 * product and partial sum is exact in int32); only the fp32 accumulation order differs.
 * Q8_0 uses vpdpbusd (unsigned weight bytes x signed activation bytes, groups of four summed
 * into int32: AVX2's maddubs + madd in one instruction); the K-quants use vpmaddubsw for byte
 * pairs and vpdpwssd to apply the int16 sub-block scales and accumulate in one instruction.
 * Each loop also prefetches the weights ahead (see quant_xq8_pf_dist). */
#include "kernels/cpu/quant_impl.h"

#if QUANT_AVX2 && defined(__GNUC__)

#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

AVX512_TARGET static inline __m512i load2x256(const void *lo, const void *hi)
{
	return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)lo)),
	                          _mm256_loadu_si256((const __m256i *)hi), 1);
}

/* word index vector [a x16, b x16] for permutexvar_epi16 */
AVX512_TARGET static inline __m512i idx2x16(int a, int b)
{
	return _mm512_mask_blend_epi16(0xffff0000u, _mm512_set1_epi16((short)a), _mm512_set1_epi16((short)b));
}

/* Q8_0: one 32-byte block per 256-bit vpdpbusd (the 512-bit form needs two loads, an insert
 * and per-pair scale blends, which measured slower). vpdpbusd wants unsigned weights: |w| times
 * x carrying w's sign gives the same products, exactly. */
AVX512_TARGET float quant_q8_0_dot_xq8_avx512(const void *row, const struct quant_xq8 *x, int64_t n)
{
	const uint8_t *b = row;
	__m256 acc = _mm256_setzero_ps();

	for (int64_t i = 0; i < n / 256; i++, x++) {
		__m256 sb0 = _mm256_setzero_ps(), sb1 = _mm256_setzero_ps();
		for (int k = 0; k < 8; k += 2, b += 68) {
			quant_prefetch(b, 68);
			__m256i w0 = _mm256_loadu_si256((const __m256i *)(b + 2));
			__m256i w1 = _mm256_loadu_si256((const __m256i *)(b + 36));
			__m256i v0 = _mm256_loadu_si256((const __m256i *)(x->q + 32 * k));
			__m256i v1 = _mm256_loadu_si256((const __m256i *)(x->q + 32 * k + 32));
			__m256i s0 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(w0, w0),
			                                 _mm256_sign_epi8(v0, w0));
			__m256i s1 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(w1, w1),
			                                 _mm256_sign_epi8(v1, w1));
			sb0 = _mm256_fmadd_ps(_mm256_set1_ps(quant_fp16(b)), _mm256_cvtepi32_ps(s0), sb0);
			sb1 =
			    _mm256_fmadd_ps(_mm256_set1_ps(quant_fp16(b + 34)), _mm256_cvtepi32_ps(s1), sb1);
		}
		acc = _mm256_fmadd_ps(_mm256_set1_ps(x->d), _mm256_add_ps(sb0, sb1), acc);
	}
	return quant_hsum(acc);
}

/* Q4_K / Q5_K. 64 bytes of packed nibbles per vector: the low nibbles of bytes 0..31 are
 * sub-block 2c, of bytes 32..63 sub-block 2c + 2; the high nibbles 2c + 1 and 2c + 3. Each
 * byte-pair product (vpmaddubsw) is scaled per sub-block and accumulated by one vpdpwssd; the
 * mins term is as in the AVX2 dot. */
AVX512_TARGET static inline __m256i k4_scales_mins_512(const uint8_t *scales)
{
	uint32_t u[4];
	memcpy(u, scales, 12);
	const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, m2 = 0x03030303;
	u[3] = ((u[2] >> 4) & m4) | (((u[1] >> 6) & m2) << 4);
	uint32_t mins_lo = u[1] & m6;
	u[1] = (u[2] & m4) | (((u[0] >> 6) & m2) << 4);
	u[2] = mins_lo;
	u[0] &= m6;
	return _mm256_cvtepu8_epi16(_mm_setr_epi32((int)u[0], (int)u[1], (int)u[2], (int)u[3]));
}

AVX512_TARGET static inline float k4_dot_xq8_512(const uint8_t *b, size_t block_bytes,
                                                 const struct quant_xq8 *x, int64_t n, bool five)
{
	const __m512i m4 = _mm512_set1_epi8(15), b16 = _mm512_set1_epi8(16);
	__m512 acc = _mm512_setzero_ps();
	__m128 accm = _mm_setzero_ps();

	for (int64_t i = 0; i < n / 256; i++, b += block_bytes, x++) {
		const uint8_t *ql = b + (five ? 48 : 16);
		quant_prefetch(b, (int)block_bytes);
		__m256i sm = k4_scales_mins_512(b + 4);
		__m512i sc16 = _mm512_castsi256_si512(sm); /* words [sc0..sc7, m0..m7] */
		__m256i bs = _mm256_loadu_si256((const __m256i *)x->bsums);
		__m128i pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
		__m128i prod = _mm_madd_epi16(_mm256_extracti128_si256(sm, 1), pairs);
		accm = _mm_fmadd_ps(_mm_set1_ps(quant_fp16(b + 2) * x->d), _mm_cvtepi32_ps(prod), accm);

		__m512i qh = five ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 16)))
		                  : _mm512_setzero_si512();
		__m512i sumi = _mm512_setzero_si512();
		for (int h = 0; h < 2; h++) {
			/* chunks c = 2h (low 256 bits) and 2h + 1 (high) */
			__m512i v = _mm512_loadu_si512((const void *)(ql + 64 * h));
			__m512i lo = _mm512_and_si512(v, m4);
			__m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
			if (five) {
				int c0 = 2 * h, c1 = 2 * h + 1;
				__m512i u1 = _mm512_mask_blend_epi8(0xffffffff00000000ULL,
				                                    _mm512_set1_epi8((char)(1 << (2 * c0))),
				                                    _mm512_set1_epi8((char)(1 << (2 * c1))));
				__m512i u2 = _mm512_add_epi8(u1, u1);
				lo = _mm512_or_si512(
				    lo, _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(qh, u1), b16));
				hi = _mm512_or_si512(
				    hi, _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(qh, u2), b16));
			}
			int j = 4 * h; /* sub-blocks j, j+2 (lo) and j+1, j+3 (hi) */
			/* byte pairs (q <= 31: no int16 saturation), then vpdpwssd applies the
			 * scales (int16, one per 256-bit half) and accumulates */
			__m512i pl = _mm512_maddubs_epi16(lo, load2x256(x->q + 32 * j, x->q + 32 * j + 64));
			__m512i ph =
			    _mm512_maddubs_epi16(hi, load2x256(x->q + 32 * j + 32, x->q + 32 * j + 96));
			sumi =
			    _mm512_dpwssd_epi32(sumi, pl, _mm512_permutexvar_epi16(idx2x16(j, j + 2), sc16));
			sumi = _mm512_dpwssd_epi32(sumi, ph,
			                           _mm512_permutexvar_epi16(idx2x16(j + 1, j + 3), sc16));
		}
		acc = _mm512_fmadd_ps(_mm512_set1_ps(quant_fp16(b) * x->d), _mm512_cvtepi32_ps(sumi), acc);
	}
	accm = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
	accm = _mm_add_ss(accm, _mm_movehdup_ps(accm));
	return _mm512_reduce_add_ps(acc) - _mm_cvtss_f32(accm);
}

AVX512_TARGET float quant_q4_k_dot_xq8_avx512(const void *row, const struct quant_xq8 *x, int64_t n)
{
	return k4_dot_xq8_512(row, 144, x, n, false);
}

AVX512_TARGET float quant_q5_k_dot_xq8_avx512(const void *row, const struct quant_xq8 *x, int64_t n)
{
	return k4_dot_xq8_512(row, 176, x, n, true);
}

/* word indices [2k x8, 2k+1 x8, 8+2k x8, 9+2k x8]: the Q6_K scale of each 128-bit lane of
 * stream k */
#define Q6I(a) a, a, a, a, a, a, a, a
#define Q6IDX(k)                                                                                             \
	{                                                                                                    \
		Q6I(2 * k), Q6I(2 * k + 1), Q6I(8 + 2 * k), Q6I(9 + 2 * k)                                   \
	}
static const int16_t q6_sc_idx_tab[4][32] = {Q6IDX(0), Q6IDX(1), Q6IDX(2), Q6IDX(3)};
#undef Q6IDX
#undef Q6I

/* Q6_K: both 128-element halves of a block at once (low 256 bits: half 0, high: half 1), so
 * stream k holds elements 32k.. and 128 + 32k..; its four 128-bit lanes are sub-blocks 2k,
 * 2k+1, 8+2k, 9+2k. The -32 offset is sum_s sc_s * (activation sum of s), as in AVX2. */
AVX512_TARGET float quant_q6_k_dot_xq8_avx512(const void *row, const struct quant_xq8 *x, int64_t n)
{
	const uint8_t *b = row;
	const __m512i m4 = _mm512_set1_epi8(15), m3 = _mm512_set1_epi8(3), m30 = _mm512_set1_epi8(0x30);
	__m512 acc = _mm512_setzero_ps();
	__m512i q6_sc_idx[4];
	for (int k = 0; k < 4; k++)
		q6_sc_idx[k] = _mm512_loadu_si512((const void *)q6_sc_idx_tab[k]);

	for (int64_t i = 0; i < n / 256; i++, b += 210, x++) {
		quant_prefetch(b, 210);
		__m128i sc8 = _mm_loadu_si128((const __m128i *)(b + 192));
		__m512i sc16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sc8));
		__m256i offv = _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8),
		                                 _mm256_loadu_si256((const __m256i *)x->bsums));
		__m512i sumi = _mm512_sub_epi32(_mm512_setzero_si512(),
		                                _mm512_zextsi256_si512(_mm256_slli_epi32(offv, 5)));
		__m512i l0 = load2x256(b, b + 64), l1 = load2x256(b + 32, b + 96);
		__m512i hb = load2x256(b + 128, b + 160);
		__m512i q[4];
		q[0] =
		    _mm512_or_si512(_mm512_and_si512(l0, m4), _mm512_slli_epi16(_mm512_and_si512(hb, m3), 4));
		q[1] = _mm512_or_si512(_mm512_and_si512(l1, m4),
		                       _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hb, 2), m3), 4));
		q[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), m4),
		                       _mm512_and_si512(hb, m30));
		q[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), m4),
		                       _mm512_and_si512(_mm512_srli_epi16(hb, 2), m30));
		for (int k = 0; k < 4; k++) {
			__m512i v = load2x256(x->q + 32 * k, x->q + 128 + 32 * k);
			/* pairs (q <= 63: |sum| <= 2 * 63 * 127, no saturation), then one vpdpwssd
			 * applies the sub-block scales (as int16, one per 128-bit lane) and accumulates */
			__m512i p = _mm512_maddubs_epi16(q[k], v);
			__m512i scv = _mm512_permutexvar_epi16(q6_sc_idx[k], sc16);
			sumi = _mm512_dpwssd_epi32(sumi, p, scv);
		}
		acc = _mm512_fmadd_ps(_mm512_set1_ps(quant_fp16(b + 208) * x->d), _mm512_cvtepi32_ps(sumi),
		                      acc);
	}
	return _mm512_reduce_add_ps(acc);
}
#endif
