/* The DSA indexer on the GPU against the CPU ops (kcpu_indexer_scores + kcpu_topk per query, as
 * forward.c's index_task), over a paged indexer-key pool (fp32 and bf16; scattered blocks; the
 * indexer part sits after two latent layers in each block).
 * 1. Exact data: q, k small integers, w multiples of 1/8: every dot product is exact on both sides,
 *    so scores must be BIT-equal and the top-k selection must equal the CPU's exactly, with heavy
 *    ties (integer levels, all-zero keys, duplicated keys). Contexts 1, 31, 33, 2048, 2049, 32768,
 *    100000 with K = 2048 (decode rows), and causal prefill rows (start 3000, T 40).
 * 2. Random float data: scores within 2e-6 * max|score| of the CPU's; the GPU selection equals
 *    kcpu_topk over the GPU's own scores exactly; where it differs from the CPU selection, both
 *    positions lie within the score tolerance of the K-th score (float near-ties only).
 * 3. kcuda_topk_idx alone: per-row lengths, NaN and -inf, many ties, k > n, against kcpu_topk.
 * Everything runs five times (the cases past 8192 keys a sixth, with TANDEM_TOPK_RADIX1=0: the radix
 * top-k in five launches instead of one): with TANDEM_IDX_ROWS=force (score blocks of 2 or 4 query rows
 * sharing each key tile wherever the kernel can: the batched rows use different tables, so those blocks run
 * a pass a row; prefill rows share one), with TANDEM_IDX_TILES=5 (default kernels, 5 key tiles a score
 * block), with TANDEM_IDX_TOPK=fused (<= 256 rows of <= 128k keys: scores and top-k in one launch, the
 * selection finished by each row's last block, topk_sel.cuh; kcuda_topk_idx alone: topk_sel.cu), with the
 * default kernels (the score kernel, then the one-block / radix top-k) and with TANDEM_CUDA_ATTN=ref (the
 * first kernels), so one GPU run checks all against the CPU. The fused path's counters live in the context's
 * zeroed scratch and must be zero again after every launch: each case runs its top-k twice (determinism), and
 * a wrong reset would change the second selection. Cases cover the GLM-5 (HI 32) and DeepSeek-V3.2 (HI 64)
 * indexer at DI 128, contexts 1 .. 131072, batches 1 .. 65 (prefill chunks beyond the workspace: the old
 * path), 32- and 64-key tiles, exact data full of ties (the tail's overflow path) and random data (its
 * candidate path). TANDEM_OPS_SMALL=1 keeps the contexts up to ~4k and skips part 3 (for compute-sanitizer
 * runs); TANDEM_OPS_QUICK=1 skips the ref kernels.
 * 4. PDL ordering of the score kernel's early part (indexer_fast.cu looks up and copies the old key
 *    rows before KDEP_ENTRY): a producer kernel (pdl_probe.h) writes q, w and each row's newest key
 *    ~30 us late, right before the launch; the scores must still equal the CPU's bit for bit.
 * Guard bytes around every output. Exit 77 = no GPU (skip). */
#include <errno.h>

#include "common/base/err.h"
#include "kernels/cuda/fused.h"
#include "kernels/cuda/model_fwd.h"
#include "kernels/cuda/pdl_probe.h"
#include "tests/ops/ops_util.h"

#ifndef TANDEM_CUDA
int main(void)
{
	printf("SKIP: built without CUDA (make CUDA=1)\n");
	return 77;
}
#else

#define BT 64
static struct kcuda_ctx *ctx;

struct pool {
	int bf16;
	int64_t DI, n_blocks;
	size_t elt, block_bytes, idx_off;
	uint8_t *h;
	void *d;
};

static void put(struct pool *p, size_t i, float v)
{
	if (p->bf16) {
		uint16_t b = kf32_to_bf16(v);
		memcpy(p->h + 2 * i, &b, 2);
	} else {
		memcpy(p->h + 4 * i, &v, 4);
	}
}
/* exact = 1: integer keys in [-2, 2], 1/16 of the rows all zero, 1/16 copies of an earlier row */
static int pool_init(struct pool *p, int bf16, int64_t DI, int64_t n_blocks, int exact)
{
	const int64_t lat = 40; /* two small latent layers before the indexer slot */
	p->bf16 = bf16;
	p->DI = DI;
	p->n_blocks = n_blocks;
	p->elt = bf16 ? 2 : 4;
	p->idx_off = 2 * (size_t)BT * lat * p->elt;
	p->block_bytes = p->idx_off + (size_t)BT * DI * p->elt;
	size_t bytes = p->block_bytes * (size_t)n_blocks;
	p->h = malloc(bytes);
	if (!p->h || kcuda_alloc(bytes, &p->d))
		return -1;
	for (size_t i = 0; i < bytes / p->elt; i++)
		put(p, i, exact ? (float)((int)(ops_rng_next() % 5) - 2) : ops_rng_unif());
	if (exact) {
		const size_t rb = (size_t)DI * p->elt;
		for (int64_t b = 0; b < n_blocks; b++)
			for (int t = 0; t < BT; t++) {
				uint8_t *row =
				    p->h + (size_t)b * p->block_bytes + p->idx_off + (size_t)t * rb;
				unsigned r = (unsigned)(ops_rng_next() % 16);
				if (r == 0)
					memset(row, 0, rb);
				else if (r == 1 && t > 0)
					memcpy(row, row - rb, rb);
			}
	}
	return kcuda_upload(ctx, p->d, p->h, bytes);
}
static void pool_fini(struct pool *p)
{
	free(p->h);
	kcuda_free(p->d);
}

struct icase {
	const char *name;
	int bf16, exact, HI, DI, K;
	int n_seq;
	const int *lens;
	int start, T; /* prefill rows when T > 0 */
	int bucket; /* > 0: max_keys of the call (a decode graph's context bucket), above every row */
};

