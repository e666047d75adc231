/* CUDA row ops against their CPU ops on seeded random inputs: kcuda_rmsnorm vs kcpu_rmsnorm,
 * kcuda_swiglu vs kcpu_swiglu, kcuda_rope vs kcpu_rope_cs + kcpu_rope (both pairings, plain and
 * YaRN frequencies from kcpu_rope_freqs, large positions, strided heads) and kcuda_embed vs
 * kcpu_dequant_row (every weight type, out-of-range ids). Checks: tolerance per element, finite
 * outputs, guard bytes around outputs and in stride gaps, bad arguments refused.
 * Exit 77 = no GPU (skip). */
#include <errno.h>

#include "common/base/err.h"
#include "tests/ops/ops_util.h"

#ifndef TANDEM_CUDA
int main(void)
{
	printf("SKIP: built without CUDA (make CUDA=1)\n");
	return 77;
}
#else

static struct kcuda_ctx *ctx;

/* uploads n floats into a guarded device buffer */
static int up_f32(struct ops_dbuf *b, const float *h, size_t n)
{
	if (ops_dbuf_init(ctx, b, n * sizeof(float)))
		return -1;
	return kcuda_upload(ctx, b->user, h, n * sizeof(float));
}

static void test_rmsnorm(void)
{
	static const int64_t ns[] = {1, 31, 32, 33, 512, 2048, 4097, 6144, 7168};
	for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++) {
		const int64_t n = ns[ni], rows = 1 + (int64_t)(ni % 5), ldx = n + 3, ldy = n + 1;
		const float eps = (ni & 1) ? 1e-5f : 1e-6f;
		float *x = malloc(sizeof(float) * ldx * rows), *w = malloc(sizeof(float) * n);
		float *y = malloc(sizeof(float) * ldy * rows);
		for (int64_t i = 0; i < ldx * rows; i++)
			x[i] = ops_rng_unif() * ((ni % 3) == 0 ? 100.0f : 1.0f);
		for (int64_t i = 0; i < n; i++)
			w[i] = 1.0f + 0.5f * ops_rng_unif();
		struct ops_dbuf xb = {0}, wb = {0}, yb = {0};
		if (up_f32(&xb, x, ldx * rows) || up_f32(&wb, w, n) ||
		    ops_dbuf_init(ctx, &yb, sizeof(float) * ldy * rows)) {
			OPS_CHECK(0, "rmsnorm setup");
			goto next;
		}
		int rc = kcuda_rmsnorm(ctx, yb.user, ldy, xb.user, ldx, wb.user, n, rows, eps);
		OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0, "rmsnorm n=%" PRId64 " rc %d", n, rc);
		OPS_CHECK(ops_dbuf_get(ctx, &yb, y) == 0, "rmsnorm n=%" PRId64 ": guard bytes damaged", n);
		int bad = 0;
		float *ref = malloc(sizeof(float) * ldy * rows);
		kcpu_rmsnorm(ref, ldy, x, ldx, w, n, rows, eps); /* the CPU op */
		for (int64_t r = 0; r < rows; r++) {
			for (int64_t i = 0; i < n; i++) {
				const float rv = ref[r * ldy + i], g = y[r * ldy + i];
				if (!isfinite(g) || fabs(g - rv) > 4e-6 * fabs(rv) + 1e-7 * fabs(w[i]) * 3.0)
					bad++;
			}
			for (int64_t i = n; i < ldy && r < rows; i++)
				bad += !ops_is_fill_f32(y[r * ldy + i]);
		}
		free(ref);
		OPS_CHECK(bad == 0, "rmsnorm n=%" PRId64 " rows=%" PRId64 ": %d bad elements", n, rows, bad);
		/* in place (y == x) */
		rc = kcuda_rmsnorm(ctx, xb.user, ldx, xb.user, ldx, wb.user, n, rows, eps);
		float *x2 = malloc(sizeof(float) * ldx * rows);
		OPS_CHECK(rc == 0 && kcuda_download(ctx, x2, xb.user, sizeof(float) * ldx * rows) == 0,
		          "rmsnorm in place");
		bad = 0;
		for (int64_t r = 0; r < rows; r++)
			for (int64_t i = 0; i < n; i++)
				bad += memcmp(&x2[r * ldx + i], &y[r * ldy + i], 4) != 0;
		OPS_CHECK(bad == 0, "rmsnorm in place differs from out of place in %d elements", bad);
		free(x2);
		printf("rmsnorm n %5" PRId64 " rows %" PRId64 " ok\n", n, rows);
	next:
		ops_dbuf_fini(&xb);
		ops_dbuf_fini(&wb);
		ops_dbuf_fini(&yb);
		free(x);
		free(w);
		free(y);
	}
	OPS_CHECK(kcuda_rmsnorm(ctx, (float *)16, 4, (float *)16, 3, (float *)16, 4, 1, 1e-5f) == -EINVAL,
	          "ldx < n accepted");
	OPS_CHECK(kcuda_rmsnorm(ctx, (float *)16, 4, (float *)16, 4, (float *)16, 0, 1, 1e-5f) == -EINVAL,
	          "n = 0 accepted");
}

