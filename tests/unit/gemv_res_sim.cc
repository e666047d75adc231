/* matmul_gemv_res.cu's kernel SOURCE run on the CPU (as topk_fast_sim.cc does for the top-k): every
 * CUDA thread a std::thread, __syncthreads a block-wide std::barrier, __shfl_xor_sync an exchange
 * behind a per-warp barrier, the dynamic shared memory a static buffer, cp.async a 16-byte memcpy
 * deferred until the cp.async.wait_group that covers its commit group.
 * test_gemv_res_sim.sh cuts the kernel's device part (from "#define RES_NW" to the host helpers) and
 * the slab decode of matmul_impl.cuh (g3t, g3_s8f, g3_row, g3_decode; not the cp.async asm) into
 * .inc files and builds this file around them, so CI without a GPU checks the kernel's own
 * indexing: which rows each block copies and where, the slab / lane / warp split of K, the x
 * groups, the butterfly reduction of RB x NT values per warp, the warp-order sum and the guarded
 * stores, against a double-precision reference (|sim - ref| <= 2e-6 sqrt(n_in) sum|w x|, the op
 * tests' tolerance), with guard values around y and in the ldy gaps. Shapes: Q8_0 and F32, n_tok 1
 * and 2, every rows-per-block value 1..16, n_out not a multiple of RB and below one block, n_in with
 * idle warps (one slab), several x groups (Q8_0 group by group, F32 pipelined), strided x and y.
 * It does not check the memory model, PDL or timing: tests/ops/test_ops_gemv_res.c does that. */
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "kernels/kernels.h"
#include "tests/unit/sim_block.h"

#include "g3_slab.inc"

static inline int kcuda_prefetch_enabled(void)
{
	return 1;
}

alignas(16) static uint8_t sim_dyn[48 * 1024];

#include "gemv_res_body.inc"

static int n_check, n_fail;

/* one block after the other, 128 std::threads each */
/* the heads: H matrices mat_bytes apart, x and y of head h at h xhs / h yhs (H = 1: a plain product) */
struct sim_heads {
	int H;
	size_t mat_bytes;
	int64_t xhs, yhs;
};
static sim_heads g_heads = {1, 0, 0, 0};

template <int T, int NT, int RB>
static void sim_run(const uint8_t *w, size_t row_bytes, int n_out, int n_slab, const float *x, int64_t ldx,
                    int n_tok, float *y, int64_t ldy)
{
	const int nb = (n_out + RB - 1) / RB;
	if ((size_t)RB * row_bytes > sizeof(sim_dyn)) {
		printf("FAIL: %d rows of %zu bytes exceed the shared memory\n", RB, row_bytes);
		n_fail++;
		return;
	}
	for (int bh = 0; bh < nb * g_heads.H; bh++) {
		const int b = bh % nb, h = bh / nb;
		memset(sim_dyn, 0xcd, sizeof(sim_dyn)); /* stale bytes from the last block must not count */
		sim_block(RES_NW * 32, (unsigned)b, (unsigned)h, [=]() {
			gemv_res_kernel<T, NT, RB>(w, g_heads.mat_bytes, row_bytes, n_out, n_slab, x, ldx,
			                           g_heads.xhs, n_tok, y, ldy, g_heads.yhs, 1, 1);
		});
	}
}

template <int T, int NT>
static void sim_rb(int rb, const uint8_t *w, size_t row_bytes, int n_out, int n_slab, const float *x,
                   int64_t ldx, int n_tok, float *y, int64_t ldy)
{
	switch (rb) {
	case 1: sim_run<T, NT, 1>(w, row_bytes, n_out, n_slab, x, ldx, n_tok, y, ldy); break;
	case 2: sim_run<T, NT, 2>(w, row_bytes, n_out, n_slab, x, ldx, n_tok, y, ldy); break;
	case 4: sim_run<T, NT, 4>(w, row_bytes, n_out, n_slab, x, ldx, n_tok, y, ldy); break;
	case 8: sim_run<T, NT, 8>(w, row_bytes, n_out, n_slab, x, ldx, n_tok, y, ldy); break;
	default: sim_run<T, NT, 16>(w, row_bytes, n_out, n_slab, x, ldx, n_tok, y, ldy); break;
	}
}

