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
#include <stdlib.h>
#include <string.h>

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
    moe_route_smem_kernel(const float *__restrict__ logits, int64_t ld, const float *__restrict__ bias,
                          int64_t n, int E, int k, int n_group, int n_group_used, int gating, int norm,
                          float scale, int32_t *__restrict__ ids, float *__restrict__ weights)
{
	__shared__ float p_all[ROUTE_WARPS][ROUTE_EMAX], sel_all[ROUTE_WARPS][ROUTE_EMAX];
	__shared__ float gs_all[ROUTE_WARPS][32];
	__shared__ int keep_all[ROUTE_WARPS][32];
	__shared__ unsigned char taken_all[ROUTE_WARPS][ROUTE_EMAX]; /* top-k: experts already chosen */
	KDEP_ENTRY();
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

/* ---- the register kernel (TANDEM_MOE_ROUTE_FAST, default on) --------------------------------- *
 * Why the kernel above took ~11 us for ONE token on the H200 (bench_cuda_moe, 15:31 run) while the
 * work is ~2k flops: everything is serial latency. Its loops over E have a run-time bound, so each
 * lane walks its 8 experts through shared memory one dependent step at a time, three times (p,
 * sel, the taken flags); each of the k = 8 top-k rounds rescans all E scores from shared memory
 * and then does a 5-level shuffle arg-max; and at the end lane 0 alone re-reads its 8 freshly
 * written weights from global memory (one L2 round trip each, ~0.3 us) to normalise them.
 * Here lane l holds experts l V .. l V + V - 1 in registers (V = E / 32 rounded up to a power of
 * two, a compile-time constant, so every loop over them is unrolled and all 2 V loads of logits
 * and bias are in flight together); a lane keeps its own best untaken expert, so a top-k round is
 * one 5-level arg-max plus one rescan of V registers by the winning lane; lane i keeps result i,
 * and the normalisation needs no memory at all. The group limit works on the same registers: a
 * group is gsz / V consecutive lanes (taken only when that is a power of two and a whole number),
 * its top-2 merged by xor shuffles inside the group. RX (the default; TANDEM_MOE_ROUTE_FAST=1 turns
 * it off): the top-k arg-max as one redux.sync.max on an order-preserving 32-bit key plus a ballot
 * (lowest lane = lowest id on ties) instead of 5 shuffle levels.
 * Same arithmetic as the CPU (kcpu_moe_route): sigmoid / softmax as the kernel above, the top-k
 * weights summed in double in selection order, ties to the lower id everywhere (contiguous
 * experts per lane: the lower lane holds the lower ids). TANDEM_MOE_ROUTE_FAST=0 or TANDEM_MOE_FAST=0
 * (the switch of the whole MoE decode path) selects the kernel above. */
template <int V, bool RX>
__global__ void __launch_bounds__(ROUTE_WARPS * 32)
    moe_route_reg_kernel(const float *__restrict__ logits, int64_t ld, const float *__restrict__ bias,
                         int64_t n, int E, int k, int n_group, int n_group_used, int gating, int norm,
                         float scale, int32_t *__restrict__ ids, float *__restrict__ weights)
{
	KDEP_ENTRY();
	const int lane = threadIdx.x & 31;
	const int64_t tok = (int64_t)blockIdx.x * ROUTE_WARPS + (threadIdx.x >> 5);
	if (tok >= n)
		return;
	const float *lg = logits + tok * ld;
	const int e0 = lane * V;
	float p[V], sel[V];
#pragma unroll
	for (int j = 0; j < V; j++)
		p[j] = e0 + j < E ? __ldg(lg + e0 + j) : -INFINITY;
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
		sel[j] = __fadd_rn(p[j], bias && e0 + j < E ? __ldg(bias + e0 + j) : 0.0f);
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
	if (lane < k) {
		float w = my_w;
		if (norm)
			w = (float)((double)w / (sum + 1e-20));
		ids[tok * k + lane] = my_id;
		weights[tok * k + lane] = w * scale;
	}
}

/* the register kernel takes E <= 32 V_MAX with k <= 32 (lane i keeps result i) and a group limit
 * whose groups are whole runs of lanes */
#define ROUTE_V_MAX 32
static int route_reg_v(int E, int k, int n_group, int n_group_used)
{
	const char *f = getenv("TANDEM_MOE_ROUTE_FAST"), *m = getenv("TANDEM_MOE_FAST"); /* either 0: old */
	if ((f && strcmp(f, "0") == 0) || (m && strcmp(m, "0") == 0) || k > 32 || E > 32 * ROUTE_V_MAX)
		return 0;
	int V = 1;
	while (32 * V < E)
		V *= 2;
	if (n_group > 1 && n_group_used < n_group) {
		const int gsz = E / n_group;
		if (gsz % V || (gsz / V) & (gsz / V - 1) || n_group > 32)
			return 0;
	}
	return V;
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
	const dim3 grid((unsigned)nb), block(ROUTE_WARPS * 32);
	const int nm = norm ? 1 : 0;
#define ROUTE_REG(VV)                                                                                        \
	case VV:                                                                                             \
		return klaunch("moe_route",                                                                  \
		               rx ? moe_route_reg_kernel<VV, true> : moe_route_reg_kernel<VV, false>, grid,  \
		               block, 0, c->stream, logits, ld, bias, n, E, k, n_group, n_group_used,        \
		               gating, nm, scale, ids, weights)
	const char *rf = getenv("TANDEM_MOE_ROUTE_FAST");
	/* the redux.sync arg-max by default (H200, 16:55 run: 4.4 us against 5.6 per bench call, batch-1
	 * decode step 15.27 against 15.99 ms); TANDEM_MOE_ROUTE_FAST=1: the shuffle arg-max */
	const bool rx = !(rf && strcmp(rf, "1") == 0);
	switch (route_reg_v(E, k, n_group, n_group_used)) {
		ROUTE_REG(1);
		ROUTE_REG(2);
		ROUTE_REG(4);
		ROUTE_REG(8);
		ROUTE_REG(16);
		ROUTE_REG(32);
	default:
		return klaunch("moe_route", moe_route_smem_kernel, grid, block, 0, c->stream, logits, ld,
		               bias, n, E, k, n_group, n_group_used, gating, nm, scale, ids, weights);
	}
#undef ROUTE_REG
}
