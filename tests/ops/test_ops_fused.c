/* The fused decode ops (kernels/cuda/fused.h) against the CPU sequences they replace, on seeded
 * random inputs: kfuse_add_rmsnorm vs add + kcpu_rmsnorm; kfuse_mla_latent vs kcpu_rmsnorm x 2 +
 * kcpu_rope + the KV write; kfuse_idx_prep vs kcpu_layernorm + kcpu_rope (all heads, and the key)
 * + scale + the KV write; kfuse_rope_copy vs copy + kcpu_rope; kfuse_absorb_rope vs kcpu_matmul
 * per head + kcpu_rope and vs kfwd_head_gemv + kfuse_rope_copy; kcuda_topk_idx_short vs kcpu_topk
 * (exact, with ties, NaN and -inf, lengths 1 .. 8192). The paged pool is a small one with 4-token
 * blocks scattered over it, fp32 and bf16, padding rows (position -1) that must write nothing;
 * every byte not written must keep its fill. Guard bytes around every output.
 * TANDEM_OPS_QUICK=1: fewer cases. Exit 77 = no GPU (skip). */
#include <errno.h>

#include "common/base/err.h"
#include "kernels/cuda/fused.h"
#include "kernels/cuda/model_fwd.h"
#include "tests/ops/ops_util.h"

#ifndef TANDEM_CUDA
int main(void)
{
	printf("SKIP: built without CUDA (make CUDA=1)\n");
	return 77;
}
#else

static struct kcuda_ctx *ctx;
static int quick;

static int up(struct ops_dbuf *b, const void *h, size_t bytes)
{
	if (ops_dbuf_init(ctx, b, bytes))
		return -1;
	return kcuda_upload(ctx, b->user, h, bytes);
}

static int close_to(float g, float r, double rel, double abs_tol)
{
	return isfinite(g) && fabs((double)g - (double)r) <= rel * fabs((double)r) + abs_tol;
}

/* ---- a small paged pool: NB blocks of BT tokens, 2 sequences of up to LDB blocks ---------------- */
#define NB 16
#define BT 4
#define LDB 4
#define NSEQ 2
#define POOL_OFF 64 /* the part's offset inside a block */
#define NROW_MAX 4

struct pool {
	int bf16;
	int64_t width;
	size_t block_bytes;
	uint8_t *host; /* the expected pool */
	uint8_t *written; /* bytes the op must write */
	struct ops_dbuf dev, seq, pos, blk;
	int32_t seq_h[NROW_MAX], pos_h[NROW_MAX], blk_h[NSEQ * LDB];
};

/* rows: (seq 0, pos 5), (seq 1, pos 13), (seq 0, pos 6), padding (pos -1) */
static int pool_init(struct pool *p, int64_t width, int bf16, int n_rows)
{
	static const int32_t seqs[NROW_MAX] = {0, 1, 0, 1}, poss[NROW_MAX] = {5, 13, 6, -1};
	static const int32_t tbl[NSEQ * LDB] = {9, 3, 14, -1, 7, 0, 11, 2};
	memset(p, 0, sizeof(*p));
	p->bf16 = bf16;
	p->width = width;
	p->block_bytes = POOL_OFF + (size_t)BT * (size_t)width * (bf16 ? 2 : 4) + 32;
	size_t bytes = p->block_bytes * NB;
	p->host = malloc(bytes);
	p->written = calloc(1, bytes);
	if (!p->host || !p->written)
		return -1;
	memset(p->host, OPS_FILL, bytes);
	memcpy(p->seq_h, seqs, sizeof(seqs));
	memcpy(p->pos_h, poss, sizeof(poss));
	memcpy(p->blk_h, tbl, sizeof(tbl));
	if (ops_dbuf_init(ctx, &p->dev, bytes) || up(&p->seq, p->seq_h, sizeof(int32_t) * (size_t)n_rows) ||
	    up(&p->pos, p->pos_h, sizeof(int32_t) * (size_t)n_rows) || up(&p->blk, p->blk_h, sizeof(tbl)))
		return -1;
	return 0;
}

static struct kfuse_kv pool_kv(struct pool *p)
{
	return (struct kfuse_kv){.base = p->dev.user,
	                         .block_bytes = p->block_bytes,
	                         .offset = POOL_OFF,
	                         .block_tokens = BT,
	                         .bf16 = p->bf16,
	                         .seq = p->seq.user,
	                         .blocks = p->blk.user,
	                         .ld_blocks = LDB};
}

/* the expected write of row r's values x (the CPU backend's kv_write) */
static void pool_put(struct pool *p, int r, const float *x)
{
	int32_t pos = p->pos_h[r];
	if (pos < 0)
		return;
	int32_t blk = p->blk_h[p->seq_h[r] * LDB + pos / BT];
	size_t elt = p->bf16 ? 2 : 4;
	size_t off = (size_t)blk * p->block_bytes + POOL_OFF + (size_t)(pos % BT) * (size_t)p->width * elt;
	for (int64_t j = 0; j < p->width; j++) {
		if (p->bf16) {
			uint16_t v = kf32_to_bf16(x[j]);
			memcpy(p->host + off + (size_t)j * 2, &v, 2);
		} else {
			memcpy(p->host + off + (size_t)j * 4, &x[j], 4);
		}
	}
	memset(p->written + off, 1, (size_t)p->width * elt);
}

/* bytes outside the written rows untouched; written values within tolerance; returns bad count */
static int pool_check(struct pool *p, double rel, double abs_tol)
{
	size_t bytes = p->block_bytes * NB;
	uint8_t *g = malloc(bytes);
	int bad = 0;
	if (!g || ops_dbuf_get(ctx, &p->dev, g) != 0) {
		free(g);
		return 1 << 20;
	}
	size_t elt = p->bf16 ? 2 : 4;
	for (size_t i = 0; i < bytes; i += elt) {
		if (!p->written[i]) {
			for (size_t k = 0; k < elt; k++)
				bad += g[i + k] != OPS_FILL;
			continue;
		}
		float gv, rv;
		if (p->bf16) {
			uint16_t a, b;
			memcpy(&a, g + i, 2);
			memcpy(&b, p->host + i, 2);
			gv = kbf16_to_f32(a);
			rv = kbf16_to_f32(b);
		} else {
			memcpy(&gv, g + i, 4);
			memcpy(&rv, p->host + i, 4);
		}
		/* bf16: the two may round to neighbours when the fp32 values straddle a tie */
		bad += !close_to(gv, rv, p->bf16 ? 1.0 / 128 : rel, abs_tol);
	}
	free(g);
	return bad;
}

static void pool_fini(struct pool *p)
{
	free(p->host);
	free(p->written);
	ops_dbuf_fini(&p->dev);
	ops_dbuf_fini(&p->seq);
	ops_dbuf_fini(&p->pos);
	ops_dbuf_fini(&p->blk);
}

/* ---- add + rmsnorm ------------------------------------------------------------------------------ */
static void test_add_rmsnorm(void)
{
	static const int64_t ns[] = {1, 33, 2048, 6144, 7168, 8192, 8196, 12288, 6144};
	for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++) {
		if (quick && ni % 2)
			continue;
		const int64_t n = ns[ni], rows = 1 + (int64_t)(ni % 3);
		const int with_x = ni != 1 && ni != 8;
		const float eps = 1e-5f;
		float *h = malloc(sizeof(float) * n * rows), *x = malloc(sizeof(float) * n * rows);
		float *w = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n * rows);
		float *hg = malloc(sizeof(float) * n * rows), *yg = malloc(sizeof(float) * n * rows);
		for (int64_t i = 0; i < n * rows; i++) {
			h[i] = 10.0f * ops_rng_unif();
			x[i] = ops_rng_unif();
		}
		for (int64_t i = 0; i < n; i++)
			w[i] = 1.0f + 0.5f * ops_rng_unif();
		struct ops_dbuf hb = {0}, xb = {0}, wb = {0}, yb = {0};
		if (up(&hb, h, sizeof(float) * n * rows) || up(&xb, x, sizeof(float) * n * rows) ||
		    up(&wb, w, sizeof(float) * n) || ops_dbuf_init(ctx, &yb, sizeof(float) * n * rows)) {
			OPS_CHECK(0, "add_rmsnorm setup");
			goto next;
		}
		int rc =
		    kfuse_add_rmsnorm(ctx, hb.user, with_x ? xb.user : NULL, yb.user, wb.user, n, rows, eps);
		OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0, "add_rmsnorm rc %d", rc);
		OPS_CHECK(ops_dbuf_get(ctx, &hb, hg) == 0 && ops_dbuf_get(ctx, &yb, yg) == 0,
		          "add_rmsnorm: guard bytes damaged");
		/* the CPU sequence: add, then rmsnorm */
		if (with_x)
			for (int64_t i = 0; i < n * rows; i++)
				h[i] += x[i];
		kcpu_rmsnorm(y, n, h, n, w, n, rows, eps);
		int bad_h = 0, bad_y = 0;
		for (int64_t i = 0; i < n * rows; i++) {
			bad_h += memcmp(&h[i], &hg[i], 4) != 0; /* one fp32 add: exact */
			bad_y += !close_to(yg[i], y[i], 4e-6, 3e-7 * fabs(w[i % n]));
		}
		OPS_CHECK(bad_h == 0 && bad_y == 0,
		          "add_rmsnorm n=%" PRId64 " rows=%" PRId64 ": %d h, %d y bad", n, rows, bad_h,
		          bad_y);
		printf("add_rmsnorm n %5" PRId64 " rows %" PRId64 "%s ok\n", n, rows,
		       with_x ? "" : " (no add)");
	next:
		ops_dbuf_fini(&hb);
		ops_dbuf_fini(&xb);
		ops_dbuf_fini(&wb);
		ops_dbuf_fini(&yb);
		free(h);
		free(x);
		free(w);
		free(y);
		free(hg);
		free(yg);
	}
	/* y aliasing h is refused */
	OPS_CHECK(kfuse_add_rmsnorm(ctx, (float *)16, NULL, (float *)16, (float *)32, 4, 1, 1e-6f) == -EINVAL,
	          "add_rmsnorm with y == h accepted");
}

