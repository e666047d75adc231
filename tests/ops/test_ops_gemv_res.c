/* The resident-weights decode GEMV (kernels/cuda/matmul_gemv_res.cu, TANDEM_GEMV_RES=1) against the
 * CPU op, on seeded random weights and activations:
 *   - every output against kcpu_dot_row (the CPU op kcpu_matmul uses per row) within fp32
 *     summation-order error, |gpu - cpu| <= 2e-6 * sqrt(n_in) * sum|w x| (test_ops_matmul's
 *     tolerance), finite; and against the dispatch without it (TANDEM_GEMV_RES=0) to the same
 *     tolerance;
 *   - the kernel is really taken (kcuda_gemv_res returns 0, not ERR_UNSUPPORTED) and kcuda_matmul with
 *     TANDEM_GEMV_RES=1 gives the same bits (the dispatch takes it); a second run gives the same bits;
 *   - guard bytes around y and the gaps of strided y (ldy > n_out) untouched, strided x;
 *   - shapes: the GLM-5 TP=8 per-rank products o (2048 -> 6144), idx_q_b (2048 -> 4096), q_b
 *     (2048 -> 2048), the F32 router (6144 -> 256), DeepSeek-V3's o (2048 -> 7168), q_b (1536 ->
 *     3072) and router (7168 -> 256), a q_a-like n_in 6144, odd n_out (1, 5, 33, 1029), n_out below
 *     one block, n_in 256 (one slab: three idle warps), long K (rows per block cut by the shared
 *     memory limit), every rows-per-block value (TANDEM_GEMV_RES_RB=1..16);
 *   - stacked heads (kfwd_head_gemv's v_b: GLM-5 8 x (512 -> 256), DeepSeek-V3 16 x (512 -> 128),
 *     a strided layout with gaps between heads) through kcuda_gemv_res_heads and kfwd_head_gemv;
 *   - n_tok 1 and 2;
 *   - PDL ordering: kcuda_pdl_late_copy writes x ~30 us late right before the launch; the outputs
 *     must be those of the new x (the kernel copies weights before its wait, never x); and the chain
 *     late producer -> v_b -> o with each TANDEM_GEMV_RES_EARLY setting (v_b triggering o before its
 *     own wait) bit-equal to the chain in plain order;
 *   - refusals: ERR_UNSUPPORTED with the switch off, n_tok 3, Q4_K, n_in % 256 (Q8_0), misaligned x,
 *     ldx % 4, rows over the shared-memory limit; -EINVAL for null pointers, ldx < n_in, ldy < n_out,
 *     row_bytes not matching.
 * TANDEM_OPS_QUICK=1: no strided repeats of the big shapes. Exit 77 = no GPU (skip). */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "common/base/err.h"
#include "kernels/cuda/gemv_res.h"
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

struct rcase {
	const char *what;
	int type;
	int64_t n_in, n_out;
	bool big;
};

static const struct rcase cases[] = {
    {"glm o", KT_Q8_0, 2048, 6144, true},
    {"glm idx_q_b", KT_Q8_0, 2048, 4096, true},
    {"glm q_b", KT_Q8_0, 2048, 2048, true},
    {"glm router (F32)", KT_F32, 6144, 256, true},
    {"ds o", KT_Q8_0, 2048, 7168, true},
    {"ds q_b", KT_Q8_0, 1536, 3072, true},
    {"ds router (F32)", KT_F32, 7168, 256, true},
    {"q_a-like n_in 6144", KT_Q8_0, 6144, 2048, true},
    {"odd n_out 1029", KT_Q8_0, 2560, 1029, false},
    {"n_out 33", KT_Q8_0, 512, 33, false},
    {"n_out 5", KT_Q8_0, 768, 5, false},
    {"n_out 1", KT_Q8_0, 1024, 1, false},
    {"n_in 256 (one slab)", KT_Q8_0, 256, 300, false},
    {"F32 n_in 128, n_out 70", KT_F32, 128, 70, false},
    {"F32 n_out 3", KT_F32, 1024, 3, false},
    {"long K 12288", KT_Q8_0, 12288, 200, false},
    {"F32 row of 44 KB", KT_F32, 11264, 9, false},
};

/* rows-per-block sweep (TANDEM_GEMV_RES_RB) on these */
static const struct rcase rb_cases[] = {
    {"rb sweep Q8_0", KT_Q8_0, 2048, 1029, false},
    {"rb sweep F32", KT_F32, 1024, 67, false},
};

static double worst_err, worst_vs_default;

