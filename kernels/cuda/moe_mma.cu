/* The decode path of kcuda_moe_ffn on tensor cores (1..256 tokens, no host sync, so CUDA graphs
 * hold it): each expert's weight rows are read once per chunk of up to 8 of its tokens, and the
 * multiply-adds run as mma.sync m16n8k16 (fp16 in, fp32 accumulate) on quant values decoded in
 * registers: the technique of bench/gemv_mma.cuh (measured 1.3-4x faster than the fp32 GEMV on the
 * H200), whose unit bodies are repeated here with two changes: token columns are gathered through a
 * row-pointer table (the tokens routed to one expert are not contiguous), and each token's staged
 * 256-element slice is scaled by a power of two so its largest |x| lands in [2^14, 2^15) (fp16
 * range; SiLU(g) * u of a test model can pass 65504), undone exactly on the fp32 accumulator.
 *
 * Launches (all on the context's stream):
 *   sort (one block): pairs (token i, slot j) = i k + j counted per expert, listed per expert
 *     (list order inside an expert is free: every column of an mma is computed on its own), and cut
 *     into chunks (expert, first list entry, count <= CH) where CH = 4 NG tokens fit one n-tile
 *     pair (NG = 1 for <= 4 tokens, else 2); bad ids are counted in err_dev and skipped;
 *   gate_up, grid (F / 16, max chunks): a block of 4 warps owns rows f0..f0+15 of the chunk's
 *     expert in BOTH gate and up (the two row tiles of one warp, R = 2), its warps split D in
 *     256-element units and reduce through shared memory; h[pair][f] = SiLU(gate) * up is formed
 *     there, so gate and up never go through memory;
 *   down, grid (D / (64 R), max chunks): each warp owns 16 R rows of the expert's down matrix and
 *     all of F (per-rank F is short: 256 for GLM-5 / DS-V3 at TP=8), y[pair][d];
 *   combine: out[i] = sum_j w[i][j] y[i k + j] in slot order (deterministic, no atomics); a pair
 *     whose id was out of range gives NaN, as the other paths.
 * Blocks past the actual chunk count exit at once (the grid is sized for the worst case).
 *
 * Fragment layout and quant tricks: bench/gemv_mma.cuh's header (A = 16 rows x 16 k of the
 * weights as exact small integers in fp16, B = up to 4 tokens x (hi, lo) fp16 columns, hi + lo /
 * 2048 carries 22 bits of x). Assumes (moe_mma_fits): D % 256 == 0, F % 256 == 0, x 16-byte
 * aligned with ldx % 4 == 0, weights from kcuda_weight_upload (16-byte aligned, 16 bytes of tail
 * padding: the Q6_K / Q8_0 funnel loads read up to 4 bytes past a row). */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/moe_mma.h"
#include "kernels/cuda/prof.h"
#include "kernels/cuda/quant_piece.cuh"

#define MM_WARPS 4

