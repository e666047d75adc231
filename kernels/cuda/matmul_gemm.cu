/* Prefill GEMM: Y = X W^T for n_tok > 8. W (any quant type) is dequantized to bf16 tiles in the
 * context workspace (quant_piece.cuh, one thread per 16-element piece), X is rounded to bf16, and
 * cuBLAS multiplies them on tensor cores with fp32 accumulation and fp32 output. This is the honest
 * first version: the dequantized tile costs an extra 4 bytes per weight of traffic (write + read),
 * which is small next to 2 * n_tok FLOPs per weight once n_tok is in the hundreds; docs/PERFORMANCE.md
 * has the measured rate against cuBLAS on plain bf16.
 * Workspace layout: [X as bf16: tok_chunk x n_in][W tile as bf16: row_chunk x n_in].
 * The fp32 variant (kcuda_gemm_f32_launch) is for products whose outputs are ranked (router,
 * indexer): F32 weights are used in place, others are dequantized to fp32 tiles filling the
 * workspace, X is read in place, and cuBLAS runs with CUBLAS_COMPUTE_32F_PEDANTIC (no TF32, no
 * bf16), so only the summation order differs from the CPU. */
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/matmul_impl.cuh"
#include "kernels/cuda/quant_piece.cuh"

/* thread -> (row, piece) of the tile; writes 16 bf16 with two 16-byte stores */
template <int T>
__global__ void dequant_pieces(const uint8_t *__restrict__ w, size_t row_bytes, int64_t r0, int64_t n_rows,
                               int64_t n_pieces, uint16_t *__restrict__ dst)
{
	KDEP_ENTRY();
	const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= n_rows * n_pieces)
		return;
	const int64_t row = i / n_pieces, p = i % n_pieces;
	float v[16];
	kq_values<T>(w + (size_t)(r0 + row) * row_bytes, p, v);
	uint32_t o[8];
#pragma unroll
	for (int k = 0; k < 8; k++) {
		__nv_bfloat162 b = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
		o[k] = *(uint32_t *)&b;
	}
	uint4 *d = (uint4 *)(dst + row * n_pieces * 16 + p * 16);
	d[0] = make_uint4(o[0], o[1], o[2], o[3]);
	d[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

/* the same into an fp32 tile (fp32 GEMM): four 16-byte stores */
template <int T>
__global__ void dequant_pieces_f32(const uint8_t *__restrict__ w, size_t row_bytes, int64_t r0,
                                   int64_t n_rows, int64_t n_pieces, float *__restrict__ dst)
{
	KDEP_ENTRY();
	const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= n_rows * n_pieces)
		return;
	const int64_t row = i / n_pieces, p = i % n_pieces;
	float v[16];
	kq_values<T>(w + (size_t)(r0 + row) * row_bytes, p, v);
	float4 *d = (float4 *)(dst + row * n_pieces * 16 + p * 16);
#pragma unroll
	for (int k = 0; k < 4; k++)
		d[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
}

/* F16 / BF16 weights of any n_in into an fp32 tile: one thread per element */
template <int T>
__global__ void dequant_elems_f32(const uint8_t *__restrict__ w, size_t row_bytes, int64_t r0, int64_t n_rows,
                                  int64_t n_in, float *__restrict__ dst)
{
	KDEP_ENTRY();
	const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= n_rows * n_in)
		return;
	const int64_t row = i / n_in, k = i % n_in;
	const uint16_t h = ((const uint16_t *)(w + (size_t)(r0 + row) * row_bytes))[k];
	dst[i] = T == KT_F16 ? kc_h2f(h) : kc_bf2f(h);
}

/* float weights of any n_in: one thread per element */
template <int T>
__global__ void dequant_elems(const uint8_t *__restrict__ w, size_t row_bytes, int64_t r0, int64_t n_rows,
                              int64_t n_in, uint16_t *__restrict__ dst)
{
	KDEP_ENTRY();
	const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= n_rows * n_in)
		return;
	const int64_t row = i / n_in, k = i % n_in;
	const uint8_t *rp = w + (size_t)(r0 + row) * row_bytes;
	float v;
	if (T == KT_F32)
		v = ((const float *)rp)[k];
	else if (T == KT_F16)
		v = kc_h2f(((const uint16_t *)rp)[k]);
	else
		v = kc_bf2f(((const uint16_t *)rp)[k]);
	__nv_bfloat16 b = __float2bfloat16_rn(v);
	dst[i] = *(uint16_t *)&b;
}

