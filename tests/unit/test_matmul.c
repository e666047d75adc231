/* Tests of kcpu_matmul (kernels/cpu/matmul.c) against a naive reference (scalar dequantization
 * of every row, then a double-precision dot per row and token), for every compute type, over
 * shapes that hit all three paths (1 token: fused dots; 2..15: 4x2 tiles; 16+: the 6x16 GEMM
 * kernel), row counts that are not multiples of the 4- and 6-row kernels, k lengths that leave a
 * partial k block (1280 = 1024 + 256 = 2 x 512 + 256; 67 for the float types), token counts
 * across the 16-token blocks and the 64- and 128-token super-blocks, padded strides (ldx > n_in, ldy > n_out;
 * the padding must stay untouched) and 1, 2 and 3 threads. Seeded; the seed is printed. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/quant_impl.h" /* quant_xq8_select: forces each instruction-set variant */
#include "kernels/kernels.h"

static int n_fail;
static uint64_t rng_state;

static uint64_t rng_next(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static float rng_gauss(void)
{
	double u1 = ((double)(rng_next() >> 11) + 0.5) * 0x1p-53;
	double u2 = ((double)(rng_next() >> 11) + 0.5) * 0x1p-53;
	return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

static const int types[] = {KT_F32,     KT_F16,   KT_BF16,   KT_Q8_0,    KT_Q4_0,   KT_Q4_1,
                            KT_Q5_0,    KT_Q5_1,  KT_IQ4_NL, KT_Q2_K,    KT_Q3_K,   KT_Q4_K,
                            KT_Q5_K,    KT_Q6_K,  KT_IQ4_XS, KT_IQ2_XXS, KT_IQ2_XS, KT_IQ2_S,
                            KT_IQ3_XXS, KT_IQ3_S, KT_IQ1_S,  KT_IQ1_M};

/* one case: returns the worst error relative to sum |w x| */
static int64_t row_pad; /* extra bytes between rows (a TP slice keeps the full row as stride) */

static double run_case(struct kpool *p, int type, int64_t n_out, int64_t n_in, int64_t n_tok)
{
	size_t rb0, rb;
	if (!ktype_row_bytes(type, n_in, &rb0))
		return 0.0;
	rb = rb0 + (size_t)row_pad;
	int64_t ldx = n_in + 3, ldy = n_out + 5;
	uint8_t *w = malloc(rb * (size_t)n_out);
	memset(w, 0x7f, rb * (size_t)n_out); /* padding: garbage that must not be read */
	float *src = malloc(sizeof(float) * (size_t)n_in);
	float *deq = malloc(sizeof(float) * (size_t)(n_in * n_out));
	float *x = malloc(sizeof(float) * (size_t)(ldx * n_tok));
	float *y = malloc(sizeof(float) * (size_t)(ldy * n_tok));
	double worst = 0.0;

	for (int64_t r = 0; r < n_out; r++) {
		for (int64_t i = 0; i < n_in; i++)
			src[i] = rng_gauss() * 0.05f;
		kcpu_quantize_row(type, src, w + (size_t)r * rb, n_in);
		kcpu_dequant_row_ref(type, w + (size_t)r * rb, deq + r * n_in, n_in);
	}
	for (int64_t i = 0; i < ldx * n_tok; i++)
		x[i] = rng_gauss();
	for (int64_t i = 0; i < ldy * n_tok; i++)
		y[i] = -12345.0f;

	struct kweight kw = {.type = type, .n_in = n_in, .n_out = n_out, .row_bytes = rb, .data = w};
	kcpu_matmul(p, &kw, x, ldx, n_tok, y, ldy);

	for (int64_t t = 0; t < n_tok; t++) {
		for (int64_t r = 0; r < n_out; r++) {
			double exact = 0.0, mag = 0.0;
			for (int64_t i = 0; i < n_in; i++) {
				double v = (double)deq[r * n_in + i] * x[t * ldx + i];
				exact += v;
				mag += fabs(v);
			}
			double err = fabs(y[t * ldy + r] - exact) / (mag > 0 ? mag : 1.0);
			if (!(err <= 1e-5)) {
				if (n_fail < 20)
					printf("FAIL %s n_out %" PRId64 " n_in %" PRId64 " n_tok %" PRId64
					       " threads %d: y[%" PRId64 "][%" PRId64 "] = %.9g want %.9g\n",
					       ktype_name(type), n_out, n_in, n_tok, kpool_n_threads(p), t, r,
					       y[t * ldy + r], exact);
				n_fail++;
			}
			if (err > worst)
				worst = err;
		}
		for (int64_t r = n_out; r < ldy; r++) {
			if (y[t * ldy + r] != -12345.0f) {
				printf("FAIL %s: padding y[%" PRId64 "][%" PRId64 "] written\n",
				       ktype_name(type), t, r);
				n_fail++;
			}
		}
	}
	free(w);
	free(src);
	free(deq);
	free(x);
	free(y);
	return worst;
}

/* kcpu_matmul_fast: with the activations quantized here independently (per 256: d = max|x|/127,
 * q = round-to-nearest-even(x * 127 / max|x|)), the result must equal the exact dot of the
 * dequantized weights with d*q to fp32 rounding; also reports the approximation error against
 * the unquantized activations. Unsupported types must give exactly kcpu_matmul's result. */
static void test_fast(struct kpool *p, int type, int64_t n_out, int64_t n_in, int64_t n_tok,
                      double *worst_exact, double *worst_approx)
{
	size_t rb;
	ktype_row_bytes(type, n_in, &rb);
	int64_t ldx = n_in + 1, ldy = n_out + 2;
	uint8_t *w = malloc(rb * (size_t)n_out);
	memset(w, 0x7f, rb * (size_t)n_out); /* padding: garbage that must not be read */
	float *src = malloc(sizeof(float) * (size_t)n_in);
	float *deq = malloc(sizeof(float) * (size_t)(n_in * n_out));
	float *x = malloc(sizeof(float) * (size_t)(ldx * n_tok)),
	      *xq = malloc(sizeof(float) * (size_t)(n_in * n_tok));
	float *y = malloc(sizeof(float) * (size_t)(ldy * n_tok)),
	      *y2 = malloc(sizeof(float) * (size_t)(ldy * n_tok));

	for (int64_t r = 0; r < n_out; r++) {
		for (int64_t i = 0; i < n_in; i++)
			src[i] = rng_gauss() * 0.05f;
		kcpu_quantize_row(type, src, w + (size_t)r * rb, n_in);
		kcpu_dequant_row_ref(type, w + (size_t)r * rb, deq + r * n_in, n_in);
	}
	for (int64_t t = 0; t < n_tok; t++) {
		for (int64_t i = 0; i < n_in; i++)
			x[t * ldx + i] = rng_gauss() * (i % 97 == 0 ? 6.0f : 1.0f);
		for (int64_t b = 0; b < n_in / 256; b++) {
			float amax = 0.0f;
			for (int j = 0; j < 256; j++)
				amax = fmaxf(amax, fabsf(x[t * ldx + 256 * b + j]));
			float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
			for (int j = 0; j < 256; j++)
				xq[t * n_in + 256 * b + j] =
				    d * (float)(int)nearbyintf(x[t * ldx + 256 * b + j] * id);
		}
	}
	struct kweight kw = {.type = type, .n_in = n_in, .n_out = n_out, .row_bytes = rb, .data = w};
	kcpu_matmul_fast(p, &kw, x, ldx, n_tok, y, ldy);
	if (!kcpu_matmul_fast_supported(type) || n_tok >= 4) {
		kcpu_matmul(p, &kw, x, ldx, n_tok, y2, ldy);
		for (int64_t t = 0; t < n_tok; t++)
			for (int64_t r = 0; r < n_out; r++)
				if (y[t * ldy + r] != y2[t * ldy + r]) {
					printf("FAIL %s: fast fallback differs from kcpu_matmul\n",
					       ktype_name(type));
					n_fail++;
					t = n_tok;
					break;
				}
	} else {
		for (int64_t t = 0; t < n_tok; t++) {
			for (int64_t r = 0; r < n_out; r++) {
				double e_q = 0, m_q = 0, e_x = 0, m_x = 0;
				for (int64_t i = 0; i < n_in; i++) {
					double wv = deq[r * n_in + i];
					e_q += wv * xq[t * n_in + i];
					m_q += fabs(wv * xq[t * n_in + i]);
					e_x += wv * x[t * ldx + i];
					m_x += fabs(wv * x[t * ldx + i]);
				}
				double got = y[t * ldy + r];
				double ee = fabs(got - e_q) / m_q, ea = fabs(got - e_x) / m_x;
				*worst_exact = fmax(*worst_exact, ee);
				*worst_approx = fmax(*worst_approx, ea);
				if (!(ee <= 1e-5) || !(ea <= 2e-2)) {
					if (n_fail < 20)
						printf(
						    "FAIL fast %s [%" PRId64 "][%" PRId64
						    "]: %.9g, exact with "
						    "quantized x %.9g (err %.2e), with x %.9g (err %.2e)\n",
						    ktype_name(type), t, r, got, e_q, ee, e_x, ea);
					n_fail++;
				}
			}
		}
	}
	free(w);
	free(src);
	free(deq);
	free(x);
	free(xq);
	free(y);
	free(y2);
}

int main(void)
{
	uint64_t seed = (uint64_t)time(NULL);
	const char *env = getenv("TANDEM_SEED");
	if (env)
		seed = strtoull(env, NULL, 0);
	printf("seed %" PRIu64 " (replay with TANDEM_SEED=%" PRIu64 ")\n", seed, seed);
	rng_state = seed;

	static const int64_t outs[] = {1, 7, 33};
	static const int64_t ins[] = {256, 1280};
	static const int64_t toks[] = {1, 2, 3, 5, 8, 12, 17, 24, 70};
	int n_cases = 0;

	for (int nt = 1; nt <= 3; nt++) {
		struct kpool *p = kpool_create(nt);
		for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
			double worst = 0.0;
			for (size_t a = 0; a < sizeof outs / sizeof outs[0]; a++)
				for (size_t b = 0; b < sizeof ins / sizeof ins[0]; b++)
					for (size_t c = 0; c < sizeof toks / sizeof toks[0]; c++) {
						double e = run_case(p, types[ti], outs[a], ins[b], toks[c]);
						worst = e > worst ? e : worst;
						n_cases++;
					}
			/* odd sizes for the element-wise types (no block constraint) and a big one */
			if (ktype_get(types[ti])->blck == 1) {
				double e = run_case(p, types[ti], 5, 67, 9);
				worst = e > worst ? e : worst;
				e = run_case(p, types[ti], 3, 64, 2);
				worst = e > worst ? e : worst;
				e = run_case(p, types[ti], 7, 67, 20); /* GEMM kernel, odd k */
				worst = e > worst ? e : worst;
				n_cases += 3;
			}
			if (nt == 2) { /* larger cases: several chunks per thread, token blocks and
				        * super-blocks (130 > 128 tokens) */
				double e = run_case(p, types[ti], 130, 2048, 66);
				worst = e > worst ? e : worst;
				e = run_case(p, types[ti], 13, 512, 130);
				worst = e > worst ? e : worst;
				n_cases += 2;
			}
			if (nt == 2)
				printf("%-7s worst error %.2e of sum|wx|\n", ktype_name(types[ti]), worst);
		}
		kpool_destroy(p);
	}
	/* rows at a stride longer than their bytes, all three paths */
	{
		struct kpool *p = kpool_create(2);
		double worst = 0.0;
		row_pad = 100;
		for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
			for (int k = 0; k < 3; k++) {
				double e = run_case(p, types[ti], 9, 512, k == 0 ? 1 : k == 1 ? 5 : 20);
				worst = e > worst ? e : worst;
				n_cases++;
			}
		row_pad = 0;
		printf("padded row stride: worst error %.2e of sum|wx|\n", worst);
		kpool_destroy(p);
	}

	/* every instruction-set variant of the fast path's integer dots, forced in turn */
	static const int isas[] = {QUANT_XQ8_AVX2, QUANT_XQ8_AVX512};
	for (size_t ii = 0; ii < sizeof isas / sizeof isas[0]; ii++) {
		if (quant_xq8_select(isas[ii]) < 0) {
			printf("SKIP fast path %s: not supported by this CPU or build\n",
			       quant_xq8_isa_name(isas[ii]));
			continue;
		}
		if (quant_xq8_selected() != isas[ii]) {
			printf("FAIL: selected %s, asked for %s\n", quant_xq8_isa_name(quant_xq8_selected()),
			       quant_xq8_isa_name(isas[ii]));
			n_fail++;
		}
		for (int nt = 1; nt <= 2; nt++) {
			struct kpool *p = nt == 1 ? NULL : kpool_create(nt);
			for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
				double we = 0, wa = 0;
				test_fast(p, types[ti], 37, 512, 3, &we, &wa);
				test_fast(p, types[ti], 64, 2048, 2, &we, &wa);
				test_fast(p, types[ti], 16, 1024, 5, &we, &wa); /* falls back: exact */
				if (nt == 2 && kcpu_matmul_fast_supported(types[ti]))
					printf(
					    "fast %-10s %-7s err vs quantized-x exact %.2e, vs float x %.2e "
					    "(of sum|wx|)\n",
					    quant_xq8_isa_name(isas[ii]), ktype_name(types[ti]), we, wa);
			}
			kpool_destroy(p);
		}
	}
	quant_xq8_select(QUANT_XQ8_AUTO);
	printf("fast path variant in use: %s\n", quant_xq8_isa_name(quant_xq8_selected()));
	printf("%d cases; %s: %d failures\n", n_cases, n_fail ? "FAIL" : "OK", n_fail);
	return n_fail ? 1 : 0;
}
