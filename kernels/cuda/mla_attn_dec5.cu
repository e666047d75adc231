/* MLA decode for up to 8 heads per rank (GLM-5 at TP=8) over a bf16 paged pool: one launch whose
 * per-tile work is a chain of a warp's own, without block barriers (issue #4, branch mla5).
 * MEASURED SLOWER (H200, 22:13: ~2x mla_dec and the split kernel at every shape), so it is OFF by
 * default and taken only with TANDEM_MLA_DEC_V=5 (kcuda_mla_attn then tries it first, before
 * mla_attn_dec.cu's kernel and the split kernel). With TANDEM_MLA_DEC=N as well it also takes more
 * heads, in groups of 8 (a block per group).
 *
 * Why: the kernels before it spent each 16- or 32-key tile in a chain of dependent steps: warp 0's
 * top-k and table loads for the next tile, a barrier, the copy (one tile in flight per block), then
 * barriers after the copy, the partial scores, the softmax and the PV product (H200, 19:30 run:
 * ~6 us per tile iteration at batch 8). Here each WARP is a flash-decoding split of its own:
 *  - the warp resolves the pool rows of all its keys once at the start (its top-k slice, then the
 *    block-table entries, each one batch of loads), and keeps the addresses in shared memory;
 *  - its tiles of 16 keys stream through its own 2-stage cp.async ring (both in flight at once;
 *    a warp with one or two tiles has all its bytes in flight from the start);
 *  - S = Q K^T with A = [q hi; q lo] (rows 0-7: the bf16 hi parts of the 8 heads, rows 8-15: the
 *    remainders, prepared once per block in shared memory): one m16n8k16 per (dim step, 8 keys)
 *    carries both halves of the fp32-accurate product, summed in the thread that holds them;
 *  - the softmax is done in the registers of that warp (the 4 threads of a head row, 2 shuffles);
 *  - O^T = V^T P^T (M = 16 channels, N = 8 heads, K = 16 keys): the score accumulators ARE the B
 *    fragments of P^T (split into bf16 hi + lo), V^T comes by ldmatrix.trans, the warp holds all
 *    C = 512 channels of its 8 heads (128 accumulators a thread).
 *  So a tile costs the warp's math plus nothing else; the only block barriers are at the start (q)
 *  and in the merge. The splits (warps) are merged without a second launch as mla_attn_dec.cu
 *  does: the blocks of a cluster (up to 8) through distributed shared memory, each block taking
 *  C / cluster channels of every warp partial of the cluster; clusters by the block that draws the
 *  last ticket, in cluster order (bits independent of arrival order). Invalid keys (bad position or
 *  block id) get score -inf and a zeroed row and are counted in the context's error counter. */
#include <cooperative_groups.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/mla_attn_merge.cuh"
#include "kernels/cuda/mla_attn_mode.cuh"
#include "kernels/cuda/mla_attn_tile.cuh"

namespace cg = cooperative_groups;

#define M5_TK 16 /* keys per tile */
#define M5_QV 18 /* q float4 loads in flight a thread (2-warp blocks: all of 8 heads x 576) */
#define M5_ST 2 /* ring stages per warp */
#define M5_HMAX 8 /* heads per block: the rows 0-7 (hi) and 8-15 (lo) of the m16 tile */
#define M5_DMAX 576
#define M5_CMAX 512
#define M5_MT (M5_CMAX / 16) /* PV m-tiles of 16 channels: 32 */
#define M5_KS (M5_DMAX / 16) /* QK^T dim steps: 36 */
#define M5_WMAX 4 /* warps per block */
#define M5_TPW_MAX 16 /* tiles per warp (addresses in shared memory: 2 KB a warp) */
#define M5_CL 8 /* largest cluster */
#define M5_NCL_MAX 64 /* clusters per row */
#define M5_MB 16 /* partials merged a batch (loads in flight a thread) */

struct m5_args {
	const uint8_t *base;
	int64_t n_blocks;
	size_t block_bytes, offset;
	int bt, dim;
	const int32_t *qseq, *blocks, *n_keys, *sel;
	int64_t ld_blocks, pos0, ld_sel, max_keys;
	const float *q;
	int H, C, n_hg; /* heads, channels, groups of 8 heads (blockIdx.y = row * n_hg + group) */
	float scale;
	int tpw; /* tiles per warp; a block's chunk is nw * tpw * 16 keys */
	int ncl; /* clusters per row; gridDim.x = ncl * cluster size */
	int bulk; /* rows copied by cp.async.bulk (one request a row, mbarrier completion) */
	float *out;
	float *pacc; /* ncl > 1: [row * H + h][ncl][C] cluster partials */
	float *pml; /* [row * H + h][ncl][cl][2] their (max, sum), one copy per slice */
	unsigned *tickets; /* [gridDim.y][cl], zero between calls */
	unsigned *err;
};

/* shared row stride of KV and q rows (bf16 values): dim + 8, a 16-byte multiple whose word stride
 * is 4 mod 32 (dim a multiple of 16... of 8 words): conflict-free ldmatrix rows */
