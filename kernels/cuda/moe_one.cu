/* The batch-1 expert products of moe_small.cu (one token, Q4_K / Q5_K experts): the same unit
 * arithmetic as moe_small's one-tile gate / up and its down + combine (gemv_mma.cuh's K-quant unit
 * on the tensor cores, so the same bits), with the weight stream issued up front.
 *
 * Why: at batch 1 the small path's gate / up took 13.9 us and down 8.3 us per layer on the
 * critical path (H200, nsys, 20:15) for 16 + 8 MB: ~1.1 TB/s of a 4.55 TB/s read rate. Each warp
 * there walks its 3 units of D as load -> stage x (an L2 round trip) -> 32 mma steps, one after the
 * other: ~2.3 KB in flight per warp, three DRAM round trips in series, and at 2 blocks per SM the
 * 288 blocks of 8 warps ran in more than one wave. Here:
 *   gate / up, grid (F / 8, pairs), 8 warps, 3 blocks per SM (one wave of 288 at GLM-5's rank
 *     slice): block = 8 f rows of gate and of up of one pair (pair p < k: routed expert ids[p];
 *     p = k: the shared expert); warp w owns units w, w + 8, ... of D. Right after the expert is
 *     known every warp issues ALL its weight bytes: the first unit into registers (plain loads),
 *     the others into shared memory with cp.async (one commit group per unit), and its slice of x
 *     (cp.async, one group). The shared expert's blocks issue their weights before KDEP_ENTRY
 *     (weights only: cuda_common.cuh). x is turned into the tensor-core B fragments in place (one
 *     token: only the hi / lo columns, 1 KB per unit) while the weights land; the units then run
 *     as their groups complete. So the whole 16 MB is in flight at once (the GPU needs ~5 MB to
 *     cover DRAM latency) and the chain after the wait is ids -> weights, one round trip.
 *   down + combine, grid (D / 16), 9 warps: warp p owns pair p (16 rows x F = 256: one unit), its
 *     weights cp.async'd into shared memory; the shared expert's before KDEP_ENTRY, and with
 *     MO_EARLY the routed ones too (see moe_one_down_kernel: ids and weights are read before the
 *     wait, which is sound only because the kernel before this one is gate / up, whose blocks all
 *     wait for the route before they trigger); then h (after the wait), the unit, and
 *     out[d] = sum_j w_j y_j[d] in slot order + the shared expert's y (moe_small's formula).
 * The fp16 range: a unit whose largest |x| reaches 2^15 is staged times a power of two and its
 * partial sums multiplied back (gm_xscale; the same factor moe_small's vote gives).
 * Switches (moe_mma.h): TANDEM_MOE_SMALL_V=old (both old kernels), new (both new, and the route
 * folded in: kcuda_moe_route_ffn1), gu / dn (only that half new); default: old (moe_one_mode says
 * why); TANDEM_MOE_ONE_EARLY=1 (down reads ids before its wait; off by default). */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/moe_mma.h"
#include "kernels/cuda/moe_one.cuh"
#include "kernels/cuda/prof.h"

#define MO_W 8 /* warps per gate / up block (units of D: warp w takes w, w + 8, ...) */
#define MO_UPW_MAX 4 /* units of D per warp: D <= 8192 */
#define MO_DW 9 /* warps per down block: pairs (8 routed + the shared expert) */
#define MO_EARLY 1 /* down: ids / weights of the routed experts before the wait */
#define MO_PF_SH 2 /* the shared expert's weights before the wait (TANDEM_PREFETCH) */

/* grid (F / 8, np), MO_W warps; dynamic shared memory: MO_W x (UPW - 1) weight slots of 16 rows,
 * then MO_W x UPW units of x (1 KB each). Block (f0 = 8 blockIdx.x, pair p) writes
 * h[p][f0 .. f0 + 7] = SiLU(gate) up; a pair with an id out of range writes nothing (the down
 * kernel reports it). */
