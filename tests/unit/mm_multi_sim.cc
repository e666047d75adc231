/* matmul_multi.cu's kernel SOURCE run on the CPU (as gemv_res_sim.cc does for gemv_res): every CUDA
 * thread a std::thread, __syncthreads a block-wide std::barrier, __shfl_xor_sync an exchange behind a
 * per-warp barrier, the dynamic shared memory a static buffer, cp.async a 16-byte memcpy deferred until
 * the cp.async.wait_group that covers its commit group (a wait that lets the kernel read a row whose
 * copy has not been waited for reads the stale fill and fails). test_mm_multi_sim.sh cuts the
 * kernel's device part (from "#define MM_NW" to the host helpers) and matmul_impl.cuh's slab decode
 * into .inc files and builds this file around them, so CI without a GPU checks the kernel's indexing:
 * the segment search over blk0, the rows each block copies and where (4 Q8_0 rows a block, 2 F16 /
 * BF16, 1 F32), the K chunks, the slab / lane / warp
 * split, the token passes (NTP 1, 2, 4, 8), the warp-order sums and the guarded stores, against a
 * double-precision reference (|sim - ref| <= 2e-6 sqrt(n_in) sum|w x|, the op tests' tolerance), with
 * guard values around every y and in the ldy gaps. The segment tables are built as mm_run builds them.
 * It does not check the memory model, PDL or timing: tests/ops/test_ops_multi.c does that on a GPU. */
#include <algorithm>
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

static inline void kdep_prefetch_l2(const void *, size_t)
{
}

