/* MLA decode at small batch (absorbed form, paged KV, sparse top-k or dense): the kernel that
 * kcuda_mla_attn takes when query rows x head groups are few (batch 1..8 at 8 / 16 heads per
 * rank), in ONE launch with every SM busy. TANDEM_MLA_DEC=0 restores the split kernel + combine
 * launch of mla_attn_mma.cu; TANDEM_MLA_DEC=N takes this kernel up to N (row, head group) pairs
 * of any shape; by default only a single sparse row (md_rows_limit: the H200 measured it slower
 * everywhere else).
 *
 * Why a second kernel: at batch 1 the split kernel ran 64 blocks of one 32-key tile each, then a
 * combine launch; each block is a chain of dependent round trips (top-k list -> block table -> KV
 * rows -> math -> partials) and the combine adds a node and another chain (H200 ncu, run 10: 19.3
 * + 6.7 us for 2.4 MB). Here:
 *  - 16-key tiles: 2048 selected keys make 128 blocks (one wave on 132 SMs), each block copying
 *    ~18 KB instead of ~36 KB;
 *  - the first tile's top-k entries, the key count, the row's table index and q are all loaded
 *    at once after KDEP_ENTRY (and, for prefill rows, which share one table, the whole table row
 *    into shared memory: one round trip less); KV rows then come by 16-byte cp.async (9 per
 *    thread in flight), the next tile's while the current one is scored;
 *  - the fragments of K (QK^T) and V (PV) come from shared memory by ldmatrix (x4, and .trans for
 *    V) for bf16 pools; q and p are split into bf16 hi + lo (fp32-level accuracy, as in
 *    mla_attn_mma.cu), hi and lo products into separate accumulators (half the mma chain);
 *  - the splits are combined without a second launch: the blocks of a thread-block cluster (up
 *    to 8, sm_90+) merge their (max, sum, acc) through distributed shared memory, block r of the
 *    cluster doing channels [r C / cl, (r + 1) C / cl); with more than one cluster per (row, head
 *    group), each block writes its cluster's partial slice to the workspace and takes a ticket
 *    (one counter per (row, head group, slice) in the context's zeroed ticket array); the block
 *    that draws the last ticket merges the slices of all clusters in cluster order and resets the
 *    counter to 0 (so the next call, or a graph replay, finds it zero). The merge order is fixed:
 *    the bits do not depend on which block finishes last (mla_attn_merge.cuh, shared with
 *    mla_attn_dec6.cu).
 * Invalid keys (bad position or block id) get score -inf and a zeroed row and are counted in the
 * context's error counter, as in the other kernels. */
#include <cooperative_groups.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "kernels/cuda/mla_attn_merge.cuh"
#include "kernels/cuda/mla_attn_mode.cuh"
#include "kernels/cuda/mla_attn_tile.cuh"

namespace cg = cooperative_groups;

#define MD_WARPS 4
#define MD_THREADS (32 * MD_WARPS)
#define MD_HG 16 /* heads per block (one m16 tile) */
#define MD_TK 16 /* keys per tile */
#define MD_DMAX 576
#define MD_CMAX 512
#define MD_KSW (MD_DMAX / 16 / MD_WARPS) /* QK^T k-steps per warp: 9 */
#define MD_NTW (MD_CMAX / 8 / MD_WARPS) /* PV n-tiles per warp at C = 512: 16 */
#define MD_PS 24 /* p row stride (bf16): 12 words, conflict-free fragment loads */
#define MD_CL 8 /* largest cluster (the portable limit on sm_90 / 100 / 120) */
#define MD_NCL_MAX 64 /* clusters per (row, head group): splits <= 512 */
#define MD_TBL_MAX 2048 /* block-table entries kept in shared memory (8 KB) */

