/* The small-batch decode path of kcuda_moe_ffn (1..8 tokens by default): the tensor-core units of
 * moe_mma.cu without its sort and combine launches, two kernels per layer instead of four.
 *
 * Why: at batch 1 the sorted path's one-block sort and its combine cost ~6.6 us each per layer in
 * the 15:31 H200 profile (1.0 ms of a 12.7 ms step) for a few hundred bytes of work: a launch, a
 * dependent global round trip or two, and nothing in flight. Here the (token, slot) pairs are
 * grouped on the fly, inside the kernels that need them:
 *   - pair q is routed pair (q / k, q % k) for q < np_r = n k, else the shared expert's pair of
 *     token q - np_r (expert number E); at most MS_MAX_PAIRS pairs, staged in shared memory;
 *   - a pair LEADS a chunk when the number of earlier pairs of its expert is a multiple of MS_CH;
 *     the chunk is that pair and the next pairs of the same expert, up to MS_CH of them in pair
 *     order (so an expert chosen by several tokens is read once per MS_CH of them, and every valid
 *     pair is in exactly one chunk). A warp finds its chunk with two or three ballots.
 * Launches:
 *   gate_up, grid (F / 16, np, split): block y = pair y; blocks whose pair does not lead exit at once; the
 *     rest are moe_mma.cu's gate_up block (8 warps, rows f0..f0+15 of gate AND up, D split over
 *     the warps, h[pair][f] = SiLU(g) u);
 *   down + combine, grid (D / 16): a block owns 16 output rows of every token; its warps take the
 *     chunks in turn (warp w: leaders w, w + W, ...; every warp reads all of F, one unit for the
 *     GLM-5 / DS-V3 rank slice) and leave y[pair][row] in shared memory; then
 *     out[i][d] = sum_j w[i][j] y[i k + j][d] in slot order (+ the shared expert's y, weight 1)
 *     with the sorted path's formula: deterministic, no partial buffer in memory, no atomics. A
 *     pair with an expert id out of range gives NaN for its token and is counted (block 0).
 * Both kernels start with KDEP_ENTRY and go through klaunch (programmatic dependent launch).
 * One-token chunks (every chunk at batch 1, most at 2..8) of Q4_K / Q5_K experts run on the int8
 * tensor-core unit of k45_i8.cuh (x as three int8 parts: ~3e-7 of max|out| against the fp16 unit's
 * ~8e-7; TANDEM_MOE_I8=0 restores the fp16 unit). Where the FFN norm left x's parts
 * (kfuse_add_rmsnorm_parts) the gate / up units copy them instead of quantizing x again in each of
 * their blocks (the same bits; TANDEM_MOE_XPARTS=0 quantizes).
 * TANDEM_MOE_SMALL=0 turns the path off (the sorted path then takes these batches), and
 * TANDEM_MOE_SMALL_MAX=n moves its upper token count (<= MOE_SMALL_MAX_TOKENS). One token with
 * Q4_K / Q5_K experts goes to moe_one.cu's kernels instead (the same arithmetic, the weights issued
 * up front; TANDEM_MOE_SMALL_V=old keeps these). */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/k45_i8.cuh"
#include "kernels/cuda/matmul_impl.cuh" /* g3_cp16 / g3_commit / g3_wait */
#include "kernels/cuda/moe_mma.h"
#include "kernels/cuda/moe_mma_units.cuh"
#include "kernels/cuda/prof.h"

#define MS_CH 4 /* pairs per chunk: one n-tile of 4 token columns (NG = 1) */
#define MS_MAX_PAIRS 80 /* 8 tokens x (top-8 + the shared expert) = 72 */

/* expert of pair q (E: the shared expert), -1 for an id out of range */
__device__ __forceinline__ int ms_expert(const int32_t *__restrict__ ids, int q, int np_r, int E)
{
	if (q >= np_r)
		return E;
	const int e = ids[q];
	return e >= 0 && e < E ? e : -1;
}

/* Warp-collective: the chunk led by pair p (es: experts of the np pairs, shared memory). Writes
 * its pairs to members[0 .. count - 1] in pair order and returns count, or 0 when p leads no chunk
 * (a bad id, or a pair inside another's chunk). */
__device__ __forceinline__ int ms_chunk(const int *es, int np, int p, int *members, int lane)
{
	const int e = es[p];
	if (e < 0)
		return 0;
	int before = 0;
	for (int q0 = 0; q0 < p; q0 += 32) {
		const int q = q0 + lane;
		before += __popc(__ballot_sync(0xffffffffu, q < p && es[q] == e));
	}
	if (before % MS_CH)
		return 0;
	int cnt = 0;
	for (int q0 = p; q0 < np && cnt < MS_CH; q0 += 32) {
		const int q = q0 + lane;
		const bool m = q < np && es[q] == e;
		const unsigned b = __ballot_sync(0xffffffffu, m);
		const int r = cnt + __popc(b & ((1u << lane) - 1u));
		if (m && r < MS_CH)
			members[r] = q;
		cnt += __popc(b);
	}
	__syncwarp();
	return cnt < MS_CH ? cnt : MS_CH;
}

