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

#ifndef KMLA_SIM
#include "kernels/cuda/cuda_common.cuh"

/* The host side the one-launch decode kernels share (mla_dec, dec6), in their terms (threads a
 * block, cl blocks a cluster along x): the launch (cuda_common.cuh's klaunch_try: the PDL attribute
 * when enabled; the status returned as it is, a refusal making the caller take another kernel) and
 * the number of clusters that can be resident at once (no launch) */
template <typename... KArgs, typename... Args>
static inline cudaError_t kmla_cluster_launch(void (*kern)(KArgs...), dim3 grid, int threads, size_t smem,
                                              int cl, cudaStream_t st, Args... args)
{
	return klaunch_try(kern, grid, dim3((unsigned)threads), smem, st, dim3((unsigned)cl), args...);
}
static inline cudaError_t kmla_max_clusters(const void *fn, int cl, int threads, size_t smem, cudaStream_t st,
                                            int *n)
{
	return klaunch_max_clusters(fn, dim3((unsigned)cl), dim3((unsigned)threads), smem, st, n);
}
#endif

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

/* Phase timestamps for a trace (mla_attn_dec6.cu's trace mode): thread 0 writes %globaltimer (ns)
 * to tr[ph]; nothing when tr is NULL. The simulation stores the phase number. */
__device__ __forceinline__ void kmla_trace(unsigned long long *tr, int ph)
{
	if (!tr || threadIdx.x != 0)
		return;
#ifdef KMLA_SIM
	tr[ph] = (unsigned long long)ph + 1;
#elif defined(__CUDA_ARCH__)
	unsigned long long t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	tr[ph] = t;
#endif
}
/* the merge's phases in such a trace */
#define KMLA_TR_CLUSTER 6 /* the cluster level done (before the ticket) */
#define KMLA_TR_TICKET 7 /* the ticket drawn, the cluster barrier passed */
#define KMLA_TR_LAST 8 /* the last block: the cross-cluster merge and its stores done */

/* (M, Ls, acc) += a batch of MB partials (max, sum) / values with a running max, in order (a
 * partial without keys, sum 0, is skipped: its value is not read). */
template <int MB>
__device__ __forceinline__ void kmla_merge_batch(float *M, float *Ls, float4 *acc, const float2 *ml,
                                                 const float4 *v)
{
	float mb = -INFINITY;
#pragma unroll
	for (int e = 0; e < MB; e++)
		if (ml[e].y > 0.0f)
			mb = fmaxf(mb, ml[e].x);
	if (mb == -INFINITY)
		return;
	const float mn = fmaxf(*M, mb);
	const float f = *M == -INFINITY ? 0.0f : expf(*M - mn);
	float4 r = make_float4(acc->x * f, acc->y * f, acc->z * f, acc->w * f);
	float l = *Ls * f;
#pragma unroll
	for (int e = 0; e < MB; e++) {
		if (ml[e].y > 0.0f) {
			const float w = expf(ml[e].x - mn);
			l = fmaf(w, ml[e].y, l);
			r.x = fmaf(w, v[e].x, r.x);
			r.y = fmaf(w, v[e].y, r.y);
			r.z = fmaf(w, v[e].z, r.z);
			r.w = fmaf(w, v[e].w, r.w);
		}
	}
	*acc = r;
	*Ls = l;
	*M = mn;
}

/* Called by every thread of every block of the cluster (no thread may have returned), after the
 * block's (max, sum) of head h are in ml_s[2 h], ml_s[2 h + 1] and its unnormalised accumulator
 * of channel c in o_s[h * OS + c] (h < HG, c < C; a block without keys has sum 0 and its o_s is
 * not read). last_s: one shared int. rh0 = row * H + first head of the group, hv = the group's
 * valid heads. The grid is (ncl * cl splits, row x head group); C % cl == 0 and (C / cl) % 4 == 0
 * (the launchers check), OS % 4 == 0. NT = threads a block.
 * Each thread takes 4 channels of one head of the block's slice and loads everything its sum needs
 * at once (the cluster's (max, sum) pairs and values; in the last block, MB clusters' partials at a
 * time): no block barrier between the weights and the sums. */