/* y = W x through kcuda_gemv_res; checks as in the header. 0 ran (pass / fail recorded), -1 setup. */
static int run_case(struct kcuda_ctx *c, const struct rcase *rc_, int64_t n_tok, int strided)
{
	const int64_t n_in = rc_->n_in, n_out = rc_->n_out;
	const int64_t ldx = strided ? n_in + 4 : n_in, ldy = strided ? n_out + 3 : n_out;
	size_t rb = 0;
	uint8_t *wh = NULL;
	float *xh = NULL, *yh = NULL, *y2 = NULL, *yd = NULL, *ym = NULL, *row = NULL;
	struct kweight wd = {0};
	struct ops_dbuf xb = {0}, yb = {0}, ys = {0};
	int ret = -1;
	if (!ktype_row_bytes(rc_->type, n_in, &rb))
		goto out;
	const size_t yby = sizeof(float) * (size_t)(ldy * n_tok);
	wh = malloc(rb * (size_t)n_out);
	xh = malloc(sizeof(float) * (size_t)(ldx * n_tok));
	yh = malloc(yby);
	y2 = malloc(yby);
	yd = malloc(yby);
	ym = malloc(yby);
	row = malloc(sizeof(float) * (size_t)n_in);
	if (!wh || !xh || !yh || !y2 || !yd || !ym || !row)
		goto out;
	ops_fill_weight(rc_->type, n_in, n_out, rb, wh);
	for (int64_t i = 0; i < ldx * n_tok; i++)
		xh[i] = ops_rng_unif();
	struct kweight w = {.type = rc_->type, .n_in = n_in, .n_out = n_out, .row_bytes = rb, .data = wh};
	if (kcuda_weight_upload(c, &w, &wd) || ops_dbuf_init(c, &xb, sizeof(float) * (size_t)(ldx * n_tok)) ||
	    kcuda_upload(c, xb.user, xh, xb.bytes) || ops_dbuf_init(c, &yb, yby) ||
	    ops_dbuf_init(c, &ys, yby))
		goto out;

	setenv("TANDEM_GEMV_RES", "1", 1);
	const int rows = kcuda_gemv_res_rows(c, &wd, 1);
	int rc = kcuda_gemv_res(c, &wd, xb.user, ldx, n_tok, yb.user, ldy);
	if (!rc)
		rc = kcuda_sync(c);
	OPS_CHECK(rc == 0, "%s n_tok=%" PRId64 ": rc %d (the kernel must take this shape)", rc_->what, n_tok,
	          rc);
	size_t bad = ops_dbuf_get(c, &yb, yh);
	OPS_CHECK(bad == 0, "%s: %zu guard bytes damaged around y", rc_->what, bad);
	/* again: the same bits; then through kcuda_matmul's dispatch: the same bits */
	int rc2 = kcuda_gemv_res(c, &wd, xb.user, ldx, n_tok, yb.user, ldy);
	rc2 = rc2 ? rc2 : kcuda_sync(c);
	if (!rc2)
		ops_dbuf_get(c, &yb, y2);
	OPS_CHECK(rc2 == 0 && memcmp(y2, yh, yby) == 0, "%s n_tok=%" PRId64 ": second run differs (rc %d)",
	          rc_->what, n_tok, rc2);
	int rc3 = kcuda_matmul_path(c, rc_->type == KT_F32 ? KCUDA_MM_F32 : KCUDA_MM_AUTO, &wd, xb.user, ldx,
	                            n_tok, ys.user, ldy);
	rc3 = rc3 ? rc3 : kcuda_sync(c);
	if (!rc3)
		ops_dbuf_get(c, &ys, ym);
	OPS_CHECK(rc3 == 0 && memcmp(ym, yh, yby) == 0,
	          "%s n_tok=%" PRId64 ": kcuda_matmul with TANDEM_GEMV_RES=1 differs from the kernel (rc %d)",
	          rc_->what, n_tok, rc3);
	/* the default dispatch (another kernel) */
	setenv("TANDEM_GEMV_RES", "0", 1);
	int rc4 = kcuda_matmul_path(c, rc_->type == KT_F32 ? KCUDA_MM_F32 : KCUDA_MM_AUTO, &wd, xb.user, ldx,
	                            n_tok, ys.user, ldy);
	rc4 = rc4 ? rc4 : kcuda_sync(c);
	if (!rc4)
		ops_dbuf_get(c, &ys, yd);
	OPS_CHECK(rc4 == 0, "%s: default dispatch rc %d", rc_->what, rc4);

	double worst = 0, worst_d = 0;
	int64_t n_bad = 0, n_bad_d = 0, n_gap = 0;
	for (int64_t r = 0; r < n_out; r++) {
		kcpu_dequant_row(rc_->type, wh + (size_t)r * rb, row, n_in);
		for (int64_t t = 0; t < n_tok; t++) {
			const float *x = xh + t * ldx;
			const double ref = kcpu_dot_row(rc_->type, wh + (size_t)r * rb, x, n_in);
			double mag = 0;
			for (int64_t k = 0; k < n_in; k++)
				mag += fabs((double)row[k] * x[k]);
			const double tol = 2e-6 * sqrt((double)n_in) * mag + 1e-30;
			const float g = yh[t * ldy + r], d = yd[t * ldy + r];
			const double err = fabs((double)g - ref), err_d = fabs((double)g - (double)d);
			if (!isfinite(g) || !(err <= tol)) {
				if (n_bad++ < 3)
					printf("  %s row %" PRId64 " tok %" PRId64
					       ": gpu %.9g ref %.9g (|d| %.3g, tol %.3g)\n",
					       rc_->what, r, t, g, ref, err, tol);
			}
			if (!rc4 && !(err_d <= tol)) {
				if (n_bad_d++ < 3)
					printf("  %s row %" PRId64 " tok %" PRId64
					       ": res %.9g default %.9g\n",
					       rc_->what, r, t, g, d);
			}
			if (mag > 0 && err / mag > worst)
				worst = err / mag;
			if (mag > 0 && err_d / mag > worst_d)
				worst_d = err_d / mag;
		}
	}
	for (int64_t t = 0; t < n_tok; t++)
		for (int64_t r = n_out; r < ldy; r++)
			n_gap += !ops_is_fill_f32(yh[t * ldy + r]);
	if (worst > worst_err)
		worst_err = worst;
	if (worst_d > worst_vs_default)
		worst_vs_default = worst_d;
	OPS_CHECK(n_bad == 0, "%s n_tok=%" PRId64 ": %" PRId64 " wrong outputs", rc_->what, n_tok, n_bad);
	OPS_CHECK(n_bad_d == 0, "%s n_tok=%" PRId64 ": %" PRId64 " outputs away from the default dispatch",
	          rc_->what, n_tok, n_bad_d);
	OPS_CHECK(n_gap == 0, "%s: %" PRId64 " writes into the ldy gaps", rc_->what, n_gap);
	printf("gemv_res %-24s %4s n_in %6" PRId64 " n_out %5" PRId64 " n_tok %" PRId64
	       " rows/block %2d%s  max |err|/sum|wx| %.2e, vs default %.2e %s\n",
	       rc_->what, ktype_name(rc_->type), n_in, n_out, n_tok, rows, strided ? " strided" : "", worst,
	       worst_d, n_bad || n_bad_d || rc ? "FAIL" : "ok");
	ret = 0;
out:
	if (ret)
		printf("setup failed for %s\n", rc_->what);
	setenv("TANDEM_GEMV_RES", "0", 1);
	kcuda_weight_free(&wd);
	ops_dbuf_fini(&xb);
	ops_dbuf_fini(&yb);
	ops_dbuf_fini(&ys);
	free(wh);
	free(xh);
	free(yh);
	free(y2);
	free(yd);
	free(ym);
	free(row);
	return ret;
}

