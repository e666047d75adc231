/* One warp's product of RT consecutive rows of a Q8_0 matrix with short rows (n_in <= 256) for n_tok
 * <= NT tokens: the body of head_gemv_q8.cu's per-head kernel and of mla_attn_absorb.cu's absorb + rope
 * kernel (one copy). Lane l < n_q = n_in / 8 owns elements 8 l .. 8 l + 7 of every row (quarter l % 4
 * of block l / 4) and loads them with three aligned loads per row (two words and a half word for the
 * quarters at 2 mod 4: no byte past the row is read), all rows' loads before any math; its x elements
 * for every token are loaded once (float4) and reused for the RT rows. fp32 throughout (bytes become
 * floats with PRMT + FADD, exact), then a warp sum: deterministic.
 *   y[t * ldy + r] = dot(row r of w, x[t * ldx ..]), r in [row0, min(row0 + RT, n_out)), t < n_tok.
 * Call after KDEP_ENTRY() with x read through kdep_after() where the kernel did work before the wait;
 * rows 4-byte aligned (n_in % 64 == 0), x 16-byte aligned. */
#ifndef TANDEM_KERNELS_CUDA_Q8_WARP_ROWS_CUH
#define TANDEM_KERNELS_CUDA_Q8_WARP_ROWS_CUH

#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/cuda/cuda_common.cuh"

/* signed byte k of u (stored + 128: the xor below) as a float */
__device__ __forceinline__ float kq8w_s8f(uint32_t u, int k)
{
	return __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7540u + (unsigned)k)) - 8388736.0f;
}

template <int RT, int NT>
__device__ __forceinline__ void kq8_warp_rows(const uint8_t *w, size_t row_bytes, int row0, int n_out,
                                              int n_q, const float *x, int64_t ldx, int n_tok, float *y,
                                              int64_t ldy)
{
	const int lane = threadIdx.x & 31;
	const bool act = lane < n_q;
	const int bi = lane >> 2, j = lane & 3;
	const int mis = (bi & 1) ? 0 : 2; /* the quarter's offset 34 bi + 2 + 8 j mod 4 (rows 4-aligned) */

	uint32_t q0[RT], q1[RT];
	float d[RT];
#pragma unroll
	for (int r = 0; r < RT; r++) {
		q0[r] = q1[r] = 0u;
		d[r] = 0.0f;
		if (act) {
			const uint8_t *rw = w + (size_t)min(row0 + r, n_out - 1) * row_bytes;
			const uint8_t *q = rw + 34 * bi + 2 + 8 * j;
			const uint32_t *a = (const uint32_t *)(q - mis);
			const uint32_t w0 = __ldg(a), w1 = __ldg(a + 1);
			/* at 2 mod 4 the last two bytes are the half word at q + 6 */
			const uint32_t w2 = mis ? (uint32_t)__ldg((const unsigned short *)(q + 6)) : 0u;
			q0[r] = __funnelshift_r(w0, w1, 8u * (uint32_t)mis) ^ 0x80808080u;
			q1[r] = __funnelshift_r(w1, w2, 8u * (uint32_t)mis) ^ 0x80808080u;
			d[r] = __half2float(__ldg((const __half *)(rw + 34 * bi)));
		}
	}
	float xv[NT][8];
#pragma unroll
	for (int t = 0; t < NT; t++) {
		if (act && t < n_tok) { /* plain loads: x is written by the kernel before */
			const float4 *p = (const float4 *)(x + t * ldx + 8 * lane);
			const float4 a = p[0], b = p[1];
			xv[t][0] = a.x, xv[t][1] = a.y, xv[t][2] = a.z, xv[t][3] = a.w;
			xv[t][4] = b.x, xv[t][5] = b.y, xv[t][6] = b.z, xv[t][7] = b.w;
		} else {
#pragma unroll
			for (int k = 0; k < 8; k++)
				xv[t][k] = 0.0f;
		}
	}
#pragma unroll
	for (int r = 0; r < RT; r++) {
		float v[8];
#pragma unroll
		for (int k = 0; k < 4; k++) {
			v[k] = kq8w_s8f(q0[r], k);
			v[4 + k] = kq8w_s8f(q1[r], k);
		}
#pragma unroll
		for (int t = 0; t < NT; t++) {
			float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
			for (int k = 0; k < 8; k += 2) {
				s0 = fmaf(v[k], xv[t][k], s0);
				s1 = fmaf(v[k + 1], xv[t][k + 1], s1);
			}
			/* inactive lanes: x is 0, the sum is 0 */
			const float s = kc_warp_sum(d[r] * (s0 + s1));
			if (lane == 0 && t < n_tok && row0 + r < n_out)
				y[t * ldy + row0 + r] = s;
		}
	}
}

#endif
