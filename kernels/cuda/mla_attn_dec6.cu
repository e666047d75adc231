/* MLA decode at small batch with short per-warp instruction streams (absorbed form, paged KV,
 * sparse top-k or dense): mla_dec6, tried before mla_dec (mla_attn_dec.cu) and the split kernel
 * (mla_attn_mma.cu) under TANDEM_MLA_DEC_V=6.
 *
 * Why: Nsight Compute of mla_dec (H200, docs/PERFORMANCE.md "Why the MLA decode costs ~7 us per
 * tile") found it latency-bound on its own instruction chain: one warp per scheduler, ~2000
 * dependent instructions per warp per 16-key tile (bf16 mma with q and p split into hi + lo
 * halves, ldmatrix, softmax, addresses), 6.6 cycles per issued instruction. The arithmetic itself
 * is small (2048 keys x 8 heads x (576 + 512) FMA = 18 M FMA, ~0.5 us of the H200's fp32 rate), so
 * this kernel does it on the CUDA cores in plain fp32 (bf16 keys widen exactly; q, p and the sums
 * stay fp32: no hi / lo split) with every thread of a 256-thread block on a few hundred
 * instructions, and registers (<= 64) and shared memory (~42 KB at one tile) small enough for
 * 3-4 blocks per SM, so a call's blocks are resident at once and can start under PDL while the
 * kernel before still runs.
 *
 * Grid (splits, row x head group of 8): a block owns 8 heads of one query row and chunk = T x KB
 * keys of its row's list (KB = 16 or 32: template; T tiles, usually 1). Its chain:
 *  - before KDEP_ENTRY: the row's block table into shared memory (qseq and the tables are step
 *    inputs the host uploads synchronously before the step's first kernel: cuda_common.cuh's
 *    narrow exception, as indexer_fast.cu; TANDEM_MLA_DEC6_EARLY=0 moves it after the wait);
 *  - after it, in one round trip: the key count, the block's top-k entries, q (8 x 576 fp32 by
 *    16-byte cp.async into shared memory);
 *  - then each warp resolves the pool rows of its KB / 8 keys of the first tile (table in shared
 *    memory: no second global round trip) and copies them by 16-byte cp.async (72 a bf16 row,
 *    spread over its lanes); the keys of later tiles are resolved once into shared memory;
 *  - scores: thread (dim group g, key j) sums 8 heads over the 16-byte pieces g, g + 256 / KB, ...
 *    of key j (q by broadcast loads, the key piece widened once for 8 heads), the groups added
 *    through shared memory; online softmax per head (KB lanes, shuffles);
 *  - PV: thread t owns channels 2t, 2t + 1 of all 8 heads (16 fp32 accumulators), one bf16x2 load
 *    a key and p[key][0..8) by two broadcast float4 loads;
 *  - the splits merged in the same launch (mla_attn_merge.cuh, shared with mla_dec): thread-block
 *    clusters of up to 8 through distributed shared memory, clusters by the last-ticket block,
 *    fixed order (the bits do not depend on which block finishes last).
 * Three block barriers a tile (copy landed, partial scores, p); with T > 1 the next tile's copy
 * is in flight while the current one is scored.
 * Invalid keys (bad position or block id) get score -inf and a zeroed row and are counted in the
 * context's error counter; a bad key count is clamped and counted; rows without keys give 0. */
#include <cooperative_groups.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/mla_attn_merge.cuh"
#include "kernels/cuda/mla_attn_mode.cuh"

namespace cg = cooperative_groups;

#define D6_THREADS 256
#define D6_WARPS 8
#define D6_HG 8 /* heads per block */
#define D6_DMAX 576
#define D6_CMAX 512 /* two channels a thread in the PV product */
#define D6_CL 8 /* largest cluster (the portable limit) */
#define D6_NCL_MAX 64 /* clusters per (row, head group) */
#define D6_CHUNK_MAX 1024 /* keys per block (their addresses are kept in shared memory) */
#define D6_SPREAD (D6_CHUNK_MAX / D6_THREADS) /* later-tile entries a thread resolves */
#define D6_TBL_MAX 2048 /* block-table entries preloaded into shared memory (8 KB) */
#define D6_ROWS_DEFAULT 8 /* query rows taken without TANDEM_MLA_DEC=N */
#define D6_HMAX_DEFAULT 16 /* heads taken without TANDEM_MLA_DEC=N (GLM-5 8, DeepSeek-V3 16 a rank) */

/* the dynamic shared memory carve (byte offsets, 16-aligned) */
struct d6_carve {
	size_t q, kv, red, p, ml, corr, valid, last, addr, tbl, total;
};

