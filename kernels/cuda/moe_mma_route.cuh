/* The routing device code shared by moe_route.cu's kernels and moe_one.cu's batch-1 expert kernels
 * (which route their one token themselves): the arg-max order and one token's register route by
 * one warp. Internal to kernels/cuda; the arithmetic and tie rules are described in moe_route.cu. */
#ifndef TANDEM_KERNELS_CUDA_MOE_MMA_ROUTE_CUH
#define TANDEM_KERNELS_CUDA_MOE_MMA_ROUTE_CUH

#include "kernels/cuda/cuda_common.cuh"

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

/* One warp's part of a token's route before the top-k, lane l holding experts l V .. l V + V - 1:
 * p = the gating probabilities of the E logits lg (read through L2 with ld.global.cg), sel = p + the
 * correction bias bj (the caller's load: bias[e0 + j], 0 past E or without a bias), zeroed outside the
 * n_group_used best groups. route_reg_token and moe_router_fuse.cu's route share it (same bits). */
template <int V>
__device__ __forceinline__ void route_scores(const float *lg, const float (&bj)[V], int E, int n_group,
                                             int n_group_used, int gating, float (&p)[V], float (&sel)[V])
{
	const int lane = threadIdx.x & 31;
	const int e0 = lane * V;
#pragma unroll
	for (int j = 0; j < V; j++)
		p[j] = e0 + j < E ? __ldcg(lg + e0 + j) : -INFINITY;
	if (gating == 1) {
		float mx = -INFINITY;
#pragma unroll
		for (int j = 0; j < V; j++)
			mx = fmaxf(mx, p[j]);
		mx = kc_warp_max(mx);
		double sum = 0.0;
#pragma unroll
		for (int j = 0; j < V; j++)
			if (e0 + j < E) {
				p[j] = expf(p[j] - mx);
				sum += (double)p[j];
			}
#pragma unroll
		for (int o = 16; o > 0; o >>= 1)
			sum += __shfl_xor_sync(0xffffffffu, sum, o);
#pragma unroll
		for (int j = 0; j < V; j++)
			p[j] = (float)((double)p[j] / sum);
	} else {
#pragma unroll
		for (int j = 0; j < V; j++)
			p[j] = 1.0f / (1.0f + expf(-p[j]));
	}
#pragma unroll
	for (int j = 0; j < V; j++)
		sel[j] = __fadd_rn(p[j], bj[j]);
	if (n_group > 1 && n_group_used < n_group) {
		/* the host checked: gsz = E / n_group is a multiple of V, L = gsz / V a power of two */
		const int L = E / n_group / V, grp = lane / L;
		float b1 = -INFINITY, b2 = -INFINITY; /* the CPU's scan over this lane's part */
#pragma unroll
		for (int j = 0; j < V; j++) {
			const float v = e0 + j < E ? sel[j] : -INFINITY;
			if (v > b1) {
				b2 = b1;
				b1 = v;
			} else if (v > b2) {
				b2 = v;
			}
		}
		for (int o = 1; o < L; o <<= 1) { /* the two largest of the group (with multiplicity) */
			const float c1 = __shfl_xor_sync(0xffffffffu, b1, o),
			            c2 = __shfl_xor_sync(0xffffffffu, b2, o);
			const float m2 = fmaxf(fminf(b1, c1), fmaxf(b2, c2));
			b1 = fmaxf(b1, c1);
			b2 = m2;
		}
		const float gscore = b1 + b2;
		unsigned keep = 0u; /* bit g: group g stays */
		for (int i = 0; i < n_group_used; i++) {
			const bool cand = grp < n_group && !((keep >> grp) & 1u);
			float v = cand ? gscore : 0.0f;
			int id = cand ? grp : -1;
			route_argmax(v, id);
			if (id >= 0)
				keep |= 1u << id;
		}
		if (grp >= n_group || !((keep >> grp) & 1u))
#pragma unroll
			for (int j = 0; j < V; j++)
				sel[j] = 0.0f;
	}
}

/* The end of a token's route: lane i < k stores the i-th selection, its weight divided by the sum of
 * the k weights in selection order when norm (as the CPU), times scale. route_reg_token and
 * moe_router_fuse.cu's route share it. */
__device__ __forceinline__ void route_store(int lane, int k, int norm, double sum, float scale, int my_id,
                                            float my_w, int32_t *oi, float *ow)
{
	if (lane < k) {
		float w = my_w;
		if (norm)
			w = (float)((double)w / (sum + 1e-20));
		oi[lane] = my_id;
		ow[lane] = w * scale;
	}
}

/* One token's routing by one warp (the register kernel's body): lg = the token's E logits (read
 * through L2 with ld.global.cg: the fused router kernel below reads logits other blocks of the same
 * grid wrote), results to oi[0..k) / ow[0..k); returns this lane's expert (slot lane < k), else -1 */
template <int V, bool RX>
__device__ __forceinline__ int route_reg_token(const float *lg, const float *__restrict__ bias, int E, int k,
                                               int n_group, int n_group_used, int gating, int norm,
                                               float scale, int32_t *oi, float *ow)
{
	const int lane = threadIdx.x & 31;
	const int e0 = lane * V;
	float p[V], sel[V], bj[V];
#pragma unroll
	for (int j = 0; j < V; j++)
		bj[j] = bias && e0 + j < E ? __ldg(bias + e0 + j) : 0.0f;
	route_scores<V>(lg, bj, E, n_group, n_group_used, gating, p, sel);
	/* top-k: each lane's best untaken expert (first in id order, then strictly larger) */
	unsigned taken = 0u;
	float bv = 0.0f;
	int bi = -1;
#pragma unroll
	for (int j = 0; j < V; j++)
		if (e0 + j < E && (bi < 0 || sel[j] > bv)) {
			bv = sel[j];
			bi = e0 + j;
		}
	int my_id = -1;
	float my_w = 0.0f;
	double sum = 0.0;
	for (int i = 0; i < k; i++) {
		int id = bi;
		if (RX) { /* one redux.sync on an order-preserving key, a ballot for the lowest lane */
			const float c = bv + 0.0f; /* -0 -> +0: they tie, as under the CPU's > */
			unsigned key = 0u; /* no candidate (or NaN): lowest */
			if (bi >= 0 && c == c) {
				const unsigned u = __float_as_uint(c);
				key = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
			}
			const unsigned m = __reduce_max_sync(0xffffffffu, key);
			const unsigned bal =
			    __ballot_sync(0xffffffffu, bi >= 0 && key == m); /* k <= E: not 0 */
			id = __shfl_sync(0xffffffffu, bi, __ffs(bal) - 1);
		} else {
			float v = bv;
			route_argmax(v, id);
		}
		float pw = 0.0f;
		const bool mine = id >= 0 && id / V == lane;
		if (mine) {
			const int jw = id - e0;
			taken |= 1u << jw;
#pragma unroll
			for (int j = 0; j < V; j++)
				pw = j == jw ? p[j] : pw;
			bi = -1;
			bv = 0.0f;
#pragma unroll
			for (int j = 0; j < V; j++)
				if (e0 + j < E && !((taken >> j) & 1u) && (bi < 0 || sel[j] > bv)) {
					bv = sel[j];
					bi = e0 + j;
				}
		}
		pw = __shfl_sync(0xffffffffu, pw, id >= 0 ? id / V : 0);
		sum += (double)pw; /* in selection order, as the CPU */
		if (lane == i)
			my_id = id, my_w = pw;
	}
	route_store(lane, k, norm, sum, scale, my_id, my_w, oi, ow);
	return lane < k ? my_id : -1;
}

#endif
