/* Internal launchers behind kcuda_matmul (kernels/cuda/matmul.cu): the decode GEMV
 * (matmul_gemv.cu) and the prefill GEMM (matmul_gemm.cu). Arguments are validated by the caller. */
#ifndef TANDEM_KERNELS_CUDA_MATMUL_IMPL_CUH
#define TANDEM_KERNELS_CUDA_MATMUL_IMPL_CUH

#include "kernels/cuda/cuda_common.cuh"

/* n_tok in 1..8; x rows 16-byte aligned with ldx % 4 == 0 unless the type is a float type. */
int kcuda_gemv_launch(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx, int n_tok,
                      float *y, int64_t ldy);
int kcuda_gemm_launch(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx,
                      int64_t n_tok, float *y, int64_t ldy);

/* The tensor-core GEMV (matmul_mma.cu) where its table says it is faster than kcuda_gemv_launch
 * for this type, width and n_tok (1..8); ERR_UNSUPPORTED otherwise (type, shape, alignment, or
 * TANDEM_GEMV_MMA=0): the caller then takes kcuda_gemv_launch. */
int kcuda_gemv_mma_launch(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx,
                          int n_tok, float *y, int64_t ldy);
/* false when TANDEM_GEMV_MMA=0 (read on every call) */
extern "C" bool kcuda_mm_mma_enabled(void);

/* One token's Q6_K product on dp4a (matmul_q6k1.cu): n_out >= 8192, n_in % 1024 == 0 (8-byte aligned
 * rows) up to 8192, W 8-byte and x 16-byte aligned; x's int8 parts from the norm before when the context
 * holds them; ERR_UNSUPPORTED otherwise or with TANDEM_GEMV_Q6K=0 (read on every call). */
int kcuda_gemv_q6k1_launch(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx,
                           int n_tok, float *y, int64_t ldy);

/* The memory-bound decode GEMV (matmul_gemv3.cu) for Q8_0 / F32 / F16 / BF16 at n_tok 1..8, fp32
 * throughout, K split over a thread-block cluster for narrow outputs; ERR_UNSUPPORTED for other
 * types, shapes (n_in % 256, F32: % 128), Q8_0 wider than 1024 rows (unless TANDEM_GEMV3_WIDE=1),
 * unaligned W / X, or TANDEM_GEMV3=0. */
int kcuda_gemv3_launch(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx, int n_tok,
                       float *y, int64_t ldy);
/* The same for H stacked matrices W_h = w0->data + h mat_bytes (kfwd_head_gemv):
 * y[t][h yhs + r] = dot(W_h row r, x[t][h xhs ..]); also needs mat_bytes % 16 == 0, xhs % 4 == 0. */
int kcuda_gemv3_heads(struct kcuda_ctx *c, const struct kweight *w0, size_t mat_bytes, int H, const float *x,
                      int64_t ldx, int64_t xhs, int n_tok, float *y, int64_t ldy, int64_t yhs);
/* Per-head Q8_0 products with rows of 64..256 elements (n_in % 64 == 0: k_b) at n_tok 1..8
 * (head_gemv_q8.cu); same alignment needs; ERR_UNSUPPORTED otherwise or with TANDEM_GEMV3=0. */
int kcuda_head_q8_launch(struct kcuda_ctx *c, const struct kweight *w0, size_t mat_bytes, int H,
                         const float *x, int64_t ldx, int64_t xhs, int n_tok, float *y, int64_t ldy,
                         int64_t yhs);
/* false when TANDEM_GEMV3=0 (read on every call) */
extern "C" bool kcuda_gemv3_enabled(void);

/* One product through the multi-product kernel (matmul_multi.cu) at n_tok 1..8: Q8_0 / F16 / BF16
 * with n_in % 256 == 0, F32 with n_in % 128 == 0, W and x 16-byte aligned, ldx % 4 == 0;
 * ERR_UNSUPPORTED otherwise. kcuda_matmul takes it for wide Q8_0 when TANDEM_MULTI_WIDE=1. */
int kcuda_gemv_multi1_launch(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx,
                             int n_tok, float *y, int64_t ldy);
