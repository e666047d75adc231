/* kcuda_matmul (decode GEMV and prefill GEMM) against the CPU ops, for every compute type, on seeded
 * random weights and activations:
 *   - GEMV (n_tok <= 8: the tensor-core GEMV or the fp32 one, matmul_mma.cu's table) and the
 *     tensor-core tile product (n_tok 9..16 automatic, any n_tok on the fp32 path, quantized
 *     weights; TANDEM_GEMV_MMA=0 turns both off and the sweep runs again that way): against kcpu_dot_row (the
 * CPU op kcpu_matmul uses per row), within fp32 summation-order error: |gpu - cpu| <= 2e-6 * sqrt(n_in) *
 * sum|w x| (+ a denormal floor);
 *   - GEMM (n_tok > 8, or forced): W and X are rounded to bf16 inside the op, so the reference is the
 *     double-precision dot of the bf16-rounded kcpu_dequant_row values and x, same tolerance;
 *   - Q8_0 cases the tile product takes run again with its fp16 conversion through float
 *     (TANDEM_TILE_Q8H=0): the same bits as the byte-permute default;
 *   - outputs are finite, guard bytes around Y and the gaps of a strided Y (ldy > n_out) untouched,
 *     strided X (ldx > n_in), bad arguments rejected with -EINVAL / ERR_UNSUPPORTED.
 * Shapes: rows 1, 31, 32, 33, 4097 and the GLM-5 TP=8 and DeepSeek-V3 per-rank weight shapes.
 * TANDEM_OPS_QUICK=1 runs a smaller sweep (for compute-sanitizer). Also one token's Q6_K output heads
 * (head_sweep: matmul_q6k1.cu); last, wide products at 1..8 tokens (wide_sweep). Exit 77 = no GPU (skip). */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "common/base/err.h"
#include "tests/ops/ops_util.h"

#ifndef TANDEM_CUDA
int main(void)
{
	printf("SKIP: built without CUDA (make CUDA=1)\n");
	return 77;
}
#else

struct shape {
	int64_t n_in, n_out;
	const char *what;
};

static const int types[] = {KT_Q8_0,    KT_Q4_K,   KT_Q5_K,   KT_Q6_K,    KT_BF16,   KT_F32,
                            KT_F16,     KT_Q4_0,   KT_Q4_1,   KT_Q5_0,    KT_Q5_1,   KT_Q2_K,
                            KT_Q3_K,    KT_IQ4_NL, KT_IQ4_XS, KT_IQ2_XXS, KT_IQ2_XS, KT_IQ2_S,
                            KT_IQ3_XXS, KT_IQ3_S,  KT_IQ1_S,  KT_IQ1_M};

/* The tensor-core paths (TANDEM_GEMV_MMA, on unless set to 0): quantized weights at n_tok 9..16
 * on the automatic path, and at any n_tok > 8 on the fp32 path, take the tile product
 * (kernels/cuda/matmul_tile.cu), which is as exact as the fp32 GEMV (weights exact, x as fp16
 * hi + lo): held to the GEMV tolerance, not the bf16 one. MM_TILE_MAX_TOK of matmul.cu. */
#define TILE_MAX_TOK 16
/* TANDEM_TILE_MAX_TOK moves that limit (matmul.cu reads it with the same rules) */
static int64_t tile_max_tok(void)
{
	const char *e = getenv("TANDEM_TILE_MAX_TOK");
	const long x = e && *e ? strtol(e, NULL, 10) : TILE_MAX_TOK;
	return x >= 8 && x <= 4096 ? x : TILE_MAX_TOK;
}
static bool mma_on(void)
{
	const char *e = getenv("TANDEM_GEMV_MMA");
	return !(e && strcmp(e, "0") == 0);
}
static bool is_float_type(int type)
{
	return type == KT_F32 || type == KT_F16 || type == KT_BF16;
}

/* when set, run_case runs the product a second time and wants bit-identical outputs */
static int g_det;
/* activations are uniform in [-g_xscale, g_xscale) */
static float g_xscale = 1.0f;

/* whether matmul_gemv3.cu takes this weight at n_tok <= 8 (type, n_in multiple, Q8_0 width,
 * TANDEM_GEMV3) */
static bool gemv3_takes(int type, int64_t n_in, int64_t n_out)
{
	const char *e = getenv("TANDEM_GEMV3");
	if (e && strcmp(e, "0") == 0)
		return false;
	if (type == KT_Q8_0 && n_out > 1024)
		return false;
	const int64_t se = type == KT_F32 ? 128 : 256;
	return (type == KT_Q8_0 || is_float_type(type)) && n_in >= se && n_in % se == 0;
}