struct d6_args {
	kmla_pool pool; /* row_bytes: dim x 2 (bf16) or x 4 (fp32), a multiple of 16 */
	int dim;
	const int32_t *n_keys, *sel;
	int64_t pos0, ld_sel, max_keys;
	int early; /* qseq and the table read before KDEP_ENTRY */
	/* early > 0, pf_entries > 0: the KV blocks of the row's first pf_entries table entries are
	 * prefetched into L2 before KDEP_ENTRY (always when pf_all, the dense rows whose keys are
	 * exactly those; for a top-k list only when the sequence has no more blocks than that) */
	int pf_entries, pf_all;
	const float *q;
	int H, C, n_hg;
	float scale;
	int chunk; /* keys a split, a multiple of KB, <= D6_CHUNK_MAX */
	int stages; /* KV tile buffers: 1 (chunk == KB) or 2 */
	kmla_merge_out mo;
	unsigned *err;
	/* scores mode (mla_attn_dec7.cu, template SO): per tile of KB keys, the block writes e^(s -
	 * m_t) of its keys (s = scale x q . key; 0 for an invalid key) to sc[(row * H + h) * ld_sc +
	 * key] and the tile's (m_t, sum) to ml[(row * H + h) * ld_t + key / KB], and ends there: no
	 * PV or merge (mla_dec7's second kernel does them) */
	float *sc;
	float2 *ml;
	int64_t ld_sc, ld_t;
	d6_carve L; /* d6_layout of this launch (precomputed: no carve arithmetic in the kernel) */
	/* trace mode (bench_cuda_attn, BENCH_ATTN_MLA_TRACE=1): NULL, or D6_NTRACE %globaltimer
	 * stamps a block at [(blockIdx.y * gridDim.x + blockIdx.x) * D6_NTRACE + phase] */
	unsigned long long *trace;
};
/* the phases: 0 entry, 1 after KDEP_ENTRY, 2 the key count and first tile's top-k entries landed
 * (its copies issued), 3 the first tile's rows and q landed (first barrier), 4 the last tile's
 * scores and softmax done, 5 its PV done, then mla_attn_merge.cuh's KMLA_TR_* (6 cluster level, 7
 * ticket, 8 last block's cross-cluster merge) */
#define D6_NTRACE 10
static __host__ __device__ size_t d6_take(size_t *at, size_t bytes)
{
	const size_t r = *at;
	*at += (bytes + 15) & ~(size_t)15;
	return r;
}
static __host__ __device__ int d6_os(int C) /* stride of the merge's output rows (floats) */
{
	return C + 4;
}
static __host__ __device__ d6_carve d6_layout(int row_bytes, int dim, int KB, int stages, int chunk,
                                              int tbl_n, int C)
{
	d6_carve o;
	size_t at = 0;
	/* rows 16 bytes apart mod 128: the 8 lanes of a quarter warp reading the same piece of 8
	 * consecutive keys hit 8 different bank groups */
	const size_t kvb = (size_t)stages * KB * (size_t)(row_bytes + 16);
	const size_t ob = D6_HG * (size_t)d6_os(C) * 4; /* the merge's accumulators reuse the tiles */
	o.q = d6_take(&at, D6_HG * (size_t)dim * 4);
	o.kv = d6_take(&at, kvb > ob ? kvb : ob);
	o.red = d6_take(&at, D6_WARPS * D6_HG * (size_t)KB * 4);
	o.p = d6_take(&at, (size_t)KB * D6_HG * 4);
	o.ml = d6_take(&at, D6_HG * 2 * 4);
	o.corr = d6_take(&at, D6_HG * 4);
	o.valid = d6_take(&at, 2 * (size_t)KB * 4);
	o.last = d6_take(&at, 4);
	o.addr = d6_take(&at, (size_t)chunk * sizeof(void *));
	o.tbl = d6_take(&at, (size_t)tbl_n * 4);
	o.total = at;
	return o;
}

/* the position of key j of query row `row` (-1: outside the list) */
__device__ __forceinline__ int32_t d6_pos(const d6_args &a, int64_t row, int j)
{
	if (!a.sel)
		return j;
	return j < a.ld_sel && j < a.max_keys ? a.sel[row * a.ld_sel + j] : -1;
}

/* one key row into shared memory by this warp: 16-byte cp.async pieces over the lanes, zeros for
 * a missing row (its score is -inf; zeros keep 0 x row finite in the PV product). src is the same
 * in every lane, so the test is made once, outside the loop (mla_attn_mma.cu's copy: the test
 * inside cost ~4x the instructions there) */
__device__ __forceinline__ void d6_copy_row(uint8_t *dst, const uint8_t *src, int np, int lane)
{
	if (src) {
		for (int c = lane; c < np; c += 32)
			katt_cp16(dst + 16 * c, src + 16 * c);
	} else {
		for (int c = lane; c < np; c += 32)
			*(uint4 *)(dst + 16 * c) = make_uint4(0, 0, 0, 0);
	}
}

