/* The decode path of kcuda_moe_ffn on tensor cores (1..256 tokens, no host sync, so CUDA graphs
 * hold it): each expert's weight rows are read once per chunk of up to 8 of its tokens, and the
 * multiply-adds run as mma.sync m16n8k16 (fp16 in, fp32 accumulate) on quant values decoded in
 * registers: the technique of gemv_mma.cuh (measured 1.3-4x faster than the fp32 GEMV on the
 * H200), whose unit bodies run here unchanged (moe_mma_units.cuh) on a lane type whose token
 * columns are gathered through a row-pointer table (the tokens routed to one expert are not
 * contiguous). fp16 range: a unit in which some token's |x| reaches 2^15 (SiLU(g) * u of a test
 * model can pass 65504) is staged again per token times a power of two, undone exactly on the
 * fp32 accumulator (gemv_mma.cuh's vote; until 2026-11-29 every unit was scaled, at the cost of a
 * warp max per token and unit).
 *
 * Launches (all on the context's stream):
 *   sort (one block): pairs (token i, slot j) = i k + j counted per expert, listed per expert
 *     (list order inside an expert is free: every column of an mma is computed on its own), and cut
 *     into chunks (expert, first list entry, count <= CH) where CH = 4 NG tokens fit one n-tile
 *     pair (NG = 1 for <= 4 tokens, else 2); bad ids are counted in err_dev and skipped;
 *   gate_up, grid (F / 16, max chunks): a block of 4 warps owns rows f0..f0+15 of the chunk's
 *     expert in BOTH gate and up (the two row tiles of one warp, R = 2), its warps split D in
 *     256-element units and reduce through shared memory; h[pair][f] = SiLU(gate) * up is formed
 *     there, so gate and up never go through memory; at two n-tiles (mm_gu_w) the block-staged
 *     variant instead: grid (F / 64, max chunks), its 4 warps take 16 rows each over all of D and
 *     share one staging of x a unit (moe_mma_gate_up_blk_kernel);
 *   down, grid (D / (64 R), max chunks): each warp owns 16 R rows of the expert's down matrix and
 *     all of F (per-rank F is short: 256 for GLM-5 / DS-V3 at TP=8), y[pair][d];
 *   combine: out[i] = sum_j w[i][j] y[i k + j] in slot order (deterministic, no atomics); a pair
 *     whose id was out of range gives NaN, as the other paths.
 * Blocks past the actual chunk count exit at once (the grid is sized for the worst case).
 *
 * Fragment layout and quant tricks: bench/gemv_mma.cuh's header (A = 16 rows x 16 k of the
 * weights as exact small integers in fp16, B = up to 4 tokens x (hi, lo) fp16 columns, hi + lo /
 * 2048 carries 22 bits of x). Assumes (moe_mma_fits): D % 256 == 0, F % 256 == 0, x 16-byte
 * aligned with ldx % 4 == 0, weights from kcuda_weight_upload (16-byte aligned, 16 bytes of tail
 * padding: the Q6_K / Q8_0 funnel loads read up to 4 bytes past a row). */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/moe_mma.h"
#include "kernels/cuda/moe_mma_units.cuh"
#include "kernels/cuda/prof.h"

#define MM_WARPS 4

/* The chunk's pair numbers and token rows into shared memory, by threads 0 .. NT - 1: pair p < np_r is
 * routed pair (p / k, p % k), p >= np_r the shared expert's pair of token p - np_r; columns past the
 * chunk's count repeat its first pair (staged as zeros, never stored) */
template <int NT>
__device__ __forceinline__ void mm_chunk_cols(const int4 ch, const int32_t *__restrict__ list, const float *x,
                                              int64_t ldx, int k, int np_r, const float **xr, int *pr)
{
	if (threadIdx.x < NT) {
		const int t = threadIdx.x;
		const int p = list[ch.y + (t < ch.z ? t : 0)];
		pr[t] = p;
		xr[t] = x + (int64_t)(p < np_r ? p / k : p - np_r) * ldx; /* routed pair, or shared: token */
	}
}

/* gate / up row pointers of a lane (rows f0 + 8 hr + g; tile 0 gate, tile 1 up) of the chunk's
 * expert e (E: the shared one) */
__device__ __forceinline__ void mm_gu_rows(const uint8_t *wg, const uint8_t *wu, const uint8_t *sg,
                                           const uint8_t *su, size_t rb, int64_t E, int64_t F, int e,
                                           int64_t f0, int g, const uint8_t *(&rows)[2][2])
{
	const size_t eo = e < E ? (size_t)e * (size_t)F * rb : 0;
	const uint8_t *bg = (e < E ? wg : sg) + eo, *bu = (e < E ? wu : su) + eo;
#pragma unroll
	for (int hr = 0; hr < 2; hr++) {
		rows[0][hr] = bg + ((size_t)f0 + 8 * hr + g) * rb;
		rows[1][hr] = bu + ((size_t)f0 + 8 * hr + g) * rb;
	}
}

/* The chunk's columns (mm_chunk_cols), the warp's staging area cleared (columns of absent tokens stay zero),
 * the accumulators zeroed. Returns false for a block past the chunk count. */
