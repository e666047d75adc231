/* kcuda_mla_dense (the dense prompt path, kernels/cuda/mla_dense.cu) against a double-precision
 * reference of the same attention over the same paged KV pool: for row i (position pos0 + i) and head h,
 * out = sum_j softmax_j(scale (q_nope . W_UK(h)^T c_j + q_rope . k_r,j)) W_UV(h) c_j over the keys
 * j <= pos0 + i, with the weights dequantized by the CPU (kcpu_dequant_row). Cases: a small odd shape
 * with forced small key / row blocks (many blocks, rows that skip key blocks), an fp32 pool with the
 * chunk starting at pos0 > 0 and per-head weights that are not packed back to back (F32 and F16), the
 * DeepSeek-V3 rank shape (H 16, N 128, V 128) and the GLM-5 rank shape (H 8, N 192, V 256) crossing the
 * default 2048-key block; each under plain fp32 GEMMs (tolerance 5e-5 of max |ref|), TF32 ones (4e-3,
 * about bf16's rounding) and bf16 ones, by the GEMMs and by the fused kernel (2e-2: variants), run
 * twice (same bits). A block id of -1 in the table
 * must be counted as an error and its keys skipped (the reference skips them too). Bad arguments give -EINVAL
 * and a short workspace ERR_LIMIT, with nothing written (guard bytes around the output). TANDEM_OPS_SMALL=1
 * (for compute-sanitizer) runs the first four cases only. Exit 77 = no GPU. */
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

#define BT 64
/* the variants: math, fused kernel */
static const struct {
	int math, flash;
	const char *name;
	double tol; /* of max |ref|: fp32 sums in another order; TF32 inputs (2^-11); bf16 inputs (2^-9) with
	             * scores up to ~40 in the large cases, whose exponentials carry the scores' absolute
	             * rounding */
} variants[] = {{KCUDA_MD_F32, 0, "f32", 5e-5},
                {KCUDA_MD_TF32, 0, "tf32", 4e-3},
                {KCUDA_MD_BF16, 0, "bf16 gemm", 2e-2},
                {KCUDA_MD_BF16, 1, "bf16 fused", 2e-2},
                {KCUDA_MD_BF16, 2, "bf16 fused128", 2e-2}};
static struct kcuda_ctx *ctx;

struct dcase {
	const char *name;
	int bf16;
	int64_t H, C, R, N, V;
	int64_t pos0, n;
	int wtype; /* k_b / v_b type */
	int packed; /* heads back to back (else a gap of 64 bytes after each head's matrix) */
	int64_t kb, qb; /* forced blocks (0: defaults) */
	int bad_block; /* table entry set to -1 (-1: none) */
};

/* one per-head weight: H matrices of rows x cols, head h at data + h stride */
struct hw {
	struct kweight w;
	size_t stride;
	uint8_t *h;
	void *d;
	float *f; /* dequantized, [H][rows][cols] */
};

static int hw_init(struct hw *x, int type, int64_t H, int64_t rows, int64_t cols, int packed)
{
	const struct ktype_info *ti = ktype_get(type);
	x->w.type = type;
	x->w.n_in = cols;
	x->w.n_out = rows;
	x->w.row_bytes = (size_t)(cols / ti->blck) * ti->bytes;
	x->stride = x->w.row_bytes * (size_t)rows + (packed ? 0 : 64);
	const size_t bytes = x->stride * (size_t)H + 16;
	x->h = calloc(1, bytes);
	x->f = malloc(sizeof(float) * (size_t)(H * rows * cols));
	if (!x->h || !x->f || kcuda_alloc(bytes, &x->d))
		return -1;
	for (int64_t h = 0; h < H; h++) {
		ops_fill_weight(type, cols, rows, x->w.row_bytes, x->h + (size_t)h * x->stride);
		for (int64_t r = 0; r < rows; r++)
			kcpu_dequant_row(type, x->h + (size_t)h * x->stride + (size_t)r * x->w.row_bytes,
			                 x->f + (h * rows + r) * cols, cols);
	}
	x->w.data = x->d;
	return kcuda_upload(ctx, x->d, x->h, bytes);
}
static void hw_fini(struct hw *x)
{
	free(x->h);
	free(x->f);
	kcuda_free(x->d);
}

