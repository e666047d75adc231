/* kcuda_matmul_multi (kernels/cuda/matmul_multi.cu: several products of one x in one launch)
 * against the CPU op, on seeded random weights and activations:
 *   - every output against kcpu_dot_row (the CPU op kcpu_matmul uses per row) within fp32
 *     summation-order error, |gpu - cpu| <= 2e-6 * sqrt(n_in) * sum|w x| (test_ops_matmul's
 *     tolerance), finite;
 *   - against the separate kcuda_matmul launches of the same products, held to the same tolerance
 *     (the sums are not taken in their order: the largest difference is printed);
 *   - a second run gives the same bits (fixed reduction order);
 *   - guard bytes around every y and the gaps of strided y (ldy > n_out) untouched, strided x;
 *   - segment mixes: the GLM-5 TP=8 per-rank groups {q_a, kv_a, idx_k, idx_proj (F32)} and {q_b,
 *     idx_q_b}, DeepSeek-V3's {q_a, kv_a}, every type the kernel takes (Q8_0, F16, BF16, F32) in one
 *     launch, odd n_out (1, 33, 67), long K (several shared-memory chunks), the tiny test models'
 *     n_in 256, and products it does not take (Q4_K, n_in % 256) mixed in (they run on their own);
 *   - n_tok 1..8 (1, 2, 3, 8 on the big shapes; 1, 2, 8 in TANDEM_OPS_QUICK=1 mode);
 *   - single wide Q8_0 products through kcuda_matmul with TANDEM_MULTI_WIDE=1 (the kernel with a
 *     table of one: GLM-5 o and q_a, odd n_out, long K);
 *   - PDL ordering: a long producer kernel writes x (last) right before the launch; the outputs must
 *     be those of the produced x (the kernel copies weights before KDEP_ENTRY, never x);
 *   - refusals: ERR_UNSUPPORTED for n_tok 9, misaligned x and TANDEM_MULTI=0, -EINVAL for bad
 *     arguments (n_in mismatch, ldy < n_out, ldx < n_in, 0 or too many products).
 * Then the 1-2 token cases again with TANDEM_MULTI_HOIST=1 (x loaded before the wait), the
 * one-token cases with x's int8 parts from the norm (g_parts), and the one-token cases (x and its
 * parts) and the PDL producer with TANDEM_MULTI_RB=4 and =8 (the Q8_0 rows a block at n_in <= 2048,
 * where the default takes 8 only when 4 would not fit one wave), and 2, 3, 5 and 8 tokens (QUICK: 2
 * and 8, small shapes only: the CPU reference of the big ones is slow) on the int8 mma kernel
 * (TANDEM_MULTI_XM=1, mm_xm_kernel: all-Q8_0 calls; any other type makes the call decline to the fp32
 * kernel), with every token's parts from the norm and with x quantized in the kernel.
 * TANDEM_OPS_SMALL=1 (for compute-sanitizer) runs the big shapes at one token only.
 * Exit 77 = no GPU (skip). */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "common/base/err.h"
#include "kernels/cuda/model_fwd.h"
#include "kernels/cuda/fused.h"
#include "tests/ops/ops_util.h"

#ifndef TANDEM_CUDA
int main(void)
{
	printf("SKIP: built without CUDA (make CUDA=1)\n");
	return 77;
}
#else

struct mseg {
	int type;
	int64_t n_out;
};
struct mcase {
	const char *what;
	int64_t n_in;
	int n;
	struct mseg s[KCUDA_MM_MULTI_MAX];
	bool big; /* fewer n_tok (the CPU reference is the slow part) */
};

static const struct mcase cases[] = {
    {"glm q_a,kv_a,idx_k,idx_proj",
     6144,
     4,
     {{KT_Q8_0, 2048}, {KT_Q8_0, 576}, {KT_Q8_0, 128}, {KT_F32, 32}},
     true},
    {"glm q_b,idx_q_b", 2048, 2, {{KT_Q8_0, 2048}, {KT_Q8_0, 4096}}, true},
    {"ds q_a,kv_a", 7168, 2, {{KT_Q8_0, 1536}, {KT_Q8_0, 576}}, true},
    {"all four types", 512, 4, {{KT_BF16, 67}, {KT_F16, 33}, {KT_F32, 1}, {KT_Q8_0, 70}}, false},
    {"six products",
     1024,
     6,
     {{KT_Q8_0, 5}, {KT_F32, 31}, {KT_Q8_0, 1}, {KT_BF16, 9}, {KT_F16, 2}, {KT_Q8_0, 33}},
     false},
    {"long K (3 chunks)", 16384, 3, {{KT_Q8_0, 37}, {KT_F32, 9}, {KT_BF16, 11}}, false},
    {"K 7424 (2 chunks)", 7424, 2, {{KT_Q8_0, 45}, {KT_F16, 6}}, false},
    {"tiny n_in 256", 256, 4, {{KT_Q8_0, 256}, {KT_Q8_0, 288}, {KT_BF16, 64}, {KT_F32, 4}}, false},
    {"Q4_K mixed in", 2048, 3, {{KT_Q4_K, 40}, {KT_Q8_0, 50}, {KT_F32, 17}}, false},
    {"n_in 384: Q8_0 runs alone", 384, 3, {{KT_Q8_0, 20}, {KT_F32, 21}, {KT_F16, 3}}, false},
    {"one product taken", 512, 2, {{KT_Q4_K, 30}, {KT_F32, 7}}, false},
    /* the int8 mma kernel's edges: 9 slabs (a cluster of 2, 7 idle warps), rows not a tile multiple;
     * an F32 product makes the call decline */
    {"Q8_0, 9 slabs", 2304, 2, {{KT_Q8_0, 77}, {KT_Q8_0, 13}}, false},
    {"Q8_0 + F32, 9 slabs", 2304, 2, {{KT_Q8_0, 77}, {KT_F32, 13}}, false},
    {"Q8_0, one slab", 256, 2, {{KT_Q8_0, 9}, {KT_Q8_0, 40}}, false},
};

