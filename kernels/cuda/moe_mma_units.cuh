/* The tensor-core unit bodies of the MoE decode paths (moe_mma.cu: sorted chunks, 1..256 tokens;
 * moe_small.cu: no sort, 1..8 tokens): gemv_mma.cuh's (one copy of the Q4_K / Q5_K / Q6_K / Q8_0
 * staging and fragments for the GEMV and the MoE, so a fix such as the fp16 range vote lives
 * once), run on a lane type whose token columns are gathered through a row-pointer table (the
 * tokens routed to one expert are not contiguous) or, for moe_small.cu's split gate / up, formed
 * from partial sums. Up to 2 row tiles x 4 NG token columns per warp. The fragment layout and
 * quant tricks are described in gemv_mma.cuh's header. Internal to kernels/cuda. */
#ifndef TANDEM_KERNELS_CUDA_MOE_MMA_UNITS_CUH
#define TANDEM_KERNELS_CUDA_MOE_MMA_UNITS_CUH

#define GEMV_MMA_UNITS_ONLY
#include "kernels/cuda/gemv_mma.cuh"

/* X staging area of one warp: gemv_mma.cuh's (fragments, and the per-token factor f that undoes a
 * power-of-two scale of a unit that reached 2^15) */
template <int NG> using mm_stage = gm_stage<NG>;

#define MM_SPLIT_MAX 3 /* moe_small.cu's largest gate / up split */

/* mm_stage_x for split partial sums of gate and up (mm_lane.split > 1): lane l's two float4 of a
 * token are elements 4 l and 128 + 4 l of the unit (the entries q = l, l + 32 gm_stage_x gives
 * it), formed in registers as sum_z g_z, sum_z u_z in z order and kcpu_swiglu's formula; then the
 * range vote and packing of gm_stage_x (a unit whose h reaches 2^15 is staged again times a power
 * of two per token, undone by f). */
template <bool K45, int NG>
__device__ __forceinline__ void mm_stage_h(gm_stage<NG> &sm, const float *hp, const int *hq, int split,
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
		uint32_t vote = 0u;
#pragma unroll
		for (int hh = 0; hh < 2; hh++)
			vote |= gm_stage_entry<K45, NG>(sm, v[hh], 1.f, tok, lane + 32 * hh);
		float f = 1.f;
		if (__any_sync(0xffffffffu, (vote & 0x80008000u) != 0u)) { /* rare: restage scaled */
			float m =
			    fmaxf(fmaxf(fabsf(v[0].x), fabsf(v[0].y)), fmaxf(fabsf(v[0].z), fabsf(v[0].w)));
			m = fmaxf(m, fmaxf(fmaxf(fabsf(v[1].x), fabsf(v[1].y)),
			                   fmaxf(fabsf(v[1].z), fabsf(v[1].w))));
			m = kc_warp_max(m);
			const float sc = gm_xscale(m);
			f = 1.f / sc;
			__syncwarp();
#pragma unroll
			for (int hh = 0; hh < 2; hh++)
				gm_stage_entry<K45, NG>(sm, v[hh], sc, tok, lane + 32 * hh);
		}
		if (lane == 0)
			sm.f[tok] = f;
	}
	__syncwarp();
}

/* Per-lane state of the MoE units (gm_lane's members for the unit bodies): lane coordinates,
 * staged X, accumulators acc[r][grp][i] in D layout (i = 0, 1: row g hi / lo; 2, 3: row g + 8 hi
 * / lo; token 4 grp + t); token columns through the row table xr. MS: the Q4_K / Q5_K mins through
 * the staged sub-block sums (gm_stage_sum; not with split > 1) */
