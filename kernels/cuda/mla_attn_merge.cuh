/* The split merge of the one-launch MLA decode kernels (mla_attn_dec.cu: mla_dec, 16 heads a
 * block; mla_attn_dec6.cu: mla_dec6, 8 heads a block): the key splits of one (query row, head
 * group) run as blocks of thread-block clusters (up to CL blocks, sm_90+), each ending with its
 * unnormalised (max, sum, acc) in shared memory. They are merged without a second launch:
 *  - inside a cluster through distributed shared memory, block r of the cluster taking channels
 *    [r C / cl, (r + 1) C / cl) of every head (weights e^(m_p - M), cluster order);
 *  - across the ncl clusters of a (row, head group) (ncl > 1): each block writes its cluster's
 *    slice to the workspace and draws a ticket (one counter per (row, head group, slice) in the
 *    context's zeroed ticket array); the block that draws the last one merges the ncl slices in
 *    cluster order and sets the counter back to 0 (the next call, or a graph replay, finds it 0).
 * The order of every sum is fixed, so the bits do not depend on which block finishes last.
 * Internal to kernels/cuda. */
#ifndef TANDEM_KERNELS_CUDA_MLA_ATTN_MERGE_CUH
#define TANDEM_KERNELS_CUDA_MLA_ATTN_MERGE_CUH

#include <cooperative_groups.h>
#include <math.h>
#include <stdint.h>

/* where the merge writes: out [row * H + h][C] (16-byte aligned); with ncl > 1 the cluster
 * partials pacc [row * H + h][ncl][C] and their (max, sum) pml [row * H + h][ncl][cl][2] in the
 * workspace, and the tickets [gridDim.y][cl] (zero between calls) */
struct kmla_merge_out {
	float *out, *pacc, *pml;
	unsigned *tickets;
	int C, ncl;
};

/* the two halves of a cluster barrier (tests/unit/mla_dec6_sim.cc, a CPU simulation of
 * mla_attn_dec6.cu, defines KMLA_SIM and its own) */
#ifndef KMLA_SIM
__device__ __forceinline__ void kmla_cluster_arrive(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void kmla_cluster_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
#endif
}
#endif

/* Called by every thread of every block of the cluster (no thread may have returned), after the
 * block's (max, sum) of head h are in ml_s[2 h], ml_s[2 h + 1] and its unnormalised accumulator
 * of channel c in o_s[h * OS + c] (h < HG, c < C; a block without keys has sum 0 and its o_s is
 * not read). wm: HG * (NCL_MAX + 2) floats of scratch; last_s: one shared int. rh0 = row * H +
 * first head of the group, hv = the group's valid heads. The grid is (ncl * cl splits, row x head
 * group); C % cl == 0 and (C / cl) % 4 == 0 (the launchers check). NT = threads a block. */
