/* kernels/cuda/matmul_q6k1.cu's kernel SOURCE run on the CPU (as gemv_res_sim.cc does for its kernel):
 * every CUDA thread a std::thread, __syncthreads a block-wide barrier, __shfl_xor_sync an exchange behind
 * a per-warp barrier (tests/unit/sim_block.h). test_q6k1_sim.sh cuts the kernel's device part, k45_i8.cuh's
 * x parts and cuda_common.cuh's word loads into an .inc file, so CI without a GPU checks the kernel's own
 * logic: each lane's share of a Q6_K block (half, 16 positions, quad pair), the 6-bit assembly from
 * ql / qh, the -32 folded into the dp4a chains, the x parts (quantized per lane, or taken from mi8_stage's
 * units as the norm before leaves them), the cp.async ring of row stages (which copies, which stage,
 * the waits), the butterfly and the warp-order sum.
 * Each output is held to a double-precision reference over the dequantized row (this file's own Q6_K
 * decode, written from MODEL-SPEC.md): |sim - ref| <= 1e-6 sum_i |w_i| m(i) + 1e-6 sum_i |w_i x_i| + 2^-120,
 * m(i) the largest |x| of element i's 32-element sub-block (x's three parts carry <= 6.1e-8 of it;
 * the rest is fp32 rounding). Outputs past n_out keep their guard value. The same case runs four ways
 * that must give the same bits: one row a ring stage on one block, two rows a stage on up to 3 blocks, four
 * rows a stage on up to 2 blocks (2 stages), one row a stage on up to 5 blocks (16-byte copies where rows
 * allow, else 8); shared memory is refilled with a pattern before every block and the copies land only at
 * their wait, so a stage read early fails. Cases: n_in / 256 = 4, 8, 20, 24 (GLM-5), 28 (DeepSeek-V3), 32
 * (the host takes n_in % 1024 == 0 up to 8192); n_out 1, 2, 3, 37 (fewer for the wide rows); x uniform, with
 * a zero sub-block and a huge element, all tiny (1e-33), and with a NaN (every output NaN); x quantized in
 * the kernel or taken from mi8_stage's units. It does not check PDL, the memory model or timing:
 * tests/ops/test_ops_matmul.c does that on a GPU. */
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/kernels.h"
#include "tests/unit/sim_block.h"

static sim_dim gridDim, blockDim;
static inline void __syncwarp()
{
	sim_warps[threadIdx.x >> 5].bar->arrive_and_wait();
}
static inline float __fdividef(float a, float b)
{
	return a / b;
}
static inline int __float2int_rn(float f)
{
	return (int)std::nearbyint(f);
}

/* the kernel's cp.async helpers on sim_block.h's deferred copies */
template <int CP> static inline void q6_cp(void *dst, const void *src)
{
	sim_cp<CP>(dst, src);
}
#define q6_commit g3_commit
#define q6_wait g3_wait
alignas(16) static uint8_t sim_dyn[49152];

#include "q6k1_body.inc"

static int n_check, n_fail;

/* MODEL-SPEC.md's Q6_K decode of one 210-byte block */
static void ref_dequant(const uint8_t *b, double *w)
{
	const double d = sim_h2f((uint16_t)(b[208] | b[209] << 8));
	for (int n = 0; n < 2; n++) {
		const uint8_t *QL = b + 64 * n, *QH = b + 128 + 32 * n;
		const int8_t *SC = (const int8_t *)(b + 192 + 8 * n);
		for (int l = 0; l < 32; l++) {
			const int is = l / 16;
			const int q1 = (QL[l] & 15) | ((QH[l] >> 0) & 3) << 4;
			const int q2 = (QL[l + 32] & 15) | ((QH[l] >> 2) & 3) << 4;
			const int q3 = (QL[l] >> 4) | ((QH[l] >> 4) & 3) << 4;
			const int q4 = (QL[l + 32] >> 4) | ((QH[l] >> 6) & 3) << 4;
			w[128 * n + l] = d * SC[is] * (q1 - 32);
			w[128 * n + l + 32] = d * SC[is + 2] * (q2 - 32);
			w[128 * n + l + 64] = d * SC[is + 4] * (q3 - 32);
			w[128 * n + l + 96] = d * SC[is + 6] * (q4 - 32);
		}
	}
}