__global__ void x_to_bf16(const float *__restrict__ x, int64_t ldx, int64_t n_tok, int64_t n_in,
                          uint16_t *__restrict__ dst)
{
	KDEP_ENTRY();
	const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= n_tok * n_in)
		return;
	const int64_t t = i / n_in, k = i % n_in;
	__nv_bfloat16 b = __float2bfloat16_rn(x[t * ldx + k]);
	dst[i] = *(uint16_t *)&b;
}

template <int T>
static int dequant_type(struct kcuda_ctx *c, const struct kweight *w, int64_t r0, int64_t n_rows,
                        uint16_t *dst)
{
	const int threads = 256;
	if ((T == KT_F32 || T == KT_F16 || T == KT_BF16) &&
	    (w->n_in % 16 || w->row_bytes % 16 || (uintptr_t)w->data % 16)) {
		const int64_t n = n_rows * w->n_in;
		return klaunch("dequant_bf16", dequant_elems<T>,
		               dim3((unsigned)((n + threads - 1) / threads)), dim3(threads), 0, c->stream,
		               (const uint8_t *)w->data, w->row_bytes, r0, n_rows, w->n_in, dst);
	}
	const int64_t n = n_rows * (w->n_in / 16);
	return klaunch("dequant_bf16", dequant_pieces<T>, dim3((unsigned)((n + threads - 1) / threads)),
	               dim3(threads), 0, c->stream, (const uint8_t *)w->data, w->row_bytes, r0, n_rows,
	               w->n_in / 16, dst);
}

extern "C" int kcuda_dequant_bf16(struct kcuda_ctx *c, const struct kweight *w, int64_t r0, int64_t n_rows,
                                  uint16_t *dst)
{
	if (!w || !w->data || r0 < 0 || n_rows < 0 || r0 > w->n_out || n_rows > w->n_out - r0)
		return kcuda_bad_arg("dequant_bf16",
		                     "rows [%lld, +%lld) of a weight with %lld rows (or no data)",
		                     (long long)r0, (long long)n_rows, w ? (long long)w->n_out : -1LL);
	if (n_rows == 0)
		return 0;
	switch (w->type) {
#define X(T)                                                                                                 \
	case T: return dequant_type<T>(c, w, r0, n_rows, dst);
		KCUDA_FOR_EACH_TYPE(X)
#undef X
	default: return ERR_UNSUPPORTED;
	}
}

