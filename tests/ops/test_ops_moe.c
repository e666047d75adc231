/* MoE on the GPU against the CPU:
 * 1. kcuda_moe_route vs kcpu_moe_route per token: DeepSeek-V3 routing (E 256, k 8, 8 groups / 4
 *    used, sigmoid, correction bias, norm, scale 2.5), GLM-5 routing (E 256, k 8, one group),
 *    softmax gating (E 64, k 6) and an odd one (E 20, k 3, 5 groups / 2 used); logits on a coarse
 *    grid in half of the tokens so experts and groups tie exactly (ties go to the lower id).
 *    ids must be equal; weights within 1e-6 relative (CUDA expf is not glibc's to the last ulp).
 * 2. kcuda_moe_ffn vs the CPU chain of forward.c (per expert: kcpu_matmul gate / up on its tokens,
 *    kcpu_swiglu, kcpu_matmul down; then the weighted sum in slot order) for Q8_0, Q4_K, Q5_K,
 *    Q6_K, BF16, F32 stacked expert weights and mixed gate / down types, every path:
 *    - the tensor-core path (moe_mma.cu: K-quants and Q8_0 at D, F multiples of 256, 1..256
 *      tokens): batch 1, 2, 3, 8, 16, 17, 40, 128, 256 at 256 experts top-8, one TP=8 rank of
 *      GLM-5 (D 6144) and DeepSeek-V3 (D 7168) with F 256, glm-dsa-tiny's dims; with the shared
 *      expert in the same launches (kcuda_moe_ffn_shexp; refused with ERR_UNSUPPORTED where its
 *      shape does not fit, e.g. ds-tiny's F 128); both n-tile counts forced (TANDEM_MOE_MMA_NG);
 *      max error <= 1e-4 max|ref| (fp16 hi/lo split of x: ~1e-7 in practice);
 *    - TANDEM_MOE_FAST=0: the pair kernels (<= 16 tokens) and the sorted kernels (17..256, bit-equal
 *      to the pair kernels token by token), fp32, <= 1e-4; the grouped prefill path
 *      (TANDEM_MOE_SORTED=0 at 40 tokens, and 300 tokens: bf16 tensor-core GEMM, <= 2e-2).
 *    Every case runs twice: the bits must be equal (determinism). An expert id out of range is
 *    counted and gives NaN for its token only.
 * 3. The model's chain kcuda_matmul (F32 router weight) -> kcuda_moe_route against the CPU chain
 *    (ids equal except near-ties of the selection score, since the logits differ by rounding), and
 *    argument checks.
 * 4. The small-batch path (moe_small.cu: 1..8 tokens by default, no sort, down + combine in one
 *    kernel) at every batch 1..8 and the neighbours 9, 16, 17 (the sorted path), GLM-5 and DS-V3 slices, with
 *    and without the shared expert, Q4_K / Q6_K / Q5_K / Q8_0 mixes, an expert chosen by many
 *    pairs (chunks of 4) and ids repeated inside a token; gate / up split over D in 1, 2, 3
 *    blocks (TANDEM_MOE_SMALL_SPLIT), 4 warps per gate / up block (TANDEM_MOE_SMALL_GUW), one
 *    tile of 8 gate + 8 up rows per warp (TANDEM_MOE_SMALL_HALF); 8 or 9
 *    warps in the down kernel (9 where np = 9, 17, 18, ...); its threshold moved by
 *    TANDEM_MOE_SMALL_MAX and the path switched off (TANDEM_MOE_SMALL=0); bits equal to the sorted
 *    path's one-tile result reported. One-token chunks of Q4_K / Q5_K run on the int8 unit
 *    (k45_i8.cuh: x as three int8 parts per 32-element sub-block, ~3e-7 of max|ref| measured) by
 *    default and on the fp16 unit under TANDEM_MOE_I8=0 (a few cases). The route's register kernel
 *    and the shared-memory one (TANDEM_MOE_ROUTE_FAST=0) on every routing case, plus group shapes
 *    the register kernel hands back (E 192, 4 groups) and E 512 top-16.
 * 5. The batch-1 kernels (moe_one.cu, behind TANDEM_MOE_SMALL_V=dn / gu / new: its kernels at one token with
 * Q4_K / Q5_K experts, TANDEM_MOE_SMALL_V=new both): against the CPU and against moe_small's kernels (the
 * same bits expected), GLM-5 / DS-V3 slices and short D, every down type, repeated ids, large x, each half
 * alone, with the switches of their early loads off; and the decode chain producer -> router -> route ->
 * experts under PDL, the same bits as the call alone (a read before a producer finished would differ), also
 * with the route folded into the expert launches (kcuda_moe_route_ffn1: its ids / weights the same bits as
 *    kcuda_moe_route's on the same logits; GLM-5 and DS-V3 group routing) and its refusals.
 * 5b. The batch-1 MoE in one launch (moe_persist.cu, TANDEM_MOE_PERSIST=1; the rest of the file runs with
 *    it off): against the CPU, twice (same bits), against moe_small's kernels, an id out of range, GLM-5 /
 *    DS-V3 slices, D 256 / 512, no shared expert, Q5_K mixes, repeated ids, large x, the decode chain
 *    with and without the route folded in; each call must be exactly one launch with no error counted.
 * 6. kcuda_moe_router_route (router product + route in one launch): moe4's kernel under
 *    TANDEM_MOE_ROUTER_FUSED=1|2, and moe6's under TANDEM_MOE_ROUTE_FUSE=1 (moe_router_fuse.cu: gemv3's
 *    product, the route in the last block; off by default): logits the bits of
 * kcuda_matmul_path(KCUDA_MM_F32), ids / weights the bits of kcuda_moe_route on them and equal to
 * kcpu_moe_route's, batch 1..8, GLM-5 / DS-V3 routing, tied rows, E 4 / 64 / 382, x written by a late PDL
 * producer (kcuda_pdl_late_copy), no clusters, the shuffle arg-max, the last block's sorted route and
 * route_reg_token itself (TANDEM_MOE_ROUTE_SORT=0), three runs bit-equal (the ticket resets); refusals. The
 * gate / up variants TANDEM_MOE_DB=2 and TANDEM_MOE_SMALL_GUW=6 against the CPU (part of 4). Guard bytes
 * around the outputs. Exit 77 = no GPU (skip). */
#include <errno.h>

#include "common/base/err.h"
#include "kernels/cuda/fused.h"
#include "kernels/cuda/model_fwd.h"
#include "kernels/cuda/pdl_probe.h"
#include "kernels/cuda/prof.h"
#include "tests/ops/ops_util.h"

#ifndef TANDEM_CUDA
int main(void)
{
	printf("SKIP: built without CUDA (make CUDA=1)\n");
	return 77;
}
#else

static struct kcuda_ctx *ctx;

struct rcase {
	const char *name;
	int E, k, n_group, n_used, gating, norm, bias;
	float scale;
};

static void route_case(const struct rcase *rc_)
{
	const int n = 300, E = rc_->E, k = rc_->k;
	float *lg = malloc(sizeof(float) * (size_t)n * E), *bias = malloc(sizeof(float) * (size_t)E);
	int32_t *rid = malloc(sizeof(int32_t) * (size_t)n * k),
	        *gid = malloc(sizeof(int32_t) * (size_t)n * k);
	float *rw = malloc(sizeof(float) * (size_t)n * k), *gw = malloc(sizeof(float) * (size_t)n * k);
	float *scr = malloc(sizeof(float) * 2 * (size_t)E);
	void *d_lg = NULL, *d_b = NULL;
	struct ops_dbuf ib = {0}, wb = {0};
	for (int e = 0; e < E; e++)
		bias[e] = ops_rng_unif() * 0.1f;
	if (E > 8)
		bias[3] = bias[5]; /* equal biases: exact ties when the logits are equal too */
	for (int i = 0; i < n; i++)
		for (int e = 0; e < E; e++) {
			float v = ops_rng_unif() * 4.0f;
			if (i % 2) /* coarse grid: many exact ties of experts and of groups */
				v = (float)(int)(v * 2.0f) / 2.0f;
			if (i % 7 == 3)
				v = 0.0f; /* all equal */
			lg[(size_t)i * E + e] = v;
		}
	const float *bp = rc_->bias ? bias : NULL;
	for (int i = 0; i < n; i++)
		kcpu_moe_route(lg + (size_t)i * E, bp, E, k, rc_->n_group, rc_->n_used, rc_->gating,
		               rc_->norm, rc_->scale, rid + (size_t)i * k, rw + (size_t)i * k, scr);
	if (kcuda_alloc(sizeof(float) * (size_t)n * E, &d_lg) ||
	    kcuda_alloc(sizeof(float) * (size_t)E, &d_b) ||
	    ops_dbuf_init(ctx, &ib, sizeof(int32_t) * (size_t)n * k) ||
	    ops_dbuf_init(ctx, &wb, sizeof(float) * (size_t)n * k)) {
		OPS_CHECK(0, "%s: device allocation", rc_->name);
		goto out;
	}
	kcuda_upload(ctx, d_lg, lg, sizeof(float) * (size_t)n * E);
	kcuda_upload(ctx, d_b, bias, sizeof(float) * (size_t)E);
	int rc = kcuda_moe_route(ctx, d_lg, E, rc_->bias ? d_b : NULL, n, E, k, rc_->n_group, rc_->n_used,
	                         rc_->gating, rc_->norm, rc_->scale, ib.user, wb.user);
	OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0, "%s: rc %d", rc_->name, rc);
	size_t g = ops_dbuf_get(ctx, &ib, gid) + ops_dbuf_get(ctx, &wb, gw);
	OPS_CHECK(g == 0, "%s: %zu guard bytes damaged", rc_->name, g);
	int bad_ids = 0, bad_w = 0;
	double maxrel = 0;
	for (int i = 0; i < n * k; i++) {
		if (gid[i] != rid[i]) {
			if (bad_ids++ < 3)
				printf("  %s: token %d slot %d: gpu expert %d, cpu %d\n", rc_->name, i / k,
				       i % k, gid[i], rid[i]);
			continue;
		}
		double rel = fabs((double)gw[i] - rw[i]) / (fabs(rw[i]) > 1e-30 ? fabs(rw[i]) : 1e-30);
		if (!isfinite(gw[i]) || rel > 1e-6)
			bad_w++;
		maxrel = rel > maxrel ? rel : maxrel;
	}
	OPS_CHECK(bad_ids == 0, "%s: %d expert ids differ", rc_->name, bad_ids);
	OPS_CHECK(bad_w == 0, "%s: %d weights off (max rel %.3g)", rc_->name, bad_w, maxrel);
	printf("%-40s %d tokens: ids equal, weights max rel err %.2g\n", rc_->name, n, maxrel);
out:
	kcuda_free(d_lg);
	kcuda_free(d_b);
	ops_dbuf_fini(&ib);
	ops_dbuf_fini(&wb);
	free(lg);
	free(bias);
	free(rid);
	free(gid);
	free(rw);
	free(gw);
	free(scr);
}

/* Which kcuda_moe_ffn path a call takes (kernels.h, moe_mma.h): the tensor-core path for the
 * K-quants and Q8_0 at D, F multiples of 256 up to 256 tokens unless TANDEM_MOE_FAST=0; else the
 * pair kernels up to 16 tokens, the sorted kernels up to 256 (unless TANDEM_MOE_SORTED=0), grouped. */
static bool mma_type(int t)
{
	return t == KT_Q4_K || t == KT_Q5_K || t == KT_Q6_K || t == KT_Q8_0;
}
/* the small path's token limit under the current switches (moe_mma.h) */
static int small_max(void)
{
	const char *v = getenv("TANDEM_MOE_SMALL"), *m = getenv("TANDEM_MOE_SMALL_MAX");
	if (v && strcmp(v, "0") == 0)
		return 0;
	if (m && *m) {
		const long x = strtol(m, NULL, 10);
		return x < 0 ? 0 : x > 16 ? 16 : (int)x;
	}
	return 4; /* MOE_SMALL_DEFAULT_TOKENS */
}
static const char *ffn_path(int type, int dtype, int n, int k, int shexp, int64_t D, int64_t F)
{
	const char *f = getenv("TANDEM_MOE_FAST");
	if ((!f || strcmp(f, "0") != 0) && mma_type(type) && mma_type(dtype) && D % 256 == 0 &&
	    F % 256 == 0 && n <= 256)
		return n <= small_max() && n * (k + (shexp ? 1 : 0)) <= 80 ? "small" : "mma";
	if (n <= 16 && D % 16 == 0 && F % 16 == 0)
		return "pairs";
	return n <= 256 && kcuda_moe_ffn_sync_free_max() > 16 ? "sorted" : "grouped";
}

struct fdims {
	const char *name;
	int64_t E, F, D;
	int k;
	int shexp; /* also a shared expert of the routed experts' shape (kcuda_moe_ffn_shexp) */
};

static struct kpool *pool; /* threads for the CPU reference */
/* expert ids of ffn_case: 0 distinct per token (as the router gives), 1 every pair one of two
 * experts (ids repeat inside a token: legal input, chunks of 4 on the small path) */
static int id_mode;
/* activations uniform in [-g_xscale, g_xscale): 1, or 1e5..1e6 for the fp16 range cases (the
 * tensor-core units stage x as fp16 hi / lo; a unit reaching 2^15 is staged scaled) */
static float g_xscale = 1.0f;
/* 1: every third sub-block of 32 x cancels exactly (pairs +v, -v: its sum, which the mins product of
 * the Q4_K / Q5_K units takes, is 0), and every third token has one element of 4e4 in one unit (the
 * fp16 range vote restages that unit of that token scaled, its sums with it) */
static int g_xalt;
/* up's type when >= 0 and not gate's (a GGUF may give them different types: kcuda_moe_ffn's split
 * path); -1: up has gate's type */
static int g_utype = -1;
/* the one-launch batch-1 kernel (moe_persist.cu) must take the call: exactly one launch, no error
 * counted (a grid-barrier timeout would count one) */
static int g_want_persist;

/* kcuda_moe_ffn, or kcuda_moe_ffn_shexp with the case's shared expert */
static int run_ffn(const struct fdims *fd, void *x, int n, void *ids, void *w, const struct kweight *g,
                   const struct kweight *u, const struct kweight *d, const struct kweight *sg,
                   const struct kweight *su, const struct kweight *sd, void *out)
{
	if (fd->shexp)
		return kcuda_moe_ffn_shexp(ctx, x, fd->D, n, ids, w, fd->k, g, u, d, fd->E, fd->F, sg, su, sd,
		                           out, fd->D);
	return kcuda_moe_ffn(ctx, x, fd->D, n, ids, w, fd->k, g, u, d, fd->E, fd->F, out, fd->D);
}