/* ---- add + rmsnorm by each kernel (kfuse_add_rmsnorm_as) ----------------------------------------
 * Every kernel against add + kcpu_rmsnorm (double sums) at the GLM-5 / DeepSeek-V3 / odd widths, 1..8
 * and 64 rows, with rows of large, huge (cluster kernel only: the fp32 kernels' sum of squares
 * overflows there), tiny and zero values, a NaN and an Inf (the CPU's results: the NaN row all NaN,
 * the Inf row NaN at the Inf and zeros elsewhere), guard bytes, h exact (one fp32 add), y within
 * 5e-7 relative for the cluster kernel (its scale is the CPU's formula in double, only the double
 * summation order differs) and 4e-6 for the fp32-sum kernels; kernels that must take a shape may not
 * decline it; two runs give the same bits. */
enum { AN_NORMAL, AN_LARGE, AN_HUGE, AN_TINY, AN_ZERO, AN_NAN, AN_INF, AN_NMODE };
static const char *const an_mode_name[AN_NMODE] = {"", " large", " huge", " tiny", " zero", " nan", " inf"};

static int an_fits(int kind, int64_t n, int64_t rows)
{
	switch (kind & ~KFUSE_AN_EARLY) {
	case KFUSE_AN_OLD: return 1;
	case KFUSE_AN_V4: return n % 4 == 0 && n <= 8192;
	case KFUSE_AN_CL: return n % 4 == 0 && n <= 16384 && rows <= KFUSE_AN_CL_ROWS;
	default: return 1; /* 0: the public op (falls back) */
	}
}

static int an_same(float g, float r, double rel)
{
	if (isnan(r))
		return isnan(g);
	if (isinf(r))
		return g == r;
	return isfinite(g) && fabs((double)g - (double)r) <= rel * fabs((double)r);
}

/* one case; returns 0, or 1 when the kernel declined (ERR_UNSUPPORTED) */
static int an_case(int kind, int64_t n, int64_t rows, int mode, int check_det)
{
	const size_t nr = (size_t)(n * rows);
	float *h = malloc(sizeof(float) * nr), *x = malloc(sizeof(float) * nr),
	      *w = malloc(sizeof(float) * n);
	float *y = malloc(sizeof(float) * nr), *hg = malloc(sizeof(float) * nr),
	      *yg = malloc(sizeof(float) * nr);
	float *h0 = malloc(sizeof(float) * nr);
	struct ops_dbuf hb = {0}, xb = {0}, wb = {0}, yb = {0};
	int declined = 0;
	if (!h || !x || !w || !y || !hg || !yg || !h0) {
		OPS_CHECK(0, "add_rmsnorm kinds: out of memory");
		goto out;
	}
	const float mag = mode == AN_LARGE  ? 1e15f
	                  : mode == AN_HUGE ? 1e19f
	                  : mode == AN_TINY ? 1e-30f
	                                    : 1.0f;
	for (size_t i = 0; i < nr; i++) {
		h[i] = mode == AN_ZERO ? 0.0f : 10.0f * mag * ops_rng_unif();
		x[i] = mode == AN_ZERO ? 0.0f : mag * ops_rng_unif();
	}
	if (mode == AN_NAN)
		x[ops_rng_next() % (uint64_t)n] = NAN; /* row 0 */
	if (mode == AN_INF)
		h[ops_rng_next() % (uint64_t)n] = -INFINITY;
	for (int64_t i = 0; i < n; i++)
		w[i] = 1.0f + 0.5f * ops_rng_unif();
	memcpy(h0, h, sizeof(float) * nr);
	if (up(&hb, h, sizeof(float) * nr) || up(&xb, x, sizeof(float) * nr) ||
	    up(&wb, w, sizeof(float) * n) || ops_dbuf_init(ctx, &yb, sizeof(float) * nr)) {
		OPS_CHECK(0, "add_rmsnorm kinds setup");
		goto out;
	}
	const float eps = 1e-5f;
	int rc = kind ? kfuse_add_rmsnorm_as(ctx, kind, hb.user, xb.user, yb.user, wb.user, n, rows, eps)
	              : kfuse_add_rmsnorm(ctx, hb.user, xb.user, yb.user, wb.user, n, rows, eps);
	if (rc == ERR_UNSUPPORTED) {
		declined = 1;
		OPS_CHECK(!an_fits(kind, n, rows),
		          "add_rmsnorm kind %#x declined n %" PRId64 " rows %" PRId64, kind, n, rows);
		goto out;
	}
	OPS_CHECK(an_fits(kind, n, rows),
	          "add_rmsnorm kind %#x took n %" PRId64 " rows %" PRId64 " it should decline", kind, n,
	          rows);
	OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0, "add_rmsnorm kind %#x rc %d", kind, rc);
	OPS_CHECK(ops_dbuf_get(ctx, &hb, hg) == 0 && ops_dbuf_get(ctx, &yb, yg) == 0,
	          "add_rmsnorm kind %#x: guard bytes damaged", kind);
	for (size_t i = 0; i < nr; i++)
		h[i] += x[i];
	kcpu_rmsnorm(y, n, h, n, w, n, rows, eps);
	const int cl = (kind & ~KFUSE_AN_EARLY) == KFUSE_AN_CL;
	const double rel = cl ? 5e-7 : 4e-6;
	int bad_h = 0, bad_y = 0;
	for (size_t i = 0; i < nr; i++) {
		bad_h += isnan(h[i]) ? !isnan(hg[i]) : memcmp(&h[i], &hg[i], 4) != 0;
		if (!an_same(yg[i], y[i], rel) && bad_y++ < 3)
			printf("  kind %#x n %" PRId64 " [%zu]: gpu %.9g cpu %.9g\n", kind, n, i, yg[i],
			       y[i]);
	}
	OPS_CHECK(bad_h == 0 && bad_y == 0,
	          "add_rmsnorm kind %#x n %" PRId64 " rows %" PRId64 "%s: %d h, %d y bad", kind, n, rows,
	          an_mode_name[mode], bad_h, bad_y);
	if (check_det) { /* again from the same h: the same bits */
		float *y2 = malloc(sizeof(float) * nr);
		rc = kcuda_upload(ctx, hb.user, h0, sizeof(float) * nr);
		rc = rc ? rc
		        : (kind ? kfuse_add_rmsnorm_as(ctx, kind, hb.user, xb.user, yb.user, wb.user, n, rows,
		                                       eps)
		                : kfuse_add_rmsnorm(ctx, hb.user, xb.user, yb.user, wb.user, n, rows, eps));
		OPS_CHECK(y2 && rc == 0 && kcuda_sync(ctx) == 0 && ops_dbuf_get(ctx, &yb, y2) == 0 &&
		              memcmp(y2, yg, sizeof(float) * nr) == 0,
		          "add_rmsnorm kind %#x n %" PRId64 " rows %" PRId64 ": two runs differ", kind, n,
		          rows);
		free(y2);
	}
out:
	ops_dbuf_fini(&hb);
	ops_dbuf_fini(&xb);
	ops_dbuf_fini(&wb);
	ops_dbuf_fini(&yb);
	free(h);
	free(x);
	free(w);
	free(y);
	free(hg);
	free(yg);
	free(h0);
	return declined;
}

