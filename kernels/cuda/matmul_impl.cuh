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

/* Same product in fp32 throughout (W dequantized to fp32 tiles, cuBLAS without TF32). */
int kcuda_gemm_f32_launch(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx,
                          int64_t n_tok, float *y, int64_t ldy);

#endif