template <int R, int NG, bool MS>
__device__ __forceinline__ bool mm_prologue(const int4 *__restrict__ chunks, const int32_t *__restrict__ list,
                                            const float *x, int64_t ldx, int k, int np_r, mm_stage<NG> &st,
                                            const float **xr, int *pr, int4 &ch, mm_lane<R, NG, MS> &L)
{
	if ((int)blockIdx.y >= chunks[0].x)
		return false;
	ch = chunks[1 + blockIdx.y]; /* (expert, first list entry, count, 0) */
	const int lane = threadIdx.x & 31;
	mm_chunk_cols<4 * NG>(ch, list, x, ldx, k, np_r, xr, pr);
	for (int i = lane; i < NG * 16 * 33; i += 32)
		(&st.b[0][0][0])[i] = make_uint2(0u, 0u);
	if (MS)
		for (int i = lane; i < NG * 32; i += 32)
			(&st.s[0][0])[i] = 0u;
	if (lane < 4 * NG)
		st.f[lane] = 1.0f; /* factor 1: no scale */
	L.g = lane >> 2, L.t = lane & 3, L.lane = lane, L.n_tok = ch.z, L.sm = &st, L.xr = xr;
	L.split = 1, L.hp = NULL, L.hq = NULL, L.hnp = 0, L.hF = 0;
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int g = 0; g < NG; g++)
#pragma unroll
			for (int i = 0; i < 4; i++)
				L.acc[r][g][i] = 0.f;
	__syncthreads();
	return true;
}

/* ---- kernels ------------------------------------------------------------------------------------ */

/* Workspace: [chunks: int4, entry 0 = (count, pairs listed)][list: int32 per pair] */
template <int CH>
__global__ void __launch_bounds__(1024)
    moe_mma_sort_kernel(const int32_t *__restrict__ ids, int np_r, int np, int E, int E_cnt,
                        int4 *__restrict__ chunks, int32_t *__restrict__ list, unsigned *err)
{
	/* pairs np_r .. np - 1 (when E_cnt = E + 1) belong to the shared expert, numbered E */
	extern __shared__ int mm_cnt[]; /* [E_cnt] counts, then [E_cnt] cursors */
	KDEP_ENTRY();
	int *cur = mm_cnt + E_cnt;
	for (int e = threadIdx.x; e < E_cnt; e += blockDim.x)
		mm_cnt[e] = 0;
	__syncthreads();
	for (int i = threadIdx.x; i < np; i += blockDim.x) {
		const int e = i < np_r ? ids[i] : E;
		if (e >= 0 && (e < E || i >= np_r))
			atomicAdd(&mm_cnt[e], 1);
		else
			atomicAdd(err, 1u);
	}
	__syncthreads();
	/* exclusive scans of the counts and the chunk counts over the whole block: thread t owns the
	 * experts [t seg, (t + 1) seg), sums them, the block scans the sums (warps, then the warp
	 * totals), and t writes its experts' cursors and chunks from its base. Until session 12 warp 0
	 * alone walked all E_cnt in steps of 32 while the other 31 warps waited (GLM-5: 9 dependent
	 * steps; ncu: 85 of 98 cycles per issue stalled on the barrier). */
	__shared__ int wsum[2][32];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
	const int seg = (E_cnt + (int)blockDim.x - 1) / (int)blockDim.x;
	const int e0 = (int)threadIdx.x * seg, e1 = min(e0 + seg, E_cnt);
	int tp = 0, tc = 0;
	for (int e = e0; e < e1; e++)
		tp += mm_cnt[e], tc += (mm_cnt[e] + CH - 1) / CH;
	int ip = tp, ic = tc; /* inclusive scans inside the warp */
#pragma unroll
	for (int o = 1; o < 32; o <<= 1) {
		const int a = __shfl_up_sync(0xffffffffu, ip, o), b = __shfl_up_sync(0xffffffffu, ic, o);
		if (lane >= o)
			ip += a, ic += b;
	}
	if (lane == 31)
		wsum[0][warp] = ip, wsum[1][warp] = ic;
	__syncthreads();
	if (warp == 0) { /* the warp totals, exclusive */
		const int vp = lane < nw ? wsum[0][lane] : 0, vc = lane < nw ? wsum[1][lane] : 0;
		int sp = vp, sc = vc;
#pragma unroll
		for (int o = 1; o < 32; o <<= 1) {
			const int a = __shfl_up_sync(0xffffffffu, sp, o),
			          b = __shfl_up_sync(0xffffffffu, sc, o);
			if (lane >= o)
				sp += a, sc += b;
		}
		if (lane < nw)
			wsum[0][lane] = sp - vp, wsum[1][lane] = sc - vc;
	}
	__syncthreads();
	int off = wsum[0][warp] + ip - tp, coff = wsum[1][warp] + ic - tc;
	if (threadIdx.x == blockDim.x - 1)
		chunks[0] = make_int4(coff + tc, off + tp, 0, 0);
	for (int e = e0; e < e1; e++) {
		const int c = mm_cnt[e], nc = (c + CH - 1) / CH;
		cur[e] = off;
		for (int j = 0; j < nc; j++)
			chunks[1 + coff + j] = make_int4(e, off + j * CH, min(CH, c - j * CH), 0);
		off += c, coff += nc;
	}
	__syncthreads();
	for (int i = threadIdx.x; i < np; i += blockDim.x) {
		const int e = i < np_r ? ids[i] : E;
		if (e >= 0 && (e < E || i >= np_r))
			list[atomicAdd(&cur[e], 1)] = i;
	}
}

/* grid (F / 16, chunk slots), W = MM_GU_WARPS(NG) warps: rows f0 .. f0 + 15 of gate (tile 0) and
 * up (tile 1) of the chunk's expert; warp w takes units w, w + W, ... of D; h[pair][f] = SiLU(g) u
 * (kcpu_swiglu's formula). With one n-tile (<= 4 tokens: batch 1 leaves ~1 block per SM) 8 warps
 * keep twice the loads in flight; with two, 8 warps' staging would pass 48 KB of shared memory. */