static __host__ __device__ int m5_rs(int dim)
{
	return dim + 8;
}
static __device__ __forceinline__ int m5_os(int C) /* warp partial rows (floats): 4 mod 16, 16-byte rows */
{
	return C + 4;
}

/* address slots per warp: its tiles' keys, rounded up to whole warps of lanes */
static __host__ __device__ int m5_apw(int tpw)
{
	return (tpw * M5_TK + 31) / 32 * 32;
}

/* the dynamic shared memory carve (byte offsets, 16-aligned) */
struct m5_carve {
	size_t ring, wring, qs, addr, valid, ml, mbar, total;
};
static __host__ __device__ size_t m5_take(size_t *at, size_t bytes)
{
	const size_t r = *at;
	*at += (bytes + 15) & ~(size_t)15;
	return r;
}
static __host__ __device__ m5_carve m5_layout(int dim, int nw, int tpw)
{
	m5_carve o;
	size_t at = 0;
	o.wring = ((size_t)M5_ST * M5_TK * m5_rs(dim) * 2 + 15) & ~(size_t)15; /* one warp's ring */
	o.ring = m5_take(&at, (size_t)nw * o.wring);
	o.qs = m5_take(&at, (size_t)16 * m5_rs(dim) * 2);
	o.addr = m5_take(&at, (size_t)nw * m5_apw(tpw) * sizeof(void *));
	o.valid = m5_take(&at, (size_t)nw * tpw * 4);
	o.ml = m5_take(&at, (size_t)nw * M5_HMAX * 2 * 4);
	o.mbar = m5_take(&at, (size_t)nw * M5_ST * 8); /* bulk copies: one mbarrier a (warp, stage) */
	o.total = at;
	return o;
}

