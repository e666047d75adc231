/* Tensor-core product for decode batches (n_tok 9..256 in kcuda_matmul; the per-head k_b / v_b
 * products of head_gemv.cu for n_tok >= 2): Y[t][r] = dot(W_h row r, X_h[t]) for H stacked
 * matrices (H = 1 for kcuda_matmul), reading each weight tile once for up to 64 tokens instead of
 * dequantizing the whole matrix to bf16 and calling cuBLAS (two launches and 4 bytes of traffic
 * per weight) or re-reading it once per token.
 *
 * Exactness: a 16-element piece of a quantized row is w_j = a v_j + b with v_j exact small values
 * (quant_piece.cuh: 1 + q / 2^(7-bits), int8, or a codebook's int8), all exact in fp16. So the
 * tensor core multiplies the exact v (A operand) with x split into fp16 hi = fp16(x) and
 * lo = fp16(2048 (x - hi)) (B operands, 22 bits of x: the trick of gemv_mma.cuh), one mma per
 * piece and 8 tokens, and the fp32 epilogue of each piece adds a (D_hi + D_lo / 2048) + b sum(x):
 * the same decomposition as the fp32 GEMV of matmul_gemv.cu, so it is held to the GEMV tolerance.
 * Float weight types (not exact in fp16) do not come here. fp16 range: a piece (16 elements of one
 * token) whose fp16(x) reaches 2^15 (|x| >= 65504 gave inf) is staged times a power of two that
 * brings it below 2^15, and the piece's (D_hi + D_lo / 2048) is multiplied back in the epilogue;
 * found by a warp vote on the packed halves' exponent bits (gemv_mma.cuh's gm_big_bits), and the
 * block takes the epilogue with the factors only in chunks where some thread saw such a piece
 * (__syncthreads_or), so below 2^15 the arithmetic and the bits are the same as before.
 *
 * Grid: x = 64-token tiles, y = 64-row tiles, z = H x S (head, K split). A block (4 warps) owns
 * 64 rows x 64 tokens of one head: per 64-element K chunk all 128 threads decode 2 pieces of W
 * (v to shared memory as fp16, a and b per row and piece) and convert 64 tokens x 64 k of X (hi,
 * lo and the per-piece sums); warp w then multiplies rows 16w..16w+15 by every active 8-token
 * n-tile (4 pieces x 2 mma each). The next chunk's global loads are issued before the mma of the
 * current one; the first chunk's weights before the PDL wait (TANDEM_TILE_WEARLY=0: after it). Q8_0
 * pieces go to fp16 by byte permutes (mt_q8_halves; TANDEM_TILE_Q8H=0: through float). Token tiles
 * are the fastest grid dimension, so the blocks that share a weight tile run together and read it from L2
 * after the first. S > 1 (when the tiles alone leave SMs idle; kcuda_matmul and, since 2026-12-03,
 * kfwd_head_gemv) writes per-split partial sums to the context workspace; a second kernel adds them in split
 * order (deterministic). Shared-memory rows are 80 halves (64 + 16) so the 8-byte fragment loads of a
 * half-warp hit 32 distinct banks. Needs n_in % 16 == 0; rows past n_out are clamped for loads and not
 * stored, tokens past n_tok are zero and not stored. Registers (sm_90, CUDA 13.0): 116-167 by type, 0 spills;
 * launch bounds allow 3 blocks per SM (without them ptxas capped at 128 and spilled 8 bytes in Q4_K). */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/matmul_impl.cuh"
#include "kernels/cuda/quant_piece.cuh"

#define MT_BM 64 /* rows per block: 4 warps x 16 */
#define MT_BN 64 /* tokens per block: 8 n-tiles of 8 */
#define MT_KC 64 /* K per chunk: 4 pieces */
#define MT_LD 80 /* halves per shared row (64 + 16 padding, see above) */
#define MT_THREADS 128
#define MT_MAX_SPLIT 64 /* the most K splits (mt_split_max) */

struct mt_smem {
	__half v[MT_BM][MT_LD]; /* weight values v, exact in fp16 */
	__half xh[MT_BN][MT_LD]; /* fp16(x) */
	__half xl[MT_BN][MT_LD]; /* fp16(2048 (x - hi)) */
	float2 ab[MT_KC / 16][MT_BM]; /* w = a v + b, per piece and row */
	float sx[MT_KC / 16][MT_BN]; /* sum of x over the piece, per piece and token */
	float xf[MT_KC / 16][MT_BN]; /* the factor undoing the piece's staging scale (1 nearly always) */
};