#define MM_GU_WARPS(NG) ((NG) == 1 ? 8 : 4)
template <int T, int NG, bool MS>
__global__ void __launch_bounds__(MM_GU_WARPS(NG) * 32)
    moe_mma_gate_up_kernel(const uint8_t *__restrict__ wg, const uint8_t *__restrict__ wu,
                           const uint8_t *__restrict__ sg, const uint8_t *__restrict__ su, size_t rb,
                           int64_t E, int64_t F, int64_t n_units, const float *__restrict__ x, int64_t ldx,
                           int k, int np_r, const int4 *__restrict__ chunks, const int32_t *__restrict__ list,
                           float *__restrict__ h)
{
	constexpr int R = 2, NT = 4 * NG, W = MM_GU_WARPS(NG);
	__shared__ float part[W][16 * R][NT];
	__shared__ mm_stage<NG> stage[W];
	__shared__ const float *xr[NT];
	__shared__ int pr[NT];
	KDEP_ENTRY();
	const int warp = threadIdx.x >> 5;
	int4 ch;
	mm_lane<R, NG, MS> L;
	if (!mm_prologue<R, NG, MS>(chunks, list, x, ldx, k, np_r, stage[warp], xr, pr, ch, L))
		return;
	const int64_t f0 = (int64_t)blockIdx.x * 16;
	const uint8_t *rows[R][2];
	mm_gu_rows(wg, wu, sg, su, rb, E, F, ch.x, f0, L.g, rows);
	const bool rb4 = rb % 4 == 0;
	for (int64_t u = warp; u < n_units; u += W)
		mm_unit<T, R, NG>(L, rows, u, rb4);
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int g = 0; g < NG; g++)
#pragma unroll
			for (int hr = 0; hr < 2; hr++)
				part[warp][16 * r + 8 * hr + L.g][4 * g + L.t] =
				    fmaf(L.acc[r][g][2 * hr + 1], 1.f / 2048.f, L.acc[r][g][2 * hr]);
	__syncthreads();
	for (int i = threadIdx.x; i < 16 * NT; i += W * 32) {
		const int rr = i / NT, tok = i % NT;
		if (tok >= ch.z)
			continue;
		float gs = 0.f, us = 0.f;
#pragma unroll
		for (int w = 0; w < W; w++) {
			gs += part[w][rr][tok];
			us += part[w][16 + rr][tok];
		}
		h[(int64_t)pr[tok] * F + f0 + rr] = gs / (1.0f + expf(-gs)) * us;
	}
}

/* The gate / up of moe_mma_gate_up_kernel with x staged ONCE a block and unit (2026-12-03). There,
 * a block's 16 rows of gate and up go through all of D split over its warps, so each warp stages
 * its own units of the chunk's tokens (8 KB of L2 reads a unit at 8 tokens, for 4.6 KB of weights)
 * and the 16 blocks of a chunk stage the same x 16 times: the waste the down kernel had (session
 * 19). Here the block's W warps split F instead (warp w: rows f0 + 16 w .. + 15 of gate and of up,
 * all of D), and the block stages each unit of x once into one of two shared staging areas
 * (mm_stage_x_blk: every thread busy, one barrier a unit: the area of unit u is written again only
 * for unit u + 2, after every warp has passed unit u + 1's barrier, so it is no longer read). A
 * warp's gate and up accumulators of one (row, token) sit in the same lane, so h is formed without
 * a reduction. grid (F / (16 W), chunk slots); the unit bodies are the same (gemv_mma.cuh), the sum
 * over D is one warp's in unit order (the old kernel summed W warps' partials), so the bits differ
 * from moe_mma_gate_up_kernel's within the fp32 rounding of the sums. */
template <int R, int NG, bool MS> struct mm_lane_blk {
	static constexpr bool kMinSums = MS; /* gm_k45_math's mins through the staged sums */
	int g, t, lane, n_tok;
	gm_stage<NG> *sm; /* the staging area of the unit being computed */
	gm_stage<NG> *bufs; /* the block's two */
	const float *const *xr;
	float acc[R][NG][4];
	template <bool K45> __device__ __forceinline__ void stage(int64_t u);
};

/* unit u of every token column into sm by the whole block (gm_stage_x's entries and range vote,
 * block-wide): loads first, all in flight; a unit where some token reaches 2^15 is staged again by
 * warp 0 per token with its own power-of-two factor (rare). Ends with a barrier. */