/* ---- helpers ---------------------------------------------------------------------------------- */
__device__ __forceinline__ void mm_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                       uint32_t b0, uint32_t b1)
{
	asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
	    "{%0,%1,%2,%3};"
	    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	    : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ float mm_f16(uint32_t h) /* fp16 in the low 16 bits */
{
	return __half2float(__ushort_as_half((uint16_t)h));
}
__device__ __forceinline__ uint32_t mm_pack(float lo, float hi) /* half2 bits, round to nearest */
{
	const __half2 h = __floats2half2_rn(lo, hi);
	return *(const uint32_t *)&h;
}
__device__ __forceinline__ uint32_t mm_hfma2(uint32_t a, uint32_t b, uint32_t c)
{
	uint32_t d;
	asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
	return d;
}
__device__ __forceinline__ uint32_t mm_hadd2(uint32_t a, uint32_t b)
{
	uint32_t d;
	asm("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
	return d;
}
__device__ __forceinline__ uint32_t mm_h2(float v) /* (v, v), v exact in fp16 */
{
	return mm_pack(v, v);
}
/* 32-bit word at p. AM 1: p 4-byte aligned; 0: p = 2 mod 4 (two aligned loads, one funnel
 * shift); 2: either, found at run time (Q6_K rows of 210 bytes, where lanes differ) */
template <int AM> __device__ __forceinline__ uint32_t mm_ldw(const uint8_t *p)
{
	if (AM == 1)
		return __ldg((const uint32_t *)p);
	if (AM == 0) {
		const uint32_t *b = (const uint32_t *)(p - 2);
		return __funnelshift_r(__ldg(b), __ldg(b + 1), 16);
	}
	const uint32_t *b = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
	return __funnelshift_r(__ldg(b), __ldg(b + 1), ((uint32_t)(uintptr_t)p & 3u) * 8u);
}
__device__ __forceinline__ uint32_t mm_u16(const uint8_t *p)
{
	return *(const uint16_t *)p;
}

/* ---- X staging (gemv_mma.cuh's gm_stage_x, gathered and scaled) -------------------------------- */
template <int NG> struct mm_stage {
	uint2 b[NG][16][33]; /* [group][step][lane], 33: bank padding */
	float scl[4 * NG]; /* the token's power-of-two scale for this unit */
	float isc[4 * NG]; /* its inverse, applied to the accumulators */
};

/* Per-lane state: lane coordinates, staged X, accumulators acc[r][grp][i] in D layout (i = 0, 1:
 * row g hi / lo; 2, 3: row g + 8 hi / lo; token 4 grp + t) */
template <int R, int NG> struct mm_lane {
	int g, t, lane, n_tok;
	mm_stage<NG> *sm;
	const float *const *xr; /* shared: row of each token column */
	float acc[R][NG][4];
};

/* Unit u (elements 256 u .. 256 u + 255) of the n_tok tokens into B fragments: entry q (0..63) of
 * token tok is x[tok][4q .. 4q + 3]; K45: lane t owns 64 t + 4 s (q = 16 t + s), else 16 s + 4 t
 * (q = 4 s + t). First the token's max |x| over the unit picks the scale. */
template <bool K45, int NG>
__device__ __forceinline__ void mm_stage_x(mm_stage<NG> &sm, const float *const *xr, int n_tok, int64_t u,
                                           int lane)
{
	__syncwarp(); /* the previous unit's reads are done */
	const int nt = n_tok < 4 * NG ? n_tok : 4 * NG;
	for (int tok = 0; tok < nt; tok++) {
		const float4 *xp = (const float4 *)(xr[tok] + 256 * u);
		const float4 a = __ldg(xp + lane), b = __ldg(xp + 32 + lane);
		float m = fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(a.z), fabsf(a.w)));
		m = fmaxf(m, fmaxf(fmaxf(fabsf(b.x), fabsf(b.y)), fmaxf(fabsf(b.z), fabsf(b.w))));
		m = kc_warp_max(m);
		if (lane == 0) {
			float s = 1.0f, is = 1.0f;
			if (m > 0.0f && isfinite(m)) { /* inf / NaN stay unscaled */
				int e2 = 14 - ilogbf(m); /* m 2^e2 in [2^14, 2^15) */
				e2 = e2 > 120 ? 120 : e2;
				s = ldexpf(1.0f, e2);
				is = ldexpf(1.0f, -e2);
			}
			sm.scl[tok] = s;
			sm.isc[tok] = is;
		}
	}
	__syncwarp();
	const int n_ent = 64 * nt;
	for (int e = lane; e < n_ent; e += 32) {
		const int tok = e >> 6, q = e & 63;
		const int st = K45 ? (q & 15) : (q >> 2), t = K45 ? (q >> 4) : (q & 3);
		const float s = sm.scl[tok];
		float4 v = __ldg((const float4 *)(xr[tok] + 256 * u + 4 * q));
		v.x *= s, v.y *= s, v.z *= s, v.w *= s; /* powers of two: exact */
		const uint32_t h0 = mm_pack(v.x, v.z), h1 = mm_pack(v.y, v.w);
		/* x - hi is exact in fp32, so is the scaling by 2^11 */
		const uint32_t l0 = mm_pack((v.x - mm_f16(h0)) * 2048.f, (v.z - mm_f16(h0 >> 16)) * 2048.f);
		const uint32_t l1 = mm_pack((v.y - mm_f16(h1)) * 2048.f, (v.w - mm_f16(h1 >> 16)) * 2048.f);
		uint2 *row = sm.b[tok >> 2][st];
		const int g = 2 * (tok & 3);
		row[4 * g + t] = make_uint2(h0, h1);
		row[4 * (g + 1) + t] = make_uint2(l0, l1);
	}
	__syncwarp();
}

template <int R, int NG> __device__ __forceinline__ uint2 mm_b(const mm_lane<R, NG> &L, int k, int s)
{
	return L.sm->b[k][s][L.lane];
}
template <int R, int NG> __device__ __forceinline__ float mm_isc(const mm_lane<R, NG> &L, int k)
{
	return L.sm->isc[4 * k + L.t];
}

#define MM_FOR_ROWS(R)                                                                                       \
	_Pragma("unroll") for (int r = 0; r < R; r++) _Pragma("unroll") for (int hr = 0; hr < 2; hr++)

/* ---- Q4_K / Q5_K: one super-block per unit -------------------------------------------------- */
template <int T, int R, int NG>
__device__ __forceinline__ void mm_unit_k45(mm_lane<R, NG> &L, const uint8_t *const (&rows)[R][2], int64_t u)
{
	constexpr bool Q5 = T == KT_Q5_K;
	constexpr int BYTES = Q5 ? 176 : 144, QS = Q5 ? 48 : 16;
	uint4 hd[R][2], qa[R][2], qb[R][2], ha[R][2], hb[R][2];
	MM_FOR_ROWS(R)
	{
		const uint8_t *b = rows[r][hr] + (size_t)BYTES * u;
		hd[r][hr] = __ldg((const uint4 *)b);
		qa[r][hr] = __ldg((const uint4 *)(b + QS + 32 * L.t));
		qb[r][hr] = __ldg((const uint4 *)(b + QS + 32 * L.t + 16));
		if (Q5) {
			ha[r][hr] = __ldg((const uint4 *)(b + 16));
			hb[r][hr] = __ldg((const uint4 *)(b + 32));
		}
	}
	mm_stage_x<true, NG>(*L.sm, L.xr, L.n_tok, u, L.lane); /* while the weights load */
	/* sub-blocks 2t (low nibbles) and 2t+1 (high nibbles): A multipliers and the mins */
	uint32_t s_lo[R][2], n_lo[R][2], s_hi[R][2], n_hi[R][2], m_lo[R][2], m_hi[R][2];
	float dd[R][2], dm[R][2];
	MM_FOR_ROWS(R)
	{
		const uint4 h = hd[r][hr];
		int sc[2], mn[2];
#pragma unroll
		for (int e = 0; e < 2; e++) {
			const int q = 2 * (L.t & 1) + e;
			const uint32_t A = (h.y >> (8 * q)) & 255, B = (h.z >> (8 * q)) & 255,
			               C = (h.w >> (8 * q)) & 255;
			sc[e] = (int)(L.t < 2 ? (A & 63) : ((C & 15) | ((A >> 6) << 4)));
			mn[e] = (int)(L.t < 2 ? (B & 63) : ((C >> 4) | ((B >> 6) << 4)));
		}
		s_lo[r][hr] = mm_h2((float)sc[0]);
		n_lo[r][hr] = mm_h2(-1024.f * sc[0]); /* (1024 + q) sc - 1024 sc */
		s_hi[r][hr] = mm_h2(sc[1] / 16.f); /* (1024 + 16 q) sc / 16 - 64 sc */
		n_hi[r][hr] = mm_h2(-64.f * sc[1]);
		m_lo[r][hr] = mm_h2((float)mn[0]);
		m_hi[r][hr] = mm_h2((float)mn[1]);
		dd[r][hr] = mm_f16(h.x), dm[r][hr] = mm_f16(h.x >> 16);
	}
	float dq[R][NG][4], dn[R][NG][4];
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int k = 0; k < NG; k++)
#pragma unroll
			for (int i = 0; i < 4; i++)
				dq[r][k][i] = 0.f, dn[r][k][i] = 0.f;
