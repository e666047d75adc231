/* DSA lightning-indexer scores over the paged indexer-key cache, batched over query rows, and the
 * indexer's top-k selection (scores + kcuda_topk_idx): the CUDA twin of forward.c's index_task
 * (kcpu_indexer_scores then kcpu_topk per query over its causal context).
 *
 * Grid of the score kernel: (key tile of 64 positions, query row). The row's HI x DI query and HI
 * weights sit in shared memory; the 64 key rows are copied there as fp32 (row stride DI + 1:
 * lane = key reads distinct banks). Thread (key t = tid % 64, head group g = tid / 64) computes
 * d_h = scale * (q_h . k_t) for heads h = g, g + 4, ...; the per-head values go through shared
 * memory and one thread per key sums w_h * d_h over h = 0..HI-1 IN ORDER with ReLU, as the CPU op
 * does (separate multiply and add, no FMA contraction), so equal inputs give bit-equal scores
 * whenever the dot products are exact (e.g. small-integer test data); otherwise ~1e-6 relative.
 * Plain fp32 CUDA cores (sm_90/100/120). */
#include <errno.h>

#include "kernels/cuda/fused.h"
#include "kernels/cuda/mla_attn_mode.cuh"
#include "kernels/cuda/topk_sel.cuh"
#include "kernels/cuda/topk_fast.cuh"

#define IDX_THREADS 256
#define IDX_TK 64 /* keys per block */
#define IDX_HG (IDX_THREADS / IDX_TK)

__global__ void __launch_bounds__(IDX_THREADS) indexer_scores_kernel(idx_args a)
{
	KDEP_ENTRY();
	extern __shared__ float sm[];
	const int HI = a.HI, DI = a.DI, DP = DI + 1;
	float *q_s = sm; /* [HI][DI] */
	float *k_s = q_s + HI * DI; /* [TK][DP] */
	float *d_s = k_s + IDX_TK * DP; /* [HI][TK] */
	float *w_s = d_s + HI * IDX_TK; /* [HI] */
	const int64_t row = blockIdx.y;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	int64_t nk = a.n_keys ? (int64_t)a.n_keys[row] : a.pos0 + row + 1;
	if (nk < 0 || nk > a.max_keys) {
		if (tid == 0 && blockIdx.x == 0)
			atomicAdd(a.err, 1u);
		nk = nk < 0 ? 0 : a.max_keys;
	}
	if (a.skip_le > 0 && nk <= a.skip_le)
		return; /* every key is selected: the scores are not read */
	const int64_t t0 = (int64_t)blockIdx.x * IDX_TK;
	if (t0 >= nk)
		return;
	const int tn = (int)min((int64_t)IDX_TK, nk - t0);

	for (int i = tid; i < HI * DI; i += IDX_THREADS)
		q_s[i] = a.q[row * (int64_t)HI * DI + i];
	for (int i = tid; i < HI; i += IDX_THREADS)
		w_s[i] = a.w[row * (int64_t)HI + i];
	const int32_t tbl = a.qseq ? a.qseq[row] : 0;
	__shared__ int bad_s[IDX_TK];
	for (int t = warp; t < IDX_TK; t += IDX_THREADS / 32) {
		const int64_t p = t0 + t;
		const uint8_t *rp = NULL;
		if (t < tn && p < a.ld_blocks * a.bt) {
			const int64_t blk = a.blocks[(int64_t)tbl * a.ld_blocks + p / a.bt];
			if (blk >= 0 && blk < a.n_blocks)
				rp = a.base + (size_t)blk * a.block_bytes + a.offset +
				     (size_t)(p % a.bt) * (size_t)DI * (a.bf16 ? 2u : 4u);
		}
		if (lane == 0) {
			bad_s[t] = t < tn && !rp;
			if (t < tn && !rp)
				atomicAdd(a.err, 1u);
		}
		float *dst = k_s + t * DP;
		if (!rp)
			for (int i = lane; i < DI; i += 32)
				dst[i] = 0.0f;
		else if (a.bf16)
			for (int i = lane; i < DI; i += 32)
				dst[i] = kc_bf2f(((const uint16_t *)rp)[i]);
		else
			for (int i = lane; i < DI; i += 32)
				dst[i] = __ldg((const float *)rp + i);
	}
	__syncthreads();
	{
		const int t = tid % IDX_TK, g = tid / IDX_TK;
		const float *kr = k_s + t * DP;
		for (int h0 = g; h0 < HI; h0 += 4 * IDX_HG) {
			/* 4 heads at a time: h0, h0 + IDX_HG, h0 + 2 IDX_HG, h0 + 3 IDX_HG */
			float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
			for (int i = 0; i < DI; i++) {
				const float kv = kr[i];
#pragma unroll
				for (int j = 0; j < 4; j++) {
					const int h = h0 + j * IDX_HG;
					if (h < HI)
						d[j] = fmaf(q_s[h * DI + i], kv, d[j]);
				}
			}
#pragma unroll
			for (int j = 0; j < 4; j++) {
				const int h = h0 + j * IDX_HG;
				if (h < HI)
					d_s[h * IDX_TK + t] = __fmul_rn(d[j], a.scale);
			}
		}
	}
	__syncthreads();
	if (tid < tn) {
		float s = 0.0f;
		for (int h = 0; h < HI; h++) {
			const float d = d_s[h * IDX_TK + tid];
			if (d > 0.0f)
				s = __fadd_rn(s, __fmul_rn(w_s[h], d));
		}
		a.scores[row * a.ld + t0 + tid] = bad_s[tid] ? -INFINITY : s;
	}
}