struct md_args {
	const uint8_t *base;
	int64_t n_blocks;
	size_t block_bytes, offset;
	int bt, dim, elt; /* elt: bytes per cached value, 2 (bf16) or 4 (fp32) */
	const int32_t *qseq, *blocks, *n_keys, *sel;
	int64_t ld_blocks, pos0, ld_sel, max_keys;
	int tbl_n; /* block-table entries preloaded into shared memory (ld_blocks or 0) */
	const float *q;
	int H, C, n_hg;
	float scale;
	int chunk; /* keys per split (a multiple of MD_TK) */
	int ncl; /* clusters per (row, head group); gridDim.x = ncl * cluster size */
	float *out;
	float *pacc; /* ncl > 1: [row * H + h][ncl][C] cluster partials */
	float *pml; /* [row * H + h][ncl][cl][2] their (max, sum), one copy per slice */
	unsigned *tickets; /* [gridDim.y][cl], zero between calls */
	unsigned *err;
};

/* shared row stride in values (16-byte multiple; 4 words mod 32: conflict-free fragment loads
 * and ldmatrix rows) */
static __host__ __device__ int md_rs(int dim, bool f32)
{
	return f32 ? dim + 4 : dim + 8;
}
static __host__ __device__ int md_os(int C) /* stride of the merged-output rows (floats) */
{
	return C + 8;
}

/* the dynamic shared memory carve (byte offsets, 16-aligned) */
struct md_carve {
	size_t kv, sred, phi, plo, corr, ml, addr, tbl, total;
};
static __host__ __device__ size_t md_take(size_t *at, size_t bytes)
{
	const size_t r = *at;
	*at += (bytes + 15) & ~(size_t)15;
	return r;
}
static __host__ __device__ md_carve md_layout(int dim, bool f32, int C, int tbl_n)
{
	md_carve o;
	size_t at = 0;
	const size_t kvb = 2 * MD_TK * (size_t)md_rs(dim, f32) * (f32 ? 4 : 2);
	const size_t ob = MD_HG * (size_t)md_os(C) * 4; /* the merged outputs reuse the KV tiles */
	o.kv = md_take(&at, kvb > ob ? kvb : ob);
	o.sred = md_take(&at, MD_WARPS * MD_HG * MD_TK * 4);
	o.phi = md_take(&at, MD_HG * MD_PS * 2);
	o.plo = md_take(&at, MD_HG * MD_PS * 2);
	o.corr = md_take(&at, MD_HG * 4);
	o.ml = md_take(&at, MD_HG * 2 * 4);
	o.addr = md_take(&at, 2 * MD_TK * sizeof(void *));
	o.tbl = md_take(&at, (size_t)tbl_n * 4);
	o.total = at;
	return o;
}

/* the pool row of position p of table row tbl (tbl_s: that row in shared memory, or NULL) */
__device__ __forceinline__ const uint8_t *md_key_row(const md_args &a, const int32_t *tbl_s, int32_t tbl,
                                                     int64_t p)
{
	if (p < 0 || p >= a.ld_blocks * a.bt)
		return NULL;
	const int64_t bi = p / a.bt;
	const int64_t blk =
	    bi < a.tbl_n ? (int64_t)tbl_s[bi] : (int64_t)a.blocks[(int64_t)tbl * a.ld_blocks + bi];
	if (blk < 0 || blk >= a.n_blocks)
		return NULL;
	return a.base + (size_t)blk * a.block_bytes + a.offset +
	       (size_t)(p % a.bt) * (size_t)a.dim * (size_t)a.elt;
}

