/* The router product and the route of 1..8 tokens in ONE launch (kcuda_moe_router_route under
 * TANDEM_MOE_ROUTE_FUSE=1; branch moe6, off by default after the H200 run, see moe_router_fuse_on): the F32
 * router GEMV with gemv3's layout (matmul_gemv3.cu: one row per warp, a cp.async ring of 512-byte slabs
 * filled BEFORE griddepcontrol.wait, K split over a thread-block cluster and summed by the cluster's rank 0
 * in rank order), then the route of every token by the LAST block to finish (a ticket counter, set back to 0
 * by that block), with the route kernel's own device code (route_reg_token, moe_mma_route.cuh).
 *
 * Why: in the batch-1 decode graph (H200, nsys 22:57, /work/gpulogs/run16) the router product
 * (gemv3, 3.3 us per layer on the critical path) was followed by the one-block route kernel (4.5
 * us) for ~2k flops: a kernel boundary (the wait for the whole grid's completion and memory flush,
 * the route's own ramp) plus its logits round trip. Here the route starts as soon as the last
 * cluster has stored its logits: one atomic round trip instead of a grid boundary, one node less.
 * moe4's fused kernel (moe_route.cu, TANDEM_MOE_ROUTER_FUSED=1|2) did the same with a different
 * product (128 blocks of 2 rows in registers) and measured SLOWER in the step (14.1 us per layer
 * against 3.4 + 4.3); this one keeps the product that measured 3.3 us (same slab plan, so the same
 * logits bits as kcuda_matmul_path(KCUDA_MM_F32) where gemv3 picks one row per warp) and adds only
 * the tail. MEASURED (H200, 01:12): no gain in the step, so OFF by default (moe_router_fuse_on).
 *
 * Bits: logits as gemv3 (same per-lane order, same warp sum, same rank-order cluster sum, same
 * split plan: E <= ~520 rows on 132 SMs); ids / weights as kcuda_moe_route on those logits (same
 * device function, RX as TANDEM_MOE_ROUTE_FAST says). Memory order: every thread that stores a
 * logit fences before its block's ticket; the last block fences after it and reads the logits
 * through L2 (__ldcg in route_reg_token). The ticket is the context's last ticket counter (zero
 * between launches; nothing else on the stream runs this kernel concurrently: under PDL a launch two
 * kernels later starts only after this grid has completed). TANDEM_MOE_ROUTE_FUSE=1: taken; unset
 * or 0: not (the caller runs the product and kcuda_moe_route as two launches). */
#include <cooperative_groups.h>
#include <string.h>

#include "kernels/cuda/matmul_impl.cuh"
#include "kernels/cuda/moe_mma.h"
#include "kernels/cuda/moe_mma_route.cuh"

namespace cg = cooperative_groups;

#define RF_NW 4 /* warps per block, one router row each (gemv3's G3_NW with RT 1) */
#define RF_S 8 /* ring stages per warp: up to 7 slabs in flight (gemv3's G3_S(1)) */
#define RF_MAX_SPLIT 8 /* portable cluster size */
#define RF_MAXT 8
#define RF_EMAX 1024 /* the register route's limit (moe_route.cu's ROUTE_EMAX) */

/* ---- the last block's route: route_reg_token's results with a shorter chain per top-k round --------
 * route_reg_token (moe_mma_route.cuh) keeps each lane's best untaken expert; after every round the
 * winning lane rescans its V scores (a dependent chain of ~3 V instructions) and picks the weight out
 * of its registers (V selects), while the other 31 lanes wait: ~8 x 250 cycles at k 8. Here each lane
 * sorts its V candidates once (a bitonic network, depth log2(V)(log2(V)+1)/2: 6 levels at V 8, all
 * lanes at once), so a round is the same arg-max over the lanes' heads plus a shift of the winner's
 * lists. The order is the route's (larger score, then lower id) and the sums and the normalisation are
 * route_reg_token's, so ids and weights are its bits; a token with a NaN score anywhere (where the
 * rescan's order is not a total one) takes route_reg_token itself. TANDEM_MOE_ROUTE_SORT=0: always
 * route_reg_token. */

