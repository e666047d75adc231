/* The prefill MoE expert FFN (moe_prefill.cu): tokens grouped by expert on the GPU and multiplied
 * by grouped tensor-core GEMMs that dequantize the expert weights on the fly; no host sync, no
 * allocation. Same arguments and result as kcuda_moe_ffn; internal to kernels/cuda. */
#ifndef TANDEM_KERNELS_CUDA_MOE_PREFILL_H
#define TANDEM_KERNELS_CUDA_MOE_PREFILL_H

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* TANDEM_PREFILL_FAST=0 (or TANDEM_MOE_PREFILL=0) turns it off: kcuda_moe_ffn then runs the old
 * per-expert path (host sync, cuBLAS per expert) */
int kcuda_moe_prefill_on(void);
/* Token count from which kcuda_moe_ffn takes this path before the decode ones: 257 (the prefill
 * sizes) unless TANDEM_MOE_MMA_MIN=n (1..257) says so (it is sync-free, so CUDA graphs can hold it
 * too); INT32_MAX when the path is off. */
int kcuda_moe_prefill_min(void);
/* Arguments already checked by kcuda_moe_ffn (shapes, row bytes, gate type == up type).
 * sh_gate / sh_up / sh_down (all NULL: none): the shared expert (sh_gate->n_out rows of gate / up,
 * which may differ from F), computed in the same pass from the same bf16 x and added to each token's
 * routed sum (kcuda_moe_ffn_shexp's result).
 * ERR_UNSUPPORTED: shapes this path does not take (the caller falls back), nothing launched. */
int kcuda_moe_prefill(struct kcuda_ctx *c, const float *x, int64_t ldx, int64_t n, const int32_t *ids,
                      const float *weights, int k, const struct kweight *gate, const struct kweight *up,
                      const struct kweight *down, int64_t E, int64_t F, const struct kweight *sh_gate,
                      const struct kweight *sh_up, const struct kweight *sh_down, float *out, int64_t ldo);

#ifdef __cplusplus
}
#endif
#endif
