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
 *   gate_up, grid (F / 16, np): block y = pair y; blocks whose pair does not lead exit at once; the
 *     rest are moe_mma.cu's gate_up block (8 warps, rows f0..f0+15 of gate AND up, D split over
 *     the warps, h[pair][f] = SiLU(g) u);
 *   down + combine, grid (D / 16): a block owns 16 output rows of every token; its warps take the
 *     chunks in turn (warp w: leaders w, w + W, ...; every warp reads all of F, one unit for the
 *     GLM-5 / DS-V3 rank slice) and leave y[pair][row] in shared memory; then
 *     out[i][d] = sum_j w[i][j] y[i k + j][d] in slot order (+ the shared expert's y, weight 1)
 *     with the sorted path's formula: deterministic, no partial buffer in memory, no atomics. A
 *     pair with an expert id out of range gives NaN for its token and is counted (block 0).
 * Both kernels start with KDEP_ENTRY and go through klaunch (programmatic dependent launch).
 * TANDEM_MOE_SMALL=0 turns the path off (the sorted path then takes these batches), and
 * TANDEM_MOE_SMALL_MAX=n moves its upper token count (<= MOE_SMALL_MAX_TOKENS). */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/moe_mma.h"
#include "kernels/cuda/moe_mma_units.cuh"
#include "kernels/cuda/prof.h"

#define MS_CH 4 /* pairs per chunk: one n-tile of 4 token columns (NG = 1) */
#define MS_MAX_PAIRS 80 /* 8 tokens x (top-8 + the shared expert) = 72 */
#define MS_GU_WARPS 8

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
		st.scl[lane] = st.isc[lane] = 1.0f;
	L.g = lane >> 2, L.t = lane & 3, L.lane = lane, L.n_tok = cnt, L.sm = &st, L.xr = xr;
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int i = 0; i < 4; i++)
			L.acc[r][0][i] = 0.f;
	__syncwarp();
}

/* grid (F / 16, np), MS_GU_WARPS warps: block y computes h[q][f0 .. f0 + 15] for the pairs q of the
 * chunk pair y leads (none: exits); warp w takes units w, w + W, ... of D for the 16 rows of gate
 * (tile 0) and up (tile 1) */
template <int T>
__global__ void __launch_bounds__(MS_GU_WARPS * 32)
    moe_small_gate_up_kernel(const uint8_t *__restrict__ wg, const uint8_t *__restrict__ wu,
                             const uint8_t *__restrict__ sg, const uint8_t *__restrict__ su, size_t rb, int E,
                             int64_t F, int64_t n_units, const float *__restrict__ x, int64_t ldx,
                             const int32_t *__restrict__ ids, int k, int np_r, int np, float *__restrict__ h)
{
	constexpr int R = 2, W = MS_GU_WARPS;
	__shared__ float part[W][16 * R][4];
	__shared__ mm_stage<1> stage[W];
	__shared__ const float *xr[4];
	__shared__ int es[MS_MAX_PAIRS], mem[MS_CH], s_cnt;
	KDEP_ENTRY();
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, p = (int)blockIdx.y;
	for (int i = threadIdx.x; i < np; i += W * 32)
		es[i] = ms_expert(ids, i, np_r, E);
	__syncthreads();
	if (warp == 0) {
		const int cnt = ms_chunk(es, np, p, mem, lane);
		if (lane == 0)
			s_cnt = cnt;
		if (cnt && lane < 4) {
			const int q = mem[lane < cnt ? lane : 0];
			xr[lane] = x + (int64_t)(q < np_r ? q / k : q - np_r) * ldx; /* the pair's token */
		}
	}
	__syncthreads();
	const int cnt = s_cnt, e = es[p];
	if (!cnt)
		return;
	mm_lane<R, 1> L;
	ms_lane_init<R>(stage[warp], xr, cnt, lane, L);
	const int64_t f0 = (int64_t)blockIdx.x * 16;
	const size_t eo = e < E ? (size_t)e * (size_t)F * rb : 0; /* expert E: the shared one */
	const uint8_t *bg = (e < E ? wg : sg) + eo, *bu = (e < E ? wu : su) + eo;
	const uint8_t *rows[R][2];
#pragma unroll
	for (int hr = 0; hr < 2; hr++) {
		rows[0][hr] = bg + ((size_t)f0 + 8 * hr + L.g) * rb;
		rows[1][hr] = bu + ((size_t)f0 + 8 * hr + L.g) * rb;
	}
	const bool rb4 = rb % 4 == 0;
	for (int64_t u = warp; u < n_units; u += W)
		mm_unit<T, R, 1>(L, rows, u, rb4);
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int hr = 0; hr < 2; hr++)
			part[warp][16 * r + 8 * hr + L.g][L.t] =
			    fmaf(L.acc[r][0][2 * hr + 1], 1.f / 2048.f, L.acc[r][0][2 * hr]);
	__syncthreads();
	for (int i = threadIdx.x; i < 16 * 4; i += W * 32) {
		const int rr = i / 4, tok = i % 4;
		if (tok >= cnt)
			continue;
		float gs = 0.f, us = 0.f;
#pragma unroll
		for (int w = 0; w < W; w++) {
			gs += part[w][rr][tok];
			us += part[w][16 + rr][tok];
		}
		h[(int64_t)mem[tok] * F + f0 + rr] = gs / (1.0f + expf(-gs)) * us;
	}
}