static int idx_fill(struct kcuda_ctx *c, const struct kcuda_kv_view *kv, const struct kcuda_attn_rows *rows,
                    const float *q, const float *w, int64_t HI, int64_t DI, float scale, idx_args *a)
{
	if (!c || !kv || !rows || !q || !w || !kv->base || !rows->blocks || HI < 1 || DI < 1 ||
	    kv->dim != DI || kv->block_tokens < 1 || kv->n_blocks < 0 || rows->n_q < 0 ||
	    rows->ld_blocks < 1 || rows->max_keys < 0 || rows->sel)
		return kcuda_bad_arg(
		    "indexer",
		    "HI %lld DI %lld kv dim %lld block_tokens %d n_q %lld ld_blocks %lld max_keys %lld sel "
		    "%s%s",
		    (long long)HI, (long long)DI, kv ? (long long)kv->dim : -1LL,
		    kv ? (int)kv->block_tokens : -1, rows ? (long long)rows->n_q : -1LL,
		    rows ? (long long)rows->ld_blocks : -1LL, rows ? (long long)rows->max_keys : -1LL,
		    rows && rows->sel ? "set (not allowed)" : "null",
		    !c || !kv || !rows || !q || !w || !kv->base || !rows->blocks ? ", or a null pointer"
		                                                                 : "");
	if (rows->max_keys > INT32_MAX / 2 || HI > 1024 || DI > 1024)
		return ERR_LIMIT;
	const size_t smem =
	    sizeof(float) * ((size_t)HI * DI + (size_t)IDX_TK * (DI + 1) + (size_t)HI * IDX_TK + HI);
	if (smem > 200 * 1024)
		return ERR_LIMIT;
	a->base = (const uint8_t *)kv->base;
	a->n_blocks = kv->n_blocks;
	a->block_bytes = kv->block_bytes;
	a->offset = kv->offset;
	a->bt = kv->block_tokens;
	a->bf16 = kv->bf16 ? 1 : 0;
	a->qseq = rows->qseq;
	a->blocks = rows->blocks;
	a->n_keys = rows->n_keys;
	a->ld_blocks = rows->ld_blocks;
	a->pos0 = rows->pos0;
	a->max_keys = rows->max_keys;
	a->q = q;
	a->w = w;
	a->HI = (int)HI;
	a->DI = (int)DI;
	a->scale = scale;
	a->err = c->err_dev;
	a->scores = NULL;
	a->ld = 0;
	a->tiles = 0;
	a->skip_le = 0;
	a->qr_R = 0;
	a->qr_pairing = 0;
	a->qr_inv = NULL;
	a->qr_pos = NULL;
	a->sel_k = 0;
	a->sel = NULL;
	a->nsel = NULL;
	a->ld_sel = 0;
	a->zs = c->zs;
	a->sel_smem = 0;
	a->pf = 0;
	a->early_new = 0;
	a->n_rows = 0;
	a->even = 0;
	return 0;
}

