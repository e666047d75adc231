/* The batch-1 MoE (route, gate / up, down, combine) in ONE launch: a grid of one block per SM that
 * stays resident through both halves, with one grid-wide barrier between them.
 *
 * Why: at batch 1 the route, gate / up and down + combine kernels cost 4.5 + 13.5 + 8.3 us per layer on
 * the critical path (H200, nsys, session 7) for ~21 MB of weights: 0.8 TB/s of a 4.3 TB/s read rate.
 * Sessions 4-7 measured that a kernel boundary under PDL is cheap (~0.5-0.9 us) but that each kernel's
 * own chain is not: its weights can only be requested once its inputs are known (the routed experts
 * after the route), every kernel has a ramp and a tail, and the route is a whole launch for ~2k flops.
 * Here:
 *   - before griddepcontrol.wait the warps whose units belong to the shared expert issue their weights
 *     (weights only: cuda_common.cuh);
 *   - after it, every block loads the token's x (all of D, one group) and every WARP routes the token
 *     itself from the router logits (route_reg_token: kcuda_moe_route's device code, the same ids and
 *     weights), so no block waits for another to learn the experts; then each warp issues all its
 *     gate / up weight units at once (cp.async into its shared-memory slots, one group a unit);
 *   - the gate / up units (pair p, 8 f rows of gate and of up, one 256-wide unit of D: the moe_one /
 *     moe_small unit arithmetic, gemv_mma.cuh's K-quant unit on the tensor cores) are spread evenly,
 *     contiguously, over the grid's warps; a block sums its warps' partial sums per tile in warp order
 *     and stores one partial per (tile, block) to the workspace;
 *   - as soon as a warp is done with its gate / up units it issues its down units into the same slots
 *     (the experts are known), so those loads overlap the block's reduction and the grid barrier;
 *   - one grid barrier (arrive / spin on a counter in the context's tickets, a deadline on the spin);
 *   - every block forms h = SiLU(g) u for all pairs from the partials (segments in block order), owns
 *     16-row groups of the output, runs the down units of all pairs on them and combines in slot order
 *     (moe_one's formula: sum_j w_j y_j, NaN for an id out of range, + the shared expert's y).
 * All blocks must be resident at once for the barrier: the grid is at most one block per SM (the
 * occupancy query says one fits), and nothing this kernel waits for needs an SM it holds: the kernels before
 * it finish on their own, and its dependents are launched only after every block of it has passed
 * griddepcontrol.wait (KDEP_ENTRY's trigger), i.e. is resident. If some block still does not arrive in
 * KGB_DEADLINE_NS (an SM taken by another process under MPS, say), the waiting blocks count an error in
 * err_dev (kcuda_ctx_take_errors reports it) and write NaN. Results: the same unit products as moe_one /
 * moe_small; the sums over D are grouped differently (per block), so the bits differ from theirs within the
 * tolerance, and are deterministic for a given SM count. Shapes: one token, gate / up Q4_K or Q5_K (the same
 * type), down Q4_K or Q5_K, F 256 (one unit per down row: a TP=8 rank of GLM-5 or DeepSeek-V3), D a multiple
 * of 256, at most MP_NP_MAX pairs. Off by default (moe_persist_on: slower in the step than the three kernels
 * it replaces); TANDEM_MOE_PERSIST=1 turns it on. TANDEM_MOE_PERSIST_TRACE=1 stamps each block's phases
 * (moe_persist_trace_print). */
#include <stdlib.h>
#include <string.h>

#include <algorithm>

#include "kernels/cuda/grid_barrier.cuh"
#include "kernels/cuda/moe_mma.h"
#include "kernels/cuda/moe_one.cuh"
#include "kernels/cuda/prof.h"