template <int KB, bool F32, bool SO = false>
__global__ void __launch_bounds__(D6_THREADS, 3) mla_dec6_kernel(d6_args a)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	constexpr int PV = F32 ? 4 : 8; /* values a 16-byte piece */
	constexpr int NG = D6_THREADS / KB; /* dim groups of the score product */
	constexpr int KW = KB / D6_WARPS; /* rows of a tile each warp copies */
	static_assert(KB == 16 || KB == 32, "tile");
	cg::cluster_group cluster = cg::this_cluster();
	extern __shared__ __align__(16) uint8_t d6_sm[];
	const int dim = a.dim, C = a.C, RSB = a.pool.row_bytes + 16, NP = a.pool.row_bytes / 16;
	const d6_carve &L = a.L;
	float *q_s = (float *)(d6_sm + L.q); /* [HG][dim] */
	uint8_t *kv_s = d6_sm + L.kv; /* [stages][KB] rows of RSB bytes */
	float *red_s = (float *)(d6_sm + L.red); /* [WARPS][HG][KB] partial scores */
	float *p_s = (float *)(d6_sm + L.p); /* [KB][HG] */
	float *ml_s = (float *)(d6_sm + L.ml); /* [HG][2] running (max, sum): read by the cluster */
	float *corr_s = (float *)(d6_sm + L.corr); /* [HG] */
	int *valid_s = (int *)(d6_sm + L.valid); /* [2][KB] */
	int *last_s = (int *)(d6_sm + L.last); /* the merge's last-ticket flag */
	const uint8_t **addr_s = (const uint8_t **)(d6_sm + L.addr); /* [chunk] (entries >= KB) */
	int32_t *tbl_s = (int32_t *)(d6_sm + L.tbl);

	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int64_t row = blockIdx.y / a.n_hg;
	const int h0 = (int)(blockIdx.y % a.n_hg) * D6_HG;
	const int k0 = (int)blockIdx.x * a.chunk;

	unsigned long long *tr =
	    a.trace ? a.trace + ((size_t)blockIdx.y * gridDim.x + blockIdx.x) * D6_NTRACE : nullptr;
	kmla_trace(tr, 0);
	/* step inputs only before the wait (see the file comment) */
	int32_t tbl = 0;
	if (a.early) {
		tbl = kmla_pool_table(a.pool, tbl_s, row, D6_THREADS);
		__syncthreads(); /* tbl_s */
		/* L2 prefetch of the row's KV blocks, spread over the blocks of the first head group: a
		 * hint only (L2 is coherent; nothing is read into the kernel before the wait), so rows
		 * an earlier kernel still writes are no hazard. A sparse row's selection is not known
		 * yet: all its blocks, when they are few (the host's pf_entries) */
		const int n = min(a.pf_entries, a.pool.tbl_n);
		if (n > 0 && h0 == 0 && (a.pf_all || n >= a.pool.tbl_n || tbl_s[n] < 0)) {
			const int i = (int)blockIdx.x + tid * (int)gridDim.x;
			const int32_t blk = i < n ? tbl_s[i] : -1;
			if (blk >= 0 && blk < a.pool.n_blocks)
				kdep_prefetch_l2(a.pool.base + (size_t)blk * a.pool.block_bytes +
				                     a.pool.offset,
				                 (size_t)a.pool.bt * (size_t)a.pool.row_bytes);
		}
	}
	KDEP_ENTRY();
	a.q = kdep_after(a.q); /* written by the kernels before: no load of them above the wait */
	a.sel = kdep_after(a.sel);
	a.n_keys = kdep_after(a.n_keys);
	kmla_trace(tr, 1);
	if (!a.early) {
		tbl = kmla_pool_table(a.pool, tbl_s, row, D6_THREADS);
		__syncthreads();
	}

	/* one round trip: the key count, this warp's keys of the first tile, the later tiles' entries,
	 * q (zeros for heads past H) */
	const int64_t nk_raw = a.n_keys ? (int64_t)a.n_keys[row] : a.pos0 + row + 1;
	int32_t pos_w[KW];
#pragma unroll
	for (int i = 0; i < KW; i++)
		pos_w[i] = d6_pos(a, row, k0 + warp + D6_WARPS * i);
	int32_t pos_s[D6_SPREAD];
#pragma unroll
	for (int i = 0; i < D6_SPREAD; i++) {
		const int e = KB + tid + D6_THREADS * i;
		pos_s[i] = e < a.chunk ? d6_pos(a, row, k0 + e) : -1;
	}
#pragma unroll
	for (int h = 0; h < D6_HG; h++) {
		const float *qh = a.q + (row * a.H + h0 + h) * (int64_t)dim;
		for (int c = tid; c < dim / 4; c += D6_THREADS) {
			float *dst = q_s + h * dim + 4 * c;
			if (h0 + h < a.H)
				katt_cp16(dst, qh + 4 * c);
			else
				*(float4 *)dst = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		}
	}
	int64_t nk64 = nk_raw;
	if (nk64 < 0 || nk64 > a.max_keys) {
		if (tid == 0 && blockIdx.x == 0 && h0 == 0)
			atomicAdd(a.err, 1u);
		nk64 = nk64 < 0 ? 0 : a.max_keys;
	}
	const int kend = (int)min(nk64 - k0, (int64_t)a.chunk); /* keys of this block (<= 0: none) */
	const int nt = kend > 0 ? (kend + KB - 1) / KB : 0;

	/* the first tile: each warp its rows warp, warp + 8, ... */
	if (nt > 0) {
#pragma unroll
		for (int i = 0; i < KW; i++) {
			const int r = warp + D6_WARPS * i;
			const uint8_t *src = r < kend ? kmla_pool_row(a.pool, tbl_s, tbl, pos_w[i]) : NULL;
			if (lane == 0) {
				valid_s[r] = src != NULL;
				if (!src && r < kend)
					atomicAdd(a.err, 1u);
			}
			d6_copy_row(kv_s + r * RSB, src, NP, lane);
		}
	}
	katt_cp_commit();
	kmla_trace(tr, 2);
	/* the later tiles' rows, resolved once (published by the first barrier of the loop) */
#pragma unroll
	for (int i = 0; i < D6_SPREAD; i++) {
		const int e = KB + tid + D6_THREADS * i;
		if (e < a.chunk) {
			const uint8_t *src = e < kend ? kmla_pool_row(a.pool, tbl_s, tbl, pos_s[i]) : NULL;
			addr_s[e] = src;
			if (!src && e < kend)
				atomicAdd(a.err, 1u);
		}
	}
	if (tid < D6_HG) {
		ml_s[2 * tid] = -INFINITY;
		ml_s[2 * tid + 1] = 0.0f;
	}

	const int c2 = 2 * tid; /* PV: channels c2, c2 + 1 of all 8 heads */
	float acc[D6_HG][2];
