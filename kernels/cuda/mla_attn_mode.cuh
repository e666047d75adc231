/* Which attention / indexer kernels the kcuda_mla_attn, kcuda_indexer_* and kcuda_topk_idx entry
 * points take: the fast ones (mla_attn_mma.cu, indexer_fast.cu, topk_idx_radix.cu; default) or the
 * first, simple ones (mla_attn.cu, indexer.cu, topk_idx.cu) with TANDEM_CUDA_ATTN=ref. The switch
 * exists so a failure of a new kernel on a GPU costs nothing (set the variable, rerun), and so the
 * op tests can check both against the CPU in one run. Read on every call (a getenv, well under a
 * microsecond next to a launch; under CUDA-graph capture it is read once, at capture), so a test
 * can flip it between calls. Internal to kernels/cuda. */
#ifndef TANDEM_KERNELS_CUDA_MLA_ATTN_MODE_CUH
#define TANDEM_KERNELS_CUDA_MLA_ATTN_MODE_CUH

#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/mla_pool.cuh"

static inline int kattn_use_ref(void)
{
	const char *e = getenv("TANDEM_CUDA_ATTN");
	return e && strcmp(e, "ref") == 0;
}

/* the first kernels, kept behind the switch (same arguments as the public ops) */
int kcuda_mla_attn_ref(struct kcuda_ctx *c, const struct kcuda_kv_view *kv,
                       const struct kcuda_attn_rows *rows, const float *q, int64_t H, int64_t C, int64_t R,
                       float scale, float *out);
int kcuda_topk_idx_ref(struct kcuda_ctx *c, const float *scores, int64_t ld, int64_t n_rows, const int32_t *n,
                       int64_t n0, int k, int32_t *out, int64_t ldo, int32_t *n_out);
/* multi-block radix top-k with an explicit scratch area (topk_idx_radix.cu); ERR_UNSUPPORTED when
 * the shape does not suit it (many rows, scratch too small): the caller then takes the ref kernel */
int kcuda_topk_idx_radix(struct kcuda_ctx *c, const float *scores, int64_t ld, int64_t n_rows,
                         const int32_t *n, int64_t n0, int k, int32_t *out, int64_t ldo, int32_t *n_out,
                         void *scratch, size_t scratch_bytes);
size_t kcuda_topk_idx_radix_scratch(int64_t n_rows, int64_t max_n);
/* one-launch top-k of up to KSEL_MAX_ROWS rows of up to KSEL_MAX_KEYS scores (topk_sel.cu, the
 * default of kcuda_topk_idx there); ERR_UNSUPPORTED (nothing launched) otherwise or with
 * TANDEM_IDX_TOPK=old / TANDEM_CUDA_ATTN=ref */
int kcuda_topk_sel(struct kcuda_ctx *c, const float *scores, int64_t ld, int64_t n_rows, const int32_t *n,
                   int64_t n0, int k, int32_t *out, int64_t ldo, int32_t *n_out);

/* kcuda_mla_attn's one-launch small-batch kernel (mla_attn_dec.cu) for a call the tensor-core
 * kernel's checks accepted: ERR_UNSUPPORTED (nothing launched) under TANDEM_MLA_DEC=0, for more
 * (row, head group) pairs than its limit, or a shape / device it does not take */
int kmla_dec_launch(struct kcuda_ctx *c, const struct kcuda_kv_view *kv, const struct kcuda_attn_rows *rows,
                    const float *q, int64_t H, int64_t C, float scale, float *out);

/* the short-chain fp32 decode kernel (mla_attn_dec6.cu; not yet measured, off by default):
 * ERR_UNSUPPORTED (nothing launched) unless TANDEM_MLA_DEC_V=6, under TANDEM_MLA_DEC=0, for more
 * rows or heads than its limits, or a shape / device it does not take (the caller then tries the
 * next kernel) */
int kmla_dec6_launch(struct kcuda_ctx *c, const struct kcuda_kv_view *kv, const struct kcuda_attn_rows *rows,
                     const float *q, int64_t H, int64_t C, float scale, float *out);
/* the same kernel in scores mode, mla_dec7's first launch, in tiles of kb keys (the kernel's own:
 * kmla_dec6_kb): sc[(row * H + h) * ld_sc + j] = e^(s_j - m_t) for j < the row's key count, s_j =
 * scale x q . key j (0 for an invalid key), and ml[(row * H + h) * ld_t + t] = (m_t, the sum of
 * tile t's values) for its tiles that hold keys; ERR_UNSUPPORTED (nothing launched) where it does
 * not take the shape or device */
int kmla_dec6_scores(struct kcuda_ctx *c, const struct kcuda_kv_view *kv, const struct kcuda_attn_rows *rows,
                     const float *q, int64_t H, int64_t C, float scale, float *sc, int64_t ld_sc, float2 *ml,
                     int64_t ld_t, int kb);
/* keys a tile of mla_dec6 for a bf16 (or fp32) pool under the current switches (TANDEM_MLA_DEC6_KB) */
int kmla_dec6_kb(int bf16);
/* whether mla_dec6 reads qseq and the block table before its PDL wait (TANDEM_MLA_DEC6_EARLY=0: after);
 * mla_dec7's second launch follows the same switch */