#define MP_W 16 /* warps per block */
#define MP_UPW_MAX 8 /* weight slots per warp (units of gate / up, then of down) */
#define MP_NP_MAX 17 /* pairs: top-16 + the shared expert */
#define MP_HV ((MP_NP_MAX * 256 + MP_W * 32 - 1) / (MP_W * 32)) /* h values a thread forms */
#define MP_PF_SH 1 /* the shared expert's units before the wait (TANDEM_PREFETCH) */
/* the kernel's static shared memory, at most (s_id, s_w, es, wsh, the barrier's flag) */
#define MP_STATIC_SMEM (2 * 4 * 32 + 8 * MP_NP_MAX + 64)
#define MP_BAR_SLOT (KCUDA_N_TICKETS - 3) /* two counters of c->tickets (moe_router_fuse.cu: the last) */

struct mp_args {
	const uint8_t *wg, *wu,
	    *wd; /* routed experts, stacked: expert e = rows [e F, e F + F) / [e D, ...) */
	const uint8_t *sg, *su, *sd; /* the shared expert, or NULL (np == np_r) */
	size_t rb_gu, rb_d;
	int E, np_r, np, tpp; /* pairs (np_r routed), 8-row tiles per pair (F / 8) */
	int U; /* units of D (D / 256) */
	int64_t D;
	const float *x;
	const int32_t *ids; /* !RT: the routed ids / weights (written by an earlier kernel) */
	const float *wts;
	mo_rt rt; /* RT: the route's arguments (ids / wts its outputs) */
	float *pbuf; /* [n_tiles][seg][16] partial sums of gate (0..7) and up (8..15) */
	int seg; /* partials per tile (blocks a tile can span) */
	unsigned *bar; /* [0] arrivals, [1] departures: zero between launches */
	unsigned *err;
	float *out;
	int upw, n_lt, nrg_max; /* slots per warp; tiles a block can touch; 16-row groups per block */
	int flags;
	unsigned long long *trace; /* TANDEM_MOE_PERSIST_TRACE=1: [block][MP_TN] %globaltimer per phase */
};
#define MP_TN 11

/* the block whose range [NU b / G, NU (b + 1) / G) holds unit u (32-bit: the host keeps NU G < 2^31) */
__device__ __forceinline__ int mp_block_of(int u, int NU, int G)
{
	return (int)(((unsigned)(u + 1) * (unsigned)G - 1u) / (unsigned)NU);
}

__device__ __forceinline__ unsigned long long mp_now(void)
{
	return kgb_now();
}

/* One weight tile of 16 rows x BYTES into a slot (row rr at dst + rr BYTES) from row(rr), by the
 * warp's lanes, 16 bytes a copy (the caller commits the group) */
template <int BYTES, typename Row> __device__ __forceinline__ void mp_cp_tile(uint8_t *dst, int lane, Row row)
{
	constexpr int CH = BYTES / 16;
	for (int i = lane; i < 16 * CH; i += 32) {
		const int rr = i / CH, c = i % CH;
		mo_cp16(dst + rr * BYTES + 16 * c, row(rr) + 16 * c);
	}
}

/* phase i of this block reached (thread 0; trace mode only) */
#define MP_T(i)                                                                                              \
	do {                                                                                                 \
		if (a.trace && threadIdx.x == 0)                                                             \
			a.trace[(size_t)blockIdx.x * MP_TN + (i)] = mp_now();                                \
	} while (0)

/* grid (blocks), MP_W warps, dynamic shared memory (mp_smem_bytes): MP_W x upw weight slots, x (U units),
 * h (np units), the warps' partial sums [MP_W][n_lt][16], the down results [nrg_max][np][16], factors */