/* gate / up of `type`, down of `dtype` (Q4_K_M files keep some ffn_down_exps in Q6_K) */
static void ffn_case(const struct fdims *fd, int type, int dtype, int n, double tol)
{
	const int64_t E = fd->E, F = fd->F, D = fd->D;
	const int k = fd->k;
	const int64_t np = (int64_t)n * k;
	size_t rb_d = 0, rb_f = 0;
	/* rows a type's blocks do not tile (ds-tiny's F 128 for a K-quant down) fall back to Q8_0, as
	 * the model files do (mkmodel; llama.cpp's quantizer) */
	if (!ktype_row_bytes(type, D, &rb_d) || rb_d == 0)
		type = KT_Q8_0, ktype_row_bytes(type, D, &rb_d);
	if (!ktype_row_bytes(dtype, F, &rb_f) || rb_f == 0)
		dtype = KT_Q8_0, ktype_row_bytes(dtype, F, &rb_f);
	int utype = g_utype >= 0 ? g_utype : type;
	size_t rb_u = 0;
	if (!ktype_row_bytes(utype, D, &rb_u) || rb_u == 0)
		utype = type, rb_u = rb_d;
	const struct ktype_info *ti = ktype_get(type);
	uint8_t *hg = malloc(rb_d * (size_t)(E * F)), *hu = malloc(rb_u * (size_t)(E * F)),
	        *hd = malloc(rb_f * (size_t)(E * D));
	float *x = malloc(sizeof(float) * (size_t)(n * D)), *ref = calloc((size_t)(n * D), sizeof(float));
	float *got = malloc(sizeof(float) * (size_t)(n * D)), *w = malloc(sizeof(float) * (size_t)np);
	float *again = malloc(sizeof(float) * (size_t)(n * D));
	int32_t *ids = malloc(sizeof(int32_t) * (size_t)np), *tok = malloc(sizeof(int32_t) * (size_t)np);
	/* an expert's rows in the CPU chain: up to np of them (ids may repeat inside a token, id_mode 1) */
	float *xs = malloc(sizeof(float) * (size_t)(np * D)), *t1 = malloc(sizeof(float) * (size_t)(np * F)),
	      *t2 = malloc(sizeof(float) * (size_t)(np * F)), *ys = malloc(sizeof(float) * (size_t)(np * D));
	float *yp = malloc(sizeof(float) * (size_t)(np * D)); /* per pair, summed in slot order below */
	uint8_t *sg = NULL, *su = NULL, *sd = NULL;
	struct kweight hsg = {type, D, F, rb_d, NULL}, hsu = hsg, hsd = {dtype, F, D, rb_f, NULL};
	struct kweight dsg = {0}, dsu = {0}, dsd = {0};
	struct kweight g = {type, D, E * F, rb_d, hg}, u = {utype, D, E * F, rb_u, hu},
	               dn = {dtype, F, E * D, rb_f, hd};
	struct kweight dg = {0}, du = {0}, dd = {0};
	void *d_x = NULL, *d_ids = NULL, *d_w = NULL;
	struct ops_dbuf ob = {0};
	const char *path = utype != type ? "split" : ffn_path(type, dtype, n, k, fd->shexp, D, F);
	if (!hg || !hu || !hd || !x || !ref || !got || !w || !again || !ids || !tok || !xs || !t1 || !t2 ||
	    !ys || !yp) {
		OPS_CHECK(0, "moe ffn %s: host allocation", fd->name);
		goto out;
	}
	ops_fill_weight(type, D, E * F, rb_d, hg);
	ops_fill_weight(utype, D, E * F, rb_u, hu);
	ops_fill_weight(dtype, F, E * D, rb_f, hd);
	for (int64_t i = 0; i < n * D; i++) {
		x[i] = g_xscale * ops_rng_unif();
		const int64_t t = i / D, e = i % D;
		if (g_xalt && (e / 32) % 3 == 0 && (e & 1))
			x[i] = -x[i - 1];
		if (g_xalt && t % 3 == 0 && e == 256 * ((t / 3) % (D / 256)) + 5)
			x[i] = 4e4f;
	}
	if (fd->shexp) {
		hsg.data = sg = malloc(rb_d * (size_t)F);
		hsu.data = su = malloc(rb_d * (size_t)F);
		hsd.data = sd = malloc(rb_f * (size_t)D);
		if (!sg || !su || !sd) {
			OPS_CHECK(0, "moe ffn %s: host allocation", fd->name);
			goto out;
		}
		ops_fill_weight(type, D, F, rb_d, sg);
		ops_fill_weight(type, D, F, rb_d, su);
		ops_fill_weight(dtype, F, D, rb_f, sd);
	}
	for (int i = 0; i < n; i++)
		for (int j = 0; j < k; j++) {
			int32_t e;
			int dup;
			if (id_mode == 1) {
				ids[i * k + j] = (int32_t)((i + j) % 2 + E / 2);
				w[i * k + j] = ops_rng_unif() + 1.5f;
				continue;
			}
			do { /* distinct experts per token */
				e = (int32_t)(ops_rng_next() % (uint64_t)E);
				dup = 0;
				for (int jj = 0; jj < j; jj++)
					dup |= ids[i * k + jj] == e;
			} while (dup);
			ids[i * k + j] = e;
			w[i * k + j] = ops_rng_unif() + 1.5f;
		}
	/* CPU: forward.c's expert chain (gate, up, SiLU * up, down) per expert on its tokens, then
	 * out[i] = sum_j w[i][j] y[i][j] in slot order */
	for (int64_t e = 0; e < E; e++) {
		int64_t m = 0;
		for (int64_t p = 0; p < np; p++)
			if (ids[p] == e) {
				tok[m] = (int32_t)p;
				memcpy(xs + m * D, x + (p / k) * D, sizeof(float) * (size_t)D);
				m++;
			}
		if (!m)
			continue;
		struct kweight eg = g, eu = u, ed = dn;
		eg.n_out = eu.n_out = F;
		ed.n_out = D;
		eg.data = hg + (size_t)e * F * rb_d;
		eu.data = hu + (size_t)e * F * rb_u;
		ed.data = hd + (size_t)e * D * rb_f;
		kcpu_matmul(pool, &eg, xs, D, m, t1, F);
		kcpu_matmul(pool, &eu, xs, D, m, t2, F);
		kcpu_swiglu(t1, t1, t2, m * F);
		kcpu_matmul(pool, &ed, t1, F, m, ys, D);
		for (int64_t r = 0; r < m; r++)
			memcpy(yp + (int64_t)tok[r] * D, ys + r * D, sizeof(float) * (size_t)D);
	}
	for (int64_t p = 0; p < np; p++)
		for (int64_t d = 0; d < D; d++)
			ref[(p / k) * D + d] += w[p] * yp[p * D + d];
	if (fd->shexp) { /* the shared expert on all tokens, added with weight 1 (backend_cpu.c) */
		kcpu_matmul(pool, &hsg, x, D, n, t1, F);
		kcpu_matmul(pool, &hsu, x, D, n, t2, F);
		kcpu_swiglu(t1, t1, t2, n * F);
		kcpu_matmul(pool, &hsd, t1, F, n, ys, D);
		for (int64_t i = 0; i < n * D; i++)
			ref[i] += ys[i];
	}
	if (kcuda_weight_upload(ctx, &g, &dg) || kcuda_weight_upload(ctx, &u, &du) ||
	    kcuda_weight_upload(ctx, &dn, &dd) || kcuda_alloc(sizeof(float) * (size_t)(n * D), &d_x) ||
	    kcuda_alloc(sizeof(int32_t) * (size_t)np, &d_ids) ||
	    kcuda_alloc(sizeof(float) * (size_t)np, &d_w) ||
	    ops_dbuf_init(ctx, &ob, sizeof(float) * (size_t)(n * D)) ||
	    (fd->shexp && (kcuda_weight_upload(ctx, &hsg, &dsg) || kcuda_weight_upload(ctx, &hsu, &dsu) ||
	                   kcuda_weight_upload(ctx, &hsd, &dsd)))) {
		OPS_CHECK(0, "moe ffn %s %s: device allocation", fd->name, ti->name);
		goto out;
	}
	kcuda_upload(ctx, d_x, x, sizeof(float) * (size_t)(n * D));
	kcuda_upload(ctx, d_ids, ids, sizeof(int32_t) * (size_t)np);
	kcuda_upload(ctx, d_w, w, sizeof(float) * (size_t)np);
	const unsigned long long l0 = kcuda_n_launch;
	int rc = run_ffn(fd, d_x, n, d_ids, d_w, &dg, &du, &dd, &dsg, &dsu, &dsd, ob.user);
	if (g_want_persist) {
		const unsigned long long nl = kcuda_n_launch - l0;
		unsigned nerr = 0;
		const int synced = rc == 0 && kcuda_sync(ctx) == 0 && kcuda_ctx_take_errors(ctx, &nerr) == 0;
		OPS_CHECK(
		    synced && nl == 1 && nerr == 0,
		    "moe ffn %s %s/%s n %d: the one-launch kernel did not run alone (%llu launches, rc %d, "
		    "%u errors counted)",
		    fd->name, ti->name, ktype_name(dtype), n, nl, rc, nerr);
	}
	const int tc = !strcmp(path, "mma") || !strcmp(path, "small"); /* tensor-core paths */
	if (fd->shexp && !tc) { /* only the tensor-core paths take the shared expert */
		OPS_CHECK(rc == ERR_UNSUPPORTED,
		          "moe ffn %s %s n %d (%s): shared expert: rc %d, not ERR_UNSUPPORTED", fd->name,
		          ti->name, n, path, rc);
		printf("moe ffn %-12s %-5s down %-5s n %3d (%s): shared expert refused (ERR_UNSUPPORTED)\n",
		       fd->name, ti->name, ktype_name(dtype), n, path);
		goto out;
	}
	OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0, "moe ffn %s %s/%s n %d: rc %d", fd->name, ti->name,
	          ktype_name(dtype), n, rc);
	size_t gb = ops_dbuf_get(ctx, &ob, got);
	OPS_CHECK(gb == 0, "moe ffn %s %s n %d: %zu guard bytes damaged", fd->name, ti->name, n, gb);
	double maxref = 0, maxerr = 0;
	int64_t nf = 0;
	for (int64_t i = 0; i < n * D; i++) {
		if (!isfinite(got[i])) {
			nf++;
			continue;
		}
		maxref = fabs(ref[i]) > maxref ? fabs(ref[i]) : maxref;
		double e = fabs((double)got[i] - ref[i]);
		maxerr = e > maxerr ? e : maxerr;
	}
	OPS_CHECK(nf == 0, "moe ffn %s %s n %d: %lld non-finite", fd->name, ti->name, n, (long long)nf);
	OPS_CHECK(maxerr <= tol * maxref,
	          "moe ffn %s %s/%s n %d (%s): max err %.3g, max|ref| %.3g (tol %.0e)", fd->name, ti->name,
	          ktype_name(dtype), n, path, maxerr, maxref, tol);
	/* determinism: a second run gives the same bits */
	rc = run_ffn(fd, d_x, n, d_ids, d_w, &dg, &du, &dd, &dsg, &dsu, &dsd, ob.user);
	OPS_CHECK(rc == 0 && ops_dbuf_get(ctx, &ob, again) == 0 &&
	              memcmp(again, got, sizeof(float) * (size_t)(n * D)) == 0,
	          "moe ffn %s %s n %d (%s): two runs differ", fd->name, ti->name, n, path);
	printf("moe ffn %-12s %-5s down %-5s n %3d (%s)%s: max|ref| %.3g max err %.3g (rel %.2g)\n", fd->name,
	       ti->name, ktype_name(dtype), n, path, g_xscale != 1.0f ? " large x" : "", maxref, maxerr,
	       maxref > 0 ? maxerr / maxref : 0.0);
	/* the sorted path sums each pair in the pair kernels' order: the same bits, token by token;
	 * the mma path's columns are computed independently: also the same bits token by token
	 * (reported, not required: it rests on the tensor core's per-column order) */
	if (!strcmp(path, "sorted") || (tc && n > 1)) {
		float *one = malloc(sizeof(float) * (size_t)D);
		int same = one != NULL;
		for (int i = 0; i < n && same; i++) {
			rc = run_ffn(fd, (float *)d_x + i * D, 1, (int32_t *)d_ids + i * k,
			             (float *)d_w + i * k, &dg, &du, &dd, &dsg, &dsu, &dsd, ob.user);
			same = rc == 0 && ops_dbuf_get(ctx, &ob, got) == 0 &&
			       memcmp(got, again + i * D, sizeof(float) * (size_t)D) == 0;
		}
		if (!strcmp(path, "sorted"))
			OPS_CHECK(same, "moe ffn %s n %d: sorted path differs from the pair kernels",
			          ti->name, n);
		else
			printf("  %s path token by token: %s\n", path,
			       same ? "same bits" : "differs (not an error)");
		free(one);
	}
	/* the small path against the sorted one (one n-tile: the same unit bodies on the same
	 * columns, so the same bits are expected; reported, not required) */
	if (!strcmp(path, "small")) {
		setenv("TANDEM_MOE_SMALL", "0", 1);
		setenv("TANDEM_MOE_MMA_NG", "1", 1);
		rc = run_ffn(fd, d_x, n, d_ids, d_w, &dg, &du, &dd, &dsg, &dsu, &dsd, ob.user);
		unsetenv("TANDEM_MOE_SMALL");
		unsetenv("TANDEM_MOE_MMA_NG");
		const int same = rc == 0 && ops_dbuf_get(ctx, &ob, got) == 0 &&
		                 memcmp(got, again, sizeof(float) * (size_t)(n * D)) == 0;
		double mx = 0;
		for (int64_t i = 0; rc == 0 && i < n * D; i++)
			mx = fmax(mx, fabs((double)got[i] - again[i]));
		OPS_CHECK(rc == 0 && mx <= tol * maxref,
		          "moe ffn %s n %d: small and sorted paths differ by %.3g", ti->name, n, mx);
		printf("  small vs sorted path: %s (max diff %.3g)\n", same ? "same bits" : "differ", mx);
	}
	/* x's int8 parts made by the norm before (kfuse_add_rmsnorm_parts): the one-token Q4_K / Q5_K
	 * chunks copy them instead of quantizing x in every block; the same bits required. y = rmsnorm(x)
	 * (weight 1) with its parts, the op on y, then the op on y with the parts forgotten; and a call
	 * on other rows (x) while the parts of y are held must not use them (the reference above) */
	if (!strcmp(path, "small") && (type == KT_Q4_K || type == KT_Q5_K) && D % 256 == 0) {
		void *d_h = NULL, *d_y = NULL, *d_nw = NULL;
		float *ones = malloc(sizeof(float) * (size_t)D),
		      *with = malloc(sizeof(float) * (size_t)(n * D));
		int ok = ones && with && !kcuda_alloc(sizeof(float) * (size_t)(n * D), &d_h) &&
		         !kcuda_alloc(sizeof(float) * (size_t)(n * D), &d_y) &&
		         !kcuda_alloc(sizeof(float) * (size_t)D, &d_nw);
		if (ok) {
			for (int64_t i = 0; i < D; i++)
				ones[i] = 1.0f;
			kcuda_upload(ctx, d_nw, ones, sizeof(float) * (size_t)D);
			kcuda_upload(ctx, d_h, x, sizeof(float) * (size_t)(n * D));
			ok = kfuse_add_rmsnorm_parts(ctx, d_h, NULL, d_y, d_nw, D, n, 1e-6f) == 0;
			const int made = ok && kcuda_xparts_of(ctx) == (const float *)d_y;
			rc = run_ffn(fd, d_x, n, d_ids, d_w, &dg, &du, &dd, &dsg, &dsu, &dsd, ob.user);
			const int other = rc == 0 && ops_dbuf_get(ctx, &ob, got) == 0 &&
			                  memcmp(got, again, sizeof(float) * (size_t)(n * D)) == 0;
			rc = run_ffn(fd, d_y, n, d_ids, d_w, &dg, &du, &dd, &dsg, &dsu, &dsd, ob.user);
			ok = ok && rc == 0 && ops_dbuf_get(ctx, &ob, with) == 0;
			/* the parts staged once a block against the parts copied by every warp for each unit
			 * (TANDEM_MOE_XBLK=0): the same bits, with D whole (on: `with`) and split over two
			 * gate / up blocks (TANDEM_MOE_SMALL_SPLIT=2: the second stages units u0 > 0, read at
			 * xs[u - u0]); the split result near the whole one (other sums, not the same bits) */
			float *sp2 = malloc(sizeof(float) * (size_t)(n * D));
			/* the caller's split (a case may run under TANDEM_MOE_SMALL_SPLIT=3): put back after
			 * the forced split 2, so `with` and the runs below use the same one */
			const char *sp_env = getenv("TANDEM_MOE_SMALL_SPLIT");
			char sp_save[16] = "";
			if (sp_env)
				snprintf(sp_save, sizeof(sp_save), "%s", sp_env);
			/* the calls below read y and must leave it as it is (y before, y after them) */
			float *y0 = malloc(sizeof(float) * (size_t)(n * D)),
			      *y1 = malloc(sizeof(float) * (size_t)(n * D));
			const int y0_ok =
			    y0 && kcuda_download(ctx, y0, d_y, sizeof(float) * (size_t)(n * D)) == 0;
			for (int split = 1; split <= 2; split++) {
				float *on = split == 1 ? with : sp2;
				if (split == 2) {
					setenv("TANDEM_MOE_SMALL_SPLIT", "2", 1);
					rc = run_ffn(fd, d_y, n, d_ids, d_w, &dg, &du, &dd, &dsg, &dsu, &dsd,
					             ob.user);
				}
				int xsame =
				    on && (split == 1 ? ok : rc == 0 && ops_dbuf_get(ctx, &ob, on) == 0);
				setenv("TANDEM_MOE_XBLK", "0", 1);
				rc =
				    run_ffn(fd, d_y, n, d_ids, d_w, &dg, &du, &dd, &dsg, &dsu, &dsd, ob.user);
				unsetenv("TANDEM_MOE_XBLK");
				if (sp_save[0])
					setenv("TANDEM_MOE_SMALL_SPLIT", sp_save, 1);
				else
					unsetenv("TANDEM_MOE_SMALL_SPLIT");
				xsame = xsame && rc == 0 && ops_dbuf_get(ctx, &ob, got) == 0 &&
				        memcmp(got, on, sizeof(float) * (size_t)(n * D)) == 0;
				OPS_CHECK(
				    xsame,
				    "moe ffn %s n %d split %d: the parts staged once a block differ from the "
				    "parts copied per unit (TANDEM_MOE_XBLK=0)",
				    ti->name, n, split);
			}
			const int y_same =
			    y0_ok && y1 &&
			    kcuda_download(ctx, y1, d_y, sizeof(float) * (size_t)(n * D)) == 0 &&
			    memcmp(y0, y1, sizeof(float) * (size_t)(n * D)) == 0;
			OPS_CHECK(y_same, "moe ffn %s n %d: the calls changed their input x", ti->name, n);
			free(y0);
			free(y1);
			double sp_mx = 0;
			for (int64_t i = 0; sp2 && i < n * D; i++)
				sp_mx = fmax(sp_mx, fabs((double)sp2[i] - with[i]));
			OPS_CHECK(sp2 && sp_mx <= tol * maxref,
			          "moe ffn %s n %d: split 2 differs from split 1 by %.3g", ti->name, n,
			          sp_mx);
			free(sp2);
			kcuda_xparts_forget(ctx);
			rc = run_ffn(fd, d_y, n, d_ids, d_w, &dg, &du, &dd, &dsg, &dsu, &dsd, ob.user);
			ok = ok && rc == 0 && ops_dbuf_get(ctx, &ob, got) == 0;
			const int same = ok && memcmp(got, with, sizeof(float) * (size_t)(n * D)) == 0;
			if (ok && !same) { /* where, and by how much (triage) */
				int64_t nd = 0, first = -1;
				double dmx = 0;
				for (int64_t i = 0; i < n * D; i++)
					if (memcmp(&got[i], &with[i], sizeof(float))) {
						nd++, first = first < 0 ? i : first;
						dmx = fmax(dmx, fabs((double)got[i] - with[i]));
					}
				printf("  parts vs none: %lld of %lld differ, first at token %lld row %lld, "
				       "max %.3g (max|ref| %.3g)\n",
				       (long long)nd, (long long)(n * D), (long long)(first / D),
				       (long long)(first % D), dmx, maxref);
			}
			OPS_CHECK(made, "moe ffn %s n %d: kfuse_add_rmsnorm_parts left no parts (D %lld)",
			          ti->name, n, (long long)D);
			OPS_CHECK(other,
			          "moe ffn %s n %d: a call on other rows changed while parts were held",
			          ti->name, n);
			OPS_CHECK(same,
			          "moe ffn %s %s n %d: the op with the norm's int8 parts differs from the op "
			          "quantizing x itself",
			          fd->name, ti->name, n);
			printf("  with the norm's int8 parts: %s\n", same ? "same bits" : "DIFFER");
		} else
			OPS_CHECK(0, "moe ffn %s: parts check: allocation", fd->name);
		kcuda_xparts_forget(ctx);
		kcuda_free(d_h);
		kcuda_free(d_y);
		kcuda_free(d_nw);
		free(ones);
		free(with);
	}
	/* one token: moe_one.cu's kernels or moe_persist.cu's against moe_small's (moe_one: the same unit
	 * arithmetic in the same order, the same bits expected, reported; persist: sums over D grouped per
	 * block; within the tolerance required) */
	const char *one_env = getenv("TANDEM_MOE_SMALL_V");
	if (!strcmp(path, "small") && n == 1 && (g_want_persist || !(one_env && !strcmp(one_env, "old")))) {
		char keep[16] = "";
		if (one_env)
			snprintf(keep, sizeof(keep), "%s", one_env);
		setenv("TANDEM_MOE_SMALL_V", "old", 1);
		setenv("TANDEM_MOE_PERSIST", "0", 1);
		rc = run_ffn(fd, d_x, n, d_ids, d_w, &dg, &du, &dd, &dsg, &dsu, &dsd, ob.user);
		if (g_want_persist)
			setenv("TANDEM_MOE_PERSIST", "1", 1);
		if (keep[0])
			setenv("TANDEM_MOE_SMALL_V", keep, 1);
		else
			unsetenv("TANDEM_MOE_SMALL_V");
		const int same = rc == 0 && ops_dbuf_get(ctx, &ob, got) == 0 &&
		                 memcmp(got, again, sizeof(float) * (size_t)(n * D)) == 0;
		double mx = 0;
		for (int64_t i = 0; rc == 0 && i < n * D; i++)
			mx = fmax(mx, fabs((double)got[i] - again[i]));
		OPS_CHECK(rc == 0 && mx <= tol * maxref,
		          "moe ffn %s n 1: batch-1 and moe_small kernels differ by %.3g", ti->name, mx);
		printf("  batch-1 %s vs moe_small's: %s (max diff %.3g)\n",
		       g_want_persist ? "one-launch kernel" : "kernels", same ? "same bits" : "differ", mx);
		/* an id out of range in the last slot: counted, the token NaN, nothing read (memcheck) */
		int32_t bad = (int32_t)E;
		unsigned nbad = 0;
		kcuda_ctx_take_errors(ctx, &nbad);
		nbad = 0;
		kcuda_upload(ctx, (int32_t *)d_ids + (k - 1), &bad, sizeof(int32_t));
		rc = run_ffn(fd, d_x, n, d_ids, d_w, &dg, &du, &dd, &dsg, &dsu, &dsd, ob.user);
		OPS_CHECK(
		    rc == 0 && kcuda_sync(ctx) == 0 && kcuda_ctx_take_errors(ctx, &nbad) == 0 && nbad > 0 &&
		        ops_dbuf_get(ctx, &ob, got) == 0 && isnan(got[0]) && isnan(got[D - 1]),
		    "moe ffn %s n 1: bad expert id not counted (%u), or the token not NaN", ti->name, nbad);
		kcuda_upload(ctx, d_ids, ids, sizeof(int32_t) * (size_t)np);
	}
	/* an expert id out of range is reported, not read */
	if (n == 3 || n == 8 || (n == 40 && strcmp(path, "grouped"))) { /* grouped: refused on the host */
		int32_t bad = (int32_t)E;
		kcuda_upload(ctx, d_ids, &bad, sizeof(int32_t));
		unsigned nbad = 0;
		rc = run_ffn(fd, d_x, n, d_ids, d_w, &dg, &du, &dd, &dsg, &dsu, &dsd, ob.user);
		OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0 && kcuda_ctx_take_errors(ctx, &nbad) == 0 &&
		              nbad > 0 && ops_dbuf_get(ctx, &ob, got) == 0 && isnan(got[0]) &&
		              isfinite(got[D]),
		          "moe ffn %s: bad expert id not counted, or token 0 not NaN / token 1 not finite",
		          ti->name);
	}