template <bool F32> __global__ void __launch_bounds__(MD_THREADS) mla_dec_kernel(md_args a)
{
	KDEP_ENTRY();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	a.q = kdep_after(a.q); /* written by the kernels before: no load of them above the wait */
	a.sel = kdep_after(a.sel);
	a.n_keys = kdep_after(a.n_keys);
	typedef typename std::conditional<F32, float, uint16_t>::type val_t;
	cg::cluster_group cluster = cg::this_cluster();
	extern __shared__ __align__(16) uint8_t md_sm[];
	const int dim = a.dim, RS = md_rs(dim, F32), C = a.C;
	const md_carve L = md_layout(dim, F32, C, a.tbl_n);
	val_t *kv_s = (val_t *)(md_sm + L.kv); /* [2][TK][RS] */
	float *sred = (float *)(md_sm + L.sred); /* [WARPS][HG][TK] */
	uint16_t *phi = (uint16_t *)(md_sm + L.phi), *plo = (uint16_t *)(md_sm + L.plo); /* [HG][PS] */
	float *corr_s = (float *)(md_sm + L.corr); /* [HG] */
	float *ml_s = (float *)(md_sm + L.ml); /* [HG][2]: read by the cluster's other blocks */
	const uint8_t **addr_s = (const uint8_t **)(md_sm + L.addr); /* [2][TK] */
	int32_t *tbl_s = (int32_t *)(md_sm + L.tbl);
	__shared__ int last_s;

	const int split = blockIdx.x;
	const int64_t row = blockIdx.y / a.n_hg;
	const int h0 = (int)(blockIdx.y % a.n_hg) * MD_HG;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int g = lane >> 2, t = lane & 3; /* mma fragment coordinates */
	const int k0 = split * a.chunk;

	/* every input of the first tile at once: the key count, the table index, this tile's top-k
	 * entries, q's fragments (below); the block-table lookups wait only for the first two */
	const int64_t nk_raw = a.n_keys ? (int64_t)a.n_keys[row] : a.pos0 + row + 1;
	const int32_t tbl = a.qseq ? a.qseq[row] : 0;
	int32_t sel0 = -1;
	if (a.sel && warp == 0 && lane < MD_TK && k0 + lane < a.ld_sel && k0 + lane < a.max_keys)
		sel0 = a.sel[row * a.ld_sel + k0 + lane];
	int64_t nk64 = nk_raw;
	if (nk64 < 0 || nk64 > a.max_keys) {
		if (tid == 0 && split == 0 && h0 == 0)
			atomicAdd(a.err, 1u);
		nk64 = nk64 < 0 ? 0 : a.max_keys;
	}
	const int nk = (int)nk64;
	const int k1 = min(nk, k0 + a.chunk);
	const int ntiles = k1 > k0 ? (k1 - k0 + MD_TK - 1) / MD_TK : 0;
	/* the addresses of tile n's rows (lanes 0..15 of warp 0); tile 0 uses sel0 */
	auto fill_addr = [&](int n, int st) {
		if (warp == 0 && lane < MD_TK) {
			const int j = k0 + n * MD_TK + lane;
			const uint8_t *p = NULL;
			if (j < k1) {
				int64_t pos = j;
				if (a.sel)
					pos = j < a.ld_sel ? (n == 0 ? sel0 : a.sel[row * a.ld_sel + j]) : -1;
				p = md_key_row(a, tbl_s, tbl, pos);
				if (!p)
					atomicAdd(a.err, 1u);
			}
			addr_s[st * MD_TK + lane] = p;
		}
	};
	const int nchunk = dim * (int)sizeof(val_t) / 16; /* 16-byte pieces per row */
	auto issue = [&](int st) {
		for (int i = tid; i < MD_TK * nchunk; i += MD_THREADS) {
			const int r = i / nchunk, c = i - r * nchunk;
			const uint8_t *p = addr_s[st * MD_TK + r];
			uint8_t *dst = (uint8_t *)(kv_s + (st * MD_TK + r) * RS) + 16 * c;
			if (p)
				katt_cp16(dst, p + 16 * c);
			else
				*(uint4 *)dst = make_uint4(0, 0, 0, 0);
		}
		katt_cp_commit();
	};

	/* q fragments (A of QK^T: rows = heads, k = dims) for this warp's dim steps ks = warp + 4 i */
	const int nks = dim / 16;
	uint32_t qh[MD_KSW][4], ql[MD_KSW][4];
	{
		float2 qv[MD_KSW][4];
#pragma unroll
		for (int i = 0; i < MD_KSW; i++) {
			const int ks = warp + MD_WARPS * i;
#pragma unroll
			for (int r = 0; r < 4; r++) {
				const int h = h0 + g + ((r & 1) ? 8 : 0);
				const int col = ks * 16 + 2 * t + ((r & 2) ? 8 : 0);
				qv[i][r] = ks < nks && h < a.H
				               ? *(const float2 *)(a.q + (row * a.H + h) * (int64_t)dim + col)
				               : make_float2(0.0f, 0.0f);
			}
		}
		/* tile 0's addresses: without a preloaded table (decode) warp 0 looks its rows up now,
		 * its q loads in flight, while the other warps wait for theirs; with a table (prefill),
		 * after the barrier below */
		if (ntiles > 0 && a.tbl_n == 0)
			fill_addr(0, 0);
		/* the table row (prefill rows: one table, qseq NULL), loads issued after q's */
		if (a.tbl_n > 0) {
			const int32_t *tr = a.blocks + (int64_t)tbl * a.ld_blocks;
			for (int i = tid; i < a.tbl_n; i += 4 * MD_THREADS) {
				int32_t v[4];
#pragma unroll
				for (int u = 0; u < 4; u++)
					v[u] = i + u * MD_THREADS < a.tbl_n ? tr[i + u * MD_THREADS] : 0;
#pragma unroll
				for (int u = 0; u < 4; u++)
					if (i + u * MD_THREADS < a.tbl_n)
						tbl_s[i + u * MD_THREADS] = v[u];
			}
		}
#pragma unroll
		for (int i = 0; i < MD_KSW; i++)
#pragma unroll
			for (int r = 0; r < 4; r++)
				katt_split2(qv[i][r].x, qv[i][r].y, &qh[i][r], &ql[i][r]);
	}
	__syncthreads(); /* tbl_s, addr_s */
	if (ntiles > 0 && a.tbl_n > 0) {
		fill_addr(0, 0);
		__syncthreads();
	}
	if (ntiles > 0)
		issue(0);

	const int cw = C / MD_WARPS, ntw = cw / 8; /* PV channels and n-tiles of this warp (ntw even) */
	float oacc[MD_NTW][4];
#pragma unroll
	for (int j = 0; j < MD_NTW; j++)
		oacc[j][0] = oacc[j][1] = oacc[j][2] = oacc[j][3] = 0.0f;
	/* softmax role: 8 threads per head, 2 keys each; running max / sum kept by all 8 */
	const int sh = tid >> 3, sk = (tid & 7) * 2;
	float m_run = -INFINITY, l_run = 0.0f;

	for (int n = 0; n < ntiles; n++) {
		const int st = n & 1;
		if (n + 1 < ntiles)
			fill_addr(n + 1, st ^ 1);
		__syncthreads();
		if (n + 1 < ntiles) {
			issue(st ^ 1);
			katt_cp_wait<1>();
		} else {
			katt_cp_wait<0>();
		}
		__syncthreads();
		const val_t *kt = kv_s + st * MD_TK * RS;

		/* S = Q K^T over this warp's dim steps: 2 n-tiles of 8 keys, hi and lo apart */
		float sh_acc[2][4], sl_acc[2][4];
#pragma unroll
		for (int j = 0; j < 2; j++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				sh_acc[j][e] = sl_acc[j][e] = 0.0f;
#pragma unroll
		for (int i = 0; i < MD_KSW; i++) {
			const int ks = warp + MD_WARPS * i;
			if (ks < nks) {
				if constexpr (F32) {
#pragma unroll
					for (int j = 0; j < 2; j++) {
						const float *kr =
						    (const float *)kt + (8 * j + g) * RS + ks * 16 + 2 * t;
						const float2 x = *(const float2 *)kr,
						             y = *(const float2 *)(kr + 8);
						uint32_t bh0, bl0, bh1, bl1;
						katt_split2(x.x, x.y, &bh0, &bl0);
						katt_split2(y.x, y.y, &bh1, &bl1);
						katt_mma(sh_acc[j], qh[i], bh0, bh1);
						katt_mma(sl_acc[j], ql[i], bh0, bh1);
						katt_mma(sl_acc[j], qh[i], bl0, bl1);
					}
				} else {
					uint32_t b[4];
					katt_ldm_keys2(b, (const uint16_t *)kt, RS, 0, ks * 16, lane);
					katt_mma(sh_acc[0], qh[i], b[0], b[1]);
					katt_mma(sl_acc[0], ql[i], b[0], b[1]);
					katt_mma(sh_acc[1], qh[i], b[2], b[3]);
					katt_mma(sl_acc[1], ql[i], b[2], b[3]);
				}
			}
		}
		float *sw = sred + warp * MD_HG * MD_TK;
#pragma unroll
		for (int j = 0; j < 2; j++) {
			*(float2 *)(sw + g * MD_TK + 8 * j + 2 * t) =
			    make_float2(sh_acc[j][0] + sl_acc[j][0], sh_acc[j][1] + sl_acc[j][1]);
			*(float2 *)(sw + (g + 8) * MD_TK + 8 * j + 2 * t) =
			    make_float2(sh_acc[j][2] + sl_acc[j][2], sh_acc[j][3] + sl_acc[j][3]);
		}
		__syncthreads();

		/* online softmax of head sh over keys sk, sk + 1 of the tile */
		katt_tile_softmax<MD_TK, MD_WARPS, MD_HG>(sred, addr_s + st * MD_TK, a.scale, sh, sk,
		                                          (tid & 7) == 0, &m_run, &l_run, phi, plo, MD_PS,
		                                          corr_s);
		__syncthreads();

		/* O = O * corr + P V over this warp's channels (one k-step of 16 keys) */
		{
			const float c0 = corr_s[g], c8 = corr_s[g + 8];
#pragma unroll
			for (int j = 0; j < MD_NTW; j++) {
				oacc[j][0] *= c0;
				oacc[j][1] *= c0;
				oacc[j][2] *= c8;
				oacc[j][3] *= c8;
			}
			uint32_t ah[4], al[4];
			katt_p_frags(phi, plo, MD_PS, g, t, 0, ah, al);
			if constexpr (F32) {
				/* B = V rows 2t, 2t + 1 (b0) and 2t + 8, 2t + 9 (b1), column = channel */
				const float *vr = (const float *)kt + 2 * t * RS + warp * cw + g;
#pragma unroll
				for (int j = 0; j < MD_NTW; j++) {
					if (j < ntw) {
						const float *v = vr + 8 * j;
						uint32_t bh0, bl0, bh1, bl1;
						katt_split2(v[0], v[RS], &bh0, &bl0);
						katt_split2(v[8 * RS], v[9 * RS], &bh1, &bl1);
						katt_mma(oacc[j], ah, bh0, bh1);
						katt_mma(oacc[j], al, bh0, bh1);
						katt_mma(oacc[j], ah, bl0, bl1);
					}
				}
			} else {
				/* matrices (transposed): keys 0-7 / 8-15 x channels c, then c + 8 */
				const val_t *vb = kt + (((lane >> 3) & 1) * 8 + (lane & 7)) * RS + warp * cw +
				                  (lane >> 4) * 8;
#pragma unroll
				for (int j = 0; j < MD_NTW; j += 2) {
					if (j < ntw)
						katt_pv_ldm2<true>(oacc[j], oacc[j + 1], ah, al, vb + 8 * j,
						                   true);
				}
			}
		}
		__syncthreads(); /* the next iteration refills this stage, the scores and p */
	}

	/* ---- this block's (max, sum, acc) to shared memory; the KV tiles are free now ---- */
	const int OS = md_os(C);
	float *o_s = (float *)kv_s; /* [HG][OS] */
	if ((tid & 7) == 0) {
		ml_s[2 * sh] = m_run;
		ml_s[2 * sh + 1] = l_run;
	}
#pragma unroll
	for (int j = 0; j < MD_NTW; j++) {
		if (j < ntw) {
			const int cc = warp * cw + 8 * j + 2 * t;
			*(float2 *)(o_s + g * OS + cc) = make_float2(oacc[j][0], oacc[j][1]);
			*(float2 *)(o_s + (g + 8) * OS + cc) = make_float2(oacc[j][2], oacc[j][3]);
		}
	}
	const kmla_merge_out mo = {a.out, a.pacc, a.pml, a.tickets, C, a.ncl};
	kmla_cluster_merge<MD_HG, MD_THREADS, MD_CL>(cluster, mo, ml_s, o_s, OS, &last_s, row * a.H + h0,
	                                             min(MD_HG, a.H - h0));
#else
	__trap(); /* not launched below sm_90 (kmla_dec_launch checks the device) */
#endif
}

/* TANDEM_MLA_DEC: unset -> -1, the default: only one (row, head group) pair of a sparse layer (a
 * top-k list) whose splits fit one wave of SMs, the one shape where the H200 measured this kernel
 * no slower (19:30 run: B1 top-2048 13.1 us vs 13.1, in the model's nsys 16.6 vs 14.5 + 4.3 us;
 * everything wider 0.52-0.67x of the split kernel); "0" -> never; N -> any shape up to N pairs
 * (A/B). Read on every call (a getenv; at capture only under graphs), so tests can flip it. */
static int md_rows_limit(void)
{
	const char *e = getenv("TANDEM_MLA_DEC");
	if (!e || !*e)
		return -1;
	char *end = NULL;
	const long v = strtol(e, &end, 10);
	if (*end || v < 0)
		return -1;
	return v > 65535 ? 65535 : (int)v;
}

/* Can the device run 8-block clusters of this kernel with its largest shared-memory size (the
 * tables at MD_TBL_MAX entries)? Asked once per kernel and device (an occupancy query, no launch),
 * so a device or driver without them takes the split kernel instead of failing the call. */
static int md_ok_state[64][2]; /* per device and kernel (F32): 0 unknown, 1 usable, 2 not */
template <bool F32> static bool md_cluster_ok(struct kcuda_ctx *c)
{
	int(*ok)[2] = md_ok_state;
	const int dev = c->device >= 0 && c->device < 64 ? c->device : 0;
	if (ok[dev][F32])
		return ok[dev][F32] == 1;
	const size_t smem = md_layout(MD_DMAX, F32, MD_CMAX, MD_TBL_MAX).total;
	int n = 0;
	/* the largest shared-memory carveout: two blocks per SM need ~95 KB of it (the driver may
	 * otherwise pick a smaller one, in favour of L1, that holds one) */
	if (cudaFuncSetAttribute(mla_dec_kernel<F32>, cudaFuncAttributeMaxDynamicSharedMemorySize,
	                         (int)smem) != cudaSuccess ||
	    cudaFuncSetAttribute(mla_dec_kernel<F32>, cudaFuncAttributePreferredSharedMemoryCarveout,
	                         (int)cudaSharedmemCarveoutMaxShared) != cudaSuccess ||
	    kmla_max_clusters((const void *)mla_dec_kernel<F32>, MD_CL, MD_THREADS, smem, c->stream, &n) !=
	        cudaSuccess ||
	    n < 1) {
		(void)cudaGetLastError();
		fprintf(stderr,
		        "kcuda: mla_dec: no %d-block clusters on device %d (%d): the split kernel is used\n",
		        MD_CL, c->device, n);
		ok[dev][F32] = 2;
		return false;
	}
	ok[dev][F32] = 1;
	return true;
}

template <bool F32>
static int md_launch(struct kcuda_ctx *c, const md_args &a, dim3 grid, int cl, size_t smem)
{
	KCUDA_CHECK(cudaFuncSetAttribute(mla_dec_kernel<F32>, cudaFuncAttributeMaxDynamicSharedMemorySize,
	                                 (int)smem));
	cudaError_t e = kmla_cluster_launch(mla_dec_kernel<F32>, grid, MD_THREADS, smem, cl, c->stream, a);
	if (e != cudaSuccess) {
		/* refused at launch (a configuration this device or driver does not take: cluster
		 * dimension, shared memory): switched off for this kernel and device, the caller runs
		 * the split kernel; a sticky error fails the next op anyway */
		(void)cudaGetLastError();
		fprintf(stderr, "kcuda: mla_dec launch refused (%s): the split kernel is used from now on\n",
		        cudaGetErrorString(e));
		md_ok_state[c->device >= 0 && c->device < 64 ? c->device : 0][F32] = 2;
		return ERR_UNSUPPORTED;
	}
	kcuda_n_launch++;
	e = cudaGetLastError();
	if (e == cudaSuccess)
		return 0;
	fprintf(stderr, "kcuda: mla_dec launch failed: %s\n", cudaGetErrorString(e));
	return ERR_CUDA;
}

/* kcuda_mla_attn's small-batch path for a call mm_fits (mla_attn_mma.cu) accepted; ERR_UNSUPPORTED
 * (nothing launched) when switched off, too many rows, or the shape / device does not suit it */
int kmla_dec_launch(struct kcuda_ctx *c, const struct kcuda_kv_view *kv, const struct kcuda_attn_rows *rows,
                    const float *q, int64_t H, int64_t C, float scale, float *out)
{
	const int64_t n_hg = (H + MD_HG - 1) / MD_HG;
	const int64_t nrh = rows->n_q * n_hg;
	const int lim = md_rows_limit();
	if ((lim < 0 ? nrh > 1 || !rows->sel : nrh > lim) || !c->tickets)
		return ERR_UNSUPPORTED;
	if (C % 64 || C > MD_CMAX || kv->dim > MD_DMAX || kv->dim % 16 || (uintptr_t)out % 16 ||
	    (uintptr_t)q % 8 || rows->max_keys < 1 || rows->max_keys > INT32_MAX / 2)
		return ERR_UNSUPPORTED;
	const int major = kcuda_cc_major(c->device), max_smem = kcuda_smem_optin(c->device);
	if (major < 9)
		return ERR_UNSUPPORTED;
	const bool f32 = !kv->bf16;
	/* the table row is preloaded only without qseq (prefill: one table): with it, the row's index
	 * is itself a load, and the preload would cost the round trip it saves */
	const int tbl_n = !rows->qseq && rows->ld_blocks <= MD_TBL_MAX ? (int)rows->ld_blocks : 0;
	const md_carve L = md_layout((int)kv->dim, f32, (int)C, tbl_n);
	if (L.total > (size_t)max_smem ||
	    md_layout(MD_DMAX, f32, MD_CMAX, MD_TBL_MAX).total > (size_t)max_smem ||
	    !(f32 ? md_cluster_ok<true>(c) : md_cluster_ok<false>(c)))
		return ERR_UNSUPPORTED;

	/* splits: about 2 resident blocks per SM in all (~200 registers a thread allow 2), each a whole
	 * number of 16-key tiles; rounded up to whole clusters (the extra splits have no keys) */
	const int64_t tiles = (rows->max_keys + MD_TK - 1) / MD_TK;
	int64_t want = (2 * (int64_t)c->n_sm + nrh - 1) / nrh;
	if (want > tiles)
		want = tiles;
	if (want > (int64_t)MD_NCL_MAX * MD_CL)
		want = (int64_t)MD_NCL_MAX * MD_CL;
	if (want < 1)
		want = 1;
	const int64_t tiles_per = (tiles + want - 1) / want;
	int64_t nsplit = (tiles + tiles_per - 1) / tiles_per;
	/* cluster: all splits when they are at most 8 (a power of two >= nsplit: C / cl channels each),
	 * else 8 and the ticket merge across clusters */
	int cl = 1;
	while (cl < nsplit && cl < MD_CL)
		cl *= 2;
	const int64_t ncl = (nsplit + cl - 1) / cl;
	if (ncl > MD_NCL_MAX || C % cl || (C / cl) % 4)
		return ERR_UNSUPPORTED;
	nsplit = ncl * cl;
	if ((size_t)nrh * (size_t)cl > KCUDA_N_TICKETS || nrh > 65535 || (lim < 0 && nsplit > c->n_sm))
		return ERR_UNSUPPORTED;
	const size_t n_part = ncl > 1 ? (size_t)rows->n_q * (size_t)H * (size_t)ncl : 0;
	if (n_part * ((size_t)C + 2 * (size_t)cl) * sizeof(float) > c->ws_bytes)
		return ERR_UNSUPPORTED;

	md_args a;
	a.base = (const uint8_t *)kv->base;
	a.n_blocks = kv->n_blocks;
	a.block_bytes = kv->block_bytes;
	a.offset = kv->offset;
	a.bt = kv->block_tokens;
	a.dim = (int)kv->dim;
	a.elt = kv->bf16 ? 2 : 4;
	a.qseq = rows->qseq;
	a.blocks = rows->blocks;
	a.n_keys = rows->n_keys;
	a.sel = rows->sel;
	a.ld_blocks = rows->ld_blocks;
	a.pos0 = rows->pos0;
	a.ld_sel = rows->ld_sel;
	a.max_keys = rows->max_keys;
	a.tbl_n = tbl_n;
	a.q = q;
	a.H = (int)H;
	a.C = (int)C;
	a.n_hg = (int)n_hg;
	a.scale = scale;
	a.chunk = (int)(tiles_per * MD_TK);
	a.ncl = (int)ncl;
	a.out = out;
	a.pacc = (float *)c->ws;
	a.pml = a.pacc + n_part * (size_t)C;
	a.tickets = c->tickets;
	a.err = c->err_dev;
	const dim3 grid((unsigned)nsplit, (unsigned)nrh);
	return f32 ? md_launch<true>(c, a, grid, cl, L.total) : md_launch<false>(c, a, grid, cl, L.total);
}

/* For bench_cuda_attn: this kernel's residency on the context's device with the bf16 (or fp32)
 * pool at its GLM-5 size (dim 576, C 512, no table preload): blocks per SM, 8-block clusters at
 * once, registers per thread, dynamic shared memory per block; ERR_UNSUPPORTED where it cannot
 * run. */
extern "C" int kmla_dec_occupancy(struct kcuda_ctx *c, int bf16, int *blocks_per_sm, int *clusters, int *regs,
                                  int *smem)
{
	const bool f32 = !bf16;
	if (!(f32 ? md_cluster_ok<true>(c) : md_cluster_ok<false>(c)))
		return ERR_UNSUPPORTED;
	const size_t sm = md_layout(MD_DMAX, f32, MD_CMAX, 0).total;
	const void *fn = f32 ? (const void *)mla_dec_kernel<true> : (const void *)mla_dec_kernel<false>;
	cudaFuncAttributes fa;
	if (cudaFuncGetAttributes(&fa, fn) != cudaSuccess ||
	    cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, fn, MD_THREADS, sm) != cudaSuccess ||
	    kmla_max_clusters(fn, MD_CL, MD_THREADS, sm, c->stream, clusters) != cudaSuccess) {
		(void)cudaGetLastError();
		return ERR_UNSUPPORTED;
	}
	*regs = fa.numRegs;
	*smem = (int)sm;
	return 0;
}
