/* Decode GEMV at the memory limit ("gemv3"): Y[t][r] = dot(W row r, X[t]) for n_tok 1..8 and
 * Q8_0 / F32 / F16 / BF16 weights, fp32 arithmetic throughout (exact weights, fp32 x, fp32
 * accumulation: as exact as the fp32 GEMV, so KCUDA_MM_F32 products that feed a top-k take it).
 *
 * Why another GEMV: at batch 1 the older kernels reached 0.1-1.4 TB/s of the H200's ~4.3 TB/s
 * (docs/PERFORMANCE.md) because too few bytes were in flight: by Little's law ~4.3 TB/s x ~0.8 us
 * = ~3.5 MB, ~26 KB per SM, and narrow products (n_out 32..576) had only a handful of blocks.
 * Here:
 *   - every warp owns RT rows and a range of K; it streams its rows through a private ring of
 *     G3_S(RT) shared-memory stages with cp.async (16-byte copies of the raw row bytes, coalesced,
 *     bypassing L1), so G3_S(RT) - 1 slabs of RT rows are always in flight per warp without
 *     registers; the block layout (34-byte Q8_0 blocks) only matters when reading shared memory;
 *   - a slab is 32 lanes x EPL elements of one row (Q8_0: 256 elements = 272 bytes, F32: 128
 *     elements = 512 bytes, F16/BF16: 256 elements = 512 bytes); lane l always owns elements
 *     EPL l .. EPL l + EPL - 1 of each slab, loads those of X (float4, L1-cached: every warp of
 *     the SM reads the same X) before waiting for the slab, and reuses them for its RT rows;
 *   - K is split over the blocks of a thread-block cluster (grid.y = n_split <= 8, sm_90+):
 *     each block sums its K range, then block 0 of the cluster adds the blocks' partial rows from
 *     their shared memory (DSMEM) in rank order: deterministic, no workspace, no counters, so
 *     graph replays need no reset. Narrow outputs get many blocks this way;
 *   - a block is G3_NW warps with different rows and the same K range (one cluster partial per
 *     block row tile).
 * Q8_0 elements become floats with one PRMT + FADD each (the byte goes into the mantissa of
 * 2^23: exact), not the 16/clock I2F.
 * Assumes (checked by kcuda_gemv3_launch, which refuses with ERR_UNSUPPORTED otherwise):
 * n_in % slab elements == 0, W and X 16-byte aligned, ldx % 4 == 0 (all reads stay inside the
 * rows: no tail padding needed). n_split > 1 only where clusters exist (sm_90+: the host checks).
 * TANDEM_GEMV3=0 (read on every call) turns it off: kcuda_matmul then dispatches as before;
 * TANDEM_GEMV3_SPLIT=0 keeps it but never splits K (no cluster launches). Q8_0 outputs wider
 * than G3_Q8_MAX_OUT go to the older kernels (measured faster there) unless TANDEM_GEMV_BIG picks
 * one of the variants here (g3_big_mode), among them gbig (bulk-copy ring; also Q4_K with
 * TANDEM_GEMV_BIG_K): experiments until a GPU run picks one. */
#include <cooperative_groups.h>
#include <string.h>

#include "kernels/cuda/matmul_impl.cuh"

namespace cg = cooperative_groups;

#define G3_NW 4 /* warps per block */
/* ring stages per warp (G3_S - 1 slabs in flight): 4 of 4 rows, 8 of one row (narrow outputs:
 * their warps then hold a whole split's K range, up to 7 slabs, in flight at once) */
#define G3_S(RT) ((RT) == 1 ? 8 : 4)
#define G3_MAX_SPLIT 8 /* portable cluster size */

/* per-type slab geometry: SE elements, SB bytes per row, EPL elements per lane */
template <int T> struct g3t;
template <> struct g3t<KT_Q8_0> {
	enum { SE = 256, SB = 272, EPL = 8 };
};
template <> struct g3t<KT_F32> {
	enum { SE = 128, SB = 512, EPL = 4 };
};
template <> struct g3t<KT_F16> {
	enum { SE = 256, SB = 512, EPL = 8 };
};
template <> struct g3t<KT_BF16> {
	enum { SE = 256, SB = 512, EPL = 8 };
};
template <> struct g3t<KT_Q4_K> { /* gbig only: one 144-byte super-block per slab */
	enum { SE = 256, SB = 144, EPL = 8 };
};

