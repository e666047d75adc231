/* Fused small ops of the decode step (kernels/cuda/fused.cu): sequences of the model's row ops
 * (add, RMSNorm, LayerNorm, RoPE, scale, KV write) done in one launch each, so a captured decode
 * graph holds fewer, less dependent nodes (issue #4). Each equals the sequence of the kcuda_ /
 * kfwd_ ops it replaces, element by element (the same per-element arithmetic; reductions in the
 * same precision), and the CPU backend runs the sequences themselves (backend_cpu.c).
 * Positions and table entries come from device memory (captured graphs replay them). Rows with a
 * negative position (padding of a graph bucket) are not written to the pool. Return 0 or an error. */
#ifndef TANDEM_KERNELS_CUDA_FUSED_H
#define TANDEM_KERNELS_CUDA_FUSED_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(TANDEM_CUDA) || defined(__CUDACC__)
/* Where the rows go in the paged KV pool (kfwd_kv_write's addressing): row i to base +
 * blocks[seq[i] * ld_blocks + pos[i] / block_tokens] * block_bytes + offset + (pos[i] %
 * block_tokens) * width * elt. base NULL: nothing is written. */
struct kfuse_kv {
	void *base;
	size_t block_bytes, offset;
	int block_tokens;
	int bf16;
	const int32_t *seq, *blocks;
	int64_t ld_blocks;
};

/* RoPE angles: pos[t] * inv_freq[i] (kcuda_rope with mscale 1), pairing 0 interleaved, 1 half */
struct kfuse_rope {
	const float *inv_freq;
	const int32_t *pos;
	int pairing;
};

/* h[r] += x[r] (x NULL: nothing added), then y[r] = rmsnorm(h[r]) * w; rows n wide, contiguous.
 * = kfwd_add + kcuda_rmsnorm. y must not alias h or x. */
int kfuse_add_rmsnorm(struct kcuda_ctx *c, float *h, const float *x, float *y, const float *w, int64_t n,
                      int64_t n_rows, float eps);

/* kfuse_add_rmsnorm that also leaves y's int8 parts (k45_i8.cuh: three int8 parts per 32-element
 * sub-block, 896 bytes per 256 elements of a row) in the context's parts buffer, for the one-token
 * MoE units that read y next (moe_small.cu): they then copy each unit's parts instead of
 * quantizing y again in every one of their blocks. The parts are written where the cluster kernel
 * takes the shape and n % 256 == 0, n_rows * n / 256 * 896 <= KCUDA_XP_BYTES; the context then
 * records (y, n, n_rows) as what its buffer holds (kcuda_xparts_forget clears it; the caller
 * forgets before y or the buffer is written by anything else). Otherwise = kfuse_add_rmsnorm with
 * nothing recorded. y's values are the same bits either way. */
int kfuse_add_rmsnorm_parts(struct kcuda_ctx *c, float *h, const float *x, float *y, const float *w,
                            int64_t n, int64_t n_rows, float eps);

/* kfuse_add_rmsnorm by a given kernel (tests, benches): KFUSE_AN_OLD one block of 1024 threads a
 * row; KFUSE_AN_V4 one block of 256 (n % 4 == 0, n <= 8192, 16-byte aligned); KFUSE_AN_CL a cluster
 * of up to 8 blocks a row, the sum of squares in double (sm_90+, n % 4 == 0, n <= 16384, 16-byte
 * aligned, n_rows <= KFUSE_AN_CL_ROWS); V4 or CL | KFUSE_AN_EARLY: the PDL trigger before the wait.
 * ERR_UNSUPPORTED (nothing launched) where the kernel does not take the shape. kfuse_add_rmsnorm
 * picks by TANDEM_ADDNORM (unset: cl, else v4, else old) and TANDEM_NORM_EARLY (1 always, 0 never,
 * unset from 2 rows on). */
#define KFUSE_AN_OLD 1
#define KFUSE_AN_V4 2
#define KFUSE_AN_CL 3
#define KFUSE_AN_EARLY 0x10
#define KFUSE_AN_CL_ROWS 256
int kfuse_add_rmsnorm_as(struct kcuda_ctx *c, int kind, float *h, const float *x, float *y, const float *w,
                         int64_t n, int64_t n_rows, float eps);

