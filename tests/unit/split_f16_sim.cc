/* The numerics of matmul_gemm.cu's split fp16 GEMM (kcuda_gemm_split_launch: the fp32 path at prefill
 * sizes), run on the CPU from the kernel's own source: test_split_f16_sim.sh cuts split_exp1, split_exps
 * and split_hl out of matmul_gemm.cu, and this file builds around them with _Float16 standing in for
 * __half (IEEE binary16, round to nearest even, subnormals kept: the device's __float2half_rn). For each
 * case it scales and splits W and X as split_w / split_x do, sums [W_hi | W_hi | W_lo] . [x_hi ; x_lo ;
 * x_hi] over K' = 3K in fp32 (every product of two halves is exact in fp32, as on the tensor cores),
 * multiplies by alpha = 2^-(e_w + e_x) and holds every output to the op tests' fp32-path tolerance:
 * |y - ref| <= 2e-6 sqrt(K) sum |w x| + 1e-30 against a double-precision reference. Cases: Q8_0-like
 * weights (int8 times an fp16 scale: exact as hi + lo) and fp32 weights; x uniform at 1, 3e5, 1e-6,
 * 1e-30 (session 13's run 4 failed this one on the GPU: an exponent clamp flushed x to zero) and 1e-36;
 * weights at 1e-12 with x at 1e-25 (the exponents give up their excess past 126); tokens 2^16 apart in one product
 * (one scale for all tokens: the documented range); and a zero row and zero x. It does not check cuBLAS's
 * summation order (any fp32 order stays inside the tolerance) or the launch code: tests/ops/
 * test_ops_matmul.c does that on a GPU. */
#include <math.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

typedef _Float16 __half;
static inline __half __float2half_rn(float f)
{
	return (__half)f;
}
static inline float __half2float(__half h)
{
	return (float)h;
}
#define __device__
#define __forceinline__ inline

#include "split_f16.inc"

static int n_check, n_fail;

static uint32_t absbits(float v)
{
	uint32_t u;
	memcpy(&u, &v, 4);
	return u & 0x7fffffffu;
}

/* y[t][r] for W (n_out x K) and X (n_tok x K) through the split; returns the number of wrong outputs */
static int run(const char *what, const std::vector<float> &W, const std::vector<float> &X, int n_out, int n_tok,
               int K)
{
	unsigned mx[2] = {0, 0};
	for (float v : W)
		mx[0] = std::max(mx[0], absbits(v));
	for (float v : X)
		mx[1] = std::max(mx[1], absbits(v));
	int ew, ex;
	split_exps(mx, ew, ex);
	std::vector<__half> wh(W.size()), wl(W.size()), xh(X.size()), xl(X.size());
	for (size_t i = 0; i < W.size(); i++)
		split_hl(ldexpf(W[i], ew), wh[i], wl[i]);
	for (size_t i = 0; i < X.size(); i++)
		split_hl(ldexpf(X[i], ex), xh[i], xl[i]);
	const float alpha = ldexpf(1.0f, -(ew + ex));
	int bad = 0;
	double worst = 0;
	for (int t = 0; t < n_tok; t++)
		for (int r = 0; r < n_out; r++) {
			const size_t w0 = (size_t)r * K, x0 = (size_t)t * K;
			float acc = 0.0f; /* K' = 3K in the GEMM's order: hi.hi, hi.lo, lo.hi */
			for (int k = 0; k < K; k++)
				acc += (float)wh[w0 + k] * (float)xh[x0 + k];
			for (int k = 0; k < K; k++)
				acc += (float)wh[w0 + k] * (float)xl[x0 + k];
			for (int k = 0; k < K; k++)
				acc += (float)wl[w0 + k] * (float)xh[x0 + k];
			const float y = acc * alpha;
			double ref = 0, mag = 0;
			for (int k = 0; k < K; k++) {
				const double p = (double)W[w0 + k] * (double)X[x0 + k];
				ref += p;
				mag += fabs(p);
			}
			const double err = fabs((double)y - ref), tol = 2e-6 * sqrt((double)K) * mag + 1e-30;
			if (mag > 0 && err / mag > worst)
				worst = err / mag;
			if (!std::isfinite(y) || !(err <= tol)) {
				if (bad++ < 3)
					printf("  %s: row %d tok %d: split %.9g ref %.9g (|d| %.3g, tol %.3g; e_w %d e_x %d)\n",
					       what, r, t, y, ref, err, tol, ew, ex);
			}
		}
	n_check++;
	if (bad)
		n_fail++;
	printf("%-44s K %5d e_w %4d e_x %4d  max |err|/sum|wx| %.2e  %s\n", what, K, ew, ex, worst,
	       bad ? "FAIL" : "ok");
	return bad;
}