__device__ __forceinline__ void g3_cp16(void *dst, const void *src)
{
	const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void g3_commit(void)
{
	asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> __device__ __forceinline__ void g3_wait(void)
{
	asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* float of a signed byte: byte k of q ^ 0x80808080 (q + 128) in the mantissa of 2^23, minus
 * 2^23 + 128; exact */
__device__ __forceinline__ float g3_s8f(uint32_t u, int k)
{
	return __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7540u + (unsigned)k)) - 8388736.0f;
}

/* One row's slab at p (shared memory) for this lane: w[0..EPL) and the per-lane scale. */
template <int T> struct g3_row {
	float v[g3t<T>::EPL];
	float d;
	float m; /* Q4_K: the sub-block's dmin * min, subtracted per unit of x */
};
template <int T> __device__ __forceinline__ void g3_decode(const uint8_t *p, int lane, g3_row<T> &o)
{
	if constexpr (T == KT_Q4_K) {
		/* lane l: elements 8 l .. 8 l + 7 = sub-block j = l / 4 (64-group l / 8, the high
		 * nibbles when j is odd), quant bytes 16 + 32 (l / 8) + 8 (l % 4) .. + 7 (8-aligned:
		 * one LDS.64); value = d sc q - dmin m (MODEL-SPEC, ggml get_scale_min_k4) */
		const int j = lane >> 2;
		const uint2 q = *(const uint2 *)(p + 16 + 32 * (lane >> 3) + 8 * (lane & 3));
		const uint32_t sh = 4u * (uint32_t)(j & 1);
		const uint32_t lo = (q.x >> sh) & 0x0F0F0F0Fu, hi = (q.y >> sh) & 0x0F0F0F0Fu;
#pragma unroll
		for (int k = 0; k < 4; k++) {
			o.v[k] = (float)((lo >> (8 * k)) & 0xFFu);
			o.v[4 + k] = (float)((hi >> (8 * k)) & 0xFFu);
		}
		const uint8_t *sc = p + 4;
		int scv, mv;
		if (j < 4) {
			scv = sc[j] & 63;
			mv = sc[j + 4] & 63;
		} else {
			scv = (sc[j + 4] & 15) | ((sc[j - 4] >> 6) << 4);
			mv = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
		}
		o.d = __half2float(*(const __half *)p) * (float)scv;
		o.m = __half2float(*(const __half *)(p + 2)) * (float)mv;
	} else if constexpr (T == KT_Q8_0) {
		/* lane l: block l / 4 (34 bytes: fp16 d, 32 int8), quarter l % 4: 8 bytes at a
		 * 2-byte-aligned offset: three aligned words and two funnel shifts */
		const int bi = lane >> 2, j = lane & 3;
		/* p is 16-byte aligned, so q = p + 34 bi + 2 + 8 j is 2 mod 4 exactly for even bi;
		 * pointer arithmetic (not an integer mask) keeps the loads LDS */
		const int mis = (bi & 1) ? 0 : 2;
		const uint8_t *q = p + 34 * bi + 2 + 8 * j;
		const uint32_t *a = (const uint32_t *)(q - mis);
		const uint32_t sh = 8u * (uint32_t)mis;
		const uint32_t w0 = a[0], w1 = a[1], w2 = sh ? a[2] : 0u;
		const uint32_t q0 = __funnelshift_r(w0, w1, sh) ^ 0x80808080u,
		               q1 = __funnelshift_r(w1, w2, sh) ^ 0x80808080u;
#pragma unroll
		for (int k = 0; k < 4; k++) {
			o.v[k] = g3_s8f(q0, k);
			o.v[4 + k] = g3_s8f(q1, k);
		}
		o.d = __half2float(*(const __half *)(p + 34 * bi));
	} else if constexpr (T == KT_F32) {
		const float4 f = *(const float4 *)(p + 16 * lane);
		o.v[0] = f.x, o.v[1] = f.y, o.v[2] = f.z, o.v[3] = f.w;
		o.d = 1.0f;
	} else {
		const uint4 u = *(const uint4 *)(p + 16 * lane);
		const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
		for (int k = 0; k < 4; k++) {
			if constexpr (T == KT_F16) {
				o.v[2 * k] = kc_h2f((uint16_t)w[k]);
				o.v[2 * k + 1] = kc_h2f((uint16_t)(w[k] >> 16));
			} else {
				o.v[2 * k] = __uint_as_float(w[k] << 16);
				o.v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
			}
		}
		o.d = 1.0f;
	}
}

/* grid (row tiles, n_split, H), block G3_NW warps; cluster (1, n_split, 1) when n_split > 1.
 * Block (bx, s, h): matrix h (W + h mat_bytes, X + h xhs, Y + h yhs), rows [G3_NW RT bx, + G3_NW RT),
 * slabs [s sps, min((s + 1) sps, n_slab)). */
template <int T, int NT, int RT>
__global__ void __launch_bounds__(G3_NW * 32)
    gemv3_kernel(const uint8_t *__restrict__ w, size_t mat_bytes, size_t row_bytes, int n_out, int n_slab,
                 int sps, const float *__restrict__ x, int64_t ldx, int64_t xhs, int n_tok,
                 float *__restrict__ y, int64_t ldy, int64_t yhs)
{
	KDEP_ENTRY();
	w += (size_t)blockIdx.z * mat_bytes;
	x += (int64_t)blockIdx.z * xhs;
	y += (int64_t)blockIdx.z * yhs;
	constexpr int SE = g3t<T>::SE, SB = g3t<T>::SB, EPL = g3t<T>::EPL;
	constexpr int NCH = RT * SB / 16, NCH_L = (NCH + 31) / 32; /* 16-byte copies per slab */
	constexpr int S = G3_S(RT);
	constexpr int RING = S * RT * SB + 16; /* keeps the rings 16-byte aligned and apart */
	extern __shared__ __align__(16) uint8_t g3_smem[];
	__shared__ float part[G3_NW * RT][NT];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int row0 = (blockIdx.x * G3_NW + warp) * RT;
	const int slab0 = blockIdx.y * sps;
	const int nsl = min(sps, n_slab - slab0);
	uint8_t *ring = g3_smem + warp * RING;

	const uint8_t *rp[RT];
#pragma unroll
	for (int r = 0; r < RT; r++)
		rp[r] = w + (size_t)min(row0 + r, n_out - 1) * row_bytes + (size_t)slab0 * SB;
	const float *xp = x + (size_t)slab0 * SE + EPL * lane;

	/* slab i of this block's range into stage i % S */
	auto issue = [&](int i) {
		uint8_t *dst = ring + (i % S) * (RT * SB);
#pragma unroll
		for (int j = 0; j < NCH_L; j++) {
			const int c = lane + 32 * j;
			if (NCH % 32 == 0 || c < NCH) {
				const int r = c / (SB / 16), o = 16 * (c % (SB / 16));
				const uint8_t *src = rp[0]; /* select, not index: rp stays in registers */
#pragma unroll
				for (int k = 1; k < RT; k++)
					src = r == k ? rp[k] : src;
				g3_cp16(dst + r * SB + o, src + (size_t)i * SB + o);
			}
		}
	};
#pragma unroll
	for (int i = 0; i < S - 1; i++) {
		if (i < nsl)
			issue(i);
		g3_commit(); /* empty groups keep the wait count uniform */
	}

	float acc[RT][NT];
#pragma unroll
	for (int r = 0; r < RT; r++)
#pragma unroll
		for (int t = 0; t < NT; t++)
			acc[r][t] = 0.0f;

	for (int i = 0; i < nsl; i++) {
		if (i + S - 1 < nsl)
			issue(i + S - 1);
		g3_commit();
		float xv[NT][EPL];
#pragma unroll
		for (int t = 0; t < NT; t++) {
			if (t < n_tok) {
				const float4 *q = (const float4 *)(xp + t * ldx + (size_t)i * SE);
#pragma unroll
				for (int k = 0; k < EPL / 4; k++) {
					const float4 f = __ldg(q + k);
					xv[t][4 * k] = f.x, xv[t][4 * k + 1] = f.y;
					xv[t][4 * k + 2] = f.z, xv[t][4 * k + 3] = f.w;
				}
			} else {
#pragma unroll
				for (int k = 0; k < EPL; k++)
					xv[t][k] = 0.0f;
			}
		}
		g3_wait<S - 1>(); /* this lane's copies of slab i are done */
		__syncwarp(); /* ... and every lane's are visible */
		const uint8_t *buf = ring + (i % S) * (RT * SB);
#pragma unroll
		for (int r = 0; r < RT; r++) {
			g3_row<T> wr;
			g3_decode<T>(buf + r * SB, lane, wr);
#pragma unroll
			for (int t = 0; t < NT; t++) {
				float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
				for (int k = 0; k < EPL; k += 2) {
					s0 = fmaf(wr.v[k], xv[t][k], s0);
					s1 = fmaf(wr.v[k + 1], xv[t][k + 1], s1);
				}
				acc[r][t] = fmaf(wr.d, s0 + s1, acc[r][t]);
			}
		}
		__syncwarp(); /* stage i % S is refilled in the next iteration */
	}
	g3_wait<0>(); /* no copy may outlive the block (empty groups only, but keep it clean) */

#pragma unroll
	for (int r = 0; r < RT; r++)
#pragma unroll
		for (int t = 0; t < NT; t++) {
			const float s = kc_warp_sum(acc[r][t]);
			if (lane == 0)
				part[warp * RT + r][t] = s;
		}
	const int rb0 = blockIdx.x * G3_NW * RT;
	if (gridDim.y == 1) {
		__syncthreads();
		for (int e = threadIdx.x; e < G3_NW * RT * NT; e += G3_NW * 32) {
			const int r = e / NT, t = e % NT;
			if (t < n_tok && rb0 + r < n_out)
				y[t * ldy + rb0 + r] = part[r][t];
		}
		return;
	}
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	cg::cluster_group cl = cg::this_cluster();
	cl.sync(); /* every block's partials are written */
	if (cl.block_rank() == 0) {
		const int ns = (int)cl.num_blocks();
		for (int e = threadIdx.x; e < G3_NW * RT * NT; e += G3_NW * 32) {
			const int r = e / NT, t = e % NT;
			float s = 0.0f;
			for (int q = 0; q < ns; q++) /* rank order: deterministic */
				s += *cl.map_shared_rank(&part[r][t], q);
			if (t < n_tok && rb0 + r < n_out)
				y[t * ldy + rb0 + r] = s;
		}
	}
	cl.sync(); /* block 0 has read the others' shared memory before they exit */
#endif
}

extern "C" bool kcuda_gemv3_enabled(void)
{
	const char *e = getenv("TANDEM_GEMV3");
	return !(e && strcmp(e, "0") == 0);
}

static int g3_cc_major(int dev)
{
	static int cc[64];
	if (dev < 0 || dev >= 64)
		return 0;
	if (!cc[dev]) {
		int v = 0;
		if (cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
			(void)cudaGetLastError();
			return 0;
		}
		cc[dev] = v;
	}
	return cc[dev];
}

/* the arguments of one launch: H matrices (w0 describes one) */
struct g3_args {
	const struct kweight *w;
	size_t mat_bytes;
	int H;
	const float *x;
	int64_t ldx, xhs;
	int n_tok;
	float *y;
	int64_t ldy, yhs;
};

template <int T, int NT, int RT>
static int g3_launch(struct kcuda_ctx *c, const struct g3_args &a, int n_split, int sps, int n_slab)
{
	void (*kern)(const uint8_t *, size_t, size_t, int, int, int, const float *, int64_t, int64_t, int,
	             float *, int64_t, int64_t) = gemv3_kernel<T, NT, RT>;
	const struct kweight *w = a.w;
	const int rows_blk = G3_NW * RT;
	cudaLaunchAttribute at[2];
	unsigned na = 0;
	if (kcuda_pdl_enabled()) {
		at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
		at[na].val.programmaticStreamSerializationAllowed = 1;
		na++;
	}
	if (n_split > 1) {
		at[na].id = cudaLaunchAttributeClusterDimension;
		at[na].val.clusterDim.x = 1;
		at[na].val.clusterDim.y = (unsigned)n_split;
		at[na].val.clusterDim.z = 1;
		na++;
	}
	cudaLaunchConfig_t cfg = {};
	cfg.gridDim =
	    dim3((unsigned)((w->n_out + rows_blk - 1) / rows_blk), (unsigned)n_split, (unsigned)a.H);
	cfg.blockDim = dim3(G3_NW * 32, 1, 1);
	cfg.dynamicSmemBytes = (size_t)G3_NW * (G3_S(RT) * RT * g3t<T>::SB + 16);
	cfg.stream = c->stream;
	cfg.attrs = at;
	cfg.numAttrs = na;
	cudaError_t e =
	    cudaLaunchKernelEx(&cfg, kern, (const uint8_t *)w->data, a.mat_bytes, w->row_bytes, (int)w->n_out,
	                       n_slab, sps, a.x, a.ldx, a.xhs, a.n_tok, a.y, a.ldy, a.yhs);
	kcuda_n_launch++;
	if (e == cudaSuccess)
		e = cudaGetLastError();
	if (e == cudaSuccess)
		return 0;
	fprintf(stderr, "kcuda: gemv3 launch failed: %s\n", cudaGetErrorString(e));
	return ERR_CUDA;
}

template <int T, int RT>
static int g3_launch_nt(struct kcuda_ctx *c, const struct g3_args &a, int n_split, int sps, int n_slab)
{
	if (a.n_tok == 1)
		return g3_launch<T, 1, RT>(c, a, n_split, sps, n_slab);
	if (a.n_tok == 2)
		return g3_launch<T, 2, RT>(c, a, n_split, sps, n_slab);
	if (a.n_tok <= 4)
		return g3_launch<T, 4, RT>(c, a, n_split, sps, n_slab);
	return g3_launch<T, 8, RT>(c, a, n_split, sps, n_slab);
}

/* Grid shape: RT = 4 rows per warp (X reused 4 times) when that still gives >= 2 blocks per SM
 * with K split up to G3_MAX_SPLIT ways, else 1; then split K until there are ~4 blocks per SM
 * (each block holds G3_NW (G3_S - 1) RT slabs in flight: Q8_0 RT 4 ~13 KB), at most 8 ways
 * (portable cluster), every split non-empty. */
template <int T> static int g3_plan_launch(struct kcuda_ctx *c, const struct g3_args &a, bool one_row)
{
	const struct kweight *w = a.w;
	const int64_t n_slab = w->n_in / g3t<T>::SE;
	if (one_row) { /* TANDEM_GEMV_BIG=2: one row per warp, whole K, no cluster */
		if ((w->n_out + G3_NW - 1) / G3_NW * a.H > 0x7fffffff || n_slab > 0x7fffffff)
			return ERR_UNSUPPORTED;
		return g3_launch_nt<T, 1>(c, a, 1, (int)n_slab, (int)n_slab);
	}
	const int64_t n_sm = c->n_sm > 0 ? c->n_sm : 1;
	const char *e = getenv("TANDEM_GEMV3_SPLIT"); /* 0: no K split (no clusters), for A/B and triage */
	const bool cluster_ok = g3_cc_major(c->device) >= 9 && !(e && strcmp(e, "0") == 0);
	const int64_t max_split = cluster_ok ? (n_slab < G3_MAX_SPLIT ? n_slab : G3_MAX_SPLIT) : 1;
	const int64_t tiles4 = (w->n_out + 4 * G3_NW - 1) / (4 * G3_NW) * a.H;
	const int rt = tiles4 * max_split >= 2 * n_sm ? 4 : 1;
	const int64_t tiles = (w->n_out + rt * G3_NW - 1) / (rt * G3_NW) * a.H;
	int64_t want = (4 * n_sm + tiles - 1) / tiles;
	if (want > max_split)
		want = max_split;
	if (want < 1)
		want = 1;
	const int64_t sps = (n_slab + want - 1) / want;
	const int64_t n_split = (n_slab + sps - 1) / sps;
	if (tiles > 0x7fffffff || n_slab > 0x7fffffff)
		return ERR_UNSUPPORTED;
	if (rt == 4)
		return g3_launch_nt<T, 4>(c, a, (int)n_split, (int)sps, (int)n_slab);
	return g3_launch_nt<T, 1>(c, a, (int)n_split, (int)sps, (int)n_slab);
}

/* ---- gbig: the wide Q8_0 products (TANDEM_GEMV_BIG=3..6) and Q4_K (TANDEM_GEMV_BIG_K) through the
 * bulk copy engine ------------------------------------------------------------------------------
 * (Q4_K: one 144-byte super-block per slab, 16 per chunk; its decode is in g3_decode.)
 * Why (counted, H200, run4 of 2026-11-29; estimates until the variant table is measured): every
 * launch costs ~2.5-3 us before and after its bytes (launch, first DRAM round trip, drain: idx_k's
 * 0.8 MB take 3.0 us in a graph), so a 13.4 MB product at 4.27 TB/s should take ~5.6 us; the old
 * fp32 GEMV takes 7.9: its 15.5 warps per SM hold ~36 KB in flight (enough by Little's law) but each
 * warp loads, waits, computes three times in a row (3 pieces per lane, no prefetch), so three loaded
 * round trips of ~1.8 us follow one another. gemv3's plan for q_a (4 rows per warp, K in 5 splits:
 * 5 slabs per warp, 2 round trips, clusters of 5 blocks) measured 11 us, worse than that count; its
 * likely costs are 272-byte pieces of 4 rows 6.5 KB apart (poor DRAM page locality, a half sector
 * fetched twice), the cluster barriers and co-scheduling, and ~5 LDS per row and slab with 2-4-way
 * bank conflicts on the 34-byte blocks. gbig asks for whole rows in 2.2 KB pieces, all at once.
 * Every warp owns tiles of RT rows with their whole K range: tiles gw, gw + GW, ... (gw the warp's
 * index in the grid, GW the grid's warps: one tile per warp, or a persistent grid of a few blocks
 * per SM whose warps walk several tiles). Lane 0 asks the Hopper bulk copy engine (cp.async.bulk,
 * completion counted in bytes on an mbarrier) for chunks of gb_cs slabs (Q8_0: 8 x 272 = 2176 bytes
 * per row) into a ring of GB_S stages; the ring runs on across the warp's tiles, so up to GB_S chunks
 * per row are always in flight, one instruction per row and chunk: at 16 one-row warps per SM that
 * is a whole 6144-element row (3 chunks, 6.5 KB) per warp, ~100 KB per SM, where Little's law asks
 * for ~26 KB (gemv3's cp.async ring spends one instruction per 16 bytes and holds 3-7 slabs). The
 * slabs are then read exactly like gemv3's (g3_decode, the same fp32 sums per lane, then the warp;
 * no K split: deterministic). Stage reuse: every lane has read the stage (__syncwarp), lane 0
 * orders those generic-proxy reads before the async-proxy write (fence.proxy.async) and refills
 * it; use k of stage s completes phase k of its mbarrier, waited on with parity k & 1. */
#define GB_S 4 /* ring stages per warp */
/* slabs per chunk: ~2.2 KB per row (Q8_0 8 x 272, Q4_K 16 x 144) */
template <int T> struct gb_cs {
	enum { N = T == KT_Q4_K ? 16 : 8 };
};

__device__ __forceinline__ uint32_t gb_saddr(const void *p)
{
	return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ bool gb_try_wait(uint32_t bar, uint32_t parity)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	uint32_t ok;
	asm volatile("{\n\t.reg .pred p;\n\t"
	             "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
	             "selp.u32 %0, 1, 0, p;\n\t}"
	             : "=r"(ok)
	             : "r"(bar), "r"(parity)
	             : "memory");
	return ok != 0;
#else
	(void)bar, (void)parity;
	return true;
#endif
}

/* grid: any number of blocks of NW warps; warp gw = blockIdx.x NW + warp owns row tiles
 * gw, gw + GW, ... (GW = gridDim.x NW) of RT rows each */
template <int T, int NT, int RT, int NW>
__global__ void __launch_bounds__(NW * 32)
    gbig_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int n_out, int n_slab,
                const float *__restrict__ x, int64_t ldx, int n_tok, float *__restrict__ y, int64_t ldy)
{
	KDEP_ENTRY();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	constexpr int SE = g3t<T>::SE, SB = g3t<T>::SB, EPL = g3t<T>::EPL, GB_CS = gb_cs<T>::N;
	constexpr int RB = GB_CS * SB; /* one row's share of a stage */
	constexpr int STAGE = RT * RB;
	extern __shared__ __align__(128) uint8_t gb_smem[];
	__shared__ __align__(8) uint64_t gb_bar[NW][GB_S];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int n_tiles = (n_out + RT - 1) / RT;
	const int gw = blockIdx.x * NW + warp, GW = gridDim.x * NW;
	if (gw >= n_tiles)
		return; /* nothing below synchronizes more than this warp */
	const int n_chunk = (n_slab + GB_CS - 1) / GB_CS;
	const int n_items = ((n_tiles - 1 - gw) / GW + 1) * n_chunk; /* (tile, chunk) pairs, in order */
	uint8_t *ring = gb_smem + warp * (GB_S * STAGE);
	uint64_t *bar = gb_bar[warp];

	/* item j (tile gw + (j / n_chunk) GW, chunk j % n_chunk) into stage j % GB_S (lane 0 only) */
	auto issue = [&](int j) {
		const int tile = gw + (j / n_chunk) * GW, s0 = (j % n_chunk) * GB_CS;
		const uint32_t bytes = (uint32_t)(min(GB_CS, n_slab - s0) * SB);
		const int st = j % GB_S;
		const uint32_t b = gb_saddr(&bar[st]);
		asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b),
		             "r"(RT * bytes)
		             : "memory");