/* The MLA latents of n_rows tokens, in place: cq[r] (Cq wide) = rmsnorm(cq[r]) * wq (eps_q);
 * kvl[r][0..C) = rmsnorm(kvl[r][0..C)) * wkv (eps_kv); kvl[r][C..C+R) roped; then kvl[r] (C + R)
 * written to kv. = kcuda_rmsnorm x 2 + kcuda_rope + kfwd_kv_write. */
int kfuse_mla_latent(struct kcuda_ctx *c, float *cq, int64_t Cq, const float *wq, float eps_q, float *kvl,
                     int64_t C, int64_t R, const float *wkv, float eps_kv, int64_t n_rows,
                     const struct kfuse_rope *rp, const struct kfuse_kv *kv);

/* kfuse_mla_latent that also leaves cq's int8 parts (normed rows) in the context's parts buffer, as
 * kfuse_add_rmsnorm_parts does for its y (Cq % 256 == 0, cq 16-byte aligned, n_rows * Cq / 256 * 896
 * <= KCUDA_XP_BYTES; else = kfuse_mla_latent with nothing recorded): the one-token Q8_0 products of
 * cq (idx_q_b) then read those. The same values in cq either way. */
int kfuse_mla_latent_parts(struct kcuda_ctx *c, float *cq, int64_t Cq, const float *wq, float eps_q,
                           float *kvl, int64_t C, int64_t R, const float *wkv, float eps_kv, int64_t n_rows,
                           const struct kfuse_rope *rp, const struct kfuse_kv *kv);

/* The indexer's inputs of n_rows tokens, in place: qI[r] (HI heads of DI) roped on the first R of
 * each head; wI[r] (HI) *= wscale; kI[r] (DI) = layernorm(kI[r]) * kw + kb (kb may be NULL;
 * statistics in double), its first R roped, then written to kv. = kfwd_layernorm + kcuda_rope x 2
 * + kfwd_scale + kfwd_kv_write. */
int kfuse_idx_prep(struct kcuda_ctx *c, float *qI, float *wI, int64_t HI, float wscale, float *kI, int64_t DI,
                   int64_t R, const float *kw, const float *kb, float eps, int64_t n_rows,
                   const struct kfuse_rope *rp, const struct kfuse_kv *kv);

/* The indexer's key and weights of the rows (idx_prep's k_I and w_I parts): kI[r] (DI) =
 * layernorm(kI[r]) * kw + kb (kb may be NULL), its first R roped by rp, written to kv; wI[r] (HI)
 * *= wscale. */
struct kfuse_idx_key {
	float *kI;
	int64_t DI, R;
	const float *kw, *kb;
	float eps;
	float *wI;
	int64_t HI;
	float wscale;
	struct kfuse_rope rp;
	struct kfuse_kv kv;
};

/* kfuse_mla_latent and the k_I / w_I parts of kfuse_idx_prep in one launch (their inputs, the
 * products of `a`, are ready together); q_I is NOT roped: kfuse_indexer_topk_rope does that on its
 * loads (or kcuda_rope, where it declines). Each part's values equal those of the two ops. */
int kfuse_mla_latent_idx(struct kcuda_ctx *c, float *cq, int64_t Cq, const float *wq, float eps_q, float *kvl,
                         int64_t C, int64_t R, const float *wkv, float eps_kv, int64_t n_rows,
                         const struct kfuse_rope *rp, const struct kfuse_kv *kv,
                         const struct kfuse_idx_key *ik);

/* dst[t * ldd + h * dhs + 0..R) = rope(src[t * lds + h * shs + 0..R)) for t < n_tok, h < n_heads
 * = kfwd_copy2d + kcuda_rope on dst. */
int kfuse_rope_copy(struct kcuda_ctx *c, float *dst, int64_t ldd, int64_t dhs, const float *src, int64_t lds,
                    int64_t shs, int64_t n_tok, int64_t n_heads, int64_t R, const struct kfuse_rope *rp);

/* mla_attn_absorb.cu: the absorbed MLA query of n_tok tokens in one launch, per head h < H:
 * y[t][h yhs + r] = dot(W_h row r, x[t][h xhs + 0 .. n_in)) for r < n_out (W_h = w0->data + h
 * mat_bytes: k_b's W_UK q_nope), and y[t][h yhs + n_out + 0..R) = RoPE of x[t][h xhs + n_in + 0..R)
 * at rp->pos[t] (q's rotary part) = kfwd_head_gemv + kfuse_rope_copy. ERR_UNSUPPORTED (nothing
 * launched) unless w0 is Q8_0 with n_in 64..256 (a multiple of 64), 1..8 tokens, aligned as
 * head_gemv_q8.cu needs, TANDEM_GEMV3 and TANDEM_ABSORB_ROPE not 0: the caller then runs the two
 * ops. */
