/* The warp of kernels/cuda/matmul_multi.cu's mm_multi_mq_kernel (one token's Q8_0 products on int8
 * mma.sync, 16 rows a block; mm_multi_mqc_kernel's warps are the same code) run on the CPU: its
 * mq_block_words, mq_pass and mq_warp_rows SOURCE, with the int8 unit
 * of kernels/cuda/k45_i8.cuh (mi8_stage: x's three int8 parts), on 32 std::threads (tests/unit/sim_warp.h:
 * mma.sync m16n8k32 an exchange of the fragments in the PTX layout, multiplied out in full).
 * test_mq_sim.sh cuts the sources into .inc files, so CI without a GPU checks the kernel's own logic:
 * each lane's 8 weights of ITS block on its k slots, B's columns nonzero only on the slots of the lane
 * whose block they hold (parts 1 and 2, part 3 in a second product), the blocks of even index read
 * from 4-byte aligned words with funnel shifts and the odd ones aligned with d in the word before, the
 * 16-byte pad between rows, the lane-local epilogue and the sum over a row's 4 lanes. Each row's dot
 * over n slabs is held to a double-precision reference over the dequantized row: |sim - ref| <= 1e-6
 * sum |w| m_j + 1e-6 sum |w x| + 64 2^-149 (m_j: the largest |x| of element j's 32-element block).
 * Cases: 1..3 slabs, quants of the full int8 range (-128 included), scales of both signs, x uniform,
 * a zero block, one huge element, all tiny (1e-35), and a NaN (every row NaN). Built with UBSan's
 * alignment check where the compiler has it (test_mq_sim.sh): a misaligned word load stops the run.
 * The block's cp.async copies, the warp sums and the PDL order need the GPU (tests/ops/test_ops_multi.c). */
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "kernels/kernels.h"
#include "tests/unit/sim_q8.h"
#include "tests/unit/sim_warp.h"

#include "k45_i8_body.inc"

#define __host__
struct __half {
	uint16_t x;
};
static inline float __half2float(__half h)
{
	return sim_h2f(h.x);
}
static inline __half __ushort_as_half(unsigned short v)
{
	return __half{v};
}

#include "mq_body.inc"

static std::mt19937_64 rng(20261203);
static int checks, fails;

/* one case: MQ_RB rows of n_slab slabs against x of kind `kind` */
static void run_case(int n_slab, int kind, const char *what)
{
	const int stride = n_slab * 272 + MQ_PAD;
	std::vector<uint8_t> tile_v(mq_tile_bytes(n_slab) + 16);
	uint8_t *tile = tile_v.data() + (16 - (uintptr_t)tile_v.data() % 16) % 16; /* 16-byte aligned */
	const int K = 256 * n_slab;
	std::vector<double> w((size_t)MQ_RB * K);
	for (int r = 0; r < MQ_RB; r++)
		for (int b = 0; b < 8 * n_slab; b++)
			sim_q8_block(tile + r * stride + 34 * b, &w[(size_t)r * K + 32 * b], rng);
	std::vector<float> x_v((size_t)K + 4);
	float *x = x_v.data() + (16 - (uintptr_t)x_v.data() % 16) % 16 / 4;
	std::uniform_real_distribution<float> u(-1.0f, 1.0f);
	for (int k = 0; k < K; k++) {
		float v = u(rng);
		if (kind == 1 && k / 32 == 3) /* a zero block */
			v = 0.0f;
		if (kind == 2 && k == 77) /* one huge element */
			v = 3.0e4f;
		if (kind == 3) /* all tiny */
			v *= 1e-35f;
		if (kind == 4 && k == 100) /* a NaN: every row NaN */
			v = NAN;
		x[k] = v;
	}
	std::vector<mi8_x> X((size_t)n_slab);
	static float out[MQ_RB], part[1][MM_PART];
	for (int r = 0; r < MQ_RB; r++)
		part[0][r] = -12345.0f;
	std::barrier<> bar(32);
	sim_bar = &bar;
	std::vector<std::thread> th;
	for (int l = 0; l < 32; l++)
		th.emplace_back([&, l] {
			sim_lane = l;
			for (int s = 0; s < n_slab; s++) /* warp-collective: the norm's parts of each slab */
				mi8_stage(X[(size_t)s], x + 256 * s, l);
			const int g = l >> 2, t = l & 3;
			float acc[2] = {0.f, 0.f};
			for (int s = 0; s < n_slab; s++) {
				mq_pass<0>(acc, tile + s * 272, stride, &X[(size_t)s], g, t);
				mq_pass<1>(acc, tile + s * 272, stride, &X[(size_t)s], g, t);
			}
			mq_warp_rows(acc, part, 0, g,
			             t); /* the kernel's epilogue: the rows' sums into part[0] */
		});
	for (auto &t : th)
		t.join();
	for (int r = 0; r < MQ_RB; r++)
		out[r] = part[0][r];
	int bad = 0;
	double worst = 0;
	for (int r = 0; r < MQ_RB; r++) {
		checks++;
		const float got = out[r];
		if (kind == 4) {
			if (!std::isnan(got) && bad++ < 3)
				printf("  %s slabs %d: row %d with a NaN in x: %g\n", what, n_slab, r, got);
			continue;
		}
		double s = 0, b1 = 0, b2 = 0;
		for (int k = 0; k < K; k++) {
			double m = 0;
			for (int i = k / 32 * 32; i < k / 32 * 32 + 32; i++)
				m = std::fmax(m, std::fabs((double)x[i]));
			const double wk = w[(size_t)r * K + k];
			s += wk * x[k];
			b1 += std::fabs(wk) * m;
			b2 += std::fabs(wk * x[k]);
		}
		const double err = std::fabs((double)got - s),
		             tol = 1e-6 * b1 + 1e-6 * b2 + 64.0 * std::ldexp(1.0, -149);
		if (b2 > 0 && err / b2 > worst)
			worst = err / b2;
		if (!(err <= tol) && bad++ < 3)
			printf("  %s slabs %d: row %d: sim %.9g ref %.9g (|d| %.3g, tol %.3g)\n", what,
			       n_slab, r, got, s, err, tol);
	}
	fails += bad;
	printf("%-16s slabs %d: %s (largest |err| / sum |w x| %.2e)\n", what, n_slab, bad ? "FAIL" : "ok",
	       worst);
}

int main(void)
{
	static const char *kinds[] = {"uniform", "zero block", "huge element", "all tiny", "NaN"};
	for (int n_slab = 1; n_slab <= 3; n_slab++)
		run_case(n_slab, 0, kinds[0]);
	for (int kind = 1; kind < 5; kind++)
		run_case(2, kind, kinds[kind]);
	printf("%d checks, %d failed\n", checks, fails);
	return fails ? 1 : 0;
}