/* grid (ceil(D / 16 R)), W warps: output rows row0 .. row0 + 16 R - 1 of every token. Warp w runs
 * the chunks led by pairs w, w + W, ... over all of F (h rows of the chunk's pairs as its token
 * columns) into ys[pair][row]; then the weighted sum per token in slot order. */
template <int T, int R, int W>
__global__ void __launch_bounds__(W * 32)
    moe_small_down_kernel(const uint8_t *__restrict__ wd, const uint8_t *__restrict__ sd, size_t rb, int E,
                          int64_t D, int64_t n_units, const float *__restrict__ h, int64_t F,
                          const int32_t *__restrict__ ids, const float *__restrict__ wts, int k, int np_r,
                          int np, int n, float *__restrict__ out, int64_t ldo, unsigned *err)
{
	__shared__ mm_stage<1> stage[W];
	__shared__ float ys[MS_MAX_PAIRS][16 * R];
	__shared__ int es[MS_MAX_PAIRS], mem[W][MS_CH];
	__shared__ const float *xr[W][4];
	KDEP_ENTRY();
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	for (int i = threadIdx.x; i < np; i += W * 32) {
		es[i] = ms_expert(ids, i, np_r, E);
		if (es[i] < 0 && blockIdx.x == 0)
			atomicAdd(err, 1u);
	}
	__syncthreads();
	const int64_t row0 = (int64_t)blockIdx.x * 16 * R;
	const bool rb4 = rb % 4 == 0;
	for (int p = warp; p < np; p += W) {
		const int cnt = ms_chunk(es, np, p, mem[warp], lane);
		if (!cnt)
			continue;
		if (lane < 4)
			xr[warp][lane] = h + (int64_t)mem[warp][lane < cnt ? lane : 0] * F;
		mm_lane<R, 1> L;
		ms_lane_init<R>(stage[warp], xr[warp], cnt, lane, L); /* its __syncwarp publishes xr */
		const int e = es[p];
		const uint8_t *bd = e < E ? wd + (size_t)e * (size_t)D * rb : sd; /* E: the shared expert */
		const uint8_t *rows[R][2];
		MM_FOR_ROWS(R)
		rows[r][hr] = bd + (size_t)min(row0 + 16 * r + 8 * hr + L.g, D - 1) * rb;
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
			s = es[q] >= 0 ? fmaf(wts[q], ys[q][rr], s) : NAN;
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

bool moe_small_fits(const struct kcuda_ctx *c, int64_t n, int k, bool shared, int64_t F)
{
	const int64_t np = n * (k + (shared ? 1 : 0));
	return n >= 1 && n <= ms_max_tokens() && np <= MS_MAX_PAIRS &&
	       (size_t)np * (size_t)F * sizeof(float) <= c->ws_bytes;
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

template <int T>
static int ms_gate_up_t(struct kcuda_ctx *c, const struct kweight *gate, const struct kweight *up,
                        const void *sg, const void *su, int E, int64_t F, int64_t D, const float *x,
                        int64_t ldx, const int32_t *ids, int k, int np_r, int np, float *h)
{
	return klaunch("moe_small_gate_up", moe_small_gate_up_kernel<T>,
	               dim3((unsigned)(F / 16), (unsigned)np), dim3(MS_GU_WARPS * 32), 0, c->stream,
	               (const uint8_t *)gate->data, (const uint8_t *)up->data, (const uint8_t *)sg,
	               (const uint8_t *)su, gate->row_bytes, E, F, D / 256, x, ldx, ids, k, np_r, np, h);
}

template <int T>
static int ms_down_t(struct kcuda_ctx *c, const struct kweight *down, const void *sd, int E, int64_t F,
                     int64_t D, const float *h, const int32_t *ids, const float *w, int k, int np_r, int np,
                     int n, float *out, int64_t ldo)
{
	/* one row tile per warp (16 rows per block: D / 16 blocks, ~3 per SM for the light K-quants at
	 * 6144); Q6_K / Q8_0 need ~130-160 registers, so 4 warps per block for them */
	constexpr int R = 1, W = (T == KT_Q4_K || T == KT_Q5_K) ? 8 : 4;
	return klaunch("moe_small_down", moe_small_down_kernel<T, R, W>,
	               dim3((unsigned)((D + 16 * R - 1) / (16 * R))), dim3(W * 32), 0, c->stream,
	               (const uint8_t *)down->data, (const uint8_t *)sd, down->row_bytes, E, D, F / 256, h, F,
	               ids, w, k, np_r, np, n, out, ldo, c->err_dev);
}

int moe_small_ffn(struct kcuda_ctx *c, const float *x, int64_t ldx, int64_t n, const int32_t *ids,
                  const float *weights, int k, const struct kweight *gate, const struct kweight *up,
                  const struct kweight *down, int64_t E, int64_t F, const struct kweight *sh_gate,
                  const struct kweight *sh_up, const struct kweight *sh_down, float *out, int64_t ldo)
{
	const bool sh = sh_gate != NULL;
	const int np_r = (int)(n * k), np = np_r + (sh ? (int)n : 0);
	const int64_t D = gate->n_in;
	const void *sg = sh ? sh_gate->data : NULL, *su = sh ? sh_up->data : NULL,
	           *sd = sh ? sh_down->data : NULL;
	float *h = (float *)c->ws;
	const int64_t n_ex = (np_r < E ? np_r : E) + (sh ? 1 : 0);
	int rc;
	ms_stage_begin("moe.experts/gate_up(small)", gate, 2.0 * (double)n_ex * (double)F);
	switch (gate->type) {
	case KT_Q4_K:
		rc = ms_gate_up_t<KT_Q4_K>(c, gate, up, sg, su, (int)E, F, D, x, ldx, ids, k, np_r, np, h);
		break;
	case KT_Q5_K:
		rc = ms_gate_up_t<KT_Q5_K>(c, gate, up, sg, su, (int)E, F, D, x, ldx, ids, k, np_r, np, h);
		break;
	case KT_Q6_K:
		rc = ms_gate_up_t<KT_Q6_K>(c, gate, up, sg, su, (int)E, F, D, x, ldx, ids, k, np_r, np, h);
		break;
	case KT_Q8_0:
		rc = ms_gate_up_t<KT_Q8_0>(c, gate, up, sg, su, (int)E, F, D, x, ldx, ids, k, np_r, np, h);
		break;
	default: rc = ERR_UNSUPPORTED; break;
	}
	ms_stage_end();
	if (rc)
		return rc;
	ms_stage_begin("moe.experts/down+combine(small)", down, (double)n_ex * (double)D);
	switch (down->type) {
	case KT_Q4_K:
		rc = ms_down_t<KT_Q4_K>(c, down, sd, (int)E, F, D, h, ids, weights, k, np_r, np, (int)n, out,
		                        ldo);
		break;
	case KT_Q5_K:
		rc = ms_down_t<KT_Q5_K>(c, down, sd, (int)E, F, D, h, ids, weights, k, np_r, np, (int)n, out,
		                        ldo);
		break;
	case KT_Q6_K:
		rc = ms_down_t<KT_Q6_K>(c, down, sd, (int)E, F, D, h, ids, weights, k, np_r, np, (int)n, out,
		                        ldo);
		break;
	case KT_Q8_0:
		rc = ms_down_t<KT_Q8_0>(c, down, sd, (int)E, F, D, h, ids, weights, k, np_r, np, (int)n, out,
		                        ldo);
		break;
	default: rc = ERR_UNSUPPORTED; break;
	}
	ms_stage_end();
	return rc;
}