template <bool K45, int NG, bool MS>
__device__ __forceinline__ void mm_stage_x_blk(gm_stage<NG> &sm, const float *const *xr, int n_tok, int64_t u)
{
	const int nt = n_tok < 4 * NG ? n_tok : 4 * NG, n_ent = 64 * nt;
	uint32_t vote = 0u;
	/* n_ent is a multiple of 64: a warp's lanes are all in a round or all out (gm_stage_sum) */
	for (int e = threadIdx.x; e < n_ent; e += blockDim.x) {
		const float4 v = gm_ldg((const float4 *)(xr[e >> 6] + 256 * u + 4 * (e & 63)));
		vote |= gm_stage_entry<K45, NG>(sm, v, 1.f, e >> 6, e & 63);
		if constexpr (MS)
			gm_stage_sum<NG>(sm, v, 1.f, e >> 6, e & 63, threadIdx.x & 31);
	}
	if ((int)threadIdx.x < nt)
		sm.f[threadIdx.x] = 1.f;
	if (!__syncthreads_or((vote & 0x80008000u) != 0u))
		return;
	if (threadIdx.x < 32) {
		const int lane = threadIdx.x;
		for (int tok = 0; tok < nt; tok++) {
			const float *xt = xr[tok] + 256 * u;
			float m = 0.f;
			for (int q = lane; q < 64; q += 32) {
				const float4 v = gm_ldg((const float4 *)(xt + 4 * q));
				m = fmaxf(
				    m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
			}
			m = kc_warp_max(m);
			const float sc = gm_xscale(m);
			if (lane == 0)
				sm.f[tok] = 1.f / sc;
			for (int q = lane; q < 64; q += 32) {
				const float4 v = gm_ldg((const float4 *)(xt + 4 * q));
				gm_stage_entry<K45, NG>(sm, v, sc, tok, q);
				if constexpr (MS)
					gm_stage_sum<NG>(sm, v, sc, tok, q, lane);
			}
		}
	}
	__syncthreads();
}

template <int R, int NG, bool MS>
template <bool K45>
__device__ __forceinline__ void mm_lane_blk<R, NG, MS>::stage(int64_t u)
{
	sm = bufs + (u & 1);
	mm_stage_x_blk<K45, NG, MS && K45>(*sm, xr, n_tok, u);
}

template <int T, int NG, int W, bool MS>
__global__ void __launch_bounds__(W * 32)
    moe_mma_gate_up_blk_kernel(const uint8_t *__restrict__ wg, const uint8_t *__restrict__ wu,
                               const uint8_t *__restrict__ sg, const uint8_t *__restrict__ su, size_t rb,
                               int64_t E, int64_t F, int64_t n_units, const float *__restrict__ x,
                               int64_t ldx, int k, int np_r, const int4 *__restrict__ chunks,
                               const int32_t *__restrict__ list, float *__restrict__ h)
{
	constexpr int R = 2, NT = 4 * NG;
	__shared__ gm_stage<NG> stage[2];
	__shared__ const float *xr[NT];
	__shared__ int pr[NT];
	KDEP_ENTRY();
	if ((int)blockIdx.y >= chunks[0].x)
		return;
	const int4 ch = chunks[1 + blockIdx.y]; /* (expert, first list entry, count, 0) */
	mm_chunk_cols<NT>(ch, list, x, ldx, k, np_r, xr, pr);
	for (int i = threadIdx.x; i < NG * 16 * 33; i += W * 32) /* absent columns stay zero */
		(&stage[0].b[0][0][0])[i] = make_uint2(0u, 0u),
		(&stage[1].b[0][0][0])[i] = make_uint2(0u, 0u);
	if (threadIdx.x < NT)
		stage[0].f[threadIdx.x] = 1.f, stage[1].f[threadIdx.x] = 1.f;
	if (MS)
		for (int i = threadIdx.x; i < NG * 32; i += W * 32)
			(&stage[0].s[0][0])[i] = 0u, (&stage[1].s[0][0])[i] = 0u;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	mm_lane_blk<R, NG, MS> L;
	L.g = lane >> 2, L.t = lane & 3, L.lane = lane, L.n_tok = ch.z, L.sm = stage, L.bufs = stage,
	L.xr = xr;
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int g = 0; g < NG; g++)
#pragma unroll
			for (int i = 0; i < 4; i++)
				L.acc[r][g][i] = 0.f;
	__syncthreads();
	const int64_t f0 = (int64_t)blockIdx.x * 16 * W + 16 * warp;
	const uint8_t *rows[R][2];
	mm_gu_rows(wg, wu, sg, su, rb, E, F, ch.x, f0, L.g, rows);
	const bool rb4 = rb % 4 == 0;
	for (int64_t u = 0; u < n_units; u++)
		gm_unit<T, R, NG>(L, rows, u, rb4);
#pragma unroll
	for (int g = 0; g < NG; g++)
#pragma unroll
		for (int hr = 0; hr < 2; hr++) {
			const int tok = 4 * g + L.t;
			if (tok >= ch.z)
				continue;
			const float gs = fmaf(L.acc[0][g][2 * hr + 1], 1.f / 2048.f, L.acc[0][g][2 * hr]);
			const float us = fmaf(L.acc[1][g][2 * hr + 1], 1.f / 2048.f, L.acc[1][g][2 * hr]);
			h[(int64_t)pr[tok] * F + f0 + 8 * hr + L.g] = gs / (1.0f + expf(-gs)) * us;
		}
}

/* grid (ceil(D / (64 R RG)), chunk slots): block b's warps take RG groups of 4 consecutive 16 R-row
 * tiles of the chunk's expert (group j: tiles 4 (RG b + j) .. + 3, warp w the w-th; rows clamped at D
 * for loads, not stored), each over all of F; y[pair][d]. With F = 256 (one unit: a TP=8 rank of GLM-5
 * or DeepSeek-V3) a warp stages its tokens' h once and keeps it for its RG tiles (mm_lane::staged):
 * at RG 1 every warp of the 48 blocks a chunk staged the same 8 tokens (8 KB of L2 reads a warp for
 * 4.6 KB of weights; H200 batch 128: down 0.9 TB/s against gate / up's 1.8). */