#pragma unroll
	for (int h = 0; h < D6_HG; h++)
		acc[h][0] = acc[h][1] = 0.0f;
	const int g = tid / KB, jk = tid % KB; /* scores: dim group, key; softmax: head g < 8, key jk */

	for (int n = 0; n < nt; n++) {
		const int st = a.stages > 1 ? (n & 1) : 0;
		katt_cp_wait<0>();
		__syncthreads(); /* tile n landed; tile n - 1's PV done; addr_s, valid_s, ml_s published */
		if (n == 0)
			kmla_trace(tr, 3);
		if (n + 1 < nt) { /* the next tile into the other buffer while this one is scored */
			const int sn = st ^ 1;
#pragma unroll
			for (int i = 0; i < KW; i++) {
				const int r = warp + D6_WARPS * i, e = (n + 1) * KB + r;
				const uint8_t *src = e < kend ? addr_s[e] : NULL;
				if (lane == 0)
					valid_s[sn * KB + r] = src != NULL;
				d6_copy_row(kv_s + (sn * KB + r) * RSB, src, NP, lane);
			}
			katt_cp_commit();
		}
		const uint8_t *kt = kv_s + st * KB * RSB;

		/* partial scores of key jk over the pieces g, g + NG, ... for all 8 heads */
		float s[D6_HG];
#pragma unroll
		for (int h = 0; h < D6_HG; h++)
			s[h] = 0.0f;
#pragma unroll 1
		for (int p = g; p < NP; p += NG) {
			const uint4 kw = *(const uint4 *)(kt + jk * RSB + 16 * p);
			float kf[PV];
			if constexpr (F32) {
				kf[0] = __uint_as_float(kw.x);
				kf[1] = __uint_as_float(kw.y);
				kf[2] = __uint_as_float(kw.z);
				kf[3] = __uint_as_float(kw.w);
			} else {
				const uint32_t w4[4] = {kw.x, kw.y, kw.z, kw.w};
#pragma unroll
				for (int e = 0; e < 4; e++) {
					kf[2 * e] = __uint_as_float(w4[e] << 16);
					kf[2 * e + 1] = __uint_as_float(w4[e] & 0xffff0000u);
				}
			}
			const float *qp = q_s + p * PV;
#pragma unroll
			for (int h = 0; h < D6_HG; h++) {
#pragma unroll
				for (int e = 0; e < PV / 4; e++) {
					const float4 qv = *(const float4 *)(qp + h * dim + 4 * e);
					s[h] = fmaf(qv.x, kf[4 * e], s[h]);
					s[h] = fmaf(qv.y, kf[4 * e + 1], s[h]);
					s[h] = fmaf(qv.z, kf[4 * e + 2], s[h]);
					s[h] = fmaf(qv.w, kf[4 * e + 3], s[h]);
				}
			}
		}
		if constexpr (KB == 16) { /* two dim groups a warp: lanes l and l + 16 hold the same key */
#pragma unroll
			for (int h = 0; h < D6_HG; h++)
				s[h] += __shfl_xor_sync(0xffffffffu, s[h], 16);
		}
		if (lane < KB)
#pragma unroll
			for (int h = 0; h < D6_HG; h++)
				red_s[(warp * D6_HG + h) * KB + jk] = s[h];
		__syncthreads();

		if constexpr (SO) { /* scores mode: thread (head g, key jk); the KB keys of a head in
			             * adjacent lanes of one warp */
			if (tid < D6_HG * KB) {
				const int e = n * KB + jk;
				float sc = 0.0f;
#pragma unroll
				for (int w = 0; w < D6_WARPS; w++)
					sc += red_s[(w * D6_HG + g) * KB + jk];
				sc = e < kend && valid_s[st * KB + jk] ? sc * a.scale : -INFINITY;
				float mt = sc;
#pragma unroll
				for (int o = KB / 2; o > 0; o >>= 1)
					mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, o));
				const float p = mt == -INFINITY ? 0.0f : expf(sc - mt);
				float lt = p;
#pragma unroll
				for (int o = KB / 2; o > 0; o >>= 1)
					lt += __shfl_xor_sync(0xffffffffu, lt, o);
				if (h0 + g < a.H) {
					const int64_t rh = row * a.H + h0 + g;
					if (e < kend)
						a.sc[rh * a.ld_sc + k0 + e] = p;
					if (jk == 0)
						a.ml[rh * a.ld_t + (k0 + n * KB) / KB] = make_float2(mt, lt);
				}
			}
			continue; /* the next tile's first barrier orders red_s's reuse */
		}

		/* online softmax: thread (head g, key jk), the KB keys of a head in adjacent lanes */
		if (tid < D6_HG * KB) {
			float sc = 0.0f;
#pragma unroll
			for (int w = 0; w < D6_WARPS; w++)
				sc += red_s[(w * D6_HG + g) * KB + jk];
			sc = valid_s[st * KB + jk] ? sc * a.scale : -INFINITY;
			const float m_old = ml_s[2 * g], l_old = ml_s[2 * g + 1];
			float mt = sc;
#pragma unroll
			for (int o = KB / 2; o > 0; o >>= 1)
				mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, o));
			const float mn = fmaxf(m_old, mt);
			/* all keys so far invalid: everything stays 0 */
			const float corr = mn == -INFINITY ? 1.0f : expf(m_old - mn);
			const float p = mn == -INFINITY ? 0.0f : expf(sc - mn);
			float ps = p;