out:
	kcuda_weight_free(&dg);
	kcuda_weight_free(&du);
	kcuda_weight_free(&dd);
	kcuda_weight_free(&dsg);
	kcuda_weight_free(&dsu);
	kcuda_weight_free(&dsd);
	kcuda_free(d_x);
	kcuda_free(d_ids);
	kcuda_free(d_w);
	ops_dbuf_fini(&ob);
	free(sg);
	free(su);
	free(sd);
	free(hg);
	free(hu);
	free(hd);
	free(x);
	free(ref);
	free(got);
	free(again);
	free(w);
	free(ids);
	free(tok);
	free(xs);
	free(t1);
	free(t2);
	free(ys);
	free(yp);
}

/* The model's chain: router logits from kcuda_matmul with the F32 router weight, then
 * kcuda_moe_route; against kcpu_matmul + kcpu_moe_route. Logits differ by fp32 rounding, so an id may
 * differ only where the CPU's two candidates are within 1e-5 of each other in selection score. */
static void route_chain(void)
{
	const int n = 64, E = 256, k = 8;
	const int64_t D = 1024;
	float *wr = malloc(sizeof(float) * (size_t)(E * D)), *x = malloc(sizeof(float) * (size_t)(n * D));
	float *lg = malloc(sizeof(float) * (size_t)(n * E)), *bias = malloc(sizeof(float) * (size_t)E);
	float *rw = malloc(sizeof(float) * (size_t)(n * k)), *gw = malloc(sizeof(float) * (size_t)(n * k));
	float *scr = malloc(sizeof(float) * 2 * (size_t)E), *sel = malloc(sizeof(float) * (size_t)E);
	int32_t *rid = malloc(sizeof(int32_t) * (size_t)(n * k)),
	        *gid = malloc(sizeof(int32_t) * (size_t)(n * k));
	struct kweight hw = {KT_F32, D, E, (size_t)D * 4, wr}, dw = {0};
	void *d_x = NULL, *d_lg = NULL, *d_b = NULL, *d_id = NULL, *d_w = NULL;
	for (int64_t i = 0; i < E * D; i++)
		wr[i] = ops_rng_unif() * 0.05f;
	for (int64_t i = 0; i < n * D; i++)
		x[i] = ops_rng_unif();
	for (int e = 0; e < E; e++)
		bias[e] = ops_rng_unif() * 0.1f;
	kcpu_matmul(NULL, &hw, x, D, n, lg, E);
	for (int i = 0; i < n; i++)
		kcpu_moe_route(lg + i * E, bias, E, k, 8, 4, 0, true, 2.5f, rid + i * k, rw + i * k, scr);
	if (kcuda_weight_upload(ctx, &hw, &dw) || kcuda_alloc(sizeof(float) * (size_t)(n * D), &d_x) ||
	    kcuda_alloc(sizeof(float) * (size_t)(n * E), &d_lg) ||
	    kcuda_alloc(sizeof(float) * (size_t)E, &d_b) ||
	    kcuda_alloc(sizeof(int32_t) * (size_t)(n * k), &d_id) ||
	    kcuda_alloc(sizeof(float) * (size_t)(n * k), &d_w)) {
		OPS_CHECK(0, "route chain: device allocation");
		goto out;
	}
	kcuda_upload(ctx, d_x, x, sizeof(float) * (size_t)(n * D));
	kcuda_upload(ctx, d_b, bias, sizeof(float) * (size_t)E);
	int rc = kcuda_matmul(ctx, &dw, d_x, D, n, d_lg, E);
	if (!rc)
		rc = kcuda_moe_route(ctx, d_lg, E, d_b, n, E, k, 8, 4, 0, true, 2.5f, d_id, d_w);
	OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0, "route chain: rc %d", rc);
	kcuda_download(ctx, gid, d_id, sizeof(int32_t) * (size_t)(n * k));
	kcuda_download(ctx, gw, d_w, sizeof(float) * (size_t)(n * k));
	int same = 0, near = 0, bad = 0;
	for (int i = 0; i < n; i++) {
		/* CPU selection scores of this token (biased probabilities; group limit ignored here:
		 * a differing id must at least be a near-tie of the plain biased scores) */
		for (int e = 0; e < E; e++)
			sel[e] = 1.0f / (1.0f + expf(-lg[i * E + e])) + bias[e];
		for (int j = 0; j < k; j++) {
			const int32_t a = rid[i * k + j], b = gid[i * k + j];
			if (a == b) {
				same++;
				continue;
			}
			if (b >= 0 && b < E && fabsf(sel[a] - sel[b]) <= 1e-5f)
				near++;
			else
				bad++;
		}
	}
	OPS_CHECK(bad == 0, "route chain: %d ids differ beyond near-ties", bad);
	OPS_CHECK(same >= n * k * 9 / 10, "route chain: only %d of %d ids equal", same, n * k);
	printf("route chain (kcuda_matmul F32 router + route, E 256 g8/4): %d of %d ids equal, %d near-tie "
	       "swaps\n",
	       same, n * k, near);
out:
	kcuda_weight_free(&dw);
	kcuda_free(d_x);
	kcuda_free(d_lg);
	kcuda_free(d_b);
	kcuda_free(d_id);
	kcuda_free(d_w);
	free(wr);
	free(x);
	free(lg);
	free(bias);
	free(rw);
	free(gw);
	free(scr);
	free(sel);
	free(rid);
	free(gid);
}

/* The batch-1 kernels (moe_one.cu) in the decode order under PDL: a long producer writes x last
 * (kfwd_scale over 128 MB ending in x / 2), then the router product, the route (it writes ids and
 * weights) and the expert launches back to back; three runs with different x, the ids buffer
 * holding the previous run's ids; and two runs with the producer right before the experts. The down kernel
 * reads the ids before its own wait (MO_EARLY) and gate / up starts the shared expert's loads before its
 * wait: a kernel that read x or the ids before their producers finished would see the old values. Reference:
 * the same expert call on the downloaded x, ids and weights, alone on an idle stream (ffn_case checks it
 * against the CPU): the same bits required. */
