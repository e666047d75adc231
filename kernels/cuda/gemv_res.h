/* The resident-weights decode GEMV (kernels/cuda/matmul_gemv_res.cu) as tests and benchmarks see it;
 * the model reaches it through kcuda_matmul and kfwd_head_gemv (TANDEM_GEMV_RES: unset = single
 * products up to TANDEM_GEMV_RES_AUTO_MB MB, 1 = all it takes, 0 = none; matmul_gemv_res.cu). */
#ifndef TANDEM_KERNELS_CUDA_GEMV_RES_H
#define TANDEM_KERNELS_CUDA_GEMV_RES_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct kcuda_ctx;
struct kweight;

/* false only under TANDEM_GEMV_RES=0 (read on every call) */
bool kcuda_gemv_res_enabled(void);
/* y[t ldy + r] = dot(W row r, x[t ldx ..]) for n_tok 1..2 through the resident-weights kernel only:
 * 0, -EINVAL for bad arguments (null pointers, row_bytes not matching type and n_in, ldx < n_in,
 * ldy < n_out), ERR_UNSUPPORTED where the kernel does not apply (switch off, type, shape,
 * alignment, n_tok) with nothing enqueued; a launch failure gives ERR_CUDA. */
int kcuda_gemv_res(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx, int64_t n_tok,
                   float *y, int64_t ldy);
/* The same for H stacked matrices W_h = w0->data + h mat_bytes (kfwd_head_gemv's v_b):
 * y[t ldy + h yhs + r] = dot(W_h row r, x[t ldx + h xhs ..]); arguments as kfwd_head_gemv validates
 * them (this entry does not: callers must); ERR_UNSUPPORTED where it does not apply, as above. */
int kcuda_gemv_res_heads(struct kcuda_ctx *c, const struct kweight *w0, size_t mat_bytes, int H,
                         const float *x, int64_t ldx, int64_t xhs, int n_tok, float *y, int64_t ldy,
                         int64_t yhs);
/* rows per block the kernel would take for w now (H = 1: a product, TANDEM_GEMV_RES_RB / _BPS
 * applied; H > 1: H stacked matrices of w's shape, _HRB / _HBPS); 0: not taken */
int kcuda_gemv_res_rows(const struct kcuda_ctx *c, const struct kweight *w, int H);

#ifdef __cplusplus
}
#endif

#endif