__global__ void __launch_bounds__(32 * M5_WMAX) mla_dec5_kernel(m5_args a)
{
	KDEP_ENTRY();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	a.q = kdep_after(a.q); /* written by the kernels before: no load of them above the wait */
	a.sel = kdep_after(a.sel);
	a.n_keys = kdep_after(a.n_keys);
	a.qseq = kdep_after(a.qseq); /* uploaded before the step, but cheap to keep below it too */
	a.blocks = kdep_after(a.blocks);
	cg::cluster_group cluster = cg::this_cluster();
	extern __shared__ __align__(16) uint8_t m5_sm[];
	const int dim = a.dim, RS = m5_rs(dim), C = a.C, H = a.H;
	const int nw = (int)(blockDim.x >> 5), nt = (int)blockDim.x;
	const m5_carve L = m5_layout(dim, nw, a.tpw);
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int g = lane >> 2, t = lane & 3; /* mma fragment coordinates */
	uint16_t *ring = (uint16_t *)(m5_sm + L.ring + (size_t)warp * L.wring); /* this warp's [ST][TK][RS] */
	uint16_t *q_s = (uint16_t *)(m5_sm + L.qs); /* [16][RS]: hi rows 0-7, lo rows 8-15 */
	const uint8_t **addr_w = (const uint8_t **)(m5_sm + L.addr) + (size_t)warp * m5_apw(a.tpw);
	uint32_t *valid_w = (uint32_t *)(m5_sm + L.valid) + (size_t)warp * a.tpw;
	float *ml_s = (float *)(m5_sm + L.ml); /* [nw][8][2]: read by the cluster's other blocks */
	__shared__ int last_s;

	const int cl = (int)cluster.num_blocks(), crank = (int)cluster.block_rank();
	const int icl = (int)blockIdx.x / cl;
	const int64_t row = blockIdx.y / a.n_hg;
	const int h0 = (int)(blockIdx.y % a.n_hg) * M5_HMAX, hv = min(M5_HMAX, H - h0);
	int nk, kw1, ntw; /* keys of the row, the end of this warp's keys, its tiles */

	/* ---- q: its loads first (registers, M5_QV float4 a thread a batch), converted below ---- */
	const float *qr = a.q + (row * H + h0) * (int64_t)dim;
	const int n4 = hv * dim / 4;
	float4 qv[M5_QV];
	auto q_load = [&](int b) {
#pragma unroll
		for (int u = 0; u < M5_QV; u++) {
			const int i = (b * M5_QV + u) * nt + tid;
			qv[u] = i < n4 ? *(const float4 *)(qr + 4 * i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		}
	};
	/* -> bf16 hi (rows 0-7) and lo (rows 8-15) of q_s */
	auto q_store = [&](int b) {
#pragma unroll
		for (int u = 0; u < M5_QV; u++) {
			const int i = (b * M5_QV + u) * nt + tid;
			if (i < n4) {
				const int h = 4 * i / dim, d = 4 * i - h * dim;
				uint2 hi, lo;
				katt_split2(qv[u].x, qv[u].y, &hi.x, &lo.x);
				katt_split2(qv[u].z, qv[u].w, &hi.y, &lo.y);
				*(uint2 *)(q_s + h * RS + d) = hi;
				*(uint2 *)(q_s + (h + 8) * RS + d) = lo;
			}
		}
	};
	q_load(0);

	/* ---- this warp's keys [kw0, kw1): the key count, the table index and the positions (up to
	 * the host bound, before the count is known) in one batch, then the table entries ---- */
	const int kw0 = ((int)blockIdx.x * nw + warp) * a.tpw * M5_TK;
	const int kcap = (int)(a.sel && a.ld_sel < a.max_keys ? a.ld_sel : a.max_keys);
	const int kwe = min(kcap, kw0 + a.tpw * M5_TK); /* the positions that may be read */
	int64_t nk64 = a.n_keys ? (int64_t)a.n_keys[row] : a.pos0 + row + 1;
	const int32_t tbl = a.qseq ? a.qseq[row] : 0;
	{
		constexpr int NI = M5_TPW_MAX * M5_TK / 32;
		int64_t pos[NI];
#pragma unroll
		for (int i = 0; i < NI; i++) {
			const int j = kw0 + lane + 32 * i;
			pos[i] = -1;
			if (j < kwe)
				pos[i] = a.sel ? (int64_t)a.sel[row * a.ld_sel + j] : (int64_t)j;
		}
		/* q's first batch arrived with the positions' loads in flight; more batches (1-warp
		 * blocks) follow; heads >= H: zero rows */
		q_store(0);
		for (int b = 1; b * M5_QV * nt < n4; b++) {
			q_load(b);
			q_store(b);
		}
		for (int i = hv * (dim / 8) + tid; i < M5_HMAX * (dim / 8); i += nt) {
			const int h = i / (dim / 8), d = 8 * (i - h * (dim / 8));
			*(uint4 *)(q_s + h * RS + d) = make_uint4(0, 0, 0, 0);
			*(uint4 *)(q_s + (h + 8) * RS + d) = make_uint4(0, 0, 0, 0);
		}
		if (nk64 < 0 || nk64 > a.max_keys) {
			if (tid == 0 && blockIdx.x == 0 && h0 == 0) /* once a row */
				atomicAdd(a.err, 1u);
			nk64 = nk64 < 0 ? 0 : a.max_keys;
		}
		nk = (int)nk64;
		kw1 = min(nk, kw0 + a.tpw * M5_TK);
		ntw = kw1 > kw0 ? (kw1 - kw0 + M5_TK - 1) / M5_TK : 0;
		const int64_t lim = a.ld_blocks * a.bt;
		int64_t blk[NI];
#pragma unroll
		for (int i = 0; i < NI; i++) {
			blk[i] = -1;
			if (kw0 + lane + 32 * i < kw1 && pos[i] >= 0 && pos[i] < lim)
				blk[i] = a.blocks[(int64_t)tbl * a.ld_blocks + pos[i] / a.bt];
		}
#pragma unroll
		for (int i = 0; i < NI; i++) {
			if (32 * i >= ntw * M5_TK)
				break;
			const int j = kw0 + lane + 32 * i;
			const uint8_t *p = NULL;
			if (j < kw1) {
				if (pos[i] >= 0 && pos[i] < lim && blk[i] >= 0 && blk[i] < a.n_blocks)
					p = a.base + (size_t)blk[i] * a.block_bytes + a.offset +
					    (size_t)(pos[i] % a.bt) * (size_t)dim * 2;
				else
					atomicAdd(a.err, 1u);
			}
			addr_w[lane + 32 * i] = p;
			const unsigned b = __ballot_sync(0xffffffffu, p != NULL);
			if (lane == 0) {
				valid_w[2 * i] = b & 0xffffu;
				if (2 * i + 1 < a.tpw)
					valid_w[2 * i + 1] = b >> 16;
			}
		}
	}
	__syncwarp();

	/* tile n of this warp into stage st: 16 rows, 16-byte pieces, invalid rows zeroed */
	const int nchunk = dim / 8;
	/* TANDEM_MLA_DEC5_BULK=1: a row is one cp.async.bulk (lanes 0-15 one row each) completing on
	 * the stage's mbarrier (phase k of stage st = its k-th tile) instead of 72 16-byte cp.async */
	const unsigned mbar0 =
	    (unsigned)__cvta_generic_to_shared(m5_sm + L.mbar) + (unsigned)(warp * M5_ST * 8);
	if (a.bulk) {
		if (lane == 0)
			for (int st = 0; st < M5_ST; st++)
				asm volatile(
				    "mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(mbar0 + 8 * st), "r"(1)
				    : "memory");
		asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
		__syncwarp();
	}
	auto issue = [&](int n, int st) {
		if (a.bulk) {
			if (n < ntw) {
				uint16_t *dst = ring + (size_t)st * M5_TK * RS;
				const uint8_t *p = lane < M5_TK ? addr_w[n * M5_TK + lane] : NULL;
				const unsigned vb = __ballot_sync(0xffffffffu, p != NULL);
				for (int r = 0; r < M5_TK; r++)
					if (!((vb >> r) & 1u))
						for (int c = lane; c < nchunk; c += 32)
							*(uint4 *)(dst + r * RS + 8 * c) =
							    make_uint4(0, 0, 0, 0);
				asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
				__syncwarp();
				if (lane == 0)
					asm volatile(
					    "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
					        mbar0 + 8 * st),
					    "r"((unsigned)(__popc(vb) * dim * 2))
					    : "memory");
				__syncwarp();
				if (p)
					asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::"
					             "complete_tx::bytes "
					             "[%0], [%1], %2, [%3];\n" ::"r"(
					                 (unsigned)__cvta_generic_to_shared(dst + lane * RS)),
					             "l"(p), "r"(dim * 2), "r"(mbar0 + 8 * st)
					             : "memory");
			}
			return;
		}
		if (n < ntw) {
			uint16_t *dst = ring + (size_t)st * M5_TK * RS;
#pragma unroll 4
			for (int r = 0; r < M5_TK; r++) {
				const uint8_t *p = addr_w[n * M5_TK + r];
				for (int c = lane; c < nchunk; c += 32) {
					if (p)
						katt_cp16(dst + r * RS + 8 * c, p + 16 * c);
					else
						*(uint4 *)(dst + r * RS + 8 * c) = make_uint4(0, 0, 0, 0);
				}
			}
		}
		katt_cp_commit(); /* always: the group count stays uniform */
	};