/* the warp's staging area cleared (absent token columns must be zero), scales 1, accumulators 0 */
template <int R>
__device__ __forceinline__ void ms_lane_init(mm_stage<1> &st, const float *const *xr, int cnt, int lane,
                                             mm_lane<R, 1> &L)
{
	for (int i = lane; i < 16 * 33; i += 32)
		(&st.b[0][0][0])[i] = make_uint2(0u, 0u);
	if (lane < 4)
		st.f[lane] = 1.0f; /* factor 1: no scale */
	L.g = lane >> 2, L.t = lane & 3, L.lane = lane, L.n_tok = cnt, L.sm = &st, L.xr = xr;
	L.split = 1, L.hp = NULL, L.hq = NULL, L.hnp = 0, L.hF = 0;
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int i = 0; i < 4; i++)
			L.acc[r][0][i] = 0.f;
	__syncwarp();
}

/* L2 prefetch flags of the kernels (weights only; results never depend on them) */
#define MS_PF_SHARED 1 /* the shared expert's weights before KDEP_ENTRY (TANDEM_PREFETCH) */
#define MS_PF_ROWS 2 /* after the wait: the block's rows of its routed expert(s) at once */
#define MS_PF_DOWN 4 /* gate / up: a 1 / gridDim.x share of the routed expert's down matrix */
#define MS_I8 8 /* not a prefetch: one-token chunks of Q4_K / Q5_K on the int8 unit (k45_i8.cuh) */
#define MS_XBLK 16 /* not a prefetch: those chunks' x parts staged once a block (TANDEM_MOE_XBLK) */

/* One token's rows of a chunk on the int8 unit (k45_i8.cuh): units u0, u0 + du, ... < u1 of the
 * rows' super-blocks against x (xrow: the token's 256-element units), staged per unit in X (the
 * warp's fp16 staging area, reused: the fp16 path is not taken for this chunk): quantized here, or
 * copied from xg (the token's units made by the norm before, kfuse_add_rmsnorm_parts: the same
 * bits) when not NULL. Returns, in every lane, the dots of rows g (hr 0) and g + 8 (hr 1) of each
 * tile r. */
template <int T, int R>
__device__ __forceinline__ void ms_rows_i8(float (&acc)[R][2], const uint8_t *const (&rows)[R][2],
                                           const float *xrow, const mi8_x *xg, int64_t u0, int64_t u1,
                                           int64_t du, mi8_x &X, int lane)
{
	const int g = lane >> 2, t = lane & 3;
#pragma unroll
	for (int r = 0; r < R; r++)
		acc[r][0] = acc[r][1] = 0.f;
	for (int64_t u = u0; u < u1; u += du) {
		gm_k45_w<T, R> w;
		gm_k45_load<T, R>(w, rows, u, t);
		__syncwarp(); /* the previous unit's reads of X are done */
		if (xg)
			mi8_copy(X, xg + u, lane); /* while the weights load */
		else
			mi8_stage(X, xrow + 256 * u, lane);
		mi8_k45_unit<T, R>(acc, w, X, g, t);
	}
	mi8_rows_sum<R>(acc);
}

/* The same as ms_rows_i8 from x's parts staged ONCE a block (xs: units u0 .. of the chunk's token in
 * shared memory, ms_xblk_issue): no per-unit copy. The first unit's weights are issued before the
 * block waits for the staged parts (xpend: the copies are still in flight; every thread of the block
 * calls this, with or without units, because of that barrier). The same bits as ms_rows_i8. */
template <int T, int R>
__device__ __forceinline__ void ms_rows_i8_blk(float (&acc)[R][2], const uint8_t *const (&rows)[R][2],
                                               const mi8_x *xs, int64_t u0, int64_t u, int64_t u1, int64_t du,
                                               bool xpend, int lane)
{
	const int g = lane >> 2, t = lane & 3;
#pragma unroll
	for (int r = 0; r < R; r++)
		acc[r][0] = acc[r][1] = 0.f;
	gm_k45_w<T, R> w;
	if (u < u1)
		gm_k45_load<T, R>(w, rows, u, t);
	if (xpend) {
		g3_wait<0>();
		__syncthreads(); /* every thread's copies are visible */
	}
	for (; u < u1; u += du) {
		mi8_k45_unit<T, R>(acc, w, xs[u - u0], g, t);
		if (u + du < u1)
			gm_k45_load<T, R>(w, rows, u + du, t);
	}
	mi8_rows_sum<R>(acc);
}

/* One token's x parts, units u0 .. u1 - 1 (src: the token's unit 0), into xs by the block's nthr threads
 * (16-byte cp.async, one commit group; the caller waits) */
__device__ __forceinline__ void ms_xblk_issue(mi8_x *xs, const mi8_x *src, int64_t u0, int64_t u1, int nthr)
{
	constexpr int N16 = (int)(sizeof(mi8_x) / 16);
	const int n16 = (int)(u1 - u0) * N16;
	const uint8_t *s = (const uint8_t *)(src + u0);
	for (int i = (int)threadIdx.x; i < n16; i += nthr)
		g3_cp16((uint8_t *)xs + 16 * i, s + 16 * i);
	g3_commit();
}

/* gate / up block's prefetch, thread `which`: 0 its NF gate rows, 1 its NF up rows (whole rows:
 * split 1 only), 2 its 1 / gridDim.x share of the down matrix dn (down_bytes; split z 0 only) */
__device__ __forceinline__ void ms_prefetch_block(int which, const uint8_t *g, const uint8_t *u,
                                                  const uint8_t *dn, int64_t f0, int NF, size_t rb,
                                                  size_t down_bytes, int S, int z)
{
	if (which < 2 && S == 1)
		kdep_prefetch_l2((which ? u : g) + (size_t)f0 * rb, (size_t)NF * rb);
	else if (which == 2 && dn && z == 0) {
		const size_t G = gridDim.x, b = blockIdx.x;
		const size_t a0 = down_bytes * b / G, a1 = down_bytes * (b + 1) / G;
		kdep_prefetch_l2(dn + a0, a1 - a0);
	}
}