/* H stacked matrices (v_b): kcuda_gemv_res_heads takes them, kfwd_head_gemv with the switch gives the
 * same bits, the default dispatch and the CPU op agree within tolerance; gaps (yhs > n_out) and guards
 * untouched. strided: xhs = n_in + 4, yhs = n_out + 1, matrices 64 bytes apart more than their size. */
static void check_heads(struct kcuda_ctx *c, int H, int64_t n_in, int64_t n_out, int64_t n_tok, int strided)
{
	size_t rb = 0;
	if (!ktype_row_bytes(KT_Q8_0, n_in, &rb)) {
		OPS_CHECK(0, "heads: row bytes");
		return;
	}
	const size_t mat = rb * (size_t)n_out + (strided ? 64 : 0);
	const int64_t xhs = strided ? n_in + 4 : n_in, yhs = strided ? n_out + 1 : n_out;
	const int64_t ldx = H * xhs, ldy = H * yhs;
	const size_t yby = sizeof(float) * (size_t)(ldy * n_tok);
	uint8_t *wh = calloc(mat * (size_t)H, 1);
	float *xh = malloc(sizeof(float) * (size_t)(ldx * n_tok)), *yh = malloc(yby), *ym = malloc(yby),
	      *yd = malloc(yby), *row = malloc(sizeof(float) * (size_t)n_in);
	struct kweight wd = {0};
	struct ops_dbuf xb = {0}, yb = {0}, ys = {0};
	if (!wh || !xh || !yh || !ym || !yd || !row) {
		OPS_CHECK(0, "heads setup");
		goto out;
	}
	for (int h = 0; h < H; h++)
		ops_fill_weight(KT_Q8_0, n_in, n_out, rb, wh + (size_t)h * mat);
	for (int64_t i = 0; i < ldx * n_tok; i++)
		xh[i] = ops_rng_unif();
	/* one kweight over all heads' bytes (rows of the first matrix, data spanning all of them) */
	struct kweight w = {.type = KT_Q8_0,
	                    .n_in = n_in,
	                    .n_out = (int64_t)(mat * (size_t)H / rb),
	                    .row_bytes = rb,
	                    .data = wh};
	if (mat % rb) { /* the strided gap is not whole rows: upload a row more */
		w.n_out += 1;
	}
	uint8_t *wbig = NULL;
	if ((size_t)w.n_out * rb > mat * (size_t)H) {
		wbig = calloc((size_t)w.n_out * rb, 1);
		if (!wbig) {
			OPS_CHECK(0, "heads setup");
			goto out;
		}
		memcpy(wbig, wh, mat * (size_t)H);
		w.data = wbig;
	}
	int rcu = kcuda_weight_upload(c, &w, &wd);
	free(wbig);
	if (rcu || ops_dbuf_init(c, &xb, sizeof(float) * (size_t)(ldx * n_tok)) ||
	    kcuda_upload(c, xb.user, xh, xb.bytes) || ops_dbuf_init(c, &yb, yby) ||
	    ops_dbuf_init(c, &ys, yby)) {
		OPS_CHECK(0, "heads setup (device)");
		goto out;
	}
	struct kweight w0 = wd;
	w0.n_out = n_out;
	setenv("TANDEM_GEMV_RES", "1", 1);
	int rc = kcuda_gemv_res_heads(c, &w0, mat, H, xb.user, ldx, xhs, (int)n_tok, yb.user, ldy, yhs);
	rc = rc ? rc : kcuda_sync(c);
	OPS_CHECK(rc == 0, "heads H %d n_tok %" PRId64 ": rc %d (the kernel must take this shape)", H, n_tok,
	          rc);
	size_t bad = ops_dbuf_get(c, &yb, yh);
	OPS_CHECK(bad == 0, "heads: %zu guard bytes damaged around y", bad);
	int rc2 = kfwd_head_gemv(c, &w0, mat, H, xb.user, ldx, xhs, n_tok, ys.user, ldy, yhs);
	rc2 = rc2 ? rc2 : kcuda_sync(c);
	if (!rc2)
		ops_dbuf_get(c, &ys, ym);
	OPS_CHECK(rc2 == 0 && memcmp(ym, yh, yby) == 0,
	          "heads H %d n_tok %" PRId64 ": kfwd_head_gemv with TANDEM_GEMV_RES=1 differs (rc %d)", H,
	          n_tok, rc2);
	setenv("TANDEM_GEMV_RES", "0", 1);
	int rc3 = kfwd_head_gemv(c, &w0, mat, H, xb.user, ldx, xhs, n_tok, ys.user, ldy, yhs);
	rc3 = rc3 ? rc3 : kcuda_sync(c);
	if (!rc3)
		ops_dbuf_get(c, &ys, yd);
	OPS_CHECK(rc3 == 0, "heads: default dispatch rc %d", rc3);
	int64_t n_bad = 0, n_bad_d = 0, n_gap = 0;
	double worst = 0;
	for (int h = 0; h < H; h++)
		for (int64_t r = 0; r < n_out; r++) {
			const uint8_t *wr = wh + (size_t)h * mat + (size_t)r * rb;
			kcpu_dequant_row(KT_Q8_0, wr, row, n_in);
			for (int64_t t = 0; t < n_tok; t++) {
				const float *x = xh + t * ldx + h * xhs;
				const double ref = kcpu_dot_row(KT_Q8_0, wr, x, n_in);
				double mag = 0;
				for (int64_t k = 0; k < n_in; k++)
					mag += fabs((double)row[k] * x[k]);
				const double tol = 2e-6 * sqrt((double)n_in) * mag + 1e-30;
				const float g = yh[t * ldy + h * yhs + r], d = yd[t * ldy + h * yhs + r];
				if (!isfinite(g) || !(fabs((double)g - ref) <= tol)) {
					if (n_bad++ < 3)
						printf("  heads h %d row %" PRId64 " tok %" PRId64
						       ": gpu %.9g ref %.9g\n",
						       h, r, t, g, ref);
				}
				if (!rc3 && !(fabs((double)g - (double)d) <= tol))
					n_bad_d++;
				if (mag > 0 && fabs((double)g - ref) / mag > worst)
					worst = fabs((double)g - ref) / mag;
			}
		}
	for (int64_t t = 0; t < n_tok; t++)
		for (int h = 0; h < H; h++)
			for (int64_t r = n_out; r < yhs; r++)
				n_gap += !ops_is_fill_f32(yh[t * ldy + h * yhs + r]);
	OPS_CHECK(n_bad == 0, "heads H %d n_tok %" PRId64 ": %" PRId64 " wrong outputs", H, n_tok, n_bad);
	OPS_CHECK(n_bad_d == 0, "heads H %d n_tok %" PRId64 ": %" PRId64 " outputs away from the default", H,
	          n_tok, n_bad_d);
	OPS_CHECK(n_gap == 0, "heads: %" PRId64 " writes into the gaps between heads", n_gap);
	if (worst > worst_err)
		worst_err = worst;
	printf("gemv_res heads %2d x (%" PRId64 " -> %" PRId64 ") n_tok %" PRId64
	       "%s rows/block %2d: max |err|/sum|wx| %.2e %s\n",
	       H, n_in, n_out, n_tok, strided ? " strided" : "", kcuda_gemv_res_rows(c, &w0, H), worst,
	       n_bad || n_bad_d || n_gap || rc ? "FAIL" : "ok");
out:
	setenv("TANDEM_GEMV_RES", "0", 1);
	kcuda_weight_free(&wd);
	ops_dbuf_fini(&xb);
	ops_dbuf_fini(&yb);
	ops_dbuf_fini(&ys);
	free(wh);
	free(xh);
	free(yh);
	free(ym);
	free(yd);
	free(row);
}