static void run_case(const struct icase *ic)
{
	const int64_t HI = ic->HI, DI = ic->DI;
	const int prefill = ic->T > 0, K = ic->K;
	const int n_seq = prefill ? 1 : ic->n_seq;
	int max_len = 0, tot = 0;
	int *lens = malloc(sizeof(int) * (size_t)n_seq);
	for (int s = 0; s < n_seq; s++) {
		lens[s] = prefill ? ic->start + ic->T : ic->lens[s];
		max_len = lens[s] > max_len ? lens[s] : max_len;
		tot += (lens[s] + BT - 1) / BT;
	}
	if (ic->bucket > max_len)
		max_len = ic->bucket;
	const int64_t n_q = prefill ? ic->T : n_seq, n_blocks = tot + 2;
	const int ld_blocks = (max_len + BT - 1) / BT + 1;
	struct pool p = {0};
	int32_t *tbl = malloc(sizeof(int32_t) * (size_t)n_seq * ld_blocks),
	        *perm = malloc(sizeof(int32_t) * (size_t)n_blocks);
	int32_t *nk = malloc(sizeof(int32_t) * (size_t)n_q), *qseq = malloc(sizeof(int32_t) * (size_t)n_q);
	float *q = malloc(sizeof(float) * (size_t)(n_q * HI * DI)),
	      *w = malloc(sizeof(float) * (size_t)(n_q * HI));
	float *aref = calloc((size_t)(n_q * max_len), sizeof(float));
	float *ref = malloc(sizeof(float) * (size_t)(n_q * max_len)),
	      *got = malloc(sizeof(float) * (size_t)(n_q * max_len));
	int32_t *rsel = malloc(sizeof(int32_t) * (size_t)(n_q * K)),
	        *gsel = malloc(sizeof(int32_t) * (size_t)(n_q * K));
	int32_t *gn = malloc(sizeof(int32_t) * (size_t)n_q);
	int32_t *tsel = malloc(sizeof(int32_t) * (size_t)K);
	const void **keys = malloc(sizeof(void *) * (size_t)max_len);
	void *d_tbl = NULL, *d_nk = NULL, *d_qseq = NULL, *d_q = NULL, *d_w = NULL;
	struct ops_dbuf sb = {0}, selb = {0}, nb = {0};
	if (pool_init(&p, ic->bf16, DI, n_blocks, ic->exact)) {
		OPS_CHECK(0, "%s: pool", ic->name);
		goto out;
	}
	for (int64_t i = 0; i < n_blocks; i++)
		perm[i] = (int32_t)i;
	for (int64_t i = n_blocks - 1; i > 0; i--) {
		int64_t j = (int64_t)(ops_rng_next() % (uint64_t)(i + 1));
		int32_t t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
	int used = 0;
	for (int s = 0; s < n_seq; s++)
		for (int b = 0; b < ld_blocks; b++)
			tbl[s * ld_blocks + b] = b < (lens[s] + BT - 1) / BT ? perm[used++] : -1;
	const float ws = 1.0f / sqrtf((float)HI);
	for (int64_t i = 0; i < n_q * HI * DI; i++)
		q[i] = ic->exact ? (float)((int)(ops_rng_next() % 5) - 2) : ops_rng_unif();
	for (int64_t i = 0; i < n_q * HI; i++)
		w[i] = ic->exact ? (float)((int)(ops_rng_next() % 9) - 3) / 8.0f : ops_rng_unif() * ws;
	for (int64_t i = 0; i < n_q; i++) {
		qseq[i] = prefill ? 0 : (int32_t)i;
		nk[i] = prefill ? ic->start + (int32_t)i + 1 : lens[i];
	}
	const float scale = 1.0f / sqrtf((float)DI);
	/* CPU reference (forward.c's index_task) */
	for (int64_t i = 0; i < n_q; i++) {
		const int32_t *t = tbl + (size_t)qseq[i] * ld_blocks;
		for (int j = 0; j < nk[i]; j++)
			keys[j] = p.h + (size_t)t[j / BT] * p.block_bytes + p.idx_off +
			          (size_t)(j % BT) * (size_t)DI * p.elt;
		kcpu_indexer_scores(q + i * HI * DI, w + i * HI, HI, DI, keys, nk[i], p.bf16, scale,
		                    ref + i * max_len);
		kcpu_topk(ref + i * max_len, nk[i], K, rsel + i * K);
	}
	/* The error scale of each score: the same sum over |w|, |q| and |k| (every term's magnitude, so
	 * cancelling terms count). Two fp32 evaluations in different orders differ by up to a few
	 * hundred ulps of it (dot products of DI terms, then HI heads): max|score| of a row is no scale
	 * for a score whose terms cancel (the 14:32 H200 run failed 2e-6 x max|score| on such rows). */
	{
		size_t pb = p.block_bytes * (size_t)p.n_blocks;
		uint8_t *habs = malloc(pb);
		float *qa = malloc(sizeof(float) * (size_t)(n_q * HI * DI)),
		      *wa = malloc(sizeof(float) * (size_t)(n_q * HI));
		if (habs && qa && wa && aref) {
			memcpy(habs, p.h, pb);
			for (size_t b = p.bf16 ? 1 : 3; b < pb; b += p.elt)
				habs[b] &=
				    0x7f; /* little-endian: the sign bit is in the last byte of an element */
			for (int64_t j = 0; j < n_q * HI * DI; j++)
				qa[j] = fabsf(q[j]);
			for (int64_t j = 0; j < n_q * HI; j++)
				wa[j] = fabsf(w[j]);
			for (int64_t i = 0; i < n_q; i++) {
				const int32_t *t = tbl + (size_t)qseq[i] * ld_blocks;
				for (int j = 0; j < nk[i]; j++)
					keys[j] = habs + (size_t)t[j / BT] * p.block_bytes + p.idx_off +
					          (size_t)(j % BT) * (size_t)DI * p.elt;
				kcpu_indexer_scores(qa + i * HI * DI, wa + i * HI, HI, DI, keys, nk[i],
				                    p.bf16, scale, aref + i * max_len);
			}
		}
		free(habs);
		free(qa);
		free(wa);
	}
	if (kcuda_alloc(sizeof(int32_t) * (size_t)n_seq * ld_blocks, &d_tbl) ||
	    kcuda_alloc(sizeof(int32_t) * (size_t)n_q, &d_nk) ||
	    kcuda_alloc(sizeof(int32_t) * (size_t)n_q, &d_qseq) ||
	    kcuda_alloc(sizeof(float) * (size_t)(n_q * HI * DI), &d_q) ||
	    kcuda_alloc(sizeof(float) * (size_t)(n_q * HI), &d_w) ||
	    ops_dbuf_init(ctx, &sb, sizeof(float) * (size_t)(n_q * max_len)) ||
	    ops_dbuf_init(ctx, &selb, sizeof(int32_t) * (size_t)(n_q * K)) ||
	    ops_dbuf_init(ctx, &nb, sizeof(int32_t) * (size_t)n_q)) {
		OPS_CHECK(0, "%s: device allocation", ic->name);
		goto out;
	}
	kcuda_upload(ctx, d_tbl, tbl, sizeof(int32_t) * (size_t)n_seq * ld_blocks);
	kcuda_upload(ctx, d_nk, nk, sizeof(int32_t) * (size_t)n_q);
	kcuda_upload(ctx, d_qseq, qseq, sizeof(int32_t) * (size_t)n_q);
	kcuda_upload(ctx, d_q, q, sizeof(float) * (size_t)(n_q * HI * DI));
	kcuda_upload(ctx, d_w, w, sizeof(float) * (size_t)(n_q * HI));
	struct kcuda_kv_view kv = {.base = p.d,
	                           .n_blocks = p.n_blocks,
	                           .block_bytes = p.block_bytes,
	                           .offset = p.idx_off,
	                           .block_tokens = BT,
	                           .dim = DI,
	                           .bf16 = p.bf16};
	struct kcuda_attn_rows rows = {.n_q = n_q,
	                               .qseq = prefill ? NULL : d_qseq,
	                               .blocks = d_tbl,
	                               .ld_blocks = ld_blocks,
	                               .n_keys = prefill ? NULL : d_nk,
	                               .pos0 = ic->start,
	                               .max_keys = max_len};
	int rc = kcuda_indexer_scores(ctx, &kv, &rows, d_q, d_w, HI, DI, scale, sb.user, max_len);
	OPS_CHECK(rc == 0, "%s: scores rc %d", ic->name, rc);
	rc = kcuda_indexer_topk(ctx, &kv, &rows, d_q, d_w, HI, DI, scale, K, selb.user, K, nb.user);
	OPS_CHECK(rc == 0, "%s: indexer_topk rc %d", ic->name, rc);
	OPS_CHECK(kcuda_sync(ctx) == 0, "%s: sync", ic->name);
	unsigned nbad = 0;
	OPS_CHECK(kcuda_ctx_take_errors(ctx, &nbad) == 0 && nbad == 0, "%s: %u kernel errors", ic->name,
	          nbad);
	size_t g1 = ops_dbuf_get(ctx, &sb, got), g2 = ops_dbuf_get(ctx, &selb, gsel),
	       g3 = ops_dbuf_get(ctx, &nb, gn);
	OPS_CHECK(g1 == 0 && g2 == 0 && g3 == 0, "%s: guard bytes damaged (%zu %zu %zu)", ic->name, g1, g2,
	          g3);
	int64_t n_scores = 0, n_bitdiff = 0, n_selbad = 0, n_own_bad = 0, n_neartie = 0, n_nonfinite = 0;
	double maxerr = 0, maxerr_abs = 0;
	for (int64_t i = 0; i < n_q; i++) {
		const float *r = ref + i * max_len, *g = got + i * max_len;
		double mx = 0;
		for (int j = 0; j < nk[i]; j++)
			mx = fabs(r[j]) > mx ? fabs(r[j]) : mx;
		for (int j = 0; j < nk[i]; j++) {
			n_scores++;
			if (!isfinite(g[j])) {
				n_nonfinite++;
				continue;
			}
			n_bitdiff += memcmp(&r[j], &g[j], 4) != 0;
			double e = fabs((double)g[j] - r[j]) / (mx > 0 ? mx : 1);
			maxerr = e > maxerr ? e : maxerr;
			const double a = aref ? aref[i * max_len + j] : mx;
			double ea = fabs((double)g[j] - r[j]) / (a > 0 ? a : 1);
			maxerr_abs = ea > maxerr_abs ? ea : maxerr_abs;
		}
		const int m = nk[i] < K ? nk[i] : K;
		if (gn[i] != m) {
			n_selbad++;
			continue;
		}
		/* the GPU selection is exactly kcpu_topk over the GPU scores */
		kcpu_topk(g, nk[i], K, tsel);
		n_own_bad += memcmp(tsel, gsel + i * K, sizeof(int32_t) * (size_t)m) != 0;
		if (memcmp(rsel + i * K, gsel + i * K, sizeof(int32_t) * (size_t)m) != 0) {
			if (ic->exact) {
				n_selbad++;
				continue;
			}
			/* float data: differences only at near-ties of the K-th score */
			float kth = INFINITY;
			for (int j = 0; j < m; j++)
				kth = r[rsel[i * K + j]] < kth ? r[rsel[i * K + j]] : kth;
			int a = 0, b = 0;
			while (a < m || b < m) {
				int32_t x = a < m ? rsel[i * K + a] : INT32_MAX,
				        y = b < m ? gsel[i * K + b] : INT32_MAX;
				if (x == y) {
					a++, b++;
					continue;
				}
				int32_t d = x < y ? x : y;
				if (x < y)
					a++;
				else
					b++;
				if (fabs((double)r[d] - kth) > 4e-6 * (mx > 0 ? mx : 1))
					n_selbad++;
				else
					n_neartie++;
			}
		}
	}
	OPS_CHECK(n_nonfinite == 0, "%s: %lld non-finite scores", ic->name, (long long)n_nonfinite);
	if (ic->exact)
		OPS_CHECK(n_bitdiff == 0, "%s: %lld of %lld scores not bit-equal on exact data", ic->name,
		          (long long)n_bitdiff, (long long)n_scores);
	/* 2e-6 of the terms' magnitude = ~34 ulps: room for both fp32 summation orders */
	OPS_CHECK(maxerr_abs <= 2e-6, "%s: max score error %.3g of the sum of |terms| (%.3g of max|score|)",
	          ic->name, maxerr_abs, maxerr);
	OPS_CHECK(n_own_bad == 0, "%s: %lld rows where the GPU top-k != kcpu_topk(GPU scores)", ic->name,
	          (long long)n_own_bad);
	OPS_CHECK(n_selbad == 0, "%s: %lld selection mismatches beyond near-ties", ic->name,
	          (long long)n_selbad);
	/* determinism: the top-k again gives the same selection and counts */
	{
		int32_t *gsel2 = malloc(sizeof(int32_t) * (size_t)(n_q * K)),
		        *gn2 = malloc(sizeof(int32_t) * (size_t)n_q);
		rc = kcuda_indexer_topk(ctx, &kv, &rows, d_q, d_w, HI, DI, scale, K, selb.user, K, nb.user);
		OPS_CHECK(gsel2 && gn2 && rc == 0 && kcuda_sync(ctx) == 0 &&
		              ops_dbuf_get(ctx, &selb, gsel2) == 0 && ops_dbuf_get(ctx, &nb, gn2) == 0 &&
		              memcmp(gn, gn2, sizeof(int32_t) * (size_t)n_q) == 0,
		          "%s: a second top-k gave other counts (rc %d)", ic->name, rc);
		int64_t ndiff = 0;
		for (int64_t i = 0; gsel2 && gn2 && i < n_q; i++)
			if (gn[i] == gn2[i] && gn[i] >= 0 && gn[i] <= K)
				ndiff +=
				    memcmp(gsel + i * K, gsel2 + i * K, sizeof(int32_t) * (size_t)gn[i]) != 0;
		OPS_CHECK(ndiff == 0, "%s: a second top-k selected otherwise in %lld rows", ic->name,
		          (long long)ndiff);
		/* graph replay (decode rows): two top-k calls captured, the graph replayed three times
		 * into a cleared output: the same selection each time (the fused path's counters are
		 * reset inside its kernel; nothing in the graph clears them) */
		if (!prefill && gsel2 && gn2) {
			void *ex = NULL;
			int cap = kfwd_graph_begin(ctx) == 0;
			for (int j = 0; j < 2 && cap; j++)
				cap = kcuda_indexer_topk(ctx, &kv, &rows, d_q, d_w, HI, DI, scale, K,
				                         selb.user, K, nb.user) == 0;
			cap = kfwd_graph_end(ctx, &ex) == 0 && cap;
			OPS_CHECK(cap, "%s: graph capture of the top-k", ic->name);
			int64_t gdiff = 0;
			for (int rep = 0; rep < 3 && cap; rep++) {
				int ok =
				    kcuda_memset(ctx, selb.user, 0xff, sizeof(int32_t) * (size_t)(n_q * K)) ==
				        0 &&
				    kcuda_memset(ctx, nb.user, 0xff, sizeof(int32_t) * (size_t)n_q) == 0 &&
				    kfwd_graph_launch(ctx, ex) == 0 && kcuda_sync(ctx) == 0 &&
				    ops_dbuf_get(ctx, &selb, gsel2) == 0 && ops_dbuf_get(ctx, &nb, gn2) == 0;
				OPS_CHECK(ok, "%s: graph replay %d: launch, sync or guard bytes", ic->name,
				          rep);
				for (int64_t i = 0; ok && i < n_q; i++)
					gdiff +=
					    gn[i] != gn2[i] || (gn[i] >= 0 && gn[i] <= K &&
					                        memcmp(gsel + i * K, gsel2 + i * K,
					                               sizeof(int32_t) * (size_t)gn[i]) != 0);
			}
			OPS_CHECK(gdiff == 0, "%s: graph replays selected otherwise in %lld rows", ic->name,
			          (long long)gdiff);
			if (ex)
				kfwd_graph_destroy(ex);
		}
		free(gsel2);
		free(gn2);
	}
	/* kfuse_indexer_topk_rope: q's first R values per head given unroped and roped by the score
	 * kernel at per-row positions, against the CPU on the roped q. A wrong pairing, position or
	 * offset changes most of the selection; the two fp32 ropes differ by an ulp, so positions may
	 * differ only at near-ties of the K-th score (loose bound) and in at most 1% of a row. Decode
	 * rows; the fast kernels must take GLM-5's shape, ref mode declines. */
	if (!prefill) {
		const int64_t R = DI >= 128 ? 64 : (DI / 2) & ~(int64_t)1; /* tiny GLM: DI 64, R 32 */
		const int pairing = (int)(HI % 2);
		float inv[64], cs[128];
		float *qr = malloc(sizeof(float) * (size_t)(n_q * HI * DI)),
		      *ref2 = malloc(sizeof(float) * (size_t)max_len);
		int32_t *pos = malloc(sizeof(int32_t) * (size_t)n_q),
		        *rsel2 = malloc(sizeof(int32_t) * (size_t)K);
		void *d_pos = NULL, *d_inv = NULL;
		if (!qr || !ref2 || !pos || !rsel2 || kcuda_alloc(sizeof(int32_t) * (size_t)n_q, &d_pos) ||
		    kcuda_alloc(sizeof(float) * (size_t)(R / 2), &d_inv)) {
			OPS_CHECK(0, "%s: rope allocation", ic->name);
		} else {
			kcpu_rope_freqs(inv, R, 10000.0f, 1.0f, 0, 0.0f, 0.0f);
			memcpy(qr, q, sizeof(float) * (size_t)(n_q * HI * DI));
			for (int64_t i = 0; i < n_q; i++) {
				pos[i] = (int32_t)((i * 7919 + nk[i]) % 60000);
				kcpu_rope_cs(inv, R / 2, pos[i], cs);
				for (int64_t h = 0; h < HI; h++)
					kcpu_rope(qr + (i * HI + h) * DI, R, cs, pairing);
			}
			kcuda_upload(ctx, d_pos, pos, sizeof(int32_t) * (size_t)n_q);
			kcuda_upload(ctx, d_inv, inv, sizeof(float) * (size_t)(R / 2));
			const struct kfuse_rope rq = {.inv_freq = d_inv, .pos = d_pos, .pairing = pairing};
			const int ref_mode = getenv("TANDEM_CUDA_ATTN") != NULL;
			rc = kfuse_indexer_topk_rope(ctx, &kv, &rows, d_q, d_w, HI, DI, scale, K, selb.user,
			                             K, nb.user, &rq, R);
			if (ref_mode || (HI == 32 && DI == 128 && p.bf16))
				OPS_CHECK(rc == (ref_mode ? ERR_UNSUPPORTED : 0),
				          "%s: indexer_topk_rope rc %d (%s mode)", ic->name, rc,
				          ref_mode ? "ref" : "fast");
			if (rc == 0) {
				OPS_CHECK(kcuda_sync(ctx) == 0 && ops_dbuf_get(ctx, &selb, gsel) == 0 &&
				              ops_dbuf_get(ctx, &nb, gn) == 0,
				          "%s: rope: sync or guard bytes", ic->name);
				unsigned nb2 = 0;
				OPS_CHECK(kcuda_ctx_take_errors(ctx, &nb2) == 0 && nb2 == 0,
				          "%s: rope: %u kernel errors", ic->name, nb2);
				int64_t n_far = 0, n_many = 0, n_cnt = 0, n_near = 0;
				for (int64_t i = 0; i < n_q; i++) {
					const int32_t *t = tbl + (size_t)qseq[i] * ld_blocks;
					for (int j = 0; j < nk[i]; j++)
						keys[j] = p.h + (size_t)t[j / BT] * p.block_bytes +
						          p.idx_off + (size_t)(j % BT) * (size_t)DI * p.elt;
					kcpu_indexer_scores(qr + i * HI * DI, w + i * HI, HI, DI, keys, nk[i],
					                    p.bf16, scale, ref2);
					const int m = kcpu_topk(ref2, nk[i], K, rsel2);
					if (gn[i] != m) {
						n_cnt++;
						continue;
					}
					double mx = 0;
					float kth = INFINITY;
					for (int j = 0; j < nk[i]; j++)
						mx = fabs(ref2[j]) > mx ? fabs(ref2[j]) : mx;
					for (int j = 0; j < m; j++)
						kth = ref2[rsel2[j]] < kth ? ref2[rsel2[j]] : kth;
					int a2 = 0, b2 = 0, nd = 0;
					const int32_t *gs = gsel + i * K;
					while (a2 < m || b2 < m) {
						const int32_t x = a2 < m ? rsel2[a2] : INT32_MAX,
						              y = b2 < m ? gs[b2] : INT32_MAX;
						if (x == y) {
							a2++, b2++;
							continue;
						}
						const int32_t d = x < y ? x : y;
						if (x < y)
							a2++;
						else
							b2++;
						nd++;
						if (d < 0 || d >= nk[i] ||
						    fabs((double)ref2[d] - kth) > 1e-4 * (mx > 0 ? mx : 1))
							n_far++;
						else
							n_near++;
					}
					n_many += nd > m / 100 + 2;
				}
				OPS_CHECK(n_cnt == 0 && n_far == 0 && n_many == 0,
				          "%s: rope in the score kernel: %lld count, %lld far, %lld rows "
				          "with many differences",
				          ic->name, (long long)n_cnt, (long long)n_far, (long long)n_many);
				printf("%-46s + q rope in the score kernel (R %lld pairing %d): near-tie "
				       "diffs %lld\n",
				       ic->name, (long long)R, pairing, (long long)n_near);
			} else if (rc != ERR_UNSUPPORTED) {
				OPS_CHECK(0, "%s: indexer_topk_rope rc %d", ic->name, rc);
			}
		}
		kcuda_free(d_pos);
		kcuda_free(d_inv);
		free(qr);
		free(ref2);
		free(pos);
		free(rsel2);
	}
	printf("%-46s rows %3lld scores %9lld bit-diff %lld max err %.2g sel near-tie diffs %lld\n", ic->name,
	       (long long)n_q, (long long)n_scores, (long long)n_bitdiff, maxerr, (long long)n_neartie);
out:
	ops_dbuf_fini(&sb);
	ops_dbuf_fini(&selb);
	ops_dbuf_fini(&nb);
	kcuda_free(d_tbl);
	kcuda_free(d_nk);
	kcuda_free(d_qseq);
	kcuda_free(d_q);
	kcuda_free(d_w);
	pool_fini(&p);
	free(lens);
	free(tbl);
	free(perm);
	free(nk);
	free(qseq);
	free(q);
	free(w);
	free(aref);
	free(ref);
	free(got);
	free(rsel);
	free(gsel);
	free(gn);
	free(tsel);
	free(keys);
}

/* kcuda_topk_idx alone: per-row lengths, ties, NaN, -inf, k > n */
static void test_topk_rows(void)
{
	static const int ns[] = {1, 2, 31, 33, 1000, 2048, 2049, 5000, 32768, 100000};
	const int n_rows = (int)(sizeof(ns) / sizeof(ns[0])), ld = 100000;
	static const int ks[] = {1, 7, 2048, 3000};
	float *s = malloc(sizeof(float) * (size_t)n_rows * ld);
	int32_t *ref = malloc(sizeof(int32_t) * 3000), *got = malloc(sizeof(int32_t) * (size_t)n_rows * 3000);
	int32_t n[sizeof(ns) / sizeof(ns[0])], gn[sizeof(ns) / sizeof(ns[0])];
	void *d_n = NULL;
	struct ops_dbuf sb = {0}, ob = {0}, nb = {0};
	for (int r = 0; r < n_rows; r++) {
		n[r] = ns[r];
		const int levels = r % 3 == 0 ? 3 : (r % 3 == 1 ? 50 : 0);
		for (int j = 0; j < ld; j++) {
			float v = ops_rng_unif();
			if (levels)
				v = (float)(int)((v + 1.0f) * 0.5f * levels);
			unsigned z = (unsigned)(ops_rng_next() % 64);
			if (z == 0)
				v = NAN;
			else if (z == 1)
				v = -INFINITY;
			else if (z == 2)
				v = 0.0f;
			else if (z == 3)
				v = -0.0f;
			s[(size_t)r * ld + j] = v;
		}
	}
	if (kcuda_alloc(sizeof(n), &d_n) || ops_dbuf_init(ctx, &sb, sizeof(float) * (size_t)n_rows * ld) ||
	    ops_dbuf_init(ctx, &ob, sizeof(int32_t) * (size_t)n_rows * 3000) ||
	    ops_dbuf_init(ctx, &nb, sizeof(n))) {
		OPS_CHECK(0, "topk_idx: device allocation");
		goto out;
	}
	kcuda_upload(ctx, sb.user, s, sizeof(float) * (size_t)n_rows * ld);
	kcuda_upload(ctx, d_n, n, sizeof(n));
	for (size_t ki = 0; ki < sizeof(ks) / sizeof(ks[0]); ki++) {
		const int k = ks[ki];
		int rc = kcuda_topk_idx(ctx, sb.user, ld, n_rows, d_n, 0, k, ob.user, 3000, nb.user);
		OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0, "topk_idx k %d: rc %d", k, rc);
		size_t g = ops_dbuf_get(ctx, &ob, got) + ops_dbuf_get(ctx, &nb, gn);
		OPS_CHECK(g == 0, "topk_idx k %d: guard bytes damaged", k);
		for (int r = 0; r < n_rows; r++) {
			int m = kcpu_topk(s + (size_t)r * ld, n[r], k, ref);
			OPS_CHECK(gn[r] == m, "topk_idx k %d row n %d: count %d, want %d", k, n[r], gn[r], m);
			OPS_CHECK(gn[r] == m &&
			              memcmp(ref, got + (size_t)r * 3000, sizeof(int32_t) * (size_t)m) == 0,
			          "topk_idx k %d row n %d: selection differs from kcpu_topk", k, n[r]);
		}
	}
	/* n = NULL: causal rows n0 + i + 1 */
	int rc = kcuda_topk_idx(ctx, sb.user, ld, n_rows, NULL, 40, 33, ob.user, 3000, nb.user);
	OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0, "topk_idx causal rc %d", rc);
	ops_dbuf_get(ctx, &ob, got);
	ops_dbuf_get(ctx, &nb, gn);
	for (int r = 0; r < n_rows; r++) {
		int m = kcpu_topk(s + (size_t)r * ld, 40 + r + 1, 33, ref);
		OPS_CHECK(gn[r] == m && memcmp(ref, got + (size_t)r * 3000, sizeof(int32_t) * (size_t)m) == 0,
		          "topk_idx causal row %d differs", r);
	}
	OPS_CHECK(kcuda_topk_idx(ctx, sb.user, ld, 1, d_n, 0, 10, ob.user, 5, nb.user) == -EINVAL,
	          "ldo < k accepted");
	printf("topk_idx: %d rows x %zu k values against kcpu_topk\n", n_rows, sizeof(ks) / sizeof(ks[0]));