template <int T, int R, int NG, int RG, bool MS>
__global__ void __launch_bounds__(MM_WARPS * 32)
    moe_mma_down_kernel(const uint8_t *__restrict__ wd, const uint8_t *__restrict__ sd, size_t rb, int64_t E,
                        int64_t D, int64_t n_units, const float *__restrict__ h, int64_t F,
                        const int4 *__restrict__ chunks, const int32_t *__restrict__ list,
                        float *__restrict__ y)
{
	constexpr int NT = 4 * NG;
	__shared__ mm_stage<NG> stage[MM_WARPS];
	__shared__ const float *xr[NT];
	__shared__ int pr[NT];
	KDEP_ENTRY();
	const int warp = threadIdx.x >> 5;
	int4 ch;
	mm_lane<R, NG, MS> L;
	if (!mm_prologue<R, NG, MS>(chunks, list, h, F, 1, INT32_MAX, stage[warp], xr, pr, ch, L))
		return;
	const uint8_t *bd = ch.x < E ? wd + (size_t)ch.x * (size_t)D * rb : sd; /* E: the shared expert */
	const bool rb4 = rb % 4 == 0;
	for (int j = 0; j < RG; j++) {
		const int64_t row0 = (((int64_t)blockIdx.x * RG + j) * MM_WARPS + warp) * 16 * R;
		if (row0 >= D)
			break; /* the warp's later groups are past D too */
		if (j > 0) {
#pragma unroll
			for (int r = 0; r < R; r++)
#pragma unroll
				for (int g = 0; g < NG; g++)
#pragma unroll
					for (int i = 0; i < 4; i++)
						L.acc[r][g][i] = 0.f;
		}
		const uint8_t *rows[R][2];
		MM_FOR_ROWS(R)
		rows[r][hr] = bd + (size_t)min(row0 + 16 * r + 8 * hr + L.g, D - 1) * rb;
		for (int64_t u = 0; u < n_units; u++)
			mm_unit<T, R, NG>(L, rows, u, rb4);
#pragma unroll
		for (int r = 0; r < R; r++)
#pragma unroll
			for (int g = 0; g < NG; g++)
#pragma unroll
				for (int hr = 0; hr < 2; hr++) {
					const int tok = 4 * g + L.t;
					const int64_t d = row0 + 16 * r + 8 * hr + L.g;
					if (tok < ch.z && d < D)
						y[(int64_t)pr[tok] * D + d] =
						    fmaf(L.acc[r][g][2 * hr + 1], 1.f / 2048.f,
						         L.acc[r][g][2 * hr]);
				}
	}
}

/* out[i] = sum_j w[i][j] y[i k + j] in slot order (+ the shared expert's y); a pair with an expert
 * id out of range: NaN */
__global__ void moe_mma_combine_kernel(const float *__restrict__ y, const float *__restrict__ w,
                                       const int32_t *__restrict__ ids, int E, int k, int64_t D,
                                       const float *__restrict__ ysh, float *__restrict__ out, int64_t ldo)
{
	KDEP_ENTRY();
	const int64_t i = blockIdx.y;
	const int64_t d = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (d >= D)
		return;
	float s = 0.0f;
	for (int j = 0; j < k; j++) {
		const int32_t e = ids[i * k + j];
		s = e >= 0 && e < E ? fmaf(w[i * k + j], y[(i * k + j) * D + d], s) : NAN;
	}
	if (ysh) /* the shared expert, weight 1, after the routed ones */
		s += ysh[i * D + d];
	out[i * ldo + d] = s;
}

/* ---- host ------------------------------------------------------------------------------------- */

/* the types moe_small.cu's (and moe_one / moe_persist's) units take */
static bool mm_small_type_ok(int t)
{
	return t == KT_Q4_K || t == KT_Q5_K || t == KT_Q6_K || t == KT_Q8_0;
}

bool moe_mma_type_ok(int t)
{
	return mm_small_type_ok(t) || gm_iq_type(t);
}

/* upper bound of the chunk count: sum_e ceil(c_e / CH) < np / CH + active experts */
static int64_t mm_max_chunks(int64_t np, int64_t E, int ch)
{
	return np / ch + 1 + (np < E ? np : E);
}

/* np: all pairs (routed and shared), E: experts counting the shared one */
static size_t mm_meta_bytes(int64_t np, int64_t E)
{
	return (((size_t)(mm_max_chunks(np, E, 4) + 1) * 16 + (size_t)np * 4) + 255) & ~(size_t)255;
}

static size_t mm_ws_bytes(int64_t np, int64_t E, int64_t F, int64_t D)
{
	return mm_meta_bytes(np, E) + (size_t)np * (size_t)(F + D) * sizeof(float);
}

bool moe_mma_on(void)
{
	const char *v = getenv("TANDEM_MOE_FAST");
	return !v || strcmp(v, "0") != 0;
}

bool moe_mma_fits(const struct kcuda_ctx *c, const float *x, int64_t ldx, int64_t n, int k,
                  const struct kweight *gate, const struct kweight *up, const struct kweight *down, int64_t E,
                  int64_t F)
{
	const int64_t D = gate->n_in;
	return moe_mma_on() && moe_mma_type_ok(gate->type) && moe_mma_type_ok(down->type) && D % 256 == 0 &&
	       F % 256 == 0 && D >= 256 && (uintptr_t)x % 16 == 0 && ldx % 4 == 0 && n >= 1 &&
	       n <= MOE_MMA_MAX_TOKENS && E <= 1024 && (uintptr_t)gate->data % 16 == 0 &&
	       (uintptr_t)up->data % 16 == 0 && (uintptr_t)down->data % 16 == 0 &&
	       mm_ws_bytes(n * (k + 1), E + 1, F, D) <= c->ws_bytes;
}