template <int T, int UPW, bool RT>
__global__ void __launch_bounds__(MO_W * 32, T == KT_Q4_K ? 3 : 2)
    moe_one_gate_up_kernel(const uint8_t *__restrict__ wg, const uint8_t *__restrict__ wu,
                           const uint8_t *__restrict__ sg, const uint8_t *__restrict__ su, size_t rb, int E,
                           int64_t F, int n_units, const float *x, const int32_t *ids, int np_r,
                           float *__restrict__ h, int flags, mo_rt rt)
{
	constexpr int BYTES = T == KT_Q5_K ? 176 : 144, CH = BYTES / 16, SLOT = 16 * BYTES;
	extern __shared__ __align__(16) uint8_t mo_smem[];
	__shared__ float part[MO_W][16];
	__shared__ float xsf[MO_W][UPW];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, p = (int)blockIdx.y;
	const int g = lane >> 2, t = lane & 3;
	const int64_t f0 = (int64_t)blockIdx.x * 8;
	uint8_t *wsm = mo_smem + (size_t)warp * (UPW - 1) * SLOT;
	float *xsm = (float *)(mo_smem + (size_t)MO_W * (UPW - 1) * SLOT) + (size_t)warp * UPW * 256;
	const bool shared = p >= np_r;
	gm_k45_w<T, 1> wr; /* the warp's first unit, in registers */
	/* every weight byte of the warp: unit j 0 into registers, j >= 1 into slot j - 1 (one group each,
	 * empty for units past D so every thread commits the same number of groups) */
	auto issue_w = [&](const uint8_t *bg, const uint8_t *bu) {
		const uint8_t *rows[1][2] = {{bg + (size_t)(f0 + g) * rb, bu + (size_t)(f0 + g) * rb}};
		if (warp < n_units)
			gm_k45_load<T, 1>(wr, rows, warp, t);
#pragma unroll
		for (int j = 1; j < UPW; j++) {
			const int u = warp + MO_W * j;
			if (u < n_units)
				for (int i = lane; i < 16 * CH; i += 32) {
					const int rr = i / CH, c = i % CH; /* rows 0..7 gate, 8..15 up */
					const uint8_t *src = (rr < 8 ? bg : bu) +
					                     (size_t)(f0 + (rr & 7)) * rb +
					                     (size_t)BYTES * u + 16 * c;
					mo_cp16(wsm + (j - 1) * SLOT + rr * BYTES + 16 * c, src);
				}
			mo_commit();
		}
	};
	auto issue_x = [&](const float *xp) {
#pragma unroll
		for (int j = 0; j < UPW; j++) {
			const int u = warp + MO_W * j;
			if (u < n_units)
				for (int i = lane; i < 64; i += 32)
					mo_cp16(xsm + 256 * j + 4 * i, xp + 256 * (int64_t)u + 4 * i);
		}
		mo_commit();
	};
	const bool early = shared && (flags & MO_PF_SH);
	if (early) /* weights: before the wait */
		issue_w(sg, su);
	KDEP_ENTRY();
	x = kdep_after(x);
	ids = kdep_after(ids);
	if (early) {
		issue_x(x);
		mo_wait<0>();
	} else {
		const uint8_t *bg = sg, *bu = su;
		issue_x(x); /* x first: it is ready now, the weights need the id */
		if (!shared) {
			int e;
			if (RT) { /* the route by warp 0 (the logits are the last launch's output) */
				__shared__ int s_id[32];
				__shared__ float s_w[32];
				if (warp == 0) {
					route_reg_token<MO_RV, true>(kdep_after(rt.lg), rt.bias, E, rt.k,
					                             rt.n_group, rt.n_group_used, rt.gating,
					                             rt.norm, rt.scale, s_id, s_w);
					if (blockIdx.x == 0 && blockIdx.y == 0 && lane < rt.k)
						rt.ids[lane] = s_id[lane], rt.wts[lane] = s_w[lane];
				}
				__syncthreads();
				e = s_id[p];
			} else
				e = ids[p];
			if (e < 0 || e >= E) { /* block-uniform */
				mo_wait<0>();
				return;
			}
			bg = wg + (size_t)e * (size_t)F * rb, bu = wu + (size_t)e * (size_t)F * rb;
		}
		issue_w(bg, bu);
		mo_wait_rt(UPW - 1); /* x's group is the oldest */
	}
	__syncwarp();
#pragma unroll
	for (int j = 0; j < UPW; j++)
		if (warp + MO_W * j < n_units) {
			const float f = mo_stage_unit(xsm + 256 * j, lane);
			if (lane == 0)
				xsf[warp][j] = f;
		}
	__syncwarp();
	float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
	for (int j = 0; j < UPW; j++) {
		if (warp + MO_W * j >= n_units)
			break;
		const uint2 *fr = (const uint2 *)(xsm + 256 * j);
		if (j == 0)
			mo_k45_math<T>(acc, wr, fr, xsf[warp][0], lane);
		else {
			if (!early)
				mo_wait_rt(UPW - 1 - j);
			__syncwarp(); /* the other lanes' copies of this slot are visible */
			gm_k45_w<T, 1> ws;
			mo_k45_lds<T>(ws, wsm + (j - 1) * SLOT, g, t);
			mo_k45_math<T>(acc, ws, fr, xsf[warp][j], lane);
		}
	}
	if (t == 0) { /* lane (g, 0): row g (gate f0 + g) and g + 8 (up), columns hi / lo */
		part[warp][g] = fmaf(acc[1], 1.f / 2048.f, acc[0]);
		part[warp][8 + g] = fmaf(acc[3], 1.f / 2048.f, acc[2]);
	}
	__syncthreads();
	if (threadIdx.x < 8) {
		float gs = 0.f, us = 0.f;
#pragma unroll
		for (int w = 0; w < MO_W; w++) {
			gs += part[w][threadIdx.x];
			us += part[w][8 + threadIdx.x];
		}
		h[(int64_t)p * F + f0 + threadIdx.x] = gs / (1.0f + expf(-gs)) * us;
	}
}