#pragma unroll
		for (int r = 0; r < RT; r++) {
			const uint8_t *src =
			    w + (size_t)min(tile * RT + r, n_out - 1) * row_bytes + (size_t)s0 * SB;
			asm volatile(
			    "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
			    "%2, [%3];" ::"r"(gb_saddr(ring + st * STAGE + r * RB)),
			    "l"(src), "r"(bytes), "r"(b)
			    : "memory");
		}
	};
	if (lane == 0) {
#pragma unroll
		for (int s = 0; s < GB_S; s++)
			asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(gb_saddr(&bar[s]))
			             : "memory");
		/* the initialized barriers are visible to the bulk copy engine (async proxy) */
		asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
		asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
		for (int j = 0; j < GB_S && j < n_items; j++)
			issue(j);
	}
	__syncwarp();

	float acc[RT][NT];
#pragma unroll
	for (int r = 0; r < RT; r++)
#pragma unroll
		for (int t = 0; t < NT; t++)
			acc[r][t] = 0.0f;

	const float *xp = x + EPL * lane;
	for (int j = 0; j < n_items; j++) {
		const int st = j % GB_S, ch = j % n_chunk;
		const int s0 = ch * GB_CS, ns = min(GB_CS, n_slab - s0);
		while (!gb_try_wait(gb_saddr(&bar[st]), (uint32_t)((j / GB_S) & 1)))
			;
		const uint8_t *buf = ring + st * STAGE;
		for (int sl = 0; sl < ns; sl++) {
			float xv[NT][EPL];
#pragma unroll
			for (int t = 0; t < NT; t++) {
				if (t < n_tok) {
					const float4 *q =
					    (const float4 *)(xp + t * ldx + (size_t)(s0 + sl) * SE);
#pragma unroll
					for (int k = 0; k < EPL / 4; k++) {
						const float4 f = __ldg(q + k);
						xv[t][4 * k] = f.x, xv[t][4 * k + 1] = f.y;
						xv[t][4 * k + 2] = f.z, xv[t][4 * k + 3] = f.w;
					}
				} else {
#pragma unroll
					for (int k = 0; k < EPL; k++)
						xv[t][k] = 0.0f;
				}
			}
			float xs[NT]; /* Q4_K: sum of the lane's x, for the min term */
#pragma unroll
			for (int t = 0; t < NT; t++) {
				xs[t] = 0.0f;
				if constexpr (T == KT_Q4_K) {
#pragma unroll
					for (int k = 0; k < EPL; k++)
						xs[t] += xv[t][k];
				}
			}
#pragma unroll
			for (int r = 0; r < RT; r++) {
				g3_row<T> wr;
				g3_decode<T>(buf + r * RB + sl * SB, lane, wr);
#pragma unroll
				for (int t = 0; t < NT; t++) {
					float s0f = 0.0f, s1f = 0.0f;
#pragma unroll
					for (int k = 0; k < EPL; k += 2) {
						s0f = fmaf(wr.v[k], xv[t][k], s0f);
						s1f = fmaf(wr.v[k + 1], xv[t][k + 1], s1f);
					}
					acc[r][t] = fmaf(wr.d, s0f + s1f, acc[r][t]);
					if constexpr (T == KT_Q4_K)
						acc[r][t] = fmaf(-wr.m, xs[t], acc[r][t]);
				}
			}
		}
		__syncwarp(); /* every lane is done with stage st */
		if (lane == 0 && j + GB_S < n_items) {
			asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
			issue(j + GB_S);
		}
		if (ch == n_chunk - 1) { /* the tile's last chunk: its rows are complete */
			const int row0 = (gw + (j / n_chunk) * GW) * RT;
#pragma unroll
			for (int r = 0; r < RT; r++)
#pragma unroll
				for (int t = 0; t < NT; t++) {
					const float s = kc_warp_sum(acc[r][t]);
					if (lane == 0 && t < n_tok && row0 + r < n_out)
						y[t * ldy + row0 + r] = s;
					acc[r][t] = 0.0f;
				}
		}
	}