/* PDL ordering: a long producer (kfwd_scale over 128 MB with h and x at its very end) right before
 * the norm, and a consumer (kfwd_scale of y by 3) right after it: the norm must read the scaled h
 * and x, and the consumer (launched early by KFUSE_AN_EARLY, while the producer still runs) must
 * read the norm's y. */
static void an_pdl(int kind, int64_t n, int64_t rows)
{
	const int64_t pad = (int64_t)32 << 20, nr = n * rows;
	float *buf = NULL, *yd = NULL, *wd = NULL;
	float *h = malloc(sizeof(float) * nr), *x = malloc(sizeof(float) * nr),
	      *w = malloc(sizeof(float) * n);
	float *y = malloc(sizeof(float) * nr), *yg = malloc(sizeof(float) * nr);
	int bad = 0, rc = -1;
	if (!h || !x || !w || !y || !yg ||
	    kcuda_alloc(sizeof(float) * (size_t)(pad + 2 * nr), (void **)&buf) ||
	    kcuda_alloc(sizeof(float) * (size_t)nr, (void **)&yd) ||
	    kcuda_alloc(sizeof(float) * (size_t)n, (void **)&wd)) {
		OPS_CHECK(0, "add_rmsnorm pdl setup");
		goto out;
	}
	for (int64_t i = 0; i < nr; i++) {
		h[i] = 10.0f * ops_rng_unif();
		x[i] = ops_rng_unif();
	}
	for (int64_t i = 0; i < n; i++)
		w[i] = 1.0f + 0.5f * ops_rng_unif();
	for (int64_t i = 0; i < nr; i++) /* the CPU sequence on 2h, 2x (exact doublings) */
		y[i] = 2.0f * h[i] + 2.0f * x[i];
	{
		float *hs = malloc(sizeof(float) * nr);
		if (!hs) {
			OPS_CHECK(0, "add_rmsnorm pdl: out of memory");
			goto out;
		}
		memcpy(hs, y, sizeof(float) * nr);
		kcpu_rmsnorm(y, n, hs, n, w, n, rows, 1e-5f);
		free(hs);
	}
	for (int64_t i = 0; i < nr; i++)
		y[i] *= 3.0f;
	rc = kcuda_upload(ctx, wd, w, sizeof(float) * (size_t)n);
	for (int rep = 0; rep < 3 && !rc; rep++) {
		rc = kcuda_memset(ctx, buf, 0, sizeof(float) * (size_t)pad);
		rc = rc ? rc : kcuda_memset(ctx, yd, 0, sizeof(float) * (size_t)nr);
		rc = rc ? rc : kcuda_upload(ctx, buf + pad, h, sizeof(float) * (size_t)nr);
		rc = rc ? rc : kcuda_upload(ctx, buf + pad + nr, x, sizeof(float) * (size_t)nr);
		rc = rc ? rc : kcuda_sync(ctx);
		rc = rc ? rc : kfwd_scale(ctx, buf, pad + 2 * nr, 2.0f); /* h and x written last */
		rc = rc ? rc
		        : kfuse_add_rmsnorm_as(ctx, kind, buf + pad, buf + pad + nr, yd, wd, n, rows, 1e-5f);
		rc = rc ? rc : kfwd_scale(ctx, yd, nr, 3.0f);
		rc = rc ? rc : kcuda_sync(ctx);
		rc = rc ? rc : kcuda_download(ctx, yg, yd, sizeof(float) * (size_t)nr);
		for (int64_t i = 0; i < nr && !rc; i++)
			if (!an_same(yg[i], y[i], (kind & ~KFUSE_AN_EARLY) == KFUSE_AN_CL ? 5e-7 : 4e-6) &&
			    bad++ < 3)
				printf("  pdl kind %#x [%" PRId64 "]: gpu %.9g cpu %.9g\n", kind, i, yg[i],
				       y[i]);
	}
	OPS_CHECK(rc == 0 && bad == 0,
	          "add_rmsnorm kind %#x after a PDL producer, n %" PRId64 " rows %" PRId64
	          ": rc %d, %d values read too early",
	          kind, n, rows, rc, bad);
	printf("add_rmsnorm kind %#x between a PDL producer and consumer, n %" PRId64 " rows %" PRId64
	       ", 3 runs: %s\n",
	       kind, n, rows, rc || bad ? "FAIL" : "ok");
out:
	kcuda_free(buf);
	kcuda_free(yd);
	kcuda_free(wd);
	free(h);
	free(x);
	free(w);
	free(y);
	free(yg);
}

static void test_add_rmsnorm_kinds(void)
{
	static const int kinds[] = {KFUSE_AN_OLD,
	                            KFUSE_AN_V4,
	                            KFUSE_AN_V4 | KFUSE_AN_EARLY,
	                            KFUSE_AN_CL,
	                            KFUSE_AN_CL | KFUSE_AN_EARLY,
	                            0};
	static const int64_t ns[] = {6144, 7168, 4096, 6143, 33, 1, 8, 2048, 512, 16384, 16388};
	static const int64_t rs[] = {1, 2, 3, 4, 5, 6, 7, 8, 64};
	for (size_t ki = 0; ki < sizeof(kinds) / sizeof(kinds[0]); ki++) {
		const int kind = kinds[ki];
		int n_run = 0, n_decl = 0;
		for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++)
			for (size_t ri = 0; ri < sizeof(rs) / sizeof(rs[0]); ri++) {
				if (quick && ri != 0 && ri != 7 && ri != 8 && !(ni == 0 && ri == 2))
					continue;
				const int d =
				    an_case(kind, ns[ni], rs[ri], AN_NORMAL, ni == 0 && (ri == 0 || ri == 7));
				n_decl += d;
				n_run += !d;
			}
		for (int mode = AN_LARGE; mode < AN_NMODE; mode++)
			for (int ni = 0; ni < 2; ni++) {
				if (mode == AN_HUGE && (kind & ~KFUSE_AN_EARLY) != KFUSE_AN_CL)
					continue; /* the fp32-sum kernels overflow there (documented) */
				n_run += !an_case(kind, ns[ni], ni ? 8 : 1, mode, 0);
			}
		printf("add_rmsnorm kind %#x: %d cases run, %d declined as expected\n", kind, n_run, n_decl);
		if (kind)
			for (int r = 1; r <= 8; r += 7)
				an_pdl(kind, 6144, r);
	}
	/* the public op refuses a kind it does not know */
	OPS_CHECK(kfuse_add_rmsnorm_as(ctx, 7, (float *)16, NULL, (float *)32, (float *)48, 4, 1, 1e-6f) ==
	              -EINVAL,
	          "add_rmsnorm kind 7 accepted");
	OPS_CHECK(kfuse_add_rmsnorm_as(ctx, KFUSE_AN_OLD | KFUSE_AN_EARLY, (float *)16, NULL, (float *)32,
	                               (float *)48, 4, 1, 1e-6f) == -EINVAL,
	          "add_rmsnorm old + early accepted");
}

/* ---- MLA latents -------------------------------------------------------------------------------- */
/* kfuse_mla_latent_parts on the same inputs (cq0, kv0): the same bits as kfuse_mla_latent (cqg, kvg),
 * c_q's int8 parts recorded, and a one-token product group of Q8_0 rows over c_q (as idx_q_b reads
 * it) with the parts within their error (1e-7 sum |w| m_j) plus fp32's of the product without them */