/* Runs one case; returns 0 if it ran (pass or fail recorded), -1 on setup failure. */
static int run_case(struct kcuda_ctx *c, int type, int64_t n_in, int64_t n_out, int64_t n_tok,
                    enum kcuda_mm_path path, int strided, const char *what)
{
	size_t rb = 0;
	if (!ktype_row_bytes(type, n_in, &rb))
		return 0;
	const int64_t ldx = strided ? n_in + 4 : n_in, ldy = strided ? n_out + 3 : n_out;
	uint8_t *wh = malloc(rb * (size_t)n_out);
	float *xh = malloc(sizeof(float) * (size_t)(ldx * n_tok));
	float *yh = malloc(sizeof(float) * (size_t)(ldy * n_tok));
	float *row = malloc(sizeof(float) * (size_t)n_in);
	float *xr = malloc(sizeof(float) * (size_t)n_in);
	struct kweight w = {.type = type, .n_in = n_in, .n_out = n_out, .row_bytes = rb, .data = wh};
	struct kweight wd = {0};
	struct ops_dbuf xb = {0}, yb = {0};
	int ret = -1;
	if (!wh || !xh || !yh || !row || !xr)
		goto out;
	ops_fill_weight(type, n_in, n_out, rb, wh);
	for (int64_t i = 0; i < ldx * n_tok; i++)
		xh[i] = g_xscale * ops_rng_unif();
	if (kcuda_weight_upload(c, &w, &wd) || ops_dbuf_init(c, &xb, sizeof(float) * (size_t)(ldx * n_tok)) ||
	    ops_dbuf_init(c, &yb, sizeof(float) * (size_t)(ldy * n_tok)) ||
	    kcuda_upload(c, xb.user, xh, xb.bytes))
		goto out;
	int rc = kcuda_matmul_path(c, path, &wd, xb.user, ldx, n_tok, yb.user, ldy);
	if (!rc)
		rc = kcuda_sync(c);
	/* bf16 rounding of W and X on the GEMM path; F32 weights (AUTO) and KCUDA_MM_F32 stay fp32 */
	/* the split fp16 GEMM (matmul_gemm.cu) takes fp32-path prefill sizes: held to the same tolerance */
	const int split_mode = kcuda_f32_split_mode();
	const bool split = path == KCUDA_MM_F32 && n_tok > 8 && n_in % 16 == 0 &&
	                   (split_mode == 2 || (split_mode == 1 && n_tok >= KCUDA_SPLIT_MIN_TOK &&
	                                        n_out >= KCUDA_SPLIT_MIN_OUT));
	const bool tile = !split && mma_on() && !is_float_type(type) && n_tok > 8 &&
	                  (path == KCUDA_MM_F32 || (path == KCUDA_MM_AUTO && n_tok <= tile_max_tok()));
	const bool gemm =
	    !tile && (path == KCUDA_MM_GEMM || (path == KCUDA_MM_AUTO && n_tok > 8 && type != KT_F32));
	const char *lbl = split                            ? "split"
	                  : tile                           ? "tile"
	                  : gemm                           ? "gemm"
	                  : n_tok > 8                      ? "f32gm"
	                  : gemv3_takes(type, n_in, n_out) ? "gemv3"
	                  : mma_on()                       ? "gemv*"
	                                                   : "gemv";
	OPS_CHECK(rc == 0, "%s %s n_in=%" PRId64 " n_out=%" PRId64 " n_tok=%" PRId64 ": rc %d",
	          ktype_name(type), what, n_in, n_out, n_tok, rc);
	size_t bad = ops_dbuf_get(c, &yb, yh);
	OPS_CHECK(bad == 0, "%s %s: %zu guard bytes damaged around Y", ktype_name(type), what, bad);
	if (g_det && rc == 0) { /* same inputs again: the same bits (fixed reduction order) */
		float *y2 = malloc(sizeof(float) * (size_t)(ldy * n_tok));
		int rc2 = y2 ? kcuda_matmul_path(c, path, &wd, xb.user, ldx, n_tok, yb.user, ldy) : -1;
		if (!rc2)
			rc2 = kcuda_sync(c);
		if (!rc2)
			ops_dbuf_get(c, &yb, y2);
		OPS_CHECK(rc2 == 0 && memcmp(y2, yh, sizeof(float) * (size_t)(ldy * n_tok)) == 0,
		          "%s %s n_in=%" PRId64 " n_out=%" PRId64 " n_tok=%" PRId64 ": second run differs",
		          ktype_name(type), what, n_in, n_out, n_tok);
		free(y2);
	}
	if (tile && rc == 0 &&
	    type == KT_Q8_0) { /* the Q8_0 halves through float (TANDEM_TILE_Q8H=0): same bits */
		float *y2 = malloc(sizeof(float) * (size_t)(ldy * n_tok));
		setenv("TANDEM_TILE_Q8H", "0", 1);
		int rc2 = y2 ? kcuda_matmul_path(c, path, &wd, xb.user, ldx, n_tok, yb.user, ldy) : -1;
		unsetenv("TANDEM_TILE_Q8H");
		if (!rc2)
			rc2 = kcuda_sync(c);
		if (!rc2)
			ops_dbuf_get(c, &yb, y2);
		OPS_CHECK(rc2 == 0 && memcmp(y2, yh, sizeof(float) * (size_t)(ldy * n_tok)) == 0,
		          "%s %s n_in=%" PRId64 " n_out=%" PRId64 " n_tok=%" PRId64
		          ": the Q8_0 halves through float give other bits",
		          ktype_name(type), what, n_in, n_out, n_tok);
		free(y2);
	}

