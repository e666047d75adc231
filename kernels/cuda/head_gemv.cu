/* Per-head products of the absorbed MLA in one launch (common/model/backend_cuda.c, mla_attn):
 *   y[t][h * yhs + r] = dot(W_h row r, x[t][h * xhs ..]),  W_h = the h-th of H stacked matrices
 * (attn_k_b: q_nope -> latent, attn_v_b: latent -> value), for n_tok tokens. The same as H calls of
 * kcuda_matmul on kweight3_at(h), which cost H launches of a few microseconds each per layer.
 * n_tok >= HG_TILE_MIN_TOK with quantized weights goes to the tile product (below). Here:
 * grid (ceil(n_out / 4), H * n_tok): a warp per (row, head, token); lane l sums the 16-element
 * pieces l, l + 32, ... (quant_piece.cuh decoders, fp32 fmaf), then a warp sum. The matrices are
 * small (N x C, C x V per head: < 1 MB), so re-reading one per token costs L2, not HBM.
 * Needs n_in % 16 == 0; float types also need 16-byte aligned rows (the piece loads are vectors);
 * kfwd_head_gemv_ok says whether a weight qualifies. */
#include "kernels/cuda/matmul_impl.cuh"
#include "kernels/cuda/model_fwd.h"
#include "kernels/cuda/quant_piece.cuh"

/* From this many tokens on, quantized heads take the tensor-core tile product (matmul_tile.cu: all
 * heads in one launch, each head's matrix read once per 64 tokens instead of once per token; the
 * profile of run 1 had this kernel at 3.6-14 GB/s at batch 32/128). One token stays here: a warp
 * per row already reads each weight once. TANDEM_GEMV_MMA=0 keeps every n_tok here. */
#define HG_TILE_MIN_TOK 2

#define HG_WARPS 4

template <int T>
__global__ void __launch_bounds__(HG_WARPS * 32)
    head_gemv_kernel(const uint8_t *__restrict__ w, size_t mat_bytes, size_t row_bytes, int64_t n_out,
                     int64_t n_in, int H, const float *__restrict__ x, int64_t ldx, int64_t xhs,
                     float *__restrict__ y, int64_t ldy, int64_t yhs)
{
	KDEP_ENTRY();
	const int lane = threadIdx.x & 31;
	const int64_t r = (int64_t)blockIdx.x * HG_WARPS + (threadIdx.x >> 5);
	if (r >= n_out)
		return;
	const int h = (int)(blockIdx.y % (unsigned)H);
	const int64_t t = blockIdx.y / (unsigned)H;
	const uint8_t *row = w + (size_t)h * mat_bytes + (size_t)r * row_bytes;
	const float *xv = x + t * ldx + (int64_t)h * xhs;
	float acc = 0.0f;
	for (int64_t p = lane; p < n_in / 16; p += 32) {
		float v[16];
		kq_values<T>(row, p, v);
#pragma unroll
		for (int i = 0; i < 16; i++)
			acc = fmaf(v[i], xv[16 * p + i], acc);
	}
	acc = kc_warp_sum(acc);
	if (lane == 0)
		y[t * ldy + (int64_t)h * yhs + r] = acc;
}

extern "C" bool kfwd_head_gemv_ok(const struct kweight *w0, size_t mat_bytes)
{
	const bool is_float = w0->type == KT_F32 || w0->type == KT_F16 || w0->type == KT_BF16;
	if (!w0->data || w0->n_in <= 0 || w0->n_out <= 0 || w0->n_in % 16)
		return false;
	return !is_float || (w0->row_bytes % 16 == 0 && mat_bytes % 16 == 0 && (uintptr_t)w0->data % 16 == 0);
}