/* D = A * B (m16n8k16, fp16 in, fp32 out, zero C) */
__device__ __forceinline__ void mt_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                       uint32_t b0, uint32_t b1)
{
	asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
	    "{%10,%10,%10,%10};"
	    : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
	    : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f));
}

__device__ __forceinline__ uint32_t mt_h2(float lo, float hi)
{
	const __half2 h = __floats2half2_rn(lo, hi);
	return *(const uint32_t *)&h;
}

/* bit 15 of a half set where that half's |value| field is >= 0x7800 (fp16 >= 2^15, inf, NaN) */
__device__ __forceinline__ uint32_t mt_big_bits(uint32_t h)
{
	return (h & 0x7fff7fffu) + 0x08000800u;
}
/* a power of two that brings m (>= 2^15, finite) below 2^15, else 1 (gemv_mma.cuh's gm_xscale) */
__device__ __forceinline__ float mt_xscale(float m)
{
	if (!(m >= 32768.f) || !(m <= 3.4e38f))
		return 1.f;
	int e;
	(void)frexpf(m, &e);
	return ldexpf(1.f, 15 - e);
}

/* Q8_0: 16 int8 values (4 words, byte 0 first) as 8 fp16 pairs without a float in between: the byte with
 * its sign bit flipped is u = q + 128, the half with bits 0x6400 | u is 1024 + u, and 1024 + u - 1152 = q,
 * all exact in fp16, so the halves are the ones mt_h2((float)q, ...) gives (5 instructions per 4 values
 * instead of ~12). The same trick as gemv_mma.cuh's Q8_0 unit (gm_perm + gm_hadd2), with pairs (0, 1),
 * (2, 3) where that unit pairs (0, 2), (1, 3); not shared because gemv_mma.cuh's helpers carry its host
 * emulator and the header its kernels. */
__device__ __forceinline__ void mt_q8_halves(const uint32_t (&w)[4], uint32_t (&h)[8])
{
	const __half2 off = __float2half2_rn(1152.f);
#pragma unroll
	for (int i = 0; i < 4; i++) {
		const uint32_t u = w[i] ^ 0x80808080u;
		const uint32_t lo = __byte_perm(u, 0x64646464u, 0x4140),
		               hi = __byte_perm(u, 0x64646464u, 0x4342);
		const __half2 a = __hsub2(*(const __half2 *)&lo, off),
		              b = __hsub2(*(const __half2 *)&hi, off);
		h[2 * i] = *(const uint32_t *)&a;
		h[2 * i + 1] = *(const uint32_t *)&b;
	}
}

/* One thread's 4 elements of x (4 lanes 4m..4m+3 hold one 16-element piece of one token; all 32 lanes
 * call it): fp16 hi and lo of x (times the piece's staging scale where fp16(x) would reach 2^15), the
 * piece's sum of the unscaled x and the factor that undoes the scale. big: this piece was scaled. */
__device__ __forceinline__ void mt_convert(float4 f, uint2 &hi, uint2 &lo, float &ps, float &xf, bool &big)
{
	__half h0 = __float2half_rn(f.x), h1 = __float2half_rn(f.y), h2 = __float2half_rn(f.z),
	       h3 = __float2half_rn(f.w);
	hi = make_uint2(mt_h2(__half2float(h0), __half2float(h1)), mt_h2(__half2float(h2), __half2float(h3)));
	ps = (f.x + f.y) + (f.z + f.w);
	ps += __shfl_xor_sync(0xffffffffu, ps, 1);
	ps += __shfl_xor_sync(0xffffffffu, ps, 2);
	xf = 1.f;
	if (__any_sync(0xffffffffu, ((mt_big_bits(hi.x) | mt_big_bits(hi.y)) & 0x80008000u) != 0u)) {
		/* rare: the piece's largest |x| over its 4 lanes picks a power of two */
		float m = fmaxf(fmaxf(fabsf(f.x), fabsf(f.y)), fmaxf(fabsf(f.z), fabsf(f.w)));
		m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
		m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
		const float sc = mt_xscale(m);
		if (sc != 1.f) {
			f.x *= sc, f.y *= sc, f.z *= sc, f.w *= sc; /* exact */
			h0 = __float2half_rn(f.x), h1 = __float2half_rn(f.y);
			h2 = __float2half_rn(f.z), h3 = __float2half_rn(f.w);
			hi = make_uint2(mt_h2(__half2float(h0), __half2float(h1)),
			                mt_h2(__half2float(h2), __half2float(h3)));
			xf = 1.f / sc;
			big = true;
		}
	}
	lo = make_uint2(mt_h2((f.x - __half2float(h0)) * 2048.f, (f.y - __half2float(h1)) * 2048.f),
	                mt_h2((f.z - __half2float(h2)) * 2048.f, (f.w - __half2float(h3)) * 2048.f));
}