/* grid (D / 16), MO_DW warps (warp p: pair p < np <= MO_DW), F = 256 (one unit per row); dynamic
 * shared memory: MO_DW weight slots of 16 rows, then MO_DW units of h. out[d], d = 16 blockIdx.x
 * .. + 15, = sum_j w_j y_j[d] in slot order (NaN for an id out of range, counted by block 0), plus
 * the shared expert's y when np > np_r.
 * MO_EARLY: the routed pairs' ids and weights are read BEFORE griddepcontrol.wait, against the
 * rule of cuda_common.cuh, and only here: ids / wts are written by the route kernel two launches
 * back; the launch right before this one is moe_one_gate_up_kernel or moe_small_gate_up_kernel,
 * whose every block executes griddepcontrol.wait (which returns only once the route grid has
 * completed and its memory is flushed) before its launch_dependents, and this grid cannot start
 * before all of them have triggered. The loads go to L2 (ld.global.cg), so no stale L1 line of an
 * earlier layer's ids can answer. Off by default; on: TANDEM_MOE_ONE_EARLY=1 (whenever PDL is off it
 * changes nothing). RT: the same for the router logits (written by the router product, the launch before
 * gate / up): warp 0 routes the token itself (route_reg_token, ld.global.cg), no ids are read. */
template <int T, bool RT>
__global__ void __launch_bounds__(MO_DW * 32, 3)
    moe_one_down_kernel(const uint8_t *__restrict__ wd, const uint8_t *__restrict__ sd, size_t rb, int E,
                        int64_t D, const float *h, const int32_t *ids, const float *wts, int np_r, int np,
                        float *__restrict__ out, unsigned *err, int flags, mo_rt rt)
{
	constexpr int BYTES = T == KT_Q5_K ? 176 : 144, CH = BYTES / 16, SLOT = 16 * BYTES;
	extern __shared__ __align__(16) uint8_t mo_smem[];
	__shared__ float ys[MO_DW][16];
	__shared__ float wsh[MO_DW];
	__shared__ int es[MO_DW];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, p = warp;
	const int g = lane >> 2, t = lane & 3;
	const int64_t row0 = (int64_t)blockIdx.x * 16;
	uint8_t *slot = mo_smem + (size_t)warp * SLOT;
	float *hb = (float *)(mo_smem + (size_t)MO_DW * SLOT) + (size_t)warp * 256;
	auto issue_w = [&](const uint8_t *base) {
		for (int i = lane; i < 16 * CH; i += 32) {
			const int rr = i / CH, c = i % CH;
			mo_cp16(slot + rr * BYTES + 16 * c,
			        base + (size_t)min(row0 + rr, D - 1) * rb + 16 * c);
		}
		mo_commit();
	};
	const bool sh = p >= np_r && p < np;
	bool issued = false;
	/* the pairs' experts and weights into es / wsh, and this warp's routed rows issued: from ids /
	 * wts (ld.global.cg before the wait), or (RT) routed by warp 0 from the logits */
	auto routes = [&](const float *lg, const int32_t *ip, const float *wp, bool cg) {
		if (RT) {
			__shared__ int s_id[32];
			__shared__ float s_w[32];
			if (warp == 0)
				route_reg_token<MO_RV, true>(lg, rt.bias, E, rt.k, rt.n_group,
				                             rt.n_group_used, rt.gating, rt.norm, rt.scale,
				                             s_id, s_w);
			__syncthreads();
			if (threadIdx.x < np) {
				const int i = threadIdx.x;
				es[i] = mo_expert(i < np_r ? s_id[i] : E, i < np_r, E);
				wsh[i] = i < np_r ? s_w[i] : 1.0f;
			}
			__syncthreads();
		} else if (threadIdx.x < np) {
			const int i = threadIdx.x;
			es[i] = mo_expert(i < np_r ? (cg ? __ldcg(ip + i) : ip[i]) : E, i < np_r, E);
			wsh[i] = i < np_r ? (cg ? __ldcg(wp + i) : wp[i]) : 1.0f;
		}
		if (p < np_r) {
			const int e = RT ? es[p] : mo_expert(cg ? __ldcg(ip + p) : ip[p], true, E);
			if (e >= 0) {
				issue_w(wd + (size_t)e * (size_t)D * rb);
				issued = true;
			}
		}
	};
	if (sh && (flags & MO_PF_SH)) { /* weights: before the wait */
		issue_w(sd);
		issued = true;
	}
	if (flags & MO_EARLY) /* see the comment above the kernel */
		routes(rt.lg, ids, wts, true);
	KDEP_ENTRY();
	h = kdep_after(h);
	ids = kdep_after(ids);
	wts = kdep_after(wts);
	if (!(flags & MO_EARLY))
		routes(kdep_after(rt.lg), ids, wts, false);
	if (sh && !issued) {
		issue_w(sd);
		issued = true;
	}
	if (issued) {
		for (int i = lane; i < 64; i += 32)
			mo_cp16(hb + 4 * i, h + (int64_t)p * 256 + 4 * i);
		mo_commit();
		mo_wait<0>();
		__syncwarp();
		const float f = mo_stage_unit(hb, lane);
		gm_k45_w<T, 1> W;
		mo_k45_lds<T>(W, slot, g, t);
		float acc[4] = {0.f, 0.f, 0.f, 0.f};
		mo_k45_math<T>(acc, W, (const uint2 *)hb, f, lane);
		if (t == 0) {
			ys[p][g] = fmaf(acc[1], 1.f / 2048.f, acc[0]);
			ys[p][8 + g] = fmaf(acc[3], 1.f / 2048.f, acc[2]);
		}
	}
	__syncthreads();
	if (blockIdx.x == 0 && threadIdx.x < np_r && es[threadIdx.x] < 0)
		atomicAdd(err, 1u);
	if (threadIdx.x < 16) {
		const int rr = threadIdx.x;
		const int64_t d = row0 + rr;
		if (d < D) {
			float s = 0.0f;
			for (int j = 0; j < np_r; j++)
				s = es[j] >= 0 ? fmaf(wsh[j], ys[j][rr], s) : NAN;
			if (np > np_r)
				s += ys[np_r][rr];
			out[d] = s;
		}
	}
}