/* PDL ordering: x holds old values; a late producer (kcuda_pdl_late_copy, ~30 us of spin, then the
 * copy) writes the new x right before the launch. Reference: the same kernel on the new x after a
 * sync (bit-equal expected), and the CPU op on the new x. */
static void check_pdl_producer(struct kcuda_ctx *c, int type, int64_t n_in, int64_t n_out, int64_t n_tok)
{
	size_t rb = 0;
	uint8_t *wh = NULL;
	float *xo = NULL, *xn = NULL, *yh = NULL, *yr = NULL, *row = NULL;
	float *xd = NULL, *xnd = NULL, *yd = NULL;
	struct kweight wd = {0};
	const size_t xby = sizeof(float) * (size_t)(n_in * n_tok),
	             yby = sizeof(float) * (size_t)(n_out * n_tok);
	int ok = ktype_row_bytes(type, n_in, &rb);
	wh = ok ? malloc(rb * (size_t)n_out) : NULL;
	xo = malloc(xby);
	xn = malloc(xby);
	yh = malloc(yby);
	yr = malloc(yby);
	row = malloc(sizeof(float) * (size_t)n_in);
	ok = ok && wh && xo && xn && yh && yr && row;
	if (ok) {
		ops_fill_weight(type, n_in, n_out, rb, wh);
		for (int64_t i = 0; i < n_in * n_tok; i++) {
			xo[i] = ops_rng_unif();
			xn[i] = ops_rng_unif();
		}
		struct kweight w = {.type = type, .n_in = n_in, .n_out = n_out, .row_bytes = rb, .data = wh};
		ok = !kcuda_weight_upload(c, &w, &wd) && !kcuda_alloc(xby, (void **)&xd) &&
		     !kcuda_alloc(xby, (void **)&xnd) && !kcuda_alloc(yby, (void **)&yd) &&
		     !kcuda_upload(c, xnd, xn, xby);
	}
	if (!ok) {
		OPS_CHECK(0, "pdl producer setup");
		goto out;
	}
	setenv("TANDEM_GEMV_RES", "1", 1);
	/* reference: the kernel on the new x, in plain order */
	int rc = kcuda_upload(c, xd, xn, xby);
	rc = rc ? rc : kcuda_gemv_res(c, &wd, xd, n_in, n_tok, yd, n_out);
	rc = rc ? rc : kcuda_sync(c);
	rc = rc ? rc : kcuda_download(c, yr, yd, yby);
	OPS_CHECK(rc == 0, "pdl producer reference rc %d", rc);
	int64_t bad = 0, bad_cpu = 0;
	for (int64_t r = 0; r < n_out && !rc; r++) {
		kcpu_dequant_row(type, wh + (size_t)r * rb, row, n_in);
		for (int64_t t = 0; t < n_tok; t++) {
			double mag = 0;
			for (int64_t k = 0; k < n_in; k++)
				mag += fabs((double)row[k] * xn[t * n_in + k]);
			const double ref = kcpu_dot_row(type, wh + (size_t)r * rb, xn + t * n_in, n_in);
			if (!(fabs((double)yr[t * n_out + r] - ref) <=
			      2e-6 * sqrt((double)n_in) * mag + 1e-30))
				bad_cpu++;
		}
	}
	OPS_CHECK(bad_cpu == 0, "pdl producer reference: %" PRId64 " outputs away from the CPU op", bad_cpu);
	for (int rep = 0; rep < 3 && !rc; rep++) {
		rc = kcuda_upload(c, xd, xo, xby); /* old x back in place */
		rc = rc ? rc : kcuda_memset(c, yd, 0, yby);
		rc = rc ? rc : kcuda_sync(c);
		void *dst[1] = {xd};
		const void *src[1] = {xnd};
		const size_t nb[1] = {xby};
		rc = rc ? rc : kcuda_pdl_late_copy(c, 1, dst, src, nb, 30.0);
		rc = rc ? rc : kcuda_gemv_res(c, &wd, xd, n_in, n_tok, yd, n_out);
		rc = rc ? rc : kcuda_sync(c);
		rc = rc ? rc : kcuda_download(c, yh, yd, yby);
		OPS_CHECK(rc == 0, "pdl producer rep %d: rc %d", rep, rc);
		if (!rc && memcmp(yh, yr, yby) != 0)
			bad++;
	}
	OPS_CHECK(bad == 0,
	          "pdl producer %s %" PRId64 " -> %" PRId64 " n_tok %" PRId64 ": %" PRId64
	          " of 3 runs read x before its producer finished",
	          ktype_name(type), n_in, n_out, n_tok, bad);
	printf("gemv_res after a late PDL producer, %s %" PRId64 " -> %" PRId64 " n_tok %" PRId64
	       ", 3 runs: %s\n",
	       ktype_name(type), n_in, n_out, n_tok, bad || bad_cpu || rc ? "FAIL" : "ok");
out:
	setenv("TANDEM_GEMV_RES", "0", 1);
	kcuda_weight_free(&wd);
	kcuda_free(xd);
	kcuda_free(xnd);
	kcuda_free(yd);
	free(wh);
	free(xo);
	free(xn);
	free(yh);
	free(yr);
	free(row);
}