#pragma unroll
	for (int i = 0; i < 8; i++) { /* word i of the chunk: step i (low nibbles), 8 + i (high) */
		uint32_t bl[NG][2], bh[NG][2];
#pragma unroll
		for (int k = 0; k < NG; k++) {
			const uint2 b0 = mm_b(L, k, i), b1 = mm_b(L, k, 8 + i);
			bl[k][0] = b0.x, bl[k][1] = b0.y, bh[k][0] = b1.x, bh[k][1] = b1.y;
		}
#pragma unroll
		for (int r = 0; r < R; r++) {
			uint32_t v[2][4]; /* [hr]: low 02, low 13, high 02, high 13 (1024 + q, 1024 + 16 q) */
#pragma unroll
			for (int hr = 0; hr < 2; hr++) {
				const uint4 q4 = i < 4 ? qa[r][hr] : qb[r][hr];
				const uint32_t w = (i & 3) == 0   ? q4.x
				                   : (i & 3) == 1 ? q4.y
				                   : (i & 3) == 2 ? q4.z
				                                  : q4.w;
				const uint32_t w8 = w >> 8;
				uint32_t l02 = (w & 0x000F000Fu) | 0x64006400u,
				         l13 = (w8 & 0x000F000Fu) | 0x64006400u;
				uint32_t h02 = (w & 0x00F000F0u) | 0x64006400u,
				         h13 = (w8 & 0x00F000F0u) | 0x64006400u;
				if (Q5) {
					const uint4 h4 = i < 4 ? ha[r][hr] : hb[r][hr];
					const uint32_t hw = (i & 3) == 0   ? h4.x
					                    : (i & 3) == 1 ? h4.y
					                    : (i & 3) == 2 ? h4.z
					                                   : h4.w;
					const uint32_t hs =
					    hw >> (2 * L.t); /* bit 0: low sub-block, bit 1: high */
					l02 |= (hs << 4) & 0x00100010u;
					l13 |= (hs >> 4) & 0x00100010u;
					h02 |= (hs << 7) & 0x01000100u;
					h13 |= (hs >> 1) & 0x01000100u;
				}
				v[hr][0] = mm_hfma2(l02, s_lo[r][hr], n_lo[r][hr]);
				v[hr][1] = mm_hfma2(l13, s_lo[r][hr], n_lo[r][hr]);
				v[hr][2] = mm_hfma2(h02, s_hi[r][hr], n_hi[r][hr]);
				v[hr][3] = mm_hfma2(h13, s_hi[r][hr], n_hi[r][hr]);
			}
#pragma unroll
			for (int k = 0; k < NG; k++) {
				mm_mma(dq[r][k], v[0][0], v[1][0], v[0][1], v[1][1], bl[k][0], bl[k][1]);
				mm_mma(dn[r][k], m_lo[r][0], m_lo[r][1], m_lo[r][0], m_lo[r][1], bl[k][0],
				       bl[k][1]);
				mm_mma(dq[r][k], v[0][2], v[1][2], v[0][3], v[1][3], bh[k][0], bh[k][1]);
				mm_mma(dn[r][k], m_hi[r][0], m_hi[r][1], m_hi[r][0], m_hi[r][1], bh[k][0],
				       bh[k][1]);
			}
		}
	}
#pragma unroll
	for (int k = 0; k < NG; k++) {
		const float is = mm_isc(L, k);
#pragma unroll
		for (int r = 0; r < R; r++)
#pragma unroll
			for (int i = 0; i < 4; i++) {
				const int hr = i >> 1;
				L.acc[r][k][i] = fmaf(dd[r][hr] * is, dq[r][k][i], L.acc[r][k][i]);
				L.acc[r][k][i] = fmaf(-dm[r][hr] * is, dn[r][k][i], L.acc[r][k][i]);
			}
	}
}

