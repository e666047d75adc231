/* The decode top-k of the indexer (topk_fast.cu): host launchers, included by the .cu files that
 * route decode-sized rows to it (topk_idx_radix.cu). Result as kcpu_topk: score descending, ties to
 * the LOWER position, +0 == -0, NaN as -inf, min(k, n) positions in ascending order. */
#ifndef TANDEM_KERNELS_CUDA_TOPK_FAST_CUH
#define TANDEM_KERNELS_CUDA_TOPK_FAST_CUH

#include <stdint.h>

struct kcuda_ctx;

#define KTOPK_FAST_REG 33280 /* rows (ld) up to this: keys in registers (640 threads x 52 at most) */
#define KTOPK_FAST_MAX 49152 /* longer rows: 1024 x 48 keys in 192 KB of shared memory (not sm_120) */

/* 1 when kcuda_topk_fast takes rows of stride ld on c's device: 1 <= ld <= KTOPK_FAST_REG, or up to
 * KTOPK_FAST_MAX where the shared memory allows, and TANDEM_TOPK is not "old" (read at every call,
 * so a test or bench can switch it between captures) */
int kcuda_topk_fast_takes(struct kcuda_ctx *c, int64_t ld);

/* kcuda_topk_idx's arguments and result; ERR_UNSUPPORTED (nothing launched) when
 * !kcuda_topk_fast_takes(ld). One block per row, no scratch, one launch. */
int kcuda_topk_fast(struct kcuda_ctx *c, const float *scores, int64_t ld, int64_t n_rows, const int32_t *n,
                    int64_t n0, int k, int32_t *out, int64_t ldo, int32_t *n_out);

#endif