#endif
}

/* persistent: as many blocks as fit on the GPU at once (occupancy, at most one tile per warp);
 * else one tile per warp */
template <int T, int NT, int RT>
static int gbig_launch(struct kcuda_ctx *c, const struct g3_args &a, int n_slab, bool persistent)
{
	constexpr int NW = 4 / RT; /* 4 row-warps per block: ~35 KB of ring whatever RT */
	const struct kweight *w = a.w;
	const int64_t tiles = (w->n_out + RT - 1) / RT;
	const size_t smem = (size_t)NW * GB_S * RT * gb_cs<T>::N * g3t<T>::SB;
	int64_t blocks = (tiles + NW - 1) / NW;
	if (persistent) {
		static int per_sm; /* per instantiation; the same on every device of one kind */
		if (!per_sm) {
			int v = 0;
			if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, gbig_kernel<T, NT, RT, NW>,
			                                                  NW * 32, smem) != cudaSuccess ||
			    v < 1) {
				(void)cudaGetLastError();
				v = 1;
			}
			per_sm = v;
		}
		const int64_t cap = (int64_t)per_sm * (c->n_sm > 0 ? c->n_sm : 1);
		if (blocks > cap)
			blocks = cap;
	}
	return klaunch("gemv_big", gbig_kernel<T, NT, RT, NW>, dim3((unsigned)blocks), dim3(NW * 32), smem,
	               c->stream, (const uint8_t *)w->data, w->row_bytes, (int)w->n_out, n_slab, a.x, a.ldx,
	               a.n_tok, a.y, a.ldy);
}

