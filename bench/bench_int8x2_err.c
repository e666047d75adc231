/* The error a one-token product would make with x held as integers, for planning a dp4a unit
 * (docs/PERFORMANCE.md, session 8): x is split per 32-element sub-block into
 *   x ~ s (h + l / 254),  s = max |x| / 127,  h = round(x / s),  l = round((x / s - h) 254)
 * (two int8 halves; one half: l = 0). With integer products summed exactly, the only error is that of
 * x itself, so each row's error is dot(w, x~) - dot(w, x) over the row's real weights: random rows of
 * the weight type (ops_fill_weight) dequantized by the CPU backend, sums in double. Reported as a
 * share of max |dot| over the rows, next to the CPU's own float dot (kcpu_dot_row) against double.
 *
 * Usage: bench_int8x2_err [--type Q4_K] [--d 6144] [--rows 512] [--xscale 1]   (no GPU needed) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "tests/ops/ops_util.h"

/* x~ of one split: halves 2 (h and l) or 1 (h only) */
static void split_x(const float *x, float *xt, int64_t n, int halves)
{
	for (int64_t b = 0; b < n; b += 32) {
		const int64_t e = b + 32 < n ? b + 32 : n;
		float m = 0.f;
		for (int64_t i = b; i < e; i++)
			m = fmaxf(m, fabsf(x[i]));
		const float s = m > 0.f ? m / 127.f : 1.f;
		for (int64_t i = b; i < e; i++) {
			const float v = x[i] / s, h = rintf(v);
			const float l = halves > 1 ? rintf((v - h) * 254.f) : 0.f;
			xt[i] = (float)((double)s * ((double)h + (double)l / 254.0));
		}
	}
}

int main(int argc, char **argv)
{
	int type = KT_Q4_K;
	int64_t D = 6144, R = 512;
	double xscale = 1.0;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--type")) {
			type = -1;
			for (int t = 0; t < KT_COUNT; t++)
				if (ktype_get(t) && !strcmp(ktype_get(t)->name, argv[i + 1]))
					type = t;
			if (type < 0) {
				fprintf(stderr, "bench_int8x2_err: unknown type %s\n", argv[i + 1]);
				return 2;
			}
		} else if (!strcmp(argv[i], "--d"))
			D = strtoll(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--rows"))
			R = strtoll(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--xscale"))
			xscale = strtod(argv[i + 1], NULL);
		else {
			fprintf(stderr,
			        "usage: bench_int8x2_err [--type T] [--d N] [--rows N] [--xscale S]\n");
			return 2;
		}
	}
	size_t rb = 0;
	if (D < 32 || R < 1 || !ktype_row_bytes(type, D, &rb) || rb == 0) {
		fprintf(stderr, "bench_int8x2_err: %s rows of %lld elements are not possible\n",
		        ktype_name(type), (long long)D);
		return 2;
	}
	ops_seed_init();
	uint8_t *w = malloc(rb * (size_t)R);
	float *x = malloc(sizeof(float) * (size_t)D), *x2 = malloc(sizeof(float) * (size_t)D),
	      *x1 = malloc(sizeof(float) * (size_t)D), *wf = malloc(sizeof(float) * (size_t)D);
	if (!w || !x || !x2 || !x1 || !wf) {
		fprintf(stderr, "bench_int8x2_err: out of memory\n");
		return 1;
	}
	ops_fill_weight(type, D, R, rb, w);
	for (int64_t i = 0; i < D; i++)
		x[i] = (float)(xscale * ops_rng_unif());
	split_x(x, x2, D, 2);
	split_x(x, x1, D, 1);
	double maxref = 0, e_cpu = 0, e_two = 0, e_one = 0;
	for (int64_t r = 0; r < R; r++) {
		const uint8_t *row = w + (size_t)r * rb;
		kcpu_dequant_row(type, row, wf, D);
		double ref = 0, two = 0, one = 0;
		for (int64_t i = 0; i < D; i++) {
			ref += (double)wf[i] * x[i];
			two += (double)wf[i] * x2[i];
			one += (double)wf[i] * x1[i];
		}
		maxref = fmax(maxref, fabs(ref));
		e_cpu = fmax(e_cpu, fabs((double)kcpu_dot_row(type, row, x, D) - ref));
		e_two = fmax(e_two, fabs(two - ref));
		e_one = fmax(e_one, fabs(one - ref));
	}
	printf("%s D %lld, %lld rows, x uniform in [-%g, %g): max|dot| %.4g; max error as a share of it: "
	       "CPU float dot %.2g, x in two int8 halves %.2g, one int8 half %.2g\n",
	       ktype_name(type), (long long)D, (long long)R, xscale, xscale, maxref, e_cpu / maxref,
	       e_two / maxref, e_one / maxref);
	free(w);
	free(x);
	free(x2);
	free(x1);
	free(wf);
	return 0;
}