template <int R, int NG, bool MS = false> struct mm_lane {
	static constexpr bool kMinSums = MS;
	int g, t, lane, n_tok;
	gm_stage<NG> *sm;
	const float *const *xr; /* shared: row of each token column */
	/* split > 1 (moe_small.cu's split gate / up): the token columns are h = SiLU(g) u formed from
	 * split partial sums hp[((z np + pair) 2 + {0 gate, 1 up}) F + f], pair = hq[column] (shared);
	 * 1: the rows xr */
	int split;
	const float *hp;
	const int *hq;
	int64_t hnp, hF;
	/* the unit in the staging area: a unit staged again for the next row group of the same tokens
	 * (moe_mma.cu's down kernel) is skipped; -1: none */
	int64_t staged = -1;
	float acc[R][NG][4];
	template <bool K45> GM_HD void stage(int64_t u)
	{
		if (staged == u)
			return;
		staged = u;
#ifdef __CUDA_ARCH__
		if constexpr (!MS) {
			if (split > 1) {
				mm_stage_h<K45, NG>(*sm, hp, hq, split, hnp, hF, n_tok, u, lane);
				return;
			}
		}
#endif
		gm_stage_x<K45, NG, gm_rows_table, MS && K45>(*sm, gm_rows_table{xr}, n_tok, u, lane);
	}
};

#define MM_FOR_ROWS(R) GM_FOR_ROWS(R)

/* ---- one token, one tile (moe_one.cu's batch-1 kernels; host-emulated by bench_cuda_moe emu) ---- */
/* One token's B fragments of a 256-element unit (moe_one.cu): fragment (step s, column c 0 hi / 1
 * lo, lane t) at fr[8 s + 4 c + t], the entries gm_stage_entry writes for token 0 (K45 order:
 * entry q = 16 t + s holds x[4q .. 4q + 3]); v times sc (a power of two: exact) */
GM_HD void mo_frag_entry(uint2 *fr, float4 v, float sc, int q)
{
	const int s = q & 15, t = q >> 4;
	v.x *= sc, v.y *= sc, v.z *= sc, v.w *= sc;
	const uint32_t h0 = gm_pack(v.x, v.z), h1 = gm_pack(v.y, v.w);
	const uint32_t l0 = gm_pack((v.x - gm_f16(h0)) * 2048.f, (v.z - gm_f16(h0 >> 16)) * 2048.f);
	const uint32_t l1 = gm_pack((v.y - gm_f16(h1)) * 2048.f, (v.w - gm_f16(h1 >> 16)) * 2048.f);
	fr[8 * s + t] = make_uint2(h0, h1);
	fr[8 * s + 4 + t] = make_uint2(l0, l1);
}

/* the unit's weight words of one lane from a shared-memory slot (16 rows of BYTES: row 8 hr + g) */
template <int T> GM_HD void mo_k45_lds(gm_k45_w<T, 1> &W, const uint8_t *slot, int g, int t)
{
	constexpr bool Q5 = T == KT_Q5_K;
	constexpr int BYTES = Q5 ? 176 : 144, QS = Q5 ? 48 : 16;
	GM_UNROLL
	for (int hr = 0; hr < 2; hr++) {
		const uint8_t *b = slot + (8 * hr + g) * BYTES;
		W.hd[0][hr] = *(const uint4 *)b;
		W.qa[0][hr] = *(const uint4 *)(b + QS + 32 * t);
		W.qb[0][hr] = *(const uint4 *)(b + QS + 32 * t + 16);
		if (Q5) {
			W.ha[0][hr] = *(const uint4 *)(b + 16);
			W.hb[0][hr] = *(const uint4 *)(b + 32);
		}
	}
}

/* gm_k45_math for one tile and one token (R 1, NG 1), B from the fragments fr of mo_stage_unit
 * (lanes 0..7 hold columns 0 / 1; the other columns are zero), f: the unit's factor back. The
 * operations and their order are gm_k45_math's, so the results are its bits. */