/* ---- host ------------------------------------------------------------------------------------- */

/* Default: only the down kernel new. H200, 22:13 run (bench_cuda_moe one, routed + shared, batch 1,
 * us per call): moe_small's kernels 22.10, both new 24.08, only gate / up new 25.57, only down new
 * 21.28; the batch-1 step 9.89 ms with the old kernels, 10.04 with both new (+ the route fold), 9.89
 * with only down new. So the new gate / up body loses ~3 us: with all 16 MB issued at once every
 * warp's units land near the end of the stream and the ~2 us of unit math per SM runs after it
 * instead of beside it (moe_small's warps, one unit at a time, overlap one warp's math with the
 * others' loads).
 * Since the 23:00 run the default is the old kernels for both halves: with its early ids read off
 * (see mo_flags) the down kernel measured 23.23 us against the old 21.32 in the same bench, and the
 * step was the same either way (7.45 vs 7.44 ms); TANDEM_MOE_SMALL_V=dn selects it. */
int moe_one_mode(void)
{
	const char *v = getenv("TANDEM_MOE_SMALL_V");
	if (v && strcmp(v, "old") == 0)
		return 0;
	if (v && strcmp(v, "gu") == 0)
		return MOE_ONE_GU;
	if (v && strcmp(v, "new") == 0)
		return MOE_ONE_GU | MOE_ONE_DN;
	if (v && strcmp(v, "dn") == 0)
		return MOE_ONE_DN;
	return 0;
}