/* ---- Q6_K: one super-block per unit; AM: alignment of the super-block (mm_ldw) ---------------- */
template <int AM, int R, int NG>
__device__ __forceinline__ void mm_unit_q6k(mm_lane<R, NG> &L, const uint8_t *const (&rows)[R][2], int64_t u)
{
	uint32_t ql[R][2][8], qh[R][2][4], sc[R][2][4];
	float d[R][2];
	MM_FOR_ROWS(R)
	{
		const uint8_t *b = rows[r][hr] + (size_t)210 * u;
#pragma unroll
		for (int i = 0; i < 8; i++) /* i = 4n + 2 (j & 1) + hh */
			ql[r][hr][i] =
			    mm_ldw<AM>(b + 64 * (i >> 2) + 32 * ((i >> 1) & 1) + 16 * (i & 1) + 4 * L.t);
#pragma unroll
		for (int i = 0; i < 4; i++) { /* i = 2n + hh */
			qh[r][hr][i] = mm_ldw<AM>(b + 128 + 32 * (i >> 1) + 16 * (i & 1) + 4 * L.t);
			sc[r][hr][i] = mm_ldw<AM>(b + 192 + 4 * i);
		}
		d[r][hr] = mm_f16(mm_u16(b + 208));
	}
	mm_stage_x<false, NG>(*L.sm, L.xr, L.n_tok, u, L.lane);
	float is[NG];
#pragma unroll
	for (int k = 0; k < NG; k++)
		is[k] = mm_isc(L, k);
#pragma unroll
	for (int s = 0; s < 16; s++) { /* one 16-element scale group: elements 128n + 32j + 16hh + .. */
		const int n = s >> 3, j = (s >> 1) & 3, hh = s & 1;
		const int sl = 4 * (j >> 1), sh = 2 * j, isx = 8 * n + 2 * j + hh;
		uint32_t b[NG][2];
#pragma unroll
		for (int k = 0; k < NG; k++) {
			const uint2 v2 = mm_b(L, k, s);
			b[k][0] = v2.x, b[k][1] = v2.y;
		}
#pragma unroll
		for (int r = 0; r < R; r++) {
			uint32_t v[2][2];
			float scale[2];
#pragma unroll
			for (int hr = 0; hr < 2; hr++) {
				const uint32_t lw = ql[r][hr][4 * n + 2 * (j & 1) + hh] >> sl;
				const uint32_t hw = qh[r][hr][2 * n + hh] >> sh;
				const uint32_t v02 =
				    (lw & 0x000F000Fu) | ((hw << 4) & 0x00300030u) | 0x64006400u;
				const uint32_t v13 =
				    ((lw >> 8) & 0x000F000Fu) | ((hw >> 4) & 0x00300030u) | 0x64006400u;
				v[hr][0] = mm_hadd2(v02, 0xE420E420u); /* - 1056: q - 32 */
				v[hr][1] = mm_hadd2(v13, 0xE420E420u);
				scale[hr] = d[r][hr] * kc_s8(sc[r][hr][isx >> 2], isx & 3);
			}
#pragma unroll
			for (int k = 0; k < NG; k++) {
				float D[4] = {0.f, 0.f, 0.f, 0.f};
				mm_mma(D, v[0][0], v[1][0], v[0][1], v[1][1], b[k][0], b[k][1]);
#pragma unroll
				for (int i = 0; i < 4; i++)
					L.acc[r][k][i] = fmaf(scale[i >> 1] * is[k], D[i], L.acc[r][k][i]);
			}
		}
	}
}

/* ---- Q8_0: eight blocks (272 B) per unit -------------------------------------------------------- */
template <int R, int NG>
__device__ __forceinline__ void mm_unit_q80(mm_lane<R, NG> &L, const uint8_t *const (&rows)[R][2], int64_t u)
{
	uint32_t qw[R][2][16];
	float d[R][2][8];
	MM_FOR_ROWS(R)
	{
		const uint8_t *b = rows[r][hr] + (size_t)272 * u;
#pragma unroll
		for (int s = 0; s < 16; s++) {
			const int bi = s >> 1, off = 34 * bi + 2 + 16 * (s & 1) + 4 * L.t;
			qw[r][hr][s] = (bi & 1) ? mm_ldw<1>(b + off) : mm_ldw<0>(b + off);
		}
#pragma unroll
		for (int bi = 0; bi < 8; bi++)
			d[r][hr][bi] = mm_f16(mm_u16(b + 34 * bi));
	}
	mm_stage_x<false, NG>(*L.sm, L.xr, L.n_tok, u, L.lane);
	float is[NG];
#pragma unroll
	for (int k = 0; k < NG; k++)
		is[k] = mm_isc(L, k);
#pragma unroll
	for (int bi = 0; bi < 8; bi++) {
		uint32_t b[NG][2][2];
#pragma unroll
		for (int k = 0; k < NG; k++)
#pragma unroll
			for (int hf = 0; hf < 2; hf++) {
				const uint2 v2 = mm_b(L, k, 2 * bi + hf);
				b[k][hf][0] = v2.x, b[k][hf][1] = v2.y;
			}
#pragma unroll
		for (int r = 0; r < R; r++) {
			uint32_t v[2][2][2]; /* [hf][hr][02 / 13] */
#pragma unroll
			for (int hf = 0; hf < 2; hf++)
#pragma unroll
				for (int hr = 0; hr < 2; hr++) {
					const uint32_t w =
					    qw[r][hr][2 * bi + hf] ^ 0x80808080u; /* int8 + 128 */
					v[hf][hr][0] =
					    mm_hadd2(__byte_perm(w, 0x64646464u, 0x4240), 0xE480E480u);
					v[hf][hr][1] =
					    mm_hadd2(__byte_perm(w, 0x64646464u, 0x4341), 0xE480E480u);
				}
#pragma unroll
			for (int k = 0; k < NG; k++) {
				float D[4] = {0.f, 0.f, 0.f, 0.f};
				mm_mma(D, v[0][0][0], v[0][1][0], v[0][0][1], v[0][1][1], b[k][0][0],
				       b[k][0][1]);
				mm_mma(D, v[1][0][0], v[1][1][0], v[1][0][1], v[1][1][1], b[k][1][0],
				       b[k][1][1]);
#pragma unroll
				for (int i = 0; i < 4; i++)
					L.acc[r][k][i] = fmaf(d[r][i >> 1][bi] * is[k], D[i], L.acc[r][k][i]);
			}
		}
	}
}