static void latent_parts_check(struct pool *p, struct ops_dbuf *cb, struct ops_dbuf *kb, struct ops_dbuf *wqb,
                               struct ops_dbuf *wkb, const struct kfuse_rope *rp, int64_t Cq, int64_t C,
                               int64_t R, int n, const float *cq0, const float *kv0, const float *cqg,
                               const float *kvg)
{
	const int64_t W = C + R, NO = 96;
	float *c2 = malloc(sizeof(float) * Cq * n), *k2 = malloc(sizeof(float) * W * n);
	float *row = malloc(sizeof(float) * Cq), *y1 = malloc(sizeof(float) * NO),
	      *y2 = malloc(sizeof(float) * NO);
	size_t rb = 0;
	ktype_row_bytes(KT_Q8_0, Cq, &rb);
	uint8_t *wh = malloc(rb * NO);
	struct kweight wd[2] = {{0}};
	struct ops_dbuf yb = {0};
	if (!c2 || !k2 || !row || !y1 || !y2 || !wh ||
	    kcuda_upload(ctx, cb->user, cq0, sizeof(float) * Cq * n) ||
	    kcuda_upload(ctx, kb->user, kv0, sizeof(float) * W * n) ||
	    ops_dbuf_init(ctx, &yb, sizeof(float) * NO)) {
		OPS_CHECK(0, "mla_latent parts setup");
		goto out;
	}
	ops_fill_weight(KT_Q8_0, Cq, NO, rb, wh);
	struct kweight w0 = {.type = KT_Q8_0, .n_in = Cq, .n_out = 64, .row_bytes = rb, .data = wh};
	struct kweight w1 = {
	    .type = KT_Q8_0, .n_in = Cq, .n_out = NO - 64, .row_bytes = rb, .data = wh + 64 * rb};
	if (kcuda_weight_upload(ctx, &w0, &wd[0]) || kcuda_weight_upload(ctx, &w1, &wd[1])) {
		OPS_CHECK(0, "mla_latent parts: weight upload");
		goto out;
	}
	struct kfuse_kv kvd = pool_kv(p);
	int rc = kfuse_mla_latent_parts(ctx, cb->user, Cq, wqb->user, 1e-6f, kb->user, C, R, wkb->user, 1e-5f,
	                                n, rp, &kvd);
	OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0 && ops_dbuf_get(ctx, cb, c2) == 0 &&
	              ops_dbuf_get(ctx, kb, k2) == 0,
	          "mla_latent_parts rc %d", rc);
	OPS_CHECK(!memcmp(c2, cqg, sizeof(float) * Cq * n) && !memcmp(k2, kvg, sizeof(float) * W * n),
	          "mla_latent_parts Cq %" PRId64 " rows %d: outputs differ from mla_latent's", Cq, n);
	OPS_CHECK(kcuda_xparts_of(ctx) == (const float *)cb->user,
	          "mla_latent_parts Cq %" PRId64 ": no parts left", Cq);
	/* row 0 of c_q through two Q8_0 products in one launch, with the parts and without */
	struct kcuda_mm_seg seg[2] = {{&wd[0], yb.user, 64}, {&wd[1], (float *)yb.user + 64, NO - 64}};
	rc = kcuda_matmul_multi(ctx, 2, seg, cb->user, Cq, 1);
	OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0 && ops_dbuf_get(ctx, &yb, y1) == 0, "parts product rc %d",
	          rc);
	kcuda_xparts_forget(ctx);
	rc = kcuda_matmul_multi(ctx, 2, seg, cb->user, Cq, 1);
	OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0 && ops_dbuf_get(ctx, &yb, y2) == 0, "product rc %d", rc);
	int bad = 0;
	double worst = 0;
	for (int64_t o = 0; o < NO; o++) {
		kcpu_dequant_row(KT_Q8_0, wh + (size_t)o * rb, row, Cq);
		double mag = 0, magm = 0;
		for (int64_t i = 0; i < Cq; i++) {
			float m = 0;
			for (int64_t q = i / 32 * 32; q < i / 32 * 32 + 32; q++)
				m = fmaxf(m, fabsf(c2[q]));
			mag += fabs((double)row[i] * c2[i]);
			magm += fabs((double)row[i]) * m;
		}
		const double d = fabs((double)y1[o] - y2[o]),
		             tol = 1e-7 * magm + 4e-6 * sqrt((double)Cq) * mag;
		bad += !(d <= tol);
		worst = mag > 0 && d / mag > worst ? d / mag : worst;
	}
	OPS_CHECK(bad == 0, "mla_latent_parts Cq %" PRId64 ": %d products off with the parts", Cq, bad);
	printf("mla_latent_parts Cq %4" PRId64
	       " rows %d: same outputs, parts product vs fp32 %.2e of sum|wx| %s\n",
	       Cq, n, worst, bad ? "FAIL" : "ok");
out:
	kcuda_xparts_forget(ctx);
	kcuda_weight_free(&wd[0]);
	kcuda_weight_free(&wd[1]);
	ops_dbuf_fini(&yb);
	free(c2);
	free(k2);
	free(row);
	free(y1);
	free(y2);
	free(wh);
}

static void test_mla_latent(void)
{
	struct lcase {
		int64_t Cq, C, R;
		int rows, pairing, bf16;
	} cases[] = {
	    {2048, 512, 64, 1, 0, 0}, {1536, 512, 64, 4, 0, 1}, {2048, 512, 64, 3, 1, 0},
	    {33, 31, 8, 4, 1, 1},     {1536, 512, 64, 4, 0, 0},
	};
	for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
		if (quick && ci >= 3)
			continue;
		const struct lcase *k = &cases[ci];
		const int64_t Cq = k->Cq, C = k->C, R = k->R, W = C + R;
		const int n = k->rows;
		float inv[64], cs[128];
		kcpu_rope_freqs(inv, R, 1e4f, ci % 2 ? 40.0f : 1.0f, 4096, 32.0f, 1.0f);
		float *cq = malloc(sizeof(float) * Cq * n), *kv = malloc(sizeof(float) * W * n);
		float *wq = malloc(sizeof(float) * Cq), *wk = malloc(sizeof(float) * C);
		float *cqg = malloc(sizeof(float) * Cq * n), *kvg = malloc(sizeof(float) * W * n);
		float *cq0 = malloc(sizeof(float) * Cq * n), *kv0 = malloc(sizeof(float) * W * n);
		for (int64_t i = 0; i < Cq * n; i++)
			cq0[i] = cq[i] = 3.0f * ops_rng_unif();
		for (int64_t i = 0; i < W * n; i++)
			kv0[i] = kv[i] = ops_rng_unif();
		for (int64_t i = 0; i < Cq; i++)
			wq[i] = 1.0f + 0.5f * ops_rng_unif();
		for (int64_t i = 0; i < C; i++)
			wk[i] = 1.0f + 0.5f * ops_rng_unif();
		struct pool p;
		struct ops_dbuf cb = {0}, kb = {0}, wqb = {0}, wkb = {0}, ib = {0};
		if (pool_init(&p, W, k->bf16, n) || up(&cb, cq, sizeof(float) * Cq * n) ||
		    up(&kb, kv, sizeof(float) * W * n) || up(&wqb, wq, sizeof(float) * Cq) ||
		    up(&wkb, wk, sizeof(float) * C) || up(&ib, inv, sizeof(float) * (R / 2))) {
			OPS_CHECK(0, "mla_latent setup");
			goto next;
		}
		struct kfuse_rope rp = {.inv_freq = ib.user, .pos = p.pos.user, .pairing = k->pairing};
		struct kfuse_kv kvd = pool_kv(&p);
		int rc = kfuse_mla_latent(ctx, cb.user, Cq, wqb.user, 1e-6f, kb.user, C, R, wkb.user, 1e-5f,
		                          n, &rp, &kvd);
		OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0, "mla_latent rc %d", rc);
		OPS_CHECK(ops_dbuf_get(ctx, &cb, cqg) == 0 && ops_dbuf_get(ctx, &kb, kvg) == 0,
		          "mla_latent: guard bytes damaged");
		/* the CPU sequence (backend_cpu.c cpu_mla_latent) */
		kcpu_rmsnorm(cq, Cq, cq, Cq, wq, Cq, n, 1e-6f);
		kcpu_rmsnorm(kv, W, kv, W, wk, C, n, 1e-5f);
		for (int r = 0; r < n; r++) {
			kcpu_rope_cs(inv, R / 2, p.pos_h[r], cs);
			kcpu_rope(kv + r * W + C, R, cs, k->pairing);
			pool_put(&p, r, kv + r * W);
		}
		int bad = 0;
		for (int64_t i = 0; i < Cq * n; i++)
			bad += !close_to(cqg[i], cq[i], 4e-6, 1e-6);
		for (int64_t i = 0; i < W * n; i++)
			bad += !close_to(kvg[i], kv[i], 8e-6, 8e-6);
		int bad_pool = pool_check(&p, 8e-6, 8e-6);
		OPS_CHECK(bad == 0 && bad_pool == 0,
		          "mla_latent Cq %" PRId64 " C %" PRId64
		          " rows %d pairing %d bf16 %d: %d bad, %d pool bad",
		          Cq, C, n, k->pairing, k->bf16, bad, bad_pool);
		printf("mla_latent Cq %4" PRId64 " C %3" PRId64 " R %2" PRId64 " rows %d pairing %d %s ok\n",
		       Cq, C, R, n, k->pairing, k->bf16 ? "bf16" : "f32");
		if (Cq % 256 == 0)
			latent_parts_check(&p, &cb, &kb, &wqb, &wkb, &rp, Cq, C, R, n, cq0, kv0, cqg, kvg);
	next:
		pool_fini(&p);
		ops_dbuf_fini(&cb);
		ops_dbuf_fini(&kb);
		ops_dbuf_fini(&wqb);
		ops_dbuf_fini(&wkb);
		ops_dbuf_fini(&ib);
		free(cq);
		free(kv);
		free(wq);
		free(wk);
		free(cqg);
		free(kvg);
		free(cq0);
		free(kv0);
	}
}