/* candidate (v, i) before (w, j): a valid one (id >= 0) before an invalid one, then the larger
 * score, then the lower id */
__device__ __forceinline__ bool rf_before(float v, int i, float w, int j)
{
	if (j < 0)
		return i >= 0;
	if (i < 0)
		return false;
	return v > w || (v == w && i < j);
}

/* order elements a, b (compile-time indices after unrolling) so that a comes first */
template <int V>
__device__ __forceinline__ void rf_ce(float (&sv)[V], int (&si)[V], float (&sp)[V], int a, int b)
{
	const bool sw = rf_before(sv[b], si[b], sv[a], si[a]);
	const float v = sv[a], pp = sp[a];
	const int i = si[a];
	sv[a] = sw ? sv[b] : sv[a], si[a] = sw ? si[b] : si[a], sp[a] = sw ? sp[b] : sp[a];
	sv[b] = sw ? v : sv[b], si[b] = sw ? i : si[b], sp[b] = sw ? pp : sp[b];
}

template <int V, bool RX>
__device__ __forceinline__ void rf_route_token(const float *lg, const float *__restrict__ bias, int E, int k,
                                               int n_group, int n_group_used, int gating, int norm,
                                               float scale, int32_t *oi, float *ow, const float (&bj)[V])
{
	const int lane = threadIdx.x & 31;
	const int e0 = lane * V;
	float p[V], sel[V];
	/* probabilities, selection scores and the group limit: route_reg_token's own code */
	route_scores<V>(lg, bj, E, n_group, n_group_used, gating, p, sel);
	bool fin = true;
	int si[V];
#pragma unroll
	for (int j = 0; j < V; j++) {
		si[j] = e0 + j < E ? e0 + j : -1;
		fin &= si[j] < 0 || sel[j] == sel[j];
	}
	if (!__all_sync(0xffffffffu, fin)) { /* a NaN score: the rescan's own order */
		route_reg_token<V, RX>(lg, bias, E, k, n_group, n_group_used, gating, norm, scale, oi, ow);
		return;
	}
	/* each lane's candidates in the route's order (bitonic network, indices fixed at compile time) */
#pragma unroll
	for (int kk = 2; kk <= V; kk <<= 1)
#pragma unroll
		for (int jj = kk >> 1; jj > 0; jj >>= 1)
#pragma unroll
			for (int i = 0; i < V; i++) {
				const int l = i ^ jj;
				if (l > i) {
					if ((i & kk) == 0)
						rf_ce<V>(sel, si, p, i, l);
					else
						rf_ce<V>(sel, si, p, l, i);
				}
			}
	int my_id = -1;
	float my_w = 0.0f;
	double sum = 0.0;
	for (int i = 0; i < k; i++) {
		int id = si[0];
		if (RX) { /* route_reg_token's redux.sync arg-max over the lanes' heads */
			const float c = sel[0] + 0.0f; /* -0 -> +0: they tie, as under the CPU's > */
			unsigned key = 0u;
			if (si[0] >= 0) {
				const unsigned u = __float_as_uint(c);
				key = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
			}
			const unsigned m = __reduce_max_sync(0xffffffffu, key);
			const unsigned bal = __ballot_sync(0xffffffffu, si[0] >= 0 && key == m);
			id = __shfl_sync(0xffffffffu, si[0], __ffs(bal) - 1);
		} else {
			float v = sel[0];
			route_argmax(v, id);
		}
		const int src = id >= 0 ? id / V : 0;
		const float pw0 = __shfl_sync(0xffffffffu, p[0], src);
		const float pw = id >= 0 ? pw0 : 0.0f;
		if (id >= 0 && lane == src) { /* the winner drops its head */
#pragma unroll
			for (int j = 0; j + 1 < V; j++)
				sel[j] = sel[j + 1], si[j] = si[j + 1], p[j] = p[j + 1];
			si[V - 1] = -1;
		}
		sum += (double)pw; /* in selection order, as the CPU */
		if (lane == i)
			my_id = id, my_w = pw;
	}
	route_store(lane, k, norm, sum, scale, my_id, my_w, oi, ow);
}