#pragma unroll
			for (int o = KB / 2; o > 0; o >>= 1)
				ps += __shfl_xor_sync(0xffffffffu, ps, o);
			__syncwarp(); /* every lane of the head has read ml_s before it is replaced */
			if (jk == 0) {
				ml_s[2 * g] = mn;
				ml_s[2 * g + 1] = l_old * corr + ps;
				corr_s[g] = corr;
			}
			p_s[jk * D6_HG + g] = p;
		}
		__syncthreads();
		if (n == nt - 1)
			kmla_trace(tr, 4);

		/* acc = acc * corr + P V for channels c2, c2 + 1 */
		if (c2 < C) {
			const float4 ca = *(const float4 *)corr_s, cb = *(const float4 *)(corr_s + 4);
			const float cr[D6_HG] = {ca.x, ca.y, ca.z, ca.w, cb.x, cb.y, cb.z, cb.w};
#pragma unroll
			for (int h = 0; h < D6_HG; h++) {
				acc[h][0] *= cr[h];
				acc[h][1] *= cr[h];
			}
			const uint8_t *vb = kt + (size_t)c2 * (F32 ? 4 : 2);
#pragma unroll 4
			for (int j = 0; j < KB; j++) {
				float v0, v1;
				if constexpr (F32) {
					const float2 v = *(const float2 *)(vb + j * RSB);
					v0 = v.x;
					v1 = v.y;
				} else {
					const uint32_t w = *(const uint32_t *)(vb + j * RSB);
					v0 = __uint_as_float(w << 16);
					v1 = __uint_as_float(w & 0xffff0000u);
				}
				const float4 pa = *(const float4 *)(p_s + j * D6_HG),
				             pb = *(const float4 *)(p_s + j * D6_HG + 4);
				const float pr[D6_HG] = {pa.x, pa.y, pa.z, pa.w, pb.x, pb.y, pb.z, pb.w};
#pragma unroll
				for (int h = 0; h < D6_HG; h++) {
					acc[h][0] = fmaf(pr[h], v0, acc[h][0]);
					acc[h][1] = fmaf(pr[h], v1, acc[h][1]);
				}
			}
		}
	}

	if constexpr (SO) {
		katt_cp_wait<0>(); /* q's copy, when the block had no keys: none left in flight */
		return;
	}
	/* ---- this block's (max, sum, acc) to shared memory, then the merge ---- */
	katt_cp_wait<0>(); /* q's copy, when the block had no keys */
	__syncthreads(); /* the KV buffers are free: the accumulators go there */
	kmla_trace(tr, 5);
	const int OS = d6_os(C);
	float *o_s = (float *)kv_s; /* [HG][OS] */
	if (c2 < C)
#pragma unroll
		for (int h = 0; h < D6_HG; h++)
			*(float2 *)(o_s + h * OS + c2) = make_float2(acc[h][0], acc[h][1]);
	kmla_cluster_merge<D6_HG, D6_THREADS, D6_CL>(cluster, a.mo, ml_s, o_s, OS, last_s, row * a.H + h0,
	                                             min(D6_HG, a.H - h0), tr);
#else
	__trap(); /* not launched below sm_90 (kmla_dec6_launch checks the device) */
#endif
}

/* launches of this kernel (test_ops_mla and bench_cuda_attn check which kernel took a call) */
extern "C" {
unsigned long long kmla_dec6_launches = 0;
}
/* trace mode: the buffer the next launches stamp (bench_cuda_attn sets it around one call of a
 * captured graph; NULL: off) */
static unsigned long long *d6_trace;
extern "C" void kmla_dec6_set_trace(unsigned long long *buf)
{
	d6_trace = buf;
}

/* On with TANDEM_MLA_DEC_V=6, and with TANDEM_MLA_DEC_V unset when kmla_dec6_default_on (0 until
 * the H200 measures it faster; test_ops_mla reads it to know what the defaults take). Then:
 * TANDEM_MLA_DEC unset -> up to D6_ROWS_DEFAULT query rows of up to D6_HMAX_DEFAULT heads; "0" ->
 * never; N -> up to N rows, any heads (A/B, tests). Read on every call (a getenv; at capture only
 * under graphs), so tests can flip it. */
extern "C" {
int kmla_dec6_default_on = 0;
}
static int d6_rows_limit(bool *forced)
{
	*forced = false;
	const char *v = getenv("TANDEM_MLA_DEC_V");
	if (v && *v ? strcmp(v, "6") != 0 : !kmla_dec6_default_on)
		return 0;
	const char *e = getenv("TANDEM_MLA_DEC");
	if (!e || !*e)
		return D6_ROWS_DEFAULT;
	char *end = NULL;
	const long n = strtol(e, &end, 10);
	if (*end || n < 0)
		return D6_ROWS_DEFAULT;
	*forced = n > 0;
	return n > 65535 ? 65535 : (int)n;
}

/* keys a tile: TANDEM_MLA_DEC6_KB=32 (bf16 pools; tuning), else 16 */
static int d6_kb(bool f32)
{
	const char *e = getenv("TANDEM_MLA_DEC6_KB");
	return !f32 && e && strcmp(e, "32") == 0 ? 32 : 16;
}
int kmla_dec6_kb(int bf16)
{
	return d6_kb(!bf16);
}

/* TANDEM_MLA_DEC6_PF=0: no L2 prefetch of the rows' KV blocks before KDEP_ENTRY */
static bool d6_pf(void)
{
	const char *e = getenv("TANDEM_MLA_DEC6_PF");
	return !(e && strcmp(e, "0") == 0);
}

/* TANDEM_MLA_DEC6_EARLY=0: the block table is read after KDEP_ENTRY */
static bool d6_early(void)
{
	const char *e = getenv("TANDEM_MLA_DEC6_EARLY");
	return !(e && strcmp(e, "0") == 0);
}
int kmla_dec6_early(void)
{
	return d6_early();
}