#pragma unroll
	for (int s = 0; s < M5_ST; s++)
		issue(s, s);

	__syncthreads(); /* q_s complete (the warps' copies are in flight meanwhile) */

	/* ---- the warp's tiles ---- */
	const int nks = dim / 16, nmt = C / 16;
	float oacc[M5_MT][4]; /* O^T: channels 16 m + g (+ 8), heads 2t, 2t + 1 */
#pragma unroll
	for (int m = 0; m < M5_MT; m++)
		oacc[m][0] = oacc[m][1] = oacc[m][2] = oacc[m][3] = 0.0f;
	float m_run = -INFINITY, l_run = 0.0f; /* head g's, kept by its 4 threads */
	/* ldmatrix row of this lane: matrices (rows 0-7 | 8-15) x (cols +0 | +8) */
	const int lrow = ((lane >> 4) << 3) + (lane & 7), lcol = ((lane >> 3) & 1) << 3;
	const int qrow = ((lane >> 3) & 1) * 8 + (lane & 7), qcol = (lane >> 4) << 3;
	for (int n = 0; n < ntw; n++) {
		const int st = n % M5_ST;
		if (a.bulk) {
			unsigned ok = 0, spins = 0;
			while (!ok) {
				if (++spins > (1u << 22)) /* a lost completion: fail the launch, not hang */
					__trap();
				asm volatile("{\n.reg .pred P1;\nmbarrier.try_wait.parity.shared::cta.b64 "
				             "P1, [%1], %2;\n"
				             "selp.b32 %0, 1, 0, P1;\n}\n"
				             : "=r"(ok)
				             : "r"(mbar0 + 8 * st), "r"((unsigned)((n / M5_ST) & 1))
				             : "memory");
			}
		} else {
			katt_cp_wait<M5_ST - 1>();
		}
		__syncwarp(); /* every lane's pieces (and zeroed rows) of tile n are visible */
		const uint16_t *kt = ring + (size_t)st * M5_TK * RS;

		/* S = [q hi; q lo] K^T: 2 n-tiles of 8 keys, 4 accumulator sets (dim step mod 4: chains
		 * of 9 mma instead of 36) */
		float sa[4][2][4];
#pragma unroll
		for (int u = 0; u < 4; u++)
#pragma unroll
			for (int j = 0; j < 2; j++)
				sa[u][j][0] = sa[u][j][1] = sa[u][j][2] = sa[u][j][3] = 0.0f;
#pragma unroll
		for (int ks = 0; ks < M5_KS; ks++) {
			if (ks < nks) {
				uint32_t qa[4], b[4];
				katt_ldm4(qa, q_s + qrow * RS + ks * 16 + qcol);
				katt_ldm4(b, kt + lrow * RS + ks * 16 + lcol);
				katt_mma(sa[ks & 3][0], qa, b[0], b[1]);
				katt_mma(sa[ks & 3][1], qa, b[2], b[3]);
			}
		}
		/* head g, keys 2t, 2t + 1 (n-tile 0) and 8 + 2t, 9 + 2t (n-tile 1): hi row + lo row */
		const uint32_t vm = valid_w[n];
		float s[4];
#pragma unroll
		for (int j = 0; j < 2; j++)
#pragma unroll
			for (int e = 0; e < 2; e++) {
				const float d =
				    ((sa[0][j][e] + sa[0][j][2 + e]) + (sa[1][j][e] + sa[1][j][2 + e])) +
				    ((sa[2][j][e] + sa[2][j][2 + e]) + (sa[3][j][e] + sa[3][j][2 + e]));
				const int key = 8 * j + 2 * t + e;
				s[2 * j + e] = (vm >> key) & 1u ? d * a.scale : -INFINITY;
			}
		float mt = fmaxf(fmaxf(s[0], s[1]), fmaxf(s[2], s[3]));
		mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
		mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
		const float mn = fmaxf(m_run, mt);
		const float corr = mn == -INFINITY ? 1.0f : expf(m_run - mn);
		float p[4], ps = 0.0f;
#pragma unroll
		for (int u = 0; u < 4; u++) {
			p[u] = mn == -INFINITY ? 0.0f : expf(s[u] - mn);
			ps += p[u];
		}
		ps += __shfl_xor_sync(0xffffffffu, ps, 1);
		ps += __shfl_xor_sync(0xffffffffu, ps, 2);
		l_run = l_run * corr + ps;
		m_run = mn;
		/* B of O^T += V^T P^T: b0 = p[g][2t, 2t + 1], b1 = p[g][2t + 8, 2t + 9], hi and lo */
		uint32_t bh0, bl0, bh1, bl1;
		katt_split2(p[0], p[1], &bh0, &bl0);
		katt_split2(p[2], p[3], &bh1, &bl1);
		/* the accumulators' heads are 2t, 2t + 1: their factors from the threads of those rows */
		const float ca = __shfl_sync(0xffffffffu, corr, 8 * t),
		            cb = __shfl_sync(0xffffffffu, corr, 8 * t + 4);
#pragma unroll
		for (int m = 0; m < M5_MT; m++) {
			if (m < nmt) {
				uint32_t av[4];
				katt_ldm4t(av, kt + lrow * RS + m * 16 + lcol);
				oacc[m][0] *= ca;
				oacc[m][1] *= cb;
				oacc[m][2] *= ca;
				oacc[m][3] *= cb;
				katt_mma(oacc[m], av, bh0, bh1);
				katt_mma(oacc[m], av, bl0, bl1);
			}
		}
		__syncwarp(); /* every lane is done with stage st before it is refilled */
		issue(n + M5_ST, st);
	}
	katt_cp_wait<0>();
	__syncwarp();

	/* ---- this warp's (max, sum, acc) into its own ring area (no other warp uses it) ---- */
	const int OS = m5_os(C);
	float *o_w = (float *)ring; /* [8][OS] */
	if (t == 0) {
		ml_s[(warp * M5_HMAX + g) * 2] = m_run;
		ml_s[(warp * M5_HMAX + g) * 2 + 1] = l_run;
	}