/* grid (F / 16, np, split), W warps (8, or 4: TANDEM_MOE_SMALL_GUW): block y computes h[q][f0 .. f0 + 15] for
 * the pairs q of the chunk pair y leads (none: exits); warp w takes units w, w + W, ... of D for the 16 rows
 * of gate (tile 0) and up (tile 1) */
#define MS_GU_PARAMS                                                                                         \
	const uint8_t *__restrict__ wg, const uint8_t *__restrict__ wu, const uint8_t *__restrict__ sg,      \
	    const uint8_t *__restrict__ su, size_t rb, int E, int64_t F, int64_t n_units,                    \
	    const float *__restrict__ x, int64_t ldx, const int32_t *__restrict__ ids, int k, int np_r,      \
	    int np, float *__restrict__ h, float *__restrict__ hp, const uint8_t *__restrict__ wd,           \
	    const uint8_t *__restrict__ sd, size_t down_bytes, int pf, const mi8_x *xq
#define MS_GU_ARGS                                                                                           \
	wg, wu, sg, su, rb, E, F, n_units, x, ldx, ids, k, np_r, np, h, hp, wd, sd, down_bytes, pf, xq
template <int T, int W, int R, bool DB> __device__ __forceinline__ void ms_gate_up_body(MS_GU_PARAMS)
{
	/* R 2: rows f0 .. f0 + 15 of gate (tile 0) and up (tile 1); R 1 (TANDEM_MOE_SMALL_HALF=1): ONE
	 * tile, rows f0 .. f0 + 7 of gate as its upper half and of up as its lower half: half the math
	 * per unit and ~70 instead of ~117 registers, so twice the blocks and ~28 resident warps per SM */
	constexpr int NF = 8 * R; /* f rows per block */
	__shared__ float part[W][16 * R][4];
	__shared__ __align__(16) mm_stage<1> stage[W];
	__shared__ const float *xr[4];
	__shared__ const mi8_x *xg; /* the chunk's token's int8 parts (xq), or NULL */
	__shared__ int es[MS_MAX_PAIRS], mem[MS_CH], s_cnt;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, p = (int)blockIdx.y;
	const int64_t f0 = (int64_t)blockIdx.x * NF;
	const int S = (int)gridDim.z, z = (int)blockIdx.z; /* split z: units u0 .. u1 - 1 of D */
	/* The shared expert's weights before the wait (weights only: cuda_common.cuh): a shared pair
	 * leads its chunk when the number of shared pairs before it is a multiple of MS_CH (routed
	 * pairs never name expert E), known without the ids */
	if ((pf & MS_PF_SHARED) && p >= np_r && (p - np_r) % MS_CH == 0 && threadIdx.x < 3)
		ms_prefetch_block(threadIdx.x, sg, su, sd, f0, NF, rb, down_bytes, S, z);
	KDEP_ENTRY();
	const int64_t u0 = n_units * z / S, u1 = n_units * (z + 1) / S;
	/* One-token chunks on the int8 unit read x's parts. They are staged once a block into the fp16
	 * staging area (unused on that path) instead of copied by every warp for every unit: the copies
	 * were the longest wait of the kernel (Nsight Compute, H200, session 22: a third of the warps'
	 * stall samples on the shared stores behind them, every block of the grid reading the same ~21 KB).
	 * With one token in the call its parts are known now, so they load while the block routes. */
	bool xblk = false; /* block-uniform; one-tile blocks only (batch 1-2: ms_half), since the
	                    * two-tile body at 3-8 tokens went from 126 to 162 registers with it */
	if constexpr ((T == KT_Q4_K || T == KT_Q5_K) && R == 1)
		xblk = (pf & MS_I8) && (pf & MS_XBLK) && xq &&
		       (size_t)(u1 - u0) * sizeof(mi8_x) <= sizeof(stage);
	bool xpend = false; /* copies issued, not yet waited for */
	if (xblk && k > 0 && np_r == k) { /* one token (np_r = n k) */
		ms_xblk_issue((mi8_x *)&stage[0], xq, u0, u1, W * 32);
		xpend = true;
	}
	for (int i = threadIdx.x; i < np; i += W * 32)
		es[i] = ms_expert(ids, i, np_r, E);
	__syncthreads();
	if (warp == 0) {
		const int cnt = ms_chunk(es, np, p, mem, lane);
		if (lane == 0)
			s_cnt = cnt;
		if (cnt && lane < 4) {
			const int q = mem[lane < cnt ? lane : 0];
			const int64_t tok = q < np_r ? q / k : q - np_r; /* the pair's token */
			xr[lane] = x + tok * ldx;
			if (lane == 0)
				xg = xq ? xq + tok * n_units : NULL;
		}
	}
	__syncthreads();
	const int cnt = s_cnt, e = es[p];
	if (!cnt) {
		if (xpend)
			g3_wait<0>(); /* no copy outlives the block */
		return;
	}
	const size_t eo = e < E ? (size_t)e * (size_t)F * rb : 0; /* expert E: the shared one */
	const uint8_t *bg = (e < E ? wg : sg) + eo, *bu = (e < E ? wu : su) + eo;
	/* a routed expert's rows of this block (and a share of its down matrix) in flight at once: the
	 * warps walk their units one after another, each a dependent round trip */
	if ((pf & MS_PF_ROWS) && e < E && threadIdx.x < 3)
		ms_prefetch_block(threadIdx.x, bg, bu, (pf & MS_PF_DOWN) ? wd + (size_t)e * down_bytes : NULL,
		                  f0, NF, rb, down_bytes, S, z);
	bool i8 = false;
	if constexpr (T == KT_Q4_K || T == KT_Q5_K)
		i8 = (pf & MS_I8) && cnt == 1; /* one token: the int8 unit */
	if (!i8 && xpend) { /* the fp16 path clears the staging area: the copies must have landed */
		g3_wait<0>();
		__syncthreads();
		xpend = false;
	}
	xblk = xblk && i8 && xg;
	if (xblk && !xpend) { /* several tokens in the call: this chunk's token is known only now */
		ms_xblk_issue((mi8_x *)&stage[0], xg, u0, u1, W * 32);
		xpend = true;
	}
	mm_lane<R, 1> L;
	if (i8) /* the unit stages in its own layout: no fp16 staging to clear */
		L.g = lane >> 2, L.t = lane & 3, L.lane = lane;
	else
		ms_lane_init<R>(stage[warp], xr, cnt, lane, L);
	const uint8_t *rows[R][2];
	if (R == 2) {
#pragma unroll
		for (int hr = 0; hr < 2; hr++) {
			rows[0][hr] = bg + ((size_t)f0 + 8 * hr + L.g) * rb;
			rows[R - 1][hr] = bu + ((size_t)f0 + 8 * hr + L.g) * rb;
		}
	} else {
		rows[0][0] = bg + ((size_t)f0 + L.g) * rb;
		rows[0][1] = bu + ((size_t)f0 + L.g) * rb;
	}
	const bool rb4 = rb % 4 == 0;
	if constexpr (T == KT_Q4_K || T == KT_Q5_K)
		if (i8) {
			float a8[R][2];
			if (R == 1 && xblk)
				ms_rows_i8_blk<T, R>(a8, rows, (const mi8_x *)&stage[0], u0, u0 + warp, u1, W,
				                     xpend, lane);
			else
				ms_rows_i8<T, R>(a8, rows, xr[0], xg, u0 + warp, u1, W,
				                 *(mi8_x *)&stage[warp], lane);
#pragma unroll
			for (int r = 0; r < R; r++)
#pragma unroll
				for (int hr = 0; hr < 2; hr++)
					if (L.t == 0)
						part[warp][16 * r + 8 * hr + L.g][0] = a8[r][hr];
		}
	if (!i8) {
		if constexpr ((T == KT_Q4_K || T == KT_Q5_K) && DB) {
			{ /* TANDEM_MOE_DB=1: the next unit's weight words load while this one computes */
				gm_k45_w<T, R> wa, wb;
				int64_t u = u0 + warp;
				if (u < u1)
					gm_k45_load<T, R>(wa, rows, u, L.t);
				for (; u < u1; u += 2 * W) { /* two units per trip: no register copies */
					if (u + W < u1)
						gm_k45_load<T, R>(wb, rows, u + W, L.t);
					gm_k45_math<T, R, 1>(L, wa, u);
					if (u + W >= u1)
						break;
					if (u + 2 * W < u1)
						gm_k45_load<T, R>(wa, rows, u + 2 * W, L.t);
					gm_k45_math<T, R, 1>(L, wb, u + W);
				}
			}
		} else
			for (int64_t u = u0 + warp; u < u1; u += W)
				mm_unit<T, R, 1>(L, rows, u, rb4);
#pragma unroll
		for (int r = 0; r < R; r++)
#pragma unroll
			for (int hr = 0; hr < 2; hr++)
				part[warp][16 * r + 8 * hr + L.g][L.t] =
				    fmaf(L.acc[r][0][2 * hr + 1], 1.f / 2048.f, L.acc[r][0][2 * hr]);
	}
	__syncthreads();
	for (int i = threadIdx.x; i < NF * 4; i += W * 32) { /* gate row rr at part[.][rr], up at [NF + rr] */
		const int rr = i / 4, tok = i % 4;
		if (tok >= cnt)
			continue;
		float gs = 0.f, us = 0.f;
#pragma unroll
		for (int w = 0; w < W; w++) {
			gs += part[w][rr][tok];
			us += part[w][NF + rr][tok];
		}
		if (S == 1)
			h[(int64_t)mem[tok] * F + f0 + rr] = gs / (1.0f + expf(-gs)) * us;
		else { /* partial sums; the down kernel forms h (mm_stage_h) */
			float *o = hp + ((int64_t)z * np + mem[tok]) * 2 * F + f0 + rr;
			o[0] = gs;
			o[F] = us;
		}
	}
}

