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
 * Switches (moe_mma.h): TANDEM_MOE_SMALL_V=old (both old kernels), gu (only gate / up new), dn
 * (only down new); TANDEM_MOE_ONE_EARLY=0 (down reads ids only after its wait). */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/moe_mma.h"
#include "kernels/cuda/moe_mma_units.cuh"

#define MO_W 8 /* warps per gate / up block (units of D: warp w takes w, w + 8, ...) */
#define MO_UPW_MAX 4 /* units of D per warp: D <= 8192 */
#define MO_DW 9 /* warps per down block: pairs (8 routed + the shared expert) */
#define MO_EARLY 1 /* down: ids / weights of the routed experts before the wait */
#define MO_PF_SH 2 /* the shared expert's weights before the wait (TANDEM_PREFETCH) */

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
/* wait until at most n groups are pending (n 0..3) */
__device__ __forceinline__ void mo_wait_rt(int n)
{
	switch (n) {
	case 0: mo_wait<0>(); break;
	case 1: mo_wait<1>(); break;
	case 2: mo_wait<2>(); break;
	default: mo_wait<3>(); break;
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

/* grid (F / 8, np), MO_W warps; dynamic shared memory: MO_W x (UPW - 1) weight slots of 16 rows,
 * then MO_W x UPW units of x (1 KB each). Block (f0 = 8 blockIdx.x, pair p) writes
 * h[p][f0 .. f0 + 7] = SiLU(gate) up; a pair with an id out of range writes nothing (the down
 * kernel reports it). */
template <int T, int UPW>
__global__ void __launch_bounds__(MO_W * 32, T == KT_Q4_K ? 3 : 2)
    moe_one_gate_up_kernel(const uint8_t *__restrict__ wg, const uint8_t *__restrict__ wu,
                           const uint8_t *__restrict__ sg, const uint8_t *__restrict__ su, size_t rb, int E,
                           int64_t F, int n_units, const float *x, const int32_t *ids, int np_r,
                           float *__restrict__ h, int flags)
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
		if (!shared) {
			const int e = ids[p];
			if (e < 0 || e >= E)
				return; /* block-uniform; nothing issued */
			bg = wg + (size_t)e * (size_t)F * rb, bu = wu + (size_t)e * (size_t)F * rb;
		}
		issue_x(x); /* x first: it is ready now, the weights need the id */
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
 * earlier layer's ids can answer. Off: TANDEM_MOE_ONE_EARLY=0 (and whenever PDL is off it changes
 * nothing). */
template <int T>
__global__ void __launch_bounds__(MO_DW * 32, 3)
    moe_one_down_kernel(const uint8_t *__restrict__ wd, const uint8_t *__restrict__ sd, size_t rb, int E,
                        int64_t D, const float *h, const int32_t *ids, const float *wts, int np_r, int np,
                        float *__restrict__ out, unsigned *err, int flags)
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
	int e = -1;
	if (sh && (flags & MO_PF_SH)) { /* weights: before the wait */
		issue_w(sd);
		issued = true;
	}
	if (flags & MO_EARLY) { /* see the comment above the kernel */
		if (p < np_r) {
			e = __ldcg(ids + p);
			if (e >= 0 && e < E) {
				issue_w(wd + (size_t)e * (size_t)D * rb);
				issued = true;
			}
		}
		if (threadIdx.x < np) {
			const int i = threadIdx.x;
			es[i] = mo_expert(i < np_r ? __ldcg(ids + i) : E, i < np_r, E);
			wsh[i] = i < np_r ? __ldcg(wts + i) : 1.0f;
		}
	}
	KDEP_ENTRY();
	h = kdep_after(h);
	ids = kdep_after(ids);
	wts = kdep_after(wts);
	if (!(flags & MO_EARLY)) {
		if (p < np_r) {
			e = ids[p];
			if (e >= 0 && e < E) {
				issue_w(wd + (size_t)e * (size_t)D * rb);
				issued = true;
			}
		}
		if (threadIdx.x < np) {
			const int i = threadIdx.x;
			es[i] = mo_expert(i < np_r ? ids[i] : E, i < np_r, E);
			wsh[i] = i < np_r ? wts[i] : 1.0f;
		}
	}
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

int moe_one_mode(void)
{
	const char *v = getenv("TANDEM_MOE_SMALL_V");
	if (v && strcmp(v, "old") == 0)
		return 0;
	if (v && strcmp(v, "gu") == 0)
		return MOE_ONE_GU;
	if (v && strcmp(v, "dn") == 0)
		return MOE_ONE_DN;
	return MOE_ONE_GU | MOE_ONE_DN;
}

static int mo_flags(bool down)
{
	int f = kcuda_prefetch_enabled() ? MO_PF_SH : 0;
	if (down) {
		const char *v = getenv("TANDEM_MOE_ONE_EARLY");
		if (!(v && strcmp(v, "0") == 0))
			f |= MO_EARLY;
	}
	return f;
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

bool moe_one_gate_up_fits(int type, int64_t D, int64_t F, int np)
{
	if ((type != KT_Q4_K && type != KT_Q5_K) || D % 256 || F % 8 || D < 256 || np < 1 || np > 65535)
		return false;
	const int upw = mo_upw(D / 256);
	return upw >= 1 && upw <= MO_UPW_MAX && mo_gu_smem(type, upw) <= 200 * 1024;
}

bool moe_one_down_fits(int type, int64_t F, int np)
{
	return (type == KT_Q4_K || type == KT_Q5_K) && F == 256 && np >= 1 && np <= MO_DW;
}

template <int T, int UPW> static int mo_gu_launch(struct kcuda_ctx *c, const struct moe_one_args *a)
{
	auto kern = moe_one_gate_up_kernel<T, UPW>;
	const size_t smem = mo_gu_smem(T, UPW);
	static bool attr_done[16]; /* per instantiation and device (attributes are per device) */
	const bool once = c->device >= 0 && c->device < 16;
	if (!once || !attr_done[c->device]) {
		/* the largest shared-memory carveout: 3 blocks of ~62 KB per SM (GLM-5) */
		if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
		        cudaSuccess ||
		    cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout,
		                         (int)cudaSharedmemCarveoutMaxShared) != cudaSuccess)
			return kcuda_launch_status("moe_one_gate_up attribute");
		if (once)
			attr_done[c->device] = true;
	}
	return klaunch("moe_one_gate_up", kern, dim3((unsigned)(a->F / 8), (unsigned)a->np), dim3(MO_W * 32),
	               smem, c->stream, (const uint8_t *)a->gate->data, (const uint8_t *)a->up->data,
	               (const uint8_t *)a->sg, (const uint8_t *)a->su, a->gate->row_bytes, a->E, a->F,
	               (int)(a->D / 256), a->x, a->ids, a->np_r, a->h, mo_flags(false));
}