/* TANDEM_MOE_ROUTE_SORT=0: the last block runs route_reg_token itself */
static bool rf_sort_on(void)
{
	const char *v = getenv("TANDEM_MOE_ROUTE_SORT");
	return !(v && strcmp(v, "0") == 0);
}

/* grid (ceil(E / RF_NW), n_split), cluster (1, n_split) when n_split > 1. Block (bx, s): rows
 * RF_NW bx .. + RF_NW - 1, slabs [s sps, min((s + 1) sps, n_slab)). */
template <int NT, int V, bool RX>
__global__ void __launch_bounds__(RF_NW * 32)
    moe_router_fuse_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int E, int n_slab, int sps,
                           const float *__restrict__ x, int64_t ldx, int n_tok, float *logits,
                           const float *__restrict__ bias, int k, int n_group, int n_group_used, int gating,
                           int norm, float scale, int32_t *ids, float *weights, unsigned *ticket, int pf,
                           int rsort)
{
	constexpr int SE = g3t<KT_F32>::SE, SB = g3t<KT_F32>::SB, EPL = g3t<KT_F32>::EPL;
	constexpr int RING = RF_S * SB + 16;
	extern __shared__ __align__(16) uint8_t rf_smem[];
	__shared__ float part[RF_NW][NT];
	__shared__ int s_last;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int row0 = blockIdx.x * RF_NW + warp;
	const int slab0 = blockIdx.y * sps;
	const int nsl = min(sps, n_slab - slab0);
	uint8_t *ring = rf_smem + warp * RING;
	const uint8_t *rp = w + (size_t)min(row0, E - 1) * row_bytes + (size_t)slab0 * SB;
	const float *xp = x + (size_t)slab0 * SE + EPL * lane;

	/* weights only until KDEP_ENTRY() (cuda_common.cuh): the ring's first RF_S - 1 slabs, the rest
	 * of a long K range and the correction bias into L2 */
	if (pf) {
		if (lane == 0 && nsl > RF_S - 1 && row0 < E)
			kdep_prefetch_l2(rp + (size_t)(RF_S - 1) * SB, (size_t)(nsl - (RF_S - 1)) * SB);
		if (bias && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0)
			kdep_prefetch_l2(bias, (size_t)E * sizeof(float));
	}
	auto issue = [&](int i) { /* 512 bytes: one 16-byte copy per lane */
		                  g3_cp16(ring + (i % RF_S) * SB + 16 * lane,
		                          rp + (size_t)i * SB + 16 * lane);
	};
#pragma unroll
	for (int i = 0; i < RF_S - 1; i++) {
		if (i < nsl)
			issue(i);
		g3_commit(); /* empty groups keep the wait count uniform */
	}
	KDEP_ENTRY();
	xp = kdep_after(xp); /* x (the norm's output) only from here on */

	float acc[NT];
#pragma unroll
	for (int t = 0; t < NT; t++)
		acc[t] = 0.0f;
	/* One token and the usual plan (a block's K range fits the ring: every slab was issued before
	 * the wait): x of all its slabs in flight at once, one L2 round trip, then the slabs in order.
	 * gemv3's loop below loads x slab by slab, each load after the previous slab's sums: one
	 * dependent L2 round trip per slab (6 at GLM-5's plan, 7 at DS-V3's). Same operations in the
	 * same order as the loop, so the same bits. */
	bool done = false;
	if constexpr (NT == 1) {
		if (nsl <= RF_S - 1) {
			float4 xq[RF_S - 1];
#pragma unroll
			for (int i = 0; i < RF_S - 1; i++)
				xq[i] = i < nsl ? __ldg((const float4 *)(xp + (size_t)i * SE))
				                : make_float4(0.f, 0.f, 0.f, 0.f);
			g3_wait<0>(); /* this lane's copies */
			__syncwarp(); /* ... and every lane's */
#pragma unroll
			for (int i = 0; i < RF_S - 1; i++)
				if (i < nsl) {
					g3_row<KT_F32> wr;
					g3_decode<KT_F32>(ring + i * SB, lane, wr); /* slab i is in stage i */
					const float xv[EPL] = {xq[i].x, xq[i].y, xq[i].z, xq[i].w};
					float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
					for (int q = 0; q < EPL; q += 2) {
						s0 = fmaf(wr.v[q], xv[q], s0);
						s1 = fmaf(wr.v[q + 1], xv[q + 1], s1);
					}
					acc[0] = fmaf(wr.d, s0 + s1, acc[0]);
				}
			done = true;
		}
	}
	for (int i = 0; !done && i < nsl; i++) {
		if (i + RF_S - 1 < nsl)
			issue(i + RF_S - 1);
		g3_commit();
		float xv[NT][EPL];
#pragma unroll
		for (int t = 0; t < NT; t++) {
			if (t < n_tok) {
				const float4 f = __ldg((const float4 *)(xp + t * ldx + (size_t)i * SE));
				xv[t][0] = f.x, xv[t][1] = f.y, xv[t][2] = f.z, xv[t][3] = f.w;
			} else {
#pragma unroll
				for (int q = 0; q < EPL; q++)
					xv[t][q] = 0.0f;
			}
		}
		g3_wait<RF_S - 1>(); /* this lane's copy of slab i is done */
		__syncwarp(); /* ... and every lane's is visible */
		g3_row<KT_F32> wr;
		g3_decode<KT_F32>(ring + (i % RF_S) * SB, lane, wr);
#pragma unroll
		for (int t = 0; t < NT; t++) {
			float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
			for (int q = 0; q < EPL; q += 2) {
				s0 = fmaf(wr.v[q], xv[t][q], s0);
				s1 = fmaf(wr.v[q + 1], xv[t][q + 1], s1);
			}
			acc[t] = fmaf(wr.d, s0 + s1, acc[t]);
		}
		__syncwarp(); /* stage i % RF_S is refilled in the next iteration */
	}
	g3_wait<0>();
#pragma unroll
	for (int t = 0; t < NT; t++) {
		const float s = kc_warp_sum(acc[t]);
		if (lane == 0)
			part[warp][t] = s;
	}
	const int rb0 = blockIdx.x * RF_NW;
	if (gridDim.y == 1) {
		__syncthreads();
		for (int e = threadIdx.x; e < RF_NW * NT; e += RF_NW * 32) {
			const int r = e / NT, t = e % NT;
			if (t < n_tok && rb0 + r < E) {
				logits[(int64_t)t * E + rb0 + r] = part[r][t];
				__threadfence(); /* before this block's ticket */
			}
		}
	} else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
		cg::cluster_group cl = cg::this_cluster();
		cl.sync(); /* every block's partials are written */
		const bool r0 = cl.block_rank() == 0;
		if (r0) {
			const int ns = (int)cl.num_blocks();
			for (int e = threadIdx.x; e < RF_NW * NT; e += RF_NW * 32) {
				const int r = e / NT, t = e % NT;
				float s = 0.0f;
				for (int q = 0; q < ns; q++) /* rank order: deterministic, gemv3's bits */
					s += *cl.map_shared_rank(&part[r][t], q);
				if (t < n_tok && rb0 + r < E) {
					logits[(int64_t)t * E + rb0 + r] = s;
					__threadfence();
				}
			}
		}
		cl.sync(); /* rank 0 has read the others' shared memory before they exit */
		if (!r0)
			return;
#endif
	}
	/* the routing warps' bias (a weight) in flight during the ticket's round trip */
	float bj[V];