template <int TG, int TD, bool RT>
__global__ void __launch_bounds__(MP_W * 32, 1) moe_persist_kernel(const mp_args a)
{
	constexpr int BG = TG == KT_Q5_K ? 176 : 144;
	constexpr int BD = TD == KT_Q5_K ? 176 : 144;
	constexpr int SLOT = 16 * (BG > BD ? BG : BD);
	extern __shared__ __align__(16) uint8_t mp_smem[];
	__shared__ int s_id[32];
	__shared__ float s_w[32];
	__shared__ int es[MP_NP_MAX];
	__shared__ float wsh[MP_NP_MAX];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int g = lane >> 2, t = lane & 3;
	const int G = (int)gridDim.x, b = (int)blockIdx.x, U = a.U, np = a.np, np_r = a.np_r, E = a.E;
	const int NU = np * a.tpp * U; /* gate / up units of the whole grid */
	uint8_t *slots = mp_smem + (size_t)warp * a.upw * SLOT;
	float *xs = (float *)(mp_smem + (size_t)MP_W * a.upw * SLOT);
	float *hs = xs + (size_t)U * 256;
	float *part = hs + (size_t)np * 256;
	float *ys = part + (size_t)MP_W * a.n_lt * 16;
	float *xsf = ys + (size_t)a.nrg_max * np * 16;
	float *hf = xsf + U;
	/* this block's units, this warp's share of them (contiguous), the block's first tile */
	const int lo_b = (int)((int64_t)NU * b / G), nb = (int)((int64_t)NU * (b + 1) / G) - lo_b;
	const int lo_w = lo_b + nb * warp / MP_W, nw = lo_b + nb * (warp + 1) / MP_W - lo_w;
	const int t0 = lo_b / U;
	MP_T(0);
	for (int i = lane; i < a.n_lt * 16; i += 32)
		part[(size_t)warp * a.n_lt * 16 + i] = 0.f;
	/* unit lo_w + j of pair expert e (E: the shared one; < 0: none) into slot j, one group */
	auto issue_gu = [&](int j, int e) {
		const int unit = lo_w + j, tile = unit / U, u = unit % U;
		const int64_t f0 = 8 * (int64_t)(tile % a.tpp);
		if (e >= 0) {
			const size_t eo = e < E ? (size_t)e * (size_t)a.tpp * 8 * a.rb_gu : 0;
			const uint8_t *bg = (e < E ? a.wg : a.sg) + eo, *bu = (e < E ? a.wu : a.su) + eo;
			mp_cp_tile<BG>(slots + (size_t)j * SLOT, lane,
			               [&](int rr) { /* 0..7 gate, 8..15 up */
				                     return (rr < 8 ? bg : bu) +
				                            (size_t)(f0 + (rr & 7)) * a.rb_gu +
				                            (size_t)BG * u;
			               });
		}
		mo_commit();
	};
	/* the shared pair is the last: a warp whose first unit is in it has only shared units */
	const bool early = (a.flags & MP_PF_SH) && np > np_r && nw > 0 && lo_w / U / a.tpp == np_r;
	if (early)
		for (int j = 0; j < nw; j++)
			issue_gu(j, E);
	KDEP_ENTRY();
	MP_T(1);
	const float *x = kdep_after(a.x);
	for (int i = threadIdx.x; i < U * 64; i += MP_W * 32)
		mo_cp16(xs + 4 * i, x + 4 * i);
	mo_commit();
	/* the experts of the pairs: warp 0 routes the token (or reads the ids), the block waits for it. (With
	 * every warp routing for itself the 2112 warps' loads of the same 2 KB of logits and bias took
	 * ~14 us in the decode step: a few L2 lines serving every SM at once.) */
	if (warp == 0) {
		if (RT) {
			route_reg_token<MO_RV, true>(kdep_after(a.rt.lg), a.rt.bias, E, a.rt.k, a.rt.n_group,
			                             a.rt.n_group_used, a.rt.gating, a.rt.norm, a.rt.scale,
			                             s_id, s_w);
			__syncwarp();
			if (b == 0 && lane < np_r)
				a.rt.ids[lane] = s_id[lane], a.rt.wts[lane] = s_w[lane];
		} else if (lane < np_r) {
			s_id[lane] = kdep_after(a.ids)[lane];
			s_w[lane] = kdep_after(a.wts)[lane];
		}
	}
	__syncthreads();
	auto expert = [&](int p) { return mo_expert(p < np_r ? s_id[p] : E, p < np_r, E); };
	/* the first unit now; x staged before the others (issuing them all stalls on the memory
	 * system for ~3 us, and the block's barrier below would wait for that) */
	if (!early && nw > 0)
		issue_gu(0, expert(lo_w / U / a.tpp));
	if (warp == 0 && lane < np) {
		es[lane] = expert(lane);
		wsh[lane] = lane < np_r ? s_w[lane] : 1.0f;
	}
	MP_T(2);
	if (early || nw == 0) /* x's group is the newest (or the only one) */
		mo_wait<0>();
	else
		mo_wait<1>(); /* x, then unit 0 */
	__syncthreads(); /* every thread's part of x landed */
	for (int u = warp; u < U; u += MP_W) {
		const float f = mo_stage_unit(xs + 256 * u, lane);
		if (lane == 0)
			xsf[u] = f;
	}
	__syncthreads();
	MP_T(3);
	if (!early)
		for (int j = 1; j < nw; j++)
			issue_gu(j, expert((lo_w + j) / U / a.tpp));
	MP_T(4);
	/* gate / up: this warp's units in order, partial sums flushed per tile */
	float acc[4] = {0.f, 0.f, 0.f, 0.f};
	int cur = -1;
	auto flush = [&]() {
		if (cur >= 0 && t == 0) {
			float *pp = part + ((size_t)warp * a.n_lt + cur) * 16;
			pp[g] = fmaf(acc[1], 1.f / 2048.f, acc[0]);
			pp[8 + g] = fmaf(acc[3], 1.f / 2048.f, acc[2]);
		}
	};
	for (int j = 0; j < nw; j++) {
		const int unit = lo_w + j, tile = unit / U, u = unit % U;
		if (tile - t0 != cur) {
			flush();
			cur = tile - t0;
			acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
		}
		if (!early)
			mo_wait_rt(nw - 1 - j);
		__syncwarp(); /* the other lanes' copies of this slot */
		if (expert(tile / a.tpp) < 0)
			continue;
		gm_k45_w<TG, 1> W;
		mo_k45_lds<TG>(W, slots + (size_t)j * SLOT, g, t);
		mo_k45_math<TG>(acc, W, (const uint2 *)(xs + 256 * u), xsf[u], lane);
	}
	flush();
	MP_T(5);
	/* down: this block's 16-row groups x all pairs; this warp's units issued into its slots now */
	const int NR = (int)((a.D + 15) / 16);
	const int rg0 = (int)((int64_t)NR * b / G), nrg = (int)((int64_t)NR * (b + 1) / G) - rg0;
	const int ndu = nrg * np;
	mo_wait<0>();
	__syncwarp(); /* every lane's reads of the slots are done */
	for (int jd = warp, s = 0; jd < ndu; jd += MP_W, s++) {
		const int rg = jd / np, p = jd % np, e = expert(p);
		if (e >= 0) {
			const uint8_t *base = e < E ? a.wd + (size_t)e * (size_t)a.D * a.rb_d : a.sd;
			const int64_t row0 = 16 * (int64_t)(rg0 + rg);
			mp_cp_tile<BD>(slots + (size_t)s * SLOT, lane, [&](int rr) {
				return base + (size_t)min(row0 + rr, a.D - 1) * a.rb_d;
			});
		}
	}
	mo_commit();
	/* the block's partial per tile (warps in order) to the workspace */
	__syncthreads();
	const int n_bt = nb > 0 ? (lo_b + nb - 1) / U - t0 + 1 : 0;
	for (int i = threadIdx.x; i < n_bt * 16; i += MP_W * 32) {
		const int lt = i / 16, r = i % 16, tile = t0 + lt;
		float s = 0.f;
		for (int w = 0; w < MP_W; w++)
			s += part[((size_t)w * a.n_lt + lt) * 16 + r];
		const int sg = b - mp_block_of(tile * U, NU, G);
		__stcg(a.pbuf + ((size_t)tile * a.seg + sg) * 16 + r, s);
	}
	MP_T(6);
	const bool ok = kgrid_barrier(a.bar, gridDim.x, a.err);
	MP_T(7);
	/* h = SiLU(g) u of every pair (segments in block order), then its B fragments: every thread's
	 * first two segments loaded at once (one L2 round trip; more segments, only when blocks hold
	 * fewer units than a tile, in a loop) */
	{
		float pg[MP_HV][2], pu[MP_HV][2];
		int ns[MP_HV];
#pragma unroll
		for (int m = 0; m < MP_HV; m++) {
			const int i = threadIdx.x + m * MP_W * 32;
			ns[m] = 0;
			if (i < np * 256) {
				const int tile = i / 256 * a.tpp + i % 256 / 8, r = i % 8;
				const int s0 = mp_block_of(tile * U, NU, G);
				ns[m] = mp_block_of(tile * U + U - 1, NU, G) - s0 + 1;
				const float *pp = a.pbuf + (size_t)tile * a.seg * 16 + r;
				pg[m][0] = __ldcg(pp), pu[m][0] = __ldcg(pp + 8);
				if (ns[m] > 1)
					pg[m][1] = __ldcg(pp + 16), pu[m][1] = __ldcg(pp + 24);
			}
		}
#pragma unroll
		for (int m = 0; m < MP_HV; m++) {
			const int i = threadIdx.x + m * MP_W * 32;
			if (i < np * 256) {
				float gs = 0.f + pg[m][0], us = 0.f + pu[m][0];
				if (ns[m] > 1)
					gs += pg[m][1], us += pu[m][1];
				if (ns[m] > 2) {
					const int tile = i / 256 * a.tpp + i % 256 / 8;
					const float *pp = a.pbuf + (size_t)tile * a.seg * 16 + i % 8;
					for (int s = 2; s < ns[m]; s++)
						gs += __ldcg(pp + 16 * s), us += __ldcg(pp + 16 * s + 8);
				}
				hs[i] = gs / (1.0f + expf(-gs)) * us;
			}
		}
	}
	__syncthreads();
	for (int p = warp; p < np; p += MP_W) {
		const float f = mo_stage_unit(hs + 256 * p, lane);
		if (lane == 0)
			hf[p] = f;
	}
	__syncthreads();
	MP_T(8);
	mo_wait<0>();
	__syncwarp();
	for (int jd = warp, s = 0; jd < ndu; jd += MP_W, s++) {
		const int rg = jd / np, p = jd % np;
		if (es[p] < 0)
			continue;
		gm_k45_w<TD, 1> W;
		mo_k45_lds<TD>(W, slots + (size_t)s * SLOT, g, t);
		float dacc[4] = {0.f, 0.f, 0.f, 0.f};
		mo_k45_math<TD>(dacc, W, (const uint2 *)(hs + 256 * p), hf[p], lane);
		if (t == 0) {
			float *y = ys + ((size_t)rg * np + p) * 16;
			y[g] = fmaf(dacc[1], 1.f / 2048.f, dacc[0]);
			y[8 + g] = fmaf(dacc[3], 1.f / 2048.f, dacc[2]);
		}
	}
	__syncthreads();
	MP_T(9);
	if (b == 0 && threadIdx.x < np_r && es[threadIdx.x] < 0)
		atomicAdd(a.err, 1u);
	for (int i = threadIdx.x; i < nrg * 16; i += MP_W * 32) {
		const int rg = i / 16, rr = i % 16;
		const int64_t d = 16 * (int64_t)(rg0 + rg) + rr;
		if (d >= a.D)
			continue;
		const float *y = ys + (size_t)rg * np * 16;
		float s = 0.0f;
		for (int j = 0; j < np_r; j++)
			s = es[j] >= 0 ? fmaf(wsh[j], y[16 * j + rr], s) : NAN;
		if (np > np_r)
			s += y[16 * np_r + rr];
		a.out[d] = ok ? s : NAN;
	}
	MP_T(10);
}