static void test_swiglu(void)
{
	static const int64_t ns[] = {1, 31, 33, 256, 2048, 4097, 12288};
	for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++) {
		const int64_t n = ns[ni], rows = 1 + (int64_t)(ni % 4), ld = n + 2;
		float *g = malloc(sizeof(float) * ld * rows), *u = malloc(sizeof(float) * ld * rows);
		float *y = malloc(sizeof(float) * ld * rows);
		for (int64_t i = 0; i < ld * rows; i++) {
			g[i] = 12.0f * ops_rng_unif();
			u[i] = 3.0f * ops_rng_unif();
		}
		g[0] = -100.0f, g[ld * rows - 1] = 100.0f;
		struct ops_dbuf gb = {0}, ub = {0}, yb = {0};
		if (up_f32(&gb, g, ld * rows) || up_f32(&ub, u, ld * rows) ||
		    ops_dbuf_init(ctx, &yb, sizeof(float) * ld * rows)) {
			OPS_CHECK(0, "swiglu setup");
			goto next;
		}
		int rc = kcuda_swiglu(ctx, yb.user, ld, gb.user, ld, ub.user, ld, n, rows);
		OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0, "swiglu rc %d", rc);
		OPS_CHECK(ops_dbuf_get(ctx, &yb, y) == 0, "swiglu guard bytes damaged");
		int bad = 0;
		float *ref = malloc(sizeof(float) * n);
		for (int64_t r = 0; r < rows; r++) {
			kcpu_swiglu(ref, g + r * ld, u + r * ld, n); /* the CPU op */
			for (int64_t i = 0; i < n; i++) {
				const float v = y[r * ld + i];
				if (!isfinite(v) || fabs(v - ref[i]) > 4e-6 * fabs(ref[i]) + 1e-30)
					bad++;
			}
			for (int64_t i = n; i < ld; i++)
				bad += !ops_is_fill_f32(y[r * ld + i]);
		}
		free(ref);
		OPS_CHECK(bad == 0, "swiglu n=%" PRId64 ": %d bad elements", n, bad);
		printf("swiglu n %5" PRId64 " rows %" PRId64 " ok\n", n, rows);
	next:
		ops_dbuf_fini(&gb);
		ops_dbuf_fini(&ub);
		ops_dbuf_fini(&yb);
		free(g);
		free(u);
		free(y);
	}
}