/* the arguments for query rows r0.. of a (scores, if set, move along with the rows) */
static idx_args idx_rows_from(const idx_args &a, int64_t r0)
{
	idx_args b = a;
	b.qr_pos = a.qr_pos ? a.qr_pos + r0 : NULL;
	b.q = a.q + r0 * a.HI * a.DI;
	b.w = a.w + r0 * a.HI;
	b.qseq = a.qseq ? a.qseq + r0 : NULL;
	b.n_keys = a.n_keys ? a.n_keys + r0 : NULL;
	b.pos0 = a.pos0 + r0;
	b.scores = a.scores ? a.scores + r0 * a.ld : NULL;
	return b;
}

/* grid (key tiles, rows), rows in launches of at most 65535 (the grid's y limit) */
static int idx_launch(struct kcuda_ctx *c, const idx_args &a, int64_t n_q)
{
	if (!kattn_use_ref() || a.qr_R) { /* the tensor-core kernel (indexer_fast.cu) where it fits */
		int rc = kcuda_indexer_fast_launch(c, a, n_q);
		if (rc != ERR_UNSUPPORTED || a.qr_R) /* only it ropes q: never the other kernel then */
			return rc;
	}
	const size_t smem = sizeof(float) * ((size_t)a.HI * a.DI + (size_t)IDX_TK * (a.DI + 1) +
	                                     (size_t)a.HI * IDX_TK + a.HI);
	const size_t optin = (size_t)kcuda_smem_optin(c->device);
	if (smem > optin) {
		fprintf(
		    stderr,
		    "kcuda: indexer: %d heads x %d dims need %zu bytes of shared memory a block, device %d "
		    "allows %zu\n",
		    (int)a.HI, (int)a.DI, smem, c->device, optin);
		return ERR_LIMIT;
	}
	if (cudaFuncSetAttribute(indexer_scores_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
	                         (int)smem) != cudaSuccess)
		return kcuda_launch_status("indexer attribute");
	const int64_t tiles = (a.max_keys + IDX_TK - 1) / IDX_TK;
	if (tiles == 0 || n_q == 0)
		return 0;
	if (tiles > INT32_MAX)
		return ERR_LIMIT;
	for (int64_t r0 = 0; r0 < n_q; r0 += 65535) {
		const int64_t nr = n_q - r0 < 65535 ? n_q - r0 : 65535;
		dim3 grid((unsigned)tiles, (unsigned)nr);
		int rc = klaunch("indexer_scores", indexer_scores_kernel, dim3(grid), dim3(IDX_THREADS), smem,
		                 c->stream, idx_rows_from(a, r0));
		if (rc)
			return rc;
	}
	return 0;
}

extern "C" int kcuda_indexer_scores(struct kcuda_ctx *c, const struct kcuda_kv_view *kv,
                                    const struct kcuda_attn_rows *rows, const float *q, const float *w,
                                    int64_t HI, int64_t DI, float scale, float *scores, int64_t ld)
{
	idx_args a;
	int rc = idx_fill(c, kv, rows, q, w, HI, DI, scale, &a);
	if (rc)
		return rc;
	if (!scores || ld < rows->max_keys)
		return kcuda_bad_arg("indexer_scores", "scores %p, ld %lld < max_keys %lld", (void *)scores,
		                     (long long)ld, (long long)rows->max_keys);
	a.scores = scores;
	a.ld = ld;
	return idx_launch(c, a, rows->n_q);
}

/* TANDEM_IDX_TOPK=fused: scores and top-k in one launch. Off by default: the H200 run of 19:30
 * measured it slower than the score kernel + a separate top-k (docs/PERFORMANCE.md, idx4) */
static int idx_sel_enabled(void)
{
	const char *e = getenv("TANDEM_IDX_TOPK");
	return e && strcmp(e, "fused") == 0;
}

