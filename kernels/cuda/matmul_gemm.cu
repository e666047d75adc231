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
#include <errno.h>

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