template <int T, int W, int R, bool DB>
__global__ void __launch_bounds__(W * 32) moe_small_gate_up_kernel(MS_GU_PARAMS)
{
	ms_gate_up_body<T, W, R, DB>(MS_GU_ARGS);
}

/* TANDEM_MOE_DB=2: the double-buffered body held to 24 warps per SM (3 blocks of 8 warps: <= 85
 * registers, a few spilled). Why: the double-buffered body needs 104 registers, so only 2 blocks of 8
 * warps fit an SM and batch 1's 288 gate / up blocks (GLM-5 rank slice: 32 x 9) took two waves on
 * the H200's 132 SMs (264 slots): that, not the double buffering, is the likely reason TANDEM_MOE_DB=1
 * measured slower (bench_cuda_moe layer, 20:15 run: 41.8 against 35.9 us per layer). Same bits. */
template <int T, int W, int R>
__global__ void __launch_bounds__(W * 32, 24 / W) moe_small_gate_up_db2_kernel(MS_GU_PARAMS)
{
	ms_gate_up_body<T, W, R, true>(MS_GU_ARGS);
}

/* grid (ceil(D / 16 R)), W warps: output rows row0 .. row0 + 16 R - 1 of every token. Warp w runs
 * the chunks led by pairs w, w + W, ... over all of F (h rows of the chunk's pairs as its token
 * columns) into ys[pair][row]; then the weighted sum per token in slot order. */