#pragma unroll
	for (int m = 0; m < M5_MT; m++) {
		if (m < nmt) {
			const int c0 = 16 * m + g;
			o_w[(2 * t) * OS + c0] = oacc[m][0];
			o_w[(2 * t + 1) * OS + c0] = oacc[m][1];
			o_w[(2 * t) * OS + c0 + 8] = oacc[m][2];
			o_w[(2 * t + 1) * OS + c0 + 8] = oacc[m][3];
		}
	}
	cluster.sync(); /* every warp partial of the cluster is in place */

	/* ---- merge the cluster's warp partials for this block's channel slice: each thread loads the
	 * (max, sum) and values of all partials of its 4 channels at once (16 a batch, merged with a
	 * running max), so one DSMEM round trip and no barrier ---- */
	const int np = cl * nw; /* partials: block b's warp w is b * nw + w */
	const int slice = C / cl, c_lo = crank * slice, nu = hv * (slice / 4);
	const int64_t rh0 = row * H + h0; /* this group's first (row, head) */
	const uint8_t *ring0 = m5_sm + L.ring;
	for (int u = tid; u < nu; u += nt) {
		const int h = u / (slice / 4), c = c_lo + (u % (slice / 4)) * 4;
		float M = -INFINITY, Ls = 0.0f;
		float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		for (int p0 = 0; p0 < np; p0 += M5_MB) {
			float2 ml[M5_MB];
			float4 v[M5_MB];
#pragma unroll
			for (int e = 0; e < M5_MB; e++) {
				const int pi = p0 + e;
				ml[e] = make_float2(-INFINITY, 0.0f);
				v[e] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
				if (pi < np) {
					const unsigned rk = (unsigned)(pi / nw);
					const int pw = pi - (int)rk * nw;
					const float *pm = cluster.map_shared_rank(ml_s, rk);
					const uint8_t *rb =
					    (const uint8_t *)cluster.map_shared_rank((void *)ring0, rk);
					ml[e] = *(const float2 *)(pm + (pw * M5_HMAX + h) * 2);
					v[e] = *(const float4 *)((const float *)(rb + (size_t)pw * L.wring) +
					                         h * OS + c);
				}
			}
			kmla_merge_batch<M5_MB>(&M, &Ls, &acc, ml, v);
		}
		if (a.ncl == 1) {
			const float inv = Ls > 0.0f ? 1.0f / Ls : 0.0f;
			*(float4 *)(a.out + (rh0 + h) * C + c) =
			    make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
		} else {
			*(float4 *)(a.pacc + ((rh0 + h) * a.ncl + icl) * C + c) = acc;
			if (c == c_lo) {
				float *d = a.pml + (((rh0 + h) * a.ncl + icl) * cl + crank) * 2;
				d[0] = M;
				d[1] = Ls;
			}
		}
	}
	/* the ticket (ncl > 1) is drawn between arriving at the cluster barrier (the other blocks
	 * may be reading this block's shared memory until it completes) and waiting on it */
	if (a.ncl > 1) {
		__threadfence(); /* this thread's partial slice is visible before the block's ticket */
		__syncthreads();
	}
	asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
	if (a.ncl > 1 && tid == 0) {
		unsigned *tk = a.tickets + (size_t)blockIdx.y * cl + crank;
		const unsigned old = atomicAdd(tk, 1u);
		last_s = old == (unsigned)(a.ncl - 1);
		if (last_s)
			*tk = 0u; /* every block of this slice has drawn: ready for the next call */
	}
	asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
	if (a.ncl == 1)
		return;
	__syncthreads(); /* last_s */
	if (!last_s)
		return;

	/* ---- last of the ncl blocks of this slice: merge the clusters in cluster order, each
	 * thread its 4 channels with all their loads in flight ---- */
	__threadfence();
	for (int u = tid; u < nu; u += nt) {
		const int h = u / (slice / 4), c = c_lo + (u % (slice / 4)) * 4;
		const float *pm = a.pml + ((rh0 + h) * a.ncl * cl + crank) * 2;
		const float4 *src = (const float4 *)(a.pacc + (rh0 + h) * a.ncl * C + c);
		float M = -INFINITY, Ls = 0.0f;
		float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		for (int k0 = 0; k0 < a.ncl; k0 += M5_MB) {
			float2 ml[M5_MB];
			float4 v[M5_MB];
#pragma unroll
			for (int e = 0; e < M5_MB; e++) {
				ml[e] = make_float2(-INFINITY, 0.0f);
				v[e] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
				if (k0 + e < a.ncl) {
					ml[e] = __ldcg((const float2 *)(pm + (size_t)(k0 + e) * cl * 2));
					v[e] = __ldcg(src + (size_t)(k0 + e) * (C / 4));
				}
			}
			kmla_merge_batch<M5_MB>(&M, &Ls, &acc, ml, v);
		}
		const float inv = Ls > 0.0f ? 1.0f / Ls : 0.0f;
		*(float4 *)(a.out + (rh0 + h) * C + c) =
		    make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
	}
