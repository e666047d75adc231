/* Resident-weights decode GEMV ("gemv_res"): Y[t][r] = dot(W row r, X[t]) at n_tok 1..2 with ALL of a
 * block's weight rows copied into shared memory BEFORE griddepcontrol.wait.
 *
 * Why: at batch 1 the dense products of a GLM-5 layer (o 13.4 MB, idx_q_b 8.9 MB, q_b 4.5 MB) cost
 * 2.6-7.7 us each on the decode step's critical path (docs/PERFORMANCE.md, run16), against ~1-3 us
 * of DRAM time: each kernel's chain (DRAM load -> decode -> reduce -> the next rows' load) starts
 * only after its wait. Weights are never written while kernels run (cuda_common.cuh), and under PDL
 * a kernel's blocks become resident as soon as the kernel before has passed its own wait, i.e.
 * while that kernel still runs (v_b before o, the q_a group before idx_q_b). So every block here
 * issues cp.async copies of its RB whole rows at once, then waits; after the wait it loads only x
 * (a few KB from L2) and decodes from shared memory. Its critical-path chain is one L2 round trip
 * for x, ~RB x n_in / 128 decoded elements per thread, one warp reduction and one store.
 *
 * Why not matmul_multi.cu's kernel (which also copies its first K chunk before the wait): its
 * blocks hold 4 Q8_0 rows (9 KB at n_in 2048), so o needs 1536 blocks, more than the GPU holds at
 * once (8 per SM by registers: ~1056); the ~480 blocks of the second wave start their DRAM copies
 * only after first-wave blocks have finished, i.e. after the wait, and carry a whole DRAM latency
 * plus their bytes into the critical path. Here RB is chosen per product so the whole grid is one
 * wave of ~3-4 blocks per SM (o: 16 rows = 35 KB per block, 384 blocks; idx_q_b 8 rows, 512;
 * q_b 4 rows, 512), and its 16-row reduction is a butterfly (16 shuffles per warp for 16 rows, not
 * 80). multi keeps the grouped products (n_in 6144, 1..8 tokens).
 *
 * Layout (gemv3's slabs, matmul_impl.cuh): a row is n_slab slabs of SE elements / SB bytes; the tile
 * holds the block's RB rows back to back (row_bytes == n_slab SB apart). Warp w takes slabs
 * w, w + RES_NW, ...; lane l decodes elements EPL l .. EPL l + EPL - 1 of each (g3_decode) for every
 * row and reuses its x registers for the RB rows. x is held for RES_KX(T, NT) slabs at a time: all of a
 * warp's x in one group, i.e. one exposed L2 round trip, up to n_in 2048 (Q8_0) / 8192 (F32) at one
 * token and half that at two; longer rows take a round trip per group.
 * Sums: per lane over its slabs in order; then the warp's RB x NT values by a butterfly (at each step
 * half the values go to the partner lane: fixed order); then the warps in order through shared
 * memory. Reruns are bit-identical; fp32 throughout (exact weights, fp32 x), within fp32 summation
 * error of the CPU op (tests/ops/test_ops_gemv_res.c), not bit-equal to the other GEMVs.
 * Takes: Q8_0 (n_in % 256 == 0) and F32 (n_in % 128 == 0) with W 16-byte aligned, x 16-byte aligned,
 * ldx % 4 == 0, n_tok 1..2, RB rows fitting RES_MAX_SMEM; ERR_UNSUPPORTED otherwise (kcuda_matmul then
 * dispatches as before). Also H stacked matrices (kfwd_head_gemv: v_b), grid.y = head.
 * Rows are copied in up to 4 commit groups and, where a warp's x is one group, decoded group by group
 * as they land. Switches (read on every call): TANDEM_GEMV_RES unset takes single products of at
 * most TANDEM_GEMV_RES_AUTO_MB (8) MB, =1 everything it can, =0 nothing (res_mode says why);
 * TANDEM_GEMV_RES_RB=1|2|4|8|16 forces the rows per block,
 * TANDEM_GEMV_RES_BPS=n sets the blocks per SM the grid aims at (default 8); the stacked heads have
 * TANDEM_GEMV_RES_HRB / _HBPS (default 1); TANDEM_GEMV_RES_EARLY: which launches trigger the next
 * kernel before their wait (res_early). */
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/gemv_res.h"
#include "kernels/cuda/matmul_impl.cuh"