/* PDL ordering of mla_latent (it loads its norm weights before KDEP_ENTRY and, by default, triggers
 * its dependents before it): its inputs written last by a 128 MB producer (kfwd_scale by 2 of halved
 * values: exact) right before the launch, a consumer (kfwd_scale by 1) right after; the outputs must
 * equal, bit for bit, those of the same launch on inputs uploaded directly. */
static void test_mla_latent_pdl(void)
{
	const int64_t Cq = 2048, C = 512, R = 64, W = C + R, pad = (int64_t)32 << 20;
	const int n = 2;
	float inv[32];
	kcpu_rope_freqs(inv, R, 1e4f, 1.0f, 4096, 32.0f, 1.0f);
	const size_t nin = (size_t)(Cq * n + W * n);
	float *in = malloc(sizeof(float) * nin), *half = malloc(sizeof(float) * nin);
	float *ref = malloc(sizeof(float) * nin), *got = malloc(sizeof(float) * nin);
	float *wq = malloc(sizeof(float) * Cq), *wk = malloc(sizeof(float) * C), *buf = NULL;
	struct pool p;
	struct ops_dbuf wqb = {0}, wkb = {0}, ib = {0};
	int rc = -1, bad = 0;
	memset(&p, 0, sizeof(p));
	if (!in || !half || !ref || !got || !wq || !wk) {
		OPS_CHECK(0, "mla_latent pdl: out of memory");
		goto out;
	}
	for (size_t i = 0; i < nin; i++) {
		in[i] = 2.0f * ops_rng_unif();
		half[i] = 0.5f * in[i];
	}
	for (int64_t i = 0; i < Cq; i++)
		wq[i] = 1.0f + 0.5f * ops_rng_unif();
	for (int64_t i = 0; i < C; i++)
		wk[i] = 1.0f + 0.5f * ops_rng_unif();
	if (pool_init(&p, W, 1, n) || up(&wqb, wq, sizeof(float) * Cq) || up(&wkb, wk, sizeof(float) * C) ||
	    up(&ib, inv, sizeof(float) * (R / 2)) ||
	    kcuda_alloc(sizeof(float) * ((size_t)pad + nin), (void **)&buf)) {
		OPS_CHECK(0, "mla_latent pdl setup");
		goto out;
	}
	struct kfuse_rope rp = {.inv_freq = ib.user, .pos = p.pos.user, .pairing = 0};
	struct kfuse_kv kvd = pool_kv(&p);
	float *cq = buf + pad, *kv = buf + pad + Cq * n;
	rc = kcuda_upload(ctx, cq, in, sizeof(float) * nin); /* the reference: inputs uploaded */
	rc =
	    rc ? rc : kfuse_mla_latent(ctx, cq, Cq, wqb.user, 1e-6f, kv, C, R, wkb.user, 1e-5f, n, &rp, &kvd);
	rc = rc ? rc : kcuda_sync(ctx);
	rc = rc ? rc : kcuda_download(ctx, ref, cq, sizeof(float) * nin);
	for (int rep = 0; rep < 3 && !rc; rep++) {
		rc = kcuda_memset(ctx, buf, 0, sizeof(float) * (size_t)pad);
		rc = rc ? rc : kcuda_upload(ctx, cq, half, sizeof(float) * nin);
		rc = rc ? rc : kcuda_sync(ctx);
		rc = rc ? rc : kfwd_scale(ctx, buf, pad + (int64_t)nin, 2.0f); /* the inputs written last */
		rc = rc ? rc
		        : kfuse_mla_latent(ctx, cq, Cq, wqb.user, 1e-6f, kv, C, R, wkb.user, 1e-5f, n, &rp,
		                           &kvd);
		rc = rc ? rc : kfwd_scale(ctx, cq, (int64_t)nin, 1.0f);
		rc = rc ? rc : kcuda_sync(ctx);
		rc = rc ? rc : kcuda_download(ctx, got, cq, sizeof(float) * nin);
		for (size_t i = 0; i < nin && !rc; i++)
			bad += memcmp(&got[i], &ref[i], 4) != 0;
	}
	OPS_CHECK(rc == 0 && bad == 0, "mla_latent after a PDL producer: rc %d, %d values differ", rc, bad);
	printf("mla_latent between a PDL producer and consumer, 3 runs: %s\n", rc || bad ? "FAIL" : "ok");
out:
	pool_fini(&p);
	ops_dbuf_fini(&wqb);
	ops_dbuf_fini(&wkb);
	ops_dbuf_fini(&ib);
	kcuda_free(buf);
	free(in);
	free(half);
	free(ref);
	free(got);
	free(wq);
	free(wk);
}

/* ---- mla_latent + the indexer's k_I / w_I in one launch ------------------------------------------
 * kfuse_mla_latent_idx against the two ops it merges (kfuse_mla_latent, then kfuse_idx_prep), both
 * checked against the CPU above: w_I bit for bit, c_q, [c | k_r], k_I and both pools within a few
 * ulps (the same device arithmetic up to FMA contraction), q_I untouched (its rope is left to the
 * indexer's loads). */
