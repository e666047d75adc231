/* MLA decode at small batch in two launches without a merge (absorbed form, paged KV, sparse top-k
 * or dense up to M7_KMAX keys): mla_dec7, tried first by kcuda_mla_attn under TANDEM_MLA_DEC_V=7
 * (or by default once kmla_dec7_default_on).
 *
 * Why: a phase trace of the one-launch kernels (docs/PERFORMANCE.md, "Where the MLA decode's ~13 us
 * go", H200 2026-11-30) found ~7.4 of a call's ~12.8 us after its wait in the split merge: the
 * cluster barrier waits for the slowest block of its cluster, then a ticket, then the last blocks
 * read 16 clusters' partials. The arithmetic is ~2 us. Splitting over the keys is what needs the
 * merge; splitting the second half over the CHANNELS needs none:
 *  1. scores: mla_attn_dec6.cu's kernel in scores mode (kmla_dec6_scores): one block a 16-key
 *     tile of a (row, 8-head group), its block table read before the wait, the row's KV blocks
 *     prefetched into L2, the key count / top-k entries / q in one round trip, the rows by
 *     cp.async, fp32 dot products; it stores scale x q . key (-inf for an invalid key) to the
 *     workspace, sc[(row * H + h) * ld + j], and ends.
 *  2. softmax + PV (this file): grid (C / 8, row x 8-head group), 256 threads. A block owns 8
 *     channels of 8 heads of one row over ALL its keys (<= M7_KMAX = 2048: 8 a thread):
 *     - before the wait: the row's block table into shared memory (qseq and the tables are step
 *       inputs the host uploads before the step's first kernel: cuda_common.cuh's narrow
 *       exception, as indexer_fast.cu and mla_attn_dec6.cu);
 *     - after it, in one round trip: the key count, the thread's 8 top-k entries, the scores of
 *       the 8 heads (cp.async into shared memory); then, as soon as the entries land, the 16 bytes
 *       of each of its keys' rows it needs (8 bf16 channels; the rows are in L2 after launch 1);
 *     - per head (one warp): max, p = e^(s - max) in place, the sum, 1 / sum;
 *     - PV: 64 accumulators a thread (8 heads x 8 channels) over its 8 keys, then a butterfly
 *       reduce-scatter over the warp (62 shuffles: lane l ends with outputs 2l, 2l + 1) and the 8
 *       warps' partials summed in warp order by 64 threads: a fixed order, so the bits do not
 *       depend on timing.
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
#define M7_TBL_MAX 2048 /* block-table entries preloaded into shared memory (8 KB) */

struct m7_args {
	const uint8_t *base;
	int64_t n_blocks;
	size_t block_bytes, offset;
	int bt, row_bytes, elt; /* elt: bytes a cached value (2 bf16, 4 fp32) */
	const int32_t *qseq, *blocks, *n_keys, *sel;
	int64_t ld_blocks, pos0, ld_sel, max_keys;
	int tbl_n; /* table entries in shared memory (0: looked up in global memory) */
	int early; /* qseq and the table read before KDEP_ENTRY (TANDEM_MLA_DEC6_EARLY=0: after) */
	const float *sc; /* launch 1's scores, [row * H + h][ld_sc] (ld_sc a multiple of 4) */
	int64_t ld_sc;
	int H, C, n_hg;
	float *out;
};

/* the pool row of position p in table tbl (the first tbl_n entries in tbl_s), or NULL */
__device__ __forceinline__ const uint8_t *m7_row(const m7_args &a, const int32_t *tbl_s, int32_t tbl,
                                                 int32_t p)
{
	if (p < 0 || (int64_t)p >= a.ld_blocks * a.bt)
		return NULL;
	const int bi = p / a.bt;
	const int64_t blk =
	    bi < a.tbl_n ? (int64_t)tbl_s[bi] : (int64_t)a.blocks[(int64_t)tbl * a.ld_blocks + bi];
	if (blk < 0 || blk >= a.n_blocks)
		return NULL;
	return a.base + (size_t)blk * a.block_bytes + a.offset +
	       (size_t)(p - bi * a.bt) * (size_t)a.row_bytes;
}