/* one 256-element unit, all R tiles; rb4: rows start 4-byte aligned (Q6_K only asks) */
template <int T, int R, int NG>
__device__ __forceinline__ void mm_unit(mm_lane<R, NG> &L, const uint8_t *const (&rows)[R][2], int64_t u,
                                        bool rb4)
{
	if constexpr (T == KT_Q4_K || T == KT_Q5_K)
		mm_unit_k45<T, R, NG>(L, rows, u);
	else if constexpr (T == KT_Q6_K) {
		if (!rb4) /* 210-byte rows (n_in 256): lanes of one warp differ in alignment */
			mm_unit_q6k<2, R, NG>(L, rows, u);
		else if (u & 1) /* 210 u = 2 mod 4 */
			mm_unit_q6k<0, R, NG>(L, rows, u);
		else
			mm_unit_q6k<1, R, NG>(L, rows, u);
	} else
		mm_unit_q80<R, NG>(L, rows, u);
}

/* The chunk's pair numbers and token rows into shared memory (threads 0 .. 4 NG - 1; pair p < np_r
 * is routed pair (p / k, p % k), p >= np_r the shared expert's pair of token p - np_r), the warp's
 * staging area cleared (columns of absent tokens stay zero), the accumulators zeroed. Returns
 * false for a block past the chunk count. */
template <int R, int NG>
__device__ __forceinline__ bool mm_prologue(const int4 *__restrict__ chunks, const int32_t *__restrict__ list,
                                            const float *x, int64_t ldx, int k, int np_r, mm_stage<NG> &st,
                                            const float **xr, int *pr, int4 &ch, mm_lane<R, NG> &L)
{
	if ((int)blockIdx.y >= chunks[0].x)
		return false;
	ch = chunks[1 + blockIdx.y]; /* (expert, first list entry, count, 0) */
	const int lane = threadIdx.x & 31;
	if (threadIdx.x < 4 * NG) {
		const int t = threadIdx.x;
		const int p = list[ch.y + (t < ch.z ? t : 0)];
		pr[t] = p;
		xr[t] = x + (int64_t)(p < np_r ? p / k : p - np_r) * ldx; /* routed pair, or shared: token */
	}
	for (int i = lane; i < NG * 16 * 33; i += 32)
		(&st.b[0][0][0])[i] = make_uint2(0u, 0u);
	if (lane < 4 * NG)
		st.scl[lane] = st.isc[lane] = 1.0f;
	L.g = lane >> 2, L.t = lane & 3, L.lane = lane, L.n_tok = ch.z, L.sm = &st, L.xr = xr;
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int g = 0; g < NG; g++)
#pragma unroll
			for (int i = 0; i < 4; i++)
				L.acc[r][g][i] = 0.f;
	__syncthreads();
	return true;
}

/* ---- kernels ------------------------------------------------------------------------------------ */

/* Workspace: [chunks: int4, entry 0 = (count, pairs listed)][list: int32 per pair] */
template <int CH>
__global__ void __launch_bounds__(1024)
    moe_mma_sort_kernel(const int32_t *__restrict__ ids, int np_r, int np, int E, int E_cnt,
                        int4 *__restrict__ chunks, int32_t *__restrict__ list, unsigned *err)
{
	/* pairs np_r .. np - 1 (when E_cnt = E + 1) belong to the shared expert, numbered E */
	extern __shared__ int mm_cnt[]; /* [E_cnt] counts, then [E_cnt] cursors */
	int *cur = mm_cnt + E_cnt;
	for (int e = threadIdx.x; e < E_cnt; e += blockDim.x)
		mm_cnt[e] = 0;
	__syncthreads();
	for (int i = threadIdx.x; i < np; i += blockDim.x) {
		const int e = i < np_r ? ids[i] : E;
		if (e >= 0 && (e < E || i >= np_r))
			atomicAdd(&mm_cnt[e], 1);
		else
			atomicAdd(err, 1u);
	}
	__syncthreads();
	if (threadIdx.x < 32) { /* warp 0: exclusive scans of the counts and the chunk counts */
		const int lane = threadIdx.x;
		int base_p = 0, base_c = 0;
		for (int e0 = 0; e0 < E_cnt; e0 += 32) {
			const int e = e0 + lane;
			const int c = e < E_cnt ? mm_cnt[e] : 0, nc = (c + CH - 1) / CH;
			int ic = c, inc = nc;
#pragma unroll
			for (int o = 1; o < 32; o <<= 1) {
				const int a = __shfl_up_sync(0xffffffffu, ic, o),
				          b = __shfl_up_sync(0xffffffffu, inc, o);
				if (lane >= o)
					ic += a, inc += b;
			}
			const int off = base_p + ic - c, coff = base_c + inc - nc;
			if (e < E_cnt)
				cur[e] = off;
			for (int j = 0; j < nc; j++)
				chunks[1 + coff + j] = make_int4(e, off + j * CH, min(CH, c - j * CH), 0);
			base_p += __shfl_sync(0xffffffffu, ic, 31);
			base_c += __shfl_sync(0xffffffffu, inc, 31);
		}
		if (lane == 0)
			chunks[0] = make_int4(base_c, base_p, 0, 0);
	}
	__syncthreads();
	for (int i = threadIdx.x; i < np; i += blockDim.x) {
		const int e = i < np_r ? ids[i] : E;
		if (e >= 0 && (e < E || i >= np_r))
			list[atomicAdd(&cur[e], 1)] = i;
	}
}