bool moe_mma_fits_shared(const struct kweight *gate, const struct kweight *down, int64_t F,
                         const struct kweight *sh_gate, const struct kweight *sh_up,
                         const struct kweight *sh_down)
{
	return sh_gate && sh_up && sh_down && sh_gate->data && sh_up->data && sh_down->data &&
	       sh_gate->type == gate->type && sh_up->type == gate->type && sh_down->type == down->type &&
	       sh_gate->n_in == gate->n_in && sh_up->n_in == gate->n_in && sh_gate->n_out == F &&
	       sh_up->n_out == F && sh_down->n_in == F && sh_down->n_out == gate->n_in &&
	       sh_gate->row_bytes == gate->row_bytes && sh_up->row_bytes == gate->row_bytes &&
	       sh_down->row_bytes == down->row_bytes && (uintptr_t)sh_gate->data % 16 == 0 &&
	       (uintptr_t)sh_up->data % 16 == 0 && (uintptr_t)sh_down->data % 16 == 0;
}

static void mm_stage_begin(const char *name, const struct kweight *w, double rows)
{
	if (kprof_active)
		kprof_push(kprof_active, name, w ? ktype_name(w->type) : NULL,
		           w ? rows * (double)w->row_bytes : 0.0);
}
static void mm_stage_end(void)
{
	if (kprof_active)
		kprof_pop(kprof_active);
}

/* what one call needs, gathered for the launch helpers */
struct mm_args {
	const struct kweight *gate, *up, *down;
	const void *sg, *su, *sd; /* shared expert's data, or NULL */
	const float *x;
	int64_t ldx, E, F, D, slots, n; /* n: tokens */
	int k, np_r;
	const int4 *chunks;
	const int32_t *list;
	float *h, *y;
};

/* Warps of the block-staged gate / up (moe_mma_gate_up_blk_kernel) at NG n-tiles, 0 for the kernel
 * whose warps split D. H200, GLM-5 rank 0 of TP=8, graph ms a step at ctx 4096 (docs/PERFORMANCE.md,
 * session 20): at two n-tiles (more pairs than experts) 4 warps took batch 64 from 49.0-50.4 to 45.2-45.8
 * and 128 from 80.5-81.5 to 76.3-76.5 (gate / up 19.2 -> 13.6 ms a step at 128), 8 warps (one block an
 * SM at 162 registers) gained nothing; at one n-tile the old kernel stays: 8 warps made batch 8 15.9-16.1
 * -> 18.2 and 16 25.4-25.9 -> 28.3 (two blocks a chunk leave too few warps, each walking all of D), 4
 * warps 17.3 / 26.7, and batch 32 was equal. TANDEM_MOE_GU_W=0|4|8 forces one (read every call, so
 * the op test runs each; 16 would spill: a 512-thread block gets 128 registers). */
static int mm_gu_w(int ng)
{
	const char *e = getenv("TANDEM_MOE_GU_W");
	const int v = e && *e ? atoi(e) : -1;
	if (v == 0 || v == 4 || v == 8)
		return v;
	return ng == 2 ? 4 : 0;
}

/* The Q4_K / Q5_K mins as one product a unit from the staged sub-block sums (gemv_mma.cuh's
 * gm_stage_sum), not one a 16-element step, and the second n-tile skipped in chunks of <= 4 tokens:
 * half the tensor-core products or fewer, and 14-34 fewer registers (the two-n-tile gate / up 150 ->
 * 128, down 150 -> 124). TANDEM_MOE_MINS (read every call, so the op test runs each) is a mask of
 * where: 1 gate / up at two n-tiles, 2 down at two, 4 gate / up at one, 8 down at one. Default 2:
 * H200 2026-12-04, eager per-op ms a step (tandem bench --profile, rank 0 of TP=8, ctx 4096), mask
 * 0 -> 2: down GLM-5 batch 64 5.40 -> 5.06, 128 8.29 -> 7.43, DeepSeek-V3 64 4.83 -> 4.70, 128 7.11 ->
 * 6.80. The others lose in the step although fewer products is all they change: gate / up at two
 * n-tiles (mask 1) GLM-5 128 13.6 -> 14.7 and 64 7.6 -> 9.3 (with uniform routing, bench_cuda_moe
 * big, it wins: 401 -> 374 us a call at 128), down at one n-tile 3.47 -> 3.54 and gate / up 7.18 ->
 * 7.78 at batch 32: the kernels issue instructions, not products, and the sums cost every staging
 * warp more instructions than the products they save where a staging is not shared. */
template <int T> static bool mm_ms(int ng, bool down)
{
	if (T != KT_Q4_K && T != KT_Q5_K)
		return false;
	const char *e = getenv("TANDEM_MOE_MINS");
	const long v = e && *e ? strtol(e, NULL, 0) : 2;
	return (v >> ((ng == 1 ? 2 : 0) + (down ? 1 : 0))) & 1;
}

template <int T, int NG, int W, bool MS>
static int mm_gate_up_blk_t(struct kcuda_ctx *c, const struct mm_args &a)
{
	dim3 grid((unsigned)(a.F / (16 * W)), (unsigned)a.slots);
	return klaunch("moe_mma_gate_up_blk", moe_mma_gate_up_blk_kernel<T, NG, W, MS>, grid, dim3(W * 32), 0,
	               c->stream, (const uint8_t *)a.gate->data, (const uint8_t *)a.up->data,
	               (const uint8_t *)a.sg, (const uint8_t *)a.su, a.gate->row_bytes, a.E, a.F, a.D / 256,
	               a.x, a.ldx, a.k, a.np_r, a.chunks, a.list, a.h);
}