static void test_rope(void)
{
	struct rcase {
		int R, heads, stride, pairing, yarn;
		double theta;
	} cases[] = {
	    {64, 1, 64, 0, 0, 1e6},   {64, 8, 256, 0, 0, 1e6},  {64, 8, 192, 0, 1, 1e4},
	    {64, 4, 192, 1, 1, 1e4},  {64, 32, 128, 0, 0, 1e6}, {64, 64, 128, 1, 0, 1e4},
	    {2, 3, 5, 1, 0, 10000.0}, {128, 2, 130, 0, 0, 8e6},
	};
	for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
		const struct rcase *rc_ = &cases[ci];
		const int64_t n_tok = 1 + (int64_t)(ci % 3) * 7, ldx = (int64_t)rc_->heads * rc_->stride + 1;
		float f[64], cs[128], u[128];
		kcpu_rope_freqs(f, rc_->R, (float)rc_->theta, rc_->yarn ? 40.0f : 1.0f, 4096, 32.0f, 1.0f);
		const float mscale = rc_->yarn ? 1.0f : 1.0f;
		float *x = malloc(sizeof(float) * ldx * n_tok), *y = malloc(sizeof(float) * ldx * n_tok);
		int32_t pos[32];
		for (int64_t t = 0; t < n_tok; t++)
			pos[t] = t == 0 ? 0 : (t == 1 ? 163839 : (int32_t)(ops_rng_next() % 200000));
		for (int64_t i = 0; i < ldx * n_tok; i++)
			x[i] = ops_rng_unif();
		struct ops_dbuf xb = {0}, fb = {0}, pb = {0};
		if (up_f32(&xb, x, ldx * n_tok) || up_f32(&fb, f, rc_->R / 2) ||
		    ops_dbuf_init(ctx, &pb, sizeof(int32_t) * n_tok) ||
		    kcuda_upload(ctx, pb.user, pos, sizeof(int32_t) * n_tok)) {
			OPS_CHECK(0, "rope setup");
			goto next;
		}
		int rc = kcuda_rope(ctx, xb.user, ldx, n_tok, rc_->heads, rc_->stride, rc_->R, fb.user,
		                    pb.user, rc_->pairing, mscale);
		OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0, "rope rc %d", rc);
		OPS_CHECK(ops_dbuf_get(ctx, &xb, y) == 0, "rope: guard bytes damaged");
		int bad = 0;
		const int half = rc_->R / 2;
		for (int64_t t = 0; t < n_tok; t++) {
			for (int h = 0; h < rc_->heads; h++) {
				const float *x0 = x + t * ldx + (int64_t)h * rc_->stride;
				const float *v = y + t * ldx + (int64_t)h * rc_->stride;
				memcpy(u, x0, sizeof(float) * rc_->R);
				kcpu_rope_cs(f, half, pos[t], cs); /* the CPU op */
				kcpu_rope(u, rc_->R, cs, rc_->pairing);
				for (int i = 0; i < rc_->R; i++)
					bad += !(fabs(v[i] - u[i]) <= 4e-6);
				for (int i = rc_->R; i < rc_->stride;
				     i++) /* the rest of the head is untouched */
					bad += memcmp(&x0[i], &v[i], 4) != 0;
			}
			bad += memcmp(&x[t * ldx + ldx - 1], &y[t * ldx + ldx - 1], 4) != 0;
		}
		OPS_CHECK(bad == 0, "rope R=%d heads=%d pairing=%d yarn=%d: %d bad", rc_->R, rc_->heads,
		          rc_->pairing, rc_->yarn, bad);
		printf("rope R %3d heads %2d stride %3d pairing %d yarn %d n_tok %2" PRId64 " ok\n", rc_->R,
		       rc_->heads, rc_->stride, rc_->pairing, rc_->yarn, n_tok);
	next:
		ops_dbuf_fini(&xb);
		ops_dbuf_fini(&fb);
		ops_dbuf_fini(&pb);
		free(x);
		free(y);
	}
	OPS_CHECK(kcuda_rope(ctx, (float *)16, 64, 1, 1, 64, 63, (float *)16, (int32_t *)16, 0, 1.0f) ==
	              -EINVAL,
	          "odd R accepted");
	OPS_CHECK(kcuda_rope(ctx, (float *)16, 64, 1, 1, 64, 64, (float *)16, (int32_t *)16, 2, 1.0f) ==
	              -EINVAL,
	          "pairing 2 accepted");
}