/* qseq[row] and the first tbl_n entries of its table into shared memory (published by a barrier
 * before use) */
__device__ __forceinline__ int32_t m7_table(const m7_args &a, int32_t *tbl_s, int64_t row)
{
	const int32_t tbl = a.qseq ? a.qseq[row] : 0;
	const int32_t *tr = a.blocks + (int64_t)tbl * a.ld_blocks;
	for (int i = (int)threadIdx.x; i < a.tbl_n; i += M7_THREADS)
		tbl_s[i] = tr[i];
	return tbl;
}

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

/* key i (0..3) of thread tid: 4 consecutive keys (one 16-byte score load a head) */
__device__ __forceinline__ int m7_key(int tid, int i)
{
	return 4 * tid + i;
}

template <bool F32> __global__ void __launch_bounds__(M7_THREADS, 1) mla_dec7_pv_kernel(m7_args a)
{
	constexpr int NO = M7_HG * M7_CB; /* outputs a block: 32 */
	extern __shared__ __align__(16) uint8_t m7_sm[];
	float *red_s = (float *)m7_sm; /* [WARPS][NO] */
	float *mx_s = red_s + M7_WARPS * NO; /* [WARPS][HG] the warps' maxima, then their sums */
	float *mh_s = mx_s + M7_WARPS * M7_HG; /* [HG] the heads' maxima */
	int32_t *tbl_s = (int32_t *)(mh_s + M7_HG); /* [tbl_n] */
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int64_t row = blockIdx.y / a.n_hg;
	const int h0 = (int)(blockIdx.y % a.n_hg) * M7_HG, hv = min(M7_HG, a.H - h0);
	const int c0 = (int)blockIdx.x * M7_CB;

	/* step inputs only before the wait (the file comment) */
	int32_t tbl = 0;
	if (a.early)
		tbl = m7_table(a, tbl_s, row);
	KDEP_ENTRY();
	a.sc = kdep_after(a.sc);
	a.sel = kdep_after(a.sel);
	a.n_keys = kdep_after(a.n_keys);
	if (!a.early)
		tbl = m7_table(a, tbl_s, row);

	/* one round trip: the key count, this thread's entries and its keys' scores of the 8 heads */
	const int64_t nk_raw = a.n_keys ? (int64_t)a.n_keys[row] : a.pos0 + row + 1;
	int32_t pos[M7_KPT];
#pragma unroll
	for (int i = 0; i < M7_KPT; i++) {
		const int j = m7_key(tid, i);
		pos[i] = j;
		if (a.sel)
			pos[i] = j < a.ld_sel && j < a.max_keys ? a.sel[row * a.ld_sel + j] : -1;
	}
	float s[M7_HG][M7_KPT]; /* scores, then p */
	const int j0 = m7_key(tid, 0);
#pragma unroll
	for (int h = 0; h < M7_HG; h++) {
		float4 v4 = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
		if (h < hv && j0 < a.ld_sc)
			v4 = __ldcg((const float4 *)(a.sc + (row * a.H + h0 + h) * a.ld_sc + j0));
		s[h][0] = v4.x;
		s[h][1] = v4.y;
		s[h][2] = v4.z;
		s[h][3] = v4.w;
	}
	const int nk = (int)(nk_raw < 0 ? 0 : nk_raw > a.max_keys ? a.max_keys : nk_raw);
	__syncthreads(); /* tbl_s */

	/* this thread's 4 channels of each of its keys' rows (8 bytes bf16, 16 fp32), in flight over
	 * the max */
	float vf[M7_KPT][M7_CB];
	{
		uint4 w[M7_KPT];
#pragma unroll
		for (int i = 0; i < M7_KPT; i++) {
			const uint8_t *p = j0 + i < nk ? m7_row(a, tbl_s, tbl, pos[i]) : NULL;
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

	/* the max of each head: the thread's keys, the warp (shuffles), the warps (8 threads) */
	float m[M7_HG];
#pragma unroll
	for (int h = 0; h < M7_HG; h++) {
		m[h] = -INFINITY;
#pragma unroll
		for (int i = 0; i < M7_KPT; i++)
			if (j0 + i < nk)
				m[h] = fmaxf(m[h], s[h][i]);
#pragma unroll
		for (int o = 16; o > 0; o >>= 1)
			m[h] = fmaxf(m[h], __shfl_xor_sync(0xffffffffu, m[h], o));
	}
	if (lane < M7_HG) {
		float mv = m[0];
#pragma unroll
		for (int h = 1; h < M7_HG; h++)
			mv = lane == h ? m[h] : mv;
		mx_s[warp * M7_HG + lane] = mv;
	}
	__syncthreads(); /* mx_s */
	if (tid < M7_HG) {
		float mh = mx_s[tid];
#pragma unroll
		for (int w = 1; w < M7_WARPS; w++)
			mh = fmaxf(mh, mx_s[w * M7_HG + tid]);
		mh_s[tid] = mh;
	}
	__syncthreads(); /* mh_s; every thread has read mx_s's maxima */
	float l[M7_HG];
	{
		const float4 ma = *(const float4 *)mh_s, mb = *(const float4 *)(mh_s + 4);
		const float mhv[M7_HG] = {ma.x, ma.y, ma.z, ma.w, mb.x, mb.y, mb.z, mb.w};
#pragma unroll
		for (int h = 0; h < M7_HG; h++) {
			l[h] = 0.0f;
#pragma unroll
			for (int i = 0; i < M7_KPT; i++) {
				/* a key past the count, or a head with no valid key: weight 0 */
				const float p =
				    j0 + i < nk && mhv[h] != -INFINITY ? expf(s[h][i] - mhv[h]) : 0.0f;
				s[h][i] = p;
				l[h] += p;
			}
		}
	}

	/* PV over this thread's keys: acc[h * 4 + c] */
	float acc[NO];
#pragma unroll
	for (int h = 0; h < M7_HG; h++)
#pragma unroll
		for (int c = 0; c < M7_CB; c++) {
			float r = 0.0f;
#pragma unroll
			for (int i = 0; i < M7_KPT; i++)
				r = fmaf(s[h][i], vf[i][c], r);
			acc[h * M7_CB + c] = r;
		}
	/* butterfly reduce-scatter over the warp: at the end lane l holds output l */
	static_assert(NO == 32, "the reduce-scatter below is written for 32 outputs");
	m7_rs_step<16>(acc, lane, 16);
	m7_rs_step<8>(acc, lane, 8);
	m7_rs_step<4>(acc, lane, 4);
	m7_rs_step<2>(acc, lane, 2);
	m7_rs_step<1>(acc, lane, 1);
	/* the sums of p the same way over lane bits 16, 8, 4 (head lane >> 2 left in l[0]), then
	 * added over bits 2 and 1 */
	m7_rs_step<4>(l, lane, 16);
	m7_rs_step<2>(l, lane, 8);
	m7_rs_step<1>(l, lane, 4);
	l[0] += __shfl_xor_sync(0xffffffffu, l[0], 2);
	l[0] += __shfl_xor_sync(0xffffffffu, l[0], 1);
	red_s[warp * NO + lane] = acc[0];
	if ((lane & 3) == 0) /* lanes 4h .. 4h + 3 hold head h's sum */
		mx_s[warp * M7_HG + (lane >> 2)] = l[0];
	__syncthreads();
	if (tid < NO) {
		const int h = tid / M7_CB, c = tid % M7_CB;
		float r = 0.0f, ls = 0.0f;
#pragma unroll
		for (int w = 0; w < M7_WARPS; w++) {
			r += red_s[w * NO + tid];
			ls += mx_s[w * M7_HG + h];
		}
		if (h < hv && c0 + c < a.C)
			a.out[(row * a.H + h0 + h) * (int64_t)a.C + c0 + c] = ls > 0.0f ? r / ls : 0.0f;
	}
}

/* launches of mla_dec7 (both kernels: one count a call; test_ops_mla and bench_cuda_attn check
 * which kernel took a call) */
extern "C" {
unsigned long long kmla_dec7_launches = 0;
int kmla_dec7_default_on = 0;
}

/* On with TANDEM_MLA_DEC_V=7, and with TANDEM_MLA_DEC_V unset when kmla_dec7_default_on. Then
 * TANDEM_MLA_DEC unset -> up to M7_ROWS_DEFAULT query rows; "0" -> never; N -> up to N rows (A/B,
 * tests). Read on every call (a getenv; at capture only under graphs). */
#define M7_ROWS_DEFAULT 8
static int m7_rows_limit(void)
{
	const char *v = getenv("TANDEM_MLA_DEC_V");
	if (v && *v ? strcmp(v, "7") != 0 : !kmla_dec7_default_on)
		return 0;
	const char *e = getenv("TANDEM_MLA_DEC");
	if (!e || !*e)
		return M7_ROWS_DEFAULT;
	char *end = NULL;
	const long n = strtol(e, &end, 10);
	if (*end || n < 0)
		return M7_ROWS_DEFAULT;
	return n > 65535 ? 65535 : (int)n;
}

static size_t m7_smem(int tbl_n)
{
	return (size_t)(M7_WARPS * M7_HG * M7_CB + M7_WARPS * M7_HG + M7_HG) * sizeof(float) +
	       (size_t)tbl_n * sizeof(int32_t);
}

/* kcuda_mla_attn's first choice under TANDEM_MLA_DEC_V=7 for a call mm_fits (mla_attn_mma.cu)
 * accepted: ERR_UNSUPPORTED (nothing launched) when off, or the shape / device does not suit it */
int kmla_dec7_launch(struct kcuda_ctx *c, const struct kcuda_kv_view *kv, const struct kcuda_attn_rows *rows,
                     const float *q, int64_t H, int64_t C, float scale, float *out)
{
	if (rows->n_q < 1 || rows->n_q > m7_rows_limit())
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
	const size_t sc_bytes = (size_t)rows->n_q * (size_t)H * (size_t)ld_s * sizeof(float);
	if (sc_bytes > c->ws_bytes)
		return ERR_UNSUPPORTED;
	const int tbl_n = rows->ld_blocks <= M7_TBL_MAX ? (int)rows->ld_blocks : 0;
	const size_t smem = m7_smem(tbl_n);
	int max_smem = 0;
	if (cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, c->device) !=
	    cudaSuccess) {
		(void)cudaGetLastError();
		return ERR_UNSUPPORTED;
	}
	if (smem > (size_t)max_smem)
		return ERR_UNSUPPORTED;
	const bool f32 = !kv->bf16;
	void (*fn)(m7_args) = f32 ? mla_dec7_pv_kernel<true> : mla_dec7_pv_kernel<false>;
	if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)m7_smem(M7_TBL_MAX)) !=
	    cudaSuccess) {
		(void)cudaGetLastError();
		return ERR_UNSUPPORTED;
	}

	float *sc = (float *)c->ws;
	int rc = kmla_dec6_scores(c, kv, rows, q, H, C, scale, sc, ld_s);
	if (rc)
		return rc; /* ERR_UNSUPPORTED: nothing launched, the caller takes the next kernel */

	m7_args a;
	a.base = (const uint8_t *)kv->base;
	a.n_blocks = kv->n_blocks;
	a.block_bytes = kv->block_bytes;
	a.offset = kv->offset;
	a.bt = kv->block_tokens;
	a.elt = kv->bf16 ? 2 : 4;
	a.row_bytes = (int)kv->dim * a.elt;
	a.qseq = rows->qseq;
	a.blocks = rows->blocks;
	a.n_keys = rows->n_keys;
	a.sel = rows->sel;
	a.ld_blocks = rows->ld_blocks;
	a.pos0 = rows->pos0;
	a.ld_sel = rows->ld_sel;
	a.max_keys = rows->max_keys;
	a.tbl_n = tbl_n;
	const char *ee = getenv("TANDEM_MLA_DEC6_EARLY");
	a.early = !(ee && strcmp(ee, "0") == 0);
	a.sc = sc;
	a.ld_sc = ld_s;
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