out:
	kcuda_free(d_n);
	ops_dbuf_fini(&sb);
	ops_dbuf_fini(&ob);
	ops_dbuf_fini(&nb);
	free(s);
	free(ref);
	free(got);
}

/* The decode top-k (topk_fast.cu: one block per row, keys in registers; kcuda_topk_idx_short and
 * kcuda_topk_idx for decode-sized batches) against kcpu_topk, under each block shape
 * (TANDEM_TOPK_THREADS) and the old kernel (TANDEM_TOPK=old). Data modes meant to break a range
 * digit: distinct, narrow ReLU sums, all equal, two values, +-0 only, NaN / -inf among ties, one
 * +inf outlier, all NaN, 80 levels, values a few ulps apart. Rows of one batch have different
 * lengths (1, k-1, k, k+1, 2049, ld, ...); row strides of the GLM-5 decode graphs (4112 = bucket
 * capped at max_ctx, 8192, 32768, 32832) and odd / unaligned ones. Each selection is made through
 * both entries (kcuda_topk_idx_short, kcuda_topk_idx) into a cleared output. */
static float fast_val(int mode, int64_t j)
{
	switch (mode) {
	case 0: return ops_rng_unif() * 10.0f;
	case 1: { /* an indexer score: weighted sum of 32 ReLU terms */
		float v = 0.0f;
		for (int h = 0; h < 32; h++) {
			const float x = ops_rng_unif();
			v += (float)(h % 7 + 1) / 16.0f * (x > 0.0f ? x : 0.0f);
		}
		return v;
	}
	case 2: return 0.375f;
	case 3: return (ops_rng_next() & 1) ? 1.5f : -2.0f;
	case 4: return (ops_rng_next() & 1) ? 0.0f : -0.0f;
	case 5: {
		const unsigned z = (unsigned)(ops_rng_next() % 8);
		return z == 0 ? NAN : (z == 1 ? -INFINITY : (float)(int)(z % 3));
	}
	case 6: return j == 77 ? INFINITY : 1.0f + 0.01f * ops_rng_unif();
	case 7: return NAN;
	case 8: return floorf(ops_rng_unif() * 40.0f) / 4.0f;
	default: /* a few ulps apart: ties and neighbours in the lowest key bits */
		return nextafterf(1.0f, 2.0f) + (float)(ops_rng_next() % 5) * 1.1920929e-7f;
	}
}

