/* Decode GEMV: Y[t][r] = dot(W row r, X[t]) for n_tok <= 8, streaming W once from HBM.
 *
 * Grid: a block of GEMV_WARPS warps owns GEMV_ROWS consecutive rows; the warps split each row's
 * 16-element pieces (quant_piece.cuh) between them: warp w, lane l takes pieces
 * (w * 32 + l) + k * 32 * GEMV_WARPS, so every warp-wide load of weights and activations is
 * contiguous. Per piece the raw bytes of all GEMV_ROWS rows are loaded first (many loads in
 * flight per warp), then each row is decoded to (v[16], a, b) and accumulated as
 * a * sum(v x) + b * sum(x) per token, sum(x) shared by the rows; the activation pieces of the
 * (up to GEMV_MAX_NT) tokens stay in registers across the rows. More tokens take more launches,
 * each re-reading W: for n_tok > 2 this kernel is not the right tool on low-bit types (it is
 * integer-ALU bound already at n_tok = 1; measured in docs/PERFORMANCE.md); a tensor-core
 * version is the next step. Software pipelining (next piece's loads before this piece's decode),
 * lane-constant offsets, 8 rows per block and register caps (launch bounds) were tried and
 * measured slower (docs/PERFORMANCE.md).
 * Partial sums: warp shuffle, then shared memory across the warps. fp32 throughout.
 * Assumes n_in % 16 == 0 and activation rows 16-byte aligned (ldx % 4 == 0); float weights with
 * other n_in or alignment use gemv_scalar (correctness path, not speed). */
#include "kernels/cuda/matmul_impl.cuh"
#include "kernels/cuda/quant_piece.cuh"

#define GEMV_WARPS 4
#define GEMV_ROWS 4 /* measured best against 8, also on big matrices (docs/PERFORMANCE.md) */
#define GEMV_MAX_NT 2 /* tokens per launch (activations in registers); more take more launches */

__device__ __forceinline__ void ld_x16(const float *x, int64_t p, float *xv)
{
	const float4 *xp = (const float4 *)(x + 16 * p);
#pragma unroll
	for (int i = 0; i < 4; i++) {
		const float4 f = __ldg(xp + i);
		xv[4 * i] = f.x, xv[4 * i + 1] = f.y, xv[4 * i + 2] = f.z, xv[4 * i + 3] = f.w;
	}
}

template <int T, int NT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int64_t n_out, int64_t n_pieces,
                const float *__restrict__ x, int64_t ldx, int n_tok, float *__restrict__ y, int64_t ldy,
                int pf)
{
	/* this block's rows into L2 while the kernel before still runs (weights only: cuda_common.cuh) */
	if (pf && threadIdx.x < GEMV_ROWS && (int64_t)blockIdx.x * GEMV_ROWS + threadIdx.x < n_out)
		kdep_prefetch_l2(w + (size_t)((int64_t)blockIdx.x * GEMV_ROWS + threadIdx.x) * row_bytes,
		                 row_bytes);
	KDEP_ENTRY();
	x = kdep_after(x); /* x only from here on (matmul_impl.cuh) */
	static_assert(NT <= GEMV_MAX_NT, "activations are held in registers");
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

	for (int64_t p = warp * 32 + lane; p < n_pieces; p += 32 * GEMV_WARPS) {
		typename kq<T>::raw raw[GEMV_ROWS];
#pragma unroll
		for (int r = 0; r < GEMV_ROWS; r++)
			kq<T>::load(rp[r], p, raw[r]);
		float xs[NT];
		float xv[NT][16];
#pragma unroll
		for (int t = 0; t < NT; t++) {
			if (t >= n_tok)
				break;
			ld_x16(x + t * ldx, p, xv[t]);
			if (kq<T>::HAS_B) {
				float s = 0.0f;
#pragma unroll
				for (int i = 0; i < 16; i++)
					s += xv[t][i];
				xs[t] = s;
			}
		}
#pragma unroll
		for (int r = 0; r < GEMV_ROWS; r++) {
			float v[16], a, b;
			kq<T>::decode(raw[r], p, v, a, b);
#pragma unroll
			for (int t = 0; t < NT; t++) {
				if (t >= n_tok)
					break;
				const float *q = xv[t];
				float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
				for (int i = 0; i < 16; i += 2) {
					s0 = fmaf(v[i], q[i], s0);
					s1 = fmaf(v[i + 1], q[i + 1], s1);
				}
				float acc_rt = fmaf(a, s0 + s1, acc[r][t]);
				if (kq<T>::HAS_B)
					acc_rt = fmaf(b, xs[t], acc_rt);
				acc[r][t] = acc_rt;
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
                            const float *__restrict__ x, int64_t ldx, int n_tok, float *__restrict__ y,
                            int64_t ldy)
{
	KDEP_ENTRY();
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
static int launch_nt(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx, int n_tok,
                     float *y, int64_t ldy)
{
	const unsigned grid = (unsigned)((w->n_out + GEMV_ROWS - 1) / GEMV_ROWS);
	return klaunch("gemv", gemv_kernel<T, NT>, dim3(grid), dim3(GEMV_WARPS * 32), 0, c->stream,
	               (const uint8_t *)w->data, w->row_bytes, w->n_out, w->n_in / 16, x, ldx, n_tok, y, ldy,
	               kcuda_prefetch_enabled());
}

template <int T>
static int launch_type(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx, int n_tok,
                       float *y, int64_t ldy)
{
	const bool is_float = T == KT_F32 || T == KT_F16 || T == KT_BF16;
	if (is_float &&
	    (w->n_in % 16 || w->row_bytes % 16 || (uintptr_t)w->data % 16 || ldx % 4 || (uintptr_t)x % 16)) {
		if constexpr (T == KT_F32 || T == KT_F16 || T == KT_BF16) {
			const unsigned grid = (unsigned)((w->n_out + GEMV_WARPS - 1) / GEMV_WARPS);
			return klaunch("gemv_scalar", gemv_scalar<T>, dim3(grid), dim3(GEMV_WARPS * 32), 0,
			               c->stream, (const uint8_t *)w->data, w->row_bytes, w->n_out, w->n_in,
			               x, ldx, n_tok, y, ldy);
		}
		return ERR_UNSUPPORTED;
	}
	for (int t0 = 0; t0 < n_tok; t0 += GEMV_MAX_NT) {
		const int nt = n_tok - t0 < GEMV_MAX_NT ? n_tok - t0 : GEMV_MAX_NT;
		const int rc = nt == 1 ? launch_nt<T, 1>(c, w, x + t0 * ldx, ldx, nt, y + t0 * ldy, ldy)
		                       : launch_nt<T, 2>(c, w, x + t0 * ldx, ldx, nt, y + t0 * ldy, ldy);
		if (rc)
			return rc;
	}
	return 0;
}

int kcuda_gemv_launch(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx, int n_tok,
                      float *y, int64_t ldy)
{
	switch (w->type) {
#define X(T)                                                                                                 \
	case T: return launch_type<T>(c, w, x, ldx, n_tok, y, ldy);
		KCUDA_FOR_EACH_TYPE(X)
#undef X
	default: return ERR_UNSUPPORTED;
	}
}
