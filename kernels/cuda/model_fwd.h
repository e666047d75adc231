/* Small CUDA ops and runtime helpers the model's CUDA backend (common/model/backend_cuda.c) needs
 * beyond the kcuda_* kernels: element-wise add/scale, strided row copies, row gathers, the paged
 * KV write, random weight fill (synthetic bench), pinned double-buffered weight staging, device
 * memory info, CUDA-graph capture/replay and a device-to-device copy bandwidth probe. Every kernel
 * takes its lengths from device memory or from values fixed for a captured graph (no per-step host
 * lengths), so they can be captured. All run on the kcuda context's stream. Return 0 or ERR_CUDA. */
#ifndef TANDEM_KERNELS_CUDA_MODEL_FWD_H
#define TANDEM_KERNELS_CUDA_MODEL_FWD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(TANDEM_CUDA) || defined(__CUDACC__)
int kfwd_add(struct kcuda_ctx *c, float *y, const float *x, int64_t n); /* y += x */
/* kcpu_layernorm twin (statistics in double), one block per row */
int kfwd_layernorm(struct kcuda_ctx *c, float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                   const float *b, int64_t n, int64_t n_rows, float eps);
int kfwd_scale(struct kcuda_ctx *c, float *x, int64_t n, float s); /* x *= s */
/* dst[r * ldd + j] = src[r * lds + j], r < rows, j < width */
int kfwd_copy2d(struct kcuda_ctx *c, float *dst, int64_t ldd, const float *src, int64_t lds, int64_t width,
                int64_t rows);
/* dst row j = src row rows_dev[j] (width floats), j < n */
int kfwd_gather_rows(struct kcuda_ctx *c, float *dst, const float *src, int64_t width,
                     const int32_t *rows_dev, int64_t n);
/* Row i of x (width floats) to the pool row of (sequence seq[i], position pos[i]): base +
 * blocks[seq * ld_blocks + pos / block_tokens] * block_bytes + offset + (pos % block_tokens) *
 * width * elt; bf16 rounds to nearest even (kf32_to_bf16). Rows with n_valid_dev[0] <= i are
 * skipped (n_valid_dev may be NULL: all n). */
int kfwd_kv_write(struct kcuda_ctx *c, void *base, size_t block_bytes, size_t offset, int block_tokens,
                  int64_t width, int bf16, const float *x, int64_t n, const int32_t *seq, const int32_t *pos,
                  const int32_t *blocks, int64_t ld_blocks);
/* bytes of random data with bit 14 of every 16-bit word cleared: every fp16 / bf16 / fp32 field
 * stays finite (|x| < 2) whatever the quant layout */
int kfwd_fill_random(struct kcuda_ctx *c, void *dst, size_t bytes, uint64_t seed);
int kfwd_mem_info(size_t *free_bytes, size_t *total_bytes);

/* Pinned double-buffered staging: stage() copies host bytes into the current pinned buffer and,
 * when it is full, starts its async copy on a copy stream and switches to the other buffer
 * (waiting for that one's previous copy), so the host reads (mmap page-ins) overlap the DMA.
 * Consecutive pieces to consecutive addresses of one allocation become one copy. */
struct kfwd_stager;
int kfwd_stager_create(size_t buf_bytes, struct kfwd_stager **out);
int kfwd_stage(struct kfwd_stager *s, void *dst_dev, const void *src, size_t bytes);
/* the following pieces go to another allocation (pieces are merged only within one) */
void kfwd_stage_new_dst(struct kfwd_stager *s);
int kfwd_stager_finish(struct kfwd_stager *s); /* flush + wait */
void kfwd_stager_destroy(struct kfwd_stager *s);

/* CUDA graphs on the context's stream */
int kfwd_graph_begin(struct kcuda_ctx *c);
int kfwd_graph_end(struct kcuda_ctx *c, void **exec_out); /* instantiated cudaGraphExec_t */
extern size_t kfwd_graph_nodes_last; /* nodes (kernels, copies, memsets) of the last graph ended */
int kfwd_graph_launch(struct kcuda_ctx *c, void *exec);
void kfwd_graph_destroy(void *exec);
/* device-to-device copy bandwidth (GB/s, read + write counted once each as bytes copied) */
int kfwd_d2d_gbps(struct kcuda_ctx *c, size_t bytes, int reps, double *gbps);

/* head_gemv.cu: y[t * ldy + h * yhs + r] = dot(row r of matrix h, x + t * ldx + h * xhs) for H
 * matrices of w0's shape stacked mat_bytes apart (w0 = matrix 0), t < n_tok (H * n_tok <= 65535):
 * the per-head k_b / v_b products of the absorbed MLA in one launch, fp32. From 2 tokens the tile
 * product may split K through the context workspace (as kcuda_matmul), so x and y must not lie in it.
 * kfwd_head_gemv_ok: the weight's type and alignment suit the kernel (else use one kcuda_matmul per
 * head). */
bool kfwd_head_gemv_ok(const struct kweight *w0, size_t mat_bytes);
int kfwd_head_gemv(struct kcuda_ctx *c, const struct kweight *w0, size_t mat_bytes, int H, const float *x,
                   int64_t ldx, int64_t xhs, int64_t n_tok, float *y, int64_t ldy, int64_t yhs);
#endif

#ifdef __cplusplus
}
#endif
#endif