/* single wide Q8_0 products through kcuda_matmul with TANDEM_MULTI_WIDE=1 (the multi kernel as a
 * table of one) */
static const struct mcase wide_cases[] = {
    {"wide o (MULTI_WIDE)", 2048, 1, {{KT_Q8_0, 6144}}, true},
    {"wide q_a (MULTI_WIDE)", 6144, 1, {{KT_Q8_0, 2048}}, true},
    {"wide odd n_out (MULTI_WIDE)", 2560, 1, {{KT_Q8_0, 1029}}, false},
    {"wide long K (MULTI_WIDE)", 12288, 1, {{KT_Q8_0, 1100}}, false},
};

static double worst_vs_single;
/* x made by kfuse_add_rmsnorm_parts (y = rmsnorm(x) with weight 1) with its int8 parts, which the
 * one-token Q8_0 products then read (one token, n_in % 256 == 0, not strided); the tolerance gains
 * the parts' error, 1e-7 sum |w| m_j (m_j: the largest |x| of element j's 32-element block) */
static int g_parts;
/* the int8 mma kernel's loop (mm_xm_kernel, at 2..8 tokens with TANDEM_MULTI_XM_MIN=2): with g_parts
 * the norm leaves the parts of every token, else the kernel quantizes x itself */
static int g_xm;
/* the cluster tiles quantizing x themselves (TANDEM_MULTI_MQ_X=1): the parts' error in the tolerance */
static int g_mqx;

/* whether the int8 mma kernel (mm_xm_kernel) took a case as it must: every product Q8_0 with n_in % 256 == 0
 * and <= 16384 takes it where K fits one block (n_in <= 2048); with a cluster over K it may decline (its
 * clusters must fit the GPU at once); any other product makes the whole call decline */
static void xm_expect(const struct mcase *mc, int64_t nt, int ran)
{
	int q8 = mc->n_in % 256 == 0 && mc->n_in <= 16384;
	for (int s = 0; s < mc->n; s++)
		q8 &= mc->s[s].type == KT_Q8_0;
	if (q8 && mc->n_in <= 2048)
		OPS_CHECK(ran, "%s at %lld tokens: the int8 mma kernel did not run", mc->what, (long long)nt);
	else if (!q8)
		OPS_CHECK(!ran, "%s at %lld tokens: the int8 mma kernel ran on a call it must decline",
		          mc->what, (long long)nt);
}

/* whether the one-token int8 tensor-core kernel (mm_multi_mq_kernel) took a case run with x's parts
 * as it must: on (TANDEM_MULTI_MQ=1), a Q8_0 product in the call, n_in % 256 == 0 and at least
 * min_table products of the types it runs (2 for a group; 1 for the GLM-5 wide products; with 8
 * warps or K split over clusters, Q8_0 and F32 only); off, never */
static void mq_expect(const struct mcase *mc, int min_table, int on, int nw8, int ran)
{
	int q8 = 0, n_take = 0;
	for (int s = 0; s < mc->n; s++) {
		const int ty = mc->s[s].type;
		q8 |= ty == KT_Q8_0;
		n_take += ty == KT_Q8_0 || ty == KT_F32 || (!nw8 && (ty == KT_F16 || ty == KT_BF16));
	}
	/* a wide product goes through kcuda_matmul, which sends only the wide ones to the multi kernel */
	if (on && q8 && mc->n_in % 256 == 0 && n_take >= min_table && (min_table > 1 || mc->big))
		OPS_CHECK(ran, "%s: the one-token int8 tensor-core kernel did not run", mc->what);
	if (!on)
		OPS_CHECK(!ran, "%s: the one-token int8 tensor-core kernel ran under TANDEM_MULTI_MQ=0",
		          mc->what);
}