template <int T, int R, int W, bool SPLIT>
__global__ void __launch_bounds__(W * 32, (T == KT_Q4_K || T == KT_Q5_K) ? 3 : 4)
    moe_small_down_kernel(const uint8_t *__restrict__ wd, const uint8_t *__restrict__ sd, size_t rb, int E,
                          int64_t D, int64_t n_units, const float *__restrict__ h, int64_t F,
                          const int32_t *__restrict__ ids, const float *__restrict__ wts, int k, int np_r,
                          int np, int n, float *__restrict__ out, int64_t ldo, unsigned *err, int split,
                          const float *__restrict__ hp, int pf)
{
	__shared__ mm_stage<1> stage[W];
	__shared__ float ys[MS_MAX_PAIRS][16 * R];
	__shared__ float wsh[MS_MAX_PAIRS]; /* the routing weights, loaded with the ids (off the tail) */
	__shared__ int es[MS_MAX_PAIRS], mem[W][MS_CH];
	__shared__ const float *xr[W][4];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int64_t row0 = (int64_t)blockIdx.x * 16 * R;
	const int64_t nrows = D - row0 < 16 * R ? D - row0 : 16 * R; /* this block's rows */
	if ((pf & MS_PF_SHARED) && np > np_r && threadIdx.x == 0) /* weights: before the wait */
		kdep_prefetch_l2(sd + (size_t)row0 * rb, (size_t)nrows * rb);
	KDEP_ENTRY();
	for (int i = threadIdx.x; i < np; i += W * 32) {
		wsh[i] = i < np_r ? wts[i] : 1.0f;
		es[i] = ms_expert(ids, i, np_r, E);
		if (es[i] < 0 && blockIdx.x == 0)
			atomicAdd(err, 1u);
		/* every pair's rows of this block in flight at once (a repeated expert asks twice: cheap);
		 * the warps then run their chunks one after another from L2 */
		if ((pf & MS_PF_ROWS) && es[i] >= 0 && es[i] < E)
			kdep_prefetch_l2(wd + ((size_t)es[i] * (size_t)D + (size_t)row0) * rb,
			                 (size_t)nrows * rb);
	}
	__syncthreads();
	const bool rb4 = rb % 4 == 0;
	for (int p = warp; p < np; p += W) {
		const int cnt = ms_chunk(es, np, p, mem[warp], lane);
		if (!cnt)
			continue;
		if (lane < 4)
			xr[warp][lane] = h + (int64_t)mem[warp][lane < cnt ? lane : 0] * F;
		mm_lane<R, 1> L;
		ms_lane_init<R>(stage[warp], xr[warp], cnt, lane, L); /* its __syncwarp publishes xr */
		if (SPLIT) /* h from the split partial sums of gate and up (a template flag: the other
		            * instantiation keeps split 1 constant and stays ~80 registers) */
			L.split = split, L.hp = hp, L.hq = mem[warp], L.hnp = np, L.hF = F;
		const int e = es[p];
		const uint8_t *bd = e < E ? wd + (size_t)e * (size_t)D * rb : sd; /* E: the shared expert */
		const uint8_t *rows[R][2];
		MM_FOR_ROWS(R)
		rows[r][hr] = bd + (size_t)min(row0 + 16 * r + 8 * hr + L.g, D - 1) * rb;
		if constexpr ((T == KT_Q4_K || T == KT_Q5_K) && !SPLIT)
			if ((pf & MS_I8) && cnt == 1) { /* one token: the int8 unit */
				float a8[R][2];
				ms_rows_i8<T, R>(a8, rows, xr[warp][0], NULL, 0, n_units, 1,
				                 *(mi8_x *)&stage[warp], lane);
#pragma unroll
				for (int r = 0; r < R; r++)
#pragma unroll
					for (int hr = 0; hr < 2; hr++)
						if (L.t == 0)
							ys[mem[warp][0]][16 * r + 8 * hr + L.g] = a8[r][hr];
				__syncwarp();
				continue;
			}
		for (int64_t u = 0; u < n_units; u++)
			mm_unit<T, R, 1>(L, rows, u, rb4);
#pragma unroll
		for (int r = 0; r < R; r++)
#pragma unroll
			for (int hr = 0; hr < 2; hr++)
				if (L.t < cnt)
					ys[mem[warp][L.t]][16 * r + 8 * hr + L.g] =
					    fmaf(L.acc[r][0][2 * hr + 1], 1.f / 2048.f, L.acc[r][0][2 * hr]);
		__syncwarp(); /* mem / xr / the staging area are rewritten by the next chunk */
	}
	__syncthreads();
	for (int i = threadIdx.x; i < n * 16 * R; i += W * 32) {
		const int tok = i / (16 * R), rr = i % (16 * R);
		const int64_t d = row0 + rr;
		if (d >= D)
			continue;
		float s = 0.0f;
		for (int j = 0; j < k; j++) {
			const int q = tok * k + j;
			s = es[q] >= 0 ? fmaf(wsh[q], ys[q][rr], s) : NAN;
		}
		if (np > np_r) /* the shared expert, weight 1, after the routed ones */
			s += ys[np_r + tok][rr];
		out[(int64_t)tok * ldo + d] = s;
	}
}