/* scores + top-k of every row (a filled by idx_fill, maybe with the q rope set) */
static int idx_topk_run(struct kcuda_ctx *c, idx_args &a, const struct kcuda_attn_rows *rows, int k,
                        int32_t *sel, int64_t ld_sel, int32_t *nsel)
{
	int rc;
	if (!sel || k < 0 || ld_sel < k)
		return kcuda_bad_arg("indexer_topk", "sel %p, k %d, ld_sel %lld", (void *)sel, k,
		                     (long long)ld_sel);
	const int64_t ld = rows->max_keys > 0 ? rows->max_keys : 1;
	const size_t sbytes = ((size_t)ld * sizeof(float) + 255) & ~(size_t)255;
	/* decode-sized batches: scores and top-k in one launch (indexer_fast.cu + topk_sel.cuh), the
	 * scores of all rows in the workspace */
	if (idx_sel_enabled() && !kattn_use_ref() && rows->n_q >= 1 && rows->n_q <= KSEL_MAX_ROWS && k >= 1 &&
	    c->ws_bytes / sbytes >= (size_t)rows->n_q) {
		idx_args b = a;
		b.scores = (float *)c->ws;
		b.ld = (int64_t)(sbytes / sizeof(float));
		b.sel_k = k;
		b.sel = sel;
		b.ld_sel = ld_sel;
		b.nsel = nsel;
		rc = kcuda_indexer_sel_launch(c, b, rows->n_q);
		if (rc != ERR_UNSUPPORTED)
			return rc;
	}
	/* scores of as many rows as fit the workspace, then their top-k. Decode-sized batches take the
	 * multi-block radix top-k, whose histograms go after the scores in the workspace; many rows
	 * (prefill) the one-block-per-row kernel, which needs no scratch. */
	int radix = !kattn_use_ref() && rows->n_q <= 64;
	/* rows that fit one block's shared memory: one block a row instead of the radix path's several
	 * (one launch; five and a memset with TANDEM_TOPK_RADIX1=0) (fused.h; TANDEM_FUSE=0 keeps the radix
	 * path). Up to KFUSE_TOPK_SHORT_DEFAULT keys by default: one block for a 32k row measured ~80 us on
	 * the H200 at 16:15 (its histogram atomics then all met on one bin; per-warp histograms since), the
	 * radix path ~25 us. TANDEM_TOPK_SHORT_MAX sets the limit (0 .. KFUSE_TOPK_SHORT) to measure it
	 * again. */
	/* topk_fast.cu takes rows up to KFUSE_TOPK_SHORT, but above 8192 keys the radix path's
	 * several blocks per row won in the decode step (H200, 2026-11-29 23:00: GLM-5 batch 1 ctx
	 * 32k 9.63 ms with topk_fast at 32768 keys, 9.07 with the radix path; at 4k topk_fast saves
	 * 0.52 ms; again 2026-12-03 with the radix path in one launch: 32k 7.81-7.85 against 8.96,
	 * ctx 8192 equal, ctx 4096 6.62-6.67 against 7.25 with the radix path):
	 * KFUSE_TOPK_SHORT_DEFAULT stays the limit; TANDEM_TOPK_SHORT_MAX moves it. */
	int64_t short_max = KFUSE_TOPK_SHORT_DEFAULT;
	const char *sm_env = getenv("TANDEM_TOPK_SHORT_MAX");
	if (sm_env && atoll(sm_env) >= 0)
		short_max = atoll(sm_env) < KFUSE_TOPK_SHORT ? atoll(sm_env) : KFUSE_TOPK_SHORT;
	const int shortk = !kattn_use_ref() && kfuse_enabled() &&
	                   sbytes <= (size_t)short_max * sizeof(float) &&
	                   kcuda_topk_idx_short_fits(c, (int64_t)(sbytes / sizeof(float)));
	if (shortk)
		radix = 0;
	const size_t scratch1 = kcuda_topk_idx_radix_scratch(1, (int64_t)(sbytes / sizeof(float)));
	if (radix && c->ws_bytes < sbytes + scratch1)
		radix = 0; /* no room for the histograms: the ref kernel needs none */
	int64_t per = (int64_t)(c->ws_bytes / (sbytes + (radix ? scratch1 : 0)));
	if (per < 1)
		return ERR_LIMIT;
	if (per > rows->n_q)
		per = rows->n_q;
	a.scores = NULL;
	a.ld = (int64_t)(sbytes / sizeof(float));
	for (int64_t r0 = 0; r0 < rows->n_q; r0 += per) {
		const int64_t nr = rows->n_q - r0 < per ? rows->n_q - r0 : per;
		idx_args b = idx_rows_from(a, r0);
		b.scores = (float *)c->ws;
		/* rows whose keys all make the top-k: the short top-k writes 0..n-1 without reading
		 * the scores (decode at contexts up to k), so they are not computed */
		b.skip_le = shortk ? k : 0;
		if ((rc = idx_launch(c, b, nr)))
			return rc;
		rc = ERR_UNSUPPORTED;
		if (shortk)
			rc = kcuda_topk_idx_short(c, b.scores, b.ld, nr, b.n_keys, b.pos0, k,
			                          sel + r0 * ld_sel, ld_sel, nsel ? nsel + r0 : NULL);
		else if (radix)
			rc = kcuda_topk_idx_radix(c, b.scores, b.ld, nr, b.n_keys, b.pos0, k,
			                          sel + r0 * ld_sel, ld_sel, nsel ? nsel + r0 : NULL,
			                          (uint8_t *)c->ws + (size_t)per * sbytes,
			                          c->ws_bytes - (size_t)per * sbytes);
		if (rc == ERR_UNSUPPORTED)
			rc = kcuda_topk_idx_ref(c, b.scores, b.ld, nr, b.n_keys, b.pos0, k, sel + r0 * ld_sel,
			                        ld_sel, nsel ? nsel + r0 : NULL);
		if (rc)
			return rc;
	}
	return 0;
}