/* The chain of a decode layer with the early trigger (TANDEM_GEMV_RES_EARLY): a late producer writes
 * v_b's input, v_b (8 stacked heads 512 -> 256, triggering the next kernel before its wait) writes o's
 * input, o (2048 -> 6144) reads it. o's blocks start while the producer still runs; its result must be
 * the one of the whole chain run in plain order (bit-equal) and within tolerance of the CPU. */
static void check_chain(struct kcuda_ctx *c, const char *early)
{
	const int H = 8;
	const int64_t C = 512, V = 256, D = 6144;
	size_t rbv = 0, rbo = 0;
	ktype_row_bytes(KT_Q8_0, C, &rbv);
	ktype_row_bytes(KT_Q8_0, H * V, &rbo);
	const size_t matv = rbv * (size_t)V;
	uint8_t *wvh = malloc(matv * H), *woh = malloc(rbo * (size_t)D);
	float *xo = malloc(sizeof(float) * (size_t)(H * C)), *xn = malloc(sizeof(float) * (size_t)(H * C));
	float *yr = malloc(sizeof(float) * (size_t)D), *yh = malloc(sizeof(float) * (size_t)D);
	float *mid = malloc(sizeof(float) * (size_t)(H * V)), *row = malloc(sizeof(float) * (size_t)(H * V));
	struct kweight wv = {0}, wo = {0};
	float *xd = NULL, *xnd = NULL, *md = NULL, *yd = NULL;
	int ok = wvh && woh && xo && xn && yr && yh && mid && row;
	if (ok) {
		ops_fill_weight(KT_Q8_0, C, H * V, rbv, wvh);
		ops_fill_weight(KT_Q8_0, H * V, D, rbo, woh);
		for (int64_t i = 0; i < H * C; i++) {
			xo[i] = ops_rng_unif();
			xn[i] = ops_rng_unif();
		}
		struct kweight a = {
		    .type = KT_Q8_0, .n_in = C, .n_out = H * V, .row_bytes = rbv, .data = wvh};
		struct kweight b = {
		    .type = KT_Q8_0, .n_in = H * V, .n_out = D, .row_bytes = rbo, .data = woh};
		ok = !kcuda_weight_upload(c, &a, &wv) && !kcuda_weight_upload(c, &b, &wo) &&
		     !kcuda_alloc(sizeof(float) * (size_t)(H * C), (void **)&xd) &&
		     !kcuda_alloc(sizeof(float) * (size_t)(H * C), (void **)&xnd) &&
		     !kcuda_alloc(sizeof(float) * (size_t)(H * V), (void **)&md) &&
		     !kcuda_alloc(sizeof(float) * (size_t)D, (void **)&yd) &&
		     !kcuda_upload(c, xnd, xn, sizeof(float) * (size_t)(H * C));
	}
	if (!ok) {
		OPS_CHECK(0, "chain setup");
		goto out;
	}
	struct kweight wv0 = wv;
	wv0.n_out = V;
	setenv("TANDEM_GEMV_RES", "1", 1);
	setenv("TANDEM_GEMV_RES_EARLY", early, 1);
	/* reference: plain order (a sync between the steps) */
	int rc = kcuda_upload(c, xd, xn, sizeof(float) * (size_t)(H * C));
	rc = rc ? rc : kcuda_gemv_res_heads(c, &wv0, matv, H, xd, H * C, C, 1, md, H * V, V);
	rc = rc ? rc : kcuda_sync(c);
	rc = rc ? rc : kcuda_gemv_res(c, &wo, md, H * V, 1, yd, D);
	rc = rc ? rc : kcuda_sync(c);
	rc = rc ? rc : kcuda_download(c, yr, yd, sizeof(float) * (size_t)D);
	OPS_CHECK(rc == 0, "chain reference rc %d", rc);
	/* the CPU: v_b per head, then o, each within tolerance of the GPU steps (mid from the GPU) */
	int64_t bad_cpu = 0;
	if (!rc)
		rc = kcuda_download(c, mid, md, sizeof(float) * (size_t)(H * V));
	for (int64_t r = 0; r < D && !rc; r++) {
		const uint8_t *wr = woh + (size_t)r * rbo;
		kcpu_dequant_row(KT_Q8_0, wr, row, H * V);
		double mag = 0;
		for (int64_t k = 0; k < H * V; k++)
			mag += fabs((double)row[k] * mid[k]);
		const double ref = kcpu_dot_row(KT_Q8_0, wr, mid, H * V);
		bad_cpu += !(fabs((double)yr[r] - ref) <= 2e-6 * sqrt((double)(H * V)) * mag + 1e-30);
	}
	OPS_CHECK(bad_cpu == 0, "chain: %" PRId64 " o outputs away from the CPU op", bad_cpu);
	int64_t bad = 0;
	for (int rep = 0; rep < 3 && !rc; rep++) {
		rc = kcuda_upload(c, xd, xo, sizeof(float) * (size_t)(H * C));
		rc = rc ? rc : kcuda_memset(c, md, 0, sizeof(float) * (size_t)(H * V));
		rc = rc ? rc : kcuda_memset(c, yd, 0, sizeof(float) * (size_t)D);
		rc = rc ? rc : kcuda_sync(c);
		void *dst[1] = {xd};
		const void *src[1] = {xnd};
		const size_t nb[1] = {sizeof(float) * (size_t)(H * C)};
		rc = rc ? rc : kcuda_pdl_late_copy(c, 1, dst, src, nb, 30.0);
		rc = rc ? rc : kcuda_gemv_res_heads(c, &wv0, matv, H, xd, H * C, C, 1, md, H * V, V);
		rc = rc ? rc : kcuda_gemv_res(c, &wo, md, H * V, 1, yd, D);
		rc = rc ? rc : kcuda_sync(c);
		rc = rc ? rc : kcuda_download(c, yh, yd, sizeof(float) * (size_t)D);
		OPS_CHECK(rc == 0, "chain rep %d: rc %d", rep, rc);
		if (!rc && memcmp(yh, yr, sizeof(float) * (size_t)D) != 0)
			bad++;
	}
	OPS_CHECK(bad == 0, "chain (TANDEM_GEMV_RES_EARLY=%s): %" PRId64 " of 3 runs differ from plain order",
	          early, bad);
	printf("gemv_res chain late producer -> v_b (8 heads) -> o, TANDEM_GEMV_RES_EARLY=%s, 3 runs: %s\n",
	       early, bad || bad_cpu || rc ? "FAIL" : "ok");
out:
	setenv("TANDEM_GEMV_RES", "0", 1);
	unsetenv("TANDEM_GEMV_RES_EARLY");
	kcuda_weight_free(&wv);
	kcuda_weight_free(&wo);
	kcuda_free(xd);
	kcuda_free(xnd);
	kcuda_free(md);
	kcuda_free(yd);
	free(wvh);
	free(woh);
	free(xo);
	free(xn);
	free(yr);
	free(yh);
	free(mid);
	free(row);
}