/* ---- host ------------------------------------------------------------------------------------- */

/* trace mode (TANDEM_MOE_PERSIST_TRACE=1, read once): the buffer every launch writes its phases to;
 * the process prints the last launch's at exit (tandem bench: the last layer of the last step) */
static unsigned long long *mp_trace_buf;
static int mp_trace_g;
static void mp_trace_atexit(void)
{
	moe_persist_trace_print(NULL);
}

static unsigned long long *mp_trace(int G)
{
	static int on = -1;
	if (on < 0) {
		const char *v = getenv("TANDEM_MOE_PERSIST_TRACE");
		on = v && strcmp(v, "1") == 0;
	}
	if (!on)
		return NULL;
	if (!mp_trace_buf) { /* (relaxed: the first call may come during a graph capture) */
		cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
		cudaThreadExchangeStreamCaptureMode(&m);
		const cudaError_t e =
		    cudaMalloc((void **)&mp_trace_buf, sizeof(unsigned long long) * MP_TN * 4096);
		cudaThreadExchangeStreamCaptureMode(&m);
		if (e != cudaSuccess) {
			mp_trace_buf = NULL;
			on = 0;
			return NULL;
		}
	}
	if (!mp_trace_g)
		atexit(mp_trace_atexit);
	mp_trace_g = G;
	return mp_trace_buf;
}