/* Trace mode (bench_cuda_mm tiletrace): NULL in every other use. Set by kcuda_mm_tile_trace before a
 * launch (a device variable the kernels only read, like a weight), it makes thread 0 of each block write
 * clock64() at its phases into MT_TR_SLOTS words (kernels.h) at blockIdx (x fastest): 0 entry, 1 after
 * KDEP_ENTRY, then for each of the first MT_TR_CH chunks its stage done, first barrier passed, mma done,
 * second barrier passed, then the exit and the chunk count. Block-relative cycles (one SM's counter). */
__device__ unsigned long long *mt_trace_buf;

template <int T>
__global__ void __launch_bounds__(MT_THREADS, 3)
    mm_tile_kernel(const uint8_t *__restrict__ w, size_t mat_bytes, size_t row_bytes, int64_t n_out,
                   int64_t n_in, int S, int64_t cps, const float *__restrict__ x, int64_t ldx, int64_t xhs,
                   int n_tok, float *__restrict__ y, int64_t ldy, int64_t yhs, float *__restrict__ part,
                   int xvec, int wearly, int q8h)
{
	unsigned long long *tr = NULL;
	if (threadIdx.x == 0 && mt_trace_buf) {
		tr = mt_trace_buf +
		     (((size_t)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) * MT_TR_SLOTS;
		tr[0] = clock64();
	}
	__shared__ __align__(16) mt_smem sm;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
	const int tok0 = (int)blockIdx.x * MT_BN;
	const int64_t row0 = (int64_t)blockIdx.y * MT_BM;
	const int H = (int)(gridDim.z / (unsigned)S), h = (int)(blockIdx.z / (unsigned)S),
	          s = (int)(blockIdx.z % (unsigned)S);
	const int64_t n_pc = n_in / 16, n_ch = (n_pc + 3) / 4;
	const int64_t c_begin = (int64_t)s * cps, c_end = min(c_begin + cps, n_ch);
	w += (size_t)h * mat_bytes;
	x += (int64_t)h * xhs;

	/* loader roles: W pieces (row tid/4 and tid/4 + 32, piece tid % 4 of the chunk); X: entry
	 * tid + 128 j is token (tid + 128 j) / 16, elements 4 ((tid + 128 j) % 16) .. + 3 */
	const int wr = tid >> 2, wpc = tid & 3;
	const uint8_t *wrow[2];
#pragma unroll
	for (int j = 0; j < 2; j++)
		wrow[j] = w + (size_t)min(row0 + wr + 32 * j, n_out - 1) * row_bytes;
	typename kq<T>::raw rw[2];
	float4 xr[8];
	/* active 8-token tiles. X entry j of a thread is token 8 j + tid / 16, i.e. in n-tile j, so
	 * entries j >= n_nt are neither loaded nor staged (a warp-uniform test); their stale shared
	 * columns only reach D columns that are never stored (an mma column depends on its B column
	 * alone) */
	const int n_nt = min(MT_BN / 8, (n_tok - tok0 + 7) / 8);

	auto loadw = [&](int64_t ch) {
		const int64_t p = 4 * ch + wpc;
		if (p < n_pc) {
			kq<T>::load(wrow[0], p, rw[0]);
			kq<T>::load(wrow[1], p, rw[1]);
		}
	};
	auto loadx = [&](int64_t ch) {
#pragma unroll
		for (int j = 0; j < 8; j++) {
			if (j >= n_nt)
				break;
			const int e = tid + MT_THREADS * j, tok = tok0 + (e >> 4);
			const int64_t k = MT_KC * ch + 4 * (e & 15);
			xr[j] = make_float4(0.f, 0.f, 0.f, 0.f);
			if (tok < n_tok && k < n_in) {
				const float *src = x + (int64_t)tok * ldx + k;
				if (xvec)
					xr[j] = __ldg((const float4 *)src);
				else
					xr[j] = make_float4(__ldg(src), __ldg(src + 1), __ldg(src + 2),
					                    __ldg(src + 3));
			}
		}
	};
	bool chunk_big = false; /* this thread staged a scaled piece in the current chunk */
	auto store = [&](int64_t ch) {
		const int64_t p = 4 * ch + wpc;
#pragma unroll
		for (int j = 0; j < 2; j++) {
			float a = 0.f, b = 0.f;
			uint4 q0, q1;
			if constexpr (T == KT_Q8_0) {
				uint32_t h[8] = {0, 0, 0, 0, 0, 0, 0, 0};
				if (p < n_pc && q8h) {
					mt_q8_halves(rw[j].w, h);
					a = kc_h2f(rw[j].d);
				} else if (p < n_pc) {
					float v[16];
					kq<T>::decode(rw[j], p, v, a, b);
#pragma unroll
					for (int i = 0; i < 8; i++)
						h[i] = mt_h2(v[2 * i], v[2 * i + 1]);
				}
				q0 = make_uint4(h[0], h[1], h[2], h[3]);
				q1 = make_uint4(h[4], h[5], h[6], h[7]);
			} else {
				float v[16];
				if (p < n_pc) {
					kq<T>::decode(rw[j], p, v, a, b);
				} else {
#pragma unroll
					for (int i = 0; i < 16; i++)
						v[i] = 0.f;
				}
				q0 = make_uint4(mt_h2(v[0], v[1]), mt_h2(v[2], v[3]), mt_h2(v[4], v[5]),
				                mt_h2(v[6], v[7]));
				q1 = make_uint4(mt_h2(v[8], v[9]), mt_h2(v[10], v[11]), mt_h2(v[12], v[13]),
				                mt_h2(v[14], v[15]));
			}
			*(uint4 *)&sm.v[wr + 32 * j][16 * wpc] = q0;
			*(uint4 *)&sm.v[wr + 32 * j][16 * wpc + 8] = q1;
			sm.ab[wpc][wr + 32 * j] = make_float2(a, b);
		}
#pragma unroll
		for (int j = 0; j < 8; j++) {
			if (j >= n_nt)
				break;
			const int e = tid + MT_THREADS * j, tk = e >> 4, k4 = 4 * (e & 15);
			uint2 hi, lo;
			float ps, xf;
			mt_convert(xr[j], hi, lo, ps, xf, chunk_big);
			*(uint2 *)&sm.xh[tk][k4] = hi;
			*(uint2 *)&sm.xl[tk][k4] = lo;
			if ((e & 3) == 0) {
				sm.sx[(e & 15) >> 2][tk] = ps; /* of the unscaled x (the b term) */
				sm.xf[(e & 15) >> 2][tk] = xf;
			}
		}
	};

	const int r_lo = 16 * warp + g;
	float acc[MT_BN / 8][4];
#pragma unroll
	for (int nt = 0; nt < MT_BN / 8; nt++)
#pragma unroll
		for (int i = 0; i < 4; i++)
			acc[nt][i] = 0.f;

	/* the first chunk's weights before the wait (weights are the one input no earlier kernel writes:
	 * cuda_common.cuh), so under PDL their latency overlaps the kernel before; wearly 0: after it */
	if (wearly && c_begin < c_end)
		loadw(c_begin);
	KDEP_ENTRY();
	if (tr)
		tr[1] = clock64();
	if (c_begin < c_end) {
		if (!wearly)
			loadw(c_begin);
		loadx(c_begin);
	}
	for (int64_t ch = c_begin; ch < c_end; ch++) {
		const int64_t ti = ch - c_begin;
		unsigned long long *tc = tr && ti < MT_TR_CH ? tr + 2 + 4 * ti : NULL;
		chunk_big = false;
		store(ch);
		if (tc)
			tc[0] = clock64();
		const int blk_big = __syncthreads_or(chunk_big); /* the barrier the chunk needs anyway */
		if (tc)
			tc[1] = clock64();
		if (ch + 1 < c_end) {
			loadw(ch + 1);
			loadx(ch + 1);
		}
		/* k order inside an mma: lane t's k = 2t, 2t+1, 2t+8, 2t+9 are elements 4t .. 4t+3 of
		 * the piece, in A and B alike, so each fragment pair is one 8-byte load */
#pragma unroll
		for (int ks = 0; ks < MT_KC / 16; ks++) {
			const uint2 A0 = *(const uint2 *)&sm.v[r_lo][16 * ks + 4 * t];
			const uint2 A1 = *(const uint2 *)&sm.v[r_lo + 8][16 * ks + 4 * t];
			const float2 ab0 = sm.ab[ks][r_lo], ab1 = sm.ab[ks][r_lo + 8];
#pragma unroll
			for (int nt = 0; nt < MT_BN / 8; nt++) {
				if (nt >= n_nt)
					break;
				const int col = 8 * nt + g;
				const uint2 Bh = *(const uint2 *)&sm.xh[col][16 * ks + 4 * t];
				const uint2 Bl = *(const uint2 *)&sm.xl[col][16 * ks + 4 * t];
				float dh[4], dl[4];
				mt_mma(dh, A0.x, A1.x, A0.y, A1.y, Bh.x, Bh.y);
				mt_mma(dl, A0.x, A1.x, A0.y, A1.y, Bl.x, Bl.y);
				/* d0 (row g, tok 2t), d1 (row g, tok 2t+1), d2, d3 (row g+8, same) */
				if constexpr (kq<T>::HAS_B) {
					const float2 sx = *(const float2 *)&sm.sx[ks][8 * nt + 2 * t];
					acc[nt][0] = fmaf(ab0.y, sx.x, acc[nt][0]);
					acc[nt][1] = fmaf(ab0.y, sx.y, acc[nt][1]);
					acc[nt][2] = fmaf(ab1.y, sx.x, acc[nt][2]);
					acc[nt][3] = fmaf(ab1.y, sx.y, acc[nt][3]);
				}
				if (!blk_big) {
					acc[nt][0] =
					    fmaf(ab0.x, fmaf(dl[0], 1.f / 2048.f, dh[0]), acc[nt][0]);
					acc[nt][1] =
					    fmaf(ab0.x, fmaf(dl[1], 1.f / 2048.f, dh[1]), acc[nt][1]);
					acc[nt][2] =
					    fmaf(ab1.x, fmaf(dl[2], 1.f / 2048.f, dh[2]), acc[nt][2]);
					acc[nt][3] =
					    fmaf(ab1.x, fmaf(dl[3], 1.f / 2048.f, dh[3]), acc[nt][3]);
				} else { /* some piece of the chunk was staged scaled: the factors per token
					  */
					const float2 xf = *(const float2 *)&sm.xf[ks][8 * nt + 2 * t];
					acc[nt][0] =
					    fmaf(ab0.x * xf.x, fmaf(dl[0], 1.f / 2048.f, dh[0]), acc[nt][0]);
					acc[nt][1] =
					    fmaf(ab0.x * xf.y, fmaf(dl[1], 1.f / 2048.f, dh[1]), acc[nt][1]);
					acc[nt][2] =
					    fmaf(ab1.x * xf.x, fmaf(dl[2], 1.f / 2048.f, dh[2]), acc[nt][2]);
					acc[nt][3] =
					    fmaf(ab1.x * xf.y, fmaf(dl[3], 1.f / 2048.f, dh[3]), acc[nt][3]);
				}
			}
		}
		if (tc)
			tc[2] = clock64();
		__syncthreads();
		if (tc)
			tc[3] = clock64();
	}
	if (tr) {
		tr[2 + 4 * MT_TR_CH] = clock64();
		tr[3 + 4 * MT_TR_CH] = (unsigned long long)(c_end > c_begin ? c_end - c_begin : 0);
	}

#pragma unroll
	for (int nt = 0; nt < MT_BN / 8; nt++) {
		if (nt >= n_nt)
			break;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			const int tok = tok0 + 8 * nt + 2 * t + (i & 1);
			const int64_t row = row0 + r_lo + 8 * (i >> 1);
			if (tok >= n_tok || row >= n_out)
				continue;
			if (part)
				part[((size_t)(s * H + h) * (size_t)n_tok + (size_t)tok) * (size_t)n_out +
				     (size_t)row] = acc[nt][i];
			else
				y[(int64_t)tok * ldy + (int64_t)h * yhs + row] = acc[nt][i];
		}
	}
}