template <int HG, int NT, int CL>
__device__ __forceinline__ void
kmla_cluster_merge(cooperative_groups::cluster_group &cluster, const kmla_merge_out &a, float *ml_s,
                   float *o_s, int OS, int *last_s, int64_t rh0, int hv, unsigned long long *tr = nullptr)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	constexpr int MB = 8; /* clusters' partials a thread loads at once in the last block */
	cluster.sync(); /* every block of the cluster has its o_s / ml_s */
	const int cl = (int)cluster.num_blocks(), crank = (int)cluster.block_rank();
	const int icl = (int)blockIdx.x / cl, tid = (int)threadIdx.x, C = a.C;
	const int slice = C / cl, c_lo = crank * slice, nu = HG * (slice / 4);
	for (int u = tid; u < nu; u += NT) {
		const int h = u / (slice / 4), c = c_lo + (u % (slice / 4)) * 4;
		if (h >= hv)
			continue;
		float2 ml[CL];
		float4 v[CL];
#pragma unroll
		for (int p = 0; p < CL; p++) {
			ml[p] = make_float2(-INFINITY, 0.0f);
			if (p < cl) {
				ml[p] = *(const float2 *)(cluster.map_shared_rank(ml_s, (unsigned)p) + 2 * h);
				v[p] =
				    *(const float4 *)(cluster.map_shared_rank(o_s, (unsigned)p) + h * OS + c);
			}
		}
		float M = -INFINITY;
#pragma unroll
		for (int p = 0; p < CL; p++)
			if (ml[p].y > 0.0f)
				M = fmaxf(M, ml[p].x);
		float Ls = 0.0f;
		float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
		for (int p = 0; p < CL; p++) {
			if (ml[p].y > 0.0f) { /* a block without keys: weight 0, value not read */
				const float w = expf(ml[p].x - M);
				Ls += ml[p].y * w;
				acc.x = fmaf(w, v[p].x, acc.x);
				acc.y = fmaf(w, v[p].y, acc.y);
				acc.z = fmaf(w, v[p].z, acc.z);
				acc.w = fmaf(w, v[p].w, acc.w);
			}
		}
		if (a.ncl == 1) {
			const float inv = Ls > 0.0f ? 1.0f / Ls : 0.0f;
			*(float4 *)(a.out + (rh0 + h) * C + c) =
			    make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
		} else {
			*(float4 *)(a.pacc + ((rh0 + h) * a.ncl + icl) * C + c) = acc;
			if (c == c_lo) {
				float *d = a.pml + (((rh0 + h) * a.ncl + icl) * cl + crank) * 2;
				d[0] = M;
				d[1] = Ls;
			}
		}
	}
	if (a.ncl > 1) {
		__threadfence(); /* this thread's partial slice is visible before the block's ticket */
		__syncthreads();
	}
	/* the ticket is drawn between arriving at the cluster barrier (the other blocks may still be
	 * reading this block's shared memory until it completes) and waiting on it, so its atomic's
	 * round trip overlaps the barrier */
	kmla_trace(tr, KMLA_TR_CLUSTER);
	kmla_cluster_arrive();
	if (a.ncl > 1 && tid == 0) {
		unsigned *tk = a.tickets + (size_t)blockIdx.y * cl + crank;
		const unsigned old = atomicAdd(tk, 1u);
		*last_s = old == (unsigned)(a.ncl - 1);
		if (*last_s)
			*tk = 0u; /* every block of this slice has drawn: ready for the next call */
	}
	kmla_cluster_wait();
	kmla_trace(tr, KMLA_TR_TICKET);
	if (a.ncl == 1)
		return;
	__syncthreads(); /* last_s */
	if (!*last_s)
		return;

	/* ---- last of the ncl blocks of this slice: merge the clusters in cluster order ---- */
	__threadfence();
	/* two threads a unit when the units fill at most half the block and the partials are more
	 * than one batch: each merges half of the clusters (one batch in flight where ncl <= 2 MB),
	 * the pair joined by one shuffle in a fixed order (the first half's state, then the second's) */
	const int sub = 2 * nu <= NT && a.ncl > MB ? 2 : 1;
	const int kh = sub == 2 ? (a.ncl + 1) / 2 : a.ncl;
	for (int u0 = 0; u0 < sub * nu; u0 += NT) { /* the same trip count in every thread */
		const int t = u0 + tid, u = t / sub, part = t % sub;
		const int h = u / (slice / 4), c = c_lo + (u % (slice / 4)) * 4;
		const bool act = u < nu && h < hv;
		const int ka = part * kh, kb = min(a.ncl, ka + kh);
		float M = -INFINITY, Ls = 0.0f;
		float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		if (act) {
			const float *pm = a.pml + ((rh0 + h) * a.ncl * cl + crank) * 2;
			const float4 *src = (const float4 *)(a.pacc + (rh0 + h) * a.ncl * C + c);
			for (int k0 = ka; k0 < kb; k0 += MB) {
				float2 ml[MB];
				float4 v[MB];
#pragma unroll
				for (int e = 0; e < MB; e++) {
					ml[e] = make_float2(-INFINITY, 0.0f);
					v[e] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
					if (k0 + e < kb) {
						ml[e] =
						    __ldcg((const float2 *)(pm + (size_t)(k0 + e) * cl * 2));
						v[e] = __ldcg(src + (size_t)(k0 + e) * (C / 4));
					}
				}
				kmla_merge_batch<MB>(&M, &Ls, &acc, ml, v);
			}
		}
		if (sub == 2) { /* every thread of the block: the pairs are lanes 2i, 2i + 1 */
			const float M2 = __shfl_xor_sync(0xffffffffu, M, 1),
			            L2 = __shfl_xor_sync(0xffffffffu, Ls, 1);
			float4 a2;
			a2.x = __shfl_xor_sync(0xffffffffu, acc.x, 1);
			a2.y = __shfl_xor_sync(0xffffffffu, acc.y, 1);
			a2.z = __shfl_xor_sync(0xffffffffu, acc.z, 1);
			a2.w = __shfl_xor_sync(0xffffffffu, acc.w, 1);
			const bool v1 = Ls > 0.0f, v2 = L2 > 0.0f;
			const float mn = v1 && v2 ? fmaxf(M, M2) : v1 ? M : M2;
			const float f1 = v1 ? expf(M - mn) : 0.0f, f2 = v2 ? expf(M2 - mn) : 0.0f;
			Ls = Ls * f1 + L2 * f2;
			acc = make_float4(fmaf(acc.x, f1, a2.x * f2), fmaf(acc.y, f1, a2.y * f2),
			                  fmaf(acc.z, f1, a2.z * f2), fmaf(acc.w, f1, a2.w * f2));
		}
		if (act && part == 0) {
			const float inv = Ls > 0.0f ? 1.0f / Ls : 0.0f;
			*(float4 *)(a.out + (rh0 + h) * C + c) =
			    make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
		}
	}
	kmla_trace(tr, KMLA_TR_LAST);
#endif
}

#endif