	double worst = 0;
	int64_t n_bad = 0, n_gap_bad = 0;
	for (int64_t r = 0; r < n_out; r++) {
		kcpu_dequant_row(type, wh + (size_t)r * rb, row, n_in);
		if (gemm)
			for (int64_t k = 0; k < n_in; k++)
				row[k] = kbf16_to_f32(kf32_to_bf16(row[k]));
		for (int64_t t = 0; t < n_tok; t++) {
			const float *x = xh + t * ldx;
			double ref = 0, mag = 0;
			if (gemm) {
				for (int64_t k = 0; k < n_in; k++) {
					double p = (double)row[k] * (double)kbf16_to_f32(kf32_to_bf16(x[k]));
					ref += p;
					mag += fabs(p);
				}
			} else {
				ref = kcpu_dot_row(type, wh + (size_t)r * rb, x, n_in);
				for (int64_t k = 0; k < n_in; k++)
					mag += fabs((double)row[k] * x[k]);
			}
			const float g = yh[t * ldy + r];
			const double err = fabs((double)g - ref),
			             tol = 2e-6 * sqrt((double)n_in) * mag + 1e-30;
			if (!isfinite(g) || !(err <= tol)) {
				if (n_bad++ < 3)
					printf("  %s %s row %" PRId64 " tok %" PRId64
					       ": gpu %.9g ref %.9g (|d| %.3g, tol %.3g)\n",
					       ktype_name(type), what, r, t, g, ref, err, tol);
			}
			if (mag > 0 && err / mag > worst)
				worst = err / mag;
		}
	}
	for (int64_t t = 0; t < n_tok; t++)
		for (int64_t r = n_out; r < ldy; r++)
			n_gap_bad += !ops_is_fill_f32(yh[t * ldy + r]);
	OPS_CHECK(n_bad == 0,
	          "%s %s n_in=%" PRId64 " n_out=%" PRId64 " n_tok=%" PRId64 " %s: %" PRId64 " wrong outputs",
	          ktype_name(type), what, n_in, n_out, n_tok, lbl, n_bad);
	OPS_CHECK(n_gap_bad == 0, "%s %s: %" PRId64 " writes into the ldy gap", ktype_name(type), what,
	          n_gap_bad);
	printf("%-7s %-5s %-22s n_in %6" PRId64 " n_out %5" PRId64 " n_tok %3" PRId64
	       "%s  max |err|/sum|wx| %.2e %s\n",
	       ktype_name(type), lbl, what, n_in, n_out, n_tok, strided ? " strided" : "", worst,
	       n_bad ? "FAIL" : "ok");
	ret = 0;
out:
	if (ret)
		printf("setup failed for %s %s\n", ktype_name(type), what);
	kcuda_weight_free(&wd);
	ops_dbuf_fini(&xb);
	ops_dbuf_fini(&yb);
	free(wh);
	free(xh);
	free(yh);
	free(row);
	free(xr);
	return ret;
}

static void check_bad_args(struct kcuda_ctx *c)
{
	uint8_t wh[34 * 2] = {0};
	struct kweight w = {.type = KT_Q8_0, .n_in = 64, .n_out = 1, .row_bytes = 68, .data = wh}, wd = {0};
	float *x = NULL, *y = NULL;
	if (kcuda_weight_upload(c, &w, &wd) || kcuda_alloc(64 * sizeof(float), (void **)&x) ||
	    kcuda_alloc(64 * sizeof(float), (void **)&y)) {
		OPS_CHECK(0, "bad-args setup");
		goto out;
	}
	OPS_CHECK(kcuda_matmul(c, &wd, x, 63, 1, y, 1) == -EINVAL, "ldx < n_in accepted");
	OPS_CHECK(kcuda_matmul(c, &wd, x, 64, 1, y, 0) == -EINVAL, "ldy < n_out accepted");
	OPS_CHECK(kcuda_matmul(c, &wd, x, 64, -1, y, 1) == -EINVAL, "negative n_tok accepted");
	struct kweight bad = wd;
	bad.row_bytes = 67;
	OPS_CHECK(kcuda_matmul(c, &bad, x, 64, 1, y, 1) == -EINVAL, "wrong row_bytes accepted");
	bad = wd;
	bad.n_in = 48;
	OPS_CHECK(kcuda_matmul(c, &bad, x, 64, 1, y, 1) == -EINVAL, "n_in not a block multiple accepted");
	bad = wd;
	bad.type = KT_IQ2_XXS;
	bad.n_in = 256;
	bad.row_bytes = 66;
	OPS_CHECK(kcuda_matmul(c, &bad, x, 256, 1, y, 1) == ERR_UNSUPPORTED,
	          "IQ2_XXS not refused as unsupported");
	struct kweight up = w;
	up.row_bytes = 60;
	struct kweight upd = {0};
	OPS_CHECK(kcuda_weight_upload(c, &up, &upd) == -EINVAL, "upload with wrong row_bytes accepted");
	OPS_CHECK(kcuda_matmul(c, &wd, x, 64, 0, y, 1) == 0, "n_tok = 0 is a no-op");
out:
	kcuda_weight_free(&wd);
	kcuda_free(x);
	kcuda_free(y);
}