static void run_case(const struct dcase *dc, int vi)
{
	const int64_t H = dc->H, C = dc->C, R = dc->R, N = dc->N, V = dc->V, n = dc->n, pos0 = dc->pos0;
	const int64_t dim = C + R, nk = pos0 + n;
	const int64_t ld_blocks = (nk + BT - 1) / BT + 1, n_blocks = ld_blocks + 2;
	const size_t elt = dc->bf16 ? 2 : 4, off = 128;
	const size_t block_bytes = off + (size_t)BT * (size_t)dim * elt;
	const int64_t NR = N + R, ldq = H * NR + 8, ldqr = H * R + 4, ldo = H * V + 12;
	uint8_t *pool = malloc(block_bytes * (size_t)n_blocks);
	int32_t *tbl = malloc(sizeof(int32_t) * (size_t)ld_blocks);
	float *q = malloc(sizeof(float) * (size_t)(n * ldq)),
	      *qr = malloc(sizeof(float) * (size_t)(n * ldqr));
	float *lat = malloc(sizeof(float) * (size_t)(nk * dim));
	int *valid = malloc(sizeof(int) * (size_t)nk);
	double *kk = malloc(sizeof(double) * (size_t)(nk * N)),
	       *vv = malloc(sizeof(double) * (size_t)(nk * V));
	double *sc = malloc(sizeof(double) * (size_t)nk), *acc = malloc(sizeof(double) * (size_t)V);
	float *ref = calloc((size_t)(n * ldo), sizeof(float)),
	      *got = malloc(sizeof(float) * (size_t)(n * ldo)),
	      *got2 = malloc(sizeof(float) * (size_t)(n * ldo));
	struct hw kb = {0}, vb = {0};
	void *d_pool = NULL, *d_tbl = NULL, *d_q = NULL, *d_qr = NULL, *d_ws = NULL;
	struct ops_dbuf ob = {0};
	char nm[160];
	snprintf(nm, sizeof nm, "%s %s", dc->name, variants[vi].name);
	if (!pool || !tbl || !q || !qr || !lat || !valid || !kk || !vv || !sc || !acc || !ref || !got ||
	    !got2 || hw_init(&kb, dc->wtype, H, C, N, dc->packed) ||
	    hw_init(&vb, dc->wtype, H, V, C, dc->packed)) {
		OPS_CHECK(0, "%s: allocation", nm);
		goto out;
	}
	/* the pool: random values, block ids shuffled */
	for (size_t i = 0; i < block_bytes * (size_t)n_blocks / elt; i++) {
		const float v = ops_rng_unif();
		if (dc->bf16) {
			const uint16_t b = kf32_to_bf16(v);
			memcpy(pool + 2 * i, &b, 2);
		} else {
			memcpy(pool + 4 * i, &v, 4);
		}
	}
	for (int64_t b = 0; b < ld_blocks; b++)
		tbl[b] = (int32_t)((b * 7 + 3) % n_blocks);
	if (dc->bad_block >= 0)
		tbl[dc->bad_block] = -1;
	for (int64_t i = 0; i < n * ldq; i++)
		q[i] = ops_rng_unif();
	for (int64_t i = 0; i < n * ldqr; i++)
		qr[i] = ops_rng_unif();
	/* the reference: keys decompressed in double */
	for (int64_t j = 0; j < nk; j++) {
		const int32_t b = tbl[j / BT];
		valid[j] = b >= 0;
		for (int64_t e = 0; e < dim; e++) {
			float v = 0.0f;
			if (b >= 0) {
				const uint8_t *p =
				    pool + (size_t)b * block_bytes + off + (size_t)((j % BT) * dim + e) * elt;
				if (dc->bf16) {
					uint16_t u;
					memcpy(&u, p, 2);
					v = kbf16_to_f32(u);
				} else {
					memcpy(&v, p, 4);
				}
			}
			lat[j * dim + e] = v;
		}
	}
	const float scale = 1.0f / sqrtf((float)(N + R));
	double max_ref = 0.0;
	for (int64_t h = 0; h < H; h++) {
		const float *wk = kb.f + h * C * N, *wv = vb.f + h * V * C;
		for (int64_t j = 0; j < nk; j++) {
			for (int64_t d = 0; d < N; d++) {
				double s = 0.0;
				for (int64_t c = 0; c < C; c++)
					s += (double)wk[c * N + d] * lat[j * dim + c];
				kk[j * N + d] = s;
			}
			for (int64_t v = 0; v < V; v++) {
				double s = 0.0;
				for (int64_t c = 0; c < C; c++)
					s += (double)wv[v * C + c] * lat[j * dim + c];
				vv[j * V + v] = s;
			}
		}
		for (int64_t i = 0; i < n; i++) {
			const float *qi = q + i * ldq + h * NR, *qri = qr + i * ldqr + h * R;
			double m = -INFINITY;
			for (int64_t j = 0; j <= pos0 + i; j++) {
				sc[j] = -INFINITY;
				if (!valid[j])
					continue;
				double s = 0.0;
				for (int64_t d = 0; d < N; d++)
					s += (double)qi[d] * kk[j * N + d];
				for (int64_t r = 0; r < R; r++)
					s += (double)qri[r] * lat[j * dim + C + r];
				sc[j] = s * scale;
				m = sc[j] > m ? sc[j] : m;
			}
			double l = 0.0;
			for (int64_t v = 0; v < V; v++)
				acc[v] = 0.0;
			for (int64_t j = 0; j <= pos0 + i && m > -INFINITY; j++) {
				if (!valid[j])
					continue;
				const double p = exp(sc[j] - m);
				l += p;
				for (int64_t v = 0; v < V; v++)
					acc[v] += p * vv[j * V + v];
			}
			for (int64_t v = 0; v < V; v++) {
				const double o = l > 0.0 ? acc[v] / l : 0.0;
				ref[i * ldo + h * V + v] = (float)o;
				max_ref = fabs(o) > max_ref ? fabs(o) : max_ref;
			}
		}
	}
	/* the GPU */
	const size_t ws =
	    kcuda_mla_dense_ws(ctx, H, C, R, N, V, n, nk, variants[vi].math, variants[vi].flash);
	/* the GEMM path's size: more (its score buffer) where the fused kernel takes this call */
	const size_t ws_gemm = kcuda_mla_dense_ws(ctx, H, C, R, N, V, n, nk, variants[vi].math, 0);
	if (kcuda_alloc(block_bytes * (size_t)n_blocks, &d_pool) ||
	    kcuda_alloc(sizeof(int32_t) * (size_t)ld_blocks, &d_tbl) ||
	    kcuda_alloc(sizeof(float) * (size_t)(n * ldq), &d_q) ||
	    kcuda_alloc(sizeof(float) * (size_t)(n * ldqr), &d_qr) || kcuda_alloc(ws, &d_ws) ||
	    ops_dbuf_init(ctx, &ob, sizeof(float) * (size_t)(n * ldo))) {
		OPS_CHECK(0, "%s: device allocation", nm);
		goto out;
	}
	kcuda_upload(ctx, d_pool, pool, block_bytes * (size_t)n_blocks);
	kcuda_upload(ctx, d_tbl, tbl, sizeof(int32_t) * (size_t)ld_blocks);
	kcuda_upload(ctx, d_q, q, sizeof(float) * (size_t)(n * ldq));
	kcuda_upload(ctx, d_qr, qr, sizeof(float) * (size_t)(n * ldqr));
	struct kcuda_kv_view kv = {.base = d_pool,
	                           .n_blocks = n_blocks,
	                           .block_bytes = block_bytes,
	                           .offset = off,
	                           .block_tokens = BT,
	                           .dim = dim,
	                           .bf16 = dc->bf16};
	struct kcuda_mla_dense_args a = {.kv = &kv,
	                                 .blocks = d_tbl,
	                                 .ld_blocks = ld_blocks,
	                                 .pos0 = pos0,
	                                 .n = n,
	                                 .q = d_q,
	                                 .ldq = ldq,
	                                 .q_hs = NR,
	                                 .qr = d_qr,
	                                 .ldqr = ldqr,
	                                 .qr_hs = R,
	                                 .k_b = &kb.w,
	                                 .v_b = &vb.w,
	                                 .k_b_stride = kb.stride,
	                                 .v_b_stride = vb.stride,
	                                 .H = H,
	                                 .C = C,
	                                 .R = R,
	                                 .N = N,
	                                 .V = V,
	                                 .scale = scale,
	                                 .out = ob.user,
	                                 .ldo = ldo,
	                                 .math = variants[vi].math,
	                                 .flash = variants[vi].flash,
	                                 .kb = dc->kb,
	                                 .qb = dc->qb};
	unsigned nbad = 0;
	kcuda_ctx_take_errors(ctx, &nbad);
	/* bad arguments first: refused, nothing written */
	{
		struct kcuda_mla_dense_args b = a;
		b.N = N + 16; /* k_b is C x N */
		OPS_CHECK(kcuda_mla_dense(ctx, &b, d_ws, ws) == -EINVAL, "%s: k_b shape mismatch accepted",
		          nm);
		b = a;
		b.ld_blocks = (nk - 1) / BT; /* positions past the table */
		OPS_CHECK(b.ld_blocks == 0 || kcuda_mla_dense(ctx, &b, d_ws, ws) == -EINVAL,
		          "%s: short block table accepted", nm);
		b = a;
		b.math = 3;
		OPS_CHECK(kcuda_mla_dense(ctx, &b, d_ws, ws) == -EINVAL, "%s: math 3 accepted", nm);
		b = a;
		b.q = NULL;
		OPS_CHECK(kcuda_mla_dense(ctx, &b, d_ws, ws) == -EINVAL, "%s: NULL q accepted", nm);
		/* the size query assumes the default blocks: a case with smaller ones needs less */
		size_t short_ws = dc->kb || dc->qb ? 256 : ws / 2;
		OPS_CHECK(kcuda_mla_dense(ctx, &a, d_ws, short_ws) == ERR_LIMIT,
		          "%s: %zu of %zu workspace bytes accepted", nm, short_ws, ws);
		/* a workspace sized for the fused kernel is refused by the GEMM path (it has no room for the
		 * scores), not overrun; with the default blocks only (smaller forced ones need less) */
		OPS_CHECK(ws <= ws_gemm, "%s: workspace %zu > the GEMM path's %zu", nm, ws, ws_gemm);
		if (ws < ws_gemm && !dc->kb && !dc->qb) {
			b = a;
			b.flash = 0;
			OPS_CHECK(
			    kcuda_mla_dense(ctx, &b, d_ws, ws) == ERR_LIMIT,
			    "%s: the GEMM path accepted the fused kernel's %zu workspace bytes (needs %zu)",
			    nm, ws, ws_gemm);
		}
		kcuda_sync(ctx);
		size_t g = ops_dbuf_get(ctx, &ob, got);
		int untouched = g == 0;
		for (int64_t i = 0; i < n * ldo && untouched; i++)
			untouched = ops_is_fill_f32(got[i]);
		OPS_CHECK(untouched, "%s: a refused call wrote the output", nm);
	}
	int rc = kcuda_mla_dense(ctx, &a, d_ws, ws);
	OPS_CHECK(rc == 0, "%s: rc %d", nm, rc);
	kcuda_sync(ctx);
	size_t g = ops_dbuf_get(ctx, &ob, got);
	OPS_CHECK(g == 0, "%s: %zu guard bytes damaged", nm, g);
	kcuda_ctx_take_errors(ctx, &nbad);
	if (dc->bad_block >= 0)
		OPS_CHECK(nbad > 0, "%s: the -1 block was not counted", nm);
	else
		OPS_CHECK(nbad == 0, "%s: %u errors counted", nm, nbad);
	rc = kcuda_mla_dense(ctx, &a, d_ws, ws);
	kcuda_sync(ctx);
	ops_dbuf_get(ctx, &ob, got2);
	kcuda_ctx_take_errors(ctx, &nbad);
	double max_err = 0.0;
	int finite = 1, gaps = 1;
	for (int64_t i = 0; i < n; i++)
		for (int64_t e = 0; e < ldo; e++) {
			const float gv = got[i * ldo + e];
			if (e >= H * V) { /* the row's gap past H V: untouched */
				gaps &= ops_is_fill_f32(gv);
				continue;
			}
			finite &= isfinite(gv);
			const double d = fabs((double)gv - ref[i * ldo + e]);
			max_err = d > max_err ? d : max_err;
		}
	const double tol = variants[vi].tol * (max_ref > 0 ? max_ref : 1.0);
	OPS_CHECK(finite, "%s: NaN / Inf in the output", nm);
	OPS_CHECK(gaps, "%s: wrote between rows", nm);
	OPS_CHECK(max_err <= tol, "%s: max |gpu - ref| %.3g > %.3g (max |ref| %.3g)", nm, max_err, tol,
	          max_ref);
	OPS_CHECK(rc == 0 && memcmp(got, got2, sizeof(float) * (size_t)(n * ldo)) == 0,
	          "%s: a second run differs (rc %d)", nm, rc);
	printf("  %-40s max|d| %.3g = %.2e of max|ref| %.3g\n", nm, max_err,
	       max_err / (max_ref > 0 ? max_ref : 1), max_ref);
out:
	ops_dbuf_fini(&ob);
	kcuda_free(d_pool);
	kcuda_free(d_tbl);
	kcuda_free(d_q);
	kcuda_free(d_qr);
	kcuda_free(d_ws);
	hw_fini(&kb);
	hw_fini(&vb);
	free(pool);
	free(tbl);
	free(q);
	free(qr);
	free(lat);
	free(valid);
	free(kk);
	free(vv);
	free(sc);
	free(acc);
	free(ref);
	free(got);
	free(got2);
}