template <int T>
static int head_launch(struct kcuda_ctx *c, const struct kweight *w0, size_t mat_bytes, int H, const float *x,
                       int64_t ldx, int64_t xhs, int64_t n_tok, float *y, int64_t ldy, int64_t yhs)
{
	dim3 grid((unsigned)((w0->n_out + HG_WARPS - 1) / HG_WARPS), (unsigned)(H * n_tok));
	return klaunch("head_gemv", head_gemv_kernel<T>, grid, dim3(HG_WARPS * 32), 0, c->stream,
	               (const uint8_t *)w0->data, mat_bytes, w0->row_bytes, w0->n_out, w0->n_in, H, x, ldx,
	               xhs, y, ldy, yhs);
}

extern "C" int kfwd_head_gemv(struct kcuda_ctx *c, const struct kweight *w0, size_t mat_bytes, int H,
                              const float *x, int64_t ldx, int64_t xhs, int64_t n_tok, float *y, int64_t ldy,
                              int64_t yhs)
{
	size_t rb = 0;
	if (!c || !w0 || !x || !y || H < 1 || n_tok < 0 || !kfwd_head_gemv_ok(w0, mat_bytes) ||
	    !ktype_row_bytes(w0->type, w0->n_in, &rb) || rb != w0->row_bytes ||
	    mat_bytes < rb * (size_t)w0->n_out || xhs < w0->n_in ||
	    ldx < (int64_t)H * xhs - (xhs - w0->n_in) || yhs < w0->n_out ||
	    ldy < (int64_t)H * yhs - (yhs - w0->n_out))
		return kcuda_bad_arg("head_gemv",
		                     "H %d, n_tok %lld, %s %lld x %lld (row_bytes %zu, mat_bytes %zu), "
		                     "ldx %lld xhs %lld ldy %lld yhs %lld",
		                     H, (long long)n_tok, w0 ? ktype_name(w0->type) : "-",
		                     w0 ? (long long)w0->n_out : 0LL, w0 ? (long long)w0->n_in : 0LL,
		                     w0 ? w0->row_bytes : 0, mat_bytes, (long long)ldx, (long long)xhs,
		                     (long long)ldy, (long long)yhs);
	if (n_tok == 0)
		return 0;
	/* decode sizes: gemv3 (matmul_gemv3.cu) where it takes the type and shape (Q8_0 / float
	 * types, n_in % 256: v_b 512 -> 256), Q8_0 rows of 64..256 (k_b's 192 / 128) in
	 * head_gemv_q8.cu; TANDEM_GEMV3=0 turns both off */
	if (n_tok <= 8) {
		/* TANDEM_GEMV_RES=1: 1-2 tokens with the rows in shared memory before the wait (v_b;
		 * matmul_gemv_res.cu) */
		int rc = kcuda_gemv_res_heads(c, w0, mat_bytes, H, x, ldx, xhs, (int)n_tok, y, ldy, yhs);
		if (rc == ERR_UNSUPPORTED)
			rc = kcuda_gemv3_heads(c, w0, mat_bytes, H, x, ldx, xhs, (int)n_tok, y, ldy, yhs);
		if (rc == ERR_UNSUPPORTED) /* Q8_0 k_b: short rows (head_gemv_q8.cu) */
			rc = kcuda_head_q8_launch(c, w0, mat_bytes, H, x, ldx, xhs, (int)n_tok, y, ldy, yhs);
		if (rc != ERR_UNSUPPORTED)
			return rc;
	}
	if (n_tok >= HG_TILE_MIN_TOK && n_tok <= INT32_MAX && kcuda_mm_mma_enabled()) {
		const int rc =
		    kcuda_mm_tile_launch(c, w0, mat_bytes, H, x, ldx, xhs, (int)n_tok, y, ldy, yhs, true);
		if (rc != ERR_UNSUPPORTED)
			return rc;
	}
	if ((int64_t)H * n_tok > 65535)
		return ERR_LIMIT;
	switch (w0->type) {
#define X(T)                                                                                                 \
	case T: return head_launch<T>(c, w0, mat_bytes, H, x, ldx, xhs, n_tok, y, ldy, yhs);
		KCUDA_FOR_EACH_TYPE(X)
#undef X
	default: return ERR_UNSUPPORTED;
	}
}