/* x's units as the norm before leaves them: mi8_stage, one warp a unit */
static void make_parts(const float *x, int nb, mi8_x *xq)
{
	for (int u = 0; u < nb; u++)
		sim_block(32, 0, 0, [=]() { mi8_stage(xq[u], x + 256 * u, (int)threadIdx.x); });
}

/* the kernel with RB rows a stage, a ring of S stages, CP-byte copies, on `grid` blocks one after another */
template <int RB, int S, int CP>
static void run_kernel(const uint8_t *w, int64_t n_out, int nb, const float *x, const mi8_x *xq, float *y,
                       unsigned grid)
{
	const int W = (nb + Q6BPW - 1) / Q6BPW;
	const size_t rb = (size_t)210 * nb, rbs = (rb + 15) & ~(size_t)15;
	if ((size_t)S * RB * rbs > sizeof(sim_dyn) || rb % CP) {
		printf("FAIL: the harness asked for a ring that does not fit (nb %d, RB %d, S %d, CP %d)\n",
		       nb, RB, S, CP);
		n_fail++;
		return;
	}
	gridDim.x = grid, blockDim.x = (unsigned)(W * 32);
	for (unsigned b = 0; b < grid; b++) {
		memset(sim_dyn, 0xcd, sizeof(sim_dyn)); /* a stage read before its copies landed reads this */
		sim_block(W * 32, b, 0, [=]() { q6k1_kernel<RB, S, CP>(w, rb, rbs, n_out, nb, x, xq, y); });
	}
}

enum xkind { X_UNIF, X_ZERO_HUGE, X_TINY, X_NAN };