static void test_topk_fast(int quick)
{
	/* 32832: the 32k graph's stride (max_ctx 32784 with --matrix-ctx 4096,32768, rounded to 256 B; 640
	 * threads x 52 keys); 33281: the first stride past the registers, whose keys live in shared
	 * memory (not on sm_120: the old paths) */
	static const int lds[] = {1,    7,     2048,  2049,  4096,  4097, 4112,
	                          8192, 16384, 32768, 32832, 33281, 49152};
	/* s1 / s0: the sampled range on / off (TANDEM_TOPK_SAMPLE; default on above 8192) */
	static const char *const shapes[] = {NULL, "256", "512", "1024", "s1", "s0", "old"};
	const int K = 2048, n_modes = 10, max_rows = 8;
	int runs = 0;
	for (size_t li = 0; li < sizeof(lds) / sizeof(lds[0]); li++) {
		const int64_t ld = lds[li];
		/* one extra float in front: offset 1 makes the rows unaligned for float4 loads */
		const size_t sbytes = sizeof(float) * (size_t)(ld * max_rows + 1);
		float *s = malloc(sbytes);
		int32_t *ref = malloc(sizeof(int32_t) * K), *got = malloc(sizeof(int32_t) * K * max_rows),
		        *got2 = malloc(sizeof(int32_t) * K * max_rows);
		int32_t nk[8], gn[8], gn2[8];
		struct ops_dbuf sb = {0}, nb = {0}, ob = {0}, cb = {0};
		if (!s || !ref || !got || !got2 || ops_dbuf_init(ctx, &sb, sbytes) ||
		    ops_dbuf_init(ctx, &nb, sizeof(nk)) ||
		    ops_dbuf_init(ctx, &ob, sizeof(int32_t) * K * max_rows) ||
		    ops_dbuf_init(ctx, &cb, sizeof(gn))) {
			OPS_CHECK(0, "topk_fast: allocation");
			goto next;
		}
		for (int mode = 0; mode < n_modes; mode++) {
			if (quick && ld > 8192 && mode != 1 && mode != 5 && mode != 9)
				continue;
			const int rows = 1 + (int)((li + (size_t)mode) % max_rows);
			const int off = (mode == 5 || ld == 4097) ? 1 : 0; /* unaligned rows */
			const int64_t cand[] = {ld, 1, K - 1, K, K + 1, 2049, ld - 3, ld / 2 + 1};
			for (int r = 0; r < rows; r++) {
				int64_t v = cand[(r + mode) % 8];
				nk[r] = (int32_t)(v < 1 ? 1 : (v > ld ? ld : v));
			}
			nk[0] = (int32_t)ld; /* the longest row always */
			for (int64_t j = 0; j < ld * rows + 1; j++)
				s[j] = fast_val(mode, j % ld);
			kcuda_upload(ctx, sb.user, s, sbytes);
			kcuda_upload(ctx, nb.user, nk, sizeof(nk));
			const float *ds = (const float *)sb.user + off;
			const float *hs = s + off;
			for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
				if (shapes[si] && !strcmp(shapes[si], "old"))
					setenv("TANDEM_TOPK", "old", 1);
				else if (shapes[si] && shapes[si][0] == 's')
					setenv("TANDEM_TOPK_SAMPLE", shapes[si] + 1, 1);
				else if (shapes[si])
					setenv("TANDEM_TOPK_THREADS", shapes[si], 1);
				int bad = 0, rc = 0, did0 = 1;
				for (int rep = 0; rep < 2; rep++) {
					/* rep 0 through the short entry, rep 1 through kcuda_topk_idx */
					kcuda_memset(ctx, ob.user, 0xff, sizeof(int32_t) * K * max_rows);
					kcuda_memset(ctx, cb.user, 0xff, sizeof(gn));
					rc = rep == 0 ? kcuda_topk_idx_short(ctx, ds, ld, rows, nb.user, 0, K,
					                                     ob.user, K, cb.user)
					              : kcuda_topk_idx(ctx, ds, ld, rows, nb.user, 0, K,
					                               ob.user, K, cb.user);
					if (rc == ERR_UNSUPPORTED && rep == 0) {
						did0 = 0; /* the old kernel does not fit this device's shared
						             memory */
						continue;
					}
					OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0, "topk_fast ld %lld rc %d",
					          (long long)ld, rc);
					OPS_CHECK(ops_dbuf_get(ctx, &ob, rep ? got2 : got) == 0 &&
					              ops_dbuf_get(ctx, &cb, rep ? gn2 : gn) == 0,
					          "topk_fast ld %lld: guard bytes damaged", (long long)ld);
				}
				for (int r = 0; r < rows; r++) {
					const int m = kcpu_topk(hs + r * ld, nk[r], K, ref);
					bad += (did0 && gn[r] != m) || gn2[r] != m;
					if (did0 && gn[r] == m &&
					    memcmp(ref, got + r * K, sizeof(int32_t) * m))
						bad++;
					if (gn2[r] == m && memcmp(ref, got2 + r * K, sizeof(int32_t) * m))
						bad++;
				}
				OPS_CHECK(bad == 0,
				          "topk_fast ld %lld mode %d rows %d shape %s: %d rows differ from "
				          "kcpu_topk",
				          (long long)ld, mode, rows, shapes[si] ? shapes[si] : "default",
				          bad);
				unsetenv("TANDEM_TOPK");
				unsetenv("TANDEM_TOPK_THREADS");
				unsetenv("TANDEM_TOPK_SAMPLE");
				runs++;
			}
		}
		/* n = NULL: causal rows n0 + i + 1 (k 7: a small k against long rows) */
		if (ld >= 16) {
			const int rows = ld >= 8 * 40 ? 8 : 1;
			int rc = kcuda_topk_idx_short(ctx, sb.user, ld, rows, NULL, ld - 9, 7, ob.user, K,
			                              cb.user);
			if (rc == ERR_UNSUPPORTED && ops_smem_small()) /* its keys do not fit: declined */
				printf("  topk short causal ld %lld: declined (sm_120-class shared memory)\n",
				       (long long)ld);
			else {
				OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0, "topk_fast causal rc %d", rc);
				ops_dbuf_get(ctx, &ob, got);
				ops_dbuf_get(ctx, &cb, gn);
				for (int r = 0; r < rows; r++) {
					const int64_t n = ld - 9 + r + 1 < ld ? ld - 9 + r + 1 : ld;
					const int m = kcpu_topk(s + r * ld, (int)n, 7, ref);
					OPS_CHECK(
					    gn[r] == m && memcmp(ref, got + r * K, sizeof(int32_t) * m) == 0,
					    "topk_fast causal ld %lld row %d differs", (long long)ld, r);
				}
			}
		}
	next:
		ops_dbuf_fini(&sb);
		ops_dbuf_fini(&nb);
		ops_dbuf_fini(&ob);
		ops_dbuf_fini(&cb);
		free(s);
		free(ref);
		free(got);
		free(got2);
	}
	unsigned nbad = 0;
	OPS_CHECK(kcuda_ctx_take_errors(ctx, &nbad) == 0 && nbad == 0, "top-k kernels counted %u bad inputs",
	          nbad);
	printf("topk_fast: %d (stride, data, shape) runs against kcpu_topk\n", runs);
}