/* gemv3 (matmul_gemv3.cu: Q8_0 / F32 / F16 / BF16 at n_tok 1..8, K split over a cluster for
 * narrow outputs): the GLM-5 TP=8 and DeepSeek-V3 per-rank shapes including the narrow ones
 * (idx_k 128, idx_proj 32, router 256, kv_a 576), odd n_out, strided X / Y, every n_tok 1..8 and
 * 16, each run twice (bit-identical), then TANDEM_GEMV3=0 on a few (the old kernels). Types it
 * does not take (Q4_K) run through the same cases as a fallback check. */
static int gemv3_sweep(struct kcuda_ctx *c, int quick)
{
	static const struct shape full[] = {
	    {6144, 2048, "glm q_a"},    {2048, 2048, "glm q_b"},     {2048, 4096, "glm idx_q_b"},
	    {6144, 576, "glm kv_a"},    {6144, 128, "glm idx_k"},    {2048, 6144, "glm o"},
	    {6144, 32, "glm idx_proj"}, {6144, 256, "glm router"},   {7168, 1536, "ds q_a"},
	    {1536, 3072, "ds q_b"},     {7168, 576, "ds kv_a"},      {2048, 7168, "ds o"},
	    {7168, 256, "ds router"},   {1024, 67, "odd n_out 67"},  {256, 1, "one row"},
	    {768, 37, "odd n_out 37"},  {384, 33, "n_in 384 (F32)"}, {12288, 5, "long K"},
	};
	static const struct shape small[] = {
	    {6144, 128, "glm idx_k"}, {6144, 32, "glm idx_proj"}, {1024, 67, "odd n_out 67"},
	    {2048, 576, "kv_a-like"}, {256, 1, "one row"},        {384, 33, "n_in 384 (F32)"},
	};
	static const int g3types[] = {KT_Q8_0, KT_F32, KT_F16, KT_BF16, KT_Q4_K};
	const struct shape *sh = quick ? small : full;
	const size_t n_sh = quick ? sizeof(small) / sizeof(small[0]) : sizeof(full) / sizeof(full[0]);
	int fail = 0;
	g_det = 1;
	for (size_t ti = 0; ti < sizeof(g3types) / sizeof(g3types[0]); ti++) {
		const int type = g3types[ti];
		for (size_t s = 0; s < n_sh; s++) {
			size_t rb;
			if (!ktype_row_bytes(type, sh[s].n_in, &rb))
				continue;
			const bool big = sh[s].n_in * sh[s].n_out > (int64_t)4 << 20;
			for (int64_t nt = 1; nt <= 16; nt++) {
				/* every n_tok 1..8 and 16 on the small shapes, 1 and 8 on the big ones
				 * (the CPU reference is the slow part), 1, 3, 8, 16 in quick mode */
				if (nt > 8 && (nt != 16 || big))
					continue;
				if (big && nt != 1 && nt != 8)
					continue;
				if (quick && nt != 1 && nt != 3 && nt != 8 && nt != 16)
					continue;
				fail |= run_case(c, type, sh[s].n_in, sh[s].n_out, nt, KCUDA_MM_AUTO,
				                 (int)((s + (size_t)nt) & 1), sh[s].what);
			}
			/* the fp32 path at decode sizes (router, indexer) */
			if (!big)
				fail |= run_case(c, type, sh[s].n_in, sh[s].n_out, 2, KCUDA_MM_F32, 0,
				                 sh[s].what);
		}
		setenv("TANDEM_GEMV3", "0", 1);
		for (size_t s = 0; s < n_sh && s < 4; s++)
			for (int64_t nt = 1; nt <= 8; nt += 7)
				fail |= run_case(c, type, sh[s].n_in, sh[s].n_out, nt, KCUDA_MM_AUTO, 0,
				                 "gemv3 off");
		unsetenv("TANDEM_GEMV3");
		/* the rows per warp forced against the default plan (4 at 5-8 tokens): 1 at 8, 4 at 1 */
		setenv("TANDEM_GEMV3_RT", "1", 1);
		for (size_t s = 0; s < n_sh && s < 3; s++)
			fail |= run_case(c, type, sh[s].n_in, sh[s].n_out, 8, KCUDA_MM_AUTO, 1, "gemv3 rt 1");
		setenv("TANDEM_GEMV3_RT", "4", 1);
		for (size_t s = 0; s < n_sh && s < 3; s++)
			fail |= run_case(c, type, sh[s].n_in, sh[s].n_out, 1, KCUDA_MM_AUTO, 0, "gemv3 rt 4");
		unsetenv("TANDEM_GEMV3_RT");
	}
	g_det = 0;
	return fail;
}

/* Wide products at 1..8 tokens on the default dispatch (Q8_0 wider than 1024 rows takes
 * matmul_multi.cu's kernel, and again with TANDEM_MULTI_WIDE=0 the tensor-core GEMV / gemv_kernel;
 * Q4_K the tensor-core GEMV): the GLM-5 shapes, odd n_out, n_in with a short last piece, long K;
 * every n_tok template (1, 2, 3-4, 5-8); a second run must give the same bits. */