int kcuda_gemm_launch(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx,
                      int64_t n_tok, float *y, int64_t ldy)
{
	const int64_t n_in = w->n_in;
	const size_t row_b = (size_t)n_in * 2;
	if (n_in > INT32_MAX || ldy > INT32_MAX)
		return ERR_LIMIT;
	/* X may take up to half the workspace; the weight tile gets the rest */
	int64_t tok_chunk = (int64_t)(c->ws_bytes / 2 / row_b);
	if (tok_chunk > n_tok)
		tok_chunk = n_tok;
	if (tok_chunk > INT32_MAX)
		tok_chunk = INT32_MAX;
	if (tok_chunk < 1)
		return ERR_LIMIT;
	const size_t x_bytes = ((size_t)tok_chunk * row_b + 255) & ~(size_t)255;
	int64_t row_chunk = (int64_t)((c->ws_bytes - x_bytes) / row_b);
	if (row_chunk > w->n_out)
		row_chunk = w->n_out;
	if (row_chunk > INT32_MAX)
		row_chunk = INT32_MAX;
	if (row_chunk < 1)
		return ERR_LIMIT;
	uint16_t *xb = (uint16_t *)c->ws;
	uint16_t *wb = (uint16_t *)((char *)c->ws + x_bytes);
	cublasHandle_t h = (cublasHandle_t)c->cublas;
	const float one = 1.0f, zero = 0.0f;
	int rc;

	for (int64_t t0 = 0; t0 < n_tok; t0 += tok_chunk) {
		const int64_t nt = n_tok - t0 < tok_chunk ? n_tok - t0 : tok_chunk;
		const int64_t nx = nt * n_in;
		if ((rc = klaunch("x_to_bf16", x_to_bf16, dim3((unsigned)((nx + 255) / 256)), dim3(256), 0,
		                  c->stream, x + t0 * ldx, ldx, nt, n_in, xb)))
			return rc;
		for (int64_t r0 = 0; r0 < w->n_out; r0 += row_chunk) {
			const int64_t nr = w->n_out - r0 < row_chunk ? w->n_out - r0 : row_chunk;
			if ((rc = kcuda_dequant_bf16(c, w, r0, nr, wb)))
				return rc;
			cublasStatus_t s = cublasGemmEx(
			    h, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, (int)nt, (int)n_in, &one, wb, CUDA_R_16BF,
			    (int)n_in, xb, CUDA_R_16BF, (int)n_in, &zero, y + t0 * ldy + r0, CUDA_R_32F,
			    (int)ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
			if (s != CUBLAS_STATUS_SUCCESS) {
				fprintf(stderr, "kcuda: cublasGemmEx failed (%d) for %lldx%lldx%lld\n",
				        (int)s, (long long)nr, (long long)nt, (long long)n_in);
				return ERR_CUDA;
			}
		}
	}
	return 0;
}

/* ---- fp32 GEMM ----------------------------------------------------------------------------------- */
template <int T>
static int dequant_f32_type(struct kcuda_ctx *c, const struct kweight *w, int64_t r0, int64_t n_rows,
                            float *dst)
{
	const int threads = 256;
	if constexpr (T == KT_F16 || T == KT_BF16) {
		const int64_t n = n_rows * w->n_in;
		return klaunch("dequant_f32", dequant_elems_f32<T>,
		               dim3((unsigned)((n + threads - 1) / threads)), dim3(threads), 0, c->stream,
		               (const uint8_t *)w->data, w->row_bytes, r0, n_rows, w->n_in, dst);
	} else if constexpr (T == KT_F32) { /* only when misaligned for cuBLAS: a byte copy */
		if (cudaMemcpy2DAsync(dst, (size_t)w->n_in * sizeof(float),
		                      (const char *)w->data + (size_t)r0 * w->row_bytes, w->row_bytes,
		                      (size_t)w->n_in * sizeof(float), (size_t)n_rows,
		                      cudaMemcpyDeviceToDevice, c->stream) != cudaSuccess)
			return kcuda_launch_status("f32 tile copy");
	} else {
		if (w->n_in % 16)
			return kcuda_bad_arg("matmul f32", "%s weight with n_in %lld (not a multiple of 16)",
			                     ktype_name(w->type), (long long)w->n_in);
		const int64_t n = n_rows * (w->n_in / 16);
		return klaunch("dequant_f32", dequant_pieces_f32<T>,
		               dim3((unsigned)((n + threads - 1) / threads)), dim3(threads), 0, c->stream,
		               (const uint8_t *)w->data, w->row_bytes, r0, n_rows, w->n_in / 16, dst);
	}
	return kcuda_launch_status("dequant_f32"); /* the F32 copy: its status, counted as a launch */
}

static int dequant_f32(struct kcuda_ctx *c, const struct kweight *w, int64_t r0, int64_t n_rows, float *dst)
{
	switch (w->type) {
#define X(T)                                                                                                 \
	case T: return dequant_f32_type<T>(c, w, r0, n_rows, dst);
		KCUDA_FOR_EACH_TYPE(X)
#undef X
	default: return ERR_UNSUPPORTED;
	}
}

extern "C" int kcuda_dequant_f32(struct kcuda_ctx *c, const struct kweight *w, int64_t r0, int64_t n_rows,
                                 float *dst)
{
	if (!c || !w || !w->data || !dst || r0 < 0 || n_rows < 0 || r0 + n_rows > w->n_out)
		return kcuda_bad_arg("dequant_f32", "rows %lld + %lld of %lld", (long long)r0,
		                     (long long)n_rows, w ? (long long)w->n_out : -1LL);
	if (n_rows == 0)
		return 0;
	return dequant_f32(c, w, r0, n_rows, dst);
}

int kcuda_gemm_f32_launch(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx,
                          int64_t n_tok, float *y, int64_t ldy)
{
	const int64_t n_in = w->n_in;
	if (n_in > INT32_MAX || ldx > INT32_MAX || ldy > INT32_MAX || n_tok > INT32_MAX)
		return ERR_LIMIT;
	/* F32 rows in place when cuBLAS can address them (row stride a whole number of floats) */
	const bool in_place = w->type == KT_F32 && w->row_bytes % 4 == 0 && (uintptr_t)w->data % 4 == 0 &&
	                      w->row_bytes / 4 <= INT32_MAX;
	int64_t row_chunk = in_place ? w->n_out : (int64_t)(c->ws_bytes / ((size_t)n_in * sizeof(float)));
	if (row_chunk > w->n_out)
		row_chunk = w->n_out;
	if (row_chunk > INT32_MAX)
		row_chunk = INT32_MAX;
	if (row_chunk < 1)
		return ERR_LIMIT;
	cublasHandle_t h = (cublasHandle_t)c->cublas;
	const float one = 1.0f, zero = 0.0f;
	for (int64_t r0 = 0; r0 < w->n_out; r0 += row_chunk) {
		const int64_t nr = w->n_out - r0 < row_chunk ? w->n_out - r0 : row_chunk;
		const float *wt;
		int64_t ldw;
		if (in_place) {
			ldw = (int64_t)(w->row_bytes / 4);
			wt = (const float *)w->data + r0 * ldw;
		} else {
			int rc = dequant_f32(c, w, r0, nr, (float *)c->ws);
			if (rc)
				return rc;
			wt = (const float *)c->ws;
			ldw = n_in;
		}
		cublasStatus_t s =
		    cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, (int)n_tok, (int)n_in, &one, wt,
		                 CUDA_R_32F, (int)ldw, x, CUDA_R_32F, (int)ldx, &zero, y + r0, CUDA_R_32F,
		                 (int)ldy, CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT);
		if (s ==
		    CUBLAS_STATUS_NOT_SUPPORTED) /* plain fp32 SGEMM (the handle's default math: no TF32) */
			s = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, (int)n_tok, (int)n_in, &one,
			                 wt, CUDA_R_32F, (int)ldw, x, CUDA_R_32F, (int)ldx, &zero, y + r0,
			                 CUDA_R_32F, (int)ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
		if (s != CUBLAS_STATUS_SUCCESS) {
			fprintf(stderr, "kcuda: fp32 cublasGemmEx failed (%d) for %lldx%lldx%lld\n", (int)s,
			        (long long)nr, (long long)n_tok, (long long)n_in);
			return ERR_CUDA;
		}
	}
	return 0;
}