template <int T, int NG, bool MS> static int mm_gate_up_ms(struct kcuda_ctx *c, const struct mm_args &a)
{
	switch (mm_gu_w(NG)) { /* F % 256 == 0 (moe_mma_fits): whole blocks */
	case 4: return mm_gate_up_blk_t<T, NG, 4, MS>(c, a);
	case 8: return mm_gate_up_blk_t<T, NG, 8, MS>(c, a);
	default: break;
	}
	dim3 grid((unsigned)(a.F / 16), (unsigned)a.slots);
	return klaunch("moe_mma_gate_up", moe_mma_gate_up_kernel<T, NG, MS>, grid, dim3(MM_GU_WARPS(NG) * 32),
	               0, c->stream, (const uint8_t *)a.gate->data, (const uint8_t *)a.up->data,
	               (const uint8_t *)a.sg, (const uint8_t *)a.su, a.gate->row_bytes, a.E, a.F, a.D / 256,
	               a.x, a.ldx, a.k, a.np_r, a.chunks, a.list, a.h);
}

template <int T, int NG> static int mm_gate_up_t(struct kcuda_ctx *c, const struct mm_args &a)
{
	if constexpr (T == KT_Q4_K || T == KT_Q5_K)
		if (mm_ms<T>(NG, false))
			return mm_gate_up_ms<T, NG, true>(c, a);
	return mm_gate_up_ms<T, NG, false>(c, a);
}

/* Row groups a down warp takes with its staged h at n tokens: 4, and 8 from 96 tokens (H200, GLM-5
 * rank 0 of TP=8, graph steps at ctx 4096, docs/PERFORMANCE.md session 19: RG 1 -> 4 took batch 32 from
 * 36.8 to 34.1 ms and 128 from 91.6 to 83.9; 8 gave 81.1 at 128 but was slower at 8 and 16, fewer
 * blocks). TANDEM_MOE_DOWN_RG=1|2|4|8 (read once) forces one; 1 is the kernel before 2026-12-03. */
static int mm_down_rg(int64_t n)
{
	static int forced = -1;
	if (forced < 0) {
		const char *e = getenv("TANDEM_MOE_DOWN_RG");
		const int v = e && *e ? atoi(e) : 0;
		forced = v == 1 || v == 2 || v == 4 || v == 8 ? v : 0;
	}
	return forced ? forced : n >= 96 ? 8 : 4;
}

template <int T, int NG, int RG, bool MS>
static int mm_down_rg_t(struct kcuda_ctx *c, const struct mm_args &a)
{
	/* two row tiles per warp for the light K-quants; Q6_K / Q8_0 need ~230-250 registers at two
	 * (bench_cuda_gemv_mma's table), so one */
	constexpr int R = (T == KT_Q4_K || T == KT_Q5_K) ? 2 : 1;
	const int64_t rows = 64 * R * RG; /* a block's */
	dim3 grid((unsigned)((a.D + rows - 1) / rows), (unsigned)a.slots);
	return klaunch("moe_mma_down", moe_mma_down_kernel<T, R, NG, RG, MS>, grid, dim3(MM_WARPS * 32), 0,
	               c->stream, (const uint8_t *)a.down->data, (const uint8_t *)a.sd, a.down->row_bytes,
	               a.E, a.D, a.F / 256, a.h, a.F, a.chunks, a.list, a.y);
}

template <int T, int NG, bool MS> static int mm_down_ms(struct kcuda_ctx *c, const struct mm_args &a)
{
	switch (mm_down_rg(a.n)) {
	case 1: return mm_down_rg_t<T, NG, 1, MS>(c, a);
	case 2: return mm_down_rg_t<T, NG, 2, MS>(c, a);
	case 8: return mm_down_rg_t<T, NG, 8, MS>(c, a);
	default: return mm_down_rg_t<T, NG, 4, MS>(c, a);
	}
}

template <int T, int NG> static int mm_down_t(struct kcuda_ctx *c, const struct mm_args &a)
{
	if constexpr (T == KT_Q4_K || T == KT_Q5_K)
		if (mm_ms<T>(NG, true))
			return mm_down_ms<T, NG, true>(c, a);
	return mm_down_ms<T, NG, false>(c, a);
}