template <int T>
GM_HD void mo_k45_math(float (&acc)[4], const gm_k45_w<T, 1> &W, const uint2 *fr, float f, int lane)
{
	constexpr bool Q5 = T == KT_Q5_K;
	const int t = lane & 3;
	uint32_t s_lo[2], n_lo[2], s_hi[2], n_hi[2], m_lo[2], m_hi[2];
	float dd[2], dm[2];
	GM_UNROLL
	for (int hr = 0; hr < 2; hr++) {
		const uint4 h = W.hd[0][hr];
		int sc[2], mn[2];
		GM_UNROLL
		for (int e = 0; e < 2; e++) {
			const int q = 2 * (t & 1) + e;
			const uint32_t A = (h.y >> (8 * q)) & 255, B = (h.z >> (8 * q)) & 255,
			               C = (h.w >> (8 * q)) & 255;
			sc[e] = (int)(t < 2 ? (A & 63) : ((C & 15) | ((A >> 6) << 4)));
			mn[e] = (int)(t < 2 ? (B & 63) : ((C >> 4) | ((B >> 6) << 4)));
		}
		s_lo[hr] = gm_h2((float)sc[0]);
		n_lo[hr] = gm_h2(-1024.f * sc[0]);
		s_hi[hr] = gm_h2(sc[1] / 16.f);
		n_hi[hr] = gm_h2(-64.f * sc[1]);
		m_lo[hr] = gm_h2((float)mn[0]);
		m_hi[hr] = gm_h2((float)mn[1]);
		dd[hr] = gm_f16(h.x), dm[hr] = gm_f16(h.x >> 16);
	}
	float dq[4] = {0.f, 0.f, 0.f, 0.f}, dn[4] = {0.f, 0.f, 0.f, 0.f};
	const bool col = lane < 8; /* lanes of columns 0 (hi) and 1 (lo) */
	GM_UNROLL
	for (int i = 0; i < 8; i++) {
		const uint2 b0 = col ? fr[8 * i + lane] : make_uint2(0u, 0u);
		const uint2 b1 = col ? fr[8 * (8 + i) + lane] : make_uint2(0u, 0u);
		uint32_t v[2][4];
		GM_UNROLL
		for (int hr = 0; hr < 2; hr++) {
			const uint4 q4 = i < 4 ? W.qa[0][hr] : W.qb[0][hr];
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
				const uint4 h4 = i < 4 ? W.ha[0][hr] : W.hb[0][hr];
				const uint32_t hw = (i & 3) == 0   ? h4.x
				                    : (i & 3) == 1 ? h4.y
				                    : (i & 3) == 2 ? h4.z
				                                   : h4.w;
				const uint32_t hs = hw >> (2 * t);
				l02 |= (hs << 4) & 0x00100010u;
				l13 |= (hs >> 4) & 0x00100010u;
				h02 |= (hs << 7) & 0x01000100u;
				h13 |= (hs >> 1) & 0x01000100u;
			}
			v[hr][0] = gm_hfma2(l02, s_lo[hr], n_lo[hr]);
			v[hr][1] = gm_hfma2(l13, s_lo[hr], n_lo[hr]);
			v[hr][2] = gm_hfma2(h02, s_hi[hr], n_hi[hr]);
			v[hr][3] = gm_hfma2(h13, s_hi[hr], n_hi[hr]);
		}
		gm_mma(dq, v[0][0], v[1][0], v[0][1], v[1][1], b0.x, b0.y);
		gm_mma(dn, m_lo[0], m_lo[1], m_lo[0], m_lo[1], b0.x, b0.y);
		gm_mma(dq, v[0][2], v[1][2], v[0][3], v[1][3], b1.x, b1.y);
		gm_mma(dn, m_hi[0], m_hi[1], m_hi[0], m_hi[1], b1.x, b1.y);
	}
	GM_UNROLL
	for (int i = 0; i < 4; i++) {
		const int hr = i >> 1;
		acc[i] = fmaf(dd[hr] * f, dq[i], acc[i]);
		acc[i] = fmaf(-dm[hr] * f, dn[i], acc[i]);
	}
}

/* one 256-element unit, all R tiles; rb4: rows start 4-byte aligned (Q6_K only asks) */
template <int T, int R, int NG, bool MS>
__device__ __forceinline__ void mm_unit(mm_lane<R, NG, MS> &L, const uint8_t *const (&rows)[R][2], int64_t u,
                                        bool rb4)
{
	gm_unit<T, R, NG>(L, rows, u, rb4);
}

#endif