extern "C" int kcuda_indexer_topk(struct kcuda_ctx *c, const struct kcuda_kv_view *kv,
                                  const struct kcuda_attn_rows *rows, const float *q, const float *w,
                                  int64_t HI, int64_t DI, float scale, int k, int32_t *sel, int64_t ld_sel,
                                  int32_t *nsel)
{
	idx_args a;
	int rc = idx_fill(c, kv, rows, q, w, HI, DI, scale, &a);
	if (rc)
		return rc;
	return idx_topk_run(c, a, rows, k, sel, ld_sel, nsel);
}

/* kfuse_indexer_topk_rope declines unless TANDEM_IDX_FOLD=1 (the caller ropes q_I with kcuda_rope):
 * off by default, as the backend's fold (the 16:40 H200 run: the fold cost 0.86 ms per batch-1 step) */
static int idx_fold_enabled(void)
{
	const char *e = getenv("TANDEM_IDX_FOLD");
	return e && strcmp(e, "1") == 0;
}

extern "C" int kfuse_indexer_topk_rope(struct kcuda_ctx *c, const struct kcuda_kv_view *kv,
                                       const struct kcuda_attn_rows *rows, const float *q, const float *w,
                                       int64_t HI, int64_t DI, float scale, int k, int32_t *sel,
                                       int64_t ld_sel, int32_t *nsel, const struct kfuse_rope *rq, int64_t R)
{
	idx_args a;
	int rc = idx_fill(c, kv, rows, q, w, HI, DI, scale, &a);
	if (rc)
		return rc;
	if (!rq || !rq->inv_freq || !rq->pos || (rq->pairing != 0 && rq->pairing != 1) || R < 2 || R % 2 ||
	    R > DI)
		return kcuda_bad_arg("indexer_topk_rope", "R %lld DI %lld, or a bad rope description",
		                     (long long)R, (long long)DI);
	a.qr_R = (int)R;
	a.qr_pairing = rq->pairing;
	a.qr_inv = rq->inv_freq;
	a.qr_pos = rq->pos;
	/* only the tensor-core score kernel ropes on its loads: decline before launching anything */
	if (!idx_fold_enabled() || kattn_use_ref() || !kcuda_indexer_fast_ok(c, a))
		return ERR_UNSUPPORTED;
	return idx_topk_run(c, a, rows, k, sel, ld_sel, nsel);
}
