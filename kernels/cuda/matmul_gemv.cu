/* Decode GEMV: Y[t][r] = dot(W row r, X[t]) for n_tok <= 8, streaming W once from HBM.
 *
 * Grid: one warp per ROWS consecutive rows, WARPS warps per block; lane l takes units (32-element
 * pieces, see quant_unit.cuh) l, l+32, ... of those rows, dequantizes each unit in registers to
 * fp32 and accumulates against the n_tok activation rows (read through L1/L2: they are small and
 * shared by every warp). The ROWS rows reuse each loaded activation value, which keeps L1 traffic
 * below the weight stream. A warp reduction ends each row. fp32 accumulation throughout, so the
 * result matches kcpu_matmul up to summation order.
 * Assumes: n_in a multiple of 32, x rows 16-byte aligned (ldx % 4 == 0). Float weights with other
 * n_in or alignment use gemv_scalar (element-wise), which exists for correctness, not speed. */
#include "kernels/cuda/matmul_impl.cuh"
#include "kernels/cuda/quant_unit.cuh"

#define GEMV_WARPS 4
#define GEMV_ROWS 2

template <int T, int NT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
	gemv_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int64_t n_out, int n_units,
		    const float *__restrict__ x, int64_t ldx, int n_tok, float *__restrict__ y, int64_t ldy)
{
	const int lane = threadIdx.x & 31;
	const int64_t row0 = ((int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * GEMV_ROWS;
	if (row0 >= n_out)
		return;
	const uint8_t *rp[GEMV_ROWS];
#pragma unroll
	for (int r = 0; r < GEMV_ROWS; r++)
		rp[r] = w + (size_t)min(row0 + r, n_out - 1) * row_bytes;

	float acc[GEMV_ROWS][NT];
#pragma unroll
	for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
		for (int t = 0; t < NT; t++)
			acc[r][t] = 0.0f;

	for (int u = lane; u < n_units; u += 32) {
		float v[GEMV_ROWS][32];
#pragma unroll
		for (int r = 0; r < GEMV_ROWS; r++)
			kq<T>::unit(rp[r], u, v[r]);
#pragma unroll
		for (int t = 0; t < NT; t++) {
			if (t >= n_tok)
				break;
			const float4 *xp = (const float4 *)(x + t * ldx + 32 * (int64_t)u);
#pragma unroll
			for (int i = 0; i < 8; i++) {
				const float4 xv = __ldg(xp + i);
#pragma unroll
				for (int r = 0; r < GEMV_ROWS; r++) {
					float a = acc[r][t];
					a = fmaf(v[r][4 * i + 0], xv.x, a);
					a = fmaf(v[r][4 * i + 1], xv.y, a);
					a = fmaf(v[r][4 * i + 2], xv.z, a);
					a = fmaf(v[r][4 * i + 3], xv.w, a);
					acc[r][t] = a;
				}
			}
		}
	}
#pragma unroll
	for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
		for (int t = 0; t < NT; t++) {
			float s = kc_warp_sum(acc[r][t]);
			if (lane == 0 && t < n_tok && row0 + r < n_out)
				y[t * ldy + row0 + r] = s;
		}
}

/* Element-wise GEMV for float weights of any n_in / alignment: one warp per row. */
template <int T>
__global__ void gemv_scalar(const uint8_t *__restrict__ w, size_t row_bytes, int64_t n_out, int64_t n_in,
			    const float *__restrict__ x, int64_t ldx, int n_tok, float *__restrict__ y, int64_t ldy)
{
	const int lane = threadIdx.x & 31;
	const int64_t row = (int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
	if (row >= n_out)
		return;
	const uint8_t *rp = w + (size_t)row * row_bytes;
	for (int t = 0; t < n_tok; t++) {
		float a = 0.0f;
		for (int64_t k = lane; k < n_in; k += 32) {
			float wv;
			if (T == KT_F32)
				wv = ((const float *)rp)[k];
			else if (T == KT_F16)
				wv = kc_h2f(((const uint16_t *)rp)[k]);
			else
				wv = kc_bf2f(((const uint16_t *)rp)[k]);
			a = fmaf(wv, x[t * ldx + k], a);
		}
		a = kc_warp_sum(a);
		if (lane == 0)
			y[t * ldy + row] = a;
	}
}

template <int T, int NT>
static void launch_nt(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx, int n_tok,
		      float *y, int64_t ldy)
{
	const int64_t rows_per_block = GEMV_WARPS * GEMV_ROWS;
	const unsigned grid = (unsigned)((w->n_out + rows_per_block - 1) / rows_per_block);
	gemv_kernel<T, NT><<<grid, GEMV_WARPS * 32, 0, c->stream>>>((const uint8_t *)w->data, w->row_bytes,
								   w->n_out, (int)(w->n_in / 32), x, ldx,
								   n_tok, y, ldy);
}

template <int T>
static int launch_type(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx, int n_tok,
		       float *y, int64_t ldy)
{
	const bool is_float = T == KT_F32 || T == KT_F16 || T == KT_BF16;
	if (is_float && (w->n_in % 32 || w->row_bytes % 16 || (uintptr_t)w->data % 16 || ldx % 4 ||
			 (uintptr_t)x % 16)) {
		if constexpr (T == KT_F32 || T == KT_F16 || T == KT_BF16) {
			const unsigned grid = (unsigned)((w->n_out + GEMV_WARPS - 1) / GEMV_WARPS);
			gemv_scalar<T><<<grid, GEMV_WARPS * 32, 0, c->stream>>>(
				(const uint8_t *)w->data, w->row_bytes, w->n_out, w->n_in, x, ldx, n_tok, y, ldy);
		}
		return kcuda_launch_status("gemv_scalar");
	}
	if (n_tok == 1)
		launch_nt<T, 1>(c, w, x, ldx, n_tok, y, ldy);
	else if (n_tok == 2)
		launch_nt<T, 2>(c, w, x, ldx, n_tok, y, ldy);
	else if (n_tok <= 4)
		launch_nt<T, 4>(c, w, x, ldx, n_tok, y, ldy);
	else
		launch_nt<T, 8>(c, w, x, ldx, n_tok, y, ldy);
	return kcuda_launch_status("gemv");
}

int kcuda_gemv_launch(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx, int n_tok,
		      float *y, int64_t ldy)
{
	switch (w->type) {
#define X(T)                                                                                       \
	case T:                                                                                    \
		return launch_type<T>(c, w, x, ldx, n_tok, y, ldy);
		KCUDA_FOR_EACH_TYPE(X)
#undef X
	default:
		return ERR_UNSUPPORTED;
	}
}