/* rows per warp 1, or by n_tok (1 / 2 / 4 at n_tok 1 / 2..4 / 5..8: X reuse against warps) */
template <int T>
static int gbig_launch_nt(struct kcuda_ctx *c, const struct g3_args &a, bool rows_by_tok, bool persistent)
{
	const struct kweight *w = a.w;
	const int64_t n_slab = w->n_in / g3t<T>::SE;
	/* one row's item count (tiles x chunks) stays far inside int: n_out, n_slab < 2^31 / 8 */
	if (a.H != 1 || g3_cc_major(c->device) < 9 || n_slab > (1 << 24) || w->n_out > (1 << 24))
		return ERR_UNSUPPORTED;
	const int ns = (int)n_slab;
	const int rt = !rows_by_tok || a.n_tok == 1 ? 1 : a.n_tok <= 4 ? 2 : 4;
	if (a.n_tok == 1)
		return gbig_launch<T, 1, 1>(c, a, ns, persistent);
	if (a.n_tok == 2)
		return rt == 1 ? gbig_launch<T, 2, 1>(c, a, ns, persistent)
		               : gbig_launch<T, 2, 2>(c, a, ns, persistent);
	if (a.n_tok <= 4)
		return rt == 1 ? gbig_launch<T, 4, 1>(c, a, ns, persistent)
		               : gbig_launch<T, 4, 2>(c, a, ns, persistent);
	return rt == 1 ? gbig_launch<T, 8, 1>(c, a, ns, persistent)
	               : gbig_launch<T, 8, 4>(c, a, ns, persistent);
}