/* the int8 mma kernel's token counts: 2, 3, 5, 8 (quick: 2, 8) */
static int64_t xm_next_tok(int64_t nt, int quick)
{
	if (quick)
		return nt + 6;
	return nt == 2 ? 3 : nt == 3 ? 5 : 8 + (nt == 8);
}

/* Runs one case at n_tok tokens; returns 0 if it ran (pass or fail recorded), -1 on setup failure. */
static int run_multi(struct kcuda_ctx *c, const struct mcase *mc, int64_t n_tok, int strided)
{
	const int n = mc->n;
	const int64_t n_in = mc->n_in, ldx = strided ? n_in + 4 : n_in;
	uint8_t *wh[KCUDA_MM_MULTI_MAX] = {0};
	struct kweight wd[KCUDA_MM_MULTI_MAX];
	struct ops_dbuf yb[KCUDA_MM_MULTI_MAX], ys[KCUDA_MM_MULTI_MAX], xb = {0};
	float *yh[KCUDA_MM_MULTI_MAX] = {0}, *y2[KCUDA_MM_MULTI_MAX] = {0}, *y1[KCUDA_MM_MULTI_MAX] = {0};
	int64_t ldy[KCUDA_MM_MULTI_MAX];
	struct kcuda_mm_seg seg[KCUDA_MM_MULTI_MAX];
	float *xh = malloc(sizeof(float) * (size_t)(ldx * n_tok));
	float *row = malloc(sizeof(float) * (size_t)n_in);
	int ret = -1;
	memset(wd, 0, sizeof(wd));
	memset(yb, 0, sizeof(yb));
	memset(ys, 0, sizeof(ys));
	if (!xh || !row)
		goto out;
	for (int64_t i = 0; i < ldx * n_tok; i++)
		xh[i] = ops_rng_unif();
	if (ops_dbuf_init(c, &xb, sizeof(float) * (size_t)(ldx * n_tok)) ||
	    kcuda_upload(c, xb.user, xh, xb.bytes))
		goto out;
	const int parts = g_parts && (n_tok == 1 || g_xm) && ldx == n_in && n_in % 256 == 0;
	if (parts) { /* x = rmsnorm(x) with its parts; the reference reads the normed x back */
		void *hd = NULL, *wn = NULL;
		float *ones = malloc(sizeof(float) * (size_t)n_in);
		int prc = !ones || kcuda_alloc(sizeof(float) * (size_t)(n_in * n_tok), &hd) ||
		          kcuda_alloc(sizeof(float) * (size_t)n_in, &wn);
		if (!prc) {
			for (int64_t k = 0; k < n_in; k++)
				ones[k] = 1.0f;
			prc = kcuda_upload(c, wn, ones, sizeof(float) * (size_t)n_in) ||
			      kcuda_upload(c, hd, xh, sizeof(float) * (size_t)(n_in * n_tok)) ||
			      kfuse_add_rmsnorm_parts(c, hd, NULL, xb.user, wn, n_in, n_tok, 1e-6f) ||
			      kcuda_sync(c) || ops_dbuf_get(c, &xb, xh) != 0;
		}
		OPS_CHECK(!prc && kcuda_xparts_of(c) == (const float *)xb.user,
		          "%s: kfuse_add_rmsnorm_parts left no parts of x (n_in %" PRId64 ")", mc->what,
		          n_in);
		kcuda_free(hd);
		kcuda_free(wn);
		free(ones);
	}
	for (int i = 0; i < n; i++) {
		size_t rb = 0;
		const int type = mc->s[i].type;
		const int64_t n_out = mc->s[i].n_out;
		if (!ktype_row_bytes(type, n_in, &rb))
			goto out;
		ldy[i] = strided ? n_out + 3 : n_out;
		const size_t yby = sizeof(float) * (size_t)(ldy[i] * n_tok);
		wh[i] = malloc(rb * (size_t)n_out);
		yh[i] = malloc(yby);
		y2[i] = malloc(yby);
		y1[i] = malloc(yby);
		if (!wh[i] || !yh[i] || !y2[i] || !y1[i])
			goto out;
		ops_fill_weight(type, n_in, n_out, rb, wh[i]);
		struct kweight w = {
		    .type = type, .n_in = n_in, .n_out = n_out, .row_bytes = rb, .data = wh[i]};
		if (kcuda_weight_upload(c, &w, &wd[i]) || ops_dbuf_init(c, &yb[i], yby) ||
		    ops_dbuf_init(c, &ys[i], yby))
			goto out;
		seg[i] = (struct kcuda_mm_seg){.w = &wd[i], .y = yb[i].user, .ldy = ldy[i]};
	}
	int rc = kcuda_matmul_multi(c, n, seg, xb.user, ldx, n_tok);
	if (!rc)
		rc = kcuda_sync(c);
	OPS_CHECK(rc == 0, "%s n_tok=%" PRId64 ": rc %d", mc->what, n_tok, rc);
	for (int i = 0; i < n; i++) {
		size_t bad = ops_dbuf_get(c, &yb[i], yh[i]);
		OPS_CHECK(bad == 0, "%s product %d: %zu guard bytes damaged around y", mc->what, i, bad);
	}
	/* the same again: the same bits */
	int rc2 = kcuda_matmul_multi(c, n, seg, xb.user, ldx, n_tok);
	if (!rc2)
		rc2 = kcuda_sync(c);
	for (int i = 0; i < n && !rc2; i++) {
		ops_dbuf_get(c, &yb[i], y2[i]);
		OPS_CHECK(memcmp(y2[i], yh[i], sizeof(float) * (size_t)(ldy[i] * n_tok)) == 0,
		          "%s product %d n_tok=%" PRId64 ": second run differs", mc->what, i, n_tok);
	}
	OPS_CHECK(rc2 == 0, "%s: second run rc %d", mc->what, rc2);
	/* the separate launches of the same products */
	int rc1 = 0;
	for (int i = 0; i < n && !rc1; i++)
		rc1 = kcuda_matmul(c, &wd[i], xb.user, ldx, n_tok, ys[i].user, ldy[i]);
	if (!rc1)
		rc1 = kcuda_sync(c);
	OPS_CHECK(rc1 == 0, "%s: separate launches rc %d", mc->what, rc1);
	for (int i = 0; i < n && !rc1; i++)
		ops_dbuf_get(c, &ys[i], y1[i]);

	double worst = 0, worst_s = 0;
	int64_t n_bad = 0, n_bad_s = 0, n_gap_bad = 0;
	for (int i = 0; i < n; i++) {
		const int type = mc->s[i].type;
		const int64_t n_out = mc->s[i].n_out;
		const size_t rb = wd[i].row_bytes;
		for (int64_t r = 0; r < n_out; r++) {
			kcpu_dequant_row(type, wh[i] + (size_t)r * rb, row, n_in);
			for (int64_t t = 0; t < n_tok; t++) {
				const float *x = xh + t * ldx;
				const double ref = kcpu_dot_row(type, wh[i] + (size_t)r * rb, x, n_in);
				double mag = 0, magm = 0;
				for (int64_t k = 0; k < n_in; k++) {
					mag += fabs((double)row[k] * x[k]);
					if ((parts || g_xm || g_mqx) &&
					    type == KT_Q8_0) { /* the parts, or the int8 mma kernel's own */
						float m = 0;
						for (int64_t q = k / 32 * 32; q < k / 32 * 32 + 32; q++)
							m = fmaxf(m, fabsf(x[q]));
						magm += fabs((double)row[k]) * m;
					}
				}
				const double tol = 2e-6 * sqrt((double)n_in) * mag + 1e-7 * magm + 1e-30;
				const float g = yh[i][t * ldy[i] + r], s = y1[i][t * ldy[i] + r];
				const double err = fabs((double)g - ref), err_s = fabs((double)g - (double)s);
				if (!isfinite(g) || !(err <= tol)) {
					if (n_bad++ < 3)
						printf("  %s product %d (%s) row %" PRId64 " tok %" PRId64
						       ": gpu %.9g ref %.9g (|d| %.3g, tol %.3g)\n",
						       mc->what, i, ktype_name(type), r, t, g, ref, err, tol);
				}
				if (!rc1 && !(err_s <= tol)) {
					if (n_bad_s++ < 3)
						printf("  %s product %d (%s) row %" PRId64 " tok %" PRId64
						       ": multi %.9g separate %.9g\n",
						       mc->what, i, ktype_name(type), r, t, g, s);
				}
				if (mag > 0 && err / mag > worst)
					worst = err / mag;
				if (mag > 0 && err_s / mag > worst_s)
					worst_s = err_s / mag;
			}
		}
		for (int64_t t = 0; t < n_tok; t++)
			for (int64_t r = n_out; r < ldy[i]; r++)
				n_gap_bad += !ops_is_fill_f32(yh[i][t * ldy[i] + r]);
	}
	if (worst_s > worst_vs_single)
		worst_vs_single = worst_s;
	OPS_CHECK(n_bad == 0, "%s n_tok=%" PRId64 ": %" PRId64 " wrong outputs", mc->what, n_tok, n_bad);
	OPS_CHECK(n_bad_s == 0, "%s n_tok=%" PRId64 ": %" PRId64 " outputs away from the separate launches",
	          mc->what, n_tok, n_bad_s);
	OPS_CHECK(n_gap_bad == 0, "%s: %" PRId64 " writes into the ldy gaps", mc->what, n_gap_bad);
	printf("multi %-30s n_in %6" PRId64 " n_tok %" PRId64
	       "%s%s  max |err|/sum|wx| %.2e, vs separate %.2e %s\n",
	       mc->what, n_in, n_tok, strided ? " strided" : "", parts ? " x parts" : "", worst, worst_s,
	       n_bad || n_bad_s ? "FAIL" : "ok");
	ret = 0;
out:
	kcuda_xparts_forget(c);
	if (ret)
		printf("setup failed for %s\n", mc->what);
	for (int i = 0; i < n; i++) {
		kcuda_weight_free(&wd[i]);
		ops_dbuf_fini(&yb[i]);
		ops_dbuf_fini(&ys[i]);
		free(wh[i]);
		free(yh[i]);
		free(y2[i]);
		free(y1[i]);
	}
	ops_dbuf_fini(&xb);
	free(xh);
	free(row);
	return ret;
}