#else
	__trap(); /* not launched below sm_90 (kmla_dec5_launch checks the device) */
#endif
}

/* Off unless TANDEM_MLA_DEC_V=5: the H200 run of 22:13 measured this kernel ~2x slower than
 * mla_dec and the split kernel at every shape (B1 top-2048 24.4 us vs 12.9 / 13.2 in a graph of 78
 * calls; each further tile a warp ~6-7 us), so the defaults stay as they were. With
 * TANDEM_MLA_DEC_V=5: TANDEM_MLA_DEC unset -> up to M5_ROWS_DEFAULT query rows; "0" -> never (the
 * split kernel); N -> up to N rows. Read on every call (a getenv; at capture only under graphs),
 * so tests can flip them. */
#define M5_ROWS_DEFAULT 8

/* launches of this kernel (test_ops_mla checks which kernel took a call) */
extern "C" {
unsigned long long kmla_dec5_launches = 0;
}
static int m5_rows_limit(void)
{
	const char *v = getenv("TANDEM_MLA_DEC_V");
	if (!v || strcmp(v, "5") != 0)
		return 0;
	const char *e = getenv("TANDEM_MLA_DEC");
	if (!e || !*e)
		return M5_ROWS_DEFAULT;
	char *end = NULL;
	const long n = strtol(e, &end, 10);
	if (*end || n < 0)
		return M5_ROWS_DEFAULT;
	return n > 65535 ? 65535 : (int)n;
}

/* TANDEM_MLA_DEC set to a row limit (A/B, tests): then also more than 8 heads */
static bool m5_forced(void)
{
	const char *e = getenv("TANDEM_MLA_DEC");
	return e && *e && strcmp(e, "0") != 0;
}

/* warps per block: TANDEM_MLA_DEC5_W = 1, 2 or 4 (bench sweeps), else 2 while every tile of the
 * call fits one tile per warp of 2-warp blocks on all SMs (more SMs pulling at once), 4 beyond */
static int m5_warps(int64_t tiles_all, int n_sm)
{
	const char *e = getenv("TANDEM_MLA_DEC5_W");
	if (e && (strcmp(e, "1") == 0 || strcmp(e, "2") == 0 || strcmp(e, "4") == 0))
		return atoi(e);
	return tiles_all <= 2 * (int64_t)n_sm ? 2 : 4;
}

/* Can the device run 8-block clusters of this kernel with nw warps at its largest shared-memory
 * size, and how many at once (*maxc)? Asked once per device and nw (an occupancy query, no
 * launch). */