/* ---- the fp32 path on the fp16 tensor cores (kcuda_gemm_split_launch) ----------------------------
 * Products whose outputs are ranked (the indexer's q: idx_q_b, Q8_0 2048 -> 4096 a GLM-5 rank) stay
 * fp32-accurate: the tile product (matmul_tile.cu) keeps the weights exact and x in fp16 hi + lo, but
 * it is built for decode batches and ran at ~41 TFLOP/s on 2048-token prefill chunks (H200, session 13:
 * idx_q_b 845 us a layer, 9% of the prefill step). Here both sides are split into fp16 hi + lo parts
 * after a power-of-two scale that puts the largest |value| in [2^14, 2^15) (so neither overflows
 * fp16 and the lo parts of all but values ~2^-20 below the largest stay normal), and one cuBLAS fp16
 * GEMM with fp32 accumulation runs over K' = 3K:
 *     [W_hi | W_hi | W_lo] . [x_hi ; x_lo ; x_hi] = W_hi x_hi + W_hi x_lo + W_lo x_hi,
 * then y = that times 2^-(e_w + e_x) (cuBLAS's alpha, read from device memory). A Q8_0 weight q d has
 * at most 19 significant bits, so hi + lo holds it exactly; an fp32 value keeps 22 of its 24 bits; the
 * dropped W_lo x_lo term is below 2^-22 of |w x|. So the error stays ~2^-21 of sum |w x|, against the
 * fp32 GEMV tolerance of 2e-6 sqrt(K) sum |w x| the tests hold every fp32-path product to.
 * One scale serves all of a call's tokens: a token whose values all lie more than ~2^20 below the call's
 * largest |x| loses bits (2^26 below: ~1.4e-5 of its sum |w x|, tests/unit/split_f16_sim.cc); the caller's
 * activations are normalized rows (idx_q_b reads the q_a-normed c_q), far from that.
 * Non-finite values: hi carries them (lo = 0), so y is non-finite where the fp32 product is.
 * Workspace: [scratch 256 B: max |w| bits, max |x| bits, alpha, beta][X' tok_chunk x 3K][W' row_chunk x 3K].
 */
