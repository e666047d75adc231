/* Per-head Q8_0 products with short rows at decode sizes (kfwd_head_gemv, n_tok 1..8): the absorbed
 * MLA's k_b (GLM-5: 8 heads x 192 -> 512, DeepSeek-V3: 16 x 128 -> 512), whose rows (204 / 136
 * bytes) are too short and too unaligned for gemv3's 272-byte slabs (matmul_gemv3.cu):
 *   y[t][h yhs + r] = dot(W_h row r, x[t][h xhs ..]),  W_h = w0->data + h mat_bytes.
 * A warp owns HQ_RT rows of one head; lane l < n_in / 8 owns elements 8 l .. 8 l + 7 of every row
 * (quarter l % 4 of block l / 4) and loads them with three aligned loads per row (two words and a
 * half word for the quarters at 2 mod 4: no byte past the row is read), all rows' loads before any
 * math. Its x elements for every token are loaded once (float4) and reused for the HQ_RT rows; the
 * weights are read once for all n_tok tokens (the kernel before this took one pass per token or
 * the tensor-core tile product). fp32 throughout (bytes become floats with PRMT + FADD, exact),
 * then a warp sum: deterministic, as exact as kcuda_matmul's GEMV.
 * Needs n_in % 64 == 0 (rows 4-byte aligned) and n_in <= 256, W, mat_bytes and X 16-byte aligned
 * (ldx, xhs % 4 == 0); ERR_UNSUPPORTED otherwise, or with TANDEM_GEMV3=0. */
#include <string.h>

#include "kernels/cuda/matmul_impl.cuh"
#include "kernels/cuda/q8_warp_rows.cuh"

#define HQ_WARPS 4
#define HQ_RT 2 /* rows per warp */

/* grid (ceil(n_out / (HQ_WARPS HQ_RT)), H) */
template <int NT>
__global__ void __launch_bounds__(HQ_WARPS * 32)
    head_q8_kernel(const uint8_t *__restrict__ w, size_t mat_bytes, size_t row_bytes, int n_out, int n_q,
                   const float *__restrict__ x, int64_t ldx, int64_t xhs, int n_tok, float *__restrict__ y,
                   int64_t ldy, int64_t yhs)
{
	KDEP_ENTRY();
	const int warp = threadIdx.x >> 5;
	w += (size_t)blockIdx.y * mat_bytes;
	x += (int64_t)blockIdx.y * xhs;
	y += (int64_t)blockIdx.y * yhs;
	const int row0 = (blockIdx.x * HQ_WARPS + warp) * HQ_RT;
	kq8_warp_rows<HQ_RT, NT>(w, row_bytes, row0, n_out, n_q, kdep_after(x), ldx, n_tok, y, ldy);
}

template <int NT>
static int hq_launch(struct kcuda_ctx *c, const struct kweight *w0, size_t mat_bytes, int H, const float *x,
                     int64_t ldx, int64_t xhs, int n_tok, float *y, int64_t ldy, int64_t yhs)
{
	const dim3 grid((unsigned)((w0->n_out + HQ_WARPS * HQ_RT - 1) / (HQ_WARPS * HQ_RT)), (unsigned)H);
	return klaunch("head_gemv_q8", head_q8_kernel<NT>, grid, dim3(HQ_WARPS * 32), 0, c->stream,
	               (const uint8_t *)w0->data, mat_bytes, w0->row_bytes, (int)w0->n_out,
	               (int)(w0->n_in / 8), x, ldx, xhs, n_tok, y, ldy, yhs);
}

int kcuda_head_q8_launch(struct kcuda_ctx *c, const struct kweight *w0, size_t mat_bytes, int H,
                         const float *x, int64_t ldx, int64_t xhs, int n_tok, float *y, int64_t ldy,
                         int64_t yhs)
{
	if (!kcuda_gemv3_enabled() || w0->type != KT_Q8_0 || n_tok < 1 || n_tok > 8 || H < 1 || H > 65535 ||
	    w0->n_in < 64 || w0->n_in > 256 || w0->n_in % 64 || w0->n_out < 1 || w0->n_out > INT32_MAX ||
	    (uintptr_t)w0->data % 16 || mat_bytes % 16 || (uintptr_t)x % 16 || ldx % 4 || xhs % 4)
		return ERR_UNSUPPORTED;
	if (n_tok == 1)
		return hq_launch<1>(c, w0, mat_bytes, H, x, ldx, xhs, n_tok, y, ldy, yhs);
	if (n_tok == 2)
		return hq_launch<2>(c, w0, mat_bytes, H, x, ldx, xhs, n_tok, y, ldy, yhs);
	if (n_tok <= 4)
		return hq_launch<4>(c, w0, mat_bytes, H, x, ldx, xhs, n_tok, y, ldy, yhs);
	return hq_launch<8>(c, w0, mat_bytes, H, x, ldx, xhs, n_tok, y, ldy, yhs);
}