#define RES_NW 4 /* warps per block */
#define RES_MAX_RB 16
/* dynamic shared memory per block: with the static part[] (<= 512 bytes) under the 48 KB a launch
 * may use without the opt-in attribute */
#define RES_MAX_SMEM (47 * 1024)
/* slabs of x per warp held in registers at once (F32 slabs are half as long, and the F32 products at
 * batch 1 are few rows: the router's 6144 / 7168 floats fit one group) */
#define RES_KX(T, NT) (((T) == KT_F32 ? 16 : 2) / (NT))

/* Sums v[0..V) of every lane over the warp: afterwards lane l holds (in v[0]) the warp total of
 * value l / (32 / V) (V a power of two <= 32). Step M (16, 8, ..., 1) while N > 1 values are held:
 * the lane with bit M set keeps the upper half and sends the lower one to lane ^ M, so each step
 * halves the values; once one is left, plain xor steps. Templates keep every index static. */
template <int V, int N, int M> __device__ __forceinline__ void res_reduce_step(float (&v)[V], int lane)
{
	if constexpr (M >= 1) {
		if constexpr (N > 1) {
			const bool up = (lane & M) != 0;
#pragma unroll
			for (int i = 0; i < N / 2; i++) {
				const float send = up ? v[i] : v[i + N / 2];
				const float keep = up ? v[i + N / 2] : v[i];
				v[i] = keep + __shfl_xor_sync(0xffffffffu, send, M);
			}
			res_reduce_step<V, N / 2, M / 2>(v, lane);
		} else {
			v[0] += __shfl_xor_sync(0xffffffffu, v[0], M);
			res_reduce_step<V, 1, M / 2>(v, lane);
		}
	}
}
template <int V> __device__ __forceinline__ void res_warp_reduce(float (&v)[V], int lane)
{
	static_assert(V >= 1 && V <= 32 && (V & (V - 1)) == 0, "a power of two up to 32 values");
	res_reduce_step<V, V, 16>(v, lane);
}

/* launch_dependents BEFORE griddepcontrol.wait (as fused.cu's mla_latent): the next kernel's blocks
 * may become resident and start on their weights while the kernel before this one still runs. Safe
 * under cuda_common.cuh's rule (a kernel reads only weights, or the step inputs it names, before its
 * own wait): the next kernel's wait still waits for this grid, which completes only after this
 * grid's wait saw its predecessor complete. */