static void check_refusals(struct kcuda_ctx *c)
{
	static uint8_t wq[272 * 4], wq2[272 * 8], wk[144 * 2], w3[34 * 12 * 2], wf[4 * 16384];
	struct kweight q = {.type = KT_Q8_0, .n_in = 1024, .n_out = 1, .row_bytes = 1088, .data = wq};
	struct kweight q2 = {.type = KT_Q8_0, .n_in = 1024, .n_out = 2, .row_bytes = 1088, .data = wq2};
	struct kweight k4 = {.type = KT_Q4_K, .n_in = 256, .n_out = 2, .row_bytes = 144, .data = wk};
	struct kweight q384 = {.type = KT_Q8_0, .n_in = 384, .n_out = 2, .row_bytes = 408, .data = w3};
	struct kweight fbig = {.type = KT_F32, .n_in = 16384, .n_out = 1, .row_bytes = 65536, .data = wf};
	struct kweight qd = {0}, q2d = {0}, k4d = {0}, q384d = {0}, fbd = {0};
	float *x = NULL, *y = NULL;
	if (kcuda_weight_upload(c, &q, &qd) || kcuda_weight_upload(c, &q2, &q2d) ||
	    kcuda_weight_upload(c, &k4, &k4d) || kcuda_weight_upload(c, &q384, &q384d) ||
	    kcuda_weight_upload(c, &fbig, &fbd) || kcuda_alloc(3 * 16384 * sizeof(float) + 64, (void **)&x) ||
	    kcuda_alloc(64 * sizeof(float), (void **)&y)) {
		OPS_CHECK(0, "refusals setup");
		goto out;
	}
	setenv("TANDEM_GEMV_RES", "0", 1);
	OPS_CHECK(kcuda_gemv_res(c, &qd, x, 1024, 1, y, 1) == ERR_UNSUPPORTED, "switch off not honoured");
	unsetenv("TANDEM_GEMV_RES"); /* auto: single products up to TANDEM_GEMV_RES_AUTO_MB */
	OPS_CHECK(kcuda_gemv_res(c, &qd, x, 1024, 1, y, 1) == 0, "auto mode refused a small product");
	setenv("TANDEM_GEMV_RES_AUTO_MB", "0.000001", 1);
	OPS_CHECK(kcuda_gemv_res(c, &qd, x, 1024, 1, y, 1) == ERR_UNSUPPORTED,
	          "auto mode took a product over TANDEM_GEMV_RES_AUTO_MB");
	unsetenv("TANDEM_GEMV_RES_AUTO_MB");
	OPS_CHECK(kcuda_gemv_res_rows(c, &qd, 1) > 0, "rows per block of a Q8_0 product: %d",
	          kcuda_gemv_res_rows(c, &qd, 1));
	setenv("TANDEM_GEMV_RES", "1", 1);
	OPS_CHECK(kcuda_gemv_res_enabled(), "TANDEM_GEMV_RES=1 not seen");
	OPS_CHECK(kcuda_gemv_res(c, &qd, x, 1024, 1, y, 1) == 0, "a plain Q8_0 product refused");
	OPS_CHECK(kcuda_gemv_res(c, &qd, x, 1024, 3, y, 1) == ERR_UNSUPPORTED, "n_tok 3 not refused");
	OPS_CHECK(kcuda_gemv_res(c, &qd, x, 1024, 0, y, 1) == ERR_UNSUPPORTED, "n_tok 0 not refused");
	OPS_CHECK(kcuda_gemv_res(c, &k4d, x, 256, 1, y, 2) == ERR_UNSUPPORTED, "Q4_K not refused");
	OPS_CHECK(kcuda_gemv_res(c, &q384d, x, 384, 1, y, 2) == ERR_UNSUPPORTED, "Q8_0 n_in 384 not refused");
	OPS_CHECK(kcuda_gemv_res(c, &fbd, x, 16384, 1, y, 1) == ERR_UNSUPPORTED, "a 64 KB row not refused");
	struct kweight f48 = fbd;
	f48.n_in = 12288;
	f48.row_bytes = 49152;
	OPS_CHECK(kcuda_gemv_res_rows(c, &f48, 1) == 0,
	          "a 48 KB row (over the limit with the static part) taken");
	OPS_CHECK(kcuda_gemv_res_rows(c, &fbd, 1) == 0, "a 64 KB row gets rows per block");
	OPS_CHECK(kcuda_gemv_res(c, &qd, x + 1, 1024, 1, y, 1) == ERR_UNSUPPORTED,
	          "misaligned x not refused");
	OPS_CHECK(kcuda_gemv_res(c, &qd, x, 1026, 2, y, 1) == ERR_UNSUPPORTED, "ldx %% 4 != 0 not refused");
	OPS_CHECK(kcuda_gemv_res(c, &qd, x, 1023, 1, y, 1) == -EINVAL, "ldx < n_in accepted");
	OPS_CHECK(kcuda_gemv_res(c, &qd, x, 1024, 1, y, 0) == -EINVAL, "ldy < n_out accepted");
	OPS_CHECK(kcuda_gemv_res(c, &qd, NULL, 1024, 1, y, 1) == -EINVAL, "null x accepted");
	OPS_CHECK(kcuda_gemv_res(c, &qd, x, 1024, 1, NULL, 1) == -EINVAL, "null y accepted");
	OPS_CHECK(kcuda_gemv_res(c, NULL, x, 1024, 1, y, 1) == -EINVAL, "null weight accepted");
	struct kweight badrb = qd;
	badrb.row_bytes = 1090;
	OPS_CHECK(kcuda_gemv_res(c, &badrb, x, 1024, 1, y, 1) == -EINVAL, "wrong row_bytes accepted");
	/* TANDEM_GEMV_RES_ONLY: named products and exact shapes */
	setenv("TANDEM_GEMV_RES_ONLY", "o,idx_q_b", 1);
	OPS_CHECK(kcuda_gemv_res(c, &qd, x, 1024, 1, y, 1) == ERR_UNSUPPORTED, "_ONLY=o,idx_q_b took 1024x1");
	setenv("TANDEM_GEMV_RES_ONLY", "o,1024x1", 1);
	OPS_CHECK(kcuda_gemv_res(c, &qd, x, 1024, 1, y, 1) == 0, "_ONLY=o,1024x1 refused 1024x1");
	setenv("TANDEM_GEMV_RES_ONLY", "1024x10", 1);
	OPS_CHECK(kcuda_gemv_res(c, &qd, x, 1024, 1, y, 1) == ERR_UNSUPPORTED, "_ONLY=1024x10 took 1024x1");
	setenv("TANDEM_GEMV_RES_ONLY", "v_b", 1);
	OPS_CHECK(kcuda_gemv_res(c, &qd, x, 1024, 1, y, 1) == ERR_UNSUPPORTED, "_ONLY=v_b took a product");
	struct kweight h0 = q2d; /* two stacked 1-row matrices */
	h0.n_out = 1;
	OPS_CHECK(kcuda_gemv_res_heads(c, &h0, 1088, 2, x, 2048, 1024, 1, y, 2, 1) == 0,
	          "_ONLY=v_b refused heads");
	setenv("TANDEM_GEMV_RES_ONLY", "router", 1);
	OPS_CHECK(kcuda_gemv_res_heads(c, &h0, 1088, 2, x, 2048, 1024, 1, y, 2, 1) == ERR_UNSUPPORTED,
	          "_ONLY=router took heads");
	unsetenv("TANDEM_GEMV_RES_ONLY");
	/* the rows-per-block choice: forced values within the shared-memory limit, halved above it */
	setenv("TANDEM_GEMV_RES_RB", "8", 1);
	OPS_CHECK(kcuda_gemv_res_rows(c, &qd, 1) == 8, "TANDEM_GEMV_RES_RB=8 gives %d",
	          kcuda_gemv_res_rows(c, &qd, 1));
	struct kweight f12 = fbd;
	f12.n_in = 11264;
	f12.row_bytes = 45056;
	OPS_CHECK(kcuda_gemv_res_rows(c, &f12, 1) == 1, "a 44 KB row with RB=8 gives %d rows",
	          kcuda_gemv_res_rows(c, &f12, 1));
	unsetenv("TANDEM_GEMV_RES_RB");
	OPS_CHECK(kcuda_sync(c) == 0, "refusals: sync");
out:
	setenv("TANDEM_GEMV_RES", "0", 1);
	kcuda_weight_free(&qd);
	kcuda_weight_free(&q2d);
	kcuda_weight_free(&k4d);
	kcuda_weight_free(&q384d);
	kcuda_weight_free(&fbd);
	kcuda_free(x);
	kcuda_free(y);
}