template <int HG, int NT, int CL, int NCL_MAX>
__device__ __forceinline__ void kmla_cluster_merge(cooperative_groups::cluster_group &cluster,
                                                   const kmla_merge_out &a, float *ml_s, float *o_s,
                                                   int OS, float *wm, int *last_s, int64_t rh0, int hv)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	cluster.sync(); /* every block of the cluster has its o_s / ml_s */
	const int cl = (int)cluster.num_blocks(), crank = (int)cluster.block_rank();
	const int icl = (int)blockIdx.x / cl, tid = (int)threadIdx.x, C = a.C;
	const int slice = C / cl, c_lo = crank * slice, nu = HG * (slice / 4);
	/* wm: [HG][NCL_MAX + 2]: weights, then (max, sum) at [NCL_MAX], [NCL_MAX + 1] */
	if (tid < hv) {
		float mp[CL], lp[CL];
		float M = -INFINITY;
#pragma unroll
		for (int p = 0; p < CL; p++) {
			mp[p] = -INFINITY;
			lp[p] = 0.0f;
			if (p < cl) {
				const float *pm = cluster.map_shared_rank(ml_s, (unsigned)p);
				mp[p] = pm[2 * tid];
				lp[p] = pm[2 * tid + 1];
			}
		}
#pragma unroll
		for (int p = 0; p < CL; p++)
			if (lp[p] > 0.0f)
				M = fmaxf(M, mp[p]);
		float Ls = 0.0f;
#pragma unroll
		for (int p = 0; p < CL; p++) {
			const float w = lp[p] > 0.0f ? expf(mp[p] - M) : 0.0f;
			Ls += lp[p] * w;
			if (p < cl)
				wm[tid * (NCL_MAX + 2) + p] = w;
		}
		wm[tid * (NCL_MAX + 2) + NCL_MAX] = M;
		wm[tid * (NCL_MAX + 2) + NCL_MAX + 1] = Ls;
	}
	__syncthreads();
	for (int u = tid; u < nu; u += NT) {
		const int h = u / (slice / 4), c = c_lo + (u % (slice / 4)) * 4;
		if (h >= hv)
			continue;
		float4 v[CL];
#pragma unroll
		for (int p = 0; p < CL; p++)
			if (p < cl)
				v[p] = *(const float4 *)(cluster.map_shared_rank(o_s, (unsigned)p) + h * OS + c);
		float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
		for (int p = 0; p < CL; p++) {
			const float w = p < cl ? wm[h * (NCL_MAX + 2) + p] : 0.0f;
			if (w != 0.0f) { /* a block without keys: weight 0, value not used */
				acc.x = fmaf(w, v[p].x, acc.x);
				acc.y = fmaf(w, v[p].y, acc.y);
				acc.z = fmaf(w, v[p].z, acc.z);
				acc.w = fmaf(w, v[p].w, acc.w);
			}
		}
		if (a.ncl == 1) {
			const float Ls = wm[h * (NCL_MAX + 2) + NCL_MAX + 1];
			const float inv = Ls > 0.0f ? 1.0f / Ls : 0.0f;
			*(float4 *)(a.out + (rh0 + h) * C + c) =
			    make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
		} else {
			*(float4 *)(a.pacc + ((rh0 + h) * a.ncl + icl) * C + c) = acc;
		}
	}
	if (a.ncl > 1 && tid < hv) {
		float *d = a.pml + (((rh0 + tid) * a.ncl + icl) * cl + crank) * 2;
		d[0] = wm[tid * (NCL_MAX + 2) + NCL_MAX];
		d[1] = wm[tid * (NCL_MAX + 2) + NCL_MAX + 1];
	}
	if (a.ncl > 1) {
		__threadfence(); /* the partial slice is visible before this block's ticket */
		__syncthreads();
	}
	/* the ticket is drawn between arriving at the cluster barrier (the other blocks may still be
	 * reading this block's shared memory until it completes) and waiting on it, so its atomic's
	 * round trip overlaps the barrier */
	kmla_cluster_arrive();
	if (a.ncl > 1 && tid == 0) {
		unsigned *tk = a.tickets + (size_t)blockIdx.y * cl + crank;
		const unsigned old = atomicAdd(tk, 1u);
		*last_s = old == (unsigned)(a.ncl - 1);
		if (*last_s)
			*tk = 0u; /* every block of this slice has drawn: ready for the next call */
	}
	kmla_cluster_wait();
	if (a.ncl == 1)
		return;
	__syncthreads(); /* last_s */
	if (!*last_s)
		return;

	/* ---- last of the ncl blocks of this slice: merge the clusters in cluster order ---- */
	__threadfence();
	if (tid < hv) {
		const float *pm = a.pml + ((rh0 + tid) * a.ncl * cl + crank) * 2;
		float M = -INFINITY;
		for (int k = 0; k < a.ncl; k++) {
			const float2 ml = __ldcg((const float2 *)(pm + (size_t)k * cl * 2));
			if (ml.y > 0.0f)
				M = fmaxf(M, ml.x);
		}
		float Ls = 0.0f;
		for (int k = 0; k < a.ncl; k++) {
			const float2 ml = __ldcg((const float2 *)(pm + (size_t)k * cl * 2));
			const float w = ml.y > 0.0f ? expf(ml.x - M) : 0.0f;
			Ls += ml.y * w;
			wm[tid * (NCL_MAX + 2) + k] = w;
		}
		wm[tid * (NCL_MAX + 2) + NCL_MAX + 1] = Ls > 0.0f ? 1.0f / Ls : 0.0f;
	}
	__syncthreads();
	for (int u = tid; u < nu; u += NT) {
		const int h = u / (slice / 4), c = c_lo + (u % (slice / 4)) * 4;
		if (h >= hv)
			continue;
		const float4 *src = (const float4 *)(a.pacc + (rh0 + h) * a.ncl * C + c);
		const float *w = wm + h * (NCL_MAX + 2);
		float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		int k = 0;
		for (; k + 8 <= a.ncl; k += 8) { /* 8 loads in flight */
			float4 v[8];
#pragma unroll
			for (int e = 0; e < 8; e++)
				v[e] = __ldcg(src + (size_t)(k + e) * (C / 4));
#pragma unroll
			for (int e = 0; e < 8; e++) {
				const float we = w[k + e];
				if (we != 0.0f) {
					acc.x = fmaf(we, v[e].x, acc.x);
					acc.y = fmaf(we, v[e].y, acc.y);
					acc.z = fmaf(we, v[e].z, acc.z);
					acc.w = fmaf(we, v[e].w, acc.w);
				}
			}
		}
		for (; k < a.ncl; k++) {
			const float4 v = __ldcg(src + (size_t)k * (C / 4));
			const float we = w[k];
			if (we != 0.0f) {
				acc.x = fmaf(we, v.x, acc.x);
				acc.y = fmaf(we, v.y, acc.y);
				acc.z = fmaf(we, v.z, acc.z);
				acc.w = fmaf(we, v.w, acc.w);
			}
		}
		const float inv = w[NCL_MAX + 1];
		*(float4 *)(a.out + (rh0 + h) * C + c) =
		    make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
	}
#endif
}

#endif