static int mo_flags(bool down)
{
	int f = kcuda_prefetch_enabled() ? MO_PF_SH : 0;
	if (down) {
		/* off by default (lead, session 5): the early ids read relies on the kernel before it
		 * (gate / up) triggering only after its own wait; a kernel that triggers before its wait
		 * (fused.cu's early triggers, or the KDEP_EARLY_ALL experiment, which FAILED
		 * test_gpu_model) would let it read the route's ids before the route finished. The step
		 * measured no difference with it on. TANDEM_MOE_ONE_EARLY=1 turns it on. */
		const char *v = getenv("TANDEM_MOE_ONE_EARLY");
		if (v && strcmp(v, "1") == 0)
			f |= MO_EARLY;
	}
	return f;
}

/* TANDEM_MOE_ONE_CARVE=0: no shared-memory carveout preference (the driver's choice; read when a
 * kernel is first launched in the process). Whether the largest carveout (so 3 gate / up blocks of
 * ~62 KB fit an SM) costs more than it gives next to kernels with another carveout under PDL is not
 * measured yet. */
static bool mo_carve(void)
{
	const char *v = getenv("TANDEM_MOE_ONE_CARVE");
	return !(v && strcmp(v, "0") == 0);
}

static int mo_upw(int64_t n_units)
{
	return (int)((n_units + MO_W - 1) / MO_W);
}

static size_t mo_gu_smem(int type, int upw)
{
	const size_t bytes = type == KT_Q5_K ? 176 : 144;
	return (size_t)MO_W * (size_t)(upw - 1) * 16 * bytes + (size_t)MO_W * (size_t)upw * 1024;
}

bool moe_one_gate_up_fits(const struct kcuda_ctx *c, int type, int64_t D, int64_t F, int np)
{
	if ((type != KT_Q4_K && type != KT_Q5_K) || D % 256 || F % 8 || D < 256 || np < 1 || np > 65535)
		return false;
	const int upw = mo_upw(D / 256);
	/* (+ 1 KB for the static part) */
	return upw >= 1 && upw <= MO_UPW_MAX &&
	       mo_gu_smem(type, upw) + 1024 <= (size_t)kcuda_smem_optin(c->device);
}

bool moe_one_down_fits(int type, int64_t F, int np)
{
	return (type == KT_Q4_K || type == KT_Q5_K) && F == 256 && np >= 1 && np <= MO_DW;
}

/* the fold-in route's arguments (RT), or an empty one */
static mo_rt mo_rt_of(const struct moe_one_args *a)
{
	mo_rt r;
	memset(&r, 0, sizeof(r));
	if (a->route) {
		r.lg = a->route->logits, r.bias = a->route->bias, r.k = a->np_r,
		r.n_group = a->route->n_group;
		r.n_group_used = a->route->n_group_used, r.gating = a->route->gating, r.norm = a->route->norm;
		r.scale = a->route->scale, r.ids = a->route->ids, r.wts = a->route->weights;
	}
	return r;
}