void moe_persist_trace_print(struct kcuda_ctx *c)
{
	static const char *const nm[MP_TN] = {"blocks enter",
	                                      "griddepcontrol.wait returns",
	                                      "routed, unit 0 issued",
	                                      "x staged",
	                                      "weights issued",
	                                      "gate / up done (warp 0)",
	                                      "partials stored",
	                                      "grid barrier passed",
	                                      "h staged",
	                                      "down done",
	                                      "out stored"};
	const int G = mp_trace_g;
	if (!mp_trace_buf || G < 1 || (c ? kcuda_sync(c) != 0 : cudaDeviceSynchronize() != cudaSuccess))
		return;
	unsigned long long *h = (unsigned long long *)malloc(sizeof(unsigned long long) * MP_TN * (size_t)G);
	double *v = (double *)malloc(sizeof(double) * (size_t)G);
	if (h && v &&
	    cudaMemcpy(h, mp_trace_buf, sizeof(unsigned long long) * MP_TN * (size_t)G,
	               cudaMemcpyDeviceToHost) == cudaSuccess) {
		unsigned long long t0 = h[0];
		for (int b = 0; b < G; b++)
			t0 = h[(size_t)b * MP_TN] < t0 ? h[(size_t)b * MP_TN] : t0;
		printf("moe_persist phases of the last launch (%d blocks), us from the first block's entry: "
		       "min / median / max over blocks\n",
		       G);
		for (int i = 0; i < MP_TN; i++) {
			for (int b = 0; b < G; b++)
				v[b] = (double)(h[(size_t)b * MP_TN + i] - t0) / 1e3;
			std::sort(v, v + G);
			printf("  %-28s %8.2f %8.2f %8.2f\n", nm[i], v[0], v[G / 2], v[G - 1]);
		}
	}
	free(h);
	free(v);
}

