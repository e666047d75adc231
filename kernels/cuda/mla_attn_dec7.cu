/* MLA decode of a single sparse row in two launches without a merge (absorbed form, paged KV, top-k
 * or dense lists of up to M7_KMAX keys): mla_dec7, kcuda_mla_attn's first choice for one query row
 * with a top-k list (m7_rows_limit: the shape where the H200 measured it faster than mla_dec);
 * TANDEM_MLA_DEC_V=7 forces it on up to 8 rows of any kind, TANDEM_MLA_DEC_V=4 restores mla_dec.
 *
 * Why: a phase trace of the one-launch kernels (docs/PERFORMANCE.md, "Where the MLA decode's ~13 us
 * go", H200 2026-11-30) found ~7.4 of a call's ~12.8 us after its wait in the split merge: the
 * cluster barrier waits for the slowest block of its cluster, then a ticket, then the last blocks
 * read 16 clusters' partials. Splitting over the keys is what needs that merge; the second half
 * split over the CHANNELS needs none:
 *  1. scores (kmla_dec6_scores: mla_attn_dec6.cu's kernel in scores mode): a block per 16-key tile
 *     of a (row, 8-head group), its block table read before the wait and the row's KV blocks
 *     prefetched into L2, the key count / top-k entries / q in one round trip, the rows by
 *     cp.async, fp32 dot products; it stores e^(s - m_t) of its keys (s = scale x q . key) and
 *     the tile's (m_t, sum) to the workspace, and ends.
 *  2. softmax + PV (this file): grid (C / 4, row x 8-head group), 512 threads; a block owns 4
 *     channels of 8 heads of one row over ALL its keys (<= 2048: 4 consecutive ones a thread):
 *     - before the wait: the row's block table into shared memory (qseq and the tables are step
 *       inputs the host uploads before the step's first kernel: cuda_common.cuh's narrow
 *       exception, as indexer_fast.cu and mla_attn_dec6.cu);
 *     - after it, in one round trip: the key count, the thread's 4 entries, their e^(s - m_t) for
 *       the 8 heads (one 16-byte load a head), two tiles' (m_t, sum); then, as soon as the entries
 *       land, 8 bytes (4 bf16 channels) of each of its keys' rows (in L2 after launch 1);
 *     - the tiles combined once a head (two warps): M = max m_t, f_t = e^(m_t - M), L = sum f_t
 *       sum_t; a key's weight is then e^(s - m_t) f_t: no exp per key, no max over the keys;
 *     - PV: 32 accumulators a thread (8 heads x 4 channels) over its 4 keys, a butterfly
 *       reduce-scatter over the warp (lane l ends with output l), the 16 warps' partials summed
 *       in warp order: a fixed order, so the bits do not depend on timing.
 * History (H200, docs/PERFORMANCE.md "Session 7"): the first second launch (256 threads, 8 keys x
 * 8 channels, the softmax by one warp a head over all keys) cost 12.7 us a layer on the critical
 * path; 512 threads with the softmax in registers 7.5; the tile combine 6.1 (+ 8.0 for launch 1).
 * A row without keys (or with only invalid ones) gives zeros, as the other kernels. Invalid keys
 * and bad key counts are counted by launch 1 (once); launch 2 clamps the count the same way. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/mla_attn_mode.cuh"

#define M7_THREADS 512
#define M7_WARPS 16
#define M7_HG 8 /* heads a block */
#define M7_CB 4 /* channels a block: 8 bytes of a bf16 row, 16 of an fp32 one */
#define M7_KPT 4 /* keys a thread */
#define M7_KMAX (M7_THREADS * M7_KPT) /* keys a row at most: 2048 */
#define M7_TMAX 128 /* launch 1's tiles a row at most (2048 keys in 16-key tiles) */
#define M7_TBL_MAX 2048 /* block-table entries preloaded into shared memory (8 KB) */