static void one_chain(const struct fdims *fd, int type, int dtype, int n_group, int n_group_used, int fold)
{
	const int64_t E = fd->E, F = fd->F, D = fd->D, pad = (int64_t)32 << 20;
	const int k = fd->k;
	size_t rb_d = 0, rb_f = 0;
	ktype_row_bytes(type, D, &rb_d);
	ktype_row_bytes(dtype, F, &rb_f);
	uint8_t *hg = malloc(rb_d * (size_t)(E * F)), *hu = malloc(rb_d * (size_t)(E * F)),
	        *hd = malloc(rb_f * (size_t)(E * D)), *sg = malloc(rb_d * (size_t)F),
	        *su = malloc(rb_d * (size_t)F), *sd = malloc(rb_f * (size_t)D);
	float *wr = malloc(sizeof(float) * (size_t)(E * D)), *x = malloc(sizeof(float) * (size_t)D),
	      *xh = malloc(sizeof(float) * (size_t)D), *got = malloc(sizeof(float) * (size_t)D),
	      *ref = malloc(sizeof(float) * (size_t)D), *gw = malloc(sizeof(float) * (size_t)k);
	int32_t *gid = malloc(sizeof(int32_t) * (size_t)k), *prev = calloc((size_t)k, sizeof(int32_t));
	struct kweight g = {type, D, E * F, rb_d, hg}, u = {type, D, E * F, rb_d, hu},
	               dn = {dtype, F, E * D, rb_f, hd};
	struct kweight hsg = {type, D, F, rb_d, sg}, hsu = {type, D, F, rb_d, su},
	               hsd = {dtype, F, D, rb_f, sd};
	struct kweight hw = {KT_F32, D, E, (size_t)D * 4, wr};
	struct kweight dg = {0}, du = {0}, ddn = {0}, dsg = {0}, dsu = {0}, dsd = {0}, dw = {0};
	float *buf = NULL, *d_lg = NULL, *d_w = NULL, *d_x2 = NULL, *d_w2 = NULL, *d_bias = NULL;
	float *bias = malloc(sizeof(float) * (size_t)E), *rw2 = malloc(sizeof(float) * (size_t)k);
	int32_t *rid2 = malloc(sizeof(int32_t) * (size_t)k);
	int route_diff = 0;
	int32_t *d_id = NULL, *d_id2 = NULL;
	struct ops_dbuf ob = {0};
	int bad = 0, changed = 0;
	if (!hg || !hu || !hd || !sg || !su || !sd || !wr || !x || !xh || !got || !ref || !gw || !gid ||
	    !prev || !bias || !rw2 || !rid2) {
		OPS_CHECK(0, "one chain %s: host allocation", fd->name);
		goto out;
	}
	ops_fill_weight(type, D, E * F, rb_d, hg);
	ops_fill_weight(type, D, E * F, rb_d, hu);
	ops_fill_weight(dtype, F, E * D, rb_f, hd);
	ops_fill_weight(type, D, F, rb_d, sg);
	ops_fill_weight(type, D, F, rb_d, su);
	ops_fill_weight(dtype, F, D, rb_f, sd);
	for (int64_t i = 0; i < E * D; i++)
		wr[i] = ops_rng_unif() * 0.05f;
	if (kcuda_weight_upload(ctx, &g, &dg) || kcuda_weight_upload(ctx, &u, &du) ||
	    kcuda_weight_upload(ctx, &dn, &ddn) || kcuda_weight_upload(ctx, &hsg, &dsg) ||
	    kcuda_weight_upload(ctx, &hsu, &dsu) || kcuda_weight_upload(ctx, &hsd, &dsd) ||
	    kcuda_weight_upload(ctx, &hw, &dw) ||
	    kcuda_alloc(sizeof(float) * (size_t)(pad + D), (void **)&buf) ||
	    kcuda_alloc(sizeof(float) * (size_t)E, (void **)&d_lg) ||
	    kcuda_alloc(sizeof(int32_t) * (size_t)k, (void **)&d_id) ||
	    kcuda_alloc(sizeof(float) * (size_t)k, (void **)&d_w) ||
	    kcuda_alloc(sizeof(float) * (size_t)D, (void **)&d_x2) ||
	    kcuda_alloc(sizeof(int32_t) * (size_t)k, (void **)&d_id2) ||
	    kcuda_alloc(sizeof(float) * (size_t)k, (void **)&d_w2) ||
	    kcuda_alloc(sizeof(float) * (size_t)E, (void **)&d_bias) ||
	    ops_dbuf_init(ctx, &ob, sizeof(float) * (size_t)D)) {
		OPS_CHECK(0, "one chain %s: device allocation", fd->name);
		goto out;
	}
	for (int64_t e = 0; e < E; e++)
		bias[e] = ops_rng_unif() * 0.1f;
	kcuda_upload(ctx, d_bias, bias, sizeof(float) * (size_t)E);
	for (int rep = 0; rep < 5; rep++) {
		/* even runs: producer, router, route, experts; odd runs: the producer right before the
		 * experts (the ids of the run before) */
		const int route = rep % 2 == 0;
		for (int64_t i = 0; i < D; i++)
			x[i] = ops_rng_unif(), xh[i] = 0.5f * x[i]; /* exact: x = 2 (x / 2) */
		int rc = kcuda_memset(ctx, buf, 0, sizeof(float) * (size_t)pad);
		rc = rc ? rc : kcuda_upload(ctx, buf + pad, xh, sizeof(float) * (size_t)D);
		if (route)
			rc = rc ? rc : kcuda_upload(ctx, d_id, prev, sizeof(int32_t) * (size_t)k);
		rc = rc ? rc : kcuda_sync(ctx);
		rc = rc ? rc : kfwd_scale(ctx, buf, pad + D, 2.0f); /* x written last */
		if (route)
			rc = rc ? rc : kcuda_matmul(ctx, &dw, buf + pad, D, 1, d_lg, E);
		if (route && fold) { /* the route inside the expert launches */
			const unsigned long long l0 = kcuda_n_launch;
			const int r1 =
			    rc ? rc
			       : kcuda_moe_route_ffn1(ctx, d_lg, d_bias, (int)E, k, n_group, n_group_used, 0,
			                              true, 2.5f, d_id, d_w, buf + pad, &dg, &du, &ddn, F,
			                              &dsg, &dsu, &dsd, ob.user);
			OPS_CHECK(r1 != ERR_UNSUPPORTED, "one chain %s: route_ffn1 refused", fd->name);
			OPS_CHECK(
			    !g_want_persist || r1 != 0 || kcuda_n_launch - l0 == 1,
			    "one chain %s: route_ffn1 made %llu launches, not the one-launch kernel's 1",
			    fd->name, kcuda_n_launch - l0);
			rc = r1;
		} else {
			if (route)
				rc = rc ? rc
				        : kcuda_moe_route(ctx, d_lg, E, d_bias, 1, (int)E, k, n_group,
				                          n_group_used, 0, true, 2.5f, d_id, d_w);
			rc = rc ? rc
			        : kcuda_moe_ffn_shexp(ctx, buf + pad, D, 1, d_id, d_w, k, &dg, &du, &ddn, E,
			                              F, &dsg, &dsu, &dsd, ob.user, D);
		}
		rc = rc ? rc : kcuda_sync(ctx);
		OPS_CHECK(rc == 0, "one chain %s rep %d: rc %d", fd->name, rep, rc);
		if (rc)
			goto out;
		size_t gb = ops_dbuf_get(ctx, &ob, got);
		kcuda_download(ctx, gid, d_id, sizeof(int32_t) * (size_t)k);
		kcuda_download(ctx, gw, d_w, sizeof(float) * (size_t)k);
		changed += route && memcmp(gid, prev, sizeof(int32_t) * (size_t)k) != 0;
		if (route) { /* the route kernel on the same logits: the same ids and weight bits */
			rc = kcuda_moe_route(ctx, d_lg, E, d_bias, 1, (int)E, k, n_group, n_group_used, 0,
			                     true, 2.5f, d_id2, d_w2);
			rc = rc ? rc : kcuda_sync(ctx);
			kcuda_download(ctx, rid2, d_id2, sizeof(int32_t) * (size_t)k);
			kcuda_download(ctx, rw2, d_w2, sizeof(float) * (size_t)k);
			route_diff += rc != 0 || memcmp(rid2, gid, sizeof(int32_t) * (size_t)k) != 0 ||
			              memcmp(rw2, gw, sizeof(float) * (size_t)k) != 0;
		}
		/* the reference: the same call alone, on the values the chain produced */
		rc = kcuda_upload(ctx, d_x2, x, sizeof(float) * (size_t)D);
		rc = rc ? rc : kcuda_upload(ctx, d_id2, gid, sizeof(int32_t) * (size_t)k);
		rc = rc ? rc : kcuda_upload(ctx, d_w2, gw, sizeof(float) * (size_t)k);
		rc = rc ? rc : kcuda_sync(ctx);
		rc = rc ? rc
		        : kcuda_moe_ffn_shexp(ctx, d_x2, D, 1, d_id2, d_w2, k, &dg, &du, &ddn, E, F, &dsg,
		                              &dsu, &dsd, ob.user, D);
		rc = rc ? rc : kcuda_sync(ctx);
		OPS_CHECK(rc == 0 && gb == 0 && ops_dbuf_get(ctx, &ob, ref) == 0,
		          "one chain %s rep %d: rc %d, guard %zu", fd->name, rep, rc, gb);
		for (int64_t i = 0; i < D; i++)
			if (memcmp(&got[i], &ref[i], sizeof(float)) != 0 && bad++ < 3)
				printf("  one chain %s rep %d row %lld: chain %.9g alone %.9g\n", fd->name,
				       rep, (long long)i, got[i], ref[i]);
		memcpy(prev, gid, sizeof(int32_t) * (size_t)k);
	}
	OPS_CHECK(bad == 0,
	          "one chain %s: %d outputs differ from the call alone (a read before its producer?)",
	          fd->name, bad);
	OPS_CHECK(route_diff == 0, "one chain %s: %d runs whose ids / weights differ from kcuda_moe_route's",
	          fd->name, route_diff);
	OPS_CHECK(changed >= 2, "one chain %s: the ids changed in only %d of 3 routed runs", fd->name,
	          changed);
	printf("batch-1 chain %s %s/%s groups %d/%d%s%s (producer, router, route, experts: 3 runs, ids "
	       "changed in "
	       "%d; producer, experts: 2 runs): %s\n",
	       fd->name, ktype_name(type), ktype_name(dtype), n_group_used, n_group,
	       fold ? ", route folded in (kcuda_moe_route_ffn1)" : "", g_want_persist ? ", one launch" : "",
	       changed, bad ? "FAIL" : "same bits as alone");
out:
	kcuda_weight_free(&dg);
	kcuda_weight_free(&du);
	kcuda_weight_free(&ddn);
	kcuda_weight_free(&dsg);
	kcuda_weight_free(&dsu);
	kcuda_weight_free(&dsd);
	kcuda_weight_free(&dw);
	kcuda_free(buf);
	kcuda_free(d_lg);
	kcuda_free(d_id);
	kcuda_free(d_w);
	kcuda_free(d_x2);
	kcuda_free(d_id2);
	kcuda_free(d_w2);
	kcuda_free(d_bias);
	ops_dbuf_fini(&ob);
	free(hg);
	free(hu);
	free(hd);
	free(sg);
	free(su);
	free(sd);
	free(wr);
	free(x);
	free(xh);
	free(got);
	free(ref);
	free(gw);
	free(gid);
	free(prev);
	free(bias);
	free(rw2);
	free(rid2);
}

/* kcuda_moe_route_ffn1 declines (ERR_UNSUPPORTED, nothing enqueued) where it does not apply and
 * rejects null pointers (-EINVAL) */
static void route_ffn1_refusals(void)
{
	const int64_t E = 256, F = 256, D = 512;
	size_t rb_d = 0, rb_f = 0;
	ktype_row_bytes(KT_Q4_K, D, &rb_d);
	ktype_row_bytes(KT_Q4_K, F, &rb_f);
	/* descriptors only: the refusals are decided before any data is read (device pointers are
	 * never dereferenced on the host) */
	void *d_any = NULL;
	if (kcuda_alloc(64, &d_any)) {
		OPS_CHECK(0, "route_ffn1 refusals: device allocation");
		return;
	}
	struct kweight g = {KT_Q4_K, D, E * F, rb_d, d_any}, dn = {KT_Q4_K, F, E * D, rb_f, d_any};
	struct kweight sg = {KT_Q4_K, D, F, rb_d, d_any}, sd = {KT_Q4_K, F, D, rb_f, d_any};
	struct kweight g6 = g, dq8 = dn;
	g6.type = KT_Q6_K;
	ktype_row_bytes(KT_Q6_K, D, &g6.row_bytes);
	dq8.type = KT_Q8_0;
	ktype_row_bytes(KT_Q8_0, F, &dq8.row_bytes);
	float *fp = (float *)d_any;
	int32_t *ip = (int32_t *)d_any;
	int rc = kcuda_moe_route_ffn1(ctx, NULL, NULL, (int)E, 8, 1, 1, 0, true, 1.f, ip, fp, fp, &g, &g, &dn,
	                              F, &sg, &sg, &sd, fp);
	OPS_CHECK(rc == -EINVAL, "route_ffn1: null logits: rc %d", rc);
	setenv("TANDEM_MOE_SMALL_V", "new", 1); /* both kernels selected: the shapes decide */
	rc = kcuda_moe_route_ffn1(ctx, fp, NULL, 64, 8, 1, 1, 0, true, 1.f, ip, fp, fp, &g, &g, &dn, F, &sg,
	                          &sg, &sd, fp); /* E 64: V 2, not the folded route's 8 (and shapes off) */
	OPS_CHECK(rc == ERR_UNSUPPORTED, "route_ffn1: E 64: rc %d", rc);
	rc = kcuda_moe_route_ffn1(ctx, fp, NULL, (int)E, 8, 1, 1, 0, true, 1.f, ip, fp, fp, &g6, &g6, &dn, F,
	                          &sg, &sg, &sd, fp);
	OPS_CHECK(rc == ERR_UNSUPPORTED, "route_ffn1: Q6_K gate: rc %d", rc);
	rc = kcuda_moe_route_ffn1(ctx, fp, NULL, (int)E, 8, 1, 1, 0, true, 1.f, ip, fp, fp, &g, &g, &dq8, F,
	                          &sg, &sg, &sd, fp);
	OPS_CHECK(rc == ERR_UNSUPPORTED, "route_ffn1: Q8_0 down: rc %d", rc);
	unsetenv("TANDEM_MOE_SMALL_V");
	rc = kcuda_moe_route_ffn1(ctx, fp, NULL, (int)E, 8, 1, 1, 0, true, 1.f, ip, fp, fp, &g, &g, &dn, F,
	                          &sg, &sg, &sd, fp);
	OPS_CHECK(rc == ERR_UNSUPPORTED, "route_ffn1: the default (only the new down kernel): rc %d", rc);
	setenv("TANDEM_MOE_SMALL_V", "new", 1);
	setenv("TANDEM_MOE_ONE_ROUTE", "0", 1);
	rc = kcuda_moe_route_ffn1(ctx, fp, NULL, (int)E, 8, 1, 1, 0, true, 1.f, ip, fp, fp, &g, &g, &dn, F,
	                          &sg, &sg, &sd, fp);
	OPS_CHECK(rc == ERR_UNSUPPORTED, "route_ffn1: TANDEM_MOE_ONE_ROUTE=0: rc %d", rc);
	unsetenv("TANDEM_MOE_ONE_ROUTE");
	unsetenv("TANDEM_MOE_SMALL_V");
	setenv("TANDEM_MOE_SMALL_V", "old", 1);
	rc = kcuda_moe_route_ffn1(ctx, fp, NULL, (int)E, 8, 1, 1, 0, true, 1.f, ip, fp, fp, &g, &g, &dn, F,
	                          &sg, &sg, &sd, fp);
	OPS_CHECK(rc == ERR_UNSUPPORTED, "route_ffn1: TANDEM_MOE_SMALL_V=old: rc %d", rc);
	unsetenv("TANDEM_MOE_SMALL_V");
	/* the one-launch kernel on: the shapes it does not take still fall through to a refusal */
	setenv("TANDEM_MOE_PERSIST", "1", 1);
	rc = kcuda_moe_route_ffn1(ctx, fp, NULL, 64, 8, 1, 1, 0, true, 1.f, ip, fp, fp, &g, &g, &dn, F, &sg,
	                          &sg, &sd, fp);
	OPS_CHECK(rc == ERR_UNSUPPORTED, "route_ffn1 (persist on): E 64: rc %d", rc);
	rc = kcuda_moe_route_ffn1(ctx, fp, NULL, (int)E, 8, 1, 1, 0, true, 1.f, ip, fp, fp, &g6, &g6, &dn, F,
	                          &sg, &sg, &sd, fp);
	OPS_CHECK(rc == ERR_UNSUPPORTED, "route_ffn1 (persist on): Q6_K gate: rc %d", rc);
	rc = kcuda_moe_route_ffn1(ctx, fp, NULL, (int)E, 8, 1, 1, 0, true, 1.f, ip, fp, fp, &g, &g, &dq8, F,
	                          &sg, &sg, &sd, fp);
	OPS_CHECK(rc == ERR_UNSUPPORTED, "route_ffn1 (persist on): Q8_0 down: rc %d", rc);
	setenv("TANDEM_MOE_PERSIST", "0", 1);
	OPS_CHECK(kcuda_sync(ctx) == 0, "route_ffn1 refusals: stream error");
	printf(
	    "route_ffn1 refusals: null logits -EINVAL; E 64, Q6_K gate, Q8_0 down, the default (down only), "
	    "TANDEM_MOE_ONE_ROUTE=0, TANDEM_MOE_SMALL_V=old: ERR_UNSUPPORTED; with the one-launch kernel on: "
	    "E 64, Q6_K gate, Q8_0 down ERR_UNSUPPORTED\n");
	kcuda_free(d_any);
}

