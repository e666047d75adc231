/* The tensor-core decode unit of the codebook types (kernels/cuda/gemv_mma.cuh gm_unit_iq: IQ2_XXS,
 * IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S), compiled for the host and run lane by lane: the 32 lanes of a warp
 * one after another with mma.sync m16n8k16 replayed from their recorded fragments (gemv_mma.cuh's
 * gm_emu, as bench_cuda_gemv_mma's emu mode does for the K-quants), so CI without a GPU checks the
 * unit's byte offsets, codebook lookups, sign bits, integer scales and fp16 construction.
 *
 * Every output is held to the exact dot (double) of the CPU backend's dequantized row with x, within
 * 2^-16 of sum |w_i x_i|, the bound bench_cuda_gemv_mma holds the K-quant units to: x enters as
 * fp16 hi + lo / 2048 (22 bits), A is exact (codebook magnitude <= 63 times an odd scale <= 31, <=
 * 1953, exact in fp16), the products and sums are fp32. Cases: every type, one and two row tiles (R 1:
 * the MoE down kernel and the GEMV; R 2: gate / up), 1, 4, 5 and 8 tokens (one and two n-tiles), rows of
 * 256 and 2048 values, x scaled by 1, 2^-10, 2^8 and 1e6 (past fp16: the unit's power-of-two rescale).
 * Rows are random blocks with sane fp16 scales (tests/ops/ops_util.h; seed printed, TANDEM_SEED=...
 * replays). Timing and the kernels around the unit are the GPU op tests' (tests/ops/test_ops_moe.c). */
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
	gm_emu emu;
	gm_emu_ctx = &emu;
	std::vector<gm_lane<R, NG>> L(32);
	gm_stage<NG> stage;
	for (int64_t row0 = 0; row0 < n_out; row0 += 16 * R) {
		memset(&stage, 0, sizeof(stage));
		for (float &f : stage.f)
			f = 1.f;
		const uint8_t *rows[32][R][2];
		for (int l = 0; l < 32; l++) {
			gm_lane<R, NG> &a = L[l];
			a.g = l >> 2, a.t = l & 3, a.lane = l, a.n_tok = n_tok, a.sm = &stage, a.x = x,
			a.ldx = n_in;
			memset(a.acc, 0, sizeof(a.acc));
			for (int r = 0; r < R; r++)
				for (int hr = 0; hr < 2; hr++)
					rows[l][r][hr] =
					    w +
					    (size_t)std::min(row0 + 16 * r + 8 * hr + a.g, n_out - 1) * rb;
		}
		for (int64_t u = 0; u < n_in / 256; u++) {
			emu.pass = 1;
			for (int l = 0; l < 32; l++) {
				const gm_lane<R, NG> keep = L[l];
				emu.lane = l;
				emu.rec[l].clear();
				gm_unit<T, R, NG>(L[l], rows[l], u);
				L[l] = keep;
			}
			gm_emu_replay(emu);
			emu.pass = 2;
			for (int l = 0; l < 32; l++) {
				emu.lane = l;
				emu.call = 0;
				gm_unit<T, R, NG>(L[l], rows[l], u);
			}
		}
		for (int l = 0; l < 32; l++)
			for (int r = 0; r < R; r++)
				for (int k = 0; k < NG; k++)
					for (int hr = 0; hr < 2; hr++) {
						const int64_t row = row0 + 16 * r + 8 * hr + L[l].g;
						const int tok = 4 * k + L[l].t;
						if (row < n_out && tok < n_tok)
							y[(size_t)tok * n_out + row] =
							    fmaf(L[l].acc[r][k][2 * hr + 1], 1.f / 2048.f,
							         L[l].acc[r][k][2 * hr]);
					}
	}
	gm_emu_ctx = NULL;
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
			/* the blocks are only 2-byte aligned: rows of odd block counts at odd multiples of 2
			 */
			std::vector<uint8_t> wbuf(rb * (size_t)n_out + 32);
			uint8_t *w = wbuf.data() + 2;
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
