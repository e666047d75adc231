/* Decode GEMV: Y[t][r] = dot(W row r, X[t]) for n_tok <= 8, streaming W once from HBM.
 *
 * Grid: a warp owns GEMV_ROWS(NT) consecutive rows; ks warps (1, 2 or 4, so that small matrices
 * still fill the GPU) split each row's 16-element pieces (quant_piece.cuh) between them: slice s,
 * lane l takes pieces (s * 32 + l) + k * 32 * ks, so every warp-wide load of weights and
 * activations is contiguous. A block holds GEMV_WARPS / ks row groups. The raw bytes of the
 * warp's rows and the activations of the next piece are requested before the current piece is
 * decoded (software pipeline: loads in flight while computing); each row is
 * decoded to (v[16], a, b) and accumulated as a * sum(v x) + b * sum(x) per token, sum(x)
 * shared by the rows, the activation piece held in registers for all rows. A launch takes up to
 * GEMV_MAX_NT tokens; more tokens take more launches (each re-reads W: see docs/PERFORMANCE.md).
 * Partial sums: warp shuffle, then shared memory across the ks warps. fp32 throughout.
 * Assumes n_in % 16 == 0 and activation rows 16-byte aligned (ldx % 4 == 0); float weights with
 * other n_in or alignment use gemv_scalar (correctness path, not speed). */
#include "kernels/cuda/matmul_impl.cuh"
#include "kernels/cuda/quant_piece.cuh"

#define GEMV_WARPS 4
/* rows per warp: 4, or 2 when 4 tokens' activations take the registers */
#define GEMV_ROWS(nt) ((nt) >= 4 ? 2 : 4)
#define GEMV_MAX_NT 4 /* tokens per launch: all held in registers; more tokens take more launches */

__device__ __forceinline__ void ld_x16(const float *x, int64_t p, float *xv)
{
	const float4 *xp = (const float4 *)(x + 16 * p);
#pragma unroll
	for (int i = 0; i < 4; i++) {
		const float4 f = __ldg(xp + i);
		xv[4 * i] = f.x, xv[4 * i + 1] = f.y, xv[4 * i + 2] = f.z, xv[4 * i + 3] = f.w;
	}
}

template <int T, int R>
__device__ __forceinline__ void load_rows(const uint8_t *const *rp, int64_t p, typename kq<T>::raw *raw)
{
#pragma unroll
	for (int r = 0; r < R; r++)
		kq<T>::load(rp[r], p, raw[r]);
}

/* requests the raw bytes of piece p of the R rows and the n_tok activation pieces */
template <int T, int NT, int R>
__device__ __forceinline__ void gemv_fetch(const uint8_t *const *rp, int64_t p, const float *x, int64_t ldx, int n_tok,
					   typename kq<T>::raw *raw, float (*xv)[16])
{
	load_rows<T, R>(rp, p, raw);
#pragma unroll
	for (int t = 0; t < NT; t++)
		if (t < n_tok)
			ld_x16(x + t * ldx, p, xv[t]);
}

/* decodes piece p of the R rows and accumulates it against the n_tok activation pieces */
template <int T, int NT, int R>
__device__ __forceinline__ void gemv_piece(const typename kq<T>::raw *raw, const float (*xv)[16], int64_t p, int n_tok,
					   float (*acc)[NT])
{
	float xs[NT];
#pragma unroll
	for (int t = 0; t < NT; t++) {
		if (t >= n_tok)
			break;
		if (kq<T>::HAS_B) {
			float s = 0.0f;
#pragma unroll
			for (int i = 0; i < 16; i++)
				s += xv[t][i];
			xs[t] = s;
		}
	}
#pragma unroll
	for (int r = 0; r < R; r++) {
		float v[16], a, b;
		kq<T>::decode(raw[r], p, v, a, b);
#pragma unroll
		for (int t = 0; t < NT; t++) {
			if (t >= n_tok)
				break;
			float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
			for (int i = 0; i < 16; i += 2) {
				s0 = fmaf(v[i], xv[t][i], s0);
				s1 = fmaf(v[i + 1], xv[t][i + 1], s1);
			}
			float acc_rt = fmaf(a, s0 + s1, acc[r][t]);
			if (kq<T>::HAS_B)
				acc_rt = fmaf(b, xs[t], acc_rt);
			acc[r][t] = acc_rt;
		}
	}
}