struct m7_args {
	kmla_pool pool;
	int elt; /* bytes a cached value (2 bf16, 4 fp32) */
	const int32_t *n_keys, *sel;
	int64_t pos0, ld_sel, max_keys;
	int early; /* qseq and the table read before KDEP_ENTRY (TANDEM_MLA_DEC6_EARLY=0: after) */
	const float *sc; /* launch 1's e^(s - m_t), [row * H + h][ld_sc] (ld_sc a multiple of 4) */
	const float2 *ml; /* launch 1's tile (m_t, sum), [row * H + h][ld_t] */
	int64_t ld_sc, ld_t;
	int kb; /* keys a tile of launch 1 (16 or 32) */
	int H, C, n_hg;
	float *out;
};

/* one step of the warp's reduce-scatter of 2N values: the lane keeps the half its bit o selects,
 * added to the other lane's copy of that half, in acc[0 .. N) */
template <int N> __device__ __forceinline__ void m7_rs_step(float *acc, int lane, int o)
{
	const bool up = (lane & o) != 0;
#pragma unroll
	for (int i = 0; i < N; i++) {
		const float send = up ? acc[i] : acc[N + i];
		const float keep = up ? acc[N + i] : acc[i];
		acc[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
	}
}

template <bool F32> __global__ void __launch_bounds__(M7_THREADS, 1) mla_dec7_pv_kernel(m7_args a)
{
	constexpr int NO = M7_HG * M7_CB; /* outputs a block: 32 */
	constexpr int TPH = M7_THREADS / M7_HG; /* threads a head in the tile combine: 64, 2 tiles each */
	extern __shared__ __align__(16) uint8_t m7_sm[];
	float *red_s = (float *)m7_sm; /* [WARPS][NO] */
	float *wx_s = red_s + M7_WARPS * NO; /* [WARPS] the warps' maxima, then their sums */
	float *f_s = wx_s + M7_WARPS; /* [HG][M7_TMAX] e^(m_t - M) of each tile */
	float *ls_s = f_s + M7_HG * M7_TMAX; /* [WARPS] the warps' sums of f_t sum_t */
	int32_t *tbl_s = (int32_t *)(ls_s + M7_WARPS); /* [tbl_n] */
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int64_t row = blockIdx.y / a.n_hg;
	const int h0 = (int)(blockIdx.y % a.n_hg) * M7_HG, hv = min(M7_HG, a.H - h0);
	const int c0 = (int)blockIdx.x * M7_CB;

	/* step inputs only before the wait (the file comment) */
	int32_t tbl = 0;
	if (a.early)
		tbl = kmla_pool_table(a.pool, tbl_s, row, M7_THREADS);
	KDEP_ENTRY();
	a.sc = kdep_after(a.sc);
	a.ml = kdep_after(a.ml);
	a.sel = kdep_after(a.sel);
	a.n_keys = kdep_after(a.n_keys);
	if (!a.early)
		tbl = kmla_pool_table(a.pool, tbl_s, row, M7_THREADS);

	/* one round trip: the key count, this thread's entries, its keys' e^(s - m_t) of the 8 heads,
	 * and two tiles' (m_t, sum) of head tid / 64 */
	const int64_t nk_raw = a.n_keys ? (int64_t)a.n_keys[row] : a.pos0 + row + 1;
	const int j0 = 4 * tid; /* this thread's keys: j0 .. j0 + 3, all in tile j0 / kb */
	int32_t pos[M7_KPT];
#pragma unroll
	for (int i = 0; i < M7_KPT; i++) {
		const int j = j0 + i;
		pos[i] = j;
		if (a.sel)
			pos[i] = j < a.ld_sel && j < a.max_keys ? a.sel[row * a.ld_sel + j] : -1;
	}
	float s[M7_HG][M7_KPT]; /* e^(s - m_t), then p = e^(s - M) */
#pragma unroll
	for (int h = 0; h < M7_HG; h++) {
		float4 v4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		if (h < hv && j0 < a.ld_sc)
			v4 = __ldcg((const float4 *)(a.sc + (row * a.H + h0 + h) * a.ld_sc + j0));
		s[h][0] = v4.x;
		s[h][1] = v4.y;
		s[h][2] = v4.z;
		s[h][3] = v4.w;
	}
	const int nk = (int)(nk_raw < 0 ? 0 : nk_raw > a.max_keys ? a.max_keys : nk_raw);
	const int ntl = (nk + a.kb - 1) / a.kb; /* tiles with keys (<= M7_TMAX) */
	const int hc = tid / TPH, t0 = tid % TPH; /* combine: head hc, tiles t0 and t0 + 64 */
	float2 tl[2];
#pragma unroll
	for (int u = 0; u < 2; u++) {
		const int t = t0 + TPH * u;
		tl[u] = make_float2(-INFINITY, 0.0f);
		if (hc < hv && t < ntl)
			tl[u] = __ldcg(a.ml + (row * a.H + h0 + hc) * a.ld_t + t);
	}
	__syncthreads(); /* tbl_s */

	/* this thread's 4 channels of each of its keys' rows (8 bytes bf16, 16 fp32), in flight over
	 * the tile combine */
	float vf[M7_KPT][M7_CB];
	{
		uint4 w[M7_KPT];
#pragma unroll
		for (int i = 0; i < M7_KPT; i++) {
			const uint8_t *p = j0 + i < nk ? kmla_pool_row(a.pool, tbl_s, tbl, pos[i]) : NULL;
			w[i] = make_uint4(0, 0, 0, 0);
			if (p) {
				if constexpr (F32) {
					w[i] = __ldcg((const uint4 *)(p + (size_t)c0 * 4));
				} else {
					const uint2 u = __ldcg((const uint2 *)(p + (size_t)c0 * 2));
					w[i].x = u.x;
					w[i].y = u.y;
				}
			}
		}
#pragma unroll
		for (int i = 0; i < M7_KPT; i++) {
			if constexpr (F32) {
				vf[i][0] = __uint_as_float(w[i].x);
				vf[i][1] = __uint_as_float(w[i].y);
				vf[i][2] = __uint_as_float(w[i].z);
				vf[i][3] = __uint_as_float(w[i].w);
			} else {
				vf[i][0] = __uint_as_float(w[i].x << 16);
				vf[i][1] = __uint_as_float(w[i].x & 0xffff0000u);
				vf[i][2] = __uint_as_float(w[i].y << 16);
				vf[i][3] = __uint_as_float(w[i].y & 0xffff0000u);
			}
		}
	}

	/* the tiles combined: M = max m_t of the head (two warps a head), f_t = e^(m_t - M) (a tile
	 * without a valid key, sum 0, gets 0), L = sum f_t sum_t */
	float mx = fmaxf(tl[0].y > 0.0f ? tl[0].x : -INFINITY, tl[1].y > 0.0f ? tl[1].x : -INFINITY);
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
	if (lane == 0)
		wx_s[warp] = mx;
	__syncthreads(); /* wx_s */
	const float M = fmaxf(wx_s[2 * hc], wx_s[2 * hc + 1]);
	float ls = 0.0f;
#pragma unroll
	for (int u = 0; u < 2; u++) {
		const int t = t0 + TPH * u;
		/* a NaN sum (a NaN score in the tile) keeps its weight: the NaN reaches the output, as on
		 * the CPU, instead of the tile being dropped */
		const float f = !(tl[u].y <= 0.0f) ? expf(tl[u].x - M) : 0.0f;
		if (t < M7_TMAX)
			f_s[hc * M7_TMAX + t] = f;
		ls = fmaf(f, tl[u].y, ls);
	}
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		ls += __shfl_xor_sync(0xffffffffu, ls, o);
	if (lane == 0)
		ls_s[warp] = ls;
	__syncthreads(); /* f_s, ls_s */

	/* PV over this thread's keys: acc[h * 4 + c], p = e^(s - m_t) f_t (0 past the key count) */
	const int tk = j0 / a.kb;
	float acc[NO];
#pragma unroll
	for (int h = 0; h < M7_HG; h++) {
		const float f = tk < ntl ? f_s[h * M7_TMAX + tk] : 0.0f;
#pragma unroll
		for (int c = 0; c < M7_CB; c++) {
			float r = 0.0f;
#pragma unroll
			for (int i = 0; i < M7_KPT; i++)
				r = fmaf(j0 + i < nk ? s[h][i] : 0.0f, vf[i][c], r);
			acc[h * M7_CB + c] = r * f;
		}
	}
	/* butterfly reduce-scatter over the warp: at the end lane l holds output l */
	static_assert(NO == 32, "the reduce-scatter below is written for 32 outputs");
	m7_rs_step<16>(acc, lane, 16);
	m7_rs_step<8>(acc, lane, 8);
	m7_rs_step<4>(acc, lane, 4);
	m7_rs_step<2>(acc, lane, 2);
	m7_rs_step<1>(acc, lane, 1);
	red_s[warp * NO + lane] = acc[0];
	__syncthreads();
	if (tid < NO) {
		const int h = tid / M7_CB, c = tid % M7_CB;
		float r = 0.0f;
#pragma unroll
		for (int w = 0; w < M7_WARPS; w++)
			r += red_s[w * NO + tid];
		const float L = ls_s[2 * h] + ls_s[2 * h + 1];
		if (h < hv && c0 + c < a.C)
			a.out[(row * a.H + h0 + h) * (int64_t)a.C + c0 + c] = !(L <= 0.0f) ? r / L : 0.0f;
	}
}

/* launches of mla_dec7 (both kernels: one count a call; test_ops_mla and bench_cuda_attn check
 * which kernel took a call) */
extern "C" {
unsigned long long kmla_dec7_launches = 0;
int kmla_dec7_default_on = 1;
}

/* Which calls take mla_dec7 (read on every call: a getenv; at capture only under graphs):
 *  - TANDEM_MLA_DEC_V unset (kmla_dec7_default_on): a single sparse row (a top-k list), the one
 *    shape the H200 measured it faster at (2026-11-30: GLM-5 rank 0 of TP=8, batch 1, ctx 4096:
 *    step 7.14 / 7.08 -> 7.02 / 6.89 ms; nsys 8.0 + 6.1 us a layer against mla_dec's 15.4); at 2
 *    rows and more its op bench is 1.2-1.8x slower than mla_dec (batch 8 step 19.3 -> 22.1);
 *  - TANDEM_MLA_DEC_V=7: up to M7_ROWS_FORCED rows, or TANDEM_MLA_DEC=N rows (A/B, tests);
 *  - TANDEM_MLA_DEC_V set to anything else, or TANDEM_MLA_DEC=0: never.
 * 0: off; -1: the default's single sparse row; n > 0: up to n rows of any kind */
#define M7_ROWS_FORCED 8
static int m7_rows_limit(void)
{
	const char *v = getenv("TANDEM_MLA_DEC_V");
	const char *e = getenv("TANDEM_MLA_DEC");
	if (e && strcmp(e, "0") == 0)
		return 0;
	if (!(v && *v))
		return kmla_dec7_default_on ? -1 : 0;
	if (strcmp(v, "7") != 0)
		return 0;
	if (!e || !*e)
		return M7_ROWS_FORCED;
	char *end = NULL;
	const long n = strtol(e, &end, 10);
	if (*end || n < 0)
		return M7_ROWS_FORCED;
	return n > 65535 ? 65535 : (int)n;
}

static constexpr size_t m7_smem(int tbl_n)
{
	return (size_t)(M7_WARPS * M7_HG * M7_CB + M7_WARPS + M7_HG * M7_TMAX + M7_WARPS) * sizeof(float) +
	       (size_t)tbl_n * sizeof(int32_t);
}
/* within the 48 KB every device gives a block without an opt-in attribute */
static_assert(m7_smem(M7_TBL_MAX) <= 48 * 1024, "mla_dec7_pv's shared memory");

/* kcuda_mla_attn's first choice under TANDEM_MLA_DEC_V=7 for a call mm_fits (mla_attn_mma.cu)
 * accepted: ERR_UNSUPPORTED (nothing launched) when off, or the shape / device does not suit it */
int kmla_dec7_launch(struct kcuda_ctx *c, const struct kcuda_kv_view *kv, const struct kcuda_attn_rows *rows,
                     const float *q, int64_t H, int64_t C, float scale, float *out)
{
	const int lim = m7_rows_limit();
	if (rows->n_q < 1 || (lim < 0 ? rows->n_q > 1 || !rows->sel : rows->n_q > lim))
		return ERR_UNSUPPORTED;
	if (H < 1 || C < M7_CB || C % M7_CB || kv->dim < C || rows->max_keys < 1 ||
	    rows->max_keys > M7_KMAX || kv->block_tokens < 1 ||
	    ((uintptr_t)kv->base | kv->block_bytes | kv->offset) % 16 ||
	    ((size_t)C * (kv->bf16 ? 2 : 4)) % 16)
		return ERR_UNSUPPORTED;
	const int64_t n_hg = (H + M7_HG - 1) / M7_HG;
	if (rows->n_q * n_hg > 65535 || C / M7_CB > 65535)
		return ERR_UNSUPPORTED;
	const int ld_s = (int)((rows->max_keys + 3) / 4 * 4);
	const int kb = kmla_dec6_kb(kv->bf16);
	const int64_t ld_t = (rows->max_keys + kb - 1) / kb;
	const size_t sc_bytes = (size_t)rows->n_q * (size_t)H * (size_t)ld_s * sizeof(float);
	if (ld_t > M7_TMAX ||
	    sc_bytes + (size_t)rows->n_q * (size_t)H * (size_t)ld_t * sizeof(float2) > c->ws_bytes)
		return ERR_UNSUPPORTED;
	const int tbl_n = rows->ld_blocks <= M7_TBL_MAX ? (int)rows->ld_blocks : 0;
	const size_t smem = m7_smem(tbl_n);
	const bool f32 = !kv->bf16;
	void (*fn)(m7_args) = f32 ? mla_dec7_pv_kernel<true> : mla_dec7_pv_kernel<false>;

	float *sc = (float *)c->ws;
	float2 *ml = (float2 *)((uint8_t *)c->ws + sc_bytes); /* 16-byte aligned: ld_s % 4 == 0 */
	int rc = kmla_dec6_scores(c, kv, rows, q, H, C, scale, sc, ld_s, ml, ld_t, kb);
	if (rc)
		return rc; /* ERR_UNSUPPORTED: nothing launched, the caller takes the next kernel */

	m7_args a;
	a.pool = kmla_pool_of(kv, rows, tbl_n);
	a.elt = kv->bf16 ? 2 : 4;
	a.n_keys = rows->n_keys;
	a.sel = rows->sel;
	a.pos0 = rows->pos0;
	a.ld_sel = rows->ld_sel;
	a.max_keys = rows->max_keys;
	a.early = kmla_dec6_early();
	a.sc = sc;
	a.ld_sc = ld_s;
	a.ml = ml;
	a.ld_t = ld_t;
	a.kb = kb;
	a.H = (int)H;
	a.C = (int)C;
	a.n_hg = (int)n_hg;
	a.out = out;
	const dim3 grid((unsigned)(C / M7_CB), (unsigned)(rows->n_q * n_hg));
	rc = klaunch("mla_dec7_pv", fn, grid, dim3(M7_THREADS), smem, c->stream, a);
	if (!rc)
		kmla_dec7_launches++;
	return rc;
}