/* PDL ordering: a long producer kernel (kfwd_scale over 128 MB, x at the very end, so x is written
 * last) right before the multi launch on the same stream. The multi kernel's blocks start beside the
 * producer's tail under PDL and copy weights before KDEP_ENTRY; reading x before it would see the
 * unscaled values. Reference: the CPU op on 2 x (exact). n_in 6144 (q_a's group) or 2048 (the Q8_0
 * products at one token then take 8 rows a block). */
static void check_pdl_producer_n(struct kcuda_ctx *c, int64_t n_tok, int64_t n_in)
{
	const int64_t pad = (int64_t)32 << 20;
	static const struct mseg sg[4] = {{KT_Q8_0, 512}, {KT_Q8_0, 64}, {KT_Q8_0, 32}, {KT_F32, 32}};
	struct kweight wd[4];
	uint8_t *wh[4] = {0};
	float *yd[4] = {0}, *yh[4] = {0};
	struct kcuda_mm_seg seg[4];
	float *buf = NULL, *xh = malloc(sizeof(float) * (size_t)(n_in * n_tok));
	memset(wd, 0, sizeof(wd));
	int ok = xh != NULL;
	for (int i = 0; i < 4 && ok; i++) {
		size_t rb = 0;
		ok = ktype_row_bytes(sg[i].type, n_in, &rb);
		wh[i] = ok ? malloc(rb * (size_t)sg[i].n_out) : NULL;
		yh[i] = malloc(sizeof(float) * (size_t)(sg[i].n_out * n_tok));
		ok = ok && wh[i] && yh[i];
		if (!ok)
			break;
		ops_fill_weight(sg[i].type, n_in, sg[i].n_out, rb, wh[i]);
		struct kweight w = {
		    .type = sg[i].type, .n_in = n_in, .n_out = sg[i].n_out, .row_bytes = rb, .data = wh[i]};
		ok = !kcuda_weight_upload(c, &w, &wd[i]) &&
		     !kcuda_alloc(sizeof(float) * (size_t)(sg[i].n_out * n_tok), (void **)&yd[i]);
		seg[i] = (struct kcuda_mm_seg){.w = &wd[i], .y = yd[i], .ldy = sg[i].n_out};
	}
	ok = ok && !kcuda_alloc(sizeof(float) * (size_t)(pad + n_in * n_tok), (void **)&buf);
	if (!ok) {
		OPS_CHECK(0, "pdl producer setup");
		goto out;
	}
	for (int64_t i = 0; i < n_in * n_tok; i++)
		xh[i] = ops_rng_unif();
	int bad = 0;
	for (int rep = 0; rep < 3; rep++) {
		int rc = kcuda_memset(c, buf, 0, sizeof(float) * (size_t)pad);
		rc = rc ? rc : kcuda_upload(c, buf + pad, xh, sizeof(float) * (size_t)(n_in * n_tok));
		rc = rc ? rc : kcuda_sync(c);
		rc = rc ? rc : kfwd_scale(c, buf, pad + n_in * n_tok, 2.0f); /* x written last */
		rc = rc ? rc : kcuda_matmul_multi(c, 4, seg, buf + pad, n_in, n_tok);
		rc = rc ? rc : kcuda_sync(c);
		OPS_CHECK(rc == 0, "pdl producer n_tok %" PRId64 ": rc %d", n_tok, rc);
		for (int i = 0; i < 4 && !rc; i++) {
			if (kcuda_download(c, yh[i], yd[i], sizeof(float) * (size_t)(sg[i].n_out * n_tok)))
				bad++;
			float *x2 = malloc(sizeof(float) * (size_t)n_in),
			      *row = malloc(sizeof(float) * (size_t)n_in);
			for (int64_t r = 0; r < sg[i].n_out && x2 && row; r++) {
				kcpu_dequant_row(sg[i].type, wh[i] + (size_t)r * wd[i].row_bytes, row, n_in);
				for (int64_t t = 0; t < n_tok; t++) {
					double mag = 0;
					for (int64_t k = 0; k < n_in; k++) {
						x2[k] = 2.0f * xh[t * n_in + k];
						mag += fabs((double)row[k] * x2[k]);
					}
					const double ref = kcpu_dot_row(
					    sg[i].type, wh[i] + (size_t)r * wd[i].row_bytes, x2, n_in);
					const float g = yh[i][t * sg[i].n_out + r];
					if (!isfinite(g) || !(fabs((double)g - ref) <=
					                      2e-6 * sqrt((double)n_in) * mag + 1e-30)) {
						if (bad++ < 3)
							printf("  pdl producer product %d row %" PRId64
							       " tok %" PRId64 ": gpu %.9g ref(2x) %.9g\n",
							       i, r, t, g, ref);
					}
				}
			}
			free(x2);
			free(row);
		}
	}
	OPS_CHECK(bad == 0, "pdl producer n_tok %" PRId64 ": %d outputs read x before its producer finished",
	          n_tok, bad);
	printf("multi after a PDL producer kernel, n_tok %" PRId64 ", 3 runs: %s\n", n_tok,
	       bad ? "FAIL" : "ok");
out:
	for (int i = 0; i < 4; i++) {
		kcuda_weight_free(&wd[i]);
		kcuda_free(yd[i]);
		free(wh[i]);
		free(yh[i]);
	}
	kcuda_free(buf);
	free(xh);
}