int main(void)
{
	if (kcuda_device_count() < 1) {
		printf("SKIP: no CUDA device\n");
		return 77;
	}
	ops_seed_init();
	const int quick = getenv("TANDEM_OPS_QUICK") != NULL;
	struct kcuda_ctx *c = NULL;
	if (kcuda_ctx_create(0, 64u << 20, &c)) {
		printf("FAIL: no CUDA context\n");
		return 1;
	}
	unsetenv("TANDEM_GEMV_RES_RB");
	unsetenv("TANDEM_GEMV_RES_BPS");
	unsetenv("TANDEM_GEMV_RES_HRB");
	unsetenv("TANDEM_GEMV_RES_HBPS");
	unsetenv("TANDEM_GEMV_RES_EARLY");
	unsetenv("TANDEM_GEMV_RES_ONLY");
	check_refusals(c);
	check_pdl_producer(c, KT_Q8_0, 2048, 6144, 1);
	check_pdl_producer(c, KT_Q8_0, 2048, 4096, 2);
	check_pdl_producer(c, KT_F32, 6144, 256, 1);
	check_chain(c, ""); /* default: v_b triggers early */
	check_chain(c, "1"); /* every launch triggers early */
	check_chain(c, "0");
	int setup_fail = 0;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		for (int64_t nt = 1; nt <= 2; nt++)
			for (int s = 0; s < 2; s++) {
				if (s && quick && cases[i].big)
					continue;
				setup_fail |= run_case(c, &cases[i], nt, s);
			}
	for (int64_t nt = 1; nt <= 2; nt++) {
		check_heads(c, 8, 512, 256, nt, 0); /* GLM-5 v_b per rank */
		check_heads(c, 16, 512, 128, nt, 1); /* DeepSeek-V3 v_b per rank, strided */
		check_heads(c, 3, 1024, 37, nt, 1);
		static const char *const hrb[] = {"1", "4"}; /* other rows per block than the default */
		for (int i = 0; i < 2; i++) {
			setenv("TANDEM_GEMV_RES_HRB", hrb[i], 1);
			check_heads(c, 8, 512, 256, nt, i);
			unsetenv("TANDEM_GEMV_RES_HRB");
		}
	}
	static const char *const rbs[] = {"1", "2", "4", "8", "16"};
	for (size_t r = 0; r < sizeof(rbs) / sizeof(rbs[0]); r++) {
		setenv("TANDEM_GEMV_RES_RB", rbs[r], 1);
		for (size_t i = 0; i < sizeof(rb_cases) / sizeof(rb_cases[0]); i++)
			for (int64_t nt = 1; nt <= 2; nt++)
				setup_fail |= run_case(c, &rb_cases[i], nt, (int)((r + (size_t)nt) & 1));
	}
	unsetenv("TANDEM_GEMV_RES_RB");
	OPS_CHECK(setup_fail == 0, "some cases failed to set up");
	printf("largest |err| / sum|wx|: %.2e; largest |res - default| / sum|wx|: %.2e\n", worst_err,
	       worst_vs_default);
	kcuda_ctx_destroy(c);
	printf("%s: %d checks, %d failed\n", ops_n_fail ? "FAIL" : "PASS", ops_n_check, ops_n_fail);
	return ops_n_fail ? 1 : 0;
}
#endif