/* Off by default: measured slower in the decode step (H200, 2026-11-30: batch 1 7.74 ms against 6.88
 * with the three kernels; docs/PERFORMANCE.md, session 8); TANDEM_MOE_PERSIST=1 turns it on. */
bool moe_persist_on(void)
{
	const char *v = getenv("TANDEM_MOE_PERSIST");
	return v && strcmp(v, "1") == 0;
}

/* the launch plan of one call (G blocks; see mp_args) */
struct mp_plan {
	int G, upw, n_lt, seg, nrg_max;
	size_t smem;
};

static int mp_cdiv(int64_t a, int64_t b)
{
	return (int)((a + b - 1) / b);
}

static size_t mp_slot(int tg, int td)
{
	const int bg = tg == KT_Q5_K ? 176 : 144, bd = td == KT_Q5_K ? 176 : 144;
	return 16 * (size_t)(bg > bd ? bg : bd);
}

/* false where the kernel cannot take the shape on this device (nothing to launch) */
static bool mp_plan_of(const struct kcuda_ctx *c, int tg, int td, int64_t D, int np, struct mp_plan *pl)
{
	const int U = (int)(D / 256);
	const int64_t NU = (int64_t)np * 32 * U; /* F 256: 32 tiles a pair */
	if (c->n_sm < 1 || U < 1 || NU * c->n_sm >= 0x7fffffff) /* mp_block_of's 32-bit product */
		return false;
	/* at most one block a unit, so no block is empty (the partials' segments assume it) */
	const int G = NU < c->n_sm ? (int)NU : c->n_sm;
	const int per_b = mp_cdiv(NU, G), min_b = (int)(NU / G); /* units a block gets: at most, at least */
	const int NR = mp_cdiv(D, 16);
	pl->G = G;
	pl->nrg_max = mp_cdiv(NR, G);
	const int upw_gu = mp_cdiv(per_b, MP_W), upw_dn = mp_cdiv((int64_t)pl->nrg_max * np, MP_W);
	pl->upw = upw_gu > upw_dn ? upw_gu : upw_dn;
	pl->n_lt = mp_cdiv(per_b, U) + 1;
	/* a tile of U units spans at most ceil((U - 1) / min_b) + 1 blocks (min_b >= 1: G <= NU) */
	pl->seg = mp_cdiv(U - 1, min_b) + 1;
	if (pl->seg > U)
		pl->seg = U;
	pl->smem = (size_t)MP_W * pl->upw * mp_slot(tg, td) + sizeof(float) * 256 * (size_t)(U + np) +
	           sizeof(float) * 16 * ((size_t)MP_W * pl->n_lt + (size_t)pl->nrg_max * np) +
	           sizeof(float) * (size_t)(U + np);
	return pl->upw <= MP_UPW_MAX;
}