/* grid (F / 16, chunk slots), W = MM_GU_WARPS(NG) warps: rows f0 .. f0 + 15 of gate (tile 0) and
 * up (tile 1) of the chunk's expert; warp w takes units w, w + W, ... of D; h[pair][f] = SiLU(g) u
 * (kcpu_swiglu's formula). With one n-tile (<= 4 tokens: batch 1 leaves ~1 block per SM) 8 warps
 * keep twice the loads in flight; with two, 8 warps' staging would pass 48 KB of shared memory. */
#define MM_GU_WARPS(NG) ((NG) == 1 ? 8 : 4)
template <int T, int NG>
__global__ void __launch_bounds__(MM_GU_WARPS(NG) * 32)
    moe_mma_gate_up_kernel(const uint8_t *__restrict__ wg, const uint8_t *__restrict__ wu,
                           const uint8_t *__restrict__ sg, const uint8_t *__restrict__ su, size_t rb,
                           int64_t E, int64_t F, int64_t n_units, const float *__restrict__ x, int64_t ldx,
                           int k, int np_r, const int4 *__restrict__ chunks, const int32_t *__restrict__ list,
                           float *__restrict__ h)
{
	constexpr int R = 2, NT = 4 * NG, W = MM_GU_WARPS(NG);
	__shared__ float part[W][16 * R][NT];
	__shared__ mm_stage<NG> stage[W];
	__shared__ const float *xr[NT];
	__shared__ int pr[NT];
	const int warp = threadIdx.x >> 5;
	int4 ch;
	mm_lane<R, NG> L;
	if (!mm_prologue<R, NG>(chunks, list, x, ldx, k, np_r, stage[warp], xr, pr, ch, L))
		return;
	const int64_t f0 = (int64_t)blockIdx.x * 16;
	const size_t eo = ch.x < E ? (size_t)ch.x * (size_t)F * rb : 0; /* expert E: the shared one */
	const uint8_t *bg = (ch.x < E ? wg : sg) + eo, *bu = (ch.x < E ? wu : su) + eo;
	const uint8_t *rows[R][2];
#pragma unroll
	for (int hr = 0; hr < 2; hr++) {
		rows[0][hr] = bg + ((size_t)f0 + 8 * hr + L.g) * rb;
		rows[1][hr] = bu + ((size_t)f0 + 8 * hr + L.g) * rb;
	}
	const bool rb4 = rb % 4 == 0;
	for (int64_t u = warp; u < n_units; u += W)
		mm_unit<T, R, NG>(L, rows, u, rb4);
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int g = 0; g < NG; g++)
#pragma unroll
			for (int hr = 0; hr < 2; hr++)
				part[warp][16 * r + 8 * hr + L.g][4 * g + L.t] =
				    fmaf(L.acc[r][g][2 * hr + 1], 1.f / 2048.f, L.acc[r][g][2 * hr]);
	__syncthreads();
	for (int i = threadIdx.x; i < 16 * NT; i += W * 32) {
		const int rr = i / NT, tok = i % NT;
		if (tok >= ch.z)
			continue;
		float gs = 0.f, us = 0.f;
#pragma unroll
		for (int w = 0; w < W; w++) {
			gs += part[w][rr][tok];
			us += part[w][16 + rr][tok];
		}
		h[(int64_t)pr[tok] * F + f0 + rr] = gs / (1.0f + expf(-gs)) * us;
	}
}

/* grid (ceil(D / (64 R)), chunk slots): warp w of block b owns down rows 16 R (4 b + w) .. + 16 R
 * of the chunk's expert (clamped at D for loads, not stored) over all of F; y[pair][d] */
template <int T, int R, int NG>
__global__ void __launch_bounds__(MM_WARPS * 32)
    moe_mma_down_kernel(const uint8_t *__restrict__ wd, const uint8_t *__restrict__ sd, size_t rb, int64_t E,
                        int64_t D, int64_t n_units, const float *__restrict__ h, int64_t F,
                        const int4 *__restrict__ chunks, const int32_t *__restrict__ list,
                        float *__restrict__ y)
{
	constexpr int NT = 4 * NG;
	__shared__ mm_stage<NG> stage[MM_WARPS];
	__shared__ const float *xr[NT];
	__shared__ int pr[NT];
	const int warp = threadIdx.x >> 5;
	int4 ch;
	mm_lane<R, NG> L;
	if (!mm_prologue<R, NG>(chunks, list, h, F, 1, INT32_MAX, stage[warp], xr, pr, ch, L))
		return;
	const int64_t row0 = ((int64_t)blockIdx.x * MM_WARPS + warp) * 16 * R;
	const uint8_t *bd = ch.x < E ? wd + (size_t)ch.x * (size_t)D * rb : sd; /* E: the shared expert */
	const uint8_t *rows[R][2];
	MM_FOR_ROWS(R)
	rows[r][hr] = bd + (size_t)min(row0 + 16 * r + 8 * hr + L.g, D - 1) * rb;
	const bool rb4 = rb % 4 == 0;
	for (int64_t u = 0; u < n_units; u++)
		mm_unit<T, R, NG>(L, rows, u, rb4);
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int g = 0; g < NG; g++)
#pragma unroll
			for (int hr = 0; hr < 2; hr++) {
				const int tok = 4 * g + L.t;
				const int64_t d = row0 + 16 * r + 8 * hr + L.g;
				if (tok < ch.z && d < D)
					y[(int64_t)pr[tok] * D + d] =
					    fmaf(L.acc[r][g][2 * hr + 1], 1.f / 2048.f, L.acc[r][g][2 * hr]);
			}
}

/* out[i] = sum_j w[i][j] y[i k + j] in slot order (+ the shared expert's y); a pair with an expert
 * id out of range: NaN */
