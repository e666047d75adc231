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
#include "kernels/cuda/moe_mma.h" /* moe_pf_mask */
#include "kernels/cuda/moe_mma_route.cuh"

#define ROUTE_WARPS 4
#define ROUTE_EMAX 1024

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
	const int64_t tok = (int64_t)blockIdx.x * ROUTE_WARPS + (threadIdx.x >> 5);
	if (tok >= n)
		return;
	route_reg_token<V, RX>(logits + tok * ld, bias, E, k, n_group, n_group_used, gating, norm, scale,
	                       ids + tok * k, weights + tok * k);
}

/* the register kernel takes E <= 32 V_MAX with k <= 32 (lane i keeps result i) and a group limit
 * whose groups are whole runs of lanes */
#define ROUTE_V_MAX 32
int moe_route_reg_v(int E, int k, int n_group, int n_group_used)
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
	switch (moe_route_reg_v(E, k, n_group, n_group_used)) {
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

/* ---- router product + route in one launch (kcuda_moe_router_route) ---------------------------- *
 * Why: at batch 1 the F32 router product (6144 x 256, 6.3 MB) and the route were two launches per
 * layer, 8.1 + 7.1 us in the 18:14 H200 profile (ncu, one kernel at a time) for ~1.4 us of reading
 * and ~2k flops: launch, ramp-up and dependent round trips. Here:
 *   - block b owns router rows 2b, 2b + 1 (RR_ROWS), 4 warps per row, each a quarter of D; a lane
 *     loads its RR_NV float4 of W into registers BEFORE KDEP_ENTRY (weights are never written while
 *     kernels run, cuda_common.cuh), so the 6.3 MB stream overlaps the kernel before (add_rmsnorm);
 *   - after the wait, x (n <= 8 tokens) is read and the dots reduced per warp, then across the
 *     quarters in a fixed order (deterministic), logits stored;
 *   - the last block to finish (an atomic ticket, reset by that block for the next launch / graph
 *     replay; word 1 of the context's err_dev) runs the register route (route_reg_token, same
 *     arithmetic and ties as kcuda_moe_route) on the logits, one warp per token, reading them
 *     through L2 (the other blocks' stores were fenced before their tickets);
 *   - that warp's lanes then prefetch their experts' gate / up / down rows into L2 (pf.on: only
 *     addresses, results never depend on it), so the expert kernels that follow read L2, and the
 *     shared expert's weights are prefetched before KDEP_ENTRY (a slice per block).
 * Shapes it takes: none by default; n 1..2 with TANDEM_MOE_ROUTER_FUSED=2, 1..8 with =1 (rr_max_tokens), E a
 * multiple of RR_ROWS with the register route, D % 16 == 0 and D <= 8192, F32 router rows 16-byte aligned;
 * else ERR_UNSUPPORTED (the two launches as before). TANDEM_MOE_ROUTER_FUSED=0 turns it off; the expert
 * prefetch is MOE_PF_ROUTE of TANDEM_MOE_PF (moe_mma.h; off by default: measured slower). */
#define RR_ROWS 2
#define RR_QW 4 /* warps per row */
#define RR_NV 16 /* float4 of a row quarter per lane: D <= 32 * 4 * RR_QW * RR_NV = 8192 */
#define RR_MAXT 8

struct rr_pf {
	const uint8_t *gate, *up, *down; /* routed experts (expert e at + e * bytes) */
	size_t gate_bytes, down_bytes;
	const uint8_t *sg, *su, *sd; /* the shared expert, or NULL */
	size_t sg_bytes, sd_bytes;
	int routed; /* prefetch the chosen experts after the route */
	int shared; /* prefetch the shared expert before KDEP_ENTRY (TANDEM_PREFETCH) */
};

/* this block's 1 / G share of [p, p + bytes) into L2 (thread 0) */
__device__ __forceinline__ void rr_prefetch_share(const uint8_t *p, size_t bytes)
{
	if (!p || !bytes)
		return;
	const size_t G = gridDim.x, b = blockIdx.x;
	const size_t a0 = bytes * b / G, a1 = bytes * (b + 1) / G;
	kdep_prefetch_l2(p + a0, a1 - a0);
}

template <int V, bool RX>
__global__ void __launch_bounds__(RR_ROWS *RR_QW * 32)
    moe_router_route_kernel(const float *__restrict__ W, size_t rb, int64_t D, const float *__restrict__ x,
                            int64_t ldx, int n, float *logits, const float *__restrict__ bias, int E, int k,
                            int n_group, int n_group_used, int gating, int norm, float scale,
                            int32_t *__restrict__ ids, float *__restrict__ weights, unsigned *ticket,
                            rr_pf pf)
{
	__shared__ float part[RR_MAXT][RR_ROWS][RR_QW];
	__shared__ int s_last;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int rr = warp / RR_QW, q = warp % RR_QW;
	const int64_t row = (int64_t)blockIdx.x * RR_ROWS + rr;
	const int qn = (int)(D / (4 * RR_QW)); /* float4 in a quarter; lane: 32 j + lane < qn */
	const int64_t q0 = (int64_t)q * (D / RR_QW); /* first element of this warp's quarter */
	/* the weights: allowed before the wait (never written while kernels run) */
	float4 w[RR_NV];
	const float4 *wr = (const float4 *)((const uint8_t *)W + (size_t)row * rb) + q0 / 4;
#pragma unroll
	for (int j = 0; j < RR_NV; j++)
		w[j] = 32 * j + lane < qn ? __ldg(wr + 32 * j + lane) : make_float4(0.f, 0.f, 0.f, 0.f);
	if (pf.shared && threadIdx.x == 0) {
		rr_prefetch_share(pf.sg, pf.sg_bytes);
		rr_prefetch_share(pf.su, pf.sg_bytes);
		rr_prefetch_share(pf.sd, pf.sd_bytes);
	}
	KDEP_ENTRY();
	/* every token's x loads are independent of the sums: one pass over j with all tokens (the
	 * loop over tokens used to be a dependent L2 round trip per token at batch 8); each token's sum
	 * runs over j in order, as before */
	float acc[RR_MAXT];
#pragma unroll
	for (int t = 0; t < RR_MAXT; t++)
		acc[t] = 0.f;
#pragma unroll
	for (int j = 0; j < RR_NV; j++) {
		if (32 * j >= qn) /* warp-uniform: no lane has an element here */
			break;
		const bool in = 32 * j + lane < qn;
#pragma unroll
		for (int t = 0; t < RR_MAXT; t++)
			if (t < n) {
				const float4 xv =
				    in ? __ldg((const float4 *)(x + (int64_t)t * ldx + q0) + 32 * j + lane)
				       : make_float4(0.f, 0.f, 0.f, 0.f);
				acc[t] = fmaf(w[j].x, xv.x, acc[t]);
				acc[t] = fmaf(w[j].y, xv.y, acc[t]);
				acc[t] = fmaf(w[j].z, xv.z, acc[t]);
				acc[t] = fmaf(w[j].w, xv.w, acc[t]);
			}
	}
#pragma unroll
	for (int t = 0; t < RR_MAXT; t++)
		if (t < n) {
			const float s = kc_warp_sum(acc[t]);
			if (lane == 0)
				part[t][rr][q] = s;
		}
	__syncthreads();
	if (threadIdx.x < n * RR_ROWS) {
		const int t = threadIdx.x / RR_ROWS, r = threadIdx.x % RR_ROWS;
		const float *pp = part[t][r];
		logits[(int64_t)t * E + (int64_t)blockIdx.x * RR_ROWS + r] =
		    (pp[0] + pp[1]) + (pp[2] + pp[3]);
		__threadfence(); /* the logits before this block's ticket */
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		__threadfence();
		s_last = atomicAdd(ticket, 1u) == gridDim.x - 1;
	}
	__syncthreads();
	if (!s_last)
		return;
	/* the last block: every other block has stored its logits and taken its ticket */
	if (threadIdx.x == 0)
		*ticket = 0u; /* for the next launch (stream order: nothing else touches it meanwhile) */
	__threadfence();
	for (int t = warp; t < n; t += RR_ROWS * RR_QW) {
		const int id =
		    route_reg_token<V, RX>(logits + (int64_t)t * E, bias, E, k, n_group, n_group_used, gating,
		                           norm, scale, ids + (int64_t)t * k, weights + (int64_t)t * k);
		if (pf.routed && id >= 0 && id < E) {
			kdep_prefetch_l2(pf.gate + (size_t)id * pf.gate_bytes, pf.gate_bytes);
			kdep_prefetch_l2(pf.up + (size_t)id * pf.gate_bytes, pf.gate_bytes);
			kdep_prefetch_l2(pf.down + (size_t)id * pf.down_bytes, pf.down_bytes);
		}
	}
}

static bool rr_env_off(const char *name)
{
	const char *v = getenv(name);
	return v && strcmp(v, "0") == 0;
}

/* the fused kernel's token limit: by default 2 (H200, 19:30 run, bench_cuda_moe layer chain without
 * the expert prefetch, us per layer against the two launches: batch 1 29.0 / 30.4, 2 45.9 / 46.6, 4
 * 75.2 / 72.2, 8 130.2 / 127.3; that build still looped over the tokens with a dependent round trip
 * each, since changed); TANDEM_MOE_ROUTER_FUSED=1: up to RR_MAXT, 0: never */
static int rr_max_tokens(void)
{
	/* OFF by default since the 20:15 H200 run: in the whole decode step the fused launch cost 14.1 us
	 * per layer on the critical path (nsys) against 3.4 + 4.3 us for the router product + route, and
	 * the batch-1 step was 8.35 ms without it, 8.72 ms with it (the bench chain above had favoured it);
	 * TANDEM_MOE_ROUTER_FUSED=2: up to 2 tokens, =1: up to RR_MAXT */
	const char *v = getenv("TANDEM_MOE_ROUTER_FUSED");
	if (v && strcmp(v, "1") == 0)
		return RR_MAXT;
	return v && strcmp(v, "2") == 0 ? 2 : 0;
}

extern "C" int kcuda_moe_router_route(struct kcuda_ctx *c, const struct kweight *router, const float *x,
                                      int64_t ldx, int64_t n, float *logits, const float *bias, int E, int k,
                                      int n_group, int n_group_used, int gating, bool norm, float scale,
                                      int32_t *ids, float *weights, const struct kcuda_moe_pf *pf)
{
	if (!c || !router || !x || !logits || !ids || !weights || n < 0 || E < 1 || k < 1 || k > E ||
	    n_group < 0 || n_group_used < 0)
		return kcuda_bad_arg(
		    "moe_router_route", "n %lld E %d k %d%s", (long long)n, E, k,
		    !c || !router || !x || !logits || !ids || !weights ? ", or a null pointer" : "");
	if (rr_env_off("TANDEM_MOE_ROUTER_FUSED") || rr_env_off("TANDEM_MOE_FAST"))
		return ERR_UNSUPPORTED;
	if (!rr_max_tokens()) { /* moe4's kernel not asked for: moe6's (moe_router_fuse.cu) under its own
		                 * switch, TANDEM_MOE_ROUTE_FUSE=1 (off by default) */
		if (n_group > 1 && n_group_used < n_group && (E % n_group || n_group_used < 1))
			return kcuda_bad_arg("moe_router_route",
			                     "E %d not split in %d groups, or %d groups used", E, n_group,
			                     n_group_used);
		return moe_router_fuse(c, router, x, ldx, n, logits, bias, E, k, n_group, n_group_used,
		                       gating, norm, scale, ids, weights);
	}
	if (n > rr_max_tokens())
		return ERR_UNSUPPORTED;
	const int64_t D = router->n_in;
	if (router->type != KT_F32 || !router->data || router->n_out != E || n < 1 || n > RR_MAXT ||
	    E % RR_ROWS || D < 16 || D % 16 || D > 32 * 4 * RR_QW * RR_NV ||
	    router->row_bytes < (size_t)D * 4 || router->row_bytes % 16 || (uintptr_t)router->data % 16 ||
	    (uintptr_t)x % 16 || ldx % 4 || ldx < D || E > ROUTE_EMAX || n_group > 32)
		return ERR_UNSUPPORTED;
	if (n_group > 1 && n_group_used < n_group && (E % n_group || n_group_used < 1))
		return kcuda_bad_arg("moe_router_route", "E %d not split in %d groups, or %d groups used", E,
		                     n_group, n_group_used);
	const int V = moe_route_reg_v(E, k, n_group, n_group_used);
	if (!V)
		return ERR_UNSUPPORTED;
	rr_pf p = {};
	if (pf) {
		/* the chosen experts only while they fit L2 comfortably (batch 8 of GLM-5 would want ~150
		 * MB: the prefetch would evict itself) */
		const double routed = (double)n * k * (2.0 * (double)pf->gate_bytes + (double)pf->down_bytes);
		p.routed = pf->gate && pf->up && pf->down && routed <= 24e6 && (moe_pf_mask() & MOE_PF_ROUTE);
		p.gate = (const uint8_t *)pf->gate, p.up = (const uint8_t *)pf->up;
		p.down = (const uint8_t *)pf->down;
		p.gate_bytes = pf->gate_bytes, p.down_bytes = pf->down_bytes;
		p.shared = pf->sh_gate && pf->sh_up && pf->sh_down && kcuda_prefetch_enabled();
		p.sg = (const uint8_t *)pf->sh_gate, p.su = (const uint8_t *)pf->sh_up;
		p.sd = (const uint8_t *)pf->sh_down;
		p.sg_bytes = pf->sh_gate_bytes, p.sd_bytes = pf->sh_down_bytes;
	}
	const char *rf = getenv("TANDEM_MOE_ROUTE_FAST");
	const bool rx = !(rf && strcmp(rf, "1") == 0);
	const dim3 grid((unsigned)(E / RR_ROWS)), block(RR_ROWS * RR_QW * 32);
	const int nm = norm ? 1 : 0, nn = (int)n;
	unsigned *ticket = c->err_dev + 1; /* ctx.cu: word 1 of err_dev */
	const float *W = (const float *)router->data;
#define RR_CASE(VV)                                                                                          \
	case VV:                                                                                             \
		return klaunch("moe_router_route",                                                           \
		               rx ? moe_router_route_kernel<VV, true> : moe_router_route_kernel<VV, false>,  \
		               grid, block, 0, c->stream, W, router->row_bytes, D, x, ldx, nn, logits, bias, \
		               E, k, n_group, n_group_used, gating, nm, scale, ids, weights, ticket, p)
	switch (V) {
		RR_CASE(1);
		RR_CASE(2);
		RR_CASE(4);
		RR_CASE(8);
		RR_CASE(16);
		RR_CASE(32);
	default: return ERR_UNSUPPORTED;
	}
#undef RR_CASE
}