static int m5_ok_state[64][3]; /* [device][nw 1, 2, 4]: 0 unknown, 1 usable, 2 not */
static int m5_maxc[64][3]; /* 8-block clusters resident at once */
static bool m5_cluster_ok(struct kcuda_ctx *c, int nw, int *maxc)
{
	const int dev = c->device >= 0 && c->device < 64 ? c->device : 0, k = nw == 4 ? 2 : nw - 1;
	*maxc = m5_maxc[dev][k];
	if (m5_ok_state[dev][k])
		return m5_ok_state[dev][k] == 1;
	const size_t smem = m5_layout(M5_DMAX, nw, M5_TPW_MAX).total;
	int n = 0;
	if (cudaFuncSetAttribute(mla_dec5_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
	        cudaSuccess ||
	    cudaFuncSetAttribute(mla_dec5_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
	                         (int)cudaSharedmemCarveoutMaxShared) != cudaSuccess ||
	    kmla_max_clusters((const void *)mla_dec5_kernel, M5_CL, 32 * nw, smem, c->stream, &n) !=
	        cudaSuccess ||
	    n < 1) {
		(void)cudaGetLastError();
		fprintf(stderr, "kcuda: mla_dec5: no %d-block clusters of %d warps on device %d (%d)\n",
		        M5_CL, nw, c->device, n);
		m5_ok_state[dev][k] = 2;
		return false;
	}
	m5_ok_state[dev][k] = 1;
	m5_maxc[dev][k] = *maxc = n;
	return true;
}

/* the launch plan of a call: warps per block, tiles per warp, cluster size, clusters per row */
struct m5_plan {
	int nw, tpw, cl, ncl;
	size_t smem;
};

static int m5_plan_of(struct kcuda_ctx *c, const struct kcuda_kv_view *kv, const struct kcuda_attn_rows *rows,
                      int64_t H, int64_t C, struct m5_plan *pl)
{
	const int64_t nrh = rows->n_q * ((H + M5_HMAX - 1) / M5_HMAX); /* (row, head group) pairs */
	const int64_t tiles = (rows->max_keys + M5_TK - 1) / M5_TK;
	const int n_sm = c->n_sm > 0 ? c->n_sm : 1;
	int64_t bpr = n_sm / nrh; /* blocks per row: one block per SM in all */
	if (bpr < 1)
		bpr = 1;
	const int64_t tpb = (tiles + bpr - 1) / bpr;
	/* more warps a block where the chosen number would need more than M5_TPW_MAX tiles a warp */
	int nw = m5_warps(tiles * nrh, n_sm);
	while (nw < M5_WMAX && (tpb + nw - 1) / nw > M5_TPW_MAX)
		nw *= 2;
	int maxc = 0;
	if (!m5_cluster_ok(c, nw, &maxc))
		return ERR_UNSUPPORTED;
	/* tiles a warp: what one block per SM gives, at least TANDEM_MLA_DEC5_TPW (tuning), more
	 * while the blocks would not all be resident at once (a second wave costs a whole pass) */
	int64_t tpw = (tpb + nw - 1) / nw;
	const char *te = getenv("TANDEM_MLA_DEC5_TPW");
	if (te && atoi(te) > tpw)
		tpw = atoi(te);
	if (tpw < 1 || tpw > M5_TPW_MAX)
		return ERR_UNSUPPORTED;
	int64_t nb, ncl;
	int cl;
	for (;;) {
		nb = (tiles + nw * tpw - 1) / (nw * tpw);
		cl = 1;
		while (cl < nb && cl < M5_CL)
			cl *= 2;
		ncl = (nb + cl - 1) / cl;
		if (ncl * cl * nrh <= (int64_t)maxc * M5_CL || tpw >= M5_TPW_MAX)
			break;
		tpw++;
	}
	if (ncl > M5_NCL_MAX || C % cl || (C / cl) % 4)
		return ERR_UNSUPPORTED;
	if ((size_t)nrh * (size_t)cl > KCUDA_N_TICKETS || nrh > 65535)
		return ERR_UNSUPPORTED;
	const size_t n_part = ncl > 1 ? (size_t)rows->n_q * (size_t)H * (size_t)ncl : 0;
	if (n_part * ((size_t)C + 2 * (size_t)cl) * sizeof(float) > c->ws_bytes)
		return ERR_UNSUPPORTED;
	pl->nw = nw;
	pl->tpw = (int)tpw;
	pl->cl = cl;
	pl->ncl = (int)ncl;
	pl->smem = m5_layout((int)kv->dim, nw, (int)tpw).total;
	return 0;
}

/* kcuda_mla_attn's default for a call mm_fits (mla_attn_mma.cu) accepted: ERR_UNSUPPORTED (nothing
 * launched) when switched off, too many rows, or the shape / device does not suit it (more than 8
 * heads, an fp32 pool, more tiles than one wave of warps holds at 16 a warp) */
int kmla_dec5_launch(struct kcuda_ctx *c, const struct kcuda_kv_view *kv, const struct kcuda_attn_rows *rows,
                     const float *q, int64_t H, int64_t C, float scale, float *out)
{
	const int lim = m5_rows_limit();
	/* more than 8 heads (groups of 8, each block one group) only when forced (A/B) */
	if (rows->n_q > lim || !c->tickets || !kv->bf16 || H < 1 || (H > M5_HMAX && !m5_forced()))
		return ERR_UNSUPPORTED;
	if (C % 16 || C > M5_CMAX || kv->dim > M5_DMAX || kv->dim % 16 || kv->dim < C ||
	    (uintptr_t)out % 16 || (uintptr_t)q % 16 || rows->max_keys < 1 || rows->max_keys > INT32_MAX / 2)
		return ERR_UNSUPPORTED;
	int major = 0, max_smem = 0;
	if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device) != cudaSuccess ||
	    cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, c->device) !=
	        cudaSuccess) {
		(void)cudaGetLastError();
		return ERR_UNSUPPORTED;
	}
	if (major < 9)
		return ERR_UNSUPPORTED;
	struct m5_plan pl;
	for (int w = 1; w <= M5_WMAX; w *= 2) /* the occupancy queries ask for this much */
		if (m5_layout(M5_DMAX, w, M5_TPW_MAX).total > (size_t)max_smem)
			return ERR_UNSUPPORTED;
	if (m5_plan_of(c, kv, rows, H, C, &pl) || pl.smem > (size_t)max_smem)
		return ERR_UNSUPPORTED;

	m5_args a;
	a.base = (const uint8_t *)kv->base;
	a.n_blocks = kv->n_blocks;
	a.block_bytes = kv->block_bytes;
	a.offset = kv->offset;
	a.bt = kv->block_tokens;
	a.dim = (int)kv->dim;
	a.qseq = rows->qseq;
	a.blocks = rows->blocks;
	a.n_keys = rows->n_keys;
	a.sel = rows->sel;
	a.ld_blocks = rows->ld_blocks;
	a.pos0 = rows->pos0;
	a.ld_sel = rows->ld_sel;
	a.max_keys = rows->max_keys;
	a.q = q;
	a.H = (int)H;
	a.n_hg = (int)((H + M5_HMAX - 1) / M5_HMAX);
	a.C = (int)C;
	a.scale = scale;
	a.tpw = pl.tpw;
	a.ncl = pl.ncl;
	{
		const char *b = getenv("TANDEM_MLA_DEC5_BULK");
		a.bulk = b && strcmp(b, "1") == 0;
	}
	a.out = out;
	const size_t n_part = pl.ncl > 1 ? (size_t)rows->n_q * (size_t)H * (size_t)pl.ncl : 0;
	a.pacc = (float *)c->ws;
	a.pml = a.pacc + n_part * (size_t)C;
	a.tickets = c->tickets;
	a.err = c->err_dev;

	KCUDA_CHECK(
	    cudaFuncSetAttribute(mla_dec5_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pl.smem));
	cudaError_t e = kmla_cluster_launch(mla_dec5_kernel,
	                                    dim3((unsigned)(pl.ncl * pl.cl), (unsigned)(rows->n_q * a.n_hg)),
	                                    32 * pl.nw, pl.smem, pl.cl, c->stream, a);
	if (e != cudaSuccess) {
		/* refused at launch (cluster dimension, shared memory): off for this device and nw,
		 * the caller takes the next kernel */
		(void)cudaGetLastError();
		fprintf(stderr, "kcuda: mla_dec5 launch refused (%s): the next kernel is used from now on\n",
		        cudaGetErrorString(e));
		m5_ok_state[c->device >= 0 && c->device < 64 ? c->device : 0][pl.nw == 4 ? 2 : pl.nw - 1] = 2;
		return ERR_UNSUPPORTED;
	}
	kcuda_n_launch++;
	kmla_dec5_launches++;
	e = cudaGetLastError();
	if (e == cudaSuccess)
		return 0;
	fprintf(stderr, "kcuda: mla_dec5 launch failed: %s\n", cudaGetErrorString(e));
	return ERR_CUDA;
}