static void test_mla_latent_idx(void)
{
	struct xcase {
		int64_t Cq, C, R, HI, DI;
		int rows, pairing, pairing_i, bf16, bias;
	} cases[] = {
	    {2048, 512, 64, 32, 128, 1, 0, 1, 1, 1},
	    {1536, 512, 64, 64, 128, 4, 1, 0, 0, 0},
	    {33, 31, 8, 3, 40, 3, 1, 1, 1, 1},
	};
	for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
		const struct xcase *k = &cases[ci];
		const int64_t Cq = k->Cq, C = k->C, R = k->R, W = C + R, HI = k->HI, DI = k->DI;
		const int n = k->rows;
		float inv[64];
		kcpu_rope_freqs(inv, R, 1e4f, 1.0f, 4096, 32.0f, 1.0f);
		const size_t ncq = (size_t)(Cq * n), nkv = (size_t)(W * n), nq = (size_t)(HI * DI * n),
		             nw = (size_t)(HI * n), nk = (size_t)(DI * n);
		const size_t tot = ncq + nkv + nq + nw + nk + (size_t)(Cq + C + 2 * DI);
		float *h = malloc(sizeof(float) * tot), *g1 = malloc(sizeof(float) * tot),
		      *g2 = malloc(sizeof(float) * tot);
		for (size_t i = 0; h && i < tot; i++)
			h[i] = 2.0f * ops_rng_unif() + (i % 7 == 0 ? 1.0f : 0.0f);
		const float *hcq = h, *hkv = hcq + ncq, *hq = hkv + nkv, *hw = hq + nq, *hk = hw + nw,
		            *hwq = hk + nk, *hwk = hwq + Cq, *hkw = hwk + C, *hkb = hkw + DI;
		struct pool pl[2], pi[2];
		struct ops_dbuf b[2][5], wb = {0}, ib = {0};
		memset(pl, 0, sizeof(pl));
		memset(pi, 0, sizeof(pi));
		memset(b, 0, sizeof(b));
		int bad = 0;
		if (!h || !g1 || !g2 || up(&wb, hwq, sizeof(float) * (size_t)(Cq + C + 2 * DI)) ||
		    up(&ib, inv, sizeof(float) * (size_t)(R / 2))) {
			OPS_CHECK(0, "mla_latent_idx setup");
			goto next;
		}
		for (int v = 0; v < 2; v++)
			if (pool_init(&pl[v], W, k->bf16, n) || pool_init(&pi[v], DI, k->bf16, n) ||
			    up(&b[v][0], hcq, sizeof(float) * ncq) ||
			    up(&b[v][1], hkv, sizeof(float) * nkv) || up(&b[v][2], hq, sizeof(float) * nq) ||
			    up(&b[v][3], hw, sizeof(float) * nw) || up(&b[v][4], hk, sizeof(float) * nk)) {
				OPS_CHECK(0, "mla_latent_idx setup");
				goto next;
			}
		{
			const float *dwq = wb.user, *dwk = dwq + Cq, *dkw = dwk + C, *dkb = dkw + DI;
			(void)hwk;
			(void)hkw;
			(void)hkb;
			const float ws = 1.0f / sqrtf((float)HI);
			/* 0: the two ops */
			struct kfuse_rope rp = {
			    .inv_freq = ib.user, .pos = pl[0].pos.user, .pairing = k->pairing};
			struct kfuse_rope rpi = {
			    .inv_freq = ib.user, .pos = pl[0].pos.user, .pairing = k->pairing_i};
			struct kfuse_kv kvl0 = pool_kv(&pl[0]), kvi0 = pool_kv(&pi[0]);
			int rc = kfuse_mla_latent(ctx, b[0][0].user, Cq, dwq, 1e-6f, b[0][1].user, C, R, dwk,
			                          1e-5f, n, &rp, &kvl0);
			rc |= kfuse_idx_prep(ctx, b[0][2].user, b[0][3].user, HI, ws, b[0][4].user, DI, R,
			                     dkw, k->bias ? dkb : NULL, 1e-6f, n, &rpi, &kvi0);
			/* 1: one launch */
			struct kfuse_rope rp1 = {
			    .inv_freq = ib.user, .pos = pl[1].pos.user, .pairing = k->pairing};
			struct kfuse_kv kvl1 = pool_kv(&pl[1]);
			struct kfuse_idx_key ik = {
			    .kI = b[1][4].user,
			    .DI = DI,
			    .R = R,
			    .kw = dkw,
			    .kb = k->bias ? dkb : NULL,
			    .eps = 1e-6f,
			    .wI = b[1][3].user,
			    .HI = HI,
			    .wscale = ws,
			    .rp = {.inv_freq = ib.user, .pos = pl[1].pos.user, .pairing = k->pairing_i},
			    .kv = pool_kv(&pi[1])};
			rc |= kfuse_mla_latent_idx(ctx, b[1][0].user, Cq, dwq, 1e-6f, b[1][1].user, C, R, dwk,
			                           1e-5f, n, &rp1, &kvl1, &ik);
			OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0, "mla_latent_idx rc %d", rc);
		}
		{
			/* q_I untouched and w_I (one fp32 product) bit for bit; the rest within a few ulps:
			 * the compiler may contract a product and a sum into an FMA in one kernel and not in
			 * the other (the 16:40 H200 run: k_I with a bias differed in its last bit) */
			const size_t sz[5] = {ncq, nkv, nq, nw, nk};
			for (int j = 0; j < 5; j++) {
				size_t gb = ops_dbuf_get(ctx, &b[0][j], g1) + ops_dbuf_get(ctx, &b[1][j], g2);
				bad += gb != 0;
				if (j == 2)
					bad += memcmp(g2, hq, sizeof(float) * sz[j]) != 0;
				else if (j == 3)
					bad += memcmp(g1, g2, sizeof(float) * sz[j]) != 0;
				else
					for (size_t i = 0; i < sz[j]; i++)
						if (!close_to(g2[i], g1[i], 2e-6, 2e-6)) {
							bad++;
							break;
						}
			}
			const size_t pb[2] = {pl[0].block_bytes * NB, pi[0].block_bytes * NB};
			for (int j = 0; j < 2; j++) {
				uint8_t *p1 = malloc(pb[j]), *p2 = malloc(pb[j]);
				struct pool *x = j ? pi : pl;
				int pbad = !p1 || !p2 || ops_dbuf_get(ctx, &x[0].dev, p1) != 0 ||
				           ops_dbuf_get(ctx, &x[1].dev, p2) != 0;
				/* values: bf16 may round to a neighbour when the fp32 values straddle a tie
				 */
				const size_t elt = k->bf16 ? 2 : 4;
				for (size_t i = 0; !pbad && i + elt <= pb[j]; i += elt) {
					if (!memcmp(p1 + i, p2 + i, elt))
						continue;
					float v1, v2;
					if (k->bf16) {
						uint16_t a1, a2;
						memcpy(&a1, p1 + i, 2);
						memcpy(&a2, p2 + i, 2);
						v1 = kbf16_to_f32(a1);
						v2 = kbf16_to_f32(a2);
					} else {
						memcpy(&v1, p1 + i, 4);
						memcpy(&v2, p2 + i, 4);
					}
					pbad = !close_to(v2, v1, k->bf16 ? 1.0 / 128 : 2e-6, 2e-6);
				}
				bad += pbad;
				free(p1);
				free(p2);
			}
		}
		OPS_CHECK(bad == 0,
		          "mla_latent_idx Cq %" PRId64 " HI %" PRId64 " DI %" PRId64 ": %d parts differ", Cq,
		          HI, DI, bad);
		printf("mla_latent_idx Cq %4" PRId64 " C %3" PRId64 " HI %2" PRId64 " DI %3" PRId64
		       " rows %d %s: = mla_latent + idx_prep, q_I untouched\n",
		       Cq, C, HI, DI, n, k->bf16 ? "bf16" : "f32");
	next:
		for (int v = 0; v < 2; v++) {
			pool_fini(&pl[v]);
			pool_fini(&pi[v]);
			for (int j = 0; j < 5; j++)
				ops_dbuf_fini(&b[v][j]);
		}
		ops_dbuf_fini(&wb);
		ops_dbuf_fini(&ib);
		free(h);
		free(g1);
		free(g2);
	}
}

/* ---- indexer inputs ----------------------------------------------------------------------------- */
static void test_idx_prep(void)
{
	struct icase {
		int64_t HI, DI, R;
		int rows, pairing, bf16, bias;
	} cases[] = {
	    {32, 128, 64, 1, 0, 0, 1},
	    {64, 128, 64, 4, 1, 1, 1},
	    {8, 128, 64, 3, 0, 1, 0},
	    {3, 40, 8, 4, 1, 0, 1},
	};
	for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
		if (quick && ci >= 2)
			continue;
		const struct icase *k = &cases[ci];
		const int64_t HI = k->HI, DI = k->DI, R = k->R;
		const int n = k->rows;
		float inv[64], cs[128];
		kcpu_rope_freqs(inv, R, 1e4f, 1.0f, 4096, 32.0f, 1.0f);
		float *q = malloc(sizeof(float) * HI * DI * n), *wI = malloc(sizeof(float) * HI * n);
		float *kI = malloc(sizeof(float) * DI * n), *kw = malloc(sizeof(float) * DI),
		      *kbias = malloc(sizeof(float) * DI);
		float *qg = malloc(sizeof(float) * HI * DI * n), *wg = malloc(sizeof(float) * HI * n),
		      *kg = malloc(sizeof(float) * DI * n);
		for (int64_t i = 0; i < HI * DI * n; i++)
			q[i] = ops_rng_unif();
		for (int64_t i = 0; i < HI * n; i++)
			wI[i] = 4.0f * ops_rng_unif();
		for (int64_t i = 0; i < DI * n; i++)
			kI[i] = 2.0f * ops_rng_unif() + 0.5f;
		for (int64_t i = 0; i < DI; i++) {
			kw[i] = 1.0f + 0.5f * ops_rng_unif();
			kbias[i] = 0.1f * ops_rng_unif();
		}
		const float ws = 1.0f / sqrtf((float)HI);
		struct pool p;
		struct ops_dbuf qb = {0}, wb = {0}, kb = {0}, kwb = {0}, kbb = {0}, ib = {0};
		if (pool_init(&p, DI, k->bf16, n) || up(&qb, q, sizeof(float) * HI * DI * n) ||
		    up(&wb, wI, sizeof(float) * HI * n) || up(&kb, kI, sizeof(float) * DI * n) ||
		    up(&kwb, kw, sizeof(float) * DI) || up(&kbb, kbias, sizeof(float) * DI) ||
		    up(&ib, inv, sizeof(float) * (R / 2))) {
			OPS_CHECK(0, "idx_prep setup");
			goto next;
		}
		struct kfuse_rope rp = {.inv_freq = ib.user, .pos = p.pos.user, .pairing = k->pairing};
		struct kfuse_kv kvd = pool_kv(&p);
		int rc = kfuse_idx_prep(ctx, qb.user, wb.user, HI, ws, kb.user, DI, R, kwb.user,
		                        k->bias ? kbb.user : NULL, 1e-6f, n, &rp, &kvd);
		OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0, "idx_prep rc %d", rc);
		OPS_CHECK(ops_dbuf_get(ctx, &qb, qg) == 0 && ops_dbuf_get(ctx, &wb, wg) == 0 &&
		              ops_dbuf_get(ctx, &kb, kg) == 0,
		          "idx_prep: guard bytes damaged");
		/* the CPU sequence (backend_cpu.c cpu_idx_prep) */
		kcpu_layernorm(kI, DI, kI, DI, kw, k->bias ? kbias : NULL, DI, n, 1e-6f);
		for (int r = 0; r < n; r++) {
			kcpu_rope_cs(inv, R / 2, p.pos_h[r], cs);
			for (int64_t hh = 0; hh < HI; hh++)
				kcpu_rope(q + (r * HI + hh) * DI, R, cs, k->pairing);
			for (int64_t j = 0; j < HI; j++)
				wI[r * HI + j] *= ws;
			kcpu_rope(kI + r * DI, R, cs, k->pairing);
			pool_put(&p, r, kI + r * DI);
		}
		int bad_q = 0, bad_w = 0, bad_k = 0;
		for (int64_t i = 0; i < HI * DI * n; i++)
			bad_q += !close_to(qg[i], q[i], 4e-6, 4e-6);
		for (int64_t i = 0; i < HI * n; i++)
			bad_w += memcmp(&wg[i], &wI[i], 4) != 0; /* one fp32 product: exact */
		for (int64_t i = 0; i < DI * n; i++)
			bad_k += !close_to(kg[i], kI[i], 8e-6, 8e-6);
		int bad_pool = pool_check(&p, 8e-6, 8e-6);
		OPS_CHECK(bad_q == 0 && bad_w == 0 && bad_k == 0 && bad_pool == 0,
		          "idx_prep HI %" PRId64 " DI %" PRId64 " rows %d: bad q %d w %d k %d pool %d", HI,
		          DI, n, bad_q, bad_w, bad_k, bad_pool);
		printf("idx_prep HI %2" PRId64 " DI %3" PRId64 " R %2" PRId64 " rows %d pairing %d %s%s ok\n",
		       HI, DI, R, n, k->pairing, k->bf16 ? "bf16" : "f32", k->bias ? "" : " (no bias)");
	next:
		pool_fini(&p);
		ops_dbuf_fini(&qb);
		ops_dbuf_fini(&wb);
		ops_dbuf_fini(&kb);
		ops_dbuf_fini(&kwb);
		ops_dbuf_fini(&kbb);
		ops_dbuf_fini(&ib);
		free(q);
		free(wI);
		free(kI);
		free(kw);
		free(kbias);
		free(qg);
		free(wg);
		free(kg);
	}
}