#define SPLIT_SCRATCH 256

/* the scale exponent e for a largest |value| with bits mb: mb 2^e in [2^14, 2^15); 0 for 0 / non-finite;
 * at least -63 (largest values past 2^78 overflow fp16: inf, as their products would nearly be in fp32) */
__device__ __forceinline__ int split_exp1(uint32_t mb)
{
	if (mb == 0 || mb >= 0x7f800000u)
		return 0;
	const int e = 14 - ((int)(mb >> 23) - 127); /* subnormal: exponent field 0, e = 141 (still < 2^15) */
	return e < -63 ? -63 : e;
}

/* both exponents. alpha = 2^-(ew + ex) stays a normal float (cuBLAS may flush subnormals): ew + ex <= 126.
 * Past that (largest |w| times largest |x| below ~2^-98) both scales give up the excess, half each; the
 * largest values' lo parts stay normal fp16 while the half is below ~17, i.e. down to products of ~2^-130. */
__device__ __forceinline__ void split_exps(const unsigned *mx, int &ew, int &ex)
{
	ew = split_exp1(mx[0]);
	ex = split_exp1(mx[1]);
	const int over = ew + ex - 126;
	if (over > 0) {
		ex -= over / 2;
		ew -= over - over / 2;
	}
}

/* hi / lo fp16 parts of v (already scaled); non-finite v: (v, 0) */
__device__ __forceinline__ void split_hl(float v, __half &hi, __half &lo)
{
	hi = __float2half_rn(v);
	lo = isfinite(v) ? __float2half_rn(v - __half2float(hi)) : __float2half_rn(0.0f);
}

__device__ __forceinline__ void split_max_commit(uint32_t m, unsigned *mx)
{
	m = __reduce_max_sync(0xffffffffu, m);
	if ((threadIdx.x & 31) == 0 && m)
		atomicMax(mx, m);
}

/* max |w| over the weight's rows (bits of the non-negative float; NaN above +inf) */
template <int T>
__global__ void split_absmax_w(const uint8_t *__restrict__ w, size_t row_bytes, int64_t n_rows,
                               int64_t n_pieces, unsigned *mx)
{
	KDEP_ENTRY();
	const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	uint32_t m = 0;
	if (i < n_rows * n_pieces) {
		float v[16];
		kq_values<T>(w + (size_t)(i / n_pieces) * row_bytes, i % n_pieces, v);
#pragma unroll
		for (int k = 0; k < 16; k++)
			m = max(m, __float_as_uint(v[k]) & 0x7fffffffu);
	}
	split_max_commit(m, mx);
}

/* max |x| over n_tok rows of n_in (8 consecutive values a thread) */
__global__ void split_absmax_x(const float *__restrict__ x, int64_t ldx, int64_t n_tok, int64_t n_in,
                               unsigned *mx)
{
	KDEP_ENTRY();
	x = kdep_after(x); /* written by the kernel before: no load of it above the wait */
	const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, n8 = n_in / 8;
	uint32_t m = 0;
	if (i < n_tok * n8) {
		const float *p = x + (i / n8) * ldx + (i % n8) * 8;
#pragma unroll
		for (int k = 0; k < 8; k++)
			m = max(m, __float_as_uint(p[k]) & 0x7fffffffu);
	}
	split_max_commit(m, mx);
}

/* rows [r0, r0 + n_rows) of W into W' (row stride 3 n_in halves): hi, hi, lo */
template <int T>
__global__ void split_w(const uint8_t *__restrict__ w, size_t row_bytes, int64_t r0, int64_t n_rows,
                        int64_t n_pieces, const unsigned *mx, __half *__restrict__ dst)
{
	KDEP_ENTRY();
	const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= n_rows * n_pieces)
		return;
	mx = kdep_after(mx); /* the maxima of the kernels before */
	const int64_t row = i / n_pieces, p = i % n_pieces, K = n_pieces * 16;
	int e, ex;
	split_exps(mx, e, ex);
	float v[16];
	kq_values<T>(w + (size_t)(r0 + row) * row_bytes, p, v);
	__align__(16) __half hi[16], lo[16];