int kmla_dec6_early(void);
/* the two-launch decode without a merge (mla_attn_dec7.cu: scores, then softmax + PV split over the
 * channels): ERR_UNSUPPORTED (nothing launched) unless on (TANDEM_MLA_DEC_V=7 or its default), for
 * more rows than its limit, more than 2048 keys a row, or a shape / device it does not take */
int kmla_dec7_launch(struct kcuda_ctx *c, const struct kcuda_kv_view *kv, const struct kcuda_attn_rows *rows,
                     const float *q, int64_t H, int64_t C, float scale, float *out);

/* the indexer score kernels' arguments (indexer.cu fills them, both kernels read them) */
struct idx_args {
	const uint8_t *base;
	int64_t n_blocks;
	size_t block_bytes, offset;
	int bt, bf16;
	const int32_t *qseq, *blocks, *n_keys;
	int64_t ld_blocks, pos0, max_keys;
	const float *q, *w;
	int HI, DI;
	float scale;
	float *scores;
	int64_t ld;
	unsigned *err;
	int tiles; /* fast kernel: 64-key tiles per block (0: chosen by kcuda_indexer_fast_launch) */
	int skip_le; /* > 0: rows with at most this many keys are not scored (their top-k keeps every
	              * key, so kcuda_indexer_topk's short top-k does not read the scores); 0: all */
	/* qr_R > 0 (fast kernel only, kfuse_indexer_topk_rope): q's first qr_R values of each head are
	 * roped on load at position qr_pos[row] (q in memory is unroped) */
	int qr_R, qr_pairing;
	const float *qr_inv;
	const int32_t *qr_pos;
	/* the fused top-k (kcuda_indexer_sel_launch; topk_sel.cuh): sel_k > 0 selects min(sel_k, n)
	 * positions of each row into sel[row * ld_sel ..], nsel[row] = that count (nsel may be NULL);
	 * zs: the context's zeroed scratch (per-row histograms and tickets) */
	int sel_k;
	int32_t *sel, *nsel;
	int64_t ld_sel;
	unsigned *zs;
	int sel_smem; /* the kernel's dynamic shared memory (the tail reuses it) */
	int pf; /* fused kernel: L2 prefetch of the block's key rows before KDEP_ENTRY */
	/* > 0 (score kernel without the fused top-k): the step's query-row count; a row's keys at
	 * positions < n_keys - early_new were written by earlier steps, so their block-table lookups
	 * and their copies into shared memory start before KDEP_ENTRY (indexer_fast.cu) */
	int64_t early_new;
	int64_t n_rows; /* fast kernel: rows of this launch (blocks of several rows stop at it) */
	/* fast kernel, one-row blocks without the fused top-k: a block's keys are an even share of its
	 * row's own tiles over the grid's key ranges (if_span), not tiles x 64 of the plan's max_keys */
	int even;
};
/* does the tensor-core score kernel take these arguments (shape, alignment, shared memory)? */
bool kcuda_indexer_fast_ok(struct kcuda_ctx *c, const idx_args &a);
/* the tensor-core score kernel (indexer_fast.cu) for rows [0, n_q) of a: ERR_UNSUPPORTED when the
 * shape does not suit it (fp32 keys, HI > 64, DI > 128 or not a multiple of 16, misaligned) */
int kcuda_indexer_fast_launch(struct kcuda_ctx *c, const idx_args &a, int64_t n_q);
/* scores and the exact top-k of rows [0, n_q) in ONE launch (the tensor-core score kernel with the
 * selection finished by the last block of each row, topk_sel.cuh); a.scores / a.ld: the scores'
 * rows (16-byte aligned, ld % 4 == 0), a.sel_k ... a.zs set. ERR_UNSUPPORTED (nothing launched)
 * where it does not apply: then kcuda_indexer_topk's separate kernels run */
int kcuda_indexer_sel_launch(struct kcuda_ctx *c, const idx_args &a, int64_t n_q);

/* cp.async helpers (sm_80+): 16-byte global -> shared copies that bypass L1 */
/* to a shared-memory address already converted (__cvta_generic_to_shared) */
__device__ __forceinline__ void katt_cp16s(unsigned s, const void *gmem)
{
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
/* three 16-byte copies at s / gmem + 0, 512 and 1024 (the third only where third): one asm, the offsets
 * immediates */
__device__ __forceinline__ void katt_cp16s_x3(unsigned s, const void *gmem, bool third)
{
	asm volatile("{\n\t.reg .pred p3;\n\tsetp.ne.u32 p3, %2, 0;\n\t"
	             "cp.async.cg.shared.global [%0], [%1], 16;\n\t"
	             "cp.async.cg.shared.global [%0+512], [%1+512], 16;\n\t"
	             "@p3 cp.async.cg.shared.global [%0+1024], [%1+1024], 16;\n\t}\n" ::"r"(s),
	             "l"(gmem), "r"((unsigned)third)
	             : "memory");
}
__device__ __forceinline__ void katt_cp16(void *smem, const void *gmem)
{
	katt_cp16s((unsigned)__cvta_generic_to_shared(smem), gmem);
}
__device__ __forceinline__ void katt_cp_commit(void)
{
	asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void katt_cp_wait(void)
{
	asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#endif