/* For bench_cuda_attn: the plan kcuda_mla_attn's default would launch for n_q rows of max_keys keys
 * at the GLM-5 size (dim 576, C 512, 8 heads, bf16) and its residency: warps per block, tiles per
 * warp, cluster size, clusters per row, blocks per SM, registers per thread, shared memory per
 * block; ERR_UNSUPPORTED where the kernel does not take it. */
extern "C" int kmla_dec5_plan(struct kcuda_ctx *c, int64_t n_q, int64_t max_keys, int out[7])
{
	struct kcuda_kv_view kv;
	struct kcuda_attn_rows rows;
	memset(&kv, 0, sizeof(kv));
	memset(&rows, 0, sizeof(rows));
	kv.dim = 576;
	kv.bf16 = 1;
	rows.n_q = n_q;
	rows.max_keys = max_keys;
	struct m5_plan pl;
	if (m5_plan_of(c, &kv, &rows, 8, 512, &pl))
		return ERR_UNSUPPORTED;
	cudaFuncAttributes fa;
	int bps = 0;
	if (cudaFuncGetAttributes(&fa, mla_dec5_kernel) != cudaSuccess ||
	    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, mla_dec5_kernel, 32 * pl.nw, pl.smem) !=
	        cudaSuccess) {
		(void)cudaGetLastError();
		return ERR_UNSUPPORTED;
	}
	out[0] = pl.nw;
	out[1] = pl.tpw;
	out[2] = pl.cl;
	out[3] = pl.ncl;
	out[4] = bps;
	out[5] = fa.numRegs;
	out[6] = (int)pl.smem;
	return 0;
}