__device__ __forceinline__ void res_trigger_early(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* cp.async.wait_group n for a count known only after unrolling (0..3) */
__device__ __forceinline__ void res_wait_groups(int n)
{
	switch (n) {
	case 0: g3_wait<0>(); break;
	case 1: g3_wait<1>(); break;
	case 2: g3_wait<2>(); break;
	default: g3_wait<3>(); break;
	}
}

/* grid (ceil(n_out / RB), H) blocks of RES_NW warps; block (b, h) owns rows [b RB, b RB + RB) of
 * matrix h (W + h mat_bytes, x + h xhs, y + h yhs; H = 1 for a plain product) (clamped to the last
 * row for the copies; rows past n_out are not written) */
template <int T, int NT, int RB>
__global__ void __launch_bounds__(RES_NW * 32)
    gemv_res_kernel(const uint8_t *__restrict__ w, size_t mat_bytes, size_t row_bytes, int n_out, int n_slab,
                    const float *x, int64_t ldx, int64_t xhs, int n_tok, float *y, int64_t ldy, int64_t yhs,
                    int pf, int early)
{
	constexpr int SE = g3t<T>::SE, SB = g3t<T>::SB, EPL = g3t<T>::EPL, KX = RES_KX(T, NT);
	constexpr int V = RB * NT;
	/* the rows are copied in G commit groups of RG rows: where a warp's x is one group (n_in up to
	 * 2048 at one token, 1024 at two), row group g is decoded as soon as its copies have landed,
	 * while later groups are still in flight (weights that did not arrive before the wait) */
	constexpr int G = RB >= 4 ? 4 : RB, RG = RB / G;
	extern __shared__ __align__(16) uint8_t res_tile[];
	__shared__ float part[RES_NW][V];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int row0 = blockIdx.x * RB;
	w += (size_t)blockIdx.y * mat_bytes;
	y += (int64_t)blockIdx.y * yhs;
	const int upr = (int)(row_bytes / 16); /* 16-byte copies per row */

	/* every row of the block into shared memory: weights only, so before the wait when allowed */
	if (early) /* TANDEM_GEMV_RES_EARLY (res_early) */
		res_trigger_early();
	if (!pf)
		KDEP_ENTRY();
#pragma unroll
	for (int gr = 0; gr < G; gr++) {
#pragma unroll
		for (int r = gr * RG; r < gr * RG + RG; r++) {
			const uint8_t *src = w + (size_t)min(row0 + r, n_out - 1) * row_bytes;
			for (int u = tid; u < upr; u += RES_NW * 32)
				g3_cp16(res_tile + (size_t)r * row_bytes + 16 * (size_t)u,
				        src + 16 * (size_t)u);
		}
		g3_commit();
	}
	if (pf)
		KDEP_ENTRY();
	const float *const xb = kdep_after(x) + (int64_t)blockIdx.y * xhs; /* x only from here on */

	/* this warp's slabs: warp + RES_NW k, k = 0 .. n_k - 1, in groups of KX */
	const int n_k = n_slab > warp ? (n_slab - warp + RES_NW - 1) / RES_NW : 0;
	/* x of group g (zeros past this warp's slabs and past n_tok) */
	auto load_x = [&](int g, float(&xs)[KX][NT][EPL]) {
#pragma unroll
		for (int k = 0; k < KX; k++) {
			const int kk = g * KX + k;
#pragma unroll
			for (int t = 0; t < NT; t++) {
				if (kk < n_k && t < n_tok) {
					const float4 *q =
					    (const float4 *)(xb + (int64_t)t * ldx +
					                     (size_t)(warp + RES_NW * kk) * SE + EPL * lane);
#pragma unroll
					for (int e = 0; e < EPL / 4; e++) {
						const float4 f = q[e]; /* plain (coherent) load */
						xs[k][t][4 * e] = f.x, xs[k][t][4 * e + 1] = f.y;
						xs[k][t][4 * e + 2] = f.z, xs[k][t][4 * e + 3] = f.w;
					}
				} else {
#pragma unroll
					for (int e = 0; e < EPL; e++)
						xs[k][t][e] = 0.0f;
				}
			}
		}
	};
	float acc[V];
#pragma unroll
	for (int i = 0; i < V; i++)
		acc[i] = 0.0f;
	/* row r of this warp's slab k (its x in xs[kx]) into acc */
	auto fma_row = [&](const float(&xs)[KX][NT][EPL], int kx, int k, int r) {
		g3_row<T> wr;
		g3_decode<T>(res_tile + (size_t)r * row_bytes + (size_t)(warp + RES_NW * k) * SB, lane, wr);
#pragma unroll
		for (int t = 0; t < NT; t++) {
			float p0 = 0.0f, p1 = 0.0f;
#pragma unroll
			for (int e = 0; e < EPL; e += 2) {
				p0 = fmaf(wr.v[e], xs[kx][t][e], p0);
				p1 = fmaf(wr.v[e + 1], xs[kx][t][e + 1], p1);
			}
			acc[r * NT + t] = fmaf(wr.d, p0 + p1, acc[r * NT + t]);
		}
	};
	float xc[KX][NT][EPL];
	load_x(0, xc); /* in flight while the copies land */
	/* x groups of the warp with the most slabs (warp 0): the branch below must be block-uniform */
	const int n_g = ((n_slab + RES_NW - 1) / RES_NW + KX - 1) / KX;
	if (n_g <= 1) {
		/* row group by row group as the copies land; per row the slabs in the same order as below */
#pragma unroll
		for (int gr = 0; gr < G; gr++) {
			res_wait_groups(G - 1 - gr);
			__syncthreads(); /* every thread's copies of row group gr are visible */
#pragma unroll
			for (int k = 0; k < KX; k++) {
				if (k >= n_k)
					break;
#pragma unroll
				for (int r = gr * RG; r < gr * RG + RG; r++)
					fma_row(xc, k, k, r);
			}
		}
	} else {
		g3_wait<0>();
		__syncthreads(); /* every thread's copies are visible */
		for (int g = 0; g < n_g; g++) {
#pragma unroll
			for (int k = 0; k < KX; k++) {
				if (g * KX + k >= n_k)
					break;
#pragma unroll
				for (int r = 0; r < RB; r++)
					fma_row(xc, k, g * KX + k, r);
			}
			if (g + 1 < n_g) /* rows longer than one group: the next group's x (L1 / L2) */
				load_x(g + 1, xc);
		}
	}
	res_warp_reduce<V>(acc, lane);
	constexpr int LPV = 32 / V; /* lanes per value after the reduction */
	if (lane % LPV == 0)
		part[warp][lane / LPV] = acc[0];
	__syncthreads();
	if (tid < V) {
		const int r = tid / NT, t = tid % NT;
		float s = 0.0f;
#pragma unroll
		for (int k = 0; k < RES_NW; k++) /* warp order: deterministic */
			s += part[k][tid];
		if (t < n_tok && row0 + r < n_out)
			y[(int64_t)t * ldy + row0 + r] = s;
	}
}

/* TANDEM_GEMV_RES_ONLY (read on every call; unset or empty: every product the kernel takes): a
 * comma-separated list of the products it may take, for step A/B runs that isolate one product. Names
 * (the per-rank shapes of GLM-5 / DeepSeek-V3 at TP=8, n_in x n_out): o = 2048x6144 or 2048x7168,
 * q_b = 2048x2048 or 1536x3072, idx_q_b = 2048x4096, router = any F32 product, v_b = any stacked heads
 * (kfwd_head_gemv); or an exact shape "NxM" of a single product. */
static bool res_tok_is(const char *t, size_t n, const char *name)
{
	return strlen(name) == n && strncmp(t, name, n) == 0;
}
static bool res_selected(const struct kweight *w, int H)
{
	const char *e = getenv("TANDEM_GEMV_RES_ONLY");
	if (!e || !*e)
		return true;
	const long long ni = (long long)w->n_in, no = (long long)w->n_out;
	for (const char *t = e; *t;) {
		const char *end = strchr(t, ',');
		const size_t n = end ? (size_t)(end - t) : strlen(t);
		bool hit;
		if (H > 1)
			hit = res_tok_is(t, n, "v_b") || res_tok_is(t, n, "heads");
		else if (w->type == KT_F32)
			hit = res_tok_is(t, n, "router") || res_tok_is(t, n, "f32");
		else {
			hit = (res_tok_is(t, n, "o") && ni == 2048 && (no == 6144 || no == 7168)) ||
			      (res_tok_is(t, n, "q_b") &&
			       ((ni == 2048 && no == 2048) || (ni == 1536 && no == 3072))) ||
			      (res_tok_is(t, n, "idx_q_b") && ni == 2048 && no == 4096);
			char shape[64];
			if (!hit && n < sizeof(shape)) {
				long long a = 0, b = 0;
				char tail = 0;
				memcpy(shape, t, n);
				shape[n] = 0;
				hit = sscanf(shape, "%lldx%lld%c", &a, &b, &tail) == 2 && a == ni && b == no;
			}
		}
		if (hit)
			return true;
		if (!end)
			break;
		t = end + 1;
	}
	return false;
}

static int env_int(const char *name, int dflt)
{
	const char *e = getenv(name);
	return e && *e ? atoi(e) : dflt;
}

/* TANDEM_GEMV_RES_EARLY (read on every call): which gemv_res launches trigger the next kernel before
 * their wait. Default (unset): the stacked heads only, i.e. v_b, whose next kernel is the o product
 * (weights only before its wait), so o's blocks can start on its 13.4 MB while the MLA decode before
 * v_b still runs; `1`: every gemv_res launch; `0`: none. 0 / 1 / 2 = none / heads / all. */
static int res_early(void)
{
	const char *e = getenv("TANDEM_GEMV_RES_EARLY");
	if (!e || !*e)
		return 1;
	return strcmp(e, "0") == 0 ? 0 : (strcmp(e, "1") == 0 ? 2 : 1);
}

/* TANDEM_GEMV_RES (read on every call): `1` every product the kernel takes, `0` none; unset (auto):
 * single products (no stacked heads) of at most TANDEM_GEMV_RES_AUTO_MB (default 8) MB of weights.
 * Why auto takes only those: the H200 step A/B of 2026-11-30 (synthetic GLM-5 rank 0 of TP=8, ctx 4096,
 * graphs, product by product with TANDEM_GEMV_RES_ONLY) measured q_b (4.5 MB) -0.13..-0.2 ms and the
 * F32 router (6.3 MB) -0.15 ms at batch 1, both together 7.45 / 7.44 -> 7.26 / 7.20 ms (ctx 32k 8.96 ->
 * 8.70), batch 8 unchanged; but o (13.4 MB) +0.3, idx_q_b (8.9 MB) +0.2 and the stacked v_b +0.2: the
 * large grids' blocks sit resident on registers and shared memory the kernels beside them need. */
static int res_mode(void) /* 0 off, 1 all, 2 auto */
{
	const char *e = getenv("TANDEM_GEMV_RES");
	if (e && strcmp(e, "0") == 0)
		return 0;
	return e && strcmp(e, "1") == 0 ? 1 : 2;
}

extern "C" bool kcuda_gemv_res_enabled(void)
{
	return res_mode() != 0;
}

/* auto mode: whether this call is one it takes (see res_mode) */
static bool res_auto_takes(const struct kweight *w, int H)
{
	if (H != 1)
		return false;
	const char *e = getenv("TANDEM_GEMV_RES_AUTO_MB");
	const double mb = e && *e ? atof(e) : 8.0;
	return (double)w->row_bytes * (double)w->n_out <= mb * 1e6;
}

/* blocks per SM the single products' grids aim at: 8 since session 27 (H200, batch 1: DeepSeek-V3 5.03-5.04
 * -> 4.93-4.99 ms a step in four passes, GLM-5 within noise); 4 before */
#define RES_BPS_DEFAULT 8

/* rows per block: the fewest (from 1, 2, 4, 8, 16) that keep the grid (all H matrices) within bps
 * blocks per SM (one wave beside the kernel before), then halved while a block's rows exceed
 * RES_MAX_SMEM; TANDEM_GEMV_RES_RB (heads: _HRB) forces it (still bounded by RES_MAX_SMEM). 0: no
 * block fits. */
static int res_rows(int64_t n_out, int64_t H, size_t row_bytes, int n_sm)
{
	/* stacked heads (v_b) have their own knobs and aim at ONE block per SM: v_b runs beside mla_dec
	 * (one block of 128 x 222 registers per SM) and, with its early trigger, so do o's blocks; 128
	 * v_b blocks of 16 rows (95 registers) leave room for two o blocks per SM where 512 blocks of 4
	 * rows (4 per SM x 48 registers) leave one */
	const bool heads = H > 1;
	int rb = env_int(heads ? "TANDEM_GEMV_RES_HRB" : "TANDEM_GEMV_RES_RB", 0);
	if (rb != 1 && rb != 2 && rb != 4 && rb != 8 && rb != 16) {
		int bps = env_int(heads ? "TANDEM_GEMV_RES_HBPS" : "TANDEM_GEMV_RES_BPS",
		                  heads ? 1 : RES_BPS_DEFAULT);
		bps = bps < 1 ? 1 : (bps > 32 ? 32 : bps);
		const int64_t max_blk = (int64_t)(n_sm > 0 ? n_sm : 132) * bps;
		rb = 1;
		while (rb < RES_MAX_RB && H * ((n_out + rb - 1) / rb) > max_blk)
			rb *= 2;
	}
	while (rb > 1 && (size_t)rb * row_bytes > RES_MAX_SMEM)
		rb /= 2;
	return (size_t)rb * row_bytes <= RES_MAX_SMEM ? rb : 0;
}

/* one call: H stacked matrices W_h = w->data + h mat_bytes (H = 1: a plain product) */
struct res_call {
	const struct kweight *w;
	size_t mat_bytes;
	int H;
	const float *x;
	int64_t ldx, xhs;
	int n_tok;
	float *y;
	int64_t ldy, yhs;
	int early; /* trigger the next kernel before the wait (res_early) */
};

template <int T, int NT, int RB> static int res_launch(struct kcuda_ctx *c, const struct res_call &a)
{
	const dim3 grid((unsigned)((a.w->n_out + RB - 1) / RB), (unsigned)a.H);
	const int n_slab = (int)(a.w->n_in / g3t<T>::SE);
	return klaunch("gemv_res", gemv_res_kernel<T, NT, RB>, grid, dim3(RES_NW * 32),
	               (size_t)RB * a.w->row_bytes, c->stream, (const uint8_t *)a.w->data, a.mat_bytes,
	               a.w->row_bytes, (int)a.w->n_out, n_slab, a.x, a.ldx, a.xhs, a.n_tok, a.y, a.ldy, a.yhs,
	               kcuda_prefetch_enabled(), a.early);
}

template <int T, int NT> static int res_launch_rb(struct kcuda_ctx *c, int rb, const struct res_call &a)
{
	switch (rb) {
	case 1: return res_launch<T, NT, 1>(c, a);
	case 2: return res_launch<T, NT, 2>(c, a);
	case 4: return res_launch<T, NT, 4>(c, a);
	case 8: return res_launch<T, NT, 8>(c, a);
	default: return res_launch<T, NT, 16>(c, a);
	}
}

template <int T> static int res_launch_t(struct kcuda_ctx *c, int rb, const struct res_call &a)
{
	return a.n_tok == 1 ? res_launch_rb<T, 1>(c, rb, a) : res_launch_rb<T, 2>(c, rb, a);
}

/* The kernel's own limits (the callers have validated the shapes: row_bytes matches type and
 * n_in, x / y strides cover the rows and heads); ERR_UNSUPPORTED with nothing enqueued. */
static int res_run(struct kcuda_ctx *c, const struct res_call &a)
{
	const struct kweight *w = a.w;
	const int mode = res_mode();
	if (mode == 0 || a.n_tok < 1 || a.n_tok > 2 || a.H < 1 || a.H > 65535 || !res_selected(w, a.H) ||
	    (mode == 2 && !res_auto_takes(w, (int)a.H)))
		return ERR_UNSUPPORTED;
	int se, sb;
	if (w->type == KT_Q8_0)
		se = g3t<KT_Q8_0>::SE, sb = g3t<KT_Q8_0>::SB;
	else if (w->type == KT_F32)
		se = g3t<KT_F32>::SE, sb = g3t<KT_F32>::SB;
	else
		return ERR_UNSUPPORTED;
	const int64_t big = (int64_t)1 << 40;
	if (w->n_in <= 0 || w->n_in % se || w->row_bytes != (size_t)(w->n_in / se) * (size_t)sb ||
	    w->row_bytes % 16 || (uintptr_t)w->data % 16 || a.mat_bytes % 16 || (uintptr_t)a.x % 16 ||
	    a.ldx % 4 || a.xhs % 4 || w->n_out < 1 || w->n_out > INT32_MAX / 2 || a.ldx > big ||
	    a.ldy > big || a.xhs < 0 || a.xhs > big || a.yhs < 0 || a.yhs > big ||
	    a.mat_bytes > ((size_t)1 << 40))
		return ERR_UNSUPPORTED;
	const int rb = res_rows(w->n_out, a.H, w->row_bytes, c->n_sm);
	if (rb < 1)
		return ERR_UNSUPPORTED;
	return w->type == KT_Q8_0 ? res_launch_t<KT_Q8_0>(c, rb, a) : res_launch_t<KT_F32>(c, rb, a);
}

int kcuda_gemv_res_launch(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx,
                          int n_tok, float *y, int64_t ldy)
{
	const struct res_call a = {w, 0, 1, x, ldx, 0, n_tok, y, ldy, 0, res_early() > 1};
	return res_run(c, a);
}

extern "C" int kcuda_gemv_res_heads(struct kcuda_ctx *c, const struct kweight *w0, size_t mat_bytes, int H,
                                    const float *x, int64_t ldx, int64_t xhs, int n_tok, float *y,
                                    int64_t ldy, int64_t yhs)
{
	const struct res_call a = {w0, mat_bytes, H, x, ldx, xhs, n_tok, y, ldy, yhs, res_early() > 0};
	return res_run(c, a);
}

extern "C" int kcuda_gemv_res(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx,
                              int64_t n_tok, float *y, int64_t ldy)
{
	if (!c || !w || !w->data || !x || !y)
		return kcuda_bad_arg("gemv_res", "null context, weight, weight data, x or y");
	size_t rb = 0;
	if (!ktype_row_bytes(w->type, w->n_in, &rb) || rb != w->row_bytes)
		return kcuda_bad_arg("gemv_res", "%s weight with n_in %lld has row_bytes %zu (want %zu)",
		                     ktype_name(w->type), (long long)w->n_in, w->row_bytes, rb);
	if (ldx < w->n_in || ldy < w->n_out)
		return kcuda_bad_arg("gemv_res", "ldx %lld < n_in %lld or ldy %lld < n_out %lld",
		                     (long long)ldx, (long long)w->n_in, (long long)ldy, (long long)w->n_out);
	if (n_tok < 1 || n_tok > 2)
		return ERR_UNSUPPORTED;
	return kcuda_gemv_res_launch(c, w, x, ldx, (int)n_tok, y, ldy);
}

extern "C" int kcuda_gemv_res_rows(const struct kcuda_ctx *c, const struct kweight *w, int H)
{
	if (!c || !w || (w->type != KT_Q8_0 && w->type != KT_F32) || w->n_out < 1)
		return 0;
	return H < 1 ? 0 : res_rows(w->n_out, H, w->row_bytes, c->n_sm);
}