static void one_case(std::mt19937 &rng, int nb, int64_t n_out, xkind xk, bool parts)
{
	const int64_t n_in = 256 * (int64_t)nb;
	const size_t rb = (size_t)210 * nb;
	std::vector<uint8_t> w(rb * (size_t)n_out + 64);
	std::uniform_int_distribution<int> byte(0, 255);
	std::uniform_real_distribution<float> u(-1.f, 1.f);
	for (auto &v : w)
		v = (uint8_t)byte(rng);
	for (int64_t r = 0; r < n_out; r++)
		for (int b = 0; b < nb; b++) { /* a finite d of either sign, 2^-12 .. 2^3 */
			const float d = std::ldexp(0.5f + 0.5f * std::fabs(u(rng)), -12 + (int)(rng() % 16)) *
			                (rng() & 1 ? -1.f : 1.f);
			const uint16_t h = sim_f2h(d);
			w[r * rb + 210 * b + 208] = (uint8_t)(h & 255);
			w[r * rb + 210 * b + 209] = (uint8_t)(h >> 8);
		}
	float *x = (float *)aligned_alloc(64, sizeof(float) * (size_t)(n_in + 16));
	for (int64_t i = 0; i < n_in; i++)
		x[i] = u(rng);
	if (xk == X_ZERO_HUGE) {
		const int64_t z = 32 * (int64_t)(rng() % (n_in / 32));
		for (int i = 0; i < 32; i++)
			x[z + i] = 0.f;
		x[rng() % n_in] = 3.0e4f;
	} else if (xk == X_TINY)
		for (int64_t i = 0; i < n_in; i++)
			x[i] *= 1e-33f;
	else if (xk == X_NAN)
		x[rng() % n_in] = NAN;
	mi8_x *xq = nullptr;
	if (parts) {
		xq = (mi8_x *)aligned_alloc(64, (sizeof(mi8_x) * (size_t)nb + 63) / 64 * 64);
		make_parts(x, nb, xq);
	}
	const float guard = -7.25e11f;
	std::vector<float> y(n_out + 8, guard), y2(n_out + 8, guard), y3(n_out + 8, guard);
	/* one row a stage on one block (8 stages where they fit 48 KB, else 4; 8-byte copies); two rows a
	 * stage on 3 blocks, or one block a row pair (4 stages, where they fit); one row a stage, one block a
	 * row (up to 5 blocks; 4 stages, 16-byte copies where rows allow): the same bits */
	if (8 * ((rb + 15) & ~(size_t)15) <= sizeof(sim_dyn)) /* the host's rule: 8 stages where they fit */
		run_kernel<1, 8, 8>(w.data(), n_out, nb, x, xq, y.data(), 1);
	else
		run_kernel<1, 4, 8>(w.data(), n_out, nb, x, xq, y.data(), 1);
	const unsigned groups = (unsigned)((n_out + 1) / 2), g2 = groups < 3 ? groups : 3;
	if (4 * 2 * ((rb + 15) & ~(size_t)15) <= sizeof(sim_dyn)) /* the host's rule: the ring fits 48 KB */
		run_kernel<2, 4, 8>(w.data(), n_out, nb, x, xq, y2.data(), g2 == 1 ? groups : g2);
	else
		y2 = y;
	std::vector<float> y4(n_out + 8, guard);
	if (2 * 4 * ((rb + 15) & ~(size_t)15) <= sizeof(sim_dyn)) /* four rows a stage, 2 stages, 2 blocks */
		run_kernel<4, 2, 8>(w.data(), n_out, nb, x, xq, y4.data(), n_out > 4 ? 2 : 1);
	else
		y4 = y;
	const unsigned g3 = n_out < 5 ? (unsigned)n_out : 5; /* a block a row, or 5 blocks striding */
	if (rb % 16 == 0)
		run_kernel<1, 4, 16>(w.data(), n_out, nb, x, xq, y3.data(), g3);
	else
		run_kernel<1, 4, 8>(w.data(), n_out, nb, x, xq, y3.data(), g3);
	std::vector<double> wr(256);
	int bad = 0;
	for (int64_t r = 0; r < n_out; r++) {
		double ref = 0, mag = 0, wm = 0;
		for (int b = 0; b < nb; b++) {
			ref_dequant(&w[r * rb + 210 * b], wr.data());
			for (int sb = 0; sb < 8; sb++) {
				double m = 0;
				for (int i = 0; i < 32; i++)
					m = std::max(m, (double)std::fabs(x[256 * b + 32 * sb + i]));
				for (int i = 0; i < 32; i++) {
					const double wi = wr[32 * sb + i], xi = x[256 * b + 32 * sb + i];
					ref += wi * xi, mag += std::fabs(wi * xi), wm += std::fabs(wi) * m;
				}
			}
		}
		bool ok;
		if (xk == X_NAN)
			ok = std::isnan(y[r]);
		else
			ok =
			    std::isfinite(y[r]) && std::fabs(y[r] - ref) <= 1e-6 * wm + 1e-6 * mag + 0x1p-120;
		const bool same = memcmp(&y[r], &y2[r], 4) == 0 && memcmp(&y[r], &y3[r], 4) == 0 &&
		                  memcmp(&y[r], &y4[r], 4) == 0;
		if ((!ok || !same) && bad++ < 3)
			printf(
			    "FAIL: nb %d n_out %lld x %d parts %d row %lld: %.9g against %.9g (mag %.3g)%s\n",
			    nb, (long long)n_out, (int)xk, (int)parts, (long long)r, y[r], ref, mag,
			    same ? "" : ", another grid or row step gave other bits");
	}
	for (int i = 0; i < 8; i++)
		if (y[n_out + i] != guard || y2[n_out + i] != guard || y3[n_out + i] != guard ||
		    y4[n_out + i] != guard)
			bad++, printf("FAIL: nb %d n_out %lld: the guard after y was written\n", nb,
			              (long long)n_out);
	n_check++;
	n_fail += bad != 0;
	free(x);
	free(xq);
}

int main(int argc, char **argv)
{
	const unsigned seed = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 20261204u;
	printf("q6k1_sim: seed %u\n", seed);
	std::mt19937 rng(seed);
	const int nbs[] = {4,  8,  20,
	                   24, 28, 32}; /* n_in % 1024 == 0: 8-byte aligned rows (the host's rule) */
	const int64_t nouts[] = {1, 2, 3, 37};
	for (int nb : nbs)
		for (int64_t n_out : nouts)
			for (int parts = 0; parts < 2; parts++)
				for (int xk = X_UNIF; xk <= X_NAN; xk++) {
					if (nb >= 20 &&
					    (n_out == 2 || (n_out > 3 && (xk != X_UNIF || !parts))))
						continue; /* the wide rows: fewer cases (each block is 160-256
						             threads) */
					one_case(rng, nb, n_out, (xkind)xk, parts != 0);
				}
	if (sim_leaks)
		printf("FAIL: %d threads left cp.async copies\n", (int)sim_leaks), n_fail++;
	printf("%d checks, %d failed\n", n_check, n_fail);
	return n_fail ? 1 : 0;
}