/* ---- host ------------------------------------------------------------------------------------- */

static int ms_max_tokens(void)
{
	const char *v = getenv("TANDEM_MOE_SMALL");
	if (v && strcmp(v, "0") == 0)
		return 0;
	const char *m = getenv("TANDEM_MOE_SMALL_MAX");
	if (m && *m) {
		const long x = strtol(m, NULL, 10);
		return x < 0 ? 0 : x > MOE_SMALL_MAX_TOKENS ? MOE_SMALL_MAX_TOKENS : (int)x;
	}
	return MOE_SMALL_DEFAULT_TOKENS;
}

/* gate / up split over D in this many blocks (1..MS_SPLIT_MAX; TANDEM_MOE_SMALL_SPLIT=1|2|3). The
 * idea: at 1-2 tokens the pairs are few (9 at batch 1: 144 blocks of 8 warps, each warp walking 3
 * of the 24 units of D one after the other); with 3 splits every warp has one unit. Measured on
 * the H200 (16:15 run, bench_cuda_moe's sweep, routed + shared): no gain, split 1 was as fast or
 * faster at every batch 1..8 (batch 1: 25.9 us at 1 split, 29.5 at 3; the down kernel then paid 6
 * dependent loads per token to form h, now 1), so 1 is the default. */
#define MS_SPLIT_MAX MM_SPLIT_MAX
static int ms_split(int64_t n, int64_t n_units)
{
	const char *v = getenv("TANDEM_MOE_SMALL_SPLIT");
	int s = 1;
	(void)n;
	if (v && v[0] >= '1' && v[0] <= '0' + MS_SPLIT_MAX && !v[1])
		s = v[0] - '0';
	return s > n_units ? (int)n_units : s;
}

bool moe_small_fits(const struct kcuda_ctx *c, int64_t n, int k, bool shared, int64_t F)
{
	const int64_t np = n * (k + (shared ? 1 : 0));
	/* workspace: h [np][F], or the split partial sums [MS_SPLIT_MAX][np][2][F] */
	return n >= 1 && n <= ms_max_tokens() && np <= MS_MAX_PAIRS &&
	       (size_t)np * (size_t)F * sizeof(float) * 2 * MS_SPLIT_MAX <= c->ws_bytes;
}

static void ms_stage_begin(const char *name, const struct kweight *w, double rows)
{
	if (kprof_active)
		kprof_push(kprof_active, name, w ? ktype_name(w->type) : NULL,
		           w ? rows * (double)w->row_bytes : 0.0);
}
static void ms_stage_end(void)
{
	if (kprof_active)
		kprof_pop(kprof_active);
}

/* one call's arguments, for the launch helpers */
struct ms_args {
	const struct kweight *gate, *up, *down;
	const void *sg, *su, *sd; /* the shared expert's data, or NULL */
	const float *x, *w;
	const int32_t *ids;
	int64_t ldx, F, D, ldo;
	int E, k, np_r, np, n, split;
	int pf_gu, pf_dn; /* MS_PF_* of the two kernels */
	float *h, *hp, *out;
	const mi8_x *xq; /* x's int8 parts (kfuse_add_rmsnorm_parts), or NULL */
};

/* warps per gate / up block: 8 (default), or 4 (TANDEM_MOE_SMALL_GUW=4: twice the blocks; 4 of them
 * fit an SM where 2 of 8 do, so batch 1's split-3 grid runs in one wave with 2 units per warp) */
static int ms_gu_warps(void)
{
	const char *v = getenv("TANDEM_MOE_SMALL_GUW");
	return v && strcmp(v, "4") == 0 ? 4 : v && strcmp(v, "6") == 0 ? 6 : 8;
}

/* the one-tile gate / up block (8 f rows of gate and of up): TANDEM_MOE_SMALL_HALF=1 always, 0 never;
 * by default at 1-2 tokens (H200, 16:55 run, routed + shared: 23.5 against 25.8 us at batch 1, 38.8
 * against 39.9 at 2, but 68.0 against 65.9 at 4 and 119.6 against 115.4 at 8) */
static bool ms_half(int n)
{
	const char *v = getenv("TANDEM_MOE_SMALL_HALF");
	if (v && (strcmp(v, "1") == 0 || strcmp(v, "0") == 0))
		return v[0] == '1';
	return n <= 2;
}

/* L2 prefetch in the two kernels (weights only): the shared expert before KDEP_ENTRY unless
 * TANDEM_PREFETCH=0; the routed experts' rows right after the wait (MOE_PF_ROWS), and a share of
 * each routed expert's down matrix from the gate / up blocks (MOE_PF_DOWN) while those are few
 * enough to stay in L2 until the down kernel reads them (<= 16 MB: 1-2 tokens of GLM-5) */
int moe_pf_mask(void)
{
	const char *v = getenv("TANDEM_MOE_PF");
	if (!v || !*v) /* off by default: every part measured slower (moe_mma.h) */
		return 0;
	const long m = strtol(v, NULL, 10);
	return (int)(m & (MOE_PF_ROUTE | MOE_PF_ROWS | MOE_PF_DOWN));
}

/* one-token chunks of Q4_K / Q5_K experts on the int8 unit (k45_i8.cuh): TANDEM_MOE_I8=0 off (the
 * fp16 unit's bits), on by default */
static bool ms_i8(void)
{
	const char *v = getenv("TANDEM_MOE_I8");
	return !(v && strcmp(v, "0") == 0);
}

