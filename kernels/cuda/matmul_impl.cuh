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

/* The tensor-core tile product (matmul_tile.cu) for H stacked matrices W_h = w0->data + h mat_bytes
 * (w0 describes one; H = 1 and mat_bytes unused for kcuda_matmul): y[t][h yhs + r] =
 * dot(W_h row r, x[t][h xhs ..]). fp32-class accuracy (exact weights, x in fp16 hi + lo).
 * may_split: K may be split over blocks with partial sums in c->ws (kcuda_matmul only).
 * ERR_UNSUPPORTED for float weight types, n_in % 16 != 0 or grids too large. */
int kcuda_mm_tile_launch(struct kcuda_ctx *c, const struct kweight *w0, size_t mat_bytes, int H,
                         const float *x, int64_t ldx, int64_t xhs, int n_tok, float *y, int64_t ldy,
                         int64_t yhs, bool may_split);
extern "C" bool kcuda_mm_tile_ok(int type, int64_t n_in);

/* Same product in fp32 throughout (W dequantized to fp32 tiles, cuBLAS without TF32). */
int kcuda_gemm_f32_launch(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx,
                          int64_t n_tok, float *y, int64_t ldy);

#endif