/* TANDEM_MLA_DEC6_T=N: at least N tiles a block (fewer blocks and clusters; tuning) */
static int d6_min_tiles(void)
{
	const char *e = getenv("TANDEM_MLA_DEC6_T");
	const int n = e ? atoi(e) : 1;
	return n < 1 ? 1 : n > D6_CHUNK_MAX / 16 ? D6_CHUNK_MAX / 16 : n;
}

typedef void (*d6_kernel_t)(d6_args);
static d6_kernel_t d6_kernel(int KB, bool f32, bool so)
{
	if (so) {
		if (f32)
			return mla_dec6_kernel<16, true, true>;
		return KB == 32 ? mla_dec6_kernel<32, false, true> : mla_dec6_kernel<16, false, true>;
	}
	if (f32)
		return mla_dec6_kernel<16, true>;
	return KB == 32 ? mla_dec6_kernel<32, false> : mla_dec6_kernel<16, false>;
}

/* Per device and instantiation (0: bf16 KB 16, 1: bf16 KB 32, 2: fp32 KB 16; + 3 in scores mode): can it run
 * 8-block clusters at its largest shared-memory size, and how many blocks fit an SM at the size of a
 * two-stage, D6_CHUNK_MAX plan (the estimate the splits are sized by)? Asked once (occupancy
 * queries, no launch), so a device or driver without them takes the next kernel. */
static int d6_ok_state[64][6]; /* 0 unknown, 1 usable, 2 not */
static int d6_bps[64][6];
static int d6_inst(int KB, bool f32, bool so)
{
	return (f32 ? 2 : KB == 32 ? 1 : 0) + (so ? 3 : 0);
}
static bool d6_cluster_ok(struct kcuda_ctx *c, int KB, bool f32, bool so, int max_smem, int *bps)
{
	const int dev = c->device >= 0 && c->device < 64 ? c->device : 0, k = d6_inst(KB, f32, so);
	*bps = d6_bps[dev][k];
	if (d6_ok_state[dev][k])
		return d6_ok_state[dev][k] == 1;
	const d6_kernel_t fn = d6_kernel(KB, f32, so);
	const int rb = D6_DMAX * (f32 ? 4 : 2);
	const size_t big = d6_layout(rb, D6_DMAX, KB, 2, D6_CHUNK_MAX, D6_TBL_MAX, D6_CMAX).total;
	int n = 0, b = 0;
	if (big > (size_t)max_smem ||
	    cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)big) != cudaSuccess ||
	    cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout,
	                         (int)cudaSharedmemCarveoutMaxShared) != cudaSuccess ||
	    kmla_max_clusters((const void *)fn, D6_CL, D6_THREADS, big, c->stream, &n) != cudaSuccess ||
	    n < 1 || cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, fn, D6_THREADS, big) != cudaSuccess ||
	    b < 1) {
		(void)cudaGetLastError();
		fprintf(stderr, "kcuda: mla_dec6: no %d-block clusters (KB %d, %s) on device %d (%d)\n",
		        D6_CL, KB, f32 ? "fp32" : "bf16", c->device, n);
		d6_ok_state[dev][k] = 2;
		return false;
	}
	d6_ok_state[dev][k] = 1;
	d6_bps[dev][k] = *bps = b;
	return true;
}

/* the launch plan of a call */
struct d6_plan {
	int KB, f32, so, chunk, stages, cl, ncl, nsplit, tbl_n, early, bps;
	int64_t nrh;
	size_t smem;
};

/* the splits of a plan for bps blocks per SM: one wave of resident blocks in all, each a whole
 * number of tiles, at most D6_CHUNK_MAX keys; rounded up to whole clusters (the extra splits have
 * no keys); pl->KB, f32, nrh, tbl_n set */
static int d6_plan_splits(struct kcuda_ctx *c, const struct kcuda_kv_view *kv,
                          const struct kcuda_attn_rows *rows, int64_t H, int64_t C, int bps,
                          struct d6_plan *pl)
{
	const int n_sm = c->n_sm > 0 ? c->n_sm : 1;
	const int64_t tiles = (rows->max_keys + pl->KB - 1) / pl->KB;
	int64_t want = ((int64_t)bps * n_sm + pl->nrh - 1) / pl->nrh;
	if (want > tiles)
		want = tiles;
	if (want > (int64_t)D6_NCL_MAX * D6_CL)
		want = (int64_t)D6_NCL_MAX * D6_CL;
	if (want < 1)
		want = 1;
	int64_t tiles_per = (tiles + want - 1) / want;
	const int tmin = d6_min_tiles();
	if (tiles_per < tmin)
		tiles_per = tmin;
	if (tiles_per * pl->KB > D6_CHUNK_MAX)
		tiles_per = D6_CHUNK_MAX / pl->KB;
	const int64_t nsplit = (tiles + tiles_per - 1) / tiles_per;
	int cl = 1;
	while (!pl->so && cl < nsplit && cl < D6_CL) /* scores mode: no merge, no clusters */
		cl *= 2;
	const int64_t ncl = (nsplit + cl - 1) / cl;
	if (!pl->so && (ncl > D6_NCL_MAX || C % cl || (C / cl) % 4))
		return ERR_UNSUPPORTED;
	if (!pl->so && (size_t)pl->nrh * (size_t)cl > KCUDA_N_TICKETS)
		return ERR_UNSUPPORTED;
	const size_t n_part = !pl->so && ncl > 1 ? (size_t)rows->n_q * (size_t)H * (size_t)ncl : 0;
	if (n_part * ((size_t)C + 2 * (size_t)cl) * sizeof(float) > c->ws_bytes)
		return ERR_UNSUPPORTED;
	pl->chunk = (int)(tiles_per * pl->KB);
	pl->stages = tiles_per > 1 ? 2 : 1;
	pl->cl = cl;
	pl->ncl = (int)ncl;
	pl->nsplit = (int)(ncl * cl);
	pl->smem = d6_layout((int)kv->dim * (pl->f32 ? 4 : 2), (int)kv->dim, pl->KB, pl->stages, pl->chunk,
	                     pl->tbl_n, (int)C)
	               .total;
	return 0;
}