template <int TG, int TD, bool RT>
static int mp_launch(struct kcuda_ctx *c, const mp_args &a, const mp_plan &pl)
{
	auto kern = moe_persist_kernel<TG, TD, RT>;
	static bool attr_done[16]; /* per instantiation and device (attributes are per device) */
	static int occ[16];
	const bool once = c->device >= 0 && c->device < 16;
	int max_optin = 0;
	if (!once || !attr_done[c->device]) {
		/* dynamic shared memory up to what the block may have besides its static arrays */
		cudaFuncAttributes fa;
		max_optin = kcuda_smem_optin(c->device);
		if (max_optin < 1 || cudaFuncGetAttributes(&fa, kern) != cudaSuccess ||
		    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
		                         max_optin - (int)fa.sharedSizeBytes) != cudaSuccess)
			return kcuda_launch_status("moe_persist attribute");
		int o = 0;
		/* the co-residency the barrier needs, with the plan's shared memory at GLM-5's size */
		if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, kern, MP_W * 32, pl.smem) !=
		    cudaSuccess)
			return kcuda_launch_status("moe_persist occupancy");
		if (once) {
			occ[c->device] = o;
			attr_done[c->device] = true;
		}
		if (o < 1)
			return ERR_UNSUPPORTED;
	} else if (occ[c->device] < 1)
		return ERR_UNSUPPORTED;
	return klaunch("moe_persist", kern, dim3((unsigned)pl.G), dim3(MP_W * 32), pl.smem, c->stream, a);
}

template <bool RT>
static int mp_launch_t(struct kcuda_ctx *c, int tg, int td, const mp_args &a, const mp_plan &pl)
{
	if (tg == KT_Q5_K)
		return td == KT_Q5_K ? mp_launch<KT_Q5_K, KT_Q5_K, RT>(c, a, pl)
		                     : mp_launch<KT_Q5_K, KT_Q4_K, RT>(c, a, pl);
	return td == KT_Q5_K ? mp_launch<KT_Q4_K, KT_Q5_K, RT>(c, a, pl)
	                     : mp_launch<KT_Q4_K, KT_Q4_K, RT>(c, a, pl);
}

