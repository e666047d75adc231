/* The absorbed MLA query in one launch (kfuse_absorb_rope, fused.h): per head h of n_tok tokens,
 *   y[t][h yhs + r]           = dot(W_h row r, x[t][h xhs + 0 .. n_in))    r < n_out (W_UK q_nope)
 *   y[t][h yhs + n_out + 0..R) = RoPE(x[t][h xhs + n_in + 0 .. R))          (q's rotary part)
 * = kfwd_head_gemv + kfuse_rope_copy, which were two graph nodes per layer (head_q8_kernel 4.2 us
 * + rope_copy_kernel 3.0 us in the H200 ncu profile of run 10). The product is head_gemv_q8.cu's
 * kernel (front4's file), copied here with its arithmetic unchanged so the values are the same:
 * Q8_0 rows of 64..256 elements at 1..8 tokens, a warp per HQ_RT rows, lane l < n_in / 8 owning
 * elements 8 l .. 8 l + 7 (quarter l % 4 of block l / 4), three aligned loads per row, fp32 and a
 * warp sum. One more block column (blockIdx.x == gridDim.x - 1) ropes the head's rotary part of
 * every token, one thread per (token, pair), with fused.cu's rotation (angle pos * inv_freq,
 * precise sincosf). The weights are not written while kernels run, so each product block asks L2
 * for its rows before KDEP_ENTRY (kdep_prefetch_l2; TANDEM_PREFETCH=0 turns it off). */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/fused.h"
#include "kernels/cuda/matmul_impl.cuh"
#include "kernels/cuda/mla_attn_mode.cuh"
#include "kernels/cuda/q8_warp_rows.cuh"

#define AR_WARPS 4
#define AR_RT 2 /* rows per warp */

/* grid (ceil(n_out / (AR_WARPS AR_RT)) + 1, H) */
template <int NT>
__global__ void __launch_bounds__(AR_WARPS * 32)
    absorb_rope_kernel(const uint8_t *__restrict__ w, size_t mat_bytes, size_t row_bytes, int n_out, int n_q,
                       int n_in, const float *x, int64_t ldx, int64_t xhs, int n_tok, float *y, int64_t ldy,
                       int64_t yhs, int half, kfuse_rope rp, int prefetch)
{
	const int warp = threadIdx.x >> 5;
	const bool rope_blk = blockIdx.x == gridDim.x - 1;
	w += (size_t)blockIdx.y * mat_bytes;
	const int row0 = (blockIdx.x * AR_WARPS + warp) * AR_RT;
	if (prefetch && !rope_blk && threadIdx.x == 0) { /* weights only: allowed before KDEP_ENTRY */
		const int r0 = blockIdx.x * AR_WARPS * AR_RT, r1 = min(r0 + AR_WARPS * AR_RT, n_out);
		kdep_prefetch_l2(w + (size_t)r0 * row_bytes, (size_t)(r1 - r0) * row_bytes);
	}
	KDEP_ENTRY();
	/* q comes from the kernel before (weights alone may be read above): plain, opaque loads */
	x = kdep_after(x) + (int64_t)blockIdx.y * xhs;
	y += (int64_t)blockIdx.y * yhs;
	if (rope_blk) { /* y[t][n_out + ..] = rope(x[t][n_in + ..]), one thread per (token, pair) */
		for (int g = threadIdx.x; g < n_tok * half; g += AR_WARPS * 32) {
			const int t = g / half, i = g - t * half;
			const float *s = x + t * ldx + n_in;
			float *d = y + t * ldy + n_out;
			const int i0 = rp.pairing ? i : 2 * i, i1 = rp.pairing ? i + half : 2 * i + 1;
			const float ang = (float)rp.pos[t] * rp.inv_freq[i];
			float sn, co;
			sincosf(ang, &sn, &co);
			const float u0 = s[i0], u1 = s[i1];
			d[i0] = u0 * co - u1 * sn;
			d[i1] = u0 * sn + u1 * co;
		}
		return;
	}
	kq8_warp_rows<AR_RT, NT>(w, row_bytes, row0, n_out, n_q, x, ldx, n_tok, y, ldy);
}