template <int T, int UPW, bool RT> static int mo_gu_launch(struct kcuda_ctx *c, const struct moe_one_args *a)
{
	auto kern = moe_one_gate_up_kernel<T, UPW, RT>;
	const size_t smem = mo_gu_smem(T, UPW);
	static bool attr_done[16]; /* per instantiation and device (attributes are per device) */
	const bool once = c->device >= 0 && c->device < 16;
	if (!once || !attr_done[c->device]) {
		/* the largest shared-memory carveout: 3 blocks of ~62 KB per SM (GLM-5) */
		if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
		        cudaSuccess ||
		    (mo_carve() && cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout,
		                                        (int)cudaSharedmemCarveoutMaxShared) != cudaSuccess))
			return kcuda_launch_status("moe_one_gate_up attribute");
		if (once)
			attr_done[c->device] = true;
	}
	return klaunch("moe_one_gate_up", kern, dim3((unsigned)(a->F / 8), (unsigned)a->np), dim3(MO_W * 32),
	               smem, c->stream, (const uint8_t *)a->gate->data, (const uint8_t *)a->up->data,
	               (const uint8_t *)a->sg, (const uint8_t *)a->su, a->gate->row_bytes, a->E, a->F,
	               (int)(a->D / 256), a->x, a->ids, a->np_r, a->h, mo_flags(false), mo_rt_of(a));
}

template <int T, bool RT> static int mo_gu_t(struct kcuda_ctx *c, const struct moe_one_args *a)
{
	switch (mo_upw(a->D / 256)) {
	case 1: return mo_gu_launch<T, 1, RT>(c, a);
	case 2: return mo_gu_launch<T, 2, RT>(c, a);
	case 3: return mo_gu_launch<T, 3, RT>(c, a);
	default: return mo_gu_launch<T, 4, RT>(c, a);
	}
}

int moe_one_gate_up(struct kcuda_ctx *c, const struct moe_one_args *a)
{
	if (!moe_one_gate_up_fits(c, a->gate->type, a->D, a->F, a->np) || a->up->type != a->gate->type)
		return -EINVAL;
	if (a->route)
		return a->gate->type == KT_Q5_K ? mo_gu_t<KT_Q5_K, true>(c, a) : mo_gu_t<KT_Q4_K, true>(c, a);
	return a->gate->type == KT_Q5_K ? mo_gu_t<KT_Q5_K, false>(c, a) : mo_gu_t<KT_Q4_K, false>(c, a);
}

template <int T, bool RT> static int mo_dn_t(struct kcuda_ctx *c, const struct moe_one_args *a)
{
	auto kern = moe_one_down_kernel<T, RT>;
	const size_t smem = (size_t)MO_DW * (16 * (T == KT_Q5_K ? 176 : 144) + 1024);
	static bool attr_done[16]; /* per instantiation and device (attributes are per device) */
	const bool once = c->device >= 0 && c->device < 16;
	if (!once || !attr_done[c->device]) {
		/* the same carveout as gate / up, so its blocks can start beside gate / up's (PDL) */
		if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
		        cudaSuccess ||
		    (mo_carve() && cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout,
		                                        (int)cudaSharedmemCarveoutMaxShared) != cudaSuccess))
			return kcuda_launch_status("moe_one_down attribute");
		if (once)
			attr_done[c->device] = true;
	}
	return klaunch("moe_one_down", kern, dim3((unsigned)((a->D + 15) / 16)), dim3(MO_DW * 32), smem,
	               c->stream, (const uint8_t *)a->down->data, (const uint8_t *)a->sd, a->down->row_bytes,
	               a->E, a->D, (const float *)a->h, a->ids, a->w, a->np_r, a->np, a->out, c->err_dev,
	               mo_flags(true), mo_rt_of(a));
}

int moe_one_down(struct kcuda_ctx *c, const struct moe_one_args *a)
{
	if (!moe_one_down_fits(a->down->type, a->F, a->np))
		return -EINVAL;
	if (a->route)
		return a->down->type == KT_Q5_K ? mo_dn_t<KT_Q5_K, true>(c, a) : mo_dn_t<KT_Q4_K, true>(c, a);
	return a->down->type == KT_Q5_K ? mo_dn_t<KT_Q5_K, false>(c, a) : mo_dn_t<KT_Q4_K, false>(c, a);
}

/* ---- the route folded into the expert launches (kcuda_moe_route_ffn1) -------------------------- */

