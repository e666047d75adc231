/* kfwd_head_gemv (kernels/cuda/head_gemv.cu: the absorbed MLA's per-head k_b / v_b products in one
 * launch) against kcpu_matmul run head by head on the same bytes: GLM-5 per-rank shapes at TP=8
 * (8 heads, k_b 192 -> 512, v_b 512 -> 256), DeepSeek-V3 (16 heads, 128 -> 512, 512 -> 128) and the
 * tiny models' (64 -> 256, 256 -> 128), types Q8_0 (what the files hold), BF16, F16, F32, Q4_K
 * (where n_in allows), 1, 2, 3, 5, 8, 9, 16, 32 and 128 tokens (up to 8 tokens: gemv3 where n_in % 256 == 0,
 * head_gemv_q8.cu for the Q8_0 k_b rows of 64..256; quantized heads otherwise the tensor-core tile
 * product from 2 tokens on; again with
 * TANDEM_GEMV_MMA=0 for Q8_0 up to 16 tokens and with TANDEM_GEMV3=0 up to 8), every case run
 * twice (bit-identical), activations with a head
 * stride larger than n_in (q_nope inside q's N + R) and outputs with one larger than n_out (q_abs's C + R).
 * fp32 on both sides: max error <= 2e-6 sqrt(n_in) x sum|w x| per output (test_ops_matmul's GEMV bound);
 * guard bytes around the output; the rows between heads (q_abs's rope part) untouched; argument checks. Exit
 * 77 = no GPU (skip). */
#include <errno.h>

#include "common/base/err.h"
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

static void head_case(int type, int H, int64_t n_in, int64_t n_out, int64_t xpad, int64_t ypad, int n_tok)
{
	size_t rb = 0;
	if (!ktype_row_bytes(type, n_in, &rb))
		return; /* n_in not a multiple of the type's block */
	const int64_t xhs = n_in + xpad, yhs = n_out + ypad, ldx = H * xhs, ldy = H * yhs;
	const size_t mat = rb * (size_t)n_out;
	uint8_t *w = malloc(mat * (size_t)H);
	float *x = malloc(sizeof(float) * (size_t)(n_tok * ldx)),
	      *ref = malloc(sizeof(float) * (size_t)(n_tok * ldy));
	float *got = malloc(sizeof(float) * (size_t)(n_tok * ldy));
	float *deq = malloc(sizeof(float) * (size_t)n_in);
	struct kweight dw = {0};
	void *d_x = NULL;
	struct ops_dbuf ob = {0};
	ops_fill_weight(type, n_in, n_out * H, rb, w);
	for (int64_t i = 0; i < n_tok * ldx; i++)
		x[i] = ops_rng_unif();
	for (int64_t i = 0; i < n_tok * ldy; i++)
		ref[i] = 7.0f; /* the gaps between heads must keep what was there */
	for (int h = 0; h < H; h++) {
		struct kweight wh = {type, n_in, n_out, rb, w + (size_t)h * mat};
		kcpu_matmul(NULL, &wh, x + h * xhs, ldx, n_tok, ref + h * yhs, ldy);
	}
	struct kweight hw = {type, n_in, n_out * H, rb, w};
	if (kcuda_weight_upload(ctx, &hw, &dw) || kcuda_alloc(sizeof(float) * (size_t)(n_tok * ldx), &d_x) ||
	    ops_dbuf_init(ctx, &ob, sizeof(float) * (size_t)(n_tok * ldy))) {
		OPS_CHECK(0, "head_gemv %s: device allocation", ktype_name(type));
		goto out;
	}
	kcuda_upload(ctx, d_x, x, sizeof(float) * (size_t)(n_tok * ldx));
	for (int64_t i = 0; i < n_tok * ldy; i++)
		got[i] = 7.0f;
	kcuda_upload(ctx, ob.user, got, sizeof(float) * (size_t)(n_tok * ldy));
	struct kweight w0 = dw;
	w0.n_out = n_out;
	OPS_CHECK(kfwd_head_gemv_ok(&w0, mat), "head_gemv %s n_in %lld: not ok", ktype_name(type),
	          (long long)n_in);
	int rc = kfwd_head_gemv(ctx, &w0, mat, H, d_x, ldx, xhs, n_tok, ob.user, ldy, yhs);
	OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0, "head_gemv %s: rc %d", ktype_name(type), rc);
	size_t gb = ops_dbuf_get(ctx, &ob, got);
	OPS_CHECK(gb == 0, "head_gemv %s: %zu guard bytes damaged", ktype_name(type), gb);
	{ /* a second run gives the same bits (every path reduces in a fixed order) */
		float *again = malloc(sizeof(float) * (size_t)(n_tok * ldy));
		int rc2 =
		    again ? kfwd_head_gemv(ctx, &w0, mat, H, d_x, ldx, xhs, n_tok, ob.user, ldy, yhs) : -1;
		if (!rc2)
			rc2 = kcuda_sync(ctx);
		if (!rc2)
			ops_dbuf_get(ctx, &ob, again);
		OPS_CHECK(rc2 == 0 && memcmp(again, got, sizeof(float) * (size_t)(n_tok * ldy)) == 0,
		          "head_gemv %s H %d n_tok %d: second run differs", ktype_name(type), H, n_tok);
		free(again);
	}
	int bad = 0;
	double worst = 0;
	const double tol = 2e-6 * sqrt((double)n_in); /* test_ops_matmul's GEMV tolerance */
	for (int h = 0; h < H; h++) {
		struct kweight wh = {type, n_in, n_out, rb, w + (size_t)h * mat};
		for (int64_t r = 0; r < n_out; r++) {
			kcpu_dequant_row(type, (const uint8_t *)wh.data + (size_t)r * rb, deq, n_in);
			for (int t = 0; t < n_tok; t++) {
				double s = 0;
				for (int64_t i = 0; i < n_in; i++)
					s += fabs((double)deq[i] * x[t * ldx + h * xhs + i]);
				const double e =
				    fabs((double)got[t * ldy + h * yhs + r] - ref[t * ldy + h * yhs + r]);
				if (!(e <= tol * s + 1e-30))
					bad++;
				if (s > 0 && e / s > worst)
					worst = e / s;
			}
		}
		for (int t = 0; t < n_tok; t++)
			for (int64_t r = n_out; r < yhs && h < H - 1; r++)
				bad += got[t * ldy + h * yhs + r] != 7.0f;
	}
	OPS_CHECK(bad == 0, "head_gemv %s H %d %lldx%lld n_tok %d: %d outputs off (worst %.2g of sum|wx|)",
	          ktype_name(type), H, (long long)n_out, (long long)n_in, n_tok, bad, worst);
	printf("head_gemv %-5s H %2d %4lld -> %4lld, %3d tokens: worst err %.2g of sum|w x|\n",
	       ktype_name(type), H, (long long)n_in, (long long)n_out, n_tok, worst);