/* y[tok][h yhs + row] = sum over s of part[s][h][tok][row], s in order */
__global__ void mm_tile_reduce(const float *__restrict__ part, int S, int H, int n_tok, int64_t n_out,
                               float *__restrict__ y, int64_t ldy, int64_t yhs)
{
	KDEP_ENTRY();
	const int64_t n = (int64_t)H * n_tok * n_out;
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		const int64_t row = i % n_out, ht = i / n_out;
		const int tok = (int)(ht % n_tok), h = (int)(ht / n_tok);
		float acc = 0.f;
		for (int s = 0; s < S; s++)
			acc += part[(int64_t)s * n + i];
		y[(int64_t)tok * ldy + (int64_t)h * yhs + row] = acc;
	}
}

extern "C" bool kcuda_mm_tile_ok(int type, int64_t n_in)
{
	switch (type) {
	case KT_Q8_0:
	case KT_Q4_0:
	case KT_Q4_1:
	case KT_Q5_0:
	case KT_Q5_1:
	case KT_IQ4_NL:
	case KT_Q2_K:
	case KT_Q3_K:
	case KT_Q4_K:
	case KT_Q5_K:
	case KT_Q6_K:
	case KT_IQ4_XS:
	case KT_IQ2_XXS: /* codebook values (with IQ1's +-1/8) are exact in fp16 */
	case KT_IQ2_XS:
	case KT_IQ2_S:
	case KT_IQ3_XXS:
	case KT_IQ3_S:
	case KT_IQ1_S:
	case KT_IQ1_M: return n_in > 0 && n_in % 16 == 0;
	default: return false; /* float weights are not exact in fp16 */
	}
}