template <int NT>
static int ar_launch(struct kcuda_ctx *c, const struct kweight *w0, size_t mat_bytes, int H, const float *x,
                     int64_t ldx, int64_t xhs, int n_tok, float *y, int64_t ldy, int64_t yhs, int64_t R,
                     const struct kfuse_rope *rp)
{
	const dim3 grid((unsigned)((w0->n_out + AR_WARPS * AR_RT - 1) / (AR_WARPS * AR_RT) + 1), (unsigned)H);
	return klaunch("absorb_rope", absorb_rope_kernel<NT>, grid, dim3(AR_WARPS * 32), 0, c->stream,
	               (const uint8_t *)w0->data, mat_bytes, w0->row_bytes, (int)w0->n_out,
	               (int)(w0->n_in / 8), (int)w0->n_in, x, ldx, xhs, n_tok, y, ldy, yhs, (int)(R / 2), *rp,
	               kcuda_prefetch_enabled());
}

/* TANDEM_ABSORB_ROPE=0: the caller runs the product and the rope apart (read on every call; at
 * capture only under graphs) */
static bool ar_enabled(void)
{
	const char *e = getenv("TANDEM_ABSORB_ROPE");
	return !(e && strcmp(e, "0") == 0);
}

extern "C" int kfuse_absorb_rope(struct kcuda_ctx *c, const struct kweight *w0, size_t mat_bytes, int H,
                                 const float *x, int64_t ldx, int64_t xhs, int64_t n_tok, float *y,
                                 int64_t ldy, int64_t yhs, int64_t R, const struct kfuse_rope *rp)
{
	size_t rb = 0;
	if (!c || !w0 || !x || !y || !rp || !rp->inv_freq || !rp->pos ||
	    (rp->pairing != 0 && rp->pairing != 1) || H < 1 || n_tok < 0 || R < 2 || R % 2 || !w0->data ||
	    w0->n_in < 1 || w0->n_out < 1 || !ktype_row_bytes(w0->type, w0->n_in, &rb) ||
	    rb != w0->row_bytes || mat_bytes < rb * (size_t)w0->n_out || xhs < w0->n_in + R ||
	    yhs < w0->n_out + R || ldx < (int64_t)H * xhs - (xhs - w0->n_in - R) ||
	    ldy < (int64_t)H * yhs - (yhs - w0->n_out - R))
		return kcuda_bad_arg(
		    "absorb_rope",
		    "H %d, n_tok %lld, R %lld, %s %lld x %lld (row_bytes %zu, mat_bytes %zu), "
		    "ldx %lld xhs %lld ldy %lld yhs %lld%s",
		    H, (long long)n_tok, (long long)R, w0 ? ktype_name(w0->type) : "-",
		    w0 ? (long long)w0->n_out : 0LL, w0 ? (long long)w0->n_in : 0LL, w0 ? w0->row_bytes : 0,
		    mat_bytes, (long long)ldx, (long long)xhs, (long long)ldy, (long long)yhs,
		    ", or a null pointer / bad rope description");
	/* the shapes head_gemv_q8.cu takes (k_b: Q8_0, 64..256 wide, 1..8 tokens, aligned) */
	if (!ar_enabled() || !kcuda_gemv3_enabled() || w0->type != KT_Q8_0 || n_tok < 1 || n_tok > 8 ||
	    H > 65535 || w0->n_in < 64 || w0->n_in > 256 || w0->n_in % 64 || w0->n_out > INT32_MAX - 64 ||
	    (uintptr_t)w0->data % 16 || mat_bytes % 16 || (uintptr_t)x % 16 || ldx % 4 || xhs % 4)
		return ERR_UNSUPPORTED;
	const int nt = (int)n_tok;
	if (nt == 1)
		return ar_launch<1>(c, w0, mat_bytes, H, x, ldx, xhs, nt, y, ldy, yhs, R, rp);
	if (nt == 2)
		return ar_launch<2>(c, w0, mat_bytes, H, x, ldx, xhs, nt, y, ldy, yhs, R, rp);
	if (nt <= 4)
		return ar_launch<4>(c, w0, mat_bytes, H, x, ldx, xhs, nt, y, ldy, yhs, R, rp);
	return ar_launch<8>(c, w0, mat_bytes, H, x, ldx, xhs, nt, y, ldy, yhs, R, rp);
}
