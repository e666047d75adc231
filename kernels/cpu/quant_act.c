/* Activation quantization for the approximate fast path (kcpu_matmul_fast): each block of 256
 * fp32 activations becomes int8 values with one fp32 scale d = max|x| / 127 (round to nearest
 * even), plus the sums of each 16 int8 values (used by weight types with mins or offsets). The
 * reference path never quantizes activations; this trades about 0.5% relative error per dot
 * (test_matmul prints it) for integer multiply-adds (AVX2 maddubs). Also the dispatch of the
 * per-type integer dots. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/err.h"
#include "kernels/cpu/quant_impl.h"

static const struct quant_ops *const xq8_ops[KT_COUNT] = {
    [KT_Q8_0] = &quant_ops_q8_0,
    [KT_Q4_K] = &quant_ops_q4_k,
    [KT_Q5_K] = &quant_ops_q5_k,
    [KT_Q6_K] = &quant_ops_q6_k,
};

int quant_xq8_pf_dist = 1536;

typedef float (*xq8_dot_fn)(const void *row, const struct quant_xq8 *x, int64_t n);

/* The dot per type for the selected variant. Written by quant_xq8_select (tests, between
 * matmuls) and once at first use (pthread_once), read by the matmul workers: atomics with
 * relaxed order, as any complete table gives correct results. */
static _Atomic(xq8_dot_fn) xq8_dot[KT_COUNT];
static atomic_int xq8_isa;
static pthread_once_t xq8_once = PTHREAD_ONCE_INIT;

static bool cpu_has_avx512vnni(void)
{
#if QUANT_AVX2 && defined(__GNUC__)
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#else
	return false;
#endif
}

static void xq8_set(int isa)
{
	for (int t = 0; t < KT_COUNT; t++)
		atomic_store_explicit(&xq8_dot[t], xq8_ops[t] ? xq8_ops[t]->dot_xq8 : NULL,
		                      memory_order_relaxed);
#if QUANT_AVX2 && defined(__GNUC__)
	if (isa == QUANT_XQ8_AVX512) {
		atomic_store_explicit(&xq8_dot[KT_Q8_0], quant_q8_0_dot_xq8_avx512, memory_order_relaxed);
		atomic_store_explicit(&xq8_dot[KT_Q4_K], quant_q4_k_dot_xq8_avx512, memory_order_relaxed);
		atomic_store_explicit(&xq8_dot[KT_Q5_K], quant_q5_k_dot_xq8_avx512, memory_order_relaxed);
		atomic_store_explicit(&xq8_dot[KT_Q6_K], quant_q6_k_dot_xq8_avx512, memory_order_relaxed);
	}
#endif
	atomic_store_explicit(&xq8_isa, QUANT_AVX2 ? isa : 0, memory_order_relaxed);
}

/* TANDEM_CPU_XQ8=avx2 keeps the AVX2 dots on an AVX-512 CPU (for measurements, or where
 * 512-bit code lowers the clock); any other value, or none, picks the best the CPU has. */
static void xq8_init(void)
{
	const char *env = getenv("TANDEM_CPU_XQ8");
	bool avx2_only = env && !strcmp(env, "avx2");
	xq8_set(cpu_has_avx512vnni() && !avx2_only ? QUANT_XQ8_AVX512 : QUANT_XQ8_AVX2);
}

int quant_xq8_select(int isa)
{
	pthread_once(&xq8_once, xq8_init);
	if (isa == QUANT_XQ8_AUTO) {
		xq8_set(cpu_has_avx512vnni() ? QUANT_XQ8_AVX512 : QUANT_XQ8_AVX2);
		return 0;
	}
	if (!QUANT_AVX2 || (isa != QUANT_XQ8_AVX2 && isa != QUANT_XQ8_AVX512) ||
	    (isa == QUANT_XQ8_AVX512 && !cpu_has_avx512vnni()))
		return ERR_UNSUPPORTED;
	xq8_set(isa);
	return 0;
}

int quant_xq8_selected(void)
{
	pthread_once(&xq8_once, xq8_init);
	return atomic_load_explicit(&xq8_isa, memory_order_relaxed);
}

const char *quant_xq8_isa_name(int isa)
{
	return isa == QUANT_XQ8_AVX512 ? "avx512vnni" : isa == QUANT_XQ8_AVX2 ? "avx2" : "none";
}

bool quant_has_xq8(int type)
{
	return type >= 0 && type < KT_COUNT && xq8_ops[type] && xq8_ops[type]->dot_xq8;
}

float quant_dot_xq8(int type, const void *row, const struct quant_xq8 *x, int64_t n)
{
	pthread_once(&xq8_once, xq8_init);
	return atomic_load_explicit(&xq8_dot[type], memory_order_relaxed)(row, x, n);
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