/* PDL ordering of the decode top-k: a producer kernel (pdl_probe.h) writes the scores and the row
 * lengths ~30 us late, right before the top-k launch; the live buffers hold other values (all
 * scores equal, every length 1) until then, so a read before the top-k's KDEP_ENTRY changes the
 * selection. Each register / shared-memory shape of topk_fast.cu. */
static void check_topk_pdl(void)
{
	static const int lds[] = {2048, 4112, 32768, 32832, 33281};
	const int K = 2048, rows = 2;
	for (size_t li = 0; li < sizeof(lds) / sizeof(lds[0]); li++) {
		const int64_t ld = lds[li];
		const size_t sb_bytes = sizeof(float) * (size_t)(ld * rows);
		float *s = malloc(sb_bytes), *junk = malloc(sb_bytes);
		int32_t nk[2] = {(int32_t)ld, (int32_t)(ld - 5)}, ones[2] = {1, 1}, gn[2];
		int32_t *got = malloc(sizeof(int32_t) * K * rows), *ref = malloc(sizeof(int32_t) * K);
		void *d_live = NULL, *d_src = NULL, *d_n = NULL, *d_nsrc = NULL;
		struct ops_dbuf ob = {0}, cb = {0};
		if (!s || !junk || !got || !ref || kcuda_alloc(sb_bytes, &d_live) ||
		    kcuda_alloc(sb_bytes, &d_src) || kcuda_alloc(sizeof(nk), &d_n) ||
		    kcuda_alloc(sizeof(nk), &d_nsrc) || ops_dbuf_init(ctx, &ob, sizeof(int32_t) * K * rows) ||
		    ops_dbuf_init(ctx, &cb, sizeof(gn))) {
			OPS_CHECK(0, "topk pdl: allocation");
			goto next;
		}
		for (int64_t j = 0; j < ld * rows; j++) {
			s[j] = fast_val(1, j);
			junk[j] = 0.5f;
		}
		kcuda_upload(ctx, d_src, s, sb_bytes);
		kcuda_upload(ctx, d_live, junk, sb_bytes);
		kcuda_upload(ctx, d_nsrc, nk, sizeof(nk));
		kcuda_upload(ctx, d_n, ones, sizeof(ones));
		void *dst[2] = {d_live, d_n};
		const void *src[2] = {d_src, d_nsrc};
		const size_t nbytes[2] = {sb_bytes, sizeof(nk)};
		if (kcuda_sync(ctx)) {
			OPS_CHECK(0, "topk pdl: upload");
			goto next;
		}
		int rc = kcuda_pdl_late_copy(ctx, 2, dst, src, nbytes, 30.0);
		if (!rc)
			rc = kcuda_topk_idx_short(ctx, d_live, ld, rows, d_n, 0, K, ob.user, K, cb.user);
		if (rc == ERR_UNSUPPORTED && ops_smem_small()) { /* its keys do not fit: declined */
			printf("topk pdl ld %lld: declined (sm_120-class shared memory)\n", (long long)ld);
			kcuda_sync(ctx);
			goto next;
		}
		OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0, "topk pdl ld %lld: rc %d", (long long)ld, rc);
		OPS_CHECK(ops_dbuf_get(ctx, &ob, got) == 0 && ops_dbuf_get(ctx, &cb, gn) == 0,
		          "topk pdl ld %lld: guard bytes damaged", (long long)ld);
		for (int r = 0; r < rows; r++) {
			const int m = kcpu_topk(s + r * ld, nk[r], K, ref);
			OPS_CHECK(gn[r] == m && memcmp(ref, got + r * K, sizeof(int32_t) * m) == 0,
			          "topk pdl ld %lld row %d: the top-k read its scores or length before the "
			          "producer "
			          "wrote them",
			          (long long)ld, r);
		}
	next:
		kcuda_free(d_live);
		kcuda_free(d_src);
		kcuda_free(d_n);
		kcuda_free(d_nsrc);
		ops_dbuf_fini(&ob);
		ops_dbuf_fini(&cb);
		free(s);
		free(junk);
		free(got);
		free(ref);
	}
	printf("topk_fast: PDL ordering against a late producer, %zu strides\n",
	       sizeof(lds) / sizeof(lds[0]));
}