/* TANDEM_TILE_WEARLY (read once): 1 (default) the first chunk's weights are loaded before the PDL wait */
static int mt_wearly(void)
{
	static int v = -1;
	if (v < 0)
		v = (int)kcuda_env_long("TANDEM_TILE_WEARLY", 0, 1, 1);
	return v;
}

/* TANDEM_TILE_Q8H (read on every launch, so a test can compare both): 1 (default) Q8_0 weights go to fp16
 * by byte permutes (mt_q8_halves), 0 through float; the same halves either way */
static int mt_q8h_on(void)
{
	const char *e = getenv("TANDEM_TILE_Q8H");
	return !(e && strcmp(e, "0") == 0);
}

template <int T>
static int mt_launch(struct kcuda_ctx *c, dim3 grid, const struct kweight *w0, size_t mat_bytes, int S,
                     int64_t cps, const float *x, int64_t ldx, int64_t xhs, int n_tok, float *y, int64_t ldy,
                     int64_t yhs, float *part, int xvec)
{
	return klaunch("mm_tile", mm_tile_kernel<T>, grid, dim3(MT_THREADS), 0, c->stream,
	               (const uint8_t *)w0->data, mat_bytes, w0->row_bytes, w0->n_out, w0->n_in, S, cps, x,
	               ldx, xhs, n_tok, y, ldy, yhs, part, xvec, mt_wearly(), mt_q8h_on());
}

