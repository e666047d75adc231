/* The tensor-core decode units of kernels/cuda/gemv_mma.cuh (gm_unit: the K-quants, Q8_0 and, since
 * session 32, the codebook types IQ1_S ... IQ3_S of gm_unit_iq), compiled for the host and run lane by
 * lane by gemv_mma.cuh's gm_emulate_rows: the 32 lanes of a warp one after another with mma.sync replayed
 * from their recorded fragments, so CI without a GPU checks the units' byte offsets, codebook lookups,
 * sign bits, scales and fp16 construction (bench_cuda_gemv_mma's emu mode runs the same driver, but only
 * by hand and in a CUDA build).
 *
 * Every output is held to the exact dot (double) of the CPU backend's dequantized row with x, within
 * 2^-16 of sum |w_i x_i|, bench_cuda_gemv_mma's bound: x enters as fp16 hi + lo / 2048 (22 bits), A is
 * exact (a codebook magnitude <= 63 times an odd scale <= 31 is <= 1953; the K-quants' as the header
 * explains), the products and sums are fp32. Cases: every type, one and two row tiles (R 1: the MoE down
 * kernel and the GEMV; R 2: gate / up), 1, 4, 5 and 8 tokens (one and two n-tiles), rows of 256 and 2048
 * values (Q6_K's 210-byte rows at 256 take the run-time alignment path), x scaled by 1, 2^-10, 2^8 and
 * 1e6 (past fp16: the unit's power-of-two rescale). Rows are random blocks with sane fp16 scales
 * (tests/ops/ops_util.h; seed printed, TANDEM_SEED=... replays); the codebook types' rows sit at an odd
 * multiple of 2 bytes, as their 2-byte-aligned blocks may. Timing and the kernels around the units are
 * the GPU op tests' (tests/ops/test_ops_moe.c, test_ops_matmul.c). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "kernels/kernels.h"
#include "tests/ops/ops_util.h"
#include "tests/unit/sim_cuda.h"
#include "tests/unit/sim_piece.h"

static inline uint2 make_uint2(uint32_t a, uint32_t b)
{
	return uint2{a, b};
}
#define __host__
#define GEMV_MMA_UNITS_ONLY
#include "kernels/cuda/gemv_mma.cuh"

static int n_fail;

/* y[t][r] for rows [0, n_out) of w (rb bytes apart) and tokens [0, n_tok) of x (n_in apart): the
 * GEMV's plan, a warp owning 16 R rows over all units */
template <int T, int R, int NG>
static void emulate(const uint8_t *w, size_t rb, int64_t n_in, int64_t n_out, const float *x, int n_tok,
                    float *y)
{
	gm_emulate_rows<T, R, NG, gm_lane<R, NG>>(
	    w, rb, n_in, n_out, n_tok, rb % 4 == 0, [&](gm_lane<R, NG> &a) { a.x = x, a.ldx = n_in; },
	    [&](int64_t row, int col, float v) { y[(size_t)col * n_out + row] = v; });
}

template <int T> static void check_type(void)
{
	const char *name = ktype_name(T);
	for (const int64_t n_in : {256, 2048})
		for (const int R : {1, 2}) {
			const int64_t n_out = 16 * R + 5; /* a partial last tile: rows past n_out clamped */
			size_t rb;
			if (!ktype_row_bytes(T, n_in, &rb))
				abort();
			/* codebook blocks are only 2-byte aligned: their rows at an odd multiple of 2; the
			 * others 16-byte aligned, as the device buffers are */
			std::vector<uint8_t> wbuf(rb * (size_t)n_out + 48);
			uint8_t *w = (uint8_t *)(((uintptr_t)wbuf.data() + 15) & ~(uintptr_t)15) +
			             (gm_is_iq<T> ? 2 : 0);
			ops_fill_weight(T, n_in, n_out, rb, w);
			std::vector<float> deq((size_t)n_in * (size_t)n_out);
			for (int64_t r = 0; r < n_out; r++)
				kcpu_dequant_row(T, w + (size_t)r * rb, deq.data() + (size_t)r * n_in, n_in);
			for (const float xs : {1.f, 0x1p-10f, 0x1p8f, 1e6f})
				for (const int nt : {1, 4, 5, 8}) {
					std::vector<float> x((size_t)nt * n_in), y((size_t)nt * n_out, NAN);
					for (float &v : x)
						v = xs * ops_rng_unif();
					if (nt <= 4)
						R == 1 ? emulate<T, 1, 1>(w, rb, n_in, n_out, x.data(), nt,
						                          y.data())
						       : emulate<T, 2, 1>(w, rb, n_in, n_out, x.data(), nt,
						                          y.data());
					else
						R == 1 ? emulate<T, 1, 2>(w, rb, n_in, n_out, x.data(), nt,
						                          y.data())
						       : emulate<T, 2, 2>(w, rb, n_in, n_out, x.data(), nt,
						                          y.data());
					double worst = 0;
					int bad = 0;
					for (int64_t r = 0; r < n_out; r++)
						for (int t = 0; t < nt; t++) {
							double e = 0, m = 1e-30;
							for (int64_t i = 0; i < n_in; i++) {
								const double p =
								    (double)deq[(size_t)r * n_in + i] *
								    x[(size_t)t * n_in + i];
								e += p, m += fabs(p);
							}
							const float g = y[(size_t)t * n_out + r];
							const double err = fabs(g - e) / m;
							worst = std::max(worst, err);
							if (!isfinite(g) || !(err <= 0x1p-16)) {
								if (bad++ < 3)
									printf(
									    "FAIL %s n_in %lld R %d x*%g "
									    "n_tok %d row %lld "
									    "tok %d: unit %.9g, exact %.9g\n",
									    name, (long long)n_in, R,
									    (double)xs, nt, (long long)r, t,
									    (double)g, e);
							}
						}
					n_fail += bad;
					if (n_in == 2048 && nt == 5 && xs == 1.f)
						printf("%-8s R %d n_in %lld: worst |unit - exact| %.2e of "
						       "sum |w x|\n",
						       name, R, (long long)n_in, worst);
				}
		}
}

int main(void)
{
	ops_seed_init();
	check_type<KT_Q4_K>();
	check_type<KT_Q5_K>();
	check_type<KT_Q6_K>();
	check_type<KT_Q8_0>();
	check_type<KT_IQ2_XXS>();
	check_type<KT_IQ2_XS>();
	check_type<KT_IQ2_S>();
	check_type<KT_IQ3_XXS>();
	check_type<KT_IQ3_S>();
	check_type<KT_IQ1_S>();
	check_type<KT_IQ1_M>();
	printf("%s: %d failures\n", n_fail ? "FAIL" : "OK", n_fail);
	return n_fail ? 1 : 0;
}