/* ---- gbig2: gbig with a tile's K range split over the warps of its block (TANDEM_GEMV_BIG=7/8) --
 * More tokens want more rows per warp (X reuse: at one row per warp every slab costs NT x 2 float4
 * loads of X per lane, L1-bound from n_tok 2), but RT rows per warp leave n_out / RT warps: 512 at
 * q_a's 2048 rows and RT 4, one per SM sub-partition. Here a block of GB2_KW warps owns one tile of
 * RT rows, warp k takes chunks k, k + GB2_KW, ... of GB2_CS slabs (Q8_0: 2 x 272 bytes per row,
 * through the same bulk-copy ring as gbig), and the warps' partial rows are added in warp order
 * through shared memory (deterministic). */
#define GB2_CS 2 /* slabs per chunk */
#define GB2_KW 4 /* warps per block (per tile) */

template <int NT, int RT>
__global__ void __launch_bounds__(GB2_KW * 32)
    gbig2_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int n_out, int n_slab,
                 const float *__restrict__ x, int64_t ldx, int n_tok, float *__restrict__ y, int64_t ldy)
{
	KDEP_ENTRY();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	constexpr int SE = g3t<KT_Q8_0>::SE, SB = g3t<KT_Q8_0>::SB, EPL = g3t<KT_Q8_0>::EPL;
	constexpr int RB = GB2_CS * SB; /* one row's share of a stage */
	constexpr int STAGE = RT * RB;
	extern __shared__ __align__(128) uint8_t gb2_smem[];
	__shared__ __align__(8) uint64_t gb2_bar[GB2_KW][GB_S];
	__shared__ float part[GB2_KW][RT][NT];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int row0 = blockIdx.x * RT;
	const int n_chunk = (n_slab + GB2_CS - 1) / GB2_CS;
	const int n_items = warp < n_chunk ? (n_chunk - 1 - warp) / GB2_KW + 1 : 0;
	uint8_t *ring = gb2_smem + warp * (GB_S * STAGE);
	uint64_t *bar = gb2_bar[warp];

	/* this warp's j-th chunk (warp + j GB2_KW) into stage j % GB_S (lane 0 only) */
	auto issue = [&](int j) {
		const int s0 = (warp + j * GB2_KW) * GB2_CS;
		const uint32_t bytes = (uint32_t)(min(GB2_CS, n_slab - s0) * SB);
		const int st = j % GB_S;
		const uint32_t b = gb_saddr(&bar[st]);
		asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b),
		             "r"(RT * bytes)
		             : "memory");