static inline float kc_warp_sum(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

#include "g3_slab.inc"
#include "mi8_x.inc"

alignas(16) static uint8_t sim_dyn[64 * 1024];

#include "mm_multi_body.inc"

static int n_check, n_fail;

/* the grid of mm_multi_block<NTP, SMALL, false, XQ, Q8RB>(a) (the kernels' body), one block after the other */
template <int NTP, bool SMALL, bool XQ = false, int Q8RB = 4>
static void sim_grid(const mm_multi_args &a, int n_blk, size_t smem)
{
	if (smem > sizeof(sim_dyn)) {
		printf("FAIL: %zu bytes of tile exceed the simulated shared memory\n", smem);
		n_fail++;
		return;
	}
	for (int b = 0; b < n_blk; b++) {
		memset(sim_dyn, 0xcd, sizeof(sim_dyn)); /* the last block's bytes must not count */
		sim_block(MM_NW * 32, (unsigned)b, 0u, [&]() { mm_multi_block<NTP, SMALL, false, XQ, Q8RB>(a); });
	}
}

static std::mt19937_64 rng(20261201);

static uint16_t f2h_scale(void) /* a random fp16 scale of magnitude [2^-9, 2^-6), either sign */
{
	const int e = (int)(rng() % 3) - 9 + 15;
	const uint16_t m = (uint16_t)(rng() & 1023);
	return (uint16_t)(((rng() & 1) << 15) | (e << 10) | m);
}

struct sim_seg {
	int type, n_out;
};

/* x's int8 parts (k45_i8.cuh's formula, written plainly: the kernel's input, not its code) */
static void make_parts(const float *x, int n_in, std::vector<mi8_x> &u)
{
	u.assign((size_t)n_in / 256, mi8_x{});
	for (int b = 0; b < n_in / 32; b++) {
		const float *v = x + 32 * b;
		float m = 0;
		for (int i = 0; i < 32; i++)
			m = std::max(m, std::fabs(v[i]));
		int e = 0;
		(void)std::frexp(m, &e);
		const int k = std::min(1 - e, 100);
		const float P = std::ldexp(1.f, k), mp = m * P;
		const float s = mp / 127.f, inv = mp > 0 ? 127.f / mp : 0.f;
		mi8_x &U = u[(size_t)b / 8];
		const int j = b % 8;
		for (int i = 0; i < 32; i++) {
			const float vp = v[i] * P;
			const float f1 = std::rint(vp * inv), r = std::fma(-f1, s, vp);
			const float f2 = std::rint(r * inv * 254.f), r2 = std::fma(-f2, s / 254.f, r);
			const int q[3] = {(int)f1, (int)f2, (int)std::nearbyint(r2 * inv * 254.f * 254.f)};
			for (int pt = 0; pt < 3; pt++)
				U.q[j][pt][i / 4] |= (uint32_t)(uint8_t)(int8_t)q[pt] << (8 * (i % 4));
		}
		U.s[j] = s, U.p[j] = std::ldexp(1.f, -k);
	}
}

/* one launch over the segments segs (all n_in), n_tok tokens; parts: x's int8 parts for the Q8_0
 * products (one token); q8rb: Q8_0 rows a block (8: one token at n_in <= 2048, mm_q8_rows) */
static void run_case(const std::vector<sim_seg> &segs, int n_in, int n_tok, const char *what,
                     bool parts = false, int q8rb = 4)
{
	std::uniform_real_distribution<float> u(-1, 1);
	const bool small = n_in <= MM_CHUNK(true);
	const int64_t ldx = n_in + (n_tok > 1 ? 4 : 0);
	std::vector<float> x((size_t)ldx * n_tok + 4);
	for (auto &v : x)
		v = u(rng);
	struct host_seg {
		std::vector<uint8_t> w;
		std::vector<double> wf;
		std::vector<float> y;
		int64_t ldy;
	};
	std::vector<host_seg> hs(segs.size());
	mm_multi_args a;
	memset(&a, 0, sizeof(a));
	int64_t n_blk = 0;
	size_t smem = 0;
	const float guard = -12345.5f;
	for (size_t i = 0; i < segs.size(); i++) {
		const int type = segs[i].type, n_out = segs[i].n_out;
		const size_t row_bytes = type == KT_Q8_0  ? (size_t)n_in / 32 * 34
		                         : type == KT_F32 ? (size_t)n_in * 4
		                                          : (size_t)n_in * 2;
		host_seg &h = hs[i];
		h.w.assign(row_bytes * (size_t)n_out + 16, 0xee);
		h.wf.resize((size_t)n_out * n_in);
		for (int r = 0; r < n_out; r++) {
			uint8_t *p = h.w.data() + (size_t)r * row_bytes;
			double *f = h.wf.data() + (size_t)r * n_in;
			for (int k = 0; k < n_in; k++) {
				if (type == KT_Q8_0) {
					if (k % 32 == 0) {
						const uint16_t d = f2h_scale();
						memcpy(p + 34 * (k / 32), &d, 2);
					}
					uint16_t d;
					memcpy(&d, p + 34 * (k / 32), 2);
					const int8_t q = (int8_t)(rng() & 0xff);
					p[34 * (k / 32) + 2 + k % 32] = (uint8_t)q;
					f[k] = (double)sim_h2f(d) * q;
				} else if (type == KT_F32) {
					const float v = u(rng);
					memcpy(p + 4 * k, &v, 4);
					f[k] = v;
				} else { /* F16 / BF16: 16 bits of a float in [-1, 1) */
					const float v = u(rng);
					uint32_t b;
					memcpy(&b, &v, 4);
					uint16_t hv;
					if (type == KT_BF16) {
						hv = (uint16_t)(b >> 16);
						f[k] = __uint_as_float((uint32_t)hv << 16);
					} else {
						const int e = (int)((b >> 23) & 255) - 127 + 15;
						hv = e <= 0 ? (uint16_t)((b >> 16) & 0x8000u)
						            : (uint16_t)(((b >> 16) & 0x8000u) | (uint32_t)e << 10 |
						                         ((b >> 13) & 1023));
						f[k] = sim_h2f(hv);
					}
					memcpy(p + 2 * k, &hv, 2);
				}
			}
		}
		h.ldy = n_out + (i & 1) * 3; /* some with gaps */
		h.y.assign((size_t)h.ldy * n_tok + 64, guard);
		/* as mm_run builds the table */
		const int rb = type == KT_Q8_0 ? q8rb : type == KT_F32 ? 1 : 2;
		const int se = type == KT_Q8_0 ? 256 : type == KT_F32 ? 128 : 256;
		const int sb = type == KT_Q8_0 ? 272 : 512;
		const int64_t cs = MM_CHUNK(small) / se, nsl = n_in / se < cs ? n_in / se : cs;
		smem = std::max(smem, (size_t)rb * (size_t)sb * (size_t)nsl);
		mm_seg_dev *d = &a.seg[a.n_seg++];
		d->w = h.w.data();
		d->y = h.y.data() + 32;
		d->ldy = h.ldy;
		d->row_bytes = row_bytes;
		d->n_out = n_out;
		d->type = type;
		d->blk0 = (int)n_blk;
		n_blk += (n_out + rb - 1) / rb;
	}
	a.x = x.data();
	a.ldx = ldx;
	a.n_tok = n_tok;
	a.n_in = n_in;
	a.pf = 1;
	std::vector<mi8_x> xq;
	if (parts) {
		make_parts(x.data(), n_in, xq);
		a.xq = xq.data();
	}
	const int nb = (int)n_blk;
	if (q8rb == 8 && !(small && n_tok == 1)) {
		printf("FAIL: 8 Q8_0 rows a block exist only at one token with n_in <= 2048\n");
		n_fail++;
		return;
	}
	if (parts && q8rb == 8)
		sim_grid<1, true, true, 8>(a, nb, smem);
	else if (parts)
		small ? sim_grid<1, true, true>(a, nb, smem) : sim_grid<1, false, true>(a, nb, smem);
	else if (q8rb == 8)
		sim_grid<1, true, false, 8>(a, nb, smem);
	else if (n_tok == 1)
		small ? sim_grid<1, true>(a, nb, smem) : sim_grid<1, false>(a, nb, smem);
	else if (n_tok == 2)
		small ? sim_grid<2, true>(a, nb, smem) : sim_grid<2, false>(a, nb, smem);
	else if (n_tok <= 4)
		small ? sim_grid<4, true>(a, nb, smem) : sim_grid<4, false>(a, nb, smem);
	else
		small ? sim_grid<8, true>(a, nb, smem) : sim_grid<8, false>(a, nb, smem);
	int bad = 0, bad_guard = 0;
	double worst = 0;
	for (size_t i = 0; i < segs.size(); i++) {
		const host_seg &h = hs[i];
		const float *yp = h.y.data() + 32;
		std::vector<bool> written((size_t)h.ldy * n_tok, false);
		for (int t = 0; t < n_tok; t++)
			for (int r = 0; r < segs[i].n_out; r++) {
				const double *f = h.wf.data() + (size_t)r * n_in;
				const float *xv = x.data() + (size_t)t * ldx;
				double ref = 0, mag = 0, magm = 0; /* magm: sum |w| m_j (the parts' error) */
				for (int k = 0; k < n_in; k++) {
					ref += f[k] * xv[k];
					mag += std::fabs(f[k] * xv[k]);
					if (parts && segs[i].type == KT_Q8_0) {
						float m = 0;
						for (int q = k / 32 * 32; q < k / 32 * 32 + 32; q++)
							m = std::max(m, std::fabs(xv[q]));
						magm += std::fabs(f[k]) * m;
					}
				}
				const size_t yi = (size_t)t * h.ldy + r;
				written[yi] = true;
				const double err = std::fabs((double)yp[yi] - ref),
				             tol = 2e-6 * std::sqrt((double)n_in) * mag + 1e-7 * magm + 1e-30;
				if (!std::isfinite(yp[yi]) || !(err <= tol)) {
					if (bad++ < 3)
						printf("  segment %zu row %d tok %d: sim %.9g ref %.9g\n", i, r, t,
						       yp[yi], ref);
				}
				if (mag > 0)
					worst = std::max(worst, err / mag);
			}
		for (size_t k = 0; k < written.size(); k++)
			bad_guard += !written[k] && yp[k] != guard;
		for (int k = 0; k < 32; k++)
			bad_guard += h.y[k] != guard;
		for (size_t k = 32 + (size_t)h.ldy * n_tok; k < h.y.size(); k++)
			bad_guard += h.y[k] != guard;
	}
	n_check++;
	const bool ok = !bad && !bad_guard;
	n_fail += !ok;
	printf("%s %-34s n_in %5d n_tok %d%s, Q8_0 %d rows a block (%lld blocks, %zu B tile): max |err|/sum|wx| %.2e%s%s\n",
	       ok ? "ok  " : "FAIL", what, n_in, n_tok, parts ? " x parts" : "", q8rb, (long long)n_blk, smem,
	       worst,
	       bad ? " WRONG OUTPUTS" : "", bad_guard ? " GUARD / GAP WRITTEN" : "");
}

int main(void)
{
	/* the GLM-5 groups, shortened: {q_a, kv_a, idx_k (Q8_0), idx_proj (F32)}; mixes of every type */
	const std::vector<sim_seg> glm = {{KT_Q8_0, 19}, {KT_Q8_0, 9}, {KT_Q8_0, 5}, {KT_F32, 3}};
	const std::vector<sim_seg> all = {{KT_Q8_0, 33}, {KT_F16, 7}, {KT_BF16, 5}, {KT_F32, 2}};
	const std::vector<sim_seg> one = {{KT_Q8_0, 67}};
	struct c {
		const std::vector<sim_seg> *s;
		int n_in;
		const char *what;
	};
	const c cases[] = {
	    {&glm, 6144, "q_a group (n_in 6144, one chunk)"},
	    {&all, 2048, "every type (n_in 2048, small chunk)"},
	    {&one, 256, "one Q8_0 slab (idle warps)"},
	    {&one, 7168, "DS-V3 n_in 7168 (one chunk)"},
	    {&all, 9216, "every type, two chunks (n_in 9216)"},
	};
	for (const c &k : cases) {
		run_case(*k.s, k.n_in, 1, k.what);
		if (k.n_in % 256 == 0) /* one token with the norm's int8 parts (Q8_0 segments) */
			run_case(*k.s, k.n_in, 1, k.what, true);
		if (k.n_in <= 2048) { /* one token, 8 Q8_0 rows a block (the default there) */
			run_case(*k.s, k.n_in, 1, k.what, false, 8);
			if (k.n_in % 256 == 0)
				run_case(*k.s, k.n_in, 1, k.what, true, 8);
		}
		for (int nt : {2, 3, 8})
			if (k.n_in <= 2048 || nt == 2)
				run_case(*k.s, k.n_in, nt, k.what);
	}
	if (sim_leaks)
		printf("FAIL: %d threads ended with cp.async copies never waited for\n", sim_leaks.load());
	printf("%d cases, %d failed\n", n_check, n_fail + (sim_leaks ? 1 : 0));
	return n_fail || sim_leaks ? 1 : 0;
}