static bool mo_route_on(void)
{
	const char *v = getenv("TANDEM_MOE_ONE_ROUTE");
	return !(v && strcmp(v, "0") == 0);
}

extern "C" int kcuda_moe_route_ffn1(struct kcuda_ctx *c, const float *logits, const float *bias, int E, int k,
                                    int n_group, int n_group_used, int gating, bool norm, float scale,
                                    int32_t *ids, float *weights, const float *x, const struct kweight *gate,
                                    const struct kweight *up, const struct kweight *down, int64_t F,
                                    const struct kweight *sh_gate, const struct kweight *sh_up,
                                    const struct kweight *sh_down, float *out)
{
	if (!c || !logits || !ids || !weights || !x || !gate || !up || !down || !sh_gate || !sh_up ||
	    !sh_down || !out || E < 1 || k < 1 || k > E || F < 1 || n_group < 0 || n_group_used < 0)
		return kcuda_bad_arg("moe_route_ffn1", "E %d k %d F %lld groups %d/%d, or a null pointer", E,
		                     k, (long long)F, n_group_used, n_group);
	if (!gate->data || !up->data || !down->data || !sh_gate->data || !sh_up->data || !sh_down->data)
		return kcuda_bad_arg("moe_route_ffn1", "null weight data");
	const int64_t D = gate->n_in;
	/* the shapes and switches of every part (moe_mma_fits: TANDEM_MOE_FAST, types, D / F multiples of
	 * 256, x alignment; moe_small_fits: TANDEM_MOE_SMALL, workspace; the route: the register kernel
	 * with V = 8, TANDEM_MOE_ROUTE_FAST unset (its redux arg-max), groups that are whole lane runs) */
	const char *rf = getenv("TANDEM_MOE_ROUTE_FAST");
	if (!mo_route_on() || (rf && *rf) ||
	    (n_group > 1 && n_group_used < n_group && (E % n_group || n_group_used < 1)) ||
	    moe_route_reg_v(E, k, n_group, n_group_used) != MO_RV || up->type != gate->type ||
	    up->n_in != D || down->n_in != F || gate->n_out != E * F || up->n_out != E * F ||
	    down->n_out != E * D || !moe_mma_fits(c, x, D, 1, k, gate, up, down, E, F) ||
	    !moe_mma_fits_shared(gate, down, F, sh_gate, sh_up, sh_down) || !moe_small_fits(c, 1, k, true, F))
		return ERR_UNSUPPORTED; /* nothing enqueued: the caller routes and runs the experts */
	struct moe_one_route r = {logits,       bias,  n_group, n_group_used, gating,
	                          norm ? 1 : 0, scale, ids,     weights};
	struct moe_one_args a;
	a.gate = gate, a.up = up, a.down = down, a.sg = sh_gate->data, a.su = sh_up->data,
	a.sd = sh_down->data;
	a.x = x, a.w = weights, a.ids = ids, a.D = D, a.F = F, a.E = E, a.np_r = k, a.np = k + 1;
	a.h = (float *)c->ws, a.out = out, a.route = &r;
	/* everything in one launch (moe_persist.cu) where it applies; else moe_one's two launches */
	int rc = moe_persist_ffn1(c, &a);
	if (rc != ERR_UNSUPPORTED)
		return rc;
	if (moe_one_mode() != (MOE_ONE_GU | MOE_ONE_DN) || k > MO_DW - 1 ||
	    !moe_one_gate_up_fits(c, gate->type, D, F, k + 1) || !moe_one_down_fits(down->type, F, k + 1))
		return ERR_UNSUPPORTED;
	if (kprof_active)
		kprof_push(kprof_active, "moe.experts/gate_up+route(one)", ktype_name(gate->type),
		           2.0 * (double)(k + 1) * (double)F * (double)gate->row_bytes);
	rc = moe_one_gate_up(c, &a);
	if (kprof_active)
		kprof_pop(kprof_active);
	if (rc)
		return rc;
	if (kprof_active)
		kprof_push(kprof_active, "moe.experts/down+route(one)", ktype_name(down->type),
		           (double)(k + 1) * (double)D * (double)down->row_bytes);
	rc = moe_one_down(c, &a);
	if (kprof_active)
		kprof_pop(kprof_active);
	return rc;
}