/* ---- copy + rope (the absorbed query's rotary part) -------------------------------------------- */
static void test_rope_copy(void)
{
	const int64_t N = 192, R = 64, C = 512, NR = N + R;
	for (int pairing = 0; pairing < 2; pairing++)
		for (int64_t H = 1; H <= 16; H *= 4) {
			const int64_t n = 1 + H % 3, lds = H * NR, ldd = H * (C + R);
			float inv[32], cs[64];
			kcpu_rope_freqs(inv, R, 1e6f, 1.0f, 4096, 32.0f, 1.0f);
			int32_t pos[3] = {0, 4095, 77};
			float *src = malloc(sizeof(float) * lds * n), *dst = malloc(sizeof(float) * ldd * n);
			for (int64_t i = 0; i < lds * n; i++)
				src[i] = ops_rng_unif();
			struct ops_dbuf sb = {0}, db = {0}, ib = {0}, pb = {0};
			if (up(&sb, src, sizeof(float) * lds * n) ||
			    ops_dbuf_init(ctx, &db, sizeof(float) * ldd * n) || up(&ib, inv, sizeof(inv)) ||
			    up(&pb, pos, sizeof(pos))) {
				OPS_CHECK(0, "rope_copy setup");
				goto next;
			}
			struct kfuse_rope rp = {.inv_freq = ib.user, .pos = pb.user, .pairing = pairing};
			int rc = kfuse_rope_copy(ctx, (float *)db.user + C, ldd, C + R,
			                         (const float *)sb.user + N, lds, NR, n, H, R, &rp);
			OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0, "rope_copy rc %d", rc);
			OPS_CHECK(ops_dbuf_get(ctx, &db, dst) == 0, "rope_copy: guard bytes damaged");
			int bad = 0;
			for (int64_t t = 0; t < n; t++) {
				kcpu_rope_cs(inv, R / 2, pos[t], cs);
				for (int64_t hh = 0; hh < H; hh++) {
					float u[64];
					memcpy(u, src + t * lds + hh * NR + N, sizeof(u));
					kcpu_rope(u, R, cs, pairing);
					const float *g = dst + t * ldd + hh * (C + R);
					for (int64_t i = 0; i < C; i++) /* the absorbed part is not touched */
						bad += !ops_is_fill_f32(g[i]);
					for (int64_t i = 0; i < R; i++)
						bad += !close_to(g[C + i], u[i], 0, 4e-6);
				}
			}
			OPS_CHECK(bad == 0, "rope_copy heads %" PRId64 " pairing %d: %d bad", H, pairing,
			          bad);
			printf("rope_copy heads %2" PRId64 " rows %" PRId64 " pairing %d ok\n", H, n,
			       pairing);
		next:
			ops_dbuf_fini(&sb);
			ops_dbuf_fini(&db);
			ops_dbuf_fini(&ib);
			ops_dbuf_fini(&pb);
			free(src);
			free(dst);
		}
}

/* ---- absorbed query: k_b product + q rope in one launch ----------------------------------------
 * kfuse_absorb_rope against the CPU (kcpu_matmul per head, kcpu_rope) and against the two GPU ops
 * it replaces (kfwd_head_gemv + kfuse_rope_copy): the product part bit for bit (the same kernel
 * arithmetic), the rotary part within an ulp or two. GLM-5 per rank (H 8, nope 192), DeepSeek-V3
 * (H 16, nope 128), 1..8 tokens, both pairings; shapes it must decline. */
static void test_absorb_rope(void)
{
	struct acase {
		int H;
		int64_t N, C, R;
		int n, pairing;
	} cases[] = {
	    {8, 192, 512, 64, 1, 0},   {8, 192, 512, 64, 8, 1}, {16, 128, 512, 64, 1, 1},
	    {16, 128, 512, 64, 4, 0},  {8, 192, 512, 64, 3, 0}, {3, 64, 40, 16, 2, 1},
	    {128, 128, 512, 64, 2, 0},
	};
	for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
		if (quick && ci >= 4)
			continue;
		const struct acase *k = &cases[ci];
		const int H = k->H, n = k->n;
		const int64_t N = k->N, C = k->C, R = k->R, NR = N + R, CR = C + R, ldx = H * NR,
		              ldy = H * CR;
		size_t rb = 0;
		ktype_row_bytes(KT_Q8_0, N, &rb);
		const size_t mat = rb * (size_t)C;
		uint8_t *w = malloc(mat * (size_t)H);
		float *x = malloc(sizeof(float) * (size_t)(n * ldx)),
		      *ref = malloc(sizeof(float) * (size_t)(n * ldy));
		float *got = malloc(sizeof(float) * (size_t)(n * ldy)),
		      *got2 = malloc(sizeof(float) * (size_t)(n * ldy));
		float *deq = malloc(sizeof(float) * (size_t)N);
		float inv[64], cs[128];
		int32_t pos[8];
		struct kweight dw = {0};
		struct ops_dbuf xb = {0}, yb = {0}, y2b = {0}, ib = {0}, pb = {0};
		int bad = 0, bad2 = 0;
		double worst = 0;
		ops_fill_weight(KT_Q8_0, N, C * H, rb, w);
		for (int64_t i = 0; i < n * ldx; i++)
			x[i] = ops_rng_unif();
		kcpu_rope_freqs(inv, R, 1e4f, ci % 2 ? 40.0f : 1.0f, 4096, 32.0f, 1.0f);
		for (int t = 0; t < n; t++)
			pos[t] = (int32_t)((t * 7919 + 13 * (int)ci) % 60000);
		struct kweight hw = {KT_Q8_0, N, C * H, rb, w};
		if (kcuda_weight_upload(ctx, &hw, &dw) || up(&xb, x, sizeof(float) * (size_t)(n * ldx)) ||
		    ops_dbuf_init(ctx, &yb, sizeof(float) * (size_t)(n * ldy)) ||
		    ops_dbuf_init(ctx, &y2b, sizeof(float) * (size_t)(n * ldy)) ||
		    up(&ib, inv, sizeof(float) * (size_t)(R / 2)) ||
		    up(&pb, pos, sizeof(int32_t) * (size_t)n)) {
			OPS_CHECK(0, "absorb_rope setup");
			goto next;
		}
		struct kweight w0 = dw;
		w0.n_out = C;
		struct kfuse_rope rp = {.inv_freq = ib.user, .pos = pb.user, .pairing = k->pairing};
		int rc = kfuse_absorb_rope(ctx, &w0, mat, H, xb.user, ldx, NR, n, yb.user, ldy, CR, R, &rp);
		OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0, "absorb_rope H %d n %d: rc %d", H, n, rc);
		OPS_CHECK(ops_dbuf_get(ctx, &yb, got) == 0, "absorb_rope: guard bytes damaged");
		/* the two ops it replaces */
		rc = kfwd_head_gemv(ctx, &w0, mat, H, xb.user, ldx, NR, n, y2b.user, ldy, CR);
		rc |= kfuse_rope_copy(ctx, (float *)y2b.user + C, ldy, CR, (const float *)xb.user + N, ldx,
		                      NR, n, H, R, &rp);
		OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0 && ops_dbuf_get(ctx, &y2b, got2) == 0,
		          "absorb_rope: the two-op reference failed (rc %d)", rc);
		/* the CPU */
		for (int h = 0; h < H; h++) {
			struct kweight wh = {KT_Q8_0, N, C, rb, w + (size_t)h * mat};
			kcpu_matmul(NULL, &wh, x + h * NR, ldx, n, ref + h * CR, ldy);
		}
		for (int t = 0; t < n; t++) {
			kcpu_rope_cs(inv, R / 2, pos[t], cs);
			for (int h = 0; h < H; h++) {
				float *u = ref + t * ldy + h * CR + C;
				memcpy(u, x + t * ldx + h * NR + N, sizeof(float) * (size_t)R);
				kcpu_rope(u, R, cs, k->pairing);
			}
		}
		const double tol = 2e-6 * sqrt((double)N); /* test_ops_head_gemv's tolerance */
		for (int h = 0; h < H; h++)
			for (int64_t r = 0; r < C; r++) {
				kcpu_dequant_row(KT_Q8_0, w + (size_t)h * mat + (size_t)r * rb, deq, N);
				for (int t = 0; t < n; t++) {
					double sa = 0;
					for (int64_t i = 0; i < N; i++)
						sa += fabs((double)deq[i] * x[t * ldx + h * NR + i]);
					const size_t o = (size_t)(t * ldy + h * CR + r);
					const double e = fabs((double)got[o] - ref[o]);
					bad += !(e <= tol * sa + 1e-30);
					worst = sa > 0 && e / sa > worst ? e / sa : worst;
					bad2 += memcmp(&got[o], &got2[o], 4) != 0;
				}
			}
		for (int t = 0; t < n; t++)
			for (int h = 0; h < H; h++)
				for (int64_t i = 0; i < R; i++) {
					const size_t o = (size_t)(t * ldy + h * CR + C + i);
					bad += !close_to(got[o], ref[o], 0, 4e-6);
					bad2 += !close_to(got[o], got2[o], 2.5e-7, 1e-7);
				}
		OPS_CHECK(bad == 0 && bad2 == 0,
		          "absorb_rope H %d N %" PRId64
		          " n %d pairing %d: %d off the CPU (worst %.2g of sum|wx|), "
		          "%d off the two ops",
		          H, N, n, k->pairing, bad, worst, bad2);
		printf("absorb_rope H %3d %3" PRId64 " -> %3" PRId64 " + rope %2" PRId64
		       ", %d tokens, pairing %d: worst %.2g of sum|wx|, = head_gemv + rope_copy\n",
		       H, N, C, R, n, k->pairing, worst);
		/* shapes it leaves to the two ops: 9 tokens; rows wider than 256 */
		rc = kfuse_absorb_rope(ctx, &w0, mat, H, xb.user, ldx, NR, 9, yb.user, ldy, CR, R, &rp);
		OPS_CHECK(rc == ERR_UNSUPPORTED, "absorb_rope took 9 tokens (rc %d)", rc);
	next:
		kcuda_weight_free(&dw);
		ops_dbuf_fini(&xb);
		ops_dbuf_fini(&yb);
		ops_dbuf_fini(&y2b);
		ops_dbuf_fini(&ib);
		ops_dbuf_fini(&pb);
		free(w);
		free(x);
		free(ref);
		free(got);
		free(got2);
		free(deq);
	}
	/* a head stride too short for the rotary part is refused */
	struct kweight bw = {KT_Q8_0, 192, 512, 204, (void *)64};
	struct kfuse_rope brp = {.inv_freq = (float *)64, .pos = (int32_t *)64, .pairing = 0};
	OPS_CHECK(kfuse_absorb_rope(ctx, &bw, 204 * 512, 8, (float *)64, 8 * 256, 200, 1, (float *)64,
	                            8 * 576, 576, 64, &brp) == -EINVAL,
	          "absorb_rope: x head stride 200 < 192 + 64 accepted");
}