/* mode bits of router_route_case2: RR_BITS the logits must be the bits of kcuda_matmul_path(KCUDA_MM_F32)
 * (moe6's kernel runs gemv3's product and plan); RR_LATE x is written by a late PDL producer
 * (kcuda_pdl_late_copy, ~30 us) launched right before each call, x holding NaN until then: a read of
 * x before the kernel's griddepcontrol.wait shows as NaN logits */
#define RR_BITS 1
#define RR_LATE 2
static void router_route_case2(const char *name, int E, int k, int n_group, int n_used, int gating, int norm,
                               float scale, int64_t D, int n, int ties, int mode);
static void router_route_case(const char *name, int E, int k, int n_group, int n_used, int gating, int norm,
                              float scale, int64_t D, int n, int ties);

/* kcuda_moe_router_route (router product + route in one launch, moe_route.cu) against the CPU
 * chain kcpu_matmul + kcpu_moe_route. Logits within 2e-5 of sum|w x| of the CPU's; the ids and
 * weights against kcpu_moe_route run on the GPU's own logits (ids equal, ties to the lower id,
 * weights within 1e-6) and against kcuda_moe_route on them (the same bits); ties: some router rows
 * are copies of others, so their logits tie exactly. Runs three times (the ticket resets itself):
 * the same bits. pf: a dummy expert buffer for the prefetch addresses. Guard bytes on all outputs. */
static void router_route_case2(const char *name, int E, int k, int n_group, int n_used, int gating, int norm,
                               float scale, int64_t D, int n, int ties, int mode)
{
	float *wr = malloc(sizeof(float) * (size_t)(E * D)), *x = malloc(sizeof(float) * (size_t)(n * D));
	float *lg = malloc(sizeof(float) * (size_t)(n * E)), *glg = malloc(sizeof(float) * (size_t)(n * E));
	float *glg2 = malloc(sizeof(float) * (size_t)(n * E)), *bias = malloc(sizeof(float) * (size_t)E);
	float *rw = malloc(sizeof(float) * (size_t)(n * k)), *gw = malloc(sizeof(float) * (size_t)(n * k));
	float *gw2 = malloc(sizeof(float) * (size_t)(n * k)), *scr = malloc(sizeof(float) * 2 * (size_t)E);
	double *sabs = malloc(sizeof(double) * (size_t)(n * E));
	int32_t *rid = malloc(sizeof(int32_t) * (size_t)(n * k)),
	        *gid = malloc(sizeof(int32_t) * (size_t)(n * k)),
	        *gid2 = malloc(sizeof(int32_t) * (size_t)(n * k));
	struct kweight hw = {KT_F32, D, E, (size_t)D * 4, wr}, dw = {0};
	void *d_x = NULL, *d_b = NULL, *d_pf = NULL, *d_xs = NULL;
	struct ops_dbuf lb = {0}, ib = {0}, wb = {0}, ib2 = {0}, wb2 = {0}, lb2 = {0};
	if (!wr || !x || !lg || !glg || !glg2 || !bias || !rw || !gw || !gw2 || !scr || !sabs || !rid ||
	    !gid || !gid2) {
		OPS_CHECK(0, "%s: host allocation", name);
		goto out;
	}
	for (int64_t i = 0; i < E * D; i++)
		wr[i] = ops_rng_unif() * 0.05f;
	int n_copies = 0;
	if (ties) /* rows 16 j + 5 = rows 16 j + 3: equal logits, the lower id must win */
		for (int e = 5; e < E; e += 16, n_copies++)
			memcpy(wr + (int64_t)e * D, wr + (int64_t)(e - 2) * D, sizeof(float) * (size_t)D);
	for (int64_t i = 0; i < n * D; i++)
		x[i] = ops_rng_unif();
	for (int e = 0; e < E; e++)
		bias[e] = ties ? 0.0f : ops_rng_unif() * 0.1f; /* equal biases where the rows tie */
	kcpu_matmul(NULL, &hw, x, D, n, lg, E);
	for (int i = 0; i < n; i++)
		for (int e = 0; e < E; e++) {
			double a = 0;
			for (int64_t j = 0; j < D; j++)
				a += fabs((double)wr[(int64_t)e * D + j] * x[(int64_t)i * D + j]);
			sabs[i * E + e] = a;
		}
	const size_t pf_bytes = (size_t)E * 4096 + 3 * 8192;
	if (kcuda_weight_upload(ctx, &hw, &dw) || kcuda_alloc(sizeof(float) * (size_t)(n * D), &d_x) ||
	    kcuda_alloc(sizeof(float) * (size_t)E, &d_b) || kcuda_alloc(pf_bytes, &d_pf) ||
	    ops_dbuf_init(ctx, &lb, sizeof(float) * (size_t)(n * E)) ||
	    ops_dbuf_init(ctx, &ib, sizeof(int32_t) * (size_t)(n * k)) ||
	    ops_dbuf_init(ctx, &wb, sizeof(float) * (size_t)(n * k)) ||
	    ops_dbuf_init(ctx, &ib2, sizeof(int32_t) * (size_t)(n * k)) ||
	    ops_dbuf_init(ctx, &wb2, sizeof(float) * (size_t)(n * k)) ||
	    ops_dbuf_init(ctx, &lb2, sizeof(float) * (size_t)(n * E)) ||
	    kcuda_alloc(sizeof(float) * (size_t)(n * D), &d_xs)) {
		OPS_CHECK(0, "%s: device allocation", name);
		goto out;
	}
	kcuda_upload(ctx, d_x, x, sizeof(float) * (size_t)(n * D));
	kcuda_upload(ctx, d_xs, x, sizeof(float) * (size_t)(n * D));
	kcuda_upload(ctx, d_b, bias, sizeof(float) * (size_t)E);
	uint8_t *pfb = d_pf;
	const struct kcuda_moe_pf pf = {pfb,
	                                pfb,
	                                pfb,
	                                2048,
	                                4096,
	                                pfb + (size_t)E * 4096,
	                                pfb + (size_t)E * 4096 + 8192,
	                                pfb + (size_t)E * 4096 + 16384,
	                                8192,
	                                8192};
	int same = 1;
	for (int run = 0; run < 3; run++) {
		int rc = 0;
		if (mode & RR_LATE) { /* x = NaN until the late producer copies it (~30 us after its start) */
			void *dst[1] = {d_x};
			const void *src[1] = {d_xs};
			const size_t nb[1] = {sizeof(float) * (size_t)(n * D)};
			rc = kcuda_memset(ctx, d_x, 0xff, nb[0]);
			if (!rc)
				rc = kcuda_sync(ctx);
			if (!rc)
				rc = kcuda_pdl_late_copy(ctx, 1, dst, src, nb, 30.0);
		}
		if (!rc)
			rc = kcuda_moe_router_route(ctx, &dw, d_x, D, n, lb.user, d_b, E, k, n_group, n_used,
			                            gating, norm, scale, ib.user, wb.user,
			                            run == 1 ? NULL : &pf);
		OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0, "%s n %d: rc %d", name, n, rc);
		if (rc)
			goto out;
		size_t g = ops_dbuf_get(ctx, &lb, run ? glg2 : glg) +
		           ops_dbuf_get(ctx, &ib, run ? gid2 : gid) + ops_dbuf_get(ctx, &wb, run ? gw2 : gw);
		OPS_CHECK(g == 0, "%s n %d: %zu guard bytes damaged", name, n, g);
		if (run)
			same &= !memcmp(glg, glg2, sizeof(float) * (size_t)(n * E)) &&
			        !memcmp(gid, gid2, sizeof(int32_t) * (size_t)(n * k)) &&
			        !memcmp(gw, gw2, sizeof(float) * (size_t)(n * k));
	}
	OPS_CHECK(same, "%s n %d: three runs differ", name, n);
	int bits = -1; /* RR_BITS: logits equal to the two-launch path's product (-1: not asked) */
	if (mode & RR_BITS) {
		/* gemv3's product: the dispatch's default takes gemv_res for 1-2 token products up to
		 * 8 MB (another summation order), which the fused kernel does not reproduce */
		const char *res = getenv("TANDEM_GEMV_RES");
		char res_saved[16] = "";
		if (res)
			snprintf(res_saved, sizeof(res_saved), "%s", res);
		setenv("TANDEM_GEMV_RES", "0", 1);
		int rc = kcuda_matmul_path(ctx, KCUDA_MM_F32, &dw, d_x, D, n, lb2.user, E);
		if (res)
			setenv("TANDEM_GEMV_RES", res_saved, 1);
		else
			unsetenv("TANDEM_GEMV_RES");
		OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0 && ops_dbuf_get(ctx, &lb2, glg2) == 0,
		          "%s n %d: the unfused product failed (rc %d)", name, n, rc);
		bits = !memcmp(glg, glg2, sizeof(float) * (size_t)(n * E));
		OPS_CHECK(bits, "%s n %d: logits differ from kcuda_matmul_path(KCUDA_MM_F32)'s bits", name,
		          n);
	}
	double maxl = 0;
	int bad_l = 0;
	for (int i = 0; i < n * E; i++) {
		const double e = fabs((double)glg[i] - lg[i]) / (sabs[i] > 1e-30 ? sabs[i] : 1e-30);
		maxl = e > maxl ? e : maxl;
		bad_l += !(e <= 2e-5);
	}
	OPS_CHECK(bad_l == 0, "%s n %d: %d logits off (max %.3g of sum|wx|)", name, n, bad_l, maxl);
	/* the route on the GPU's logits: the CPU's and the standalone kernel's */
	int bad_ids = 0, bad_w = 0, tie_pairs = 0;
	double maxrel = 0;
	for (int i = 0; i < n; i++) {
		kcpu_moe_route(glg + i * E, d_b ? bias : NULL, E, k, n_group, n_used, gating, norm, scale,
		               rid + i * k, rw + i * k, scr);
		for (int e = 5; ties && e < E; e += 16)
			for (int j = 0; j < k; j++)
				tie_pairs += rid[i * k + j] == e - 2; /* the tied copy had to lose */
	}
	for (int i = 0; i < n * k; i++) {
		if (gid[i] != rid[i]) {
			if (bad_ids++ < 3)
				printf("  %s: token %d slot %d: gpu expert %d, cpu %d\n", name, i / k, i % k,
				       gid[i], rid[i]);
			continue;
		}
		const double rel = fabs((double)gw[i] - rw[i]) / (fabs(rw[i]) > 1e-30 ? fabs(rw[i]) : 1e-30);
		bad_w += !isfinite(gw[i]) || rel > 1e-6;
		maxrel = rel > maxrel ? rel : maxrel;
	}
	OPS_CHECK(bad_ids == 0, "%s n %d: %d ids differ from kcpu_moe_route on the same logits", name, n,
	          bad_ids);
	OPS_CHECK(bad_w == 0, "%s n %d: %d weights off (max rel %.3g)", name, n, bad_w, maxrel);
	int rc = kcuda_moe_route(ctx, lb.user, E, d_b, n, E, k, n_group, n_used, gating, norm, scale,
	                         ib2.user, wb2.user);
	OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0 && ops_dbuf_get(ctx, &ib2, gid2) == 0 &&
	              ops_dbuf_get(ctx, &wb2, gw2) == 0 &&
	              !memcmp(gid, gid2, sizeof(int32_t) * (size_t)(n * k)) &&
	              !memcmp(gw, gw2, sizeof(float) * (size_t)(n * k)),
	          "%s n %d: differs from kcuda_moe_route on its logits", name, n);
	printf("%-44s n %d D %5lld: logits max err %.2g of sum|wx|%s, ids equal, weights rel %.2g, %d "
	       "tied copies chosen (lower id kept)%s\n",
	       name, n, (long long)D, maxl, bits == 1 ? " (= the product's bits)" : "", maxrel, tie_pairs,
	       mode & RR_LATE ? ", x from a late PDL producer" : "");
	(void)n_copies;
out:
	kcuda_weight_free(&dw);
	kcuda_free(d_x);
	kcuda_free(d_b);
	kcuda_free(d_pf);
	kcuda_free(d_xs);
	ops_dbuf_fini(&lb2);
	ops_dbuf_fini(&lb);
	ops_dbuf_fini(&ib);
	ops_dbuf_fini(&wb);
	ops_dbuf_fini(&ib2);
	ops_dbuf_fini(&wb2);
	free(wr);
	free(x);
	free(lg);
	free(glg);
	free(glg2);
	free(bias);
	free(rw);
	free(gw);
	free(gw2);
	free(scr);
	free(sabs);
	free(rid);
	free(gid);
	free(gid2);
}

static void router_route_case(const char *name, int E, int k, int n_group, int n_used, int gating, int norm,
                              float scale, int64_t D, int n, int ties)
{
	router_route_case2(name, E, k, n_group, n_used, gating, norm, scale, D, n, ties, 0);
}