static int wide_sweep(struct kcuda_ctx *c, int quick)
{
	static const struct shape wide[] = {{6144, 2048, "glm q_a wide"},     {2048, 6144, "glm o wide"},
	                                    {2560, 1029, "wide, odd n_out"},  {2048, 1100, "wide"},
	                                    {2560, 3300, "wide, many tiles"}, {12288, 1100, "wide, long K"}};
	int fail = 0;
	g_det = 1;
	static const int wtypes[] = {KT_Q8_0, KT_Q8_0, KT_Q4_K};
	for (size_t ti = 0; ti < 3; ti++) {
		if (ti == 1)
			setenv("TANDEM_MULTI_WIDE", "0", 1);
		else
			unsetenv("TANDEM_MULTI_WIDE");
		for (size_t s = quick ? 2 : 0; s < sizeof(wide) / sizeof(wide[0]); s++)
			for (int64_t nt = 1; nt <= 8; nt++) {
				if ((quick || s < 2) && nt != 1 && nt != 2 && nt != 3 && nt != 8)
					continue;
				fail |= run_case(c, wtypes[ti], wide[s].n_in, wide[s].n_out, nt,
				                 KCUDA_MM_AUTO, (int)((nt + s) & 1),
				                 ti == 1 ? "wide, TANDEM_MULTI_WIDE=0" : wide[s].what);
			}
	}
	unsetenv("TANDEM_MULTI_WIDE");
	g_det = 0;
	return fail;
}

/* One token's Q6_K products of output-head size (matmul_q6k1.cu takes n_out >= 8192, n_in % 1024 == 0 up
 * to 8192): the GLM-5 and DeepSeek-V3 TP=8 head slices, an odd n_out (the last row step part-filled),
 * 5120 (GLM-4.5's hidden, 8-byte copies) and a row count past the minimum; each TANDEM_GEMV_Q6K variant
 * (quick: the default and 3), x at scale 1 and 1e-30, twice each (the same bits) */
static int head_sweep(struct kcuda_ctx *c, int quick)
{
	static const struct shape heads[] = {{6144, 19360, "glm head/8 (q6k1)"},
	                                     {7168, 16160, "ds head/8 (q6k1)"},
	                                     {6144, 8193, "odd head (q6k1)"},
	                                     {5120, 9000, "5120 head (q6k1)"}};
	static const char *vars[] = {NULL, "1", "3", "4", "0"};
	int fail = 0;
	g_det = 1;
	for (size_t v = 0; v < sizeof(vars) / sizeof(vars[0]); v++) {
		if (quick && v != 0 && v != 2)
			continue;
		if (vars[v])
			setenv("TANDEM_GEMV_Q6K", vars[v], 1);
		else
			unsetenv("TANDEM_GEMV_Q6K");
		for (size_t s = 0; s < sizeof(heads) / sizeof(heads[0]); s++) {
			if (quick && s != 2)
				continue;
			for (int xi = 0; xi < 2; xi++) {
				if (xi && (v || s))
					continue; /* the tiny x once */
				g_xscale = xi ? 1e-30f : 1.0f;
				fail |= run_case(c, KT_Q6_K, heads[s].n_in, heads[s].n_out, 1, KCUDA_MM_AUTO,
				                 0, heads[s].what);
			}
		}
	}
	g_xscale = 1.0f;
	unsetenv("TANDEM_GEMV_Q6K");
	g_det = 0;
	return fail;
}

/* The tile kernel's trace mode (kcuda_mm_tile_trace, bench_cuda_mm tiletrace): the same output bits with
 * the trace on as off; every block of the launch leaves its stamps (entry <= after the wait <= each
 * chunk's four stamps in order <= exit) and a chunk count, the counts adding up to the K chunks times the
 * row and token tiles; after it is turned off, a launch writes nothing into the buffer. */