template <int NG>
static int mm_run(struct kcuda_ctx *c, const float *x, int64_t ldx, int64_t n, const int32_t *ids,
                  const float *weights, int k, const struct kweight *gate, const struct kweight *up,
                  const struct kweight *down, int64_t E, int64_t F, const struct kweight *sh_gate,
                  const struct kweight *sh_up, const struct kweight *sh_down, float *out, int64_t ldo)
{
	constexpr int CH = 4 * NG;
	const bool sh = sh_gate != NULL;
	const int64_t np_r = n * k, np = np_r + (sh ? n : 0), E_cnt = E + (sh ? 1 : 0);
	struct mm_args a;
	a.gate = gate, a.up = up, a.down = down;
	a.sg = sh ? sh_gate->data : NULL, a.su = sh ? sh_up->data : NULL, a.sd = sh ? sh_down->data : NULL;
	a.x = x, a.ldx = ldx, a.E = E, a.F = F, a.D = gate->n_in, a.n = n, a.k = k, a.np_r = (int)np_r;
	a.slots = mm_max_chunks(np, E_cnt, CH);
	int4 *chunks = (int4 *)c->ws;
	a.chunks = chunks;
	a.list = (const int32_t *)(chunks + a.slots + 1);
	a.h = (float *)((char *)c->ws + mm_meta_bytes(np, E_cnt));
	a.y = a.h + np * F;
	const int64_t n_ex = (np_r < E ? np_r : E) + (sh ? 1 : 0);
	int rc = 0;
	mm_stage_begin("moe.experts/sort", NULL, 0);
	rc = klaunch("moe_mma_sort", moe_mma_sort_kernel<CH>, dim3(1), dim3(1024),
	             2 * (size_t)E_cnt * sizeof(int), c->stream, ids, (int)np_r, (int)np, (int)E, (int)E_cnt,
	             chunks, (int32_t *)a.list, c->err_dev);
	mm_stage_end();
	if (rc)
		return rc;
	/* bytes: the experts the pairs can touch at most */
	mm_stage_begin("moe.experts/gate_up(mma)", gate, 2.0 * (double)n_ex * (double)F);
	switch (gate->type) {
	case KT_Q4_K: rc = mm_gate_up_t<KT_Q4_K, NG>(c, a); break;
	case KT_Q5_K: rc = mm_gate_up_t<KT_Q5_K, NG>(c, a); break;
	case KT_Q6_K: rc = mm_gate_up_t<KT_Q6_K, NG>(c, a); break;
	case KT_Q8_0: rc = mm_gate_up_t<KT_Q8_0, NG>(c, a); break;
	case KT_IQ2_XXS: rc = mm_gate_up_t<KT_IQ2_XXS, NG>(c, a); break;
	case KT_IQ2_XS: rc = mm_gate_up_t<KT_IQ2_XS, NG>(c, a); break;
	case KT_IQ2_S: rc = mm_gate_up_t<KT_IQ2_S, NG>(c, a); break;
	case KT_IQ3_XXS: rc = mm_gate_up_t<KT_IQ3_XXS, NG>(c, a); break;
	case KT_IQ3_S: rc = mm_gate_up_t<KT_IQ3_S, NG>(c, a); break;
	case KT_IQ1_S: rc = mm_gate_up_t<KT_IQ1_S, NG>(c, a); break;
	case KT_IQ1_M: rc = mm_gate_up_t<KT_IQ1_M, NG>(c, a); break;
	default: rc = ERR_UNSUPPORTED; break;
	}
	mm_stage_end();
	if (rc)
		return rc;
	mm_stage_begin("moe.experts/down(mma)", down, (double)n_ex * (double)a.D);
	switch (down->type) {
	case KT_Q4_K: rc = mm_down_t<KT_Q4_K, NG>(c, a); break;
	case KT_Q5_K: rc = mm_down_t<KT_Q5_K, NG>(c, a); break;
	case KT_Q6_K: rc = mm_down_t<KT_Q6_K, NG>(c, a); break;
	case KT_Q8_0: rc = mm_down_t<KT_Q8_0, NG>(c, a); break;
	case KT_IQ2_XXS: rc = mm_down_t<KT_IQ2_XXS, NG>(c, a); break;
	case KT_IQ2_XS: rc = mm_down_t<KT_IQ2_XS, NG>(c, a); break;
	case KT_IQ2_S: rc = mm_down_t<KT_IQ2_S, NG>(c, a); break;
	case KT_IQ3_XXS: rc = mm_down_t<KT_IQ3_XXS, NG>(c, a); break;
	case KT_IQ3_S: rc = mm_down_t<KT_IQ3_S, NG>(c, a); break;
	case KT_IQ1_S: rc = mm_down_t<KT_IQ1_S, NG>(c, a); break;
	case KT_IQ1_M: rc = mm_down_t<KT_IQ1_M, NG>(c, a); break;
	default: rc = ERR_UNSUPPORTED; break;
	}
	mm_stage_end();
	if (rc)
		return rc;
	mm_stage_begin("moe.experts/combine", NULL, 0);
	dim3 g3((unsigned)((a.D + 255) / 256), (unsigned)n);
	rc = klaunch("moe_mma_combine", moe_mma_combine_kernel, g3, dim3(256), 0, c->stream, a.y, weights,
	             ids, (int)E, k, a.D, sh ? a.y + np_r * a.D : (const float *)NULL, out, ldo);
	mm_stage_end();
	return rc;
}

int moe_mma_ffn(struct kcuda_ctx *c, const float *x, int64_t ldx, int64_t n, const int32_t *ids,
                const float *weights, int k, const struct kweight *gate, const struct kweight *up,
                const struct kweight *down, int64_t E, int64_t F, const struct kweight *sh_gate,
                const struct kweight *sh_up, const struct kweight *sh_down, float *out, int64_t ldo)
{
	/* one n-tile of 4 tokens (8 warps per gate/up block) while experts average at most one pair
	 * (n k <= E: an expert with more than 4 then costs a second chunk, rare) or no expert can have
	 * more than 4 (n <= 4: ids of one token are distinct); else two (8 tokens per pass over a row).
	 * TANDEM_MOE_MMA_NG=1|2 forces it (bench_cuda_moe's A/B). */
	if (mm_small_type_ok(gate->type) && mm_small_type_ok(down->type) &&
	    moe_small_fits(c, n, k, sh_gate != NULL, F)) /* 1..4 tokens by default: no sort, no combine */
		return moe_small_ffn(c, x, ldx, n, ids, weights, k, gate, up, down, E, F, sh_gate, sh_up,
		                     sh_down, out, ldo);
	const char *f = getenv("TANDEM_MOE_MMA_NG");
	const int ng = f && (f[0] == '1' || f[0] == '2') ? f[0] - '0' : (n <= 4 || n * k <= E ? 1 : 2);
	if (ng == 1)
		return mm_run<1>(c, x, ldx, n, ids, weights, k, gate, up, down, E, F, sh_gate, sh_up, sh_down,
		                 out, ldo);
	return mm_run<2>(c, x, ldx, n, ids, weights, k, gate, up, down, E, F, sh_gate, sh_up, sh_down, out,
	                 ldo);
}