#pragma unroll
		for (int r = 0; r < RT; r++) {
			const uint8_t *src =
			    w + (size_t)min(row0 + r, n_out - 1) * row_bytes + (size_t)s0 * SB;
			asm volatile(
			    "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
			    "%2, [%3];" ::"r"(gb_saddr(ring + st * STAGE + r * RB)),
			    "l"(src), "r"(bytes), "r"(b)
			    : "memory");
		}
	};
	if (lane == 0) {
#pragma unroll
		for (int s = 0; s < GB_S; s++)
			asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(gb_saddr(&bar[s]))
			             : "memory");
		asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
		asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
		for (int j = 0; j < GB_S && j < n_items; j++)
			issue(j);
	}
	__syncwarp();

	float acc[RT][NT];
#pragma unroll
	for (int r = 0; r < RT; r++)
#pragma unroll
		for (int t = 0; t < NT; t++)
			acc[r][t] = 0.0f;

	const float *xp = x + EPL * lane;
	for (int j = 0; j < n_items; j++) {
		const int st = j % GB_S;
		const int s0 = (warp + j * GB2_KW) * GB2_CS, ns = min(GB2_CS, n_slab - s0);
		while (!gb_try_wait(gb_saddr(&bar[st]), (uint32_t)((j / GB_S) & 1)))
			;
		const uint8_t *buf = ring + st * STAGE;
		for (int sl = 0; sl < ns; sl++) {
			float xv[NT][EPL];
#pragma unroll
			for (int t = 0; t < NT; t++) {
				if (t < n_tok) {
					const float4 *q =
					    (const float4 *)(xp + t * ldx + (size_t)(s0 + sl) * SE);
#pragma unroll
					for (int k = 0; k < EPL / 4; k++) {
						const float4 f = __ldg(q + k);
						xv[t][4 * k] = f.x, xv[t][4 * k + 1] = f.y;
						xv[t][4 * k + 2] = f.z, xv[t][4 * k + 3] = f.w;
					}
				} else {
#pragma unroll
					for (int k = 0; k < EPL; k++)
						xv[t][k] = 0.0f;
				}
			}
#pragma unroll
			for (int r = 0; r < RT; r++) {
				g3_row<KT_Q8_0> wr;
				g3_decode<KT_Q8_0>(buf + r * RB + sl * SB, lane, wr);
#pragma unroll
				for (int t = 0; t < NT; t++) {
					float s0f = 0.0f, s1f = 0.0f;
#pragma unroll
					for (int k = 0; k < EPL; k += 2) {
						s0f = fmaf(wr.v[k], xv[t][k], s0f);
						s1f = fmaf(wr.v[k + 1], xv[t][k + 1], s1f);
					}
					acc[r][t] = fmaf(wr.d, s0f + s1f, acc[r][t]);
				}
			}
		}
		__syncwarp(); /* every lane is done with stage st */
		if (lane == 0 && j + GB_S < n_items) {
			asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
			issue(j + GB_S);
		}
	}

#pragma unroll
	for (int r = 0; r < RT; r++)
#pragma unroll
		for (int t = 0; t < NT; t++) {
			const float s = kc_warp_sum(acc[r][t]);
			if (lane == 0)
				part[warp][r][t] = s;
		}
	__syncthreads();
	for (int e = threadIdx.x; e < RT * NT; e += GB2_KW * 32) {
		const int r = e / NT, t = e % NT;
		float s = 0.0f;
#pragma unroll
		for (int k = 0; k < GB2_KW; k++) /* warp order: deterministic */
			s += part[k][r][t];
		if (t < n_tok && row0 + r < n_out)
			y[t * ldy + row0 + r] = s;
	}
#endif
}

template <int NT, int RT> static int gbig2_launch(struct kcuda_ctx *c, const struct g3_args &a, int n_slab)
{
	const struct kweight *w = a.w;
	const size_t smem = (size_t)GB2_KW * GB_S * RT * GB2_CS * g3t<KT_Q8_0>::SB;
	return klaunch("gemv_big2", gbig2_kernel<NT, RT>, dim3((unsigned)((w->n_out + RT - 1) / RT)),
	               dim3(GB2_KW * 32), smem, c->stream, (const uint8_t *)w->data, w->row_bytes,
	               (int)w->n_out, n_slab, a.x, a.ldx, a.n_tok, a.y, a.ldy);
}

/* rows per tile by n_tok (1 / 2 / 4 at n_tok 1 / 2..4 / 5..8), or 4 at every n_tok */
static int gbig2_launch_nt(struct kcuda_ctx *c, const struct g3_args &a, bool rows4)
{
	const struct kweight *w = a.w;
	const int64_t n_slab = w->n_in / g3t<KT_Q8_0>::SE;
	if (a.H != 1 || g3_cc_major(c->device) < 9 || n_slab > (1 << 24) || w->n_out > (1 << 24))
		return ERR_UNSUPPORTED;
	const int ns = (int)n_slab;
	const int rt = rows4 ? 4 : a.n_tok == 1 ? 1 : a.n_tok <= 4 ? 2 : 4;
	if (a.n_tok == 1)
		return rt == 1 ? gbig2_launch<1, 1>(c, a, ns) : gbig2_launch<1, 4>(c, a, ns);
	if (a.n_tok == 2)
		return rt == 2 ? gbig2_launch<2, 2>(c, a, ns) : gbig2_launch<2, 4>(c, a, ns);
	if (a.n_tok <= 4)
		return rt == 2 ? gbig2_launch<4, 2>(c, a, ns) : gbig2_launch<4, 4>(c, a, ns);
	return gbig2_launch<8, 4>(c, a, ns);
}

