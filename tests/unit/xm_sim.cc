/* The warp of kernels/cuda/matmul_multi.cu's mm_xm_kernel (TANDEM_MULTI_XM=1: 5-8 tokens of Q8_0 products
 * on int8 mma.sync) run on the CPU: its xm_warp SOURCE, with matmul_impl.cuh's g3_q8_bytes and the int8 unit
 * of kernels/cuda/k45_i8.cuh (mi8_stage: x's three int8 parts), on 32 std::threads (tests/unit/sim_warp.h:
 * __syncwarp a barrier, mma.sync m16n8k32 an exchange of the fragments in the PTX layout, multiplied
 * out in full). test_xm_sim.sh cuts the sources into .inc files, so CI without a GPU checks the
 * kernel's own logic: the swapped roles (x's parts as A, parts 1 and 2 in its row halves, part 3
 * against zero rows; 8 weight rows as B), the k permutation both sides share, the 2-byte-aligned
 * blocks of a Q8_0 slab in shared memory (g3_q8_bytes's funnel shifts), the lane-local epilogue and the
 * zero tokens past n_tok. Each (token, row) dot over the 256-element slab is held to a double-precision
 * reference over the dequantized row: |sim - ref| <= 1e-6 sum |w| m_j + 1e-6 sum |w x| + 64 2^-149 (m_j:
 * the largest |x| of element j's 32-element block; the parts carry <= 6.1e-8 of it). Cases: 16 and 32
 * rows (R8 2, 4), 1..8 tokens, quants of the full int8 range (-128 included), scales of both signs,
 * x uniform, a zero block, one huge element, all tiny (1e-35), and a NaN (that token's rows NaN).
 * Built with UBSan's alignment check where the compiler has it (test_xm_sim.sh), so a misaligned word
 * load, which x86 performs and the GPU's shared memory does not, stops the run. The block and
 * cluster sums and the PDL order need the GPU (tests/ops/test_ops_multi.c). */
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

struct __half {
	uint16_t x;
};
static inline float __half2float(__half h)
{
	return sim_h2f(h.x);
}
static inline uint2 make_uint2(uint32_t a, uint32_t b)
{
	return {a, b};
}

#include "xm_body.inc"

static std::mt19937_64 rng(20261202);
static int checks, fails;

/* one case: RT = 8 R8 rows of one slab against n_tok tokens' x of kind `kind` */
template <int R8> static void run_case(int n_tok, int kind, const char *what)
{
	constexpr int RT = 8 * R8;
	alignas(16) static uint8_t wsm[RT * XM_SB];
	std::vector<double> w((size_t)RT * 256);
	for (int r = 0; r < RT; r++)
		for (int b = 0; b < 8; b++)
			sim_q8_block(wsm + r * XM_SB + 34 * b, &w[(size_t)r * 256 + 32 * b], rng);
	alignas(16) static float x[8][256];
	std::uniform_real_distribution<float> u(-1.0f, 1.0f);
	for (int t = 0; t < 8; t++)
		for (int k = 0; k < 256; k++) {
			float v = u(rng);
			if (kind == 1 && k / 32 == 3) /* a zero block */
				v = 0.0f;
			if (kind == 2 && k == 77 + t) /* one huge element */
				v = 3.0e4f;
			if (kind == 3) /* all tiny */
				v *= 1e-35f;
			if (kind == 4 && t == 1 && k == 100) /* a NaN: token 1's rows NaN */
				v = NAN;
			x[t][k] = v;
		}
	static mi8_x X[8];
	static float out[8][RT];
	for (int t = 0; t < 8; t++)
		for (int r = 0; r < RT; r++)
			out[t][r] = -12345.0f;
	std::barrier<> bar(32);
	sim_bar = &bar;
	std::vector<std::thread> th;
	for (int l = 0; l < 32; l++)
		th.emplace_back([&, l] {
			sim_lane = l;
			for (int t = 0; t < n_tok;
			     t++) /* warp-collective, as the kernel quantizes its slab */
				mi8_stage(X[t], x[t], l);
			const int g = l >> 2, j = l & 3;
			float acc[R8][2];
			for (int i = 0; i < R8; i++)
				acc[i][0] = acc[i][1] = 0.0f;
			xm_warp<R8>(wsm, X + (g < n_tok ? g : 0), g < n_tok, l, acc, []() { __syncwarp(); });
			for (int i = 0; i < R8; i++)
				for (int e = 0; e < 2; e++)
					out[g][8 * i + 2 * j + e] = acc[i][e];
		});
	for (auto &t : th)
		t.join();
	int bad = 0;
	double worst = 0;
	for (int t = 0; t < 8; t++)
		for (int r = 0; r < RT; r++) {
			checks++;
			const float got = out[t][r];
			if (t >= n_tok) {
				if (got != 0.0f && bad++ < 3)
					printf("  %s R8 %d n_tok %d: token %d row %d past n_tok: %g, not 0\n",
					       what, R8, n_tok, t, r, got);
				continue;
			}
			if (kind == 4 && t == 1) {
				if (!std::isnan(got) && bad++ < 3)
					printf("  %s R8 %d n_tok %d: row %d of the NaN token: %g\n", what, R8,
					       n_tok, r, got);
				continue;
			}
			double s = 0, b1 = 0, b2 = 0;
			for (int k = 0; k < 256; k++) {
				double m = 0;
				for (int i = k / 32 * 32; i < k / 32 * 32 + 32; i++)
					m = std::fmax(m, std::fabs((double)x[t][i]));
				const double wk = w[(size_t)r * 256 + k];
				s += wk * x[t][k];
				b1 += std::fabs(wk) * m;
				b2 += std::fabs(wk * x[t][k]);
			}
			const double err = std::fabs((double)got - s),
			             tol = 1e-6 * b1 + 1e-6 * b2 + 64.0 * std::ldexp(1.0, -149);
			if (b2 > 0 && err / b2 > worst)
				worst = err / b2;
			if (!(err <= tol) && bad++ < 3)
				printf("  %s R8 %d n_tok %d: token %d row %d: sim %.9g ref %.9g (|d| %.3g, "
				       "tol %.3g)\n",
				       what, R8, n_tok, t, r, got, s, err, tol);
		}
	fails += bad;
	printf("%-16s R8 %d n_tok %d: %s (largest |err| / sum |w x| %.2e)\n", what, R8, n_tok,
	       bad ? "FAIL" : "ok", worst);
}

int main(void)
{
	static const char *kinds[] = {"uniform", "zero block", "huge element", "all tiny", "NaN"};
	for (int n_tok = 1; n_tok <= 8; n_tok++)
		run_case<2>(n_tok, 0, kinds[0]);
	for (int kind = 1; kind < 5; kind++) {
		run_case<2>(8, kind, kinds[kind]);
		run_case<4>(5, kind, kinds[kind]);
	}
	run_case<4>(8, 0, kinds[0]);
	printf("%d checks, %d failed\n", checks, fails);
	return fails ? 1 : 0;
}
