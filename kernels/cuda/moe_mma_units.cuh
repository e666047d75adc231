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
 * / lo; token 4 grp + t); token columns through the row table xr */
template <int R, int NG> struct mm_lane {
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
	float acc[R][NG][4];
	template <bool K45> GM_HD void stage(int64_t u)
	{
#ifdef __CUDA_ARCH__
		if (split > 1) {
			mm_stage_h<K45, NG>(*sm, hp, hq, split, hnp, hF, n_tok, u, lane);
			return;
		}
#endif
		gm_stage_x<K45, NG>(*sm, gm_rows_table{xr}, n_tok, u, lane);
	}
};

#define MM_FOR_ROWS(R) GM_FOR_ROWS(R)

/* one 256-element unit, all R tiles; rb4: rows start 4-byte aligned (Q6_K only asks) */
template <int T, int R, int NG>
__device__ __forceinline__ void mm_unit(mm_lane<R, NG> &L, const uint8_t *const (&rows)[R][2], int64_t u,
                                        bool rb4)
{
	gm_unit<T, R, NG>(L, rows, u, rb4);
}

#endif