/* the longest context of a case */
/* Part 4: decode rows whose newest key (position n - 1, "this step's"), q and w are written by the
 * kernel right before the score kernel, late (after a spin). Exact data: the scores must be
 * bit-equal to the CPU's. The device starts with the newest keys, q and w replaced by other values,
 * so a read of any of them before the producer's copies would show. */
static void check_early_pdl(int bf16, int n_q, const int *lens)
{
	const int64_t HI = 32, DI = 128;
	int max_len = 0, tot = 0;
	for (int s = 0; s < n_q; s++) {
		max_len = lens[s] > max_len ? lens[s] : max_len;
		tot += (lens[s] + BT - 1) / BT;
	}
	const int ld_blocks = (max_len + BT - 1) / BT + 1;
	const int64_t n_blocks = tot + 1;
	struct pool p = {0};
	int32_t *tbl = malloc(sizeof(int32_t) * (size_t)n_q * ld_blocks),
	        *nk = malloc(sizeof(int32_t) * (size_t)n_q), *qseq = malloc(sizeof(int32_t) * (size_t)n_q);
	float *q = malloc(sizeof(float) * (size_t)(n_q * HI * DI)),
	      *w = malloc(sizeof(float) * (size_t)(n_q * HI));
	float *ref = malloc(sizeof(float) * (size_t)(n_q * max_len)),
	      *got = malloc(sizeof(float) * (size_t)(n_q * max_len));
	const void **keys = malloc(sizeof(void *) * (size_t)max_len);
	uint8_t *junk = malloc((size_t)(n_q * HI * DI) * 4);
	void *d_tbl = NULL, *d_nk = NULL, *d_qseq = NULL, *d_q = NULL, *d_w = NULL, *d_src = NULL;
	struct ops_dbuf sb = {0};
	const size_t rb = (size_t)DI * (bf16 ? 2 : 4);
	int ok = tbl && nk && qseq && q && w && ref && got && keys && junk &&
	         pool_init(&p, bf16, DI, n_blocks, 1) == 0;
	if (!ok) {
		OPS_CHECK(0, "early pdl: setup");
		goto out;
	}
	int used = 0;
	for (int s = 0; s < n_q; s++)
		for (int b = 0; b < ld_blocks; b++)
			tbl[s * ld_blocks + b] =
			    b < (lens[s] + BT - 1) / BT ? (int32_t)(n_blocks - 1 - used++) : -1;
	for (int64_t i = 0; i < n_q * HI * DI; i++)
		q[i] = (float)((int)(ops_rng_next() % 5) - 2);
	for (int64_t i = 0; i < n_q * HI; i++)
		w[i] = (float)((int)(ops_rng_next() % 9) - 3) / 8.0f;
	for (int i = 0; i < n_q; i++) {
		qseq[i] = i;
		nk[i] = lens[i];
	}
	const float scale = 1.0f / sqrtf((float)DI);
	for (int i = 0; i < n_q; i++) {
		const int32_t *t = tbl + (size_t)i * ld_blocks;
		for (int j = 0; j < nk[i]; j++)
			keys[j] = p.h + (size_t)t[j / BT] * p.block_bytes + p.idx_off + (size_t)(j % BT) * rb;
		kcpu_indexer_scores(q + (int64_t)i * HI * DI, w + (int64_t)i * HI, HI, DI, keys, nk[i], bf16,
		                    scale, ref + (int64_t)i * max_len);
	}
	/* device: the right q, w and newest keys in a source area; the live copies hold other values */
	const size_t qb = (size_t)(n_q * HI * DI) * 4, wb = (size_t)(n_q * HI) * 4;
	if (kcuda_alloc(sizeof(int32_t) * (size_t)n_q * ld_blocks, &d_tbl) ||
	    kcuda_alloc(sizeof(int32_t) * (size_t)n_q, &d_nk) ||
	    kcuda_alloc(sizeof(int32_t) * (size_t)n_q, &d_qseq) || kcuda_alloc(qb, &d_q) ||
	    kcuda_alloc(wb, &d_w) || kcuda_alloc(qb + wb + (size_t)n_q * rb, &d_src) ||
	    ops_dbuf_init(ctx, &sb, sizeof(float) * (size_t)(n_q * max_len))) {
		OPS_CHECK(0, "early pdl: device allocation");
		goto out;
	}
	kcuda_upload(ctx, d_tbl, tbl, sizeof(int32_t) * (size_t)n_q * ld_blocks);
	kcuda_upload(ctx, d_nk, nk, sizeof(int32_t) * (size_t)n_q);
	kcuda_upload(ctx, d_qseq, qseq, sizeof(int32_t) * (size_t)n_q);
	kcuda_upload(ctx, d_src, q, qb);
	kcuda_upload(ctx, (uint8_t *)d_src + qb, w, wb);
	for (size_t i = 0; i < qb; i++)
		junk[i] = (uint8_t)(0x3f + (i & 1)); /* finite values far from the data */
	kcuda_upload(ctx, d_q, junk, qb);
	kcuda_upload(ctx, d_w, junk, wb);
	void *dst[KPROBE_MAX];
	const void *src[KPROBE_MAX];
	size_t nbytes[KPROBE_MAX];
	int n_cp = 0;
	dst[n_cp] = d_q, src[n_cp] = d_src, nbytes[n_cp++] = qb;
	dst[n_cp] = d_w, src[n_cp] = (uint8_t *)d_src + qb, nbytes[n_cp++] = wb;
	for (int i = 0; i < n_q && n_cp < KPROBE_MAX; i++) {
		const int j = nk[i] - 1;
		const size_t off = (size_t)tbl[(size_t)i * ld_blocks + j / BT] * p.block_bytes + p.idx_off +
		                   (size_t)(j % BT) * rb;
		uint8_t *s_i = (uint8_t *)d_src + qb + wb + (size_t)i * rb;
		kcuda_upload(ctx, s_i, p.h + off, rb);
		kcuda_upload(ctx, (uint8_t *)p.d + off, junk, rb);
		dst[n_cp] = (uint8_t *)p.d + off, src[n_cp] = s_i, nbytes[n_cp++] = rb;
	}
	struct kcuda_kv_view kv = {.base = p.d,
	                           .n_blocks = p.n_blocks,
	                           .block_bytes = p.block_bytes,
	                           .offset = p.idx_off,
	                           .block_tokens = BT,
	                           .dim = DI,
	                           .bf16 = bf16};
	struct kcuda_attn_rows rows = {.n_q = n_q,
	                               .qseq = d_qseq,
	                               .blocks = d_tbl,
	                               .ld_blocks = ld_blocks,
	                               .n_keys = d_nk,
	                               .pos0 = 0,
	                               .max_keys = max_len};
	int rc = kcuda_pdl_late_copy(ctx, n_cp, dst, src, nbytes, 30.0);
	OPS_CHECK(rc == 0, "early pdl: producer rc %d", rc);
	rc = kcuda_indexer_scores(ctx, &kv, &rows, d_q, d_w, HI, DI, scale, sb.user, max_len);
	OPS_CHECK(rc == 0, "early pdl: scores rc %d", rc);
	OPS_CHECK(kcuda_sync(ctx) == 0, "early pdl: sync");
	unsigned nbad = 0;
	OPS_CHECK(kcuda_ctx_take_errors(ctx, &nbad) == 0 && nbad == 0, "early pdl: %u kernel errors", nbad);
	OPS_CHECK(ops_dbuf_get(ctx, &sb, got) == 0, "early pdl: guard bytes damaged");
	int64_t bad = 0;
	for (int i = 0; i < n_q; i++)
		for (int j = 0; j < nk[i]; j++)
			bad += memcmp(&ref[(int64_t)i * max_len + j], &got[(int64_t)i * max_len + j], 4) != 0;
	OPS_CHECK(bad == 0, "early pdl %s batch %d: %lld scores differ from the CPU", bf16 ? "bf16" : "f32",
	          n_q, (long long)bad);
	printf("indexer scores after a late PDL producer (q, w, newest keys), %s keys, batch %d, ctx up to "
	       "%d: %s\n",
	       bf16 ? "bf16" : "f32", n_q, max_len, bad ? "DIFFER" : "bit-equal to the CPU");
out:
	ops_dbuf_fini(&sb);
	kcuda_free(d_tbl);
	kcuda_free(d_nk);
	kcuda_free(d_qseq);
	kcuda_free(d_q);
	kcuda_free(d_w);
	kcuda_free(d_src);
	pool_fini(&p);
	free(tbl);
	free(nk);
	free(qseq);
	free(q);
	free(w);
	free(ref);
	free(got);
	free(keys);
	free(junk);
}