out:
	kcuda_weight_free(&dw);
	kcuda_free(d_x);
	ops_dbuf_fini(&ob);
	free(w);
	free(x);
	free(ref);
	free(got);
	free(deq);
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
	static const int types[] = {KT_Q8_0, KT_BF16, KT_F16, KT_F32, KT_Q4_K};
	/* quantized heads take the tensor-core tile product from 2 tokens on (head_gemv.cu); the
	 * second pass (TANDEM_GEMV_MMA=0) checks the warp-per-row kernel at the same counts */
	/* n_tok <= 8 with n_in % 256 (v_b) take gemv3 (matmul_gemv3.cu); the third pass
	 * (TANDEM_GEMV3=0) checks what they took before */
	static const int toks[] = {1, 2, 3, 5, 8, 9, 16, 32, 128};
	for (int off = 0; off < 3; off++)
		for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++)
			for (size_t k = 0; k < sizeof(toks) / sizeof(toks[0]); k++) {
				setenv("TANDEM_GEMV_MMA", off == 1 ? "0" : "1", 1);
				setenv("TANDEM_GEMV3", off == 2 ? "0" : "1", 1);
				if (off == 1 && (types[t] != KT_Q8_0 || toks[k] > 16))
					continue;
				if (off == 2 && toks[k] > 8)
					continue;
				/* GLM-5 v_b with strided heads (x 4 floats apart: aligned; y 3) */
				head_case(types[t], 8, 512, 256, 4, 3, toks[k]);
				head_case(types[t], 8, 192, 512, 64, 64,
				          toks[k]); /* GLM-5 k_b: q_nope in q, q_abs */
				head_case(types[t], 8, 512, 256, 0, 0, toks[k]); /* GLM-5 v_b */
				head_case(types[t], 16, 128, 512, 64, 64, toks[k]); /* DeepSeek-V3 k_b */
				head_case(types[t], 16, 512, 128, 0, 0, toks[k]); /* DeepSeek-V3 v_b */
				head_case(types[t], 4, 64, 256, 32, 32, toks[k]); /* tiny k_b */
			}
	unsetenv("TANDEM_GEMV_MMA");
	unsetenv("TANDEM_GEMV3");
	float *f = (float *)16;
	size_t rb = 0;
	ktype_row_bytes(KT_Q8_0, 192, &rb);
	struct kweight w = {KT_Q8_0, 192, 512, rb, f};
	OPS_CHECK(kfwd_head_gemv(ctx, &w, rb * 512, 8, f, 8 * 256, 100, 1, f, 8 * 576, 576) == -EINVAL,
	          "head stride < n_in accepted");
	OPS_CHECK(kfwd_head_gemv(ctx, &w, rb * 511, 8, f, 8 * 256, 256, 1, f, 8 * 576, 576) == -EINVAL,
	          "mat_bytes < one matrix accepted");
	OPS_CHECK(kfwd_head_gemv(ctx, &w, rb * 512, 8, f, 7 * 256, 256, 1, f, 8 * 576, 576) == -EINVAL,
	          "ldx too small accepted");
	struct kweight w2 = w;
	w2.n_in = 200;
	OPS_CHECK(!kfwd_head_gemv_ok(&w2, rb * 512), "n_in 200 (not a multiple of 16) accepted");
	kcuda_ctx_destroy(ctx);
	printf("%d checks, %d failed\n", ops_n_check, ops_n_fail);
	return ops_n_fail ? 1 : 0;
}
#endif