template <int T, int NT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
	gemv_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int64_t n_out, int64_t n_pieces,
		    const float *__restrict__ x, int64_t ldx, int n_tok, float *__restrict__ y, int64_t ldy, int ks)
{
	constexpr int R = GEMV_ROWS(NT);
	__shared__ float part[GEMV_WARPS][R][NT];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int slice = warp % ks; /* which K slice of its row group this warp takes */
	const int64_t row0 = ((int64_t)blockIdx.x * (GEMV_WARPS / ks) + warp / ks) * R;
	const uint8_t *rp[R];
#pragma unroll
	for (int r = 0; r < R; r++)
		rp[r] = w + (size_t)min(row0 + r, n_out - 1) * row_bytes;

	float acc[R][NT];
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int t = 0; t < NT; t++)
			acc[r][t] = 0.0f;

	/* software pipeline, unrolled by two so the buffers swap roles without copies: the raw
	 * weight bytes and the activations of the next piece are requested before the current piece
	 * is decoded, so every warp keeps its loads in flight while it computes. Pieces are indexed
	 * as p = 16 * q + pl with pl = lane & 15 fixed per lane (the same place in every block). */
	const int64_t pl = lane & 15;
	const int64_t q_step = 2 * ks;
	int64_t q = 2 * slice + (lane >> 4);
	typename kq<T>::raw ra[R], rb[R];
	float xa[NT][16], xb[NT][16];
	if (row0 >= n_out)
		q = n_pieces; /* nothing to do (stays in the barrier below) */
	if (16 * q + pl < n_pieces)
		gemv_fetch<T, NT, R>(rp, 16 * q + pl, x, ldx, n_tok, ra, xa);
	for (;;) {
		int64_t p = 16 * q + pl;
		if (p >= n_pieces)
			break;
		if (p + 16 * q_step < n_pieces)
			gemv_fetch<T, NT, R>(rp, p + 16 * q_step, x, ldx, n_tok, rb, xb);
		gemv_piece<T, NT, R>(ra, xa, p, n_tok, acc);
		q += q_step;
		p = 16 * q + pl;
		if (p >= n_pieces)
			break;
		if (p + 16 * q_step < n_pieces)
			gemv_fetch<T, NT, R>(rp, p + 16 * q_step, x, ldx, n_tok, ra, xa);
		gemv_piece<T, NT, R>(rb, xb, p, n_tok, acc);
		q += q_step;
	}
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int t = 0; t < NT; t++) {
			float s = kc_warp_sum(acc[r][t]);
			if (lane == 0)
				part[warp][r][t] = s;
		}
	__syncthreads();
	/* thread -> (row group in block, row, token); sums the ks slices of the group */
	const int groups = GEMV_WARPS / ks;
	if (threadIdx.x < groups * R * NT) {
		const int g = threadIdx.x / (R * NT), r = (threadIdx.x / NT) % R, t = threadIdx.x % NT;
		const int64_t row = ((int64_t)blockIdx.x * groups + g) * R + r;
		float s = 0.0f;
		for (int k = 0; k < ks; k++)
			s += part[g * ks + k][r][t];
		if (t < n_tok && row < n_out)
			y[t * ldy + row] = s;
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
	/* K split: as many warps per row group as it takes to give every SM ~24 warps, at most
	 * GEMV_WARPS; big matrices get one warp per row group (long loops keep the pipeline full) */
	const int64_t groups = (w->n_out + GEMV_ROWS(NT) - 1) / GEMV_ROWS(NT);
	const int64_t want = (int64_t)c->n_sm * 24;
	const int ks = groups >= want ? 1 : (2 * groups >= want ? 2 : 4);
	const int64_t per_block = GEMV_WARPS / ks;
	const unsigned grid = (unsigned)((groups + per_block - 1) / per_block);
	gemv_kernel<T, NT><<<grid, GEMV_WARPS * 32, 0, c->stream>>>((const uint8_t *)w->data, w->row_bytes,
								   w->n_out, w->n_in / 16, x, ldx, n_tok, y, ldy,
								   ks);
}

template <int T>
static int launch_type(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx, int n_tok,
		       float *y, int64_t ldy)
{
	const bool is_float = T == KT_F32 || T == KT_F16 || T == KT_BF16;
	if (is_float && (w->n_in % 16 || w->row_bytes % 16 || (uintptr_t)w->data % 16 || ldx % 4 ||
			 (uintptr_t)x % 16)) {
		if constexpr (T == KT_F32 || T == KT_F16 || T == KT_BF16) {
			const unsigned grid = (unsigned)((w->n_out + GEMV_WARPS - 1) / GEMV_WARPS);
			gemv_scalar<T><<<grid, GEMV_WARPS * 32, 0, c->stream>>>(
				(const uint8_t *)w->data, w->row_bytes, w->n_out, w->n_in, x, ldx, n_tok, y, ldy);
		}
		return kcuda_launch_status("gemv_scalar");
	}
	for (int t0 = 0; t0 < n_tok; t0 += GEMV_MAX_NT) {
		const int nt = n_tok - t0 < GEMV_MAX_NT ? n_tok - t0 : GEMV_MAX_NT;
		if (nt == 1)
			launch_nt<T, 1>(c, w, x + t0 * ldx, ldx, nt, y + t0 * ldy, ldy);
		else if (nt == 2)
			launch_nt<T, 2>(c, w, x + t0 * ldx, ldx, nt, y + t0 * ldy, ldy);
		else
			launch_nt<T, 4>(c, w, x + t0 * ldx, ldx, nt, y + t0 * ldy, ldy);
	}
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