/* the gate / up units copy x's int8 parts made by the norm before (kfuse_add_rmsnorm_parts) where
 * the context holds them: TANDEM_MOE_XPARTS=0 quantizes x in every block instead (the same bits) */
static bool ms_xparts(void)
{
	const char *v = getenv("TANDEM_MOE_XPARTS");
	return !(v && strcmp(v, "0") == 0);
}

/* the gate / up kernel's one-token chunks stage x's parts once a block (MS_XBLK) unless
 * TANDEM_MOE_XBLK=0 (every warp copies each unit's parts, as before; the same bits). Read on every call. */
static bool ms_xblk(void)
{
	const char *v = getenv("TANDEM_MOE_XBLK");
	return !(v && strcmp(v, "0") == 0);
}

static void ms_pf_flags(struct ms_args *a, bool sh)
{
	const int m = moe_pf_mask();
	const bool rows = (m & MOE_PF_ROWS) != 0;
	const int shf = sh && kcuda_prefetch_enabled() ? MS_PF_SHARED : 0;
	const double down_bytes = (double)a->D * (double)a->down->row_bytes;
	a->pf_gu = shf | (rows ? MS_PF_ROWS : 0) |
	           ((m & MOE_PF_DOWN) && a->np_r * down_bytes <= 16e6 ? MS_PF_DOWN : 0);
	a->pf_dn = shf | (rows ? MS_PF_ROWS : 0);
	if (ms_i8()) {
		a->pf_gu |= MS_I8 | (ms_xblk() ? MS_XBLK : 0);
		a->pf_dn |= MS_I8;
	}
}

/* TANDEM_MOE_DB=1: gate / up (Q4_K / Q5_K) keep the next unit's weight loads in flight while the
 * current unit computes (register double buffering); =2: the same held to 24 warps per SM
 * (moe_small_gate_up_db2_kernel); off by default until measured */
static int ms_db(void)
{
	const char *v = getenv("TANDEM_MOE_DB");
	return v && (strcmp(v, "1") == 0 || strcmp(v, "2") == 0) ? v[0] - '0' : 0;
}

/* the gate / up kernel for W warps (4, 6: one-tile blocks only, else 8), R tiles, DB 0 / 1 / 2 */
typedef void (*ms_gu_fn)(const uint8_t *, const uint8_t *, const uint8_t *, const uint8_t *, size_t, int,
                         int64_t, int64_t, const float *, int64_t, const int32_t *, int, int, int, float *,
                         float *, const uint8_t *, const uint8_t *, size_t, int, const mi8_x *);
template <int T, int R, int DB> static ms_gu_fn ms_gu_kernel(int w)
{
	if constexpr (DB == 2) {
		if constexpr (R == 1)
			if (w == 6)
				return moe_small_gate_up_db2_kernel<T, 6, R>;
		return w == 4 ? moe_small_gate_up_db2_kernel<T, 4, R> : moe_small_gate_up_db2_kernel<T, 8, R>;
	} else {
		if constexpr (R == 1)
			if (w == 6)
				return moe_small_gate_up_kernel<T, 6, R, DB == 1>;
		return w == 4 ? moe_small_gate_up_kernel<T, 4, R, DB == 1>
		              : moe_small_gate_up_kernel<T, 8, R, DB == 1>;
	}
}

template <int T, int DB> static int ms_gate_up_launch(struct kcuda_ctx *c, const struct ms_args &a)
{
	int w = ms_gu_warps();
	if (ms_half(a.n))
		return klaunch("moe_small_gate_up", ms_gu_kernel<T, 1, DB>(w),
		               dim3((unsigned)(a.F / 8), (unsigned)a.np, (unsigned)a.split), dim3(w * 32), 0,
		               c->stream, (const uint8_t *)a.gate->data, (const uint8_t *)a.up->data,
		               (const uint8_t *)a.sg, (const uint8_t *)a.su, a.gate->row_bytes, a.E, a.F,
		               a.D / 256, a.x, a.ldx, a.ids, a.k, a.np_r, a.np, a.h, a.hp,
		               (const uint8_t *)a.down->data, (const uint8_t *)a.sd,
		               (size_t)a.D * a.down->row_bytes, a.pf_gu, a.xq);
	if (w == 6) /* two-tile blocks: 4 or 8 warps */
		w = 8;
	return klaunch("moe_small_gate_up", ms_gu_kernel<T, 2, DB>(w),
	               dim3((unsigned)(a.F / 16), (unsigned)a.np, (unsigned)a.split), dim3(w * 32), 0,
	               c->stream, (const uint8_t *)a.gate->data, (const uint8_t *)a.up->data,
	               (const uint8_t *)a.sg, (const uint8_t *)a.su, a.gate->row_bytes, a.E, a.F, a.D / 256,
	               a.x, a.ldx, a.ids, a.k, a.np_r, a.np, a.h, a.hp, (const uint8_t *)a.down->data,
	               (const uint8_t *)a.sd, (size_t)a.D * a.down->row_bytes, a.pf_gu, a.xq);
}

template <int T> static int ms_gate_up_t(struct kcuda_ctx *c, const struct ms_args &a)
{
	if constexpr (T == KT_Q4_K || T == KT_Q5_K) {
		const int db = ms_db();
		if (db == 2)
			return ms_gate_up_launch<T, 2>(c, a);
		if (db == 1)
			return ms_gate_up_launch<T, 1>(c, a);
	}
	return ms_gate_up_launch<T, 0>(c, a);
}