int main()
{
	std::mt19937 rng(1234);
	std::uniform_real_distribution<float> u(-1.0f, 1.0f);
	std::uniform_int_distribution<int> q8(-127, 127);
	const int n_out = 24, n_tok = 6, K = 512;
	auto weights = [&](bool q8_like, float scale) {
		std::vector<float> W((size_t)n_out * K);
		for (int r = 0; r < n_out; r++)
			for (int b = 0; b < K / 32; b++) { /* a Q8_0 block: one fp16 scale, 32 int8 */
				const float d = (float)(__half)(scale * (0.5f + 0.5f * fabsf(u(rng))) / 127.0f);
				for (int k = 0; k < 32; k++)
					W[(size_t)r * K + b * 32 + k] = q8_like ? d * (float)q8(rng) : scale * u(rng);
			}
		return W;
	};
	auto acts = [&](float scale) {
		std::vector<float> X((size_t)n_tok * K);
		for (float &v : X)
			v = scale * u(rng);
		return X;
	};
	static const float xs[] = {1.0f, 3e5f, 1e-6f, 1e-30f, 1e-36f};
	for (int q = 0; q < 2; q++)
		for (float s : xs) {
			char name[64];
			snprintf(name, sizeof(name), "%s weights, x at %g", q ? "f32" : "q8_0", (double)s);
			run(name, weights(q == 0, q ? 0.05f : 0.02f), acts(s), n_out, n_tok, K);
		}
	/* both sides tiny: the exponents would pass 126 and give up the excess (outputs ~1e-35 stay normal
	 * floats, so this one is held to the relative tolerance); at 1e-30 x 1e-30 the products underflow
	 * fp32 itself, as they do in the fp32 GEMV */
	run("f32 weights at 1e-12, x at 1e-25", weights(false, 1e-12f), acts(1e-25f), n_out, n_tok, K);
	run("f32 weights at 1e-30, x at 1e-30", weights(false, 1e-30f), acts(1e-30f), n_out, n_tok, K);
	/* large weights (fp16's range is far below them) */
	run("f32 weights at 1e20, x at 1", weights(false, 1e20f), acts(1.0f), n_out, n_tok, K);
	/* tokens 2^16 apart share one scale */
	{
		std::vector<float> X = acts(1.0f);
		for (int t = 1; t < n_tok; t += 2)
			for (int k = 0; k < K; k++)
				X[(size_t)t * K + k] *= 1.0f / 65536.0f;
		run("q8_0 weights, tokens 2^16 apart", weights(true, 0.02f), X, n_out, n_tok, K);
	}
	/* a zero weight row and a zero token */
	{
		std::vector<float> W = weights(true, 0.02f), X = acts(1.0f);
		for (int k = 0; k < K; k++)
			W[k] = 0.0f, X[(size_t)K + k] = 0.0f;
		run("q8_0 weights, a zero row and a zero token", W, X, n_out, n_tok, K);
	}
	{
		std::vector<float> W = weights(true, 0.02f), X((size_t)n_tok * K, 0.0f);
		run("all of x zero", W, X, n_out, n_tok, K);
	}
	printf("%d checks, %d failed\n", n_check, n_fail);
	return n_fail ? 1 : 0;
}
