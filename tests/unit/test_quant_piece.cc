/* The CUDA backend's piece dequantizers (kernels/cuda/quant_piece.cuh, quant_piece_iq.cuh: kq<T>::load
 * and decode, the code every generic CUDA product, the embedding lookup and the prefill dequantization
 * share) compiled for the host and checked against the CPU backend's dequantizer, so that CI, which
 * has no GPU, still checks their bit layouts. The CUDA intrinsics they use have host stand-ins in
 * tests/unit/sim_cuda.h (the kernel simulations' header) and below (read-only loads as plain loads,
 * cuda_common.cuh's word loaders with their alignment checked).
 *
 * For every type in KCUDA_FOR_EACH_TYPE, on seeded random rows (tests/ops/ops_util.h's filler: random
 * bytes with sane fp16 scales; seed printed, TANDEM_SEED=... replays), every piece's fma(a, v, b)
 * must equal kcpu_dequant_row's value: exactly where b = 0 (the float types, Q8_0, IQ4_*, the
 * codebook types; a zero's sign may differ), within 4 ulp of the block's largest value where the piece has an
 * offset (Q4_0 ... Q6_K: the GPU forms a * v + b from a rescaled v, MODEL-SPEC.md §5 has the CPU's formula).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "tests/ops/ops_util.h"
#include "tests/unit/sim_cuda.h" /* vector types, __uint_as_float, __byte_perm, __funnelshift_r */

#include "tests/unit/sim_piece.h" /* quant_piece.cuh's CUDA and cuda_common.cuh helpers */

#include "kernels/cuda/quant_piece.cuh"

/* ---- the check ---- */
static int n_fail, n_check;

template <int T> static void check_type(int64_t n_in, int n_rows)
{
	const struct ktype_info *ti = ktype_get(T);
	size_t rb = 0;
	if (!ktype_row_bytes(T, n_in, &rb)) {
		printf("FAIL %s: row bytes\n", ti->name);
		n_fail++;
		return;
	}
	/* 16-byte aligned rows with 16 bytes of tail, as the device weight buffers have */
	const size_t stride = (rb + 15) & ~(size_t)15;
	uint8_t *w = (uint8_t *)aligned_alloc(16, stride * (size_t)n_rows + 16);
	float *ref = (float *)malloc(sizeof(float) * (size_t)n_in);
	memset(w, 0, stride * (size_t)n_rows + 16);
	ops_fill_weight(T, n_in, n_rows, stride, w);
	int bad = 0;
	double worst = 0;
	for (int r = 0; r < n_rows; r++) {
		const uint8_t *row = w + stride * (size_t)r;
		kcpu_dequant_row(T, row, ref, n_in);
		for (int64_t p = 0; p < n_in / 16; p++) {
			float out[16], v[16], a, b;
			typename kq<T>::raw raw;
			kq<T>::load(row, p, raw);
			kq<T>::decode(raw, p, v, a, b);
			for (int i = 0; i < 16; i++)
				out[i] = fmaf(a, v[i], b);
			/* the tolerance unit: the largest |value| of the piece's block (or the piece) */
			const int64_t e0 = 16 * p, blk = ti->blck > 16 ? ti->blck : 16, b0 = e0 / blk * blk;
			float scale = 0.0f;
			for (int64_t j = b0; j < b0 + blk && j < n_in; j++)
				scale = fmaxf(scale, fabsf(ref[j]));
			const float tol = kq<T>::HAS_B ? 4.0f * scale * 1.1920929e-7f : 0.0f;
			for (int i = 0; i < 16; i++) {
				const float d = fabsf(out[i] - ref[e0 + i]);
				const bool ok =
				    kq<T>::HAS_B ? d <= tol : out[i] == ref[e0 + i]; /* -0 == +0 */
				n_check++;
				if (!ok && bad++ < 4)
					printf("FAIL %s row %d element %lld: GPU piece %.9g, CPU %.9g\n",
					       ti->name, r, (long long)(e0 + i), (double)out[i],
					       (double)ref[e0 + i]);
				if (scale > 0)
					worst = fmax(worst, d / scale);
			}
		}
	}
	n_fail += bad;
	printf("%-8s %d rows of %lld: %s, worst |d| %.2g of the block's max\n", ti->name, n_rows,
	       (long long)n_in,
	       bad            ? "FAIL"
	       : kq<T>::HAS_B ? "within 4 ulp"
	                      : "exact",
	       worst);
	free(w);
	free(ref);
}

int main(void)
{
	ops_seed_init();
#define X(T) check_type<T>(1024, 24);
	KCUDA_FOR_EACH_TYPE(X)
#undef X
	printf("%d values checked, %d failed\n", n_check, n_fail);
	return n_fail ? 1 : 0;
}