static int trace_check(struct kcuda_ctx *c, int type)
{
	const int64_t n_in = 1024, n_out = 130, n_tok = 16; /* 3 row tiles, 16 chunks (K may be split) */
	size_t rb = 0;
	if (!ktype_row_bytes(type, n_in, &rb))
		return 0;
	const size_t ny = (size_t)(n_out * n_tok), nb = 4096, nw = nb * MT_TR_SLOTS;
	uint8_t *wh = malloc(rb * (size_t)n_out);
	float *xh = malloc(sizeof(float) * (size_t)(n_in * n_tok)), *y0 = malloc(ny * 4),
	      *y1 = malloc(ny * 4);
	unsigned long long *th = calloc(nw, 8), *td = NULL;
	struct kweight w = {.type = type, .n_in = n_in, .n_out = n_out, .row_bytes = rb, .data = wh},
	               wd = {0};
	float *xd = NULL, *yd = NULL;
	int ret = -1;
	if (!wh || !xh || !y0 || !y1 || !th)
		goto out;
	ops_fill_weight(type, n_in, n_out, rb, wh);
	for (int64_t i = 0; i < n_in * n_tok; i++)
		xh[i] = ops_rng_unif();
	if (kcuda_weight_upload(c, &w, &wd) ||
	    kcuda_alloc(sizeof(float) * (size_t)(n_in * n_tok), (void **)&xd) ||
	    kcuda_alloc(ny * 4, (void **)&yd) || kcuda_alloc(nw * 8, (void **)&td) ||
	    kcuda_upload(c, xd, xh, sizeof(float) * (size_t)(n_in * n_tok)) ||
	    kcuda_upload(c, td, th, nw * 8))
		goto out;
	int rc = kcuda_matmul_path(c, KCUDA_MM_F32, &wd, xd, n_in, n_tok, yd, n_out);
	rc = rc ? rc : kcuda_sync(c);
	rc = rc ? rc : kcuda_download(c, y0, yd, ny * 4);
	rc = rc ? rc : kcuda_mm_tile_trace(td);
	rc = rc ? rc : kcuda_matmul_path(c, KCUDA_MM_F32, &wd, xd, n_in, n_tok, yd, n_out);
	rc = rc ? rc : kcuda_sync(c);
	const int rc_off = kcuda_mm_tile_trace(NULL);
	rc = rc ? rc : rc_off;
	rc = rc ? rc : kcuda_download(c, y1, yd, ny * 4);
	rc = rc ? rc : kcuda_download(c, th, td, nw * 8);
	OPS_CHECK(rc == 0, "%s trace: rc %d", ktype_name(type), rc);
	if (rc)
		goto done;
	OPS_CHECK(memcmp(y0, y1, ny * 4) == 0, "%s trace: the output differs with the trace on",
	          ktype_name(type));
	int64_t blocks = 0, chunks = 0, disorder = 0;
	for (size_t b = 0; b < nb; b++) {
		const unsigned long long *r = th + b * MT_TR_SLOTS;
		if (!r[0])
			continue;
		const int64_t nc = (int64_t)r[3 + 4 * MT_TR_CH];
		blocks++;
		chunks += nc;
		unsigned long long prev = r[0];
		for (int i = 1; i < 2 + 4 * (int)(nc < MT_TR_CH ? nc : MT_TR_CH); i++) {
			disorder += r[i] < prev;
			prev = r[i];
		}
		disorder += r[2 + 4 * MT_TR_CH] < prev || nc < 1;
	}
	const int64_t tiles = (n_out + 63) / 64 * ((n_tok + 63) / 64), kch = (n_in / 16 + 3) / 4;
	OPS_CHECK(blocks >= tiles && blocks % tiles == 0 && chunks == kch * tiles && disorder == 0,
	          "%s trace: %" PRId64 " blocks (a multiple of %" PRId64 " expected), %" PRId64
	          " chunks (%" PRId64 " expected), %" PRId64 " stamps out of order",
	          ktype_name(type), blocks, tiles, chunks, kch * tiles, disorder);
	/* off again: a launch leaves the buffer as it is */
	memset(th, 0, nw * 8);
	rc = kcuda_upload(c, td, th, nw * 8);
	rc = rc ? rc : kcuda_matmul_path(c, KCUDA_MM_F32, &wd, xd, n_in, n_tok, yd, n_out);
	rc = rc ? rc : kcuda_sync(c);
	rc = rc ? rc : kcuda_download(c, th, td, nw * 8);
	size_t written = 0;
	for (size_t i = 0; i < nw; i++)
		written += th[i] != 0;
	OPS_CHECK(rc == 0 && written == 0, "%s trace off: rc %d, %zu words written", ktype_name(type), rc,
	          written);
	printf("%-7s tile trace: %" PRId64 " blocks, %" PRId64 " chunks, same bits %s\n", ktype_name(type),
	       blocks, chunks, memcmp(y0, y1, ny * 4) ? "no" : "yes");
done:
	ret = 0;
out:
	if (ret)
		printf("setup failed for %s trace\n", ktype_name(type));
	kcuda_mm_tile_trace(NULL);
	kcuda_weight_free(&wd);
	kcuda_free(xd);
	kcuda_free(yd);
	kcuda_free(td);
	free(wh);
	free(xh);
	free(y0);
	free(y1);
	free(th);
	return ret;
}