__global__ void moe_mma_combine_kernel(const float *__restrict__ y, const float *__restrict__ w,
                                       const int32_t *__restrict__ ids, int E, int k, int64_t D,
                                       const float *__restrict__ ysh, float *__restrict__ out, int64_t ldo)
{
	const int64_t i = blockIdx.y;
	const int64_t d = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (d >= D)
		return;
	float s = 0.0f;
	for (int j = 0; j < k; j++) {
		const int32_t e = ids[i * k + j];
		s = e >= 0 && e < E ? fmaf(w[i * k + j], y[(i * k + j) * D + d], s) : NAN;
	}
	if (ysh) /* the shared expert, weight 1, after the routed ones */
		s += ysh[i * D + d];
	out[i * ldo + d] = s;
}

/* ---- host ------------------------------------------------------------------------------------- */

static bool mm_type_ok(int t)
{
	return t == KT_Q4_K || t == KT_Q5_K || t == KT_Q6_K || t == KT_Q8_0;
}

/* upper bound of the chunk count: sum_e ceil(c_e / CH) < np / CH + active experts */
static int64_t mm_max_chunks(int64_t np, int64_t E, int ch)
{
	return np / ch + 1 + (np < E ? np : E);
}

/* np: all pairs (routed and shared), E: experts counting the shared one */
static size_t mm_meta_bytes(int64_t np, int64_t E)
{
	return (((size_t)(mm_max_chunks(np, E, 4) + 1) * 16 + (size_t)np * 4) + 255) & ~(size_t)255;
}

static size_t mm_ws_bytes(int64_t np, int64_t E, int64_t F, int64_t D)
{
	return mm_meta_bytes(np, E) + (size_t)np * (size_t)(F + D) * sizeof(float);
}

bool moe_mma_on(void)
{
	const char *v = getenv("TANDEM_MOE_FAST");
	return !v || strcmp(v, "0") != 0;
}

bool moe_mma_fits(const struct kcuda_ctx *c, const float *x, int64_t ldx, int64_t n, int k,
                  const struct kweight *gate, const struct kweight *up, const struct kweight *down, int64_t E,
                  int64_t F)
{
	const int64_t D = gate->n_in;
	return moe_mma_on() && mm_type_ok(gate->type) && mm_type_ok(down->type) && D % 256 == 0 &&
	       F % 256 == 0 && D >= 256 && (uintptr_t)x % 16 == 0 && ldx % 4 == 0 && n >= 1 &&
	       n <= MOE_MMA_MAX_TOKENS && E <= 1024 && (uintptr_t)gate->data % 16 == 0 &&
	       (uintptr_t)up->data % 16 == 0 && (uintptr_t)down->data % 16 == 0 &&
	       mm_ws_bytes(n * (k + 1), E + 1, F, D) <= c->ws_bytes;
}

bool moe_mma_fits_shared(const struct kweight *gate, const struct kweight *down, int64_t F,
                         const struct kweight *sh_gate, const struct kweight *sh_up,
                         const struct kweight *sh_down)
{
	return sh_gate && sh_up && sh_down && sh_gate->data && sh_up->data && sh_down->data &&
	       sh_gate->type == gate->type && sh_up->type == gate->type && sh_down->type == down->type &&
	       sh_gate->n_in == gate->n_in && sh_up->n_in == gate->n_in && sh_gate->n_out == F &&
	       sh_up->n_out == F && sh_down->n_in == F && sh_down->n_out == gate->n_in &&
	       sh_gate->row_bytes == gate->row_bytes && sh_up->row_bytes == gate->row_bytes &&
	       sh_down->row_bytes == down->row_bytes && (uintptr_t)sh_gate->data % 16 == 0 &&
	       (uintptr_t)sh_up->data % 16 == 0 && (uintptr_t)sh_down->data % 16 == 0;
}

static void mm_stage_begin(const char *name, const struct kweight *w, double rows)
{
	if (kprof_active)
		kprof_push(kprof_active, name, w ? ktype_name(w->type) : NULL,
		           w ? rows * (double)w->row_bytes : 0.0);
}
static void mm_stage_end(void)
{
	if (kprof_active)
		kprof_pop(kprof_active);
}

/* what one call needs, gathered for the launch helpers */
struct mm_args {
	const struct kweight *gate, *up, *down;
	const void *sg, *su, *sd; /* shared expert's data, or NULL */
	const float *x;
	int64_t ldx, E, F, D, slots;
	int k, np_r;
	const int4 *chunks;
	const int32_t *list;
	float *h, *y;
};

template <int T, int NG> static int mm_gate_up_t(struct kcuda_ctx *c, const struct mm_args &a)
{
	dim3 grid((unsigned)(a.F / 16), (unsigned)a.slots);
	moe_mma_gate_up_kernel<T, NG><<<grid, MM_GU_WARPS(NG) * 32, 0, c->stream>>>(
	    (const uint8_t *)a.gate->data, (const uint8_t *)a.up->data, (const uint8_t *)a.sg,
	    (const uint8_t *)a.su, a.gate->row_bytes, a.E, a.F, a.D / 256, a.x, a.ldx, a.k, a.np_r, a.chunks,
	    a.list, a.h);
	return kcuda_launch_status("moe_mma_gate_up");
}

template <int T, int NG> static int mm_down_t(struct kcuda_ctx *c, const struct mm_args &a)
{
	/* two row tiles per warp for the light K-quants; Q6_K / Q8_0 need ~230-250 registers at two
	 * (bench_cuda_gemv_mma's table), so one */
	constexpr int R = (T == KT_Q4_K || T == KT_Q5_K) ? 2 : 1;
	dim3 grid((unsigned)((a.D + 64 * R - 1) / (64 * R)), (unsigned)a.slots);
	moe_mma_down_kernel<T, R, NG><<<grid, MM_WARPS * 32, 0, c->stream>>>(
	    (const uint8_t *)a.down->data, (const uint8_t *)a.sd, a.down->row_bytes, a.E, a.D, a.F / 256, a.h,
	    a.F, a.chunks, a.list, a.y);
	return kcuda_launch_status("moe_mma_down");
}