static std::mt19937_64 rng(20261130);

static uint16_t f2h_scale(void) /* a random fp16 scale of magnitude [2^-9, 2^-6), either sign */
{
	const int e = (int)(rng() % 3) - 9 + 15; /* biased exponent */
	const uint16_t m = (uint16_t)(rng() & 1023);
	return (uint16_t)(((rng() & 1) << 15) | (e << 10) | m);
}

/* H = 1: a plain product (x rows ldx apart, y rows ldy apart); H > 1: H matrices with a 32-byte gap
 * between them, x of head h at h xhs (xhs = n_in + 4), y of head h at h yhs (yhs = n_out + 1) */
static void run_case(int type, int n_in, int n_out, int n_tok, int rb, bool strided, int H = 1)
{
	const bool q8 = type == KT_Q8_0;
	const int se = q8 ? 256 : 128, sb = q8 ? 272 : 512;
	const int n_slab = n_in / se;
	const size_t row_bytes = (size_t)n_slab * sb,
	             mat_bytes = row_bytes * (size_t)n_out + (H > 1 ? 32 : 0);
	const int64_t xhs = H > 1 ? n_in + 4 : 0, yhs = H > 1 ? n_out + 1 : 0;
	const int64_t ldx = (H > 1 ? H * xhs : n_in) + (strided ? 4 : 0);
	const int64_t ldy = (H > 1 ? H * yhs : n_out) + (strided ? 3 : 0);
	std::vector<uint8_t> w(mat_bytes * (size_t)H + 16, 0xee);
	std::vector<double> wf((size_t)H * n_in * (size_t)n_out);
	std::uniform_real_distribution<float> u(-1, 1);
	for (int h = 0; h < H; h++)
		for (int r = 0; r < n_out; r++) {
			uint8_t *p = w.data() + (size_t)h * mat_bytes + (size_t)r * row_bytes;
			double *f = wf.data() + ((size_t)h * n_out + r) * n_in;
			if (q8) {
				for (int b = 0; b < n_in / 32; b++) {
					const uint16_t d = f2h_scale();
					memcpy(p + 34 * b, &d, 2);
					for (int i = 0; i < 32; i++) {
						const int8_t q = (int8_t)(rng() & 0xff);
						p[34 * b + 2 + i] = (uint8_t)q;
						f[32 * b + i] = (double)sim_h2f(d) * q;
					}
				}
			} else {
				for (int k = 0; k < n_in; k++) {
					const float v = u(rng);
					memcpy(p + 4 * k, &v, 4);
					f[k] = v;
				}
			}
		}
	std::vector<float> x((size_t)ldx * n_tok + 4), y((size_t)ldy * n_tok + 64);
	for (auto &v : x)
		v = u(rng);
	const float guard = -12345.5f;
	for (auto &v : y)
		v = guard;
	float *yp = y.data() + 32; /* guards before and after */
	/* 16-byte alignment as the kernel needs (the vectors' storage is 16-byte aligned here) */
	if ((uintptr_t)x.data() % 16 || (uintptr_t)w.data() % 16) {
		printf("FAIL: host buffers not 16-byte aligned\n");
		n_fail++;
		return;
	}
	g_heads = {H, mat_bytes, xhs, yhs};
	if (q8)
		n_tok == 1 ? sim_rb<KT_Q8_0, 1>(rb, w.data(), row_bytes, n_out, n_slab, x.data(), ldx, n_tok,
		                                yp, ldy)
		           : sim_rb<KT_Q8_0, 2>(rb, w.data(), row_bytes, n_out, n_slab, x.data(), ldx, n_tok,
		                                yp, ldy);
	else
		n_tok == 1
		    ? sim_rb<KT_F32, 1>(rb, w.data(), row_bytes, n_out, n_slab, x.data(), ldx, n_tok, yp, ldy)
		    : sim_rb<KT_F32, 2>(rb, w.data(), row_bytes, n_out, n_slab, x.data(), ldx, n_tok, yp,
		                        ldy);
	g_heads = {1, 0, 0, 0};
	int bad = 0, bad_guard = 0;
	double worst = 0;
	std::vector<bool> written((size_t)ldy * n_tok, false);
	for (int t = 0; t < n_tok; t++)
		for (int h = 0; h < H; h++)
			for (int r = 0; r < n_out; r++) {
				const double *f = wf.data() + ((size_t)h * n_out + r) * n_in;
				const float *xv = x.data() + (size_t)t * ldx + (size_t)h * xhs;
				double ref = 0, mag = 0;
				for (int k = 0; k < n_in; k++) {
					ref += f[k] * xv[k];
					mag += std::fabs(f[k] * xv[k]);
				}
				const size_t yi = (size_t)t * ldy + (size_t)h * yhs + r;
				written[yi] = true;
				const float g = yp[yi];
				const double err = std::fabs((double)g - ref),
				             tol = 2e-6 * std::sqrt((double)n_in) * mag + 1e-30;
				if (!std::isfinite(g) || !(err <= tol)) {
					if (bad++ < 3)
						printf("  head %d row %d tok %d: sim %.9g ref %.9g\n", h, r,
						       t, g, ref);
				}
				if (mag > 0)
					worst = std::max(worst, err / mag);
			}
	for (size_t i = 0; i < written.size(); i++) /* the gaps: ldy > rows, yhs > n_out */
		bad_guard += !written[i] && yp[i] != guard;
	for (int i = 0; i < 32; i++)
		bad_guard += y[i] != guard;
	for (size_t i = 32 + (size_t)ldy * n_tok; i < y.size(); i++)
		bad_guard += y[i] != guard;
	n_check++;
	const bool ok = !bad && !bad_guard;
	n_fail += !ok;
	printf("%s %-4s n_in %5d n_out %5d n_tok %d rb %2d H %d%s: max |err|/sum|wx| %.2e%s%s\n",
	       ok ? "ok  " : "FAIL", q8 ? "Q8_0" : "F32", n_in, n_out, n_tok, rb, H,
	       strided ? " strided" : "", worst, bad ? " WRONG OUTPUTS" : "",
	       bad_guard ? " GUARD / GAP WRITTEN" : "");
}