/* trace mode (bench_cuda_mm tiletrace): buf of MT_TR_SLOTS words a block, or NULL (off) */
extern "C" int kcuda_mm_tile_trace(unsigned long long *buf)
{
	if (cudaMemcpyToSymbol(mt_trace_buf, &buf, sizeof(buf)) != cudaSuccess)
		return kcuda_launch_status("mm_tile trace");
	return 0;
}

/* the fewest K chunks (64 elements) a split keeps: TANDEM_TILE_SPLIT_CH (read once), default 2. A block
 * walks its chunks one after another with one chunk's loads ahead, ~1.5-2 us a chunk (H200), so
 * the narrow products are bound by that chain: GLM-5's idx_k (6144 -> 128) at 32 tokens was 2 row
 * tiles x 4 splits of 24 chunks, 43 us a call. 8 was the rule before 2026-12-03 (docs/PERFORMANCE.md,
 * session 19), 4 until session 21 (with at most 16 splits; 2 and 32 measured 2-5% faster steps at
 * batch 16-128). */
#define MT_SPLIT_CH_DEFAULT 2
static int64_t mt_split_chunks(void)
{
	static int64_t v = 0;
	if (!v)
		v = kcuda_env_long("TANDEM_TILE_SPLIT_CH", 1, 1024, MT_SPLIT_CH_DEFAULT);
	return v;
}