extern "C" bool kcuda_multi_wide_enabled(void);

/* The resident-weights GEMV (matmul_gemv_res.cu): all of a block's rows in shared memory before
 * the wait; Q8_0 (n_in % 256 == 0) / F32 (n_in % 128 == 0), n_tok 1..2, W and x 16-byte aligned,
 * ldx % 4 == 0; ERR_UNSUPPORTED otherwise or unless TANDEM_GEMV_RES=1. Arguments validated by
 * the caller. */
int kcuda_gemv_res_launch(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx,
                          int n_tok, float *y, int64_t ldy);
/* The same for H stacked matrices as kcuda_gemv3_heads (v_b); also needs mat_bytes % 16 == 0 and
 * xhs % 4 == 0. */
extern "C" int kcuda_gemv_res_heads(struct kcuda_ctx *c, const struct kweight *w0, size_t mat_bytes, int H,
                                    const float *x, int64_t ldx, int64_t xhs, int n_tok, float *y,
                                    int64_t ldy, int64_t yhs);

/* The tensor-core tile product (matmul_tile.cu) for H stacked matrices W_h = w0->data + h mat_bytes
 * (w0 describes one; H = 1 and mat_bytes unused for kcuda_matmul): y[t][h yhs + r] =
 * dot(W_h row r, x[t][h xhs ..]). fp32-class accuracy (exact weights, x in fp16 hi + lo).
 * may_split: K may be split over blocks with partial sums in c->ws (kcuda_matmul only).
 * ERR_UNSUPPORTED for float weight types, n_in % 16 != 0 or grids too large. */
int kcuda_mm_tile_launch(struct kcuda_ctx *c, const struct kweight *w0, size_t mat_bytes, int H,
                         const float *x, int64_t ldx, int64_t xhs, int n_tok, float *y, int64_t ldy,
                         int64_t yhs, bool may_split);
extern "C" bool kcuda_mm_tile_ok(int type, int64_t n_in);

/* The fp32 path on the fp16 tensor cores (hi + lo parts of W and X, one GEMM over 3K): where
 * kcuda_f32_split_takes (kernels.h: KCUDA_SPLIT_MIN_TOK / _OUT, TANDEM_F32_SPLIT); ERR_UNSUPPORTED
 * otherwise, ERR_LIMIT when the workspace cannot hold one token and one row of each. */
extern "C" bool kcuda_f32_split_takes(const struct kweight *w, int64_t n_tok);
int kcuda_gemm_split_launch(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx,
                            int64_t n_tok, float *y, int64_t ldy);
/* Same product in fp32 throughout (W dequantized to fp32 tiles, cuBLAS without TF32). */
int kcuda_gemm_f32_launch(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx,
                          int64_t n_tok, float *y, int64_t ldy);

/* ---- the 16-byte slab layout shared by gemv3 (matmul_gemv3.cu) and the multi-product GEMV
 * (matmul_multi.cu): a row is read in slabs of SE elements / SB bytes (16-byte multiples), copied
 * to shared memory with cp.async, and lane l of a warp decodes elements EPL l .. EPL l + EPL - 1
 * of a slab (g3_decode). */
/* per-type slab geometry: SE elements, SB bytes per row, EPL elements per lane */
template <int T> struct g3t;
template <> struct g3t<KT_Q8_0> {
	enum { SE = 256, SB = 272, EPL = 8 };
};
template <> struct g3t<KT_F32> {
	enum { SE = 128, SB = 512, EPL = 4 };
};
template <> struct g3t<KT_F16> {
	enum { SE = 256, SB = 512, EPL = 8 };
};
template <> struct g3t<KT_BF16> {
	enum { SE = 256, SB = 512, EPL = 8 };
};