int kfuse_absorb_rope(struct kcuda_ctx *c, const struct kweight *w0, size_t mat_bytes, int H, const float *x,
                      int64_t ldx, int64_t xhs, int64_t n_tok, float *y, int64_t ldy, int64_t yhs, int64_t R,
                      const struct kfuse_rope *rp);

/* mla_attn_dec.cu (bench_cuda_attn's report): the one-launch decode kernel's residency on c's
 * device for a bf16 / fp32 pool (576-wide rows): blocks per SM, 8-block clusters at once,
 * registers per thread, shared memory per block; ERR_UNSUPPORTED where it cannot run. */
int kmla_dec_occupancy(struct kcuda_ctx *c, int bf16, int *blocks_per_sm, int *clusters, int *regs,
                       int *smem);

/* mla_attn_mma.cu: kcuda_mla_attn with q's rotary part roped inside the attention kernel, so the
 * absorbed query needs no kfuse_rope_copy first: q[t][h][0..C) is read as kcuda_mla_attn reads it;
 * dims [C, C+R) come from qr[t * ldqr + h * qrhs + 0..R) (unroped) rotated by rp at rp->pos[t]
 * (= kfuse_rope_copy into q, then kcuda_mla_attn). ERR_UNSUPPORTED (nothing launched) when the
 * tensor-core kernel does not take the call, under TANDEM_CUDA_ATTN=ref, or with TANDEM_MLA_ROPE=0:
 * the caller then runs the two steps. Off unless TANDEM_MLA_ROPE=1. */
int kfuse_mla_attn_rope(struct kcuda_ctx *c, const struct kcuda_kv_view *kv,
                        const struct kcuda_attn_rows *rows, const float *q, int64_t H, int64_t C, int64_t R,
                        float scale, float *out, const float *qr, int64_t ldqr, int64_t qrhs,
                        const struct kfuse_rope *rp);

/* indexer.cu: kcuda_indexer_topk with q unroped in memory: the first R values of each of the HI
 * heads of q are roped by rq at rq->pos[row] as the score kernel loads them (= kcuda_rope on q,
 * then kcuda_indexer_topk). ERR_UNSUPPORTED (nothing launched) where the tensor-core score kernel
 * does not take the call, under TANDEM_CUDA_ATTN=ref, and unless TANDEM_IDX_FOLD=1. */
int kfuse_indexer_topk_rope(struct kcuda_ctx *c, const struct kcuda_kv_view *kv,
                            const struct kcuda_attn_rows *rows, const float *q, const float *w, int64_t HI,
                            int64_t DI, float scale, int k, int32_t *sel, int64_t ld_sel, int32_t *nsel,
                            const struct kfuse_rope *rq, int64_t R);

/* topk_idx_radix.cu: exact top-k (kcpu_topk's order and ties) of rows of at most KFUSE_TOPK_SHORT
 * scores, one block per row with the row's keys in shared memory: one launch, no scratch (the
 * radix path takes 5 launches and a memset). Arguments as kcuda_topk_idx; ERR_UNSUPPORTED when
 * the row does not fit (kcuda_topk_idx_short_fits: ld > KFUSE_TOPK_SHORT, or more than the
 * device's shared memory per block: sm_120 takes ~24k). */
#define KFUSE_TOPK_SHORT 49152 /* topk_fast.cu's KTOPK_FAST_MAX; the shared-memory kernel: 32768 */
#define KFUSE_TOPK_SHORT_DEFAULT 8192 /* kcuda_indexer_topk's limit unless TANDEM_TOPK_SHORT_MAX */
int kcuda_topk_idx_short(struct kcuda_ctx *c, const float *scores, int64_t ld, int64_t n_rows,
                         const int32_t *n, int64_t n0, int k, int32_t *out, int64_t ldo, int32_t *n_out);
int kcuda_topk_idx_short_fits(struct kcuda_ctx *c, int64_t ld);

/* TANDEM_FUSE=0 turns the fused paths off (the parts run one by one); read once. */
int kfuse_enabled(void);
#endif

#ifdef __cplusplus
}
#endif
#endif