template <int NG>
static int mm_run(struct kcuda_ctx *c, const float *x, int64_t ldx, int64_t n, const int32_t *ids,
                  const float *weights, int k, const struct kweight *gate, const struct kweight *up,
                  const struct kweight *down, int64_t E, int64_t F, const struct kweight *sh_gate,
                  const struct kweight *sh_up, const struct kweight *sh_down, float *out, int64_t ldo)
{
	constexpr int CH = 4 * NG;
	const bool sh = sh_gate != NULL;
	const int64_t np_r = n * k, np = np_r + (sh ? n : 0), E_cnt = E + (sh ? 1 : 0);
	struct mm_args a;
	a.gate = gate, a.up = up, a.down = down;
	a.sg = sh ? sh_gate->data : NULL, a.su = sh ? sh_up->data : NULL, a.sd = sh ? sh_down->data : NULL;
	a.x = x, a.ldx = ldx, a.E = E, a.F = F, a.D = gate->n_in, a.k = k, a.np_r = (int)np_r;
	a.slots = mm_max_chunks(np, E_cnt, CH);
	int4 *chunks = (int4 *)c->ws;
	a.chunks = chunks;
	a.list = (const int32_t *)(chunks + a.slots + 1);
	a.h = (float *)((char *)c->ws + mm_meta_bytes(np, E_cnt));
	a.y = a.h + np * F;
	const int64_t n_ex = (np_r < E ? np_r : E) + (sh ? 1 : 0);
	int rc = 0;
	mm_stage_begin("moe.experts/sort", NULL, 0);
	moe_mma_sort_kernel<CH><<<1, 1024, 2 * (size_t)E_cnt * sizeof(int), c->stream>>>(
	    ids, (int)np_r, (int)np, (int)E, (int)E_cnt, chunks, (int32_t *)a.list, c->err_dev);
	rc = kcuda_launch_status("moe_mma_sort");
	mm_stage_end();
	if (rc)
		return rc;
	/* bytes: the experts the pairs can touch at most */
	mm_stage_begin("moe.experts/gate_up(mma)", gate, 2.0 * (double)n_ex * (double)F);
	switch (gate->type) {
	case KT_Q4_K: rc = mm_gate_up_t<KT_Q4_K, NG>(c, a); break;
	case KT_Q5_K: rc = mm_gate_up_t<KT_Q5_K, NG>(c, a); break;
	case KT_Q6_K: rc = mm_gate_up_t<KT_Q6_K, NG>(c, a); break;
	case KT_Q8_0: rc = mm_gate_up_t<KT_Q8_0, NG>(c, a); break;
	default: rc = ERR_UNSUPPORTED; break;
	}
	mm_stage_end();
	if (rc)
		return rc;
	mm_stage_begin("moe.experts/down(mma)", down, (double)n_ex * (double)a.D);
	switch (down->type) {
	case KT_Q4_K: rc = mm_down_t<KT_Q4_K, NG>(c, a); break;
	case KT_Q5_K: rc = mm_down_t<KT_Q5_K, NG>(c, a); break;
	case KT_Q6_K: rc = mm_down_t<KT_Q6_K, NG>(c, a); break;
	case KT_Q8_0: rc = mm_down_t<KT_Q8_0, NG>(c, a); break;
	default: rc = ERR_UNSUPPORTED; break;
	}
	mm_stage_end();
	if (rc)
		return rc;
	mm_stage_begin("moe.experts/combine", NULL, 0);
	dim3 g3((unsigned)((a.D + 255) / 256), (unsigned)n);
	moe_mma_combine_kernel<<<g3, 256, 0, c->stream>>>(a.y, weights, ids, (int)E, k, a.D,
	                                                  sh ? a.y + np_r * a.D : NULL, out, ldo);
	rc = kcuda_launch_status("moe_mma_combine");
	mm_stage_end();
	return rc;
}

int moe_mma_ffn(struct kcuda_ctx *c, const float *x, int64_t ldx, int64_t n, const int32_t *ids,
                const float *weights, int k, const struct kweight *gate, const struct kweight *up,
                const struct kweight *down, int64_t E, int64_t F, const struct kweight *sh_gate,
                const struct kweight *sh_up, const struct kweight *sh_down, float *out, int64_t ldo)
{
	/* one n-tile of 4 tokens (8 warps per gate/up block) while experts average at most one pair
	 * (n k <= E: an expert with more than 4 then costs a second chunk, rare) or no expert can have
	 * more than 4 (n <= 4: ids of one token are distinct); else two (8 tokens per pass over a row).
	 * TANDEM_MOE_MMA_NG=1|2 forces it (bench_cuda_moe's A/B). */
	const char *f = getenv("TANDEM_MOE_MMA_NG");
	const int ng = f && (f[0] == '1' || f[0] == '2') ? f[0] - '0' : (n <= 4 || n * k <= E ? 1 : 2);
	if (ng == 1)
		return mm_run<1>(c, x, ldx, n, ids, weights, k, gate, up, down, E, F, sh_gate, sh_up, sh_down,
		                 out, ldo);
	return mm_run<2>(c, x, ldx, n, ids, weights, k, gate, up, down, E, F, sh_gate, sh_up, sh_down, out,
	                 ldo);
}