/* shapes and switches kcuda_moe_router_route hands back (ERR_UNSUPPORTED, nothing enqueued) */
static void router_route_refusals(void)
{
	const int64_t D = 512;
	const int E = 64, k = 4;
	float *wr = calloc((size_t)(E * D), sizeof(float));
	struct kweight hw = {KT_F32, D, E, (size_t)D * 4, wr}, dw = {0};
	void *d_x = NULL, *d_o = NULL;
	if (!wr || kcuda_weight_upload(ctx, &hw, &dw) || kcuda_alloc(sizeof(float) * 16 * (size_t)D, &d_x) ||
	    kcuda_alloc(sizeof(float) * 16 * (size_t)E * 3, &d_o)) {
		OPS_CHECK(0, "router_route refusals: allocation");
		goto out;
	}
	float *lo = d_o, *wo = lo + 16 * E;
	int32_t *io = (int32_t *)(wo + 16 * E);
	setenv("TANDEM_MOE_ROUTE_FUSE", "1", 1);
	OPS_CHECK(kcuda_moe_router_route(ctx, &dw, d_x, D, 9, lo, NULL, E, k, 1, 1, 0, true, 1.f, io, wo,
	                                 NULL) == ERR_UNSUPPORTED,
	          "router_route: 9 tokens not refused");
	unsetenv("TANDEM_MOE_ROUTE_FUSE");
	setenv("TANDEM_MOE_ROUTER_FUSED", "2", 1); /* moe4's kernel up to 2 tokens */
	OPS_CHECK(kcuda_moe_router_route(ctx, &dw, d_x, D, 3, lo, NULL, E, k, 1, 1, 0, true, 1.f, io, wo,
	                                 NULL) == ERR_UNSUPPORTED,
	          "router_route: 3 tokens taken with TANDEM_MOE_ROUTER_FUSED=2");
	unsetenv("TANDEM_MOE_ROUTER_FUSED");
	OPS_CHECK(kcuda_moe_router_route(ctx, &dw, d_x, D, 1, lo, NULL, E, k, 1, 1, 0, true, 1.f, io, wo,
	                                 NULL) == ERR_UNSUPPORTED,
	          "router_route: taken by default (moe6's kernel is off unless TANDEM_MOE_ROUTE_FUSE=1)");
	setenv("TANDEM_MOE_ROUTE_FUSE", "0", 1); /* moe6's kernel off: the two launches */
	OPS_CHECK(kcuda_moe_router_route(ctx, &dw, d_x, D, 1, lo, NULL, E, k, 1, 1, 0, true, 1.f, io, wo,
	                                 NULL) == ERR_UNSUPPORTED,
	          "router_route: taken with TANDEM_MOE_ROUTE_FUSE=0");
	setenv("TANDEM_MOE_ROUTE_FUSE", "1", 1); /* on: the shape refusals below are moe6's */
	struct kweight odd = dw;
	odd.n_in = 448; /* D % 128 != 0 (moe6's kernel; moe4's takes D % 16 == 0 only when asked) */
	OPS_CHECK(kcuda_moe_router_route(ctx, &odd, d_x, D, 1, lo, NULL, E, k, 1, 1, 0, true, 1.f, io, wo,
	                                 NULL) == ERR_UNSUPPORTED,
	          "router_route: D 448 not refused");
	unsetenv("TANDEM_MOE_ROUTE_FUSE");
	odd = dw;
	odd.n_in = 504; /* D % 16 != 0 */
	OPS_CHECK(kcuda_moe_router_route(ctx, &odd, d_x, D, 1, lo, NULL, E, k, 1, 1, 0, true, 1.f, io, wo,
	                                 NULL) == ERR_UNSUPPORTED,
	          "router_route: D 504 not refused");
	odd = dw;
	odd.type = KT_BF16;
	OPS_CHECK(kcuda_moe_router_route(ctx, &odd, d_x, D, 1, lo, NULL, E, k, 1, 1, 0, true, 1.f, io, wo,
	                                 NULL) == ERR_UNSUPPORTED,
	          "router_route: a BF16 router not refused");
	OPS_CHECK(kcuda_moe_router_route(ctx, &dw, d_x, D, 1, lo, NULL, E, 70, 1, 1, 0, true, 1.f, io, wo,
	                                 NULL) == -EINVAL,
	          "router_route: k > E accepted");
	setenv("TANDEM_MOE_ROUTER_FUSED", "0", 1);
	OPS_CHECK(kcuda_moe_router_route(ctx, &dw, d_x, D, 1, lo, NULL, E, k, 1, 1, 0, true, 1.f, io, wo,
	                                 NULL) == ERR_UNSUPPORTED,
	          "router_route: TANDEM_MOE_ROUTER_FUSED=0 not honoured");
	unsetenv("TANDEM_MOE_ROUTER_FUSED");
	OPS_CHECK(kcuda_sync(ctx) == 0, "router_route refusals: stream error");
	printf("router_route: 9 tokens, 3 with TANDEM_MOE_ROUTER_FUSED=2, 1 by default and with "
	       "TANDEM_MOE_ROUTE_FUSE=0, D 448 "
	       "and 504, BF16 router, TANDEM_MOE_ROUTER_FUSED=0 refused; k > E rejected\n");
out:
	kcuda_weight_free(&dw);
	kcuda_free(d_x);
	kcuda_free(d_o);
	free(wr);
}

static void test_args(void)
{
	float *f = (float *)16;
	int32_t *ids = (int32_t *)16;
	OPS_CHECK(kcuda_moe_route(ctx, f, 256, NULL, 1, 256, 300, 1, 1, 0, true, 1.0f, ids, f) == -EINVAL,
	          "route: k > E accepted");
	OPS_CHECK(kcuda_moe_route(ctx, f, 100, NULL, 1, 256, 8, 1, 1, 0, true, 1.0f, ids, f) == -EINVAL,
	          "route: ld < E accepted");
	OPS_CHECK(kcuda_moe_route(ctx, f, 2048, NULL, 1, 2048, 8, 1, 1, 0, true, 1.0f, ids, f) == ERR_LIMIT,
	          "route: E > 1024 accepted");
	OPS_CHECK(kcuda_moe_route(ctx, f, 250, NULL, 1, 250, 8, 8, 4, 0, true, 1.0f, ids, f) == -EINVAL,
	          "route: E not a multiple of n_group accepted");
	size_t rb = 0;
	ktype_row_bytes(KT_Q8_0, 512, &rb);
	struct kweight g = {KT_Q8_0, 512, 4 * 256, rb, f}, d = {KT_Q8_0, 256, 4 * 512, 0, f};
	ktype_row_bytes(KT_Q8_0, 256, &d.row_bytes);
	struct kweight gb = g;
	gb.n_out = 5 * 256;
	OPS_CHECK(kcuda_moe_ffn(ctx, f, 512, 1, ids, f, 2, &gb, &g, &d, 4, 256, f, 512) == -EINVAL,
	          "ffn: gate rows != E*F accepted");
	gb = g;
	gb.row_bytes += 2;
	OPS_CHECK(kcuda_moe_ffn(ctx, f, 512, 1, ids, f, 2, &gb, &gb, &d, 4, 256, f, 512) == -EINVAL,
	          "ffn: wrong row_bytes accepted");
	OPS_CHECK(kcuda_moe_ffn(ctx, f, 100, 1, ids, f, 2, &g, &g, &d, 4, 256, f, 512) == -EINVAL,
	          "ffn: ldx < D accepted");
	gb = d;
	gb.type = KT_Q4_K; /* a down type of its own is fine, but its row_bytes must fit it */
	OPS_CHECK(kcuda_moe_ffn(ctx, f, 512, 1, ids, f, 2, &g, &g, &gb, 4, 256, f, 512) == -EINVAL,
	          "ffn: down row_bytes of another type accepted");
	gb = g;
	gb.type = KT_Q4_0;
	ktype_row_bytes(KT_Q4_0, 512, &gb.row_bytes);
	OPS_CHECK(kcuda_moe_ffn(ctx, f, 512, 1, ids, f, 2, &g, &gb, &d, 4, 256, f, 512) == -EINVAL,
	          "ffn: gate and up of different types accepted");
}

int main(void)
{
	if (kcuda_device_count() < 1) {
		printf("SKIP: no CUDA device\n");
		return 77;
	}
	ops_seed_init();
	if (kcuda_ctx_create(0, 64u << 20, &ctx)) {
		printf("FAIL: no CUDA context\n");
		return 1;
	}
	const struct rcase rcs[] = {
	    {"route DeepSeek-V3 E256 k8 g8/4 sigmoid", 256, 8, 8, 4, 0, 1, 1, 2.5f},
	    {"route GLM-5 E256 k8 g1 sigmoid", 256, 8, 1, 1, 0, 1, 1, 2.5f},
	    {"route softmax E64 k6 no norm", 64, 6, 1, 1, 1, 0, 0, 1.0f},
	    {"route odd E20 k3 g5/2 sigmoid", 20, 3, 5, 2, 0, 1, 1, 1.5f},
	    {"route E192 k8 g4/2 (groups of 6 lanes)", 192, 8, 4, 2, 0, 1, 1, 1.0f},
	    {"route E512 k16 g1 softmax norm", 512, 16, 1, 1, 1, 1, 1, 1.0f},
	    {"route E160 k6 g8/3 sigmoid", 160, 6, 8, 3, 0, 1, 1, 2.0f},
	    {"route E256 k1 g8/1 sigmoid", 256, 1, 8, 1, 0, 0, 1, 1.0f},
	};
	for (int fast = 2; fast >= 0; fast--) { /* the register kernel (redux arg-max: the default; shuffle
		                                 * arg-max), then the shared-memory one */
		if (fast != 2)
			setenv("TANDEM_MOE_ROUTE_FAST", fast ? "1" : "0", 1);
		printf("route: %s kernel\n", fast == 2 ? "register (redux)"
		                             : fast    ? "register (shuffle)"
		                                       : "shared-memory");
		for (size_t i = 0; i < sizeof(rcs) / sizeof(rcs[0]); i++)
			route_case(&rcs[i]);
		unsetenv("TANDEM_MOE_ROUTE_FAST");
	}
	const int quick = getenv("TANDEM_OPS_QUICK") != NULL;
	pool = kpool_create(8);
	/* the one-launch batch-1 kernel (moe_persist.cu, off by default) off until its own part below, also
	 * where the environment turns it on, so the one-token cases here test moe_small's / moe_one's */
	setenv("TANDEM_MOE_PERSIST", "0", 1);
	/* small: the old sweep; glm5 / ds3: one TP=8 rank of GLM-5 / DeepSeek-V3 (per-rank expert
	 * slice F 256); e256: their expert count and top-k on a short D, for the large batches;
	 * glm-tiny / ds-tiny: tests/data's models (ds-tiny's F 128 takes the older kernels) */
	const struct fdims small = {"small", 12, 256, 512, 4, 0}, glm5 = {"glm5-tp8", 256, 256, 6144, 8, 0},
	                   ds3 = {"ds3-tp8", 256, 256, 7168, 8, 0}, e256 = {"e256-d512", 256, 256, 512, 8, 0},
	                   gtiny = {"glm-tiny", 4, 256, 256, 2, 0}, dtiny = {"ds-tiny", 6, 128, 256, 2, 0},
	                   glm5s = {"glm5-tp8+sh", 256, 256, 6144, 8, 1},
	                   e256s = {"e256+sh", 256, 256, 512, 8, 1},
	                   gtinys = {"glm-tiny+sh", 4, 256, 256, 2, 1},
	                   dtinys = {"ds-tiny+sh", 6, 128, 256, 2, 1};
	const int only_mma = getenv("TANDEM_OPS_ONLY_MMA") != NULL; /* see "mma:" below */
	static const char *const gu_w[] = {"0", "4", "8"}; /* TANDEM_MOE_GU_W values there */
	if (only_mma)
		goto mma;
	static const int types[] = {KT_Q8_0, KT_Q4_K, KT_Q5_K, KT_Q6_K, KT_BF16, KT_F32};
	static const int small_n[] = {1, 3, 16, 40, 128, 300};
	for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++)
		for (size_t i = 0; i < sizeof(small_n) / sizeof(small_n[0]); i++)
			if (!quick || small_n[i] == 3 || small_n[i] == 40)
				ffn_case(&small, types[t], types[t], small_n[i],
				         small_n[i] > 256 ? 2e-2 : 1e-4);
	/* glm-dsa-tiny-Q4_K_M's layer 2: Q4_K gate/up, Q6_K down (failed with -EINVAL before) */
	static const int mix_n[] = {1, 3, 16, 40, 128};
	for (size_t i = 0; i < sizeof(mix_n) / sizeof(mix_n[0]); i++)
		ffn_case(&small, KT_Q4_K, KT_Q6_K, mix_n[i], 1e-4);
	/* the codebook types of low-bit GLM-5 / DeepSeek GGUFs on the experts: moe_mma's tensor-core units
	 * (gemv_mma.cuh gm_unit_iq, session 32), and with TANDEM_MOE_FAST=0 the generic kernels they had
	 * before */
	static const int iq_pair[][2] = {
	    {KT_IQ2_XXS, KT_IQ3_S}, {KT_IQ3_XXS, KT_IQ2_S}, {KT_IQ1_M, KT_IQ1_S}, {KT_IQ2_XS, KT_Q4_K}};
	for (int generic = 0; generic < 2; generic++) {
		if (generic)
			setenv("TANDEM_MOE_FAST", "0", 1);
		for (size_t t = 0; t < sizeof(iq_pair) / sizeof(iq_pair[0]); t++)
			for (size_t i = 0; i < sizeof(mix_n) / sizeof(mix_n[0]); i++)
				if ((!quick && !generic) || mix_n[i] == 1 || mix_n[i] == 40)
					ffn_case(&small, iq_pair[t][0], iq_pair[t][1], mix_n[i], 1e-4);
		unsetenv("TANDEM_MOE_FAST");
	}
	/* gate and up of different types (the split path: gate, up and down as per-pair products) */
	static const int split_n[] = {1, 3, 17, 40};
	static const int split_t[][3] = {{KT_Q5_K, KT_Q8_0, KT_Q6_K}, {KT_IQ2_XXS, KT_IQ3_S, KT_Q4_K}};
	for (size_t t = 0; t < sizeof(split_t) / sizeof(split_t[0]); t++)
		for (size_t i = 0; i < sizeof(split_n) / sizeof(split_n[0]); i++) {
			g_utype = split_t[t][1];
			ffn_case(&small, split_t[t][0], split_t[t][2], split_n[i], 1e-4);
			ffn_case(&gtinys, split_t[t][0], split_t[t][2], split_n[i],
			         1e-4); /* shared expert refused */
			g_utype = -1;
		}
	/* the batch sweep at 256 experts top-8 */
	static const int sweep_n[] = {1, 2, 3, 8, 16, 17, 40, 128, 256};
	for (size_t i = 0; i < sizeof(sweep_n) / sizeof(sweep_n[0]); i++) {
		ffn_case(&e256, KT_Q4_K, KT_Q6_K, sweep_n[i], 1e-4);
		if (!quick)
			ffn_case(&e256, KT_Q8_0, KT_Q4_K, sweep_n[i], 1e-4);
	}
	/* the gate / up kernels of the sorted path (moe_mma.cu): x staged once a block (W warps split F;
	 * the default at two n-tiles, 4 warps) and the kernel whose warps split D (TANDEM_MOE_GU_W=0, the
	 * default at one), each forced with 4 and 8 warps at both n-tile counts, every unit type, the
	 * fp16 range vote (large x). TANDEM_OPS_ONLY_MMA=1 runs only these and the F 512 cases below (a
	 * size for compute-sanitizer). */