static int case_len(const struct icase *c)
{
	int m = c->T > 0 ? c->start + c->T : 0;
	for (int s = 0; c->lens && s < c->n_seq; s++)
		m = c->lens[s] > m ? c->lens[s] : m;
	return m;
}

int main(void)
{
	if (kcuda_device_count() < 1) {
		printf("SKIP: no CUDA device\n");
		return 77;
	}
	ops_seed_init();
	setenv("TANDEM_IDX_FOLD", "1", 1); /* the in-kernel q rope is off by default: test it */
	/* 1 MiB workspace: kcuda_indexer_topk keeps the scores of 2 rows at 100k positions, and of 81
	 * rows at 3200, so the T 200 prefill case runs in three workspace chunks */
	if (kcuda_ctx_create(0, 1u << 20, &ctx)) {
		printf("FAIL: no CUDA context\n");
		return 1;
	}
	static const int l_small[] = {1, 31, 33, 64, 65, 2048, 2049};
	static const int l_32k[] = {32768};
	static const int l_100k[] = {100000};
	static const int l_4k[] = {4096};
	static const int l_mix[] = {1, 2047, 2048, 2049, 3000, 4096, 4097, 8192};
	static const int l_32k2[] = {30001, 32768};
	static const int l_12[] = {1, 2, 63, 64, 65, 2047, 2048, 2049, 2050, 4000, 4096, 4097};
	static const int l_5[] = {1, 2047, 2048, 2049, 4096};
	static const int l_8x4k[] = {4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096};
	static const int l_ds[] = {2049, 4096, 16384, 32768};
	static const int l_128k[] = {131072};
	static int l_64[65];
	for (int i = 0; i < 65; i++)
		l_64[i] =
		    2049 + (i * 613) % 1900; /* 2049 .. 3948: 64 rows of scores fit the 1 MiB workspace */
	const struct icase cases[] = {
	    /* the fused scores + top-k (default): GLM-5 at TP=8 (HI 32 DI 128 per rank: the indexer is
	     * replicated) and DeepSeek-V3.2 (HI 64), f32 and bf16 keys, 32-key tiles (batch 1..2 at 4k)
	     * and 64-key tiles of two (batch 8, 32k), 128k keys, 64 and 65 rows */
	    {"random f32 HI32 DI128 batch 5 ctx 1..4096", 0, 0, 32, 128, 2048, 5, l_5, 0, 0, 0},
	    {"exact f32 HI32 DI128 batch 5 ctx 1..4096", 0, 1, 32, 128, 2048, 5, l_5, 0, 0, 0},
	    {"random bf16 HI32 DI128 ctx 4096", 1, 0, 32, 128, 2048, 1, l_4k, 0, 0, 0},
	    {"random bf16 HI32 DI128 batch 8 ctx 4096", 1, 0, 32, 128, 2048, 8, l_8x4k, 0, 0, 0},
	    {"random bf16 HI64 DI128 (DS-V3.2) batch 4 ctx 2049..32768", 1, 0, 64, 128, 2048, 4, l_ds, 0, 0,
	     0},
	    {"exact bf16 HI64 DI128 (DS-V3.2) batch 4 ctx 2049..32768", 1, 1, 64, 128, 2048, 4, l_ds, 0, 0,
	     0},
	    {"random bf16 HI32 DI128 ctx 131072", 1, 0, 32, 128, 2048, 1, l_128k, 0, 0, 0},
	    {"random f32 HI32 DI128 batch 64 ctx 2049..3948", 0, 0, 32, 128, 2048, 64, l_64, 0, 0, 0},
	    {"exact bf16 HI32 DI128 batch 65 ctx 2049..3948", 1, 1, 32, 128, 2048, 65, l_64, 0, 0, 0},
	    {"exact f32 HI32 DI128 ctx 1..2049", 0, 1, 32, 128, 2048, 7, l_small, 0, 0, 0},
	    {"exact bf16 HI64 DI128 ctx 1..2049", 1, 1, 64, 128, 2048, 7, l_small, 0, 0, 0},
	    {"exact f32 HI32 DI128 ctx 32768", 0, 1, 32, 128, 2048, 1, l_32k, 0, 0, 0},
	    {"exact bf16 HI64 DI128 ctx 100000", 1, 1, 64, 128, 2048, 1, l_100k, 0, 0, 0},
	    {"exact f32 prefill start 3000 T 40", 0, 1, 32, 128, 2048, 0, NULL, 3000, 40, 0},
	    {"exact bf16 prefill start 3000 T 200 (3 chunks)", 1, 1, 32, 128, 2048, 0, NULL, 3000, 200, 0},
	    {"random f32 HI32 DI128 ctx 1..2049", 0, 0, 32, 128, 2048, 7, l_small, 0, 0, 0},
	    {"random bf16 HI64 DI128 ctx 32768", 1, 0, 64, 128, 2048, 1, l_32k, 0, 0, 0},
	    {"random f32 HI32 DI128 ctx 100000", 0, 0, 32, 128, 2048, 1, l_100k, 0, 0, 0},
	    {"random bf16 prefill start 2000 T 70", 1, 0, 64, 128, 2048, 0, NULL, 2000, 70, 0},
	    {"odd HI5 DI40 K7 ctx 1..2049", 0, 0, 5, 40, 7, 7, l_small, 0, 0, 0},
	    /* GLM-5's indexer (HI 32, DI 128) on bf16 keys: the tensor-core kernel's main shape */
	    {"exact bf16 HI32 DI128 ctx 1..2049", 1, 1, 32, 128, 2048, 7, l_small, 0, 0, 0},
	    {"exact bf16 HI32 DI128 ctx 32768", 1, 1, 32, 128, 2048, 1, l_32k, 0, 0, 0},
	    {"random bf16 HI32 DI128 ctx 100000", 1, 0, 32, 128, 2048, 1, l_100k, 0, 0, 0},
	    {"random bf16 HI32 DI128 batch ctx 1..2049", 1, 0, 32, 128, 2048, 7, l_small, 0, 0, 0},
	    {"exact bf16 HI16 DI64 K100 ctx 1..2049", 1, 1, 16, 64, 100, 7, l_small, 0, 0, 0},
	    {"random bf16 HI40 DI48 K33 prefill start 500 T 30", 1, 0, 40, 48, 33, 0, NULL, 500, 30, 0},
	    /* decode graphs: max_keys is the context bucket, above the rows' own lengths; rows of at
	     * most K keys are not scored inside kcuda_indexer_topk (every key is selected) */
	    {"exact bf16 HI32 DI128 ctx 4096 bucket 8192", 1, 1, 32, 128, 2048, 1, l_4k, 0, 0, 8192},
	    {"random bf16 HI32 DI128 batch 8 ctx mix bucket 8192", 1, 0, 32, 128, 2048, 8, l_mix, 0, 0, 8192},
	    {"exact bf16 HI32 DI128 batch 8 ctx mix bucket 8192", 1, 1, 32, 128, 2048, 8, l_mix, 0, 0, 8192},
	    {"random bf16 HI32 DI128 batch 2 ctx 32768 bucket 32768", 1, 0, 32, 128, 2048, 2, l_32k2, 0, 0,
	     32768},
	    {"exact bf16 HI32 DI128 batch 12 ctx 1..4097 bucket 4160", 1, 1, 32, 128, 2048, 12, l_12, 0, 0,
	     4160},
	};
	/* TANDEM_OPS_SMALL=1: contexts up to ~4k only (for compute-sanitizer runs) */
	const int small = getenv("TANDEM_OPS_SMALL") != NULL;
	const int quick = getenv("TANDEM_OPS_QUICK") != NULL;
	/* every case under the three kernel sets: TANDEM_IDX_TOPK=fused, the default (fast score
	 * kernel + a separate top-k) and TANDEM_CUDA_ATTN=ref */
	test_topk_fast(quick || small);
	check_topk_pdl();
	if (getenv("TANDEM_OPS_ONLY_TOPK")) { /* only the top-k parts (compute-sanitizer runs): with
		                               * kcuda_topk_idx's rows of up to 100k, the one-launch radix
		                               * kernel and (TANDEM_TOPK_RADIX1=0) its five launches */
		test_topk_rows();
		setenv("TANDEM_TOPK_RADIX1", "0", 1);
		test_topk_rows();
		unsetenv("TANDEM_TOPK_RADIX1");
		kcuda_ctx_destroy(ctx);
		printf("%d checks, %d failed\n", ops_n_check, ops_n_fail);
		return ops_n_fail ? 1 : 0;
	}
	/* mode 3: the default kernels with 5 key tiles a score block, mode 6 with 37 (any count 1..64 is
	 * valid; the default takes 8 at prefill sizes and, between decode and prefill sizes, as many as
	 * keep the grid in one wave: tens at batch 32-128, more rows x tiles than most of these cases) */
	for (int mode = 0; mode < 7; mode++) {
		if (quick && mode == 2)
			continue;
		if (mode == 5) /* the radix top-k's five launches (above 8192 keys the default is one) */
			setenv("TANDEM_TOPK_RADIX1", "0", 1);
		else
			unsetenv("TANDEM_TOPK_RADIX1");
		if (mode == 2)
			setenv("TANDEM_CUDA_ATTN", "ref", 1);
		else
			unsetenv("TANDEM_CUDA_ATTN");
		if (mode == 0)
			setenv("TANDEM_IDX_TOPK", "fused", 1);
		else
			unsetenv("TANDEM_IDX_TOPK");
		if (mode == 3 || mode == 6)
			setenv("TANDEM_IDX_TILES", mode == 3 ? "5" : "37", 1);
		else
			unsetenv("TANDEM_IDX_TILES");
		if (mode == 4)
			setenv("TANDEM_IDX_ROWS", "force", 1);
		else
			unsetenv("TANDEM_IDX_ROWS");
		printf("-- kernels: %s\n",
		       mode == 6   ? "default, 37 tiles a score block (TANDEM_IDX_TILES=37)"
		       : mode == 5 ? "default, radix top-k in five launches (TANDEM_TOPK_RADIX1=0)"
		       : mode == 4 ? "several query rows a score block (TANDEM_IDX_ROWS=force)"
		       : mode == 3 ? "default, 5 tiles a score block (TANDEM_IDX_TILES=5)"
		       : mode == 2 ? "ref (TANDEM_CUDA_ATTN=ref)"
		       : mode == 1 ? "default (fast scores, separate top-k)"
		                   : "fused top-k (TANDEM_IDX_TOPK=fused)");
		for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
			if (small && case_len(&cases[i]) > 4200) {
				printf("skipped (TANDEM_OPS_SMALL): %s\n", cases[i].name);
				continue;
			}
			if (mode == 5 && case_len(&cases[i]) <= 8192)
				continue; /* rows the radix top-k does not take */
			run_case(&cases[i]);
		}
		if (!small)
			test_topk_rows();
	}
	unsetenv("TANDEM_CUDA_ATTN");
	unsetenv("TANDEM_IDX_TOPK");
	unsetenv("TANDEM_IDX_TILES");
	unsetenv("TANDEM_IDX_ROWS");
	unsetenv("TANDEM_TOPK_RADIX1");
	{ /* part 4 (default kernels) */
		static const int e1[] = {4096}, e3[] = {33, 2049, 4096}, e2[] = {70, 32768};
		check_early_pdl(1, 1, e1);
		check_early_pdl(0, 1, e1);
		check_early_pdl(1, 3, e3);
		check_early_pdl(1, 2, e2);
	}
	kcuda_ctx_destroy(ctx);
	printf("%d checks, %d failed\n", ops_n_check, ops_n_fail);
	return ops_n_fail ? 1 : 0;
}
#endif