int main(int argc, char **argv)
{
	const bool big = argc > 1 && !strcmp(argv[1], "big");
	struct shape {
		int type, n_in, n_out;
	};
	const shape shapes[] = {
	    {KT_Q8_0, 2048, 37}, /* o / q_b's n_in: 2 slabs per warp, one x group */
	    {KT_Q8_0, 1536, 19}, /* DeepSeek-V3 q_b's n_in: warps with 2 and 1 slabs */
	    {KT_Q8_0, 256, 5}, /* one slab: three idle warps */
	    {KT_Q8_0, 6144, 9}, /* 6 slabs per warp: three x groups, loaded group by group */
	    {KT_F32, 128, 7}, /* F32, one slab */
	    {KT_F32, 6144, 6}, /* the router's n_in: 12 slabs per warp, pipelined groups */
	    {KT_F32, 1664, 17}, /* 13 slabs: uneven over the warps */
	};
	for (const shape &s : shapes)
		for (int nt = 1; nt <= 2; nt++)
			for (int rb : {1, 2, 4, 8, 16}) {
				if ((size_t)rb * (size_t)(s.n_in / (s.type == KT_Q8_0 ? 256 : 128)) *
				        (s.type == KT_Q8_0 ? 272 : 512) >
				    RES_MAX_SMEM)
					continue; /* the host never launches it (RES_MAX_SMEM) */
				if (!big && rb != 1 && rb != 16 && s.n_in > 2048 && nt == 2)
					continue;
				run_case(s.type, s.n_in, s.n_out, nt, rb, ((nt + rb) & 1) != 0);
			}
	/* stacked heads (v_b: 8 heads of 512 -> 256; smaller here) */
	for (int nt = 1; nt <= 2; nt++)
		for (int rb : {1, 4, 16}) {
			run_case(KT_Q8_0, 512, 21, nt, rb, nt == 2, 3);
			run_case(KT_F32, 256, 7, nt, rb, nt == 1, 2);
		}
	if (sim_leaks) {
		printf("FAIL: %d threads ended with copies never waited for\n", sim_leaks.load());
		n_fail++;
	}
	printf("%s: %d cases, %d failed\n", n_fail ? "FAIL" : "PASS", n_check, n_fail);
	return n_fail ? 1 : 0;
}