#pragma unroll
	for (int k = 0; k < 16; k++)
		split_hl(ldexpf(v[k], e), hi[k], lo[k]);
	__half *d = dst + row * 3 * K + p * 16;
	const uint4 *h4 = (const uint4 *)hi, *l4 = (const uint4 *)lo;
	((uint4 *)d)[0] = h4[0], ((uint4 *)d)[1] = h4[1];
	((uint4 *)(d + K))[0] = h4[0], ((uint4 *)(d + K))[1] = h4[1];
	((uint4 *)(d + 2 * K))[0] = l4[0], ((uint4 *)(d + 2 * K))[1] = l4[1];
}

/* n_tok rows of x into X' (row stride 3 n_in halves): hi, lo, hi; block 0 also writes alpha / beta */
__global__ void split_x(const float *__restrict__ x, int64_t ldx, int64_t n_tok, int64_t n_in,
                        const unsigned *mx, float *ab, __half *__restrict__ dst)
{
	KDEP_ENTRY();
	x = kdep_after(x);
	mx = kdep_after(mx);
	const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, n8 = n_in / 8;
	int ew, ex;
	split_exps(mx, ew, ex);
	if (i == 0) {
		ab[0] = ldexpf(1.0f, -(ew + ex));
		ab[1] = 0.0f;
	}
	if (i >= n_tok * n8)
		return;
	const int64_t t = i / n8, k0 = (i % n8) * 8;
	const float *p = x + t * ldx + k0;
	__align__(16) __half hi[8], lo[8];
#pragma unroll
	for (int k = 0; k < 8; k++)
		split_hl(ldexpf(p[k], ex), hi[k], lo[k]);
	__half *d = dst + t * 3 * n_in + k0;
	*(uint4 *)d = *(const uint4 *)hi;
	*(uint4 *)(d + n_in) = *(const uint4 *)lo;
	*(uint4 *)(d + 2 * n_in) = *(const uint4 *)hi;
}

template <int T>
static int split_w_type(struct kcuda_ctx *c, const struct kweight *w, int64_t r0, int64_t n_rows, bool absmax,
                        unsigned *mx, __half *dst)
{
	const int64_t np = w->n_in / 16, n = n_rows * np;
	const dim3 grid((unsigned)((n + 255) / 256));
	if (absmax)
		return klaunch("split_absmax_w", split_absmax_w<T>, grid, dim3(256), 0, c->stream,
		               (const uint8_t *)w->data, w->row_bytes, n_rows, np, mx);
	return klaunch("split_w", split_w<T>, grid, dim3(256), 0, c->stream, (const uint8_t *)w->data,
	               w->row_bytes, r0, n_rows, np, (const unsigned *)mx, dst);
}

static int split_w_any(struct kcuda_ctx *c, const struct kweight *w, int64_t r0, int64_t n_rows, bool absmax,
                       unsigned *mx, __half *dst)
{
	switch (w->type) {
#define X(T)                                                                                                 \
	case T: return split_w_type<T>(c, w, r0, n_rows, absmax, mx, dst);
		KCUDA_FOR_EACH_TYPE(X)
#undef X
	default: return ERR_UNSUPPORTED;
	}
}

/* TANDEM_F32_SPLIT: 0 never, all: every fp32-path product above the GEMV's 8 tokens (tests), unset or 1:
 * n_tok >= KCUDA_SPLIT_MIN_TOK (or TANDEM_F32_SPLIT_MIN_TOK) and n_out >= KCUDA_SPLIT_MIN_OUT (read on every
 * call) */
extern "C" int kcuda_f32_split_mode(void)
{
	const char *v = getenv("TANDEM_F32_SPLIT");
	if (v && strcmp(v, "0") == 0)
		return 0;
	if (v && strcmp(v, "all") == 0)
		return 2;
	return 1;
}

extern "C" bool kcuda_f32_split_takes(const struct kweight *w, int64_t n_tok)
{
	const int m = kcuda_f32_split_mode();
	if (m == 0 || n_tok <= 8 || w->n_in % 16)
		return false;
	if ((w->type == KT_F32 || w->type == KT_F16 || w->type == KT_BF16) &&
	    (w->row_bytes % 16 || (uintptr_t)w->data % 16))
		return false; /* kq_values reads float pieces as 16-byte vectors */
	static long min_tok = 0; /* TANDEM_F32_SPLIT_MIN_TOK (read once): the decode / prefill crossover */
	if (!min_tok)
		min_tok = kcuda_env_long("TANDEM_F32_SPLIT_MIN_TOK", 9, 1L << 30, KCUDA_SPLIT_MIN_TOK);
	return m == 2 || (n_tok >= min_tok && w->n_out >= KCUDA_SPLIT_MIN_OUT);
}

