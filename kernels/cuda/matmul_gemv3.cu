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
 * than G3_Q8_MAX_OUT go to the older kernels (measured faster there). */
#include <cooperative_groups.h>
#include <string.h>

#include "kernels/cuda/matmul_impl.cuh"

namespace cg = cooperative_groups;

#define G3_NW 4 /* warps per block */
/* ring stages per warp (G3_S - 1 slabs in flight): 4 of 4 rows, 8 of one row (narrow outputs:
 * their warps then hold a whole split's K range, up to 7 slabs, in flight at once) */
#define G3_S(RT) ((RT) == 1 ? 8 : 4)
#define G3_MAX_SPLIT 8 /* portable cluster size */

/* slab geometry (g3t), cp.async helpers and the slab decode (g3_decode): matmul_impl.cuh */

/* grid (row tiles, n_split, H), block G3_NW warps; cluster (1, n_split, 1) when n_split > 1.
 * Block (bx, s, h): matrix h (W + h mat_bytes, X + h xhs, Y + h yhs), rows [G3_NW RT bx, + G3_NW RT),
 * slabs [s sps, min((s + 1) sps, n_slab)). */
template <int T, int NT, int RT>
__global__ void __launch_bounds__(G3_NW * 32)
    gemv3_kernel(const uint8_t *__restrict__ w, size_t mat_bytes, size_t row_bytes, int n_out, int n_slab,
                 int sps, const float *__restrict__ x, int64_t ldx, int64_t xhs, int n_tok,
                 float *__restrict__ y, int64_t ldy, int64_t yhs, int pf)
{
	if (!pf)
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
	/* weights only until KDEP_ENTRY() (cuda_common.cuh): the slabs past the ring's first S - 1 go
	 * to L2, the first S - 1 start into the ring, both while the kernel before still runs */
	if (pf && lane < RT && nsl > S - 1 && row0 + lane < n_out) {
		const uint8_t *src = rp[0];
#pragma unroll
		for (int k = 1; k < RT; k++)
			src = lane == k ? rp[k] : src;
		kdep_prefetch_l2(src + (size_t)(S - 1) * SB, (size_t)(nsl - (S - 1)) * SB);
	}

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
	if (pf)
		KDEP_ENTRY();
	xp = kdep_after(xp); /* x only from here on (matmul_impl.cuh) */

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
	             float *, int64_t, int64_t, int) = gemv3_kernel<T, NT, RT>;
	const struct kweight *w = a.w;
	const int rows_blk = G3_NW * RT;
	/* the n_split blocks of a row tile in one cluster (their partials summed through DSMEM) */
	return klaunch_cl(
	    "gemv3", kern,
	    dim3((unsigned)((w->n_out + rows_blk - 1) / rows_blk), (unsigned)n_split, (unsigned)a.H),
	    dim3(G3_NW * 32, 1, 1), (size_t)G3_NW * (G3_S(RT) * RT * g3t<T>::SB + 16), c->stream,
	    n_split > 1 ? dim3(1, (unsigned)n_split, 1) : dim3(0), (const uint8_t *)w->data, a.mat_bytes,
	    w->row_bytes, (int)w->n_out, n_slab, sps, a.x, a.ldx, a.xhs, a.n_tok, a.y, a.ldy, a.yhs,
	    kcuda_prefetch_enabled());
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
 * with K split up to G3_MAX_SPLIT ways, or at 5-8 tokens (the 8-token slots) whatever the block
 * count, else 1; TANDEM_GEMV3_RT=1|4 (read on every call) forces it. At 8 tokens the loads of x
 * bound the one-row warps, not the blocks an SM holds (H200, session 12, synthetic GLM-5 rank 0 of
 * TP=8, batch 8: the F32 router 256 x 6144 12.9 -> 8.1 us a layer as 16 x 8 blocks instead of 64 x
 * 8, v_b's heads 5.6 -> 4.2 us, the step 16.88 / 16.64 -> 16.40 / 16.26 ms; batch 4 the same either
 * way, so 1-4 tokens keep the old rule). Then split K until there are ~4 blocks per SM
 * (each block holds G3_NW (G3_S - 1) RT slabs in flight: Q8_0 RT 4 ~13 KB), at most 8 ways
 * (portable cluster), every split non-empty. */
template <int T> static int g3_plan_launch(struct kcuda_ctx *c, const struct g3_args &a)
{
	const struct kweight *w = a.w;
	const int64_t n_slab = w->n_in / g3t<T>::SE;
	const int64_t n_sm = c->n_sm > 0 ? c->n_sm : 1;
	const char *e = getenv("TANDEM_GEMV3_SPLIT"); /* 0: no K split (no clusters), for A/B and triage */
	const bool cluster_ok = kcuda_cc_major(c->device) >= 9 && !(e && strcmp(e, "0") == 0);
	const int64_t max_split = cluster_ok ? (n_slab < G3_MAX_SPLIT ? n_slab : G3_MAX_SPLIT) : 1;
	const int64_t tiles4 = (w->n_out + 4 * G3_NW - 1) / (4 * G3_NW) * a.H;
	const char *re = getenv("TANDEM_GEMV3_RT"); /* 1 or 4 forces the rows per warp (A/B) */
	int rt = a.n_tok > 4 || tiles4 * max_split >= 2 * n_sm ? 4 : 1;
	if (re && (strcmp(re, "1") == 0 || strcmp(re, "4") == 0))
		rt = atoi(re);
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

/* Widest Q8_0 output gemv3 takes. MEASURED (H200, 2026-11-29 16:15, bench_cuda_gemv_mma glm,
 * gpulogs/run4/bench_gemv.log, cold weights): gemv3 wins on narrow outputs (kv_a 576: 1.07-2.4x,
 * idx_k 128: 1.2-3.8x, k_b / v_b per head 512 / 256: 1.1-3.2x at n_tok 1..8) and loses on the wide
 * ones, where the tensor-core GEMV (matmul_mma.cu) reads faster (q_a / q_b 2048: 0.67-0.96x,
 * idx_q_b 4096: 0.71-1.03x, o 6144: 0.73-1.03x). The crossover lies between 576 and 2048 (not
 * measured in between): 1024. Float weights have no tensor-core GEMV (the fp32 one is slower than
 * gemv3 on every measured shape), so they keep gemv3 at any width. Eight further kernels for the
 * wide ones (bulk-copy rings, persistent grids, K split over warps) all measured slower than the
 * tensor-core GEMV (16:51 run, docs/PERFORMANCE.md) and were removed. */
#define G3_Q8_MAX_OUT 1024

static int g3_run(struct kcuda_ctx *c, const struct g3_args &a)
{
	const struct kweight *w = a.w;
	if (!kcuda_gemv3_enabled() || a.n_tok < 1 || a.n_tok > 8 || a.H < 1 || a.H > 65535 || w->n_out < 1 ||
	    w->n_out > INT32_MAX || (w->type == KT_Q8_0 && w->n_out > G3_Q8_MAX_OUT) ||
	    (uintptr_t)w->data % 16 || (uintptr_t)a.x % 16 || a.ldx % 4 || a.xhs % 4 || w->row_bytes % 16 ||
	    a.mat_bytes % 16)
		return ERR_UNSUPPORTED;
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
	case KT_Q8_0: return g3_plan_launch<KT_Q8_0>(c, a);
	case KT_F32: return g3_plan_launch<KT_F32>(c, a);
	case KT_F16: return g3_plan_launch<KT_F16>(c, a);
	default: return g3_plan_launch<KT_BF16>(c, a);
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