__device__ __forceinline__ void g3_cp16(void *dst, const void *src)
{
	const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void g3_commit(void)
{
	asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> __device__ __forceinline__ void g3_wait(void)
{
	asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* float of a signed byte: byte k of q ^ 0x80808080 (q + 128) in the mantissa of 2^23, minus
 * 2^23 + 128; exact */
__device__ __forceinline__ float g3_s8f(uint32_t u, int k)
{
	return __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7540u + (unsigned)k)) - 8388736.0f;
}

/* Quarter u % 4 of 32-element block u / 4 of a Q8_0 slab at p (shared memory, the slab 16-byte
 * aligned: block bi's quants start 2 bytes past a word when bi is even, so whole words and a funnel
 * shift): its bytes 0..3 in q0 and 4..7 in q1 */
__device__ __forceinline__ void g3_q8_bytes(const uint8_t *p, int u, uint32_t &q0, uint32_t &q1)
{
	const int bi = u >> 2, j = u & 3;
	const int mis = (bi & 1) ? 0 : 2; /* as g3_decode */
	const uint8_t *q = p + 34 * bi + 2 + 8 * j;
	const uint32_t *a = (const uint32_t *)(q - mis);
	const uint32_t sh = 8u * (uint32_t)mis;
	const uint32_t w0 = a[0], w1 = a[1], w2 = sh ? a[2] : 0u;
	q0 = __funnelshift_r(w0, w1, sh);
	q1 = __funnelshift_r(w1, w2, sh);
}

/* One Q8_0 row's slab at p (shared memory) for this lane as it is stored: the lane's 8 signed bytes
 * (g3_decode's, before conversion) in q0 (elements 0..3) and q1 (4..7), and the block's scale d */
__device__ __forceinline__ void g3_q8_raw(const uint8_t *p, int lane, uint32_t &q0, uint32_t &q1, float &d)
{
	g3_q8_bytes(p, lane, q0, q1);
	d = __half2float(*(const __half *)(p + 34 * (lane >> 2)));
}

/* One row's slab at p (shared memory) for this lane: w[0..EPL) and the per-lane scale. */
template <int T> struct g3_row {
	float v[g3t<T>::EPL];
	float d;
};
template <int T> __device__ __forceinline__ void g3_decode(const uint8_t *p, int lane, g3_row<T> &o)
{
	if constexpr (T == KT_Q8_0) {
		/* lane l: block l / 4 (34 bytes: fp16 d, 32 int8), quarter l % 4: 8 bytes at a
		 * 2-byte-aligned offset: three aligned words and two funnel shifts */
		const int bi = lane >> 2, j = lane & 3;
		/* p is 16-byte aligned, so q = p + 34 bi + 2 + 8 j is 2 mod 4 exactly for even bi;
		 * pointer arithmetic (not an integer mask) keeps the loads LDS */
		const int mis = (bi & 1) ? 0 : 2;
		const uint8_t *q = p + 34 * bi + 2 + 8 * j;
		const uint32_t *a = (const uint32_t *)(q - mis);
		const uint32_t sh = 8u * (uint32_t)mis;
		const uint32_t w0 = a[0], w1 = a[1], w2 = sh ? a[2] : 0u;
		const uint32_t q0 = __funnelshift_r(w0, w1, sh) ^ 0x80808080u,
		               q1 = __funnelshift_r(w1, w2, sh) ^ 0x80808080u;
#pragma unroll
		for (int k = 0; k < 4; k++) {
			o.v[k] = g3_s8f(q0, k);
			o.v[4 + k] = g3_s8f(q1, k);
		}
		o.d = __half2float(*(const __half *)(p + 34 * bi));
	} else if constexpr (T == KT_F32) {
		const float4 f = *(const float4 *)(p + 16 * lane);
		o.v[0] = f.x, o.v[1] = f.y, o.v[2] = f.z, o.v[3] = f.w;
		o.d = 1.0f;
	} else {
		const uint4 u = *(const uint4 *)(p + 16 * lane);
		const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
		for (int k = 0; k < 4; k++) {
			if constexpr (T == KT_F16) {
				o.v[2 * k] = kc_h2f((uint16_t)w[k]);
				o.v[2 * k + 1] = kc_h2f((uint16_t)(w[k] >> 16));
			} else {
				o.v[2 * k] = __uint_as_float(w[k] << 16);
				o.v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
			}
		}
		o.d = 1.0f;
	}
}

#endif