int main(void)
{
	if (kcuda_ctx_create(0, (size_t)64 << 20, &ctx)) {
		printf("SKIP: no CUDA device\n");
		return 77;
	}
	ops_seed_init();
	const struct dcase cases[] = {
	    {"odd H3 C64 R16 N32 V48 kb32 qb16", 1, 3, 64, 16, 32, 48, 0, 70, KT_Q8_0, 1, 32, 16, -1},
	    {"fp32 pool pos0 100 kb64 qb50 F32 gaps", 0, 4, 128, 32, 64, 64, 100, 150, KT_F32, 0, 64, 50, -1},
	    {"F16 weights, no rope part", 1, 2, 64, 0, 32, 32, 5, 40, KT_F16, 0, 0, 0, -1},
	    {"bad block", 1, 4, 64, 16, 32, 32, 40, 200, KT_Q8_0, 1, 64, 0, 2},
	    {"DeepSeek-V3 rank H16 n256", 1, 16, 512, 64, 128, 128, 0, 256, KT_Q8_0, 1, 0, 0, -1},
	    {"GLM-5 rank H8 pos0 1900 n300", 1, 8, 512, 64, 192, 256, 1900, 300, KT_Q8_0, 1, 0, 0, -1},
	};
	/* TANDEM_OPS_SMALL=1 (compute-sanitizer runs): the first four cases only */
	const size_t n_cases = getenv("TANDEM_OPS_SMALL") ? 4 : sizeof cases / sizeof cases[0];
	for (size_t i = 0; i < n_cases; i++)
		for (int vi = 0; vi < (int)(sizeof variants / sizeof variants[0]); vi++)
			run_case(&cases[i], vi);
	printf("test_ops_mla_dense: %d checks, %d failed\n", ops_n_check, ops_n_fail);
	kcuda_ctx_destroy(ctx);
	return ops_n_fail ? 1 : 0;
}
#endif