#pragma unroll
	for (int j = 0; j < V; j++)
		bj[j] = 0.0f;
	if (rsort && bias && warp < n_tok) {
#pragma unroll
		for (int j = 0; j < V; j++)
			bj[j] = lane * V + j < E ? __ldg(bias + lane * V + j) : 0.0f;
	}
	/* one block per row tile (the cluster's rank 0) takes a ticket; the last one routes */
	__syncthreads();
	if (threadIdx.x == 0) {
		__threadfence();
		s_last = atomicAdd(ticket, 1u) == gridDim.x - 1;
	}
	__syncthreads();
	if (!s_last)
		return;
	if (threadIdx.x == 0)
		*ticket = 0u; /* for the next launch or graph replay */
	__threadfence(); /* the other blocks' logits, after their tickets */
	for (int t = warp; t < n_tok; t += RF_NW)
		if (rsort)
			rf_route_token<V, RX>(logits + (int64_t)t * E, bias, E, k, n_group, n_group_used,
			                      gating, norm, scale, ids + (int64_t)t * k,
			                      weights + (int64_t)t * k, bj);
		else
			route_reg_token<V, RX>(logits + (int64_t)t * E, bias, E, k, n_group, n_group_used,
			                       gating, norm, scale, ids + (int64_t)t * k,
			                       weights + (int64_t)t * k);
}