/* moe_one_args' call in one launch; ERR_UNSUPPORTED (nothing enqueued) where the kernel does not
 * apply: switched off, types, F != 256, D not a multiple of 256, too many pairs, no workspace or
 * tickets, or more shared memory than an SM offers */
int moe_persist_ffn1(struct kcuda_ctx *c, const struct moe_one_args *o)
{
	const int tg = o->gate->type, td = o->down->type;
	if (!moe_persist_on() || (tg != KT_Q4_K && tg != KT_Q5_K) || (td != KT_Q4_K && td != KT_Q5_K) ||
	    o->up->type != tg || o->F != 256 || o->D < 256 || o->D % 256 || o->np_r < 1 ||
	    o->np > MP_NP_MAX || o->np < o->np_r || o->np > o->np_r + 1 ||
	    (o->np > o->np_r && (!o->sg || !o->su || !o->sd)) || !c->tickets || ((uintptr_t)o->x & 15) ||
	    o->gate->row_bytes % 16 || o->down->row_bytes % 16 ||
	    (o->route && o->route->n_group > 1 && o->route->n_group_used < o->route->n_group &&
	     (o->E % o->route->n_group || o->route->n_group_used < 1)) ||
	    (o->route && moe_route_reg_v(o->E, o->np_r, o->route->n_group, o->route->n_group_used) != MO_RV))
		return ERR_UNSUPPORTED;
	struct mp_plan pl;
	if (!mp_plan_of(c, tg, td, o->D, o->np, &pl))
		return ERR_UNSUPPORTED;
	if (pl.smem + MP_STATIC_SMEM > (size_t)kcuda_smem_optin(c->device))
		return ERR_UNSUPPORTED;
	const size_t pbytes = sizeof(float) * 16 * (size_t)o->np * 32 * (size_t)pl.seg;
	if (pbytes > c->ws_bytes)
		return ERR_UNSUPPORTED;
	mp_args a;
	memset(&a, 0, sizeof(a));
	a.wg = (const uint8_t *)o->gate->data, a.wu = (const uint8_t *)o->up->data;
	a.wd = (const uint8_t *)o->down->data;
	a.sg = (const uint8_t *)o->sg, a.su = (const uint8_t *)o->su, a.sd = (const uint8_t *)o->sd;
	a.rb_gu = o->gate->row_bytes, a.rb_d = o->down->row_bytes;
	a.E = o->E, a.np_r = o->np_r, a.np = o->np, a.tpp = 32, a.U = (int)(o->D / 256), a.D = o->D;
	a.x = o->x, a.ids = o->ids, a.wts = o->w;
	if (o->route) {
		a.rt.lg = o->route->logits, a.rt.bias = o->route->bias, a.rt.k = o->np_r;
		a.rt.n_group = o->route->n_group, a.rt.n_group_used = o->route->n_group_used;
		a.rt.gating = o->route->gating, a.rt.norm = o->route->norm, a.rt.scale = o->route->scale;
		a.rt.ids = o->route->ids, a.rt.wts = o->route->weights;
	}
	a.pbuf = (float *)c->ws, a.seg = pl.seg, a.bar = c->tickets + MP_BAR_SLOT, a.err = c->err_dev;
	a.out = o->out, a.upw = pl.upw, a.n_lt = pl.n_lt, a.nrg_max = pl.nrg_max;
	a.flags = kcuda_prefetch_enabled() ? MP_PF_SH : 0;
	a.trace = mp_trace(pl.G);
	if (kprof_active)
		kprof_push(kprof_active,
		           o->route ? "moe.experts/route+ffn(persist)" : "moe.experts/ffn(persist)",
		           ktype_name(tg),
		           (double)o->np * (2.0 * 256.0 * (double)o->gate->row_bytes +
		                            (double)o->D * (double)o->down->row_bytes));
	const int rc = o->route ? mp_launch_t<true>(c, tg, td, a, pl) : mp_launch_t<false>(c, tg, td, a, pl);
	if (kprof_active)
		kprof_pop(kprof_active);
	return rc;
}