mma:
	/* the sub-block sums of a unit cancelling, and one unit near the fp16 range in a few tokens only
	 * (the scaled restaging, its sums scaled alike) */
	g_xalt = 1;
	ffn_case(&e256s, KT_Q4_K, KT_Q5_K, 40, 1e-4);
	ffn_case(&e256s, KT_Q5_K, KT_Q4_K, 128, 1e-4);
	setenv("TANDEM_MOE_MINS", "15", 1);
	ffn_case(&e256s, KT_Q4_K, KT_Q4_K, 17, 1e-4);
	unsetenv("TANDEM_MOE_MINS");
	g_xalt = 0;
	for (size_t i = 0; i < sizeof(gu_w) / sizeof(gu_w[0]); i++) {
		setenv("TANDEM_MOE_GU_W", gu_w[i], 1);
		printf("gate / up: TANDEM_MOE_GU_W=%s\n", gu_w[i]);
		ffn_case(&e256s, KT_Q4_K, KT_Q6_K, 17, 1e-4); /* one n-tile */
		ffn_case(&e256s, KT_Q4_K, KT_Q6_K, 128, 1e-4); /* two */
		ffn_case(&e256, KT_Q8_0, KT_Q4_K, 40, 1e-4);
		ffn_case(&e256, KT_Q6_K, KT_Q5_K, 40, 1e-4);
		ffn_case(&e256, KT_Q5_K, KT_Q8_0, 16, 1e-4);
		/* the codebook units, the shared expert of the same types riding along */
		ffn_case(&e256s, KT_IQ2_XXS, KT_IQ3_XXS, 17, 1e-4);
		ffn_case(&e256s, KT_IQ1_M, KT_IQ2_S, 128, 1e-4);
		ffn_case(&e256, KT_IQ3_S, KT_IQ1_S, 40, 1e-4);
		g_xscale = 1e5f;
		ffn_case(&e256s, KT_Q4_K, KT_Q6_K, 40, 1e-4);
		ffn_case(&e256s, KT_Q5_K, KT_Q4_K, 17, 1e-4);
		ffn_case(&e256s, KT_IQ2_XS, KT_IQ1_M, 40, 1e-4);
		g_xscale = 1.0f;
		if (!quick)
			ffn_case(&glm5s, KT_Q4_K, KT_Q4_K, 64, 1e-4);
		/* the Q4_K / Q5_K mins as a product a step in every kernel (TANDEM_MOE_MINS=0) and as one
		 * a unit from the staged sub-block sums in every kernel (=15; the default: some) */
		setenv("TANDEM_MOE_MINS", "0", 1);
		ffn_case(&e256s, KT_Q4_K, KT_Q6_K, 17, 1e-4);
		ffn_case(&e256s, KT_Q5_K, KT_Q4_K, 128, 1e-4);
		setenv("TANDEM_MOE_MINS", "15", 1);
		ffn_case(&e256s, KT_Q4_K, KT_Q6_K, 17, 1e-4);
		ffn_case(&e256, KT_Q5_K, KT_Q5_K, 16, 1e-4);
		unsetenv("TANDEM_MOE_MINS");
	}
	unsetenv("TANDEM_MOE_GU_W");
	/* F 512 (a TP=4 rank's expert slice): two units a down row, so a down warp stages each unit
	 * again for its next row group (moe_mma.cu's RG groups keep only one unit) */
	{
		const struct fdims f512 = {"f512-d512", 64, 512, 512, 8, 1};
		static const int f512_n[] = {8, 40, 128};
		for (size_t i = 0; i < sizeof(f512_n) / sizeof(f512_n[0]); i++)
			ffn_case(&f512, KT_Q4_K, KT_Q6_K, f512_n[i], 1e-4);
	}
	if (only_mma)
		goto done;
	/* the real dims (680-790 MB of experts each: a few such cases in the quick mode) */
	static const int big_n[] = {1, 2, 8, 17};
	for (size_t i = 0; i < sizeof(big_n) / sizeof(big_n[0]); i++)
		if (!quick || big_n[i] == 1 || big_n[i] == 8) {
			ffn_case(&glm5, KT_Q4_K, KT_Q4_K, big_n[i], 1e-4);
			if (!quick || big_n[i] == 8)
				ffn_case(&ds3, KT_Q4_K, KT_Q6_K, big_n[i], 1e-4);
		}
	if (!quick) {
		ffn_case(&glm5, KT_Q5_K, KT_Q8_0, 3, 1e-4);
		ffn_case(&glm5, KT_Q6_K, KT_Q6_K, 3, 1e-4);
	}
	/* the shared expert in the same launches */
	ffn_case(&glm5s, KT_Q4_K, KT_Q4_K, 1, 1e-4);
	ffn_case(&glm5s, KT_Q4_K, KT_Q6_K, 8, 1e-4);
	for (size_t i = 0; i < sizeof(sweep_n) / sizeof(sweep_n[0]); i++)
		if (!quick || sweep_n[i] == 3 || sweep_n[i] == 17)
			ffn_case(&e256s, KT_Q4_K, KT_Q6_K, sweep_n[i], 1e-4);
	ffn_case(&gtinys, KT_Q4_K, KT_Q6_K, 3, 1e-4);
	/* one-token chunks of Q4_K / Q5_K take the int8 unit by default (k45_i8.cuh, everywhere above):
	 * Q5_K at the real D, and the fp16 unit again with it switched off */
	ffn_case(&glm5, KT_Q5_K, KT_Q5_K, 1, 1e-4);
	setenv("TANDEM_MOE_I8", "0", 1);
	ffn_case(&glm5s, KT_Q4_K, KT_Q4_K, 1, 1e-4);
	ffn_case(&e256s, KT_Q4_K, KT_Q6_K, 3, 1e-4);
	ffn_case(&small, KT_Q5_K, KT_Q5_K, 3, 1e-4);
	unsetenv("TANDEM_MOE_I8");
	/* the n-tile count forced against its choice: one tile with experts of > 4 pairs (split into
	 * several chunks), two tiles at 1 and 3 tokens */
	setenv("TANDEM_MOE_MMA_NG", "1", 1);
	ffn_case(&e256s, KT_Q4_K, KT_Q6_K, 128, 1e-4);
	ffn_case(&small, KT_Q8_0, KT_Q5_K, 40, 1e-4);
	setenv("TANDEM_MOE_MMA_NG", "2", 1);
	ffn_case(&e256s, KT_Q4_K, KT_Q6_K, 1, 1e-4);
	if (!quick)
		ffn_case(&glm5, KT_Q4_K, KT_Q4_K, 3, 1e-4);
	unsetenv("TANDEM_MOE_MMA_NG");
	ffn_case(&dtinys, KT_Q4_K, KT_Q6_K, 3, 1e-4); /* F 128: ERR_UNSUPPORTED */
	static const int tiny_n[] = {1, 3, 17, 40};
	for (size_t i = 0; i < sizeof(tiny_n) / sizeof(tiny_n[0]); i++) {
		ffn_case(&gtiny, KT_Q4_K, KT_Q6_K, tiny_n[i], 1e-4);
		ffn_case(&dtiny, KT_Q4_K, KT_Q6_K, tiny_n[i], 1e-4);
	}
	setenv("TANDEM_MOE_SORTED", "0", 1); /* the grouped path at a batched-decode size */
	setenv("TANDEM_MOE_FAST", "0", 1);
	ffn_case(&small, KT_Q4_K, KT_Q6_K, 40, 2e-2);
	ffn_case(&small, KT_Q8_0, KT_Q8_0, 40, 2e-2);
	unsetenv("TANDEM_MOE_SORTED");
	/* TANDEM_MOE_FAST=0: the pair and sorted kernels on the shapes the mma path now takes */
	for (size_t i = 0; i < sizeof(mix_n) / sizeof(mix_n[0]); i++)
		ffn_case(&small, KT_Q4_K, KT_Q6_K, mix_n[i], 1e-4);
	ffn_case(&e256, KT_Q4_K, KT_Q6_K, 256, 1e-4);
	if (!quick)
		ffn_case(&glm5, KT_Q4_K, KT_Q4_K, 8, 1e-4);
	ffn_case(&e256s, KT_Q4_K, KT_Q6_K, 3, 1e-4); /* ERR_UNSUPPORTED under the switch */
	unsetenv("TANDEM_MOE_FAST");
	ffn_case(&small, KT_Q8_0, KT_BF16, 3, 1e-4); /* a float down type under a quant gate */
	/* the small-batch path (moe_small.cu) at every batch up to 8 (the default limit is 4 tokens
	 * since session 12) and the neighbours */
	setenv("TANDEM_MOE_SMALL_MAX", "8", 1);
	static const int sb_n[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17};
	for (size_t i = 0; i < sizeof(sb_n) / sizeof(sb_n[0]); i++) {
		ffn_case(&e256s, KT_Q4_K, KT_Q6_K, sb_n[i], 1e-4);
		if (!quick || sb_n[i] <= 2 || sb_n[i] == 8)
			ffn_case(&e256, KT_Q8_0, KT_Q5_K, sb_n[i], 1e-4);
		if (!quick || sb_n[i] == 5)
			ffn_case(&e256s, KT_Q5_K, KT_Q8_0, sb_n[i], 1e-4);
	}
	/* the real dims (680-790 MB of experts per case; glm5-tp8+sh at 1 and 8 tokens above): the
	 * quick mode adds DS-V3's 28 units of D (an uneven 3-way split), not under TANDEM_OPS_SMALL
	 * (compute-sanitizer runs) */
	const int ops_small = getenv("TANDEM_OPS_SMALL") != NULL;
	const struct fdims ds3s = {"ds3-tp8+sh", 256, 256, 7168, 8, 1};
	if (!ops_small)
		ffn_case(&ds3s, KT_Q4_K, KT_Q6_K, 1, 1e-4);
	if (!quick) {
		ffn_case(&glm5s, KT_Q4_K, KT_Q4_K, 5, 1e-4);
		ffn_case(&glm5s, KT_Q6_K, KT_Q6_K, 2, 1e-4);
		ffn_case(&ds3, KT_Q4_K, KT_Q6_K, 4, 1e-4);
	}
	ffn_case(&gtinys, KT_Q4_K, KT_Q6_K, 8, 1e-4);
	ffn_case(&gtiny, KT_Q8_0, KT_Q8_0, 6, 1e-4);
	id_mode = 1; /* two experts for every pair, repeated inside tokens: chunks of 4 */
	ffn_case(&e256s, KT_Q4_K, KT_Q6_K, 1, 1e-4);
	ffn_case(&e256s, KT_Q4_K, KT_Q6_K, 7, 1e-4);
	ffn_case(&e256, KT_Q8_0, KT_Q4_K, 8, 1e-4);
	id_mode = 0;
	/* gate / up split over D (1 by default), forced to 1, 2, 3 */
	setenv("TANDEM_MOE_SMALL_SPLIT", "1", 1);
	ffn_case(&e256s, KT_Q4_K, KT_Q6_K, 1, 1e-4);
	if (!quick)
		ffn_case(&glm5s, KT_Q4_K, KT_Q4_K, 2, 1e-4);
	setenv("TANDEM_MOE_SMALL_SPLIT", "2", 1);
	ffn_case(&e256s, KT_Q4_K, KT_Q6_K, 5, 1e-4);
	ffn_case(&e256, KT_Q8_0, KT_Q5_K, 8, 1e-4);
	setenv("TANDEM_MOE_SMALL_GUW", "4", 1); /* 4 warps per gate / up block */
	ffn_case(&e256s, KT_Q4_K, KT_Q6_K, 1, 1e-4);
	ffn_case(&e256s, KT_Q4_K, KT_Q4_K, 8, 1e-4);
	if (!quick)
		ffn_case(&glm5s, KT_Q4_K, KT_Q4_K, 8, 1e-4);
	unsetenv("TANDEM_MOE_SMALL_GUW");
	setenv("TANDEM_MOE_SMALL_HALF", "1", 1); /* one tile of 8 gate + 8 up rows per warp */
	ffn_case(&e256s, KT_Q4_K, KT_Q6_K, 1, 1e-4);
	ffn_case(&e256, KT_Q8_0, KT_Q5_K, 6, 1e-4);
	ffn_case(&gtinys, KT_Q5_K, KT_Q4_K, 8, 1e-4);
	setenv("TANDEM_MOE_SMALL_GUW", "4", 1);
	ffn_case(&e256s, KT_Q6_K, KT_Q8_0, 2, 1e-4);
	setenv("TANDEM_MOE_SMALL_SPLIT", "3", 1);
	ffn_case(&e256s, KT_Q4_K, KT_Q4_K, 3, 1e-4);
	if (!quick)
		ffn_case(&glm5s, KT_Q4_K, KT_Q4_K, 1, 1e-4);
	unsetenv("TANDEM_MOE_SMALL_GUW");
	unsetenv("TANDEM_MOE_SMALL_HALF");
	setenv("TANDEM_MOE_SMALL_SPLIT", "3", 1);
	ffn_case(&e256s, KT_Q5_K, KT_Q8_0, 7, 1e-4);
	ffn_case(&e256s, KT_Q4_K, KT_Q4_K, 3, 1e-4); /* D 512: two units, the split stops at 2 */
	unsetenv("TANDEM_MOE_SMALL_SPLIT");
	unsetenv("TANDEM_MOE_SMALL_MAX");
	ffn_case(&e256s, KT_Q4_K, KT_Q6_K, 4, 1e-4); /* the default limit and its neighbour */
	ffn_case(&e256s, KT_Q4_K, KT_Q6_K, 5, 1e-4);
	setenv("TANDEM_MOE_SMALL_HALF", "0", 1); /* two tiles at 1 token (the default takes one there) */
	ffn_case(&e256s, KT_Q4_K, KT_Q6_K, 1, 1e-4);
	unsetenv("TANDEM_MOE_SMALL_HALF");
	setenv("TANDEM_MOE_SMALL_MAX", "16", 1); /* the limit moved: 16 tokens of 2 + 1 pairs */
	ffn_case(&gtinys, KT_Q4_K, KT_Q6_K, 16, 1e-4);
	ffn_case(&e256s, KT_Q4_K, KT_Q6_K, 9, 1e-4); /* 90 pairs: too many, the sorted path */
	setenv("TANDEM_MOE_SMALL_MAX", "2", 1);
	ffn_case(&e256s, KT_Q4_K, KT_Q6_K, 3, 1e-4);
	unsetenv("TANDEM_MOE_SMALL_MAX");
	setenv("TANDEM_MOE_SMALL", "0", 1);
	ffn_case(&e256s, KT_Q4_K, KT_Q6_K, 2, 1e-4);
	unsetenv("TANDEM_MOE_SMALL");
	/* fp16 range: activations up to 1e5..1e6 (gate / up inputs) and so h = SiLU(g) u far past
	 * 65504 (down inputs): the small path, the sorted path, the split gate / up (h formed from
	 * partial sums), GLM-5 / DS-V3 per-rank dims, every expert type of the units */
	g_xscale = 1e6f;
	ffn_case(&glm5s, KT_Q4_K, KT_Q4_K, 1, 1e-4);
	ffn_case(&e256s, KT_Q6_K, KT_Q8_0, 3, 1e-4);
	g_xscale = 1e5f;
	ffn_case(&e256s, KT_Q5_K, KT_Q6_K, 8, 1e-4);
	ffn_case(&e256s, KT_Q8_0, KT_Q5_K, 17, 1e-4); /* the sorted path */
	setenv("TANDEM_MOE_SMALL_SPLIT", "3", 1);
	ffn_case(&e256s, KT_Q4_K, KT_Q6_K, 2, 1e-4);
	unsetenv("TANDEM_MOE_SMALL_SPLIT");
	if (!quick) {
		g_xscale = 3e5f;
		ffn_case(&ds3s, KT_Q4_K, KT_Q6_K, 4, 1e-4);
		ffn_case(&glm5s, KT_Q6_K, KT_Q6_K, 8, 1e-4);
		setenv("TANDEM_MOE_SMALL", "0", 1);
		ffn_case(&glm5s, KT_Q4_K, KT_Q4_K, 2, 1e-4);
		unsetenv("TANDEM_MOE_SMALL");
	}
	g_xscale = 1.0f;
	/* TANDEM_MOE_DB=1: gate / up with the next unit's loads in flight (Q4_K / Q5_K): 1 unit per warp
	 * or several, one or two tiles, 8 or 4 warps */
	setenv("TANDEM_MOE_DB", "1", 1);
	ffn_case(&glm5s, KT_Q4_K, KT_Q4_K, 1, 1e-4);
	ffn_case(&e256s, KT_Q5_K, KT_Q6_K, 3, 1e-4);
	ffn_case(&e256s, KT_Q4_K, KT_Q8_0, 8, 1e-4);
	setenv("TANDEM_MOE_SMALL_GUW", "4", 1);
	ffn_case(&glm5s, KT_Q4_K, KT_Q4_K, 2, 1e-4);
	if (!quick)
		ffn_case(&ds3s, KT_Q5_K, KT_Q6_K, 5, 1e-4);
	unsetenv("TANDEM_MOE_SMALL_GUW");
	/* TANDEM_MOE_DB=2 (moe6): the double-buffered body held to 3 blocks of 8 warps per SM (some
	 * registers spilled); TANDEM_MOE_SMALL_GUW=6: 6 warps per one-tile gate / up block (24 units: 4
	 * per warp; DS-V3's 28: uneven), with and without double buffering; two-tile blocks (3+ tokens)
	 * fall back to 8 warps */
	setenv("TANDEM_MOE_DB", "2", 1);
	ffn_case(&glm5s, KT_Q4_K, KT_Q4_K, 1, 1e-4);
	ffn_case(&e256s, KT_Q5_K, KT_Q6_K, 3, 1e-4);
	ffn_case(&e256s, KT_Q4_K, KT_Q8_0, 8, 1e-4);
	setenv("TANDEM_MOE_SMALL_GUW", "6", 1);
	ffn_case(&glm5s, KT_Q4_K, KT_Q4_K, 1, 1e-4);
	ffn_case(&ds3s, KT_Q5_K, KT_Q6_K, 2, 1e-4);
	setenv("TANDEM_MOE_DB", "1", 1);
	ffn_case(&glm5s, KT_Q4_K, KT_Q4_K, 1, 1e-4);
	ffn_case(&e256s, KT_Q4_K, KT_Q4_K, 5, 1e-4);
	unsetenv("TANDEM_MOE_DB");
	ffn_case(&glm5s, KT_Q4_K, KT_Q6_K, 1, 1e-4);
	if (!quick)
		ffn_case(&ds3s, KT_Q4_K, KT_Q4_K, 2, 1e-4);
	unsetenv("TANDEM_MOE_SMALL_GUW");
	route_chain();
	/* the batch-1 kernels (moe_one.cu; off by default: TANDEM_MOE_SMALL_V=dn its down kernel, =new both):
	 * GLM-5 and DS-V3 (28 units of D: 4 per warp, uneven) rank slices, D 256 / 512 (1-2 units: warps
	 * without work), Q5_K, every down type (Q6_K / Q8_0 take moe_small's down after the new gate /
	 * up), no shared expert (8 pairs), ids repeated inside the token, large x; each against the CPU,
	 * twice (same bits) and against moe_small's kernels; the default (down only), both (new) and gate /
	 * up alone (gu); the ids read before the wait (TANDEM_MOE_ONE_EARLY=1, off by default), and the
	 * decode chain under PDL (one_chain) */
	printf("batch-1 kernels (moe_one.cu)\n");
	static const char *const one_v[] = {"dn", "new", "gu"}; /* (the default is the old kernels) */
	for (size_t v = 0; v < sizeof(one_v) / sizeof(one_v[0]); v++) {
		if (one_v[v])
			setenv("TANDEM_MOE_SMALL_V", one_v[v], 1);
		if (!quick || v < 2)
			ffn_case(&glm5s, KT_Q4_K, KT_Q4_K, 1, 1e-4);
		ffn_case(&e256s, KT_Q4_K, KT_Q4_K, 1, 1e-4);
		ffn_case(&e256s, KT_Q5_K, KT_Q5_K, 1, 1e-4);
		ffn_case(&gtinys, KT_Q4_K, KT_Q5_K, 1, 1e-4);
		if (!quick || v < 2) {
			ffn_case(&e256, KT_Q4_K, KT_Q4_K, 1, 1e-4);
			ffn_case(&e256s, KT_Q4_K, KT_Q8_0, 1, 1e-4);
			ffn_case(&e256s, KT_Q5_K, KT_Q6_K, 1, 1e-4);
			if (!ops_small)
				ffn_case(&ds3s, KT_Q4_K, KT_Q4_K, 1, 1e-4);
		}
		unsetenv("TANDEM_MOE_SMALL_V");
	}
	for (int v = 0; v < 2; v++) { /* the new down kernel alone, then both new */
		setenv("TANDEM_MOE_SMALL_V", v ? "new" : "dn", 1);
		id_mode = 1;
		ffn_case(&e256s, KT_Q4_K, KT_Q4_K, 1, 1e-4);
		ffn_case(&e256s, KT_Q5_K, KT_Q5_K, 1, 1e-4);
		if (!quick)
			ffn_case(&glm5s, KT_Q4_K, KT_Q4_K, 1, 1e-4);
		id_mode = 0;
		g_xscale = 1e6f;
		ffn_case(&glm5s, KT_Q4_K, KT_Q4_K, 1, 1e-4);
		ffn_case(&e256s, KT_Q5_K, KT_Q5_K, 1, 1e-4);
		g_xscale = 1.0f;
		setenv("TANDEM_MOE_ONE_EARLY", "1", 1); /* the non-default: ids read before the wait */
		ffn_case(&e256s, KT_Q4_K, KT_Q4_K, 1, 1e-4);
		one_chain(&e256s, KT_Q4_K, KT_Q4_K, 1, 1, 0);
		if (!quick)
			ffn_case(&glm5s, KT_Q4_K, KT_Q4_K, 1, 1e-4);
		unsetenv("TANDEM_MOE_ONE_EARLY");
		/* (the shared expert's loads after the wait: TANDEM_PREFETCH=0, read once per process, so a
		 * separate run of this test) */
		one_chain(&glm5s, KT_Q4_K, KT_Q4_K, 1, 1, 0);
		one_chain(&e256s, KT_Q5_K, KT_Q5_K, 8, 4, 0);
		unsetenv("TANDEM_MOE_SMALL_V");
	}
	/* the route folded into the expert launches (kcuda_moe_route_ffn1, under TANDEM_MOE_SMALL_V=new):
	 * GLM-5 routing (one group), DS-V3 routing (8 groups / 4), Q5_K; with the down kernel's loads
	 * after its wait; refusals */
	setenv("TANDEM_MOE_SMALL_V", "new", 1);
	one_chain(&glm5s, KT_Q4_K, KT_Q4_K, 1, 1, 1);
	one_chain(&e256s, KT_Q4_K, KT_Q4_K, 8, 4, 1);
	one_chain(&e256s, KT_Q5_K, KT_Q5_K, 1, 1, 1);
	setenv("TANDEM_MOE_ONE_EARLY", "1", 1); /* the non-default: ids read before the wait */
	one_chain(&e256s, KT_Q4_K, KT_Q4_K, 8, 4, 1);
	unsetenv("TANDEM_MOE_ONE_EARLY");
	unsetenv("TANDEM_MOE_SMALL_V");
	route_ffn1_refusals();
	/* the batch-1 MoE in one launch (moe_persist.cu): against the CPU, twice (same bits), against
	 * moe_small's kernels, an id out of range (counted, the token NaN); GLM-5 / DS-V3 rank slices (24 /
	 * 28 units of D, DS-V3 Q5_K: the most shared memory), D 512 and 256 (fewer units than SMs: a grid
	 * of one block a unit), no shared expert, Q5_K / Q4_K mixes, ids repeated inside the token, large
	 * x; the decode chain under PDL with and without the route folded in (GLM-5 / DS-V3 routing), the
	 * same bits as the call alone; each must take exactly one launch and count no error */
	setenv("TANDEM_MOE_PERSIST", "1", 1);
	printf("batch-1 MoE in one launch (moe_persist.cu, TANDEM_MOE_PERSIST=1)\n");
	g_want_persist = 1;
	/* the GLM-5 / DS-V3 slices need ~180-220 KB of shared memory a block: with sm_120's 99 KB
	 * (ops_smem_small) the kernel declines them and only the short-D cases run it */
	const int big_fits = !ops_smem_small();
	if (!big_fits)
		printf("  (sm_120-class shared memory: the GLM-5 / DS-V3 slices decline; not run here)\n");
	if (big_fits)
		ffn_case(&glm5s, KT_Q4_K, KT_Q4_K, 1, 1e-4);
	ffn_case(&e256s, KT_Q4_K, KT_Q4_K, 1, 1e-4);
	ffn_case(&e256s, KT_Q5_K, KT_Q4_K, 1, 1e-4);
	ffn_case(&e256, KT_Q4_K, KT_Q5_K, 1, 1e-4);
	ffn_case(&gtinys, KT_Q4_K, KT_Q5_K, 1, 1e-4);
	if (!ops_small && big_fits) {
		ffn_case(&ds3s, KT_Q4_K, KT_Q4_K, 1, 1e-4);
		if (!quick)
			ffn_case(&ds3s, KT_Q5_K, KT_Q5_K, 1, 1e-4);
	}
	id_mode = 1;
	ffn_case(&e256s, KT_Q4_K, KT_Q4_K, 1, 1e-4);
	id_mode = 0;
	g_xscale = 1e6f;
	if (big_fits)
		ffn_case(&glm5s, KT_Q4_K, KT_Q4_K, 1, 1e-4);
	ffn_case(&e256s, KT_Q5_K, KT_Q5_K, 1, 1e-4);
	g_xscale = 1.0f;
	if (big_fits)
		one_chain(&glm5s, KT_Q4_K, KT_Q4_K, 1, 1, 1);
	one_chain(&e256s, KT_Q4_K, KT_Q4_K, 8, 4, 1);
	one_chain(&e256s, KT_Q5_K, KT_Q5_K, 1, 1, 1);
	if (big_fits)
		one_chain(&glm5s, KT_Q4_K, KT_Q4_K, 1, 1, 0);
	g_want_persist = 0;
	/* shapes it does not take go to moe_small / moe_one as before */
	ffn_case(&e256s, KT_Q4_K, KT_Q6_K, 1, 1e-4);
	setenv("TANDEM_MOE_PERSIST", "0", 1);
	/* router product + route in one launch: GLM-5 / DS-V3 per-rank shapes, batch 1..8 (the default
	 * takes 1..2 tokens, TANDEM_MOE_ROUTER_FUSED=1 up to 8), ties; the expert prefetch on (it is
	 * off by default) and off */
	setenv("TANDEM_MOE_ROUTER_FUSED", "1", 1);
	setenv("TANDEM_MOE_PF", "7", 1);
	for (int n = 1; n <= 8; n++) {
		if (quick && n != 1 && n != 3 && n != 8)
			continue;
		router_route_case("router+route GLM-5 E256 k8 sigmoid", 256, 8, 1, 1, 0, 1, 2.5f, 6144, n, 0);
		router_route_case("router+route DS-V3 E256 k8 g8/4", 256, 8, 8, 4, 0, 1, 2.5f, 7168, n, 0);
	}
	router_route_case("router+route GLM-5 ties (copied rows)", 256, 8, 1, 1, 0, 1, 2.5f, 6144, 4, 1);
	router_route_case("router+route DS-V3 ties (copied rows)", 256, 8, 8, 4, 0, 1, 2.5f, 7168, 8, 1);
	router_route_case("router+route softmax E64 k6 D 256", 64, 6, 1, 1, 1, 0, 1.0f, 256, 2, 0);
	router_route_case("router+route tiny E4 k2 D 256", 4, 2, 1, 1, 0, 1, 1.0f, 256, 5, 0);
	router_route_case("router+route E512 k16 D 8192", 512, 16, 1, 1, 1, 1, 1.0f, 8192, 3, 0);
	unsetenv("TANDEM_MOE_PF");
	router_route_case("router+route GLM-5 no prefetch", 256, 8, 1, 1, 0, 1, 2.5f, 6144, 1, 0);
	setenv("TANDEM_MOE_ROUTER_FUSED", "2", 1);
	router_route_case("router+route GLM-5 =2 (up to 2 tokens)", 256, 8, 1, 1, 0, 1, 2.5f, 6144, 2, 0);
	unsetenv("TANDEM_MOE_ROUTER_FUSED");
	/* moe6's kernel (moe_router_fuse.cu, the default): gemv3's product (the same logits bits as
	 * kcuda_matmul_path(KCUDA_MM_F32)) with the route in the last block, batch 1..8, ties, other
	 * shapes, x from a late PDL producer, without clusters (TANDEM_GEMV3_SPLIT=0: one block per row
	 * tile walks all of K through its ring), the shuffle arg-max, no weight prefetch */
	setenv("TANDEM_MOE_ROUTE_FUSE", "1", 1); /* off by default (no gain in the H200 step) */
	for (int n = 1; n <= 8; n++) {
		if (quick && n != 1 && n != 2 && n != 5 && n != 8)
			continue;
		router_route_case2("fuse6 GLM-5 E256 k8 sigmoid", 256, 8, 1, 1, 0, 1, 2.5f, 6144, n, 0,
		                   RR_BITS);
		router_route_case2("fuse6 DS-V3 E256 k8 g8/4", 256, 8, 8, 4, 0, 1, 2.5f, 7168, n, 0, RR_BITS);
	}
	router_route_case2("fuse6 GLM-5 ties (copied rows)", 256, 8, 1, 1, 0, 1, 2.5f, 6144, 1, 1, RR_BITS);
	router_route_case2("fuse6 DS-V3 ties (copied rows)", 256, 8, 8, 4, 0, 1, 2.5f, 7168, 6, 1, RR_BITS);
	router_route_case2("fuse6 softmax E64 k6 D 256", 64, 6, 1, 1, 1, 0, 1.0f, 256, 2, 0, RR_BITS);
	router_route_case2("fuse6 tiny E4 k2 D 256", 4, 2, 1, 1, 0, 1, 1.0f, 256, 5, 0, RR_BITS);
	router_route_case2("fuse6 E382 k16 D 8192", 382, 16, 1, 1, 1, 1, 1.0f, 8192, 3, 0, RR_BITS);
	router_route_case2("fuse6 GLM-5 late x", 256, 8, 1, 1, 0, 1, 2.5f, 6144, 1, 0, RR_BITS | RR_LATE);
	router_route_case2("fuse6 DS-V3 late x", 256, 8, 8, 4, 0, 1, 2.5f, 7168, 8, 0, RR_BITS | RR_LATE);
	setenv("TANDEM_GEMV3_SPLIT", "0", 1);
	router_route_case2("fuse6 GLM-5 no clusters", 256, 8, 1, 1, 0, 1, 2.5f, 6144, 1, 0, RR_BITS);
	router_route_case2("fuse6 GLM-5 no clusters, late x", 256, 8, 1, 1, 0, 1, 2.5f, 6144, 3, 0,
	                   RR_BITS | RR_LATE);
	unsetenv("TANDEM_GEMV3_SPLIT");
	setenv("TANDEM_MOE_ROUTE_SORT", "0", 1); /* the last block runs route_reg_token itself */
	router_route_case2("fuse6 GLM-5 rescan route", 256, 8, 1, 1, 0, 1, 2.5f, 6144, 1, 0, RR_BITS);
	router_route_case2("fuse6 DS-V3 ties, rescan route", 256, 8, 8, 4, 0, 1, 2.5f, 7168, 3, 1, RR_BITS);
	unsetenv("TANDEM_MOE_ROUTE_SORT");
	setenv("TANDEM_MOE_ROUTE_FAST", "1", 1);
	router_route_case2("fuse6 DS-V3 ties, shuffle arg-max", 256, 8, 8, 4, 0, 1, 2.5f, 7168, 4, 1,
	                   RR_BITS);
	router_route_case2("fuse6 GLM-5 shuffle arg-max", 256, 8, 1, 1, 0, 1, 2.5f, 6144, 2, 1, RR_BITS);
	unsetenv("TANDEM_MOE_ROUTE_FAST");
	setenv("TANDEM_PREFETCH", "0", 1);
	router_route_case2("fuse6 GLM-5 no prefetch", 256, 8, 1, 1, 0, 1, 2.5f, 6144, 1, 0,
	                   RR_BITS | RR_LATE);
	unsetenv("TANDEM_PREFETCH");
	unsetenv("TANDEM_MOE_ROUTE_FUSE");
	router_route_refusals();
	test_args();
done:
	kcuda_ctx_destroy(ctx);
	kpool_destroy(pool);
	printf("%d checks, %d failed\n", ops_n_check, ops_n_fail);
	return ops_n_fail ? 1 : 0;
}
#endif