/* The wide Q8_0 products (n_out > G3_Q8_MAX_OUT: q_a, q_b, idx_q_b, o): which kernel takes them,
 * TANDEM_GEMV_BIG (read on every call), for one GPU run to pick the winner (bench_cuda_gemv_mma glm
 * sweeps them):
 *   0 (default): none here (kcuda_matmul's older kernels: the fp32 GEMV at n_tok 1..2, the
 *      tensor-core GEMV from 3);
 *   1: gemv3 with its own plan (4 rows per warp, K split over a cluster of ~5);
 *   2: gemv3 with one row per warp, whole K, no cluster (8-stage ring: 7 slabs in flight per warp,
 *      16 warps per SM);
 *   3: gbig_kernel (above: the Hopper bulk copy engine fills a per-warp ring of 2176-byte chunks
 *      per row, a whole 6144-element row in flight at once), one row per warp;
 *   4: gbig_kernel with 1 / 2 / 4 rows per warp at n_tok 1 / 2..4 / 5..8 (X reuse against warps);
 *   5, 6: 3, 4 on a persistent grid (the blocks that fit at once; warps walk several tiles with
 *      one ring, so no block ends and restarts between tiles);
 *   7, 8: gbig2 (a tile's K range over the 4 warps of its block, 2-slab chunks), rows per tile
 *      1 / 2 / 4 by n_tok, or 4 at every n_tok. */
#define G3_BIG_MAX 8
static int g3_big_mode(void)
{
	const char *e = getenv("TANDEM_GEMV_BIG");
	const int v = e ? atoi(e) : 0;
	return v >= 0 && v <= G3_BIG_MAX ? v : 0;
}
/* Q4_K at n_tok 1..8, any width, TANDEM_GEMV_BIG_K (read on every call): 0 (default) the older
 * kernels; 1 gbig with 1 / 2 / 4 rows per warp at n_tok 1 / 2..4 / 5..8, one tile per warp; 2 the
 * same on a persistent grid. Weights exact, fp32 sums: d sc sum(q x) - dmin m sum(x) per lane and
 * sub-block, as the fp32 GEMV (quant_piece.cuh) does. */
static int g3_big_k_mode(void)
{
	const char *e = getenv("TANDEM_GEMV_BIG_K");
	const int v = e ? atoi(e) : 0;
	return v >= 0 && v <= 2 ? v : 0;
}

/* Widest Q8_0 output gemv3 takes. MEASURED (H200, 2026-11-29 16:15, bench_cuda_gemv_mma glm,
 * gpulogs/run4/bench_gemv.log, cold weights): gemv3 wins on narrow outputs (kv_a 576: 1.07-2.4x,
 * idx_k 128: 1.2-3.8x, k_b / v_b per head 512 / 256: 1.1-3.2x at n_tok 1..8) and loses on the wide
 * ones, where the tensor-core GEMV (matmul_mma.cu) reads faster (q_a / q_b 2048: 0.67-0.96x,
 * idx_q_b 4096: 0.71-1.03x, o 6144: 0.73-1.03x). The crossover lies between 576 and 2048 (not
 * measured in between): 1024. Float weights have no tensor-core GEMV (the fp32 one is slower than
 * gemv3 on every measured shape), so they keep gemv3 at any width. TANDEM_GEMV_BIG (above) picks
 * another kernel for the wide ones. */
#define G3_Q8_MAX_OUT 1024

static int g3_run(struct kcuda_ctx *c, const struct g3_args &a)
{
	const struct kweight *w = a.w;
	const int big = w->type == KT_Q8_0 && w->n_out > G3_Q8_MAX_OUT ? g3_big_mode() : 0;
	if (w->type == KT_Q8_0 && w->n_out > G3_Q8_MAX_OUT && big == 0)
		return ERR_UNSUPPORTED;
	if (!kcuda_gemv3_enabled() || a.n_tok < 1 || a.n_tok > 8 || a.H < 1 || a.H > 65535 || w->n_out < 1 ||
	    w->n_out > INT32_MAX || (uintptr_t)w->data % 16 || (uintptr_t)a.x % 16 || a.ldx % 4 ||
	    a.xhs % 4 || w->row_bytes % 16 || a.mat_bytes % 16)
		return ERR_UNSUPPORTED;
	if (w->type == KT_Q4_K) { /* gbig only, when TANDEM_GEMV_BIG_K asks for it */
		const int km = g3_big_k_mode();
		if (km == 0 || w->n_in < 256 || w->n_in % 256)
			return ERR_UNSUPPORTED;
		return gbig_launch_nt<KT_Q4_K>(c, a, true, km == 2);
	}
	int se;
	switch (w->type) {
	case KT_Q8_0: se = g3t<KT_Q8_0>::SE; break;
	case KT_F32: se = g3t<KT_F32>::SE; break;
	case KT_F16: se = g3t<KT_F16>::SE; break;
	case KT_BF16: se = g3t<KT_BF16>::SE; break;
	default: return ERR_UNSUPPORTED;
	}
	if (w->n_in < se || w->n_in % se)
		return ERR_UNSUPPORTED;
	switch (w->type) {
	case KT_Q8_0:
		if (big >= 7)
			return gbig2_launch_nt(c, a, big == 8);
		if (big >= 3)
			return gbig_launch_nt<KT_Q8_0>(c, a, big == 4 || big == 6, big >= 5);
		return g3_plan_launch<KT_Q8_0>(c, a, big == 2);
	case KT_F32: return g3_plan_launch<KT_F32>(c, a, false);
	case KT_F16: return g3_plan_launch<KT_F16>(c, a, false);
	default: return g3_plan_launch<KT_BF16>(c, a, false);
	}
}

int kcuda_gemv3_launch(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx, int n_tok,
                       float *y, int64_t ldy)
{
	const struct g3_args a = {w, w->row_bytes * (size_t)w->n_out, 1, x, ldx, 0, n_tok, y, ldy, 0};
	return g3_run(c, a);
}

int kcuda_gemv3_heads(struct kcuda_ctx *c, const struct kweight *w0, size_t mat_bytes, int H, const float *x,
                      int64_t ldx, int64_t xhs, int n_tok, float *y, int64_t ldy, int64_t yhs)
{
	const struct g3_args a = {w0, mat_bytes, H, x, ldx, xhs, n_tok, y, ldy, yhs};
	return g3_run(c, a);
}