/* OFF by default since the H200 run of 01:12 (2026-11-30): bench_cuda_moe six at batch 1, router + route
 * behind a producer, 9.31 us per layer against 9.72 for the two launches, but the decode step 7.50 / 7.42
 * ms with it against 7.38 without (batch 8: 19.71 / 19.48 against 19.57): no gain. TANDEM_MOE_ROUTE_FUSE=1
 * takes it (the product and the route kernel as two launches otherwise). */
bool moe_router_fuse_on(void)
{
	const char *v = getenv("TANDEM_MOE_ROUTE_FUSE");
	return v && strcmp(v, "1") == 0;
}

template <int NT, int V, bool RX>
static int rf_launch(struct kcuda_ctx *c, const struct kweight *router, const float *x, int64_t ldx, int n,
                     float *logits, const float *bias, int E, int k, int n_group, int n_group_used,
                     int gating, int norm, float scale, int32_t *ids, float *weights, int n_split, int sps,
                     int n_slab)
{
	unsigned *ticket = c->tickets + (KCUDA_N_TICKETS - 1); /* the last counter: ours alone */
	return klaunch_cl("moe_router_fuse", moe_router_fuse_kernel<NT, V, RX>,
	                  dim3((unsigned)((E + RF_NW - 1) / RF_NW), (unsigned)n_split, 1),
	                  dim3(RF_NW * 32, 1, 1), (size_t)RF_NW * (RF_S * g3t<KT_F32>::SB + 16), c->stream,
	                  n_split > 1 ? dim3(1, (unsigned)n_split, 1) : dim3(0),
	                  (const uint8_t *)router->data, router->row_bytes, E, n_slab, sps, x, ldx, n, logits,
	                  bias, k, n_group, n_group_used, gating, norm, scale, ids, weights, ticket,
	                  kcuda_prefetch_enabled(), rf_sort_on() ? 1 : 0);
}