static int d6_plan_of(struct kcuda_ctx *c, const struct kcuda_kv_view *kv, const struct kcuda_attn_rows *rows,
                      int64_t H, int64_t C, bool so, struct d6_plan *pl)
{
	if ((!c->tickets && !so) || H < 1 || C < 4 || C % 4 || C > D6_CMAX || kv->dim < C ||
	    kv->dim > D6_DMAX || kv->dim % 8 || rows->n_q < 1 || rows->max_keys < 1 ||
	    rows->max_keys > INT32_MAX / 2 || kv->block_tokens < 1)
		return ERR_UNSUPPORTED;
	const int major = kcuda_cc_major(c->device), max_smem = kcuda_smem_optin(c->device);
	if (major < 9)
		return ERR_UNSUPPORTED;
	const bool f32 = !kv->bf16;
	pl->f32 = f32;
	pl->so = so;
	pl->KB = d6_kb(f32);
	if (!d6_cluster_ok(c, pl->KB, f32, so, max_smem, &pl->bps))
		return ERR_UNSUPPORTED;
	const int n_hg = (int)((H + D6_HG - 1) / D6_HG);
	pl->nrh = rows->n_q * n_hg;
	if (pl->nrh > 65535)
		return ERR_UNSUPPORTED;
	pl->early = d6_early();
	pl->tbl_n = rows->ld_blocks <= D6_TBL_MAX ? (int)rows->ld_blocks : 0;
	/* sized for the blocks per SM at the largest shared memory (d6_cluster_ok), then again for
	 * what fits at the plan's own size when that is more (a second plan is kept only if its own
	 * size still fits that many) */
	if (d6_plan_splits(c, kv, rows, H, C, pl->bps, pl) || pl->smem > (size_t)max_smem)
		return ERR_UNSUPPORTED;
	const d6_kernel_t fn = d6_kernel(pl->KB, f32, so);
	int occ = 0, occ2 = 0;
	if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, fn, D6_THREADS, pl->smem) != cudaSuccess) {
		(void)cudaGetLastError();
		return 0;
	}
	struct d6_plan p2 = *pl;
	if (occ > pl->bps && !d6_plan_splits(c, kv, rows, H, C, occ, &p2) && p2.smem <= (size_t)max_smem &&
	    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ2, fn, D6_THREADS, p2.smem) == cudaSuccess &&
	    occ2 >= occ)
		*pl = p2;
	(void)cudaGetLastError();
	return 0;
}

/* kcuda_mla_attn's first choice under TANDEM_MLA_DEC_V=6 for a call mm_fits (mla_attn_mma.cu)
 * accepted: ERR_UNSUPPORTED (nothing launched) when switched off, too many rows or heads, or the
 * shape / device does not suit it (the caller then tries the next kernel) */
static int d6_run(struct kcuda_ctx *c, const struct kcuda_kv_view *kv, const struct kcuda_attn_rows *rows,
                  const float *q, int64_t H, int64_t C, float scale, float *out, float *sc, int64_t ld_sc,
                  float2 *ml, int64_t ld_t);

int kmla_dec6_launch(struct kcuda_ctx *c, const struct kcuda_kv_view *kv, const struct kcuda_attn_rows *rows,
                     const float *q, int64_t H, int64_t C, float scale, float *out)
{
	bool forced = false;
	const int lim = d6_rows_limit(&forced);
	if (rows->n_q > lim || (H > D6_HMAX_DEFAULT && !forced))
		return ERR_UNSUPPORTED;
	return d6_run(c, kv, rows, q, H, C, scale, out, NULL, 0, NULL, 0);
}

/* mla_attn_dec7.cu's first launch: this kernel in scores mode (no clusters, no merge): sc[(row * H
 * + h) * ld_sc + j] = scale x q . key j of row's list for j < its key count (-inf for an invalid
 * key; later entries untouched). ERR_UNSUPPORTED, nothing launched, where the kernel does not take
 * the shape or device. */
int kmla_dec6_scores(struct kcuda_ctx *c, const struct kcuda_kv_view *kv, const struct kcuda_attn_rows *rows,
                     const float *q, int64_t H, int64_t C, float scale, float *sc, int64_t ld_sc, float2 *ml,
                     int64_t ld_t, int kb)
{
	if (!sc || !ml || ld_sc < rows->max_keys || kb != d6_kb(!kv->bf16) || ld_t * kb < rows->max_keys)
		return ERR_UNSUPPORTED;
	return d6_run(c, kv, rows, q, H, C, scale, NULL, sc, ld_sc, ml, ld_t);
}