int main(void)
{
	if (kcuda_device_count() < 1) {
		printf("SKIP: no CUDA device\n");
		return 77;
	}
	ops_seed_init();
	const int quick = getenv("TANDEM_OPS_QUICK") != NULL;
	/* the resident-weights GEMV (taken by default for small 1-2 token products) has its own test,
	 * test_ops_gemv_res; here the kernels behind it: gemv3, multi1, the tensor-core GEMV, gemv */
	setenv("TANDEM_GEMV_RES", "0", 1);
	struct kcuda_ctx *c = NULL;
	if (kcuda_ctx_create(0, 64u << 20, &c)) {
		printf("FAIL: no CUDA context\n");
		return 1;
	}
	check_bad_args(c);
	int setup_fail = gemv3_sweep(c, quick);
	setup_fail |= trace_check(c, KT_Q8_0) | trace_check(c, KT_Q4_K);
	setup_fail |= head_sweep(c, quick);

	/* rows sweep on a small n_in, then the real per-rank weight shapes */
	static const int64_t rows_sweep[] = {1, 31, 32, 33, 4097};
	static const struct shape real[] = {
	    {6144, 2048, "glm q_a"},          {2048, 2048, "glm q_b/8"},      {6144, 576, "glm kv_a"},
	    {512, 3584, "glm kv_b/8"},        {2048, 6144, "glm o_proj/8"},   {6144, 2048, "glm expert gate"},
	    {256, 6144, "glm expert down/8"}, {6144, 1536, "glm dense up/8"}, {7168, 1536, "ds q_a"},
	    {1536, 3072, "ds q_b/8"},         {2048, 7168, "ds o_proj/8"},    {7168, 2048, "ds expert up"},
	};
	/* 1..8: the GEMVs (mma or fp32 per matmul_mma.cu's table); 9..16: the tile product, above: bf16
	 * cuBLAS */
	static const int64_t toks_gemv[] = {1, 2, 3, 5, 8, 9, 16, 32, 128};

	for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
		const int type = types[ti];
		const int64_t qk = ktype_get(type)->blck;
		const int64_t n_small = qk == 1 ? 96 : (qk == 32 ? 96 : 512);
		for (size_t i = 0; i < sizeof(rows_sweep) / sizeof(rows_sweep[0]); i++) {
			if (quick && rows_sweep[i] > 64)
				continue;
			setup_fail |= run_case(c, type, n_small, rows_sweep[i], 1 + (int64_t)(i % 3),
			                       KCUDA_MM_AUTO, i & 1, "rows sweep");
		}
		if (qk == 1) { /* float weights take any n_in: odd lengths use the scalar path */
			static const int64_t odd[] = {1, 31, 33, 4097};
			for (size_t i = 0; i < 4; i++) {
				setup_fail |= run_case(c, type, odd[i], 37, 2, KCUDA_MM_AUTO, 0, "odd n_in");
				setup_fail |= run_case(c, type, odd[i], 37, 9, KCUDA_MM_AUTO, 0, "odd n_in");
			}
		}
		/* with the tensor-core paths (default) and without them (TANDEM_GEMV_MMA=0); n_in 1024
		 * in quick mode still splits K in the tile product (16 chunks -> 2 splits) */
		for (int off = 0; off < 2; off++) {
			setenv("TANDEM_GEMV_MMA", off ? "0" : "1", 1);
			for (size_t t = 0; t < sizeof(toks_gemv) / sizeof(toks_gemv[0]); t++) {
				if (off && toks_gemv[t] > 32)
					continue;
				const int64_t n_in = qk == 1 ? (quick ? 96 : 6144) : (quick ? 1024 : 6144);
				setup_fail |= run_case(c, type, n_in, 67, toks_gemv[t], KCUDA_MM_AUTO, t & 1,
				                       off ? "n_tok sweep, mma off" : "n_tok sweep");
			}
			/* Q4_K / Q5_K take the mma GEMV at n_tok 1-2 only on wide outputs (>= 2 x SMs
			 * tiles of 16 rows: 4224 on an H200) */
			if (!off && (type == KT_Q4_K || type == KT_Q5_K))
				for (int64_t nt = 1; nt <= 2; nt++)
					setup_fail |=
					    run_case(c, type, 512, 4500, nt, KCUDA_MM_AUTO, 0, "wide");
			/* outputs and tokens around the tile edges (rows 64, tokens 64) */
			if (!off && qk > 1) {
				setup_fail |= run_case(c, type, 512, 65, 65, KCUDA_MM_AUTO, 1, "tile edges");
				setup_fail |=
				    run_case(c, type, 256, 64, 64, KCUDA_MM_F32, 0, "tile f32 exact");
			}
		}
		unsetenv("TANDEM_GEMV_MMA");
		setup_fail |= run_case(c, type, n_small, 45, 33, KCUDA_MM_AUTO, 1, "gemm strided");
		setup_fail |= run_case(c, type, n_small, 33, 3, KCUDA_MM_GEMM, 0, "gemm forced");
		/* the fp32 GEMM (router, indexer): held to the fp32 tolerance */
		setup_fail |= run_case(c, type, n_small, 45, 33, KCUDA_MM_F32, 1, "f32 gemm strided");
		setup_fail |= run_case(c, type, n_small, 45, 5, KCUDA_MM_F32, 0, "f32 path gemv");
		/* the fp32 path at prefill sizes: the split fp16 GEMM (default thresholds), then every
		 * fp32-path shape through it (TANDEM_F32_SPLIT=all), x far above and below fp16's range */
		if (!quick || type == KT_Q8_0 || type == KT_F32 || type == KT_Q4_K)
			setup_fail |= run_case(c, type, n_small, KCUDA_SPLIT_MIN_OUT + 16,
			                       KCUDA_SPLIT_MIN_TOK + 8, KCUDA_MM_F32, 1, "f32 split");
		setenv("TANDEM_F32_SPLIT", "all", 1);
		setup_fail |= run_case(c, type, n_small, 45, 33, KCUDA_MM_F32, 1, "f32 split all");
		if (type == KT_Q8_0 || type == KT_F32 || type == KT_Q4_K || type == KT_BF16) {
			static const float xs[] = {3e5f, 1e-6f, 1e-30f};
			for (int i = 0; i < 3; i++) {
				g_xscale = xs[i];
				setup_fail |=
				    run_case(c, type, n_small, 48, 40, KCUDA_MM_F32, 0, "f32 split x scale");
			}
			g_xscale = 1.0f;
		}
		unsetenv("TANDEM_F32_SPLIT");
		/* the tiny test models' shapes on the bf16 GEMM (64-token prefill) */
		static const struct shape tiny[] = {{256, 192, "tiny q_b"},
		                                    {64, 256, "tiny k_b"},
		                                    {128, 64, "tiny ds k_b"},
		                                    {256, 64, "tiny idx_k"}};
		for (size_t s = 0; s < sizeof(tiny) / sizeof(tiny[0]); s++)
			if (tiny[s].n_in % qk == 0)
				setup_fail |= run_case(c, type, tiny[s].n_in, tiny[s].n_out, 64,
				                       KCUDA_MM_AUTO, 0, tiny[s].what);
		if (quick)
			continue;
		for (size_t s = 0; s < sizeof(real) / sizeof(real[0]); s++) {
			if (real[s].n_in % qk)
				continue;
			setup_fail |= run_case(c, type, real[s].n_in, real[s].n_out, 1 + (int64_t)(s % 4),
			                       KCUDA_MM_AUTO, 0, real[s].what);
		}
		setup_fail |= run_case(c, type, 6144, 300, 40, KCUDA_MM_AUTO, 0, "gemm 6144");
		/* GLM-5 per-rank kv_a at a decode batch of 32 (the tile product, K split) */
		setup_fail |= run_case(c, type, 6144, 576, 32, KCUDA_MM_AUTO, 0, "glm kv_a batch 32");
		/* activations past fp16's range (|x| up to 3e5) on the tensor-core GEMV: 1..8 tokens */
		if (type == KT_Q8_0 || type == KT_Q4_K || type == KT_Q5_K || type == KT_Q6_K) {
			g_xscale = 3e5f;
			for (int64_t nt = 1; nt <= 8; nt += (nt < 2 ? 1 : 3))
				setup_fail |= run_case(c, type, 512, 48, nt, KCUDA_MM_AUTO, 0, "large x");
			/* and on the tile product (9.. tokens; matmul_tile.cu's per-piece scale) */
			setup_fail |= run_case(c, type, 512, 48, 12, KCUDA_MM_AUTO, 0, "large x tile");
			setup_fail |= run_case(c, type, 1024, 80, 40, KCUDA_MM_AUTO, 0, "large x tile");
			g_xscale = 1.0f;
		}
	}
	/* the prefill GEMM's workspace chunking: 256 KiB holds 10 tokens and 11 rows of a 6144-wide
	 * tile, so this runs 4 token chunks x 10 row chunks */
	struct kcuda_ctx *small = NULL;
	if (kcuda_ctx_create(0, 256u << 10, &small)) {
		OPS_CHECK(0, "small-workspace context");
	} else {
		setup_fail |= run_case(small, KT_Q4_K, 6144, 100, 40, KCUDA_MM_GEMM, 1, "gemm small ws");
		setup_fail |= run_case(small, KT_Q8_0, 6144, 100, 40, KCUDA_MM_GEMM, 0, "gemm small ws");
		setup_fail |= run_case(small, KT_Q4_K, 6144, 100, 40, KCUDA_MM_F32, 1, "f32 small ws");
		/* the split GEMM's chunks: 3 tokens x 4 rows of 3 x 6144 halves a pass */
		setenv("TANDEM_F32_SPLIT", "all", 1);
		setup_fail |= run_case(small, KT_Q4_K, 6144, 100, 40, KCUDA_MM_F32, 1, "f32 split small ws");
		setup_fail |= run_case(small, KT_F32, 6144, 30, 20, KCUDA_MM_F32, 0, "f32 split small ws");
		unsetenv("TANDEM_F32_SPLIT");
		/* the tile product's K split in a small workspace */
		setup_fail |= run_case(small, KT_Q8_0, 6144, 100, 40, KCUDA_MM_AUTO, 0, "tile small ws");
		setenv("TANDEM_GEMV_MMA", "0", 1);
		setup_fail |= run_case(small, KT_Q4_K, 6144, 100, 40, KCUDA_MM_F32, 1, "f32 gemm small ws");
		unsetenv("TANDEM_GEMV_MMA");
		kcuda_ctx_destroy(small);
	}
	setup_fail |= wide_sweep(c, quick);
	OPS_CHECK(setup_fail == 0, "some cases failed to set up");
	kcuda_ctx_destroy(c);
	printf("%d checks, %d failed\n", ops_n_check, ops_n_fail);
	return ops_n_fail ? 1 : 0;
}
#endif