template <int NT, bool RX>
static int rf_launch_v(struct kcuda_ctx *c, int V, const struct kweight *router, const float *x, int64_t ldx,
                       int n, float *logits, const float *bias, int E, int k, int n_group, int n_group_used,
                       int gating, int norm, float scale, int32_t *ids, float *weights, int n_split, int sps,
                       int n_slab)
{
#define RF_V(VV)                                                                                             \
	case VV:                                                                                             \
		return rf_launch<NT, VV, RX>(c, router, x, ldx, n, logits, bias, E, k, n_group,              \
		                             n_group_used, gating, norm, scale, ids, weights, n_split, sps,  \
		                             n_slab)
	switch (V) {
		RF_V(1);
		RF_V(2);
		RF_V(4);
		RF_V(8);
		RF_V(16);
		RF_V(32);
	default: return ERR_UNSUPPORTED;
	}
#undef RF_V
}

int moe_router_fuse(struct kcuda_ctx *c, const struct kweight *router, const float *x, int64_t ldx, int64_t n,
                    float *logits, const float *bias, int E, int k, int n_group, int n_group_used, int gating,
                    bool norm, float scale, int32_t *ids, float *weights)
{
	if (!moe_router_fuse_on() || !c->tickets)
		return ERR_UNSUPPORTED;
	constexpr int SE = g3t<KT_F32>::SE;
	const int64_t D = router->n_in;
	if (router->type != KT_F32 || !router->data || router->n_out != E || n < 1 || n > RF_MAXT || E < 1 ||
	    E > RF_EMAX || D < SE || D % SE || D / SE > 0x7fffffff || router->row_bytes < (size_t)D * 4 ||
	    router->row_bytes % 16 || (uintptr_t)router->data % 16 || (uintptr_t)x % 16 || ldx % 4 || ldx < D)
		return ERR_UNSUPPORTED;
	const int V = moe_route_reg_v(E, k, n_group, n_group_used);
	if (!V)
		return ERR_UNSUPPORTED;
	/* gemv3's plan for one row per warp (g3_plan_launch with rt 1): split K until ~4 blocks per SM,
	 * at most RF_MAX_SPLIT ways, every split non-empty; the same plan gives the same logits bits */
	const int64_t n_slab = D / SE;
	const int64_t n_sm = c->n_sm > 0 ? c->n_sm : 1;
	const char *sp = getenv("TANDEM_GEMV3_SPLIT");
	const bool cluster_ok = kcuda_cc_major(c->device) >= 9 && !(sp && strcmp(sp, "0") == 0);
	const int64_t max_split = cluster_ok ? (n_slab < RF_MAX_SPLIT ? n_slab : RF_MAX_SPLIT) : 1;
	const int64_t tiles = (E + RF_NW - 1) / RF_NW;
	int64_t want = (4 * n_sm + tiles - 1) / tiles;
	want = want > max_split ? max_split : want < 1 ? 1 : want;
	const int64_t sps = (n_slab + want - 1) / want;
	const int n_split = (int)((n_slab + sps - 1) / sps);
	const char *rf = getenv("TANDEM_MOE_ROUTE_FAST");
	const bool rx = !(rf && strcmp(rf, "1") == 0); /* as kcuda_moe_route */
	const int nn = (int)n, nm = norm ? 1 : 0;
	if (n == 1)
		return rx ? rf_launch_v<1, true>(c, V, router, x, ldx, nn, logits, bias, E, k, n_group,
		                                 n_group_used, gating, nm, scale, ids, weights, n_split,
		                                 (int)sps, (int)n_slab)
		          : rf_launch_v<1, false>(c, V, router, x, ldx, nn, logits, bias, E, k, n_group,
		                                  n_group_used, gating, nm, scale, ids, weights, n_split,
		                                  (int)sps, (int)n_slab);
	return rx ? rf_launch_v<RF_MAXT, true>(c, V, router, x, ldx, nn, logits, bias, E, k, n_group,
	                                       n_group_used, gating, nm, scale, ids, weights, n_split,
	                                       (int)sps, (int)n_slab)
	          : rf_launch_v<RF_MAXT, false>(c, V, router, x, ldx, nn, logits, bias, E, k, n_group,
	                                        n_group_used, gating, nm, scale, ids, weights, n_split,
	                                        (int)sps, (int)n_slab);
}