int kcuda_gemm_split_launch(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx,
                            int64_t n_tok, float *y, int64_t ldy)
{
	const int64_t K = w->n_in, K3 = 3 * K;
	if (!kcuda_f32_split_takes(w, n_tok))
		return ERR_UNSUPPORTED;
	if (K3 > INT32_MAX || ldy > INT32_MAX || n_tok > INT32_MAX)
		return ERR_LIMIT;
	const size_t row_b = (size_t)K3 * sizeof(__half);
	if (c->ws_bytes < SPLIT_SCRATCH + 2 * row_b)
		return ERR_LIMIT;
	const size_t room = c->ws_bytes - SPLIT_SCRATCH;
	/* X' may take up to half the room; W' gets the rest */
	int64_t tok_chunk = (int64_t)(room / 2 / row_b);
	if (tok_chunk > n_tok)
		tok_chunk = n_tok;
	const size_t x_bytes = ((size_t)tok_chunk * row_b + 255) & ~(size_t)255;
	if (x_bytes + row_b > room)
		return ERR_LIMIT;
	int64_t row_chunk = (int64_t)((room - x_bytes) / row_b);
	if (row_chunk > w->n_out)
		row_chunk = w->n_out;
	if (row_chunk > INT32_MAX)
		row_chunk = INT32_MAX;
	unsigned *mx = (unsigned *)c->ws;
	float *ab = (float *)c->ws + 2;
	__half *xs = (__half *)((char *)c->ws + SPLIT_SCRATCH);
	__half *ws = (__half *)((char *)xs + x_bytes);
	int rc;
	/* the scales: the largest |w| and |x| of the whole product */
	if (cudaMemsetAsync(mx, 0, 2 * sizeof(unsigned), c->stream) != cudaSuccess)
		return kcuda_launch_status("split scale reset");
	if ((rc = split_w_any(c, w, 0, w->n_out, true, mx, NULL)))
		return rc;
	const int64_t nx8 = n_tok * (K / 8);
	if ((rc = klaunch("split_absmax_x", split_absmax_x, dim3((unsigned)((nx8 + 255) / 256)), dim3(256), 0,
	                  c->stream, x, ldx, n_tok, K, mx + 1)))
		return rc;
	cublasHandle_t h = (cublasHandle_t)c->cublas;
	if (cublasSetPointerMode(h, CUBLAS_POINTER_MODE_DEVICE) != CUBLAS_STATUS_SUCCESS)
		return ERR_CUDA;
	for (int64_t t0 = 0; t0 < n_tok && !rc; t0 += tok_chunk) {
		const int64_t nt = n_tok - t0 < tok_chunk ? n_tok - t0 : tok_chunk, n8 = nt * (K / 8);
		rc = klaunch("split_x", split_x, dim3((unsigned)((n8 + 255) / 256)), dim3(256), 0, c->stream,
		             x + t0 * ldx, ldx, nt, K, (const unsigned *)mx, ab, xs);
		for (int64_t r0 = 0; r0 < w->n_out && !rc; r0 += row_chunk) {
			const int64_t nr = w->n_out - r0 < row_chunk ? w->n_out - r0 : row_chunk;
			if ((rc = split_w_any(c, w, r0, nr, false, mx, ws)))
				break;
			cublasStatus_t s = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, (int)nt,
			                                (int)K3, ab, ws, CUDA_R_16F, (int)K3, xs, CUDA_R_16F,
			                                (int)K3, ab + 1, y + t0 * ldy + r0, CUDA_R_32F,
			                                (int)ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
			if (s != CUBLAS_STATUS_SUCCESS) {
				fprintf(stderr,
				        "kcuda: split fp16 cublasGemmEx failed (%d) for %lldx%lldx%lld\n",
				        (int)s, (long long)nr, (long long)nt, (long long)K3);
				rc = ERR_CUDA;
			}
		}
	}
	if (cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST) != CUBLAS_STATUS_SUCCESS && !rc)
		rc = ERR_CUDA;
	return rc;
}
