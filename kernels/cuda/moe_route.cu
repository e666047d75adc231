/* MoE routing on the GPU, the CUDA twin of kcpu_moe_route (kernels/cpu/moe_route.c) for n tokens:
 * gate probabilities (sigmoid, or softmax for gating 1; softmax sum in double as the CPU), the
 * correction bias added for selection only, the group limit (group score = sum of the group's two
 * best biased scores scanned in expert order with the CPU's strict comparisons; the best
 * n_group_used groups stay, ties to the lower group; dropped groups' experts get 0.0), top-k by
 * repeated arg-max with ties to the LOWER expert id, weights from the unbiased probabilities,
 * normalised in double with + 1e-20, times the routed scale.
 *
 * Grid: one warp per token (blocks of 4 warps); probabilities and selection scores of the token in
 * shared memory (E <= 1024). The arg-max is a warp reduction on (score, id) with the CPU's order.
 * Differences to the CPU can only come from expf (CUDA's expf is within 2 ulp of glibc's), so ids
 * agree unless two experts are within an ulp of each other. */
#include <errno.h>

#include "kernels/cuda/cuda_common.cuh"

#define ROUTE_WARPS 4
#define ROUTE_EMAX 1024

/* (v, i) beats (w, j): larger score, then lower id (the CPU keeps the first strict maximum) */
__device__ __forceinline__ bool route_better(float v, int i, float w, int j)
{
	if (j < 0)
		return i >= 0;
	if (i < 0)
		return false;
	return v > w || (v == w && i < j);
}

__device__ __forceinline__ void route_argmax(float &v, int &i)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) {
		const float w = __shfl_xor_sync(0xffffffffu, v, o);
		const int j = __shfl_xor_sync(0xffffffffu, i, o);
		if (route_better(w, j, v, i)) {
			v = w;
			i = j;
		}
	}
}

__global__ void __launch_bounds__(ROUTE_WARPS * 32)
    moe_route_kernel(const float *__restrict__ logits, int64_t ld, const float *__restrict__ bias, int64_t n,
                     int E, int k, int n_group, int n_group_used, int gating, int norm, float scale,
                     int32_t *__restrict__ ids, float *__restrict__ weights)
{
	__shared__ float p_all[ROUTE_WARPS][ROUTE_EMAX], sel_all[ROUTE_WARPS][ROUTE_EMAX];
	__shared__ float gs_all[ROUTE_WARPS][32];
	__shared__ int keep_all[ROUTE_WARPS][32];
	__shared__ unsigned char taken_all[ROUTE_WARPS][ROUTE_EMAX]; /* top-k: experts already chosen */
	const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
	const int64_t tok = (int64_t)blockIdx.x * ROUTE_WARPS + wi;
	if (tok >= n)
		return;
	float *p = p_all[wi], *sel = sel_all[wi];
	const float *lg = logits + tok * ld;
	if (gating == 1) {
		float mx = -INFINITY;
		for (int e = lane; e < E; e += 32)
			mx = fmaxf(mx, lg[e]);
		mx = kc_warp_max(mx);
		double sum = 0.0;
		for (int e = lane; e < E; e += 32) {
			p[e] = expf(lg[e] - mx);
			sum += (double)p[e];
		}
#pragma unroll
		for (int o = 16; o > 0; o >>= 1)
			sum += __shfl_xor_sync(0xffffffffu, sum, o);
		for (int e = lane; e < E; e += 32)
			p[e] = (float)((double)p[e] / sum);
	} else {
		for (int e = lane; e < E; e += 32)
			p[e] = 1.0f / (1.0f + expf(-lg[e]));
	}
	for (int e = lane; e < E; e += 32)
		sel[e] = __fadd_rn(p[e], bias ? bias[e] : 0.0f);
	__syncwarp();
	if (n_group > 1 && n_group_used < n_group) {
		const int gsz = E / n_group;
		float *gscore = gs_all[wi];
		int *keep = keep_all[wi];
		if (lane < n_group) {
			float b1 = -INFINITY, b2 = -INFINITY;
			for (int j = 0; j < gsz; j++) {
				const float v = sel[lane * gsz + j];
				if (v > b1) {
					b2 = b1;
					b1 = v;
				} else if (v > b2) {
					b2 = v;
				}
			}
			gscore[lane] = b1 + b2;
			keep[lane] = 0;
		}
		__syncwarp();
		for (int i = 0; i < n_group_used; i++) {
			float v = lane < n_group && !keep[lane] ? gscore[lane] : 0.0f;
			int id = lane < n_group && !keep[lane] ? lane : -1;
			route_argmax(v, id);
			if (lane == 0 && id >= 0)
				keep[id] = 1;
			__syncwarp();
		}
		for (int e = lane; e < n_group * gsz; e += 32)
			if (!keep[e / gsz])
				sel[e] = 0.0f;
		__syncwarp();
	}
	/* top-k: repeated arg-max over the experts not taken yet (flags in shared memory; the
	 * earlier version re-read the chosen ids from global memory for every candidate, k^2 E / 64
	 * dependent loads per lane, and the op measured 23 us per call at batch 1 on the H200) */
	int32_t *oi = ids + tok * k;
	float *ow = weights + tok * k;
	unsigned char *taken = taken_all[wi];
	for (int e = lane; e < E; e += 32)
		taken[e] = 0;
	__syncwarp();
	double sum = 0.0;
	for (int i = 0; i < k; i++) {
		float v = 0.0f;
		int id = -1;
		for (int e = lane; e < E; e += 32)
			if (!taken[e] && route_better(sel[e], e, v, id)) {
				v = sel[e];
				id = e;
			}
		route_argmax(v, id);
		if (lane == 0) {
			oi[i] = id;
			ow[i] = p[id];
			taken[id] = 1;
		}
		sum += (double)p[id];
		__syncwarp();
	}
	if (lane == 0)
		for (int i = 0; i < k; i++) {
			float w = ow[i];
			if (norm)
				w = (float)((double)w / (sum + 1e-20));
			ow[i] = w * scale;
		}
}

extern "C" int kcuda_moe_route(struct kcuda_ctx *c, const float *logits, int64_t ld, const float *bias,
                               int64_t n, int E, int k, int n_group, int n_group_used, int gating, bool norm,
                               float scale, int32_t *ids, float *weights)
{
	if (!c || !logits || !ids || !weights || n < 0 || E < 1 || k < 1 || k > E || ld < E || n_group < 0 ||
	    n_group_used < 0)
		return kcuda_bad_arg("moe_route", "n %lld E %d k %d ld %lld groups %d/%d%s", (long long)n, E,
		                     k, (long long)ld, n_group_used, n_group,
		                     !c || !logits || !ids || !weights ? ", or a null pointer" : "");
	if (E > ROUTE_EMAX || n_group > 32)
		return ERR_LIMIT;
	if (n_group > 1 && n_group_used < n_group && (E % n_group || n_group_used < 1))
		return kcuda_bad_arg("moe_route", "E %d not split in %d groups, or %d groups used", E,
		                     n_group, n_group_used);
	if (n == 0)
		return 0;
	const int64_t nb = (n + ROUTE_WARPS - 1) / ROUTE_WARPS;
	if (nb > INT32_MAX)
		return ERR_LIMIT;
	moe_route_kernel<<<(unsigned)nb, ROUTE_WARPS * 32, 0, c->stream>>>(
	    logits, ld, bias, n, E, k, n_group, n_group_used, gating, norm ? 1 : 0, scale, ids, weights);
	return kcuda_launch_status("moe_route");
}