static void check_pdl_producer(struct kcuda_ctx *c, int64_t n_tok)
{
	check_pdl_producer_n(c, n_tok, 6144);
	if (n_tok == 1)
		check_pdl_producer_n(c, n_tok, 2048);
}

static void check_refusals(struct kcuda_ctx *c)
{
	uint8_t wh[34 * 16] = {0}, wf[4 * 512] = {0};
	struct kweight w = {.type = KT_Q8_0, .n_in = 512, .n_out = 1, .row_bytes = 544, .data = wh};
	struct kweight f = {.type = KT_F32, .n_in = 512, .n_out = 1, .row_bytes = 2048, .data = wf};
	struct kweight wd = {0}, fd = {0};
	float *x = NULL, *y = NULL;
	if (kcuda_weight_upload(c, &w, &wd) || kcuda_weight_upload(c, &f, &fd) ||
	    kcuda_alloc(16 * 1024 * sizeof(float), (void **)&x) ||
	    kcuda_alloc(64 * sizeof(float), (void **)&y)) {
		OPS_CHECK(0, "refusals setup");
		goto out;
	}
	struct kcuda_mm_seg s[KCUDA_MM_MULTI_MAX + 1];
	for (int i = 0; i < KCUDA_MM_MULTI_MAX + 1; i++)
		s[i] = (struct kcuda_mm_seg){.w = i & 1 ? &fd : &wd, .y = y + 8 * i, .ldy = 1};
	OPS_CHECK(kcuda_matmul_multi(c, 2, s, x, 512, 9) == ERR_UNSUPPORTED, "n_tok 9 not refused");
	OPS_CHECK(kcuda_matmul_multi(c, 2, s, x + 1, 512, 1) == ERR_UNSUPPORTED, "misaligned x not refused");
	OPS_CHECK(kcuda_matmul_multi(c, 2, s, x, 514, 1) == ERR_UNSUPPORTED, "ldx %% 4 != 0 not refused");
	OPS_CHECK(kcuda_matmul_multi(c, 2, s, x, 511, 1) == -EINVAL, "ldx < n_in accepted");
	OPS_CHECK(kcuda_matmul_multi(c, 0, s, x, 512, 1) == -EINVAL, "no products accepted");
	OPS_CHECK(kcuda_matmul_multi(c, KCUDA_MM_MULTI_MAX + 1, s, x, 512, 1) == -EINVAL,
	          "too many products accepted");
	OPS_CHECK(kcuda_matmul_multi(c, 2, s, x, 512, -1) == -EINVAL, "negative n_tok accepted");
	OPS_CHECK(kcuda_matmul_multi(c, 2, s, x, 512, 0) == 0, "n_tok 0 is not a no-op");
	struct kweight other = fd;
	other.n_in = 256;
	other.row_bytes = 1024;
	struct kcuda_mm_seg bad[2] = {s[0], {.w = &other, .y = y, .ldy = 1}};
	OPS_CHECK(kcuda_matmul_multi(c, 2, bad, x, 512, 1) == -EINVAL, "n_in mismatch accepted");
	bad[1] = s[1];
	bad[1].ldy = 0;
	OPS_CHECK(kcuda_matmul_multi(c, 2, bad, x, 512, 1) == -EINVAL, "ldy < n_out accepted");
	bad[1] = s[1];
	bad[1].y = NULL;
	OPS_CHECK(kcuda_matmul_multi(c, 2, bad, x, 512, 1) == -EINVAL, "null y accepted");
	setenv("TANDEM_MULTI", "0", 1);
	OPS_CHECK(kcuda_matmul_multi(c, 2, s, x, 512, 1) == ERR_UNSUPPORTED, "TANDEM_MULTI=0 not honoured");
	unsetenv("TANDEM_MULTI");
	setenv("TANDEM_MULTI_TOK", "2", 1);
	OPS_CHECK(kcuda_matmul_multi(c, 2, s, x, 512, 3) == ERR_UNSUPPORTED,
	          "TANDEM_MULTI_TOK=2 not honoured");
	OPS_CHECK(kcuda_matmul_multi(c, 2, s, x, 512, 2) == 0, "TANDEM_MULTI_TOK=2 refuses 2 tokens");
	unsetenv("TANDEM_MULTI_TOK");
	OPS_CHECK(kcuda_sync(c) == 0, "refusals: sync");
out:
	kcuda_weight_free(&wd);
	kcuda_weight_free(&fd);
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
	/* TANDEM_OPS_SMALL=1 (compute-sanitizer runs): the big per-rank shapes at n_tok 1 only */
	const int small = getenv("TANDEM_OPS_SMALL") != NULL;
	struct kcuda_ctx *c = NULL;
	if (kcuda_ctx_create(0, 64u << 20, &c)) {
		printf("FAIL: no CUDA context\n");
		return 1;
	}
	check_refusals(c);
	for (int h = 0; h < 2; h++) { /* x slab by slab, then x before the wait (TANDEM_MULTI_HOIST=1) */
		if (h)
			setenv("TANDEM_MULTI_HOIST", "1", 1);
		check_pdl_producer(c, 1);
		check_pdl_producer(c, 2);
		check_pdl_producer(c, 8);
		unsetenv("TANDEM_MULTI_HOIST");
	}
	int setup_fail = 0;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		for (int64_t nt = 1; nt <= 8; nt++) {
			if ((quick || cases[i].big) && nt != 1 && nt != 2 && nt != 8 && !(nt == 3 && !quick))
				continue;
			if (small && cases[i].big && nt != 1)
				continue;
			setup_fail |= run_multi(c, &cases[i], nt, (int)((i + (size_t)nt) & 1));
		}
	/* x loaded before the wait at 1-2 tokens (TANDEM_MULTI_HOIST=1): the other instantiations */
	setenv("TANDEM_MULTI_HOIST", "1", 1);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		for (int64_t nt = 1; nt <= 2; nt++)
			if (!(small && cases[i].big && nt != 1) && !(quick && cases[i].big && nt != 1))
				setup_fail |= run_multi(c, &cases[i], nt, (int)((i + (size_t)nt) & 1));
	unsetenv("TANDEM_MULTI_HOIST");
	setenv("TANDEM_MULTI_WIDE", "1", 1);
	for (size_t i = 0; i < sizeof(wide_cases) / sizeof(wide_cases[0]); i++)
		for (int64_t nt = 1; nt <= 8; nt++) {
			if (nt != 1 && nt != 2 && nt != 3 && nt != 8)
				continue;
			if ((quick && i < 2 && nt == 3) || (small && wide_cases[i].big && nt != 1))
				continue;
			setup_fail |= run_multi(c, &wide_cases[i], nt, (int)((i + (size_t)nt) & 1));
		}
	unsetenv("TANDEM_MULTI_WIDE"); /* the default: on */
	/* one token with x's int8 parts from the norm (kfuse_add_rmsnorm_parts): every group and the wide
	 * products (the table of one), on the int8 tensor-core tiles (mm_multi_mq_kernel, TANDEM_MULTI_MQ=1,
	 * with 4 and 8 warps a block, and mm_multi_mqc_kernel's clusters) and on the dp4a kernel (the
	 * default) */
	g_parts = 1;
	/* 4 warps a block, 8 warps (TANDEM_MULTI_MQ_NW=8), K split over clusters (TANDEM_MULTI_MQ_KS:
	 * one slab a warp of 8, 2 blocks of 4 warps, 8 blocks: clipped to the slabs there are, so ranks
	 * of one slab and, at 768 = 3 slabs, fewer ranks than asked), off */
	static const struct {
		const char *nw, *ks;
	} mqv[] = {{"4", NULL}, {"8", NULL}, {"8", "auto"}, {"4", "2"}, {"8", "8"}, {"4", NULL}};
	const int n_mqv = (int)(sizeof(mqv) / sizeof(mqv[0]));
	for (int v = 0; v < n_mqv; v++) {
		const int mq = v < n_mqv - 1, nw8 = strcmp(mqv[v].nw, "8") == 0 || mqv[v].ks;
		setenv("TANDEM_MULTI_MQ", mq ? "1" : "0", 1);
		setenv("TANDEM_MULTI_MQ_NW", mqv[v].nw, 1);
		if (mqv[v].ks)
			setenv("TANDEM_MULTI_MQ_KS", mqv[v].ks, 1);
		else
			unsetenv("TANDEM_MULTI_MQ_KS");
		for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
			const unsigned long long before = kcuda_matmul_mq_calls();
			setup_fail |= run_multi(c, &cases[i], 1, 0);
			mq_expect(&cases[i], 2, mq, nw8, kcuda_matmul_mq_calls() > before);
		}
		for (size_t i = 0; i < sizeof(wide_cases) / sizeof(wide_cases[0]); i++) {
			const unsigned long long before = kcuda_matmul_mq_calls();
			setup_fail |= run_multi(c, &wide_cases[i], 1, 0);
			mq_expect(&wide_cases[i], 1, mq, nw8, kcuda_matmul_mq_calls() > before);
		}
	}
	g_parts = 0;
	/* one token without x's parts on the cluster tiles (TANDEM_MULTI_MQ_X=1: each warp quantizes its
	 * slabs of x), 8 and 4 warps */
	setenv("TANDEM_MULTI_MQ", "1", 1);
	setenv("TANDEM_MULTI_MQ_X", "1", 1);
	g_mqx = 1;
	for (int v = 0; v < 2; v++) {
		setenv("TANDEM_MULTI_MQ_NW", v ? "4" : "8", 1);
		setenv("TANDEM_MULTI_MQ_KS", v ? "2" : "auto", 1);
		for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
			const unsigned long long before = kcuda_matmul_mq_calls();
			setup_fail |= run_multi(c, &cases[i], 1, (int)(i & 1));
			mq_expect(&cases[i], 2, 1, 1, kcuda_matmul_mq_calls() > before);
		}
		for (size_t i = 0; i < sizeof(wide_cases) / sizeof(wide_cases[0]); i++) {
			const unsigned long long before = kcuda_matmul_mq_calls();
			setup_fail |= run_multi(c, &wide_cases[i], 1, 0);
			mq_expect(&wide_cases[i], 1, 1, 1, kcuda_matmul_mq_calls() > before);
		}
	}
	unsetenv("TANDEM_MULTI_MQ_X");
	g_mqx = 0;
	unsetenv("TANDEM_MULTI_MQ");
	unsetenv("TANDEM_MULTI_MQ_NW");
	unsetenv("TANDEM_MULTI_MQ_KS");
	/* one token at n_in <= 2048 takes 8 Q8_0 rows a block where 4 would not fit one wave (the wide o
	 * above); TANDEM_MULTI_RB=4 / 8 force either there: the one-token cases again on both (x and x's
	 * parts), and the PDL producer */
	setenv("TANDEM_MULTI_MQ", "0",
	       1); /* x's parts on the dp4a kernel's 4 and 8 rows, not the mma tiles */
	for (int rb = 4; rb <= 8; rb += 4) {
		setenv("TANDEM_MULTI_RB", rb == 4 ? "4" : "8", 1);
		check_pdl_producer(c, 1);
		for (g_parts = 0; g_parts < 2; g_parts++) {
			for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
				setup_fail |= run_multi(c, &cases[i], 1, (int)(i & 1) && !g_parts);
			for (size_t i = 0; i < sizeof(wide_cases) / sizeof(wide_cases[0]); i++)
				setup_fail |= run_multi(c, &wide_cases[i], 1, (int)(i & 1) && !g_parts);
		}
		g_parts = 0;
	}
	unsetenv("TANDEM_MULTI_RB");
	unsetenv("TANDEM_MULTI_MQ");
	/* 1..8 tokens on the int8 mma (TANDEM_MULTI_XM=1) with the parts of every token: every group (its
	 * other products run after it) and the wide products */
	setenv("TANDEM_MULTI_XM", "1", 1);
	setenv("TANDEM_MULTI_XM_MIN", "2", 1); /* every token count it can take, not only the default 5..8 */
	g_xm = 1;
	for (g_parts = 1; g_parts >= 0; g_parts--) /* x's parts from the norm, then quantized in the kernel */
		for (int64_t nt = 2; nt <= 8; nt = xm_next_tok(nt, quick)) {
			for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
				if (!((small || quick) && cases[i].big)) {
					const unsigned long long before = kcuda_matmul_xm_calls();
					setup_fail |= run_multi(c, &cases[i], nt, 0);
					xm_expect(&cases[i], nt, kcuda_matmul_xm_calls() > before);
				}
			for (size_t i = 0; i < sizeof(wide_cases) / sizeof(wide_cases[0]); i++)
				if (!((small || quick) && wide_cases[i].big)) {
					const unsigned long long before = kcuda_matmul_xm_calls();
					setup_fail |= run_multi(c, &wide_cases[i], nt, 0);
					xm_expect(&wide_cases[i], nt, kcuda_matmul_xm_calls() > before);
				}
		}
	g_parts = g_xm = 0;
	unsetenv("TANDEM_MULTI_XM_MIN");
	unsetenv("TANDEM_MULTI_XM");
	OPS_CHECK(setup_fail == 0, "some cases failed to set up");
	printf("largest |multi - separate| / sum|wx|: %.2e\n", worst_vs_single);
	kcuda_ctx_destroy(c);
	printf("%d checks, %d failed\n", ops_n_check, ops_n_fail);
	return ops_n_fail ? 1 : 0;
}
#endif
