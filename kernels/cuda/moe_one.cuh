/* The batch-1 MoE kernels' shared pieces (moe_one.cu, moe_persist.cu): the fold-in route's
 * arguments, the cp.async helpers, a pair's expert and one unit of x turned into the tensor-core B
 * fragments of one token. Internal to kernels/cuda. */
#ifndef TANDEM_KERNELS_CUDA_MOE_ONE_CUH
#define TANDEM_KERNELS_CUDA_MOE_ONE_CUH

#include "kernels/cuda/moe_mma_route.cuh"
#include "kernels/cuda/moe_mma_units.cuh"

#define MO_RV 8 /* the route folded in (RT): E in 129..256, V = 8 experts per lane (GLM-5, DS-V3) */

/* RT: the token's route, done by warp 0 of every block from the router logits (route_reg_token:
 * kcuda_moe_route's device code, so the same ids and weights in every block and as the route
 * kernel); block (0, 0) of gate / up also stores them to ids / wts (the op's outputs) */
struct mo_rt {
	const float *lg, *bias;
	int k, n_group, n_group_used, gating, norm;
	float scale;
	int32_t *ids;
	float *wts;
};

/* 16 bytes global -> shared, asynchronous (both 16-byte aligned) */
__device__ __forceinline__ void mo_cp16(void *dst, const void *src)
{
	const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src) : "memory");
}
__device__ __forceinline__ void mo_commit(void)
{
	asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> __device__ __forceinline__ void mo_wait(void)
{
	asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
/* wait until at most n groups are pending (n 0..7; more waits for all of them) */
__device__ __forceinline__ void mo_wait_rt(int n)
{
	switch (n) {
	case 1: mo_wait<1>(); break;
	case 2: mo_wait<2>(); break;
	case 3: mo_wait<3>(); break;
	case 4: mo_wait<4>(); break;
	case 5: mo_wait<5>(); break;
	case 6: mo_wait<6>(); break;
	case 7: mo_wait<7>(); break;
	default: mo_wait<0>(); break;
	}
}

/* expert of a pair (E: the shared expert), -1 for a routed id out of range */
__device__ __forceinline__ int mo_expert(int e, bool routed, int E)
{
	return !routed ? E : e >= 0 && e < E ? e : -1;
}

/* One unit of x (256 floats at buf, shared memory) into the B fragments of one token, in place:
 * fragment (step s, column c 0 hi / 1 lo, lane t) at ((uint2 *)buf)[8 s + 4 c + t]: the entries
 * gm_stage_entry writes for token 0 (K45 order: entry q = 16 t + s holds x[4q .. 4q + 3]). Scaled
 * by gm_xscale of the unit's largest |x| (1 below 2^15); returns 1 / that factor. Warp-collective. */
__device__ __forceinline__ float mo_stage_unit(float *buf, int lane)
{
	float4 v[2];
	float m = 0.f;
#pragma unroll
	for (int i = 0; i < 2; i++) {
		v[i] = ((const float4 *)buf)[lane + 32 * i];
		m = fmaxf(m, fmaxf(fmaxf(fabsf(v[i].x), fabsf(v[i].y)), fmaxf(fabsf(v[i].z), fabsf(v[i].w))));
	}
	m = kc_warp_max(m);
	const float sc = gm_xscale(m);
	__syncwarp(); /* every lane's reads before the writes below (in place) */
	uint2 *fr = (uint2 *)buf;
#pragma unroll
	for (int i = 0; i < 2; i++)
		mo_frag_entry(fr, v[i], sc, lane + 32 * i);
	__syncwarp();
	return 1.f / sc;
}

#endif