static void test_embed(void)
{
	static const int types[] = {KT_Q8_0,    KT_Q4_K,   KT_Q5_K,   KT_Q6_K,    KT_BF16,   KT_F32,
	                            KT_F16,     KT_Q4_0,   KT_Q4_1,   KT_Q5_0,    KT_Q5_1,   KT_Q2_K,
	                            KT_Q3_K,    KT_IQ4_NL, KT_IQ4_XS, KT_IQ2_XXS, KT_IQ2_XS, KT_IQ2_S,
	                            KT_IQ3_XXS, KT_IQ3_S,  KT_IQ1_S,  KT_IQ1_M};
	for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
		const int type = types[ti];
		const int64_t qk = ktype_get(type)->blck;
		const int64_t n_in = qk == 1 ? (ti & 1 ? 33 : 6144) : (qk == 32 ? 96 : 6144), n_rows = 1000;
		size_t rb;
		if (!ktype_row_bytes(type, n_in, &rb))
			continue;
		uint8_t *wh = malloc(rb * n_rows);
		ops_fill_weight(type, n_in, n_rows, rb, wh);
		const int64_t n_tok = 6, ldy = n_in + 5;
		int32_t ids[6] = {0, 999, 17, -1, 1000, 17};
		float *y = malloc(sizeof(float) * ldy * n_tok), *ref = malloc(sizeof(float) * n_in);
		struct kweight w = {.type = type, .n_in = n_in, .n_out = n_rows, .row_bytes = rb, .data = wh},
		               wd = {0};
		struct ops_dbuf ib = {0}, yb = {0};
		unsigned n_bad = 0;
		if (kcuda_weight_upload(ctx, &w, &wd) || ops_dbuf_init(ctx, &ib, sizeof(ids)) ||
		    kcuda_upload(ctx, ib.user, ids, sizeof(ids)) ||
		    ops_dbuf_init(ctx, &yb, sizeof(float) * ldy * n_tok)) {
			OPS_CHECK(0, "embed setup");
			goto next;
		}
		int rc = kcuda_embed(ctx, &wd, ib.user, n_tok, yb.user, ldy);
		OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0, "embed rc %d", rc);
		OPS_CHECK(ops_dbuf_get(ctx, &yb, y) == 0, "embed: guard bytes damaged");
		OPS_CHECK(kcuda_ctx_take_errors(ctx, &n_bad) == 0 && n_bad == 2,
		          "embed: %u bad ids counted, want 2", n_bad);
		OPS_CHECK(kcuda_ctx_take_errors(ctx, &n_bad) == 0 && n_bad == 0,
		          "embed: error count not cleared");
		int bad = 0;
		for (int64_t t = 0; t < n_tok; t++) {
			const float *yr = y + t * ldy;
			if (ids[t] < 0 || ids[t] >= n_rows) {
				for (int64_t i = 0; i < n_in; i++)
					bad += !isnan(yr[i]);
			} else {
				kcpu_dequant_row(type, wh + (size_t)ids[t] * rb, ref, n_in);
				double mx = 0;
				for (int64_t i = 0; i < n_in; i++)
					mx = fmax(mx, fabs(ref[i]));
				for (int64_t i = 0; i < n_in; i++)
					bad += !(fabs(yr[i] - ref[i]) <= 1e-6 * (fabs(ref[i]) + mx));
			}
			for (int64_t i = n_in; i < ldy; i++)
				bad += !ops_is_fill_f32(yr[i]);
		}
		OPS_CHECK(bad == 0, "embed %s n_in=%" PRId64 ": %d bad elements", ktype_name(type), n_in,
		          bad);
		printf("embed %-7s n_in %4" PRId64 " ok\n", ktype_name(type), n_in);
	next:
		kcuda_weight_free(&wd);
		ops_dbuf_fini(&ib);
		ops_dbuf_fini(&yb);
		free(wh);
		free(y);
		free(ref);
	}
}

int main(void)
{
	if (kcuda_device_count() < 1) {
		printf("SKIP: no CUDA device\n");
		return 77;
	}
	ops_seed_init();
	if (kcuda_ctx_create(0, 16u << 20, &ctx)) {
		printf("FAIL: no CUDA context\n");
		return 1;
	}
	test_rmsnorm();
	test_swiglu();
	test_rope();
	test_embed();
	kcuda_ctx_destroy(ctx);
	printf("%d checks, %d failed\n", ops_n_check, ops_n_fail);
	return ops_n_fail ? 1 : 0;
}
#endif
