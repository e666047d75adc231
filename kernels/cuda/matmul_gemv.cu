/* Decode GEMV: Y[t][r] = dot(W row r, X[t]) for n_tok <= 8, streaming W once from HBM.
 *
 * Grid: a block of GEMV_WARPS warps owns GEMV_ROWS consecutive rows; the warps split the row's
 * pieces (8 elements each, quant_piece.cuh) between them: warp w, lane l takes pieces
 * (w * 32 + l) + k * 32 * GEMV_WARPS, so every warp-wide load of weights and of activations is
 * contiguous. Each piece is dequantized in registers to fp32 once and used for all n_tok tokens
 * and the GEMV_ROWS rows share each activation load. Partial sums: warp shuffle, then shared
 * memory across the warps. fp32 throughout, so results equal kcpu_matmul up to summation order.
 * Assumes n_in % 8 == 0, activation rows 16-byte aligned (ldx % 4 == 0), and for the float types
 * 16-byte aligned rows; other float weights use gemv_scalar (correctness path, not speed). */
#include "kernels/cuda/matmul_impl.cuh"
#include "kernels/cuda/quant_piece.cuh"

#define GEMV_WARPS 4
#define GEMV_ROWS 4
#define GEMV_UNROLL 2

template <int T, int NT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
	gemv_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int64_t n_out, int64_t n_pieces,
		    const float *__restrict__ x, int64_t ldx, int n_tok, float *__restrict__ y, int64_t ldy)
{
	__shared__ float part[GEMV_WARPS][GEMV_ROWS][NT];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int64_t row0 = (int64_t)blockIdx.x * GEMV_ROWS;
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

	const int64_t step = 32 * GEMV_WARPS;
	int64_t p = warp * 32 + lane;
	/* main loop: GEMV_UNROLL pieces per row in flight before any FMA */
	for (; p + (GEMV_UNROLL - 1) * step < n_pieces; p += GEMV_UNROLL * step) {
		float v[GEMV_UNROLL][GEMV_ROWS][8];
#pragma unroll
		for (int u = 0; u < GEMV_UNROLL; u++)
#pragma unroll
			for (int r = 0; r < GEMV_ROWS; r++)
				kq<T>::piece(rp[r], p + u * step, v[u][r]);
#pragma unroll
		for (int u = 0; u < GEMV_UNROLL; u++)
#pragma unroll
			for (int t = 0; t < NT; t++) {
				if (t >= n_tok)
					break;
				const float4 *xp = (const float4 *)(x + t * ldx + 8 * (p + u * step));
				const float4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
#pragma unroll
				for (int r = 0; r < GEMV_ROWS; r++) {
					float a = acc[r][t];
					a = fmaf(v[u][r][0], x0.x, a);
					a = fmaf(v[u][r][1], x0.y, a);
					a = fmaf(v[u][r][2], x0.z, a);
					a = fmaf(v[u][r][3], x0.w, a);
					a = fmaf(v[u][r][4], x1.x, a);
					a = fmaf(v[u][r][5], x1.y, a);
					a = fmaf(v[u][r][6], x1.z, a);
					a = fmaf(v[u][r][7], x1.w, a);
					acc[r][t] = a;
				}
			}
	}
	for (; p < n_pieces; p += step) { /* tail */
		float v[GEMV_ROWS][8];
#pragma unroll
		for (int r = 0; r < GEMV_ROWS; r++)
			kq<T>::piece(rp[r], p, v[r]);
#pragma unroll
		for (int t = 0; t < NT; t++) {
			if (t >= n_tok)
				break;
			const float4 *xp = (const float4 *)(x + t * ldx + 8 * p);
			const float4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
#pragma unroll
			for (int r = 0; r < GEMV_ROWS; r++) {
				float a = acc[r][t];
				a = fmaf(v[r][0], x0.x, a);
				a = fmaf(v[r][1], x0.y, a);
				a = fmaf(v[r][2], x0.z, a);
				a = fmaf(v[r][3], x0.w, a);
				a = fmaf(v[r][4], x1.x, a);
				a = fmaf(v[r][5], x1.y, a);
				a = fmaf(v[r][6], x1.z, a);
				a = fmaf(v[r][7], x1.w, a);
				acc[r][t] = a;
			}
		}
	}
#pragma unroll
	for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
		for (int t = 0; t < NT; t++) {
			float s = kc_warp_sum(acc[r][t]);
			if (lane == 0)
				part[warp][r][t] = s;
		}
	__syncthreads();
	if (threadIdx.x < GEMV_ROWS * NT) {
		const int r = threadIdx.x / NT, t = threadIdx.x % NT;
		float s = 0.0f;
#pragma unroll
		for (int k = 0; k < GEMV_WARPS; k++)
			s += part[k][r][t];
		if (t < n_tok && row0 + r < n_out)
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
	const unsigned grid = (unsigned)((w->n_out + GEMV_ROWS - 1) / GEMV_ROWS);
	gemv_kernel<T, NT><<<grid, GEMV_WARPS * 32, 0, c->stream>>>((const uint8_t *)w->data, w->row_bytes,
								   w->n_out, w->n_in / 8, x, ldx, n_tok, y, ldy);
}

template <int T>
static int launch_type(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx, int n_tok,
		       float *y, int64_t ldy)
{
	const bool is_float = T == KT_F32 || T == KT_F16 || T == KT_BF16;
	if (is_float && (w->n_in % 8 || w->row_bytes % 16 || (uintptr_t)w->data % 16 || ldx % 4 ||
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