/* ---- short top-k --------------------------------------------------------------------------------- */
static void test_topk_short(void)
{
	/* up to KFUSE_TOPK_SHORT (32768: a decode graph's 32k context bucket); the row stride is the
	 * longest row rounded up as kcuda_indexer_topk does (the keys' shared memory follows it) */
	static const int ns[] = {1, 100, 2047, 2048, 2049, 4096, 5000, 8192, 16385, 32768};
	const int K = 2048, rows = 3;
	for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++) {
		if (quick && (ni % 2) && ni + 1 != sizeof(ns) / sizeof(ns[0]))
			continue;
		const int64_t ld = (ns[ni] + 63) / 64 * 64;
		if (!kcuda_topk_idx_short_fits(ctx, ld)) { /* sm_120: ~24k keys of shared memory */
			printf("topk_short n %d: row does not fit this device's shared memory (radix path)\n",
			       ns[ni]);
			continue;
		}
		for (int mode = 0; mode < 3; mode++) { /* 0 distinct, 1 many ties, 2 ties + NaN / -inf */
			const int n = ns[ni];
			float *s = malloc(sizeof(float) * ld * rows);
			int32_t nk[3], *ref = malloc(sizeof(int32_t) * K * rows),
			               *sel = malloc(sizeof(int32_t) * K * rows);
			int32_t cnt[3], cntg[3];
			for (int r = 0; r < rows; r++)
				nk[r] = r == 0 ? n : (r == 1 ? (n + 1) / 2 : (n > 3 ? n - 3 : n));
			for (int64_t i = 0; i < ld * rows; i++) {
				float v = ops_rng_unif() * 10.0f;
				if (mode >= 1)
					v = floorf(v * 4.0f) /
					    4.0f; /* ~80 distinct values: long runs of ties */
				if (mode == 2 && ops_rng_next() % 17 == 0)
					v = (ops_rng_next() & 1) ? NAN : -INFINITY;
				s[i] = v;
			}
			struct ops_dbuf sb = {0}, nb = {0}, ob = {0}, cb = {0};
			if (up(&sb, s, sizeof(float) * ld * rows) || up(&nb, nk, sizeof(nk)) ||
			    ops_dbuf_init(ctx, &ob, sizeof(int32_t) * K * rows) ||
			    ops_dbuf_init(ctx, &cb, sizeof(int32_t) * rows)) {
				OPS_CHECK(0, "topk_short setup");
				goto next;
			}
			int rc =
			    kcuda_topk_idx_short(ctx, sb.user, ld, rows, nb.user, 0, K, ob.user, K, cb.user);
			OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0, "topk_short rc %d", rc);
			OPS_CHECK(ops_dbuf_get(ctx, &ob, sel) == 0 && ops_dbuf_get(ctx, &cb, cntg) == 0,
			          "topk_short: guard bytes damaged");
			int bad = 0;
			for (int r = 0; r < rows; r++) {
				cnt[r] = kcpu_topk(s + r * ld, nk[r], K, ref + r * K); /* the CPU op */
				bad += cnt[r] != cntg[r];
				for (int j = 0; j < cnt[r] && cnt[r] == cntg[r]; j++)
					bad += sel[r * K + j] != ref[r * K + j];
			}
			OPS_CHECK(bad == 0, "topk_short n=%d mode %d: %d mismatches", n, mode, bad);
		next:
			ops_dbuf_fini(&sb);
			ops_dbuf_fini(&nb);
			ops_dbuf_fini(&ob);
			ops_dbuf_fini(&cb);
			free(s);
			free(ref);
			free(sel);
		}
		printf("topk_short n %5d (and n/2, n-3) k %d, distinct / ties / NaN ok\n", ns[ni], K);
	}
	/* rows longer than the short kernel's limit are refused (the caller takes the radix path) */
	OPS_CHECK(kcuda_topk_idx_short(ctx, (float *)64, KFUSE_TOPK_SHORT + 1, 1, NULL, 0, 8, (int32_t *)64,
	                               8, NULL) == ERR_UNSUPPORTED,
	          "topk_short accepted a row longer than %d", KFUSE_TOPK_SHORT);
	unsigned nbad = 0;
	OPS_CHECK(kcuda_ctx_take_errors(ctx, &nbad) == 0 && nbad == 0, "kernels counted %u bad inputs", nbad);
}

int main(void)
{
	if (kcuda_device_count() < 1) {
		printf("SKIP: no CUDA device\n");
		return 77;
	}
	quick = getenv("TANDEM_OPS_QUICK") != NULL;
	ops_seed_init();
	if (kcuda_ctx_create(0, 16u << 20, &ctx)) {
		printf("FAIL: no CUDA context\n");
		return 1;
	}
	test_add_rmsnorm();
	test_add_rmsnorm_kinds();
	test_mla_latent();
	test_mla_latent_pdl();
	test_idx_prep();
	test_mla_latent_idx();
	test_rope_copy();
	test_absorb_rope();
	test_topk_short();
	kcuda_ctx_destroy(ctx);
	printf("%d checks, %d failed\n", ops_n_check, ops_n_fail);
	return ops_n_fail ? 1 : 0;
}
#endif
