/* The pieces the tensor-core MLA kernels share (mla_attn_mma.cu: split kernel; mla_attn_dec.cu:
 * one-launch kernel): the bf16 mma and ldmatrix wrappers, the fp32 -> bf16 hi + lo split that keeps
 * their products at fp32-level accuracy, and the block-wide online softmax of one key tile with its
 * P fragments (the split and one-launch kernels' tile body was the same code twice). Internal to
 * kernels/cuda. */
#ifndef TANDEM_KERNELS_CUDA_MLA_ATTN_TILE_CUH
#define TANDEM_KERNELS_CUDA_MLA_ATTN_TILE_CUH

#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

/* d += a b: m16n8k16, bf16 in, fp32 accumulate (sm_80 and later) */
__device__ __forceinline__ void katt_mma(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
	             "{%8,%9}, {%0,%1,%2,%3};\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* four 8x8 b16 matrices from shared memory; lane l gives the address of row l % 8 of matrix l / 8 */
__device__ __forceinline__ void katt_ldm4(uint32_t *r, const void *p)
{
	const unsigned s = (unsigned)__cvta_generic_to_shared(p);
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
	             : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
	             : "r"(s)
	             : "memory");
}
/* the same, each matrix transposed (lane (g, t) gets rows 2t, 2t + 1 of column g) */
__device__ __forceinline__ void katt_ldm4t(uint32_t *r, const void *p)
{
	const unsigned s = (unsigned)__cvta_generic_to_shared(p);
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
	             : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
	             : "r"(s)
	             : "memory");
}
/* B fragments (k: 16 dims from col; n: 8 keys) of two n-tiles, keys row .. row + 7 then row + 8 ..
 * row + 15, from a [key][dim] bf16 tile of row stride RS by one ldmatrix.x4: b[0], b[1] the first n-tile,
 * b[2], b[3] the second (16-byte rows: RS 4 mod 32 words is conflict-free) */
__device__ __forceinline__ void katt_ldm_keys2(uint32_t *b, const uint16_t *t, int RS, int row, int col,
                                               int lane)
{
	katt_ldm4(b, t + (row + (lane >> 4) * 8 + (lane & 7)) * RS + col + ((lane >> 3) & 1) * 8);
}
/* P V over one 16-key step for two n-tiles of 8 channels from one ldmatrix.x4.trans: vb is this lane's
 * row address (keys 0-7 / 8-15 x channels c, then c + 8); o0 += ah (+ al with LO) x the first pair, o1
 * the same with the second when `second` (an odd last n-tile leaves it unused) */
template <bool LO>
__device__ __forceinline__ void katt_pv_ldm2(float *o0, float *o1, const uint32_t *ah, const uint32_t *al,
                                             const void *vb, bool second)
{
	uint32_t b[4];
	katt_ldm4t(b, vb);
	katt_mma(o0, ah, b[0], b[1]);
	if (LO)
		katt_mma(o0, al, b[0], b[1]);
	if (second) {
		katt_mma(o1, ah, b[2], b[3]);
		if (LO)
			katt_mma(o1, al, b[2], b[3]);
	}
}
/* x, y (x at the lower half) -> bf16x2 hi part and the bf16x2 of the remainders */
__device__ __forceinline__ void katt_split2(float x, float y, uint32_t *hi, uint32_t *lo)
{
	const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
	const float2 hf = __bfloat1622float2(h);
	const __nv_bfloat162 l = __floats2bfloat162_rn(x - hf.x, y - hf.y);
	*hi = *(const uint32_t *)&h;
	*lo = *(const uint32_t *)&l;
}
__device__ __forceinline__ void katt_split1(float x, uint16_t *hi, uint16_t *lo)
{
	const __nv_bfloat16 h = __float2bfloat16_rn(x);
	const __nv_bfloat16 l = __float2bfloat16_rn(x - __bfloat162float(h));
	*hi = *(const uint16_t *)&h;
	*lo = *(const uint16_t *)&l;
}

/* Online softmax of one tile of TK keys for a block whose WARPS warps each hold a partial score
 * tile (their share of the dim steps) in sred[w][HG][TK]: TPH threads (8 or 16, lanes of one warp) per
 * head row sh, KPT = TK / TPH keys each from sk; a key whose row address is NULL (invalid, or past the
 * end) scores -inf. The running max / sum (kept by all TPH threads of the row) are updated, p of the
 * tile is written as bf16 hi / lo rows of stride PS (hi to phi, lo to plo: mla_attn_mma.cu's stacked
 * kernel passes plo = phi + 8 rows), and the rescale factor of the row to corr_s[sh] (one thread). */
template <int TK, int WARPS, int HG, int TPH = 8>
__device__ __forceinline__ void katt_tile_softmax(const float *sred, const uint8_t *const *addr, float scale,
                                                  int sh, int sk, bool writer, float *m_run, float *l_run,
                                                  uint16_t *phi, uint16_t *plo, int PS, float *corr_s)
{
	static_assert(TPH == 8 || TPH == 16, "8 or 16 threads a head row");
	constexpr int KPT = TK / TPH;
	float s[KPT], mt = -INFINITY;
#pragma unroll
	for (int u = 0; u < KPT; u++) {
		float d = 0.0f;
#pragma unroll
		for (int w = 0; w < WARPS; w++)
			d += sred[(w * HG + sh) * TK + sk + u];
		s[u] = addr[sk + u] ? d * scale : -INFINITY;
		mt = fmaxf(mt, s[u]);
	}
#pragma unroll
	for (int o = 1; o < TPH; o <<= 1)
		mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, o));
	const float mn = fmaxf(*m_run, mt);
	const float corr = mn == -INFINITY ? 1.0f : expf(*m_run - mn);
	float ps = 0.0f;
#pragma unroll
	for (int u = 0; u < KPT; u++) {
		const float p = mn == -INFINITY ? 0.0f : expf(s[u] - mn);
		ps += p;
		katt_split1(p, &phi[sh * PS + sk + u], &plo[sh * PS + sk + u]);
	}
#pragma unroll
	for (int o = 1; o < TPH; o <<= 1)
		ps += __shfl_xor_sync(0xffffffffu, ps, o);
	*l_run = *l_run * corr + ps;
	*m_run = mn;
	if (writer)
		corr_s[sh] = corr;
}

/* the A fragments (hi, lo) of P's k-step kk (16 keys) for the PV product, rows g and g + 8 */
__device__ __forceinline__ void katt_p_frags(const uint16_t *phi, const uint16_t *plo, int PS, int g, int t,
                                             int kk, uint32_t *ah, uint32_t *al)
{
	const int pc = kk * 16 + 2 * t;
	ah[0] = *(const uint32_t *)(phi + g * PS + pc);
	ah[1] = *(const uint32_t *)(phi + (g + 8) * PS + pc);
	ah[2] = *(const uint32_t *)(phi + g * PS + pc + 8);
	ah[3] = *(const uint32_t *)(phi + (g + 8) * PS + pc + 8);
	al[0] = *(const uint32_t *)(plo + g * PS + pc);
	al[1] = *(const uint32_t *)(plo + (g + 8) * PS + pc);
	al[2] = *(const uint32_t *)(plo + g * PS + pc + 8);
	al[3] = *(const uint32_t *)(plo + (g + 8) * PS + pc + 8);
}

#endif