/* out != NULL: the softmax-weighted sums, merged; sc != NULL: scores mode */
static int d6_run(struct kcuda_ctx *c, const struct kcuda_kv_view *kv, const struct kcuda_attn_rows *rows,
                  const float *q, int64_t H, int64_t C, float scale, float *out, float *sc, int64_t ld_sc,
                  float2 *ml, int64_t ld_t)
{
	const bool so = sc != NULL;
	if (((uintptr_t)kv->base | kv->block_bytes | kv->offset | (uintptr_t)q | (uintptr_t)out) % 16)
		return ERR_UNSUPPORTED;
	struct d6_plan pl;
	if (d6_plan_of(c, kv, rows, H, C, so, &pl))
		return ERR_UNSUPPORTED;

	d6_args a;
	a.pool = kmla_pool_of(kv, rows, pl.tbl_n);
	a.dim = (int)kv->dim;
	a.n_keys = rows->n_keys;
	a.sel = rows->sel;
	a.pos0 = rows->pos0;
	a.ld_sel = rows->ld_sel;
	a.max_keys = rows->max_keys;
	a.early = pl.early;
	/* the L2 prefetch: at most ~16 MB a call; a top-k row only when its sequence is at most twice
	 * the list (GLM-5 top-2048 at 4096 keys: 4.7 MB a row, read from HBM while the top-k runs) */
	a.pf_entries = 0;
	a.pf_all = !rows->sel;
	if (d6_pf() && pl.early && pl.tbl_n > 0) {
		const size_t eb = (size_t)kv->block_tokens * (size_t)a.pool.row_bytes;
		int64_t n = (int64_t)(((size_t)16 << 20) / (eb * (size_t)rows->n_q));
		if (rows->sel && n > 2 * rows->max_keys / kv->block_tokens)
			n = 2 * rows->max_keys / kv->block_tokens;
		a.pf_entries = (int)(n < pl.tbl_n ? n : pl.tbl_n);
	}
	a.q = q;
	a.H = (int)H;
	a.C = (int)C;
	a.n_hg = (int)((H + D6_HG - 1) / D6_HG);
	a.scale = scale;
	a.chunk = pl.chunk;
	a.stages = pl.stages;
	const size_t n_part = pl.ncl > 1 ? (size_t)rows->n_q * (size_t)H * (size_t)pl.ncl : 0;
	a.mo.out = out;
	a.mo.pacc = (float *)c->ws;
	a.mo.pml = a.mo.pacc + n_part * (size_t)C;
	a.mo.tickets = c->tickets;
	a.mo.C = (int)C;
	a.mo.ncl = pl.ncl;
	a.err = c->err_dev;
	a.sc = sc;
	a.ld_sc = ld_sc;
	a.ml = ml;
	a.ld_t = ld_t;
	a.L = d6_layout(a.pool.row_bytes, a.dim, pl.KB, pl.stages, pl.chunk, pl.tbl_n, a.C);
	a.trace = d6_trace;

	const d6_kernel_t fn = d6_kernel(pl.KB, pl.f32, so);
	/* the kernel's shared-memory limit stays at the largest plan's (d6_cluster_ok): never lowered,
	 * so the occupancy the plans are made from, and the plans, are the same on every call */
	cudaError_t e = kmla_cluster_launch(fn, dim3((unsigned)pl.nsplit, (unsigned)pl.nrh), D6_THREADS,
	                                    pl.smem, pl.cl, c->stream, a);
	if (e != cudaSuccess) {
		/* refused at launch (cluster dimension, shared memory): off for this device and
		 * instantiation, the caller takes the next kernel */
		(void)cudaGetLastError();
		fprintf(stderr, "kcuda: mla_dec6 launch refused (%s): the next kernel is used from now on\n",
		        cudaGetErrorString(e));
		d6_ok_state[c->device >= 0 && c->device < 64 ? c->device : 0][d6_inst(pl.KB, pl.f32, so)] = 2;
		return ERR_UNSUPPORTED;
	}
	kcuda_n_launch++;
	if (!so)
		kmla_dec6_launches++;
	e = cudaGetLastError();
	if (e == cudaSuccess)
		return 0;
	fprintf(stderr, "kcuda: mla_dec6 launch failed: %s\n", cudaGetErrorString(e));
	return ERR_CUDA;
}

/* For bench_cuda_attn: the plan kmla_dec6_launch makes for n_q rows of H heads and max_keys keys at
 * the GLM-5 size (dim 576, C 512, ld_blocks blocks a table) with the current switches (KB by
 * TANDEM_MLA_DEC6_KB): out = keys a split, splits a row, cluster size, clusters a row, blocks per
 * SM at that plan's shared memory, registers per thread, shared memory per block;
 * ERR_UNSUPPORTED where the kernel does not take it. */
extern "C" int kmla_dec6_plan(struct kcuda_ctx *c, int64_t n_q, int64_t H, int64_t max_keys,
                              int64_t ld_blocks, int bf16, int out[7])
{
	struct kcuda_kv_view kv;
	struct kcuda_attn_rows rows;
	memset(&kv, 0, sizeof(kv));
	memset(&rows, 0, sizeof(rows));
	kv.dim = 576;
	kv.bf16 = bf16;
	kv.block_tokens = 64;
	rows.n_q = n_q;
	rows.max_keys = max_keys;
	rows.ld_blocks = ld_blocks;
	struct d6_plan pl;
	if (d6_plan_of(c, &kv, &rows, H, 512, false, &pl))
		return ERR_UNSUPPORTED;
	const d6_kernel_t fn = d6_kernel(pl.KB, pl.f32, false);
	cudaFuncAttributes fa;
	int bps = 0;
	if (cudaFuncGetAttributes(&fa, fn) != cudaSuccess ||
	    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, fn, D6_THREADS, pl.smem) != cudaSuccess) {
		(void)cudaGetLastError();
		return ERR_UNSUPPORTED;
	}
	out[0] = pl.chunk;
	out[1] = pl.nsplit;
	out[2] = pl.cl;
	out[3] = pl.ncl;
	out[4] = bps;
	out[5] = fa.numRegs;
	out[6] = (int)pl.smem;
	return 0;
}