template <int T> static int mo_gu_t(struct kcuda_ctx *c, const struct moe_one_args *a)
{
	switch (mo_upw(a->D / 256)) {
	case 1: return mo_gu_launch<T, 1>(c, a);
	case 2: return mo_gu_launch<T, 2>(c, a);
	case 3: return mo_gu_launch<T, 3>(c, a);
	default: return mo_gu_launch<T, 4>(c, a);
	}
}

int moe_one_gate_up(struct kcuda_ctx *c, const struct moe_one_args *a)
{
	if (!moe_one_gate_up_fits(a->gate->type, a->D, a->F, a->np) || a->up->type != a->gate->type)
		return -EINVAL;
	return a->gate->type == KT_Q5_K ? mo_gu_t<KT_Q5_K>(c, a) : mo_gu_t<KT_Q4_K>(c, a);
}

template <int T> static int mo_dn_t(struct kcuda_ctx *c, const struct moe_one_args *a)
{
	auto kern = moe_one_down_kernel<T>;
	const size_t smem = (size_t)MO_DW * (16 * (T == KT_Q5_K ? 176 : 144) + 1024);
	static bool attr_done[16]; /* per instantiation and device (attributes are per device) */
	const bool once = c->device >= 0 && c->device < 16;
	if (!once || !attr_done[c->device]) {
		/* the same carveout as gate / up, so its blocks can start beside gate / up's (PDL) */
		if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
		        cudaSuccess ||
		    cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout,
		                         (int)cudaSharedmemCarveoutMaxShared) != cudaSuccess)
			return kcuda_launch_status("moe_one_down attribute");
		if (once)
			attr_done[c->device] = true;
	}
	return klaunch("moe_one_down", kern, dim3((unsigned)((a->D + 15) / 16)), dim3(MO_DW * 32), smem,
	               c->stream, (const uint8_t *)a->down->data, (const uint8_t *)a->sd, a->down->row_bytes,
	               a->E, a->D, (const float *)a->h, a->ids, a->w, a->np_r, a->np, a->out, c->err_dev,
	               mo_flags(true));
}

int moe_one_down(struct kcuda_ctx *c, const struct moe_one_args *a)
{
	if (!moe_one_down_fits(a->down->type, a->F, a->np))
		return -EINVAL;
	return a->down->type == KT_Q5_K ? mo_dn_t<KT_Q5_K>(c, a) : mo_dn_t<KT_Q4_K>(c, a);
}