/* the most K splits: TANDEM_TILE_SPLIT_MAX (read once; 2..MT_MAX_SPLIT), default 32 */
#define MT_SPLIT_MAX_DEFAULT 32
static int mt_split_max(void)
{
	static int v = 0;
	if (!v)
		v = (int)kcuda_env_long("TANDEM_TILE_SPLIT_MAX", 2, MT_MAX_SPLIT, MT_SPLIT_MAX_DEFAULT);
	return v;
}

int kcuda_mm_tile_launch(struct kcuda_ctx *c, const struct kweight *w0, size_t mat_bytes, int H,
                         const float *x, int64_t ldx, int64_t xhs, int n_tok, float *y, int64_t ldy,
                         int64_t yhs, bool may_split)
{
	if (!kcuda_mm_tile_ok(w0->type, w0->n_in) || H < 1 || n_tok < 1)
		return ERR_UNSUPPORTED;
	const int64_t ntt = (n_tok + MT_BN - 1) / MT_BN, nrt = (w0->n_out + MT_BM - 1) / MT_BM;
	const int64_t n_ch = (w0->n_in / 16 + 3) / 4, base = ntt * nrt * H;
	if (ntt > 65535 || nrt > 65535 || (int64_t)H * MT_MAX_SPLIT > 65535)
		return ERR_UNSUPPORTED;
	/* split K when the tiles alone give fewer than ~3 blocks per SM (3 fit by registers), keeping
	 * >= mt_split_chunks() chunks per split and the partial sums inside the workspace */
	int S = 1;
	const size_t one = (size_t)H * (size_t)n_tok * (size_t)w0->n_out * sizeof(float);
	const int64_t min_ch = mt_split_chunks();
	while (may_split && S < mt_split_max() && base * S < 3 * (int64_t)c->n_sm &&
	       n_ch >= 2 * min_ch * (int64_t)S && one * (size_t)(2 * S) <= c->ws_bytes)
		S *= 2;
	const int64_t cps = (n_ch + S - 1) / S;
	float *part = S > 1 ? (float *)c->ws : NULL;
	const int xvec = (uintptr_t)x % 16 == 0 && ldx % 4 == 0 && xhs % 4 == 0;
	const dim3 grid((unsigned)ntt, (unsigned)nrt, (unsigned)(H * S));
	int rc;
	switch (w0->type) {
		/* clang-format off */
#define X(T) \
	case T: \
		rc = mt_launch<T>(c, grid, w0, mat_bytes, S, cps, x, ldx, xhs, n_tok, y, ldy, yhs, part, xvec); \
		break;
		X(KT_Q8_0) X(KT_Q4_0) X(KT_Q4_1) X(KT_Q5_0) X(KT_Q5_1) X(KT_IQ4_NL)
		X(KT_Q2_K) X(KT_Q3_K) X(KT_Q4_K) X(KT_Q5_K) X(KT_Q6_K) X(KT_IQ4_XS)
		X(KT_IQ2_XXS) X(KT_IQ2_XS) X(KT_IQ2_S) X(KT_IQ3_XXS) X(KT_IQ3_S) X(KT_IQ1_S) X(KT_IQ1_M)
#undef X
	default:
		return ERR_UNSUPPORTED;
	}
	/* clang-format on */
	if (rc || S == 1)
		return rc;
	const int64_t n = (int64_t)H * n_tok * w0->n_out;
	const unsigned blocks = (unsigned)min((n + 255) / 256, (int64_t)4 * c->n_sm);
	return klaunch("mm_tile reduce", mm_tile_reduce, dim3(blocks), dim3(256), 0, c->stream, part, S, H,
	               n_tok, w0->n_out, y, ldy, yhs);
}