template <int T> static int ms_down_t(struct kcuda_ctx *c, const struct ms_args &a)
{
	/* one row tile per warp (16 rows per block: D / 16 blocks, 3 per SM for the light K-quants at
	 * <= 80 registers: one wave at D 6144); 9 warps where that saves a round of chunks (batch 1 with
	 * the shared expert: 9 chunks); Q6_K / Q8_0 need ~128 registers, so 4 warps per block for them */
	constexpr bool LIGHT = T == KT_Q4_K || T == KT_Q5_K;
	constexpr int R = 1, W = LIGHT ? 8 : 4, W9 = LIGHT ? 9 : 4;
	const bool w9 = LIGHT && (a.np + 8) / 9 < (a.np + 7) / 8;
	auto kern =
	    a.split > 1
	        ? (w9 ? moe_small_down_kernel<T, R, W9, true> : moe_small_down_kernel<T, R, W, true>)
	        : (w9 ? moe_small_down_kernel<T, R, W9, false> : moe_small_down_kernel<T, R, W, false>);
	return klaunch("moe_small_down", kern, dim3((unsigned)((a.D + 16 * R - 1) / (16 * R))),
	               dim3((w9 ? W9 : W) * 32), 0, c->stream, (const uint8_t *)a.down->data,
	               (const uint8_t *)a.sd, a.down->row_bytes, a.E, a.D, a.F / 256, (const float *)a.h, a.F,
	               a.ids, a.w, a.k, a.np_r, a.np, a.n, a.out, a.ldo, c->err_dev, a.split,
	               (const float *)a.hp, a.pf_dn);
}

int moe_small_ffn(struct kcuda_ctx *c, const float *x, int64_t ldx, int64_t n, const int32_t *ids,
                  const float *weights, int k, const struct kweight *gate, const struct kweight *up,
                  const struct kweight *down, int64_t E, int64_t F, const struct kweight *sh_gate,
                  const struct kweight *sh_up, const struct kweight *sh_down, float *out, int64_t ldo)
{
	const bool sh = sh_gate != NULL;
	struct ms_args a;
	a.gate = gate, a.up = up, a.down = down;
	a.sg = sh ? sh_gate->data : NULL, a.su = sh ? sh_up->data : NULL, a.sd = sh ? sh_down->data : NULL;
	a.x = x, a.w = weights, a.ids = ids, a.ldx = ldx, a.F = F, a.D = gate->n_in, a.ldo = ldo;
	a.E = (int)E, a.k = k, a.np_r = (int)(n * k), a.np = a.np_r + (sh ? (int)n : 0), a.n = (int)n;
	a.split = ms_split(n, a.D / 256);
	ms_pf_flags(&a, sh);
	a.h = a.hp = (float *)c->ws; /* h (split 1) or the partial sums */
	a.out = out;
	/* x's int8 parts, where the norm before left them for exactly these rows (fused.h) */
	a.xq = ms_xparts() ? kcuda_xparts_for(c, x, ldx, a.D, n) : NULL;
	const int64_t n_ex = (a.np_r < E ? a.np_r : E) + (sh ? 1 : 0);
	/* one token: moe_one.cu's kernels (h in the same layout, split 1) */
	const int one = n == 1 && a.split == 1 ? moe_one_mode() : 0;
	struct moe_one_args oa;
	oa.gate = gate, oa.up = up, oa.down = down, oa.sg = a.sg, oa.su = a.su, oa.sd = a.sd;
	oa.x = x, oa.w = weights, oa.ids = ids, oa.D = a.D, oa.F = F, oa.E = a.E, oa.np_r = a.np_r;
	oa.np = a.np, oa.h = a.h, oa.out = out, oa.route = NULL;
	int rc;
	if (n == 1 && a.split == 1) { /* the whole op in one launch (moe_persist.cu) */
		rc = moe_persist_ffn1(c, &oa);
		if (rc != ERR_UNSUPPORTED)
			return rc;
	}
	ms_stage_begin("moe.experts/gate_up(small)", gate, 2.0 * (double)n_ex * (double)F);
	if ((one & MOE_ONE_GU) && up->type == gate->type && moe_one_gate_up_fits(c, gate->type, a.D, F, a.np))
		rc = moe_one_gate_up(c, &oa);
	else
		switch (gate->type) {
		case KT_Q4_K: rc = ms_gate_up_t<KT_Q4_K>(c, a); break;
		case KT_Q5_K: rc = ms_gate_up_t<KT_Q5_K>(c, a); break;
		case KT_Q6_K: rc = ms_gate_up_t<KT_Q6_K>(c, a); break;
		case KT_Q8_0: rc = ms_gate_up_t<KT_Q8_0>(c, a); break;
		default: rc = ERR_UNSUPPORTED; break;
		}
	ms_stage_end();
	if (rc)
		return rc;
	ms_stage_begin("moe.experts/down+combine(small)", down, (double)n_ex * (double)a.D);
	if ((one & MOE_ONE_DN) && moe_one_down_fits(down->type, F, a.np))
		rc = moe_one_down(c, &oa);
	else
		switch (down->type) {
		case KT_Q4_K: rc = ms_down_t<KT_Q4_K>(c, a); break;
		case KT_Q5_K: rc = ms_down_t<KT_Q5_K>(c, a); break;
		case KT_Q6_K: rc = ms_down_t<KT_Q6_K>(c, a); break;
		case KT_Q8_0: rc = ms_down_t<KT_Q8_0>(c, a); break;
		default: rc = ERR_UNSUPPORTED; break;
		}
	ms_stage_end();
	return rc;
}
