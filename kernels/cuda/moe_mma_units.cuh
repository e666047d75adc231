/* The tensor-core unit bodies of the MoE decode paths (moe_mma.cu: sorted chunks, 1..256 tokens;
 * moe_small.cu: no sort, 1..8 tokens): one 256-element unit of up to 2 row tiles x 4 NG token
 * columns per warp, mma.sync m16n8k16 on quant values decoded in registers, token columns
 * gathered through a row-pointer table and scaled per unit by a power of two (fp16 range). The
 * fragment layout and quant tricks are described in moe_mma.cu's header and bench/gemv_mma.cuh's.
 * Internal to kernels/cuda. */
#ifndef TANDEM_KERNELS_CUDA_MOE_MMA_UNITS_CUH
#define TANDEM_KERNELS_CUDA_MOE_MMA_UNITS_CUH

#include "kernels/cuda/quant_piece.cuh"

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
	/* split > 1 (moe_small.cu's split gate / up): the token columns are h = SiLU(g) u formed from
	 * split partial sums hp[((z np + pair) 2 + {0 gate, 1 up}) F + f], pair = hq[column] (shared);
	 * 1: the rows xr */
	int split;
	const float *hp;
	const int *hq;
	int64_t hnp, hF;
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

#define MM_SPLIT_MAX 3 /* moe_small.cu's largest gate / up split */

/* mm_stage_x for split partial sums of gate and up (mm_lane.split > 1): lane l's two float4 of a
 * token are elements 4 l and 128 + 4 l of the unit (the entries q = l, l + 32 mm_stage_x gives
 * it), formed in registers as sum_z g_z, sum_z u_z in z order and kcpu_swiglu's formula; the
 * scale and the packing are mm_stage_x's. */
template <bool K45, int NG>
__device__ __forceinline__ void mm_stage_h(mm_stage<NG> &sm, const float *hp, const int *hq, int split,
                                           int64_t np, int64_t F, int n_tok, int64_t u, int lane)
{
	__syncwarp(); /* the previous unit's reads are done */
	const int nt = n_tok < 4 * NG ? n_tok : 4 * NG;
	for (int tok = 0; tok < nt; tok++) {
		float4 v[2];
#pragma unroll
		for (int hh = 0; hh < 2; hh++) {
			/* all partial loads first (split <= MM_SPLIT_MAX: one round trip, not split), then
			 * the sums in z order */
			float4 pa[MM_SPLIT_MAX], pc[MM_SPLIT_MAX];
#pragma unroll
			for (int z = 0; z < MM_SPLIT_MAX; z++)
				if (z < split) {
					const float *b = hp + ((int64_t)z * np + hq[tok]) * 2 * F + 256 * u +
					                 4 * lane + 128 * hh;
					pa[z] = __ldg((const float4 *)b),
					pc[z] = __ldg((const float4 *)(b + F));
				}
			float4 gs = make_float4(0.f, 0.f, 0.f, 0.f), us = gs;
#pragma unroll
			for (int z = 0; z < MM_SPLIT_MAX; z++)
				if (z < split) {
					gs.x += pa[z].x, gs.y += pa[z].y, gs.z += pa[z].z, gs.w += pa[z].w;
					us.x += pc[z].x, us.y += pc[z].y, us.z += pc[z].z, us.w += pc[z].w;
				}
			v[hh].x = gs.x / (1.0f + expf(-gs.x)) * us.x;
			v[hh].y = gs.y / (1.0f + expf(-gs.y)) * us.y;
			v[hh].z = gs.z / (1.0f + expf(-gs.z)) * us.z;
			v[hh].w = gs.w / (1.0f + expf(-gs.w)) * us.w;
		}
		float m = fmaxf(fmaxf(fabsf(v[0].x), fabsf(v[0].y)), fmaxf(fabsf(v[0].z), fabsf(v[0].w)));
		m = fmaxf(m, fmaxf(fmaxf(fabsf(v[1].x), fabsf(v[1].y)), fmaxf(fabsf(v[1].z), fabsf(v[1].w))));
		m = kc_warp_max(m); /* the same in every lane */
		float s = 1.0f, is = 1.0f;
		if (m > 0.0f && isfinite(m)) {
			int e2 = 14 - ilogbf(m);
			e2 = e2 > 120 ? 120 : e2;
			s = ldexpf(1.0f, e2);
			is = ldexpf(1.0f, -e2);
		}
		if (lane == 0)
			sm.scl[tok] = s, sm.isc[tok] = is;
#pragma unroll
		for (int hh = 0; hh < 2; hh++) {
			const int q = lane + 32 * hh;
			const int st = K45 ? (q & 15) : (q >> 2), t = K45 ? (q >> 4) : (q & 3);
			float4 w = v[hh];
			w.x *= s, w.y *= s, w.z *= s, w.w *= s;
			const uint32_t h0 = mm_pack(w.x, w.z), h1 = mm_pack(w.y, w.w);
			const uint32_t l0 =
			    mm_pack((w.x - mm_f16(h0)) * 2048.f, (w.z - mm_f16(h0 >> 16)) * 2048.f);
			const uint32_t l1 =
			    mm_pack((w.y - mm_f16(h1)) * 2048.f, (w.w - mm_f16(h1 >> 16)) * 2048.f);
			uint2 *row = sm.b[tok >> 2][st];
			const int g = 2 * (tok & 3);
			row[4 * g + t] = make_uint2(h0, h1);
			row[4 * (g + 1) + t] = make_uint2(l0, l1);
		}
	}
	__syncwarp();
}

/* the unit's token columns into the staging area, from rows or from split partial sums */
template <bool K45, int R, int NG> __device__ __forceinline__ void mm_stage_l(mm_lane<R, NG> &L, int64_t u)
{
	if (L.split > 1)
		mm_stage_h<K45, NG>(*L.sm, L.hp, L.hq, L.split, L.hnp, L.hF, L.n_tok, u, L.lane);
	else
		mm_stage_x<K45, NG>(*L.sm, L.xr, L.n_tok, u, L.lane);
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
	mm_stage_l<true>(L, u); /* while the weights load */
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
	mm_stage_l<false>(L, u);
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
	mm_stage_l<false>(L, u);
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

#endif
