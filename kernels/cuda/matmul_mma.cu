/* The tensor-core decode GEMV (gemv_mma.cuh: mma.sync with exact integer weights and x split into
 * fp16 hi + lo) behind kcuda_matmul for n_tok 1..8, and the table that says when it is taken.
 *
 * Table, from the H200 run of bench_cuda_gemv_mma (2026-11-29, docs/PERFORMANCE.md, mma vs the
 * fp32 GEMV of matmul_gemv.cu in the same call):
 *   Q4_K, Q5_K: faster at every n_tok when the grid fills the GPU (6144x32768: 1.35x / 1.10x at
 *     n_tok 1); at n_tok 1-2 on narrow weights (n_out 2048: 128 blocks of 16 rows on 132 SMs)
 *     the fp32 GEMV's 4-row blocks win (0.83-0.95x), so those stay there;
 *   Q6_K, Q8_0: slower at n_tok 1-2 (0.52-0.87x; 4-byte loads of the 2-byte-aligned blocks and
 *     more registers), faster from n_tok 4 (1.05-2.5x); n_tok 3 costs the fp32 GEMV two passes
 *     over W, as n_tok 4 does, so it goes to the mma kernel too;
 *   every other type: the fp32 GEMV.
 * TANDEM_GEMV_MMA=0 (read on every call, like TANDEM_CUDA_ATTN) turns the mma paths off: the
 * dispatch is then exactly the one before they existed. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/gemv_mma.cuh"
#include "kernels/cuda/matmul_impl.cuh"

extern "C" bool kcuda_mm_mma_enabled(void)
{
	const char *e = getenv("TANDEM_GEMV_MMA");
	return !(e && strcmp(e, "0") == 0);
}

/* whether the mma GEMV is the faster one for this type, width and token count (table above) */
static bool mma_wins(int type, int64_t n_out, int n_tok, int n_sm)
{
	switch (type) {
	case KT_Q4_K:
	case KT_Q5_K: return n_tok >= 3 || (n_out + 15) / 16 >= 2 * (int64_t)n_sm;
	case KT_Q6_K:
	case KT_Q8_0: return n_tok >= 3;
	default: /* the codebook types: the fp32 GEMV's per-element codebook decode and FMAs are heavier than
	          * any K-quant's (not yet measured against it: session 32 had no GPU) */
		return gm_iq_type(type);
	}
}

int kcuda_gemv_mma_launch(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx,
                          int n_tok, float *y, int64_t ldy)
{
	if (!kcuda_mm_mma_enabled() || !mma_wins(w->type, w->n_out, n_tok, c->n_sm))
		return ERR_UNSUPPORTED;
	/* gemv_mma refuses (-EINVAL) what its layout assumptions exclude: n_in % 256 (Q6_K % 512),
	 * unaligned W or X; the caller then takes the fp32 GEMV */
	const int rc = gemv_mma(w->type, w->data, w->row_bytes, w->n_in, w->n_out, x, ldx, n_tok, y, ldy,
	                        c->stream, c->n_sm, 0);
	return rc == -EINVAL ? ERR_UNSUPPORTED : rc;
}
