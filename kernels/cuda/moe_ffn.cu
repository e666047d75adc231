/* The routed-expert FFN of a MoE layer on the GPU (common/model/forward.c, FFN of a MoE layer,
 * without the shared expert, which is a plain kcuda_matmul chain):
 *   out[i] = sum_j w[i][j] * down_e(SiLU(gate_e x_i) * up_e x_i),  e = ids[i][j].
 * The stacked expert tensors stay in their GGUF quant types on the device (kcuda_weight_upload of
 * all E*F rows); expert e's rows are [e F, e F + F) (gate, up) and [e D, e D + D) (down).
 * Up to 256 tokens of the K-quants and Q8_0 go to the tensor-core path (moe_mma.cu, which also
 * takes the shared expert: kcuda_moe_ffn_shexp) unless TANDEM_MOE_FAST=0; the kernels below serve
 * the other types and shapes, and everything under that switch.
 *
 * Decode (n <= 16 tokens): every (token, expert) pair in one launch per stage, no host sync:
 *   gate_up kernel, grid (F / 4, n*k): a warp per (pair, row f) dots the gate and up rows of e with
 *     x_i (pieces of 16 decoded by the `cuda` helper's kq<T> decoders, quant_piece.cuh) and writes
 *     h[pair][f] = SiLU(g) * u (kcpu_swiglu's formula);
 *   down kernel, grid (D / 4, n*k): y[pair][d] = down row (e, d) . h[pair];
 *   combine kernel: out[i][d] = sum_j w[i][j] y[i k + j][d] in slot order (deterministic).
 *   h and y live in the context workspace.
 * Batched decode (16 < n <= 256 tokens, TANDEM_MOE_SORTED unset or not 0): still no host sync, so
 * CUDA graphs can hold it, and each expert row is read once per 8 of its tokens instead of once
 * per pair:
 *   sort kernel (one block): the pairs counted and listed per expert (shared-memory atomics; the
 *     order inside an expert's list does not matter, every pair's sums are its own), the active
 *     experts listed;
 *   gate_up kernel, grid (F / 4, min(n*k, E) active-expert slots): a warp per row f of expert e
 *     walks the row's pieces once for up to 8 of e's pairs, keeping 8 gate and 8 up sums per lane;
 *   down kernel, grid (D / 16, slots): a warp per row d (4 rows per warp), the same 8-pair chunks;
 *   combine kernel as above (NaN for a pair whose id was out of range).
 *   Every pair's sums are taken in the same lane / piece order as the pair kernels, so the two
 *   paths give bit-identical outputs (tests/ops/test_ops_moe.c checks it).
 * Prefill (more tokens; from TANDEM_MOE_MMA_MIN=n tokens on when set, 1..257): moe_prefill.cu
 * (grouped tensor-core GEMMs, no host sync) unless TANDEM_PREFILL_FAST=0 / TANDEM_MOE_PREFILL=0 or
 * the shapes do not fit it; otherwise (the old path) ids are downloaded once, (token, weight) pairs grouped
 * by expert on the host (counting sort, as the CPU), and each expert with tokens runs gather -> kcuda_matmul
 * (tensor-core GEMM for > 8 tokens) gate and up -> kcuda_swiglu -> kcuda_matmul down -> scaled
 * scatter-add into out; experts run one after another on the stream, so the adds do not race.
 * Scratch for this path is allocated per call (the GEMM owns the workspace). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/moe_mma.h"
#include "kernels/cuda/moe_prefill.h"
#include "kernels/cuda/prof.h"
#include "kernels/cuda/quant_piece.cuh"

#define MOE_WARPS 4
#define MOE_DECODE_MAX 16
#define MOE_SORTED_MAX 256 /* tokens; the sort kernel's block holds E counters (E <= 1024) */
#define MOE_TB 8 /* pairs of one expert per pass over a row */
#define MOE_DOWN_RPW 4 /* down rows per warp */

template <int T>
__device__ __forceinline__ float moe_dot(const uint8_t *row, const float *__restrict__ x, int64_t n_in,
                                         int lane)
{
	float acc = 0.0f;
	const int64_t np = n_in / 16;
	for (int64_t p = lane; p < np; p += 32) {
		float v[16];
		kq_values<T>(row, p, v);
#pragma unroll
		for (int i = 0; i < 16; i++)
			acc = fmaf(v[i], x[16 * p + i], acc);
	}
	return kc_warp_sum(acc);
}

template <int T>
__global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_gate_up_kernel(const uint8_t *__restrict__ wg, const uint8_t *__restrict__ wu, size_t row_bytes,
                       int64_t D, int64_t F, int64_t E, const float *__restrict__ x, int64_t ldx,
                       const int32_t *__restrict__ ids, int k, float *__restrict__ h, unsigned *err)
{
	KDEP_ENTRY();
	const int lane = threadIdx.x & 31;
	const int64_t f = (int64_t)blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
	const int64_t pair = blockIdx.y;
	if (f >= F)
		return;
	const int32_t e = ids[pair];
	if (e < 0 || e >= E) {
		if (lane == 0) {
			h[pair * F + f] = NAN;
			if (f == 0)
				atomicAdd(err, 1u);
		}
		return;
	}
	const float *xi = x + (pair / k) * ldx;
	const size_t r = ((size_t)e * (size_t)F + (size_t)f) * row_bytes;
	const float g = moe_dot<T>(wg + r, xi, D, lane);
	const float u = moe_dot<T>(wu + r, xi, D, lane);
	if (lane == 0)
		h[pair * F + f] = g / (1.0f + expf(-g)) * u;
}

template <int T>
__global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_down_kernel(const uint8_t *__restrict__ wd, size_t row_bytes, int64_t D, int64_t F, int64_t E,
                    const float *__restrict__ h, const int32_t *__restrict__ ids, float *__restrict__ y)
{
	KDEP_ENTRY();
	const int lane = threadIdx.x & 31;
	const int64_t d = (int64_t)blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
	const int64_t pair = blockIdx.y;
	if (d >= D)
		return;
	const int32_t e = ids[pair];
	if (e < 0 || e >= E) {
		if (lane == 0)
			y[pair * D + d] = NAN;
		return;
	}
	const float v =
	    moe_dot<T>(wd + ((size_t)e * (size_t)D + (size_t)d) * row_bytes, h + pair * F, F, lane);
	if (lane == 0)
		y[pair * D + d] = v;
}

__global__ void moe_combine_kernel(const float *__restrict__ y, const float *__restrict__ w, int k, int64_t D,
                                   float *__restrict__ out, int64_t ldo)
{
	KDEP_ENTRY();
	const int64_t i = blockIdx.y;
	const int64_t d = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (d >= D)
		return;
	float s = 0.0f;
	for (int j = 0; j < k; j++)
		s = fmaf(w[i * k + j], y[(i * k + j) * D + d], s);
	out[i * ldo + d] = s;
}

/* meta = [n_act][act: E][off: E + 1][list: np]: active experts, then each expert's pairs */
__global__ void moe_sort_kernel(const int32_t *__restrict__ ids, int np, int E, int32_t *__restrict__ meta,
                                unsigned *err)
{
	KDEP_ENTRY();
	extern __shared__ int cnt_s[]; /* [E] counts, then [E] cursors */
	int *cur_s = cnt_s + E;
	int32_t *act = meta + 1, *off = act + E, *list = off + E + 1;
	for (int e = threadIdx.x; e < E; e += blockDim.x)
		cnt_s[e] = 0;
	__syncthreads();
	for (int i = threadIdx.x; i < np; i += blockDim.x) {
		const int e = ids[i];
		if (e >= 0 && e < E)
			atomicAdd(&cnt_s[e], 1);
		else
			atomicAdd(err, 1u);
	}
	__syncthreads();
	if (threadIdx.x == 0) { /* E <= 1024: a serial scan is ~1 us */
		int s = 0, na = 0;
		for (int e = 0; e < E; e++) {
			off[e] = s;
			cur_s[e] = s;
			s += cnt_s[e];
			if (cnt_s[e])
				act[na++] = e;
		}
		off[E] = s;
		meta[0] = na;
	}
	__syncthreads();
	for (int i = threadIdx.x; i < np; i += blockDim.x) {
		const int e = ids[i];
		if (e >= 0 && e < E)
			list[atomicAdd(&cur_s[e], 1)] = i;
	}
}

template <int T>
__global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_gate_up_sorted_kernel(const uint8_t *__restrict__ wg, const uint8_t *__restrict__ wu,
                              size_t row_bytes, int64_t D, int64_t F, const float *__restrict__ x,
                              int64_t ldx, int k, const int32_t *__restrict__ meta, int E,
                              float *__restrict__ h)
{
	KDEP_ENTRY();
	const int lane = threadIdx.x & 31;
	const int64_t f = (int64_t)blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
	const int32_t *act = meta + 1, *off = act + E, *list = off + E + 1;
	if (f >= F || (int)blockIdx.y >= meta[0])
		return;
	const int e = act[blockIdx.y], b = off[e], cnt = off[e + 1] - b;
	const size_t r = ((size_t)e * (size_t)F + (size_t)f) * row_bytes;
	const int64_t np16 = D / 16;
	for (int c0 = 0; c0 < cnt; c0 += MOE_TB) {
		const int nt = min(MOE_TB, cnt - c0);
		const float *xs[MOE_TB];
		float ag[MOE_TB], au[MOE_TB];
#pragma unroll
		for (int t = 0; t < MOE_TB; t++) {
			xs[t] = x + (int64_t)(list[b + c0 + (t < nt ? t : 0)] / k) * ldx;
			ag[t] = au[t] = 0.0f;
		}
		for (int64_t p = lane; p < np16; p += 32) {
			float vg[16], vu[16];
			kq_values<T>(wg + r, p, vg);
			kq_values<T>(wu + r, p, vu);
#pragma unroll
			for (int t = 0; t < MOE_TB; t++) {
				if (t >= nt)
					break;
				const float *xp = xs[t] + 16 * p;
#pragma unroll
				for (int i = 0; i < 16; i++) {
					ag[t] = fmaf(vg[i], xp[i], ag[t]);
					au[t] = fmaf(vu[i], xp[i], au[t]);
				}
			}
		}
		for (int t = 0; t < nt; t++) {
			const float g = kc_warp_sum(ag[t]), u = kc_warp_sum(au[t]);
			if (lane == 0)
				h[(int64_t)list[b + c0 + t] * F + f] = g / (1.0f + expf(-g)) * u;
		}
	}
}

template <int T>
__global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_down_sorted_kernel(const uint8_t *__restrict__ wd, size_t row_bytes, int64_t D, int64_t F,
                           const float *__restrict__ h, const int32_t *__restrict__ meta, int E,
                           float *__restrict__ y)
{
	KDEP_ENTRY();
	const int lane = threadIdx.x & 31;
	const int32_t *act = meta + 1, *off = act + E, *list = off + E + 1;
	if ((int)blockIdx.y >= meta[0])
		return;
	const int e = act[blockIdx.y], b = off[e], cnt = off[e + 1] - b;
	const int64_t np16 = F / 16;
	const int64_t d0 = ((int64_t)blockIdx.x * MOE_WARPS + (threadIdx.x >> 5)) * MOE_DOWN_RPW;
	for (int64_t d = d0; d < d0 + MOE_DOWN_RPW && d < D; d++) {
		const uint8_t *row = wd + ((size_t)e * (size_t)D + (size_t)d) * row_bytes;
		for (int c0 = 0; c0 < cnt; c0 += MOE_TB) {
			const int nt = min(MOE_TB, cnt - c0);
			const float *hs[MOE_TB];
			float acc[MOE_TB];
#pragma unroll
			for (int t = 0; t < MOE_TB; t++) {
				hs[t] = h + (int64_t)list[b + c0 + (t < nt ? t : 0)] * F;
				acc[t] = 0.0f;
			}
			for (int64_t p = lane; p < np16; p += 32) {
				float v[16];
				kq_values<T>(row, p, v);
#pragma unroll
				for (int t = 0; t < MOE_TB; t++) {
					if (t >= nt)
						break;
					const float *hp = hs[t] + 16 * p;
#pragma unroll
					for (int i = 0; i < 16; i++)
						acc[t] = fmaf(v[i], hp[i], acc[t]);
				}
			}
			for (int t = 0; t < nt; t++) {
				const float s = kc_warp_sum(acc[t]);
				if (lane == 0)
					y[(int64_t)list[b + c0 + t] * D + d] = s;
			}
		}
	}
}

/* out[i] = sum_j w[i][j] y[i k + j]; a pair with an expert id out of range gives NaN */
__global__ void moe_combine_ids_kernel(const float *__restrict__ y, const float *__restrict__ w,
                                       const int32_t *__restrict__ ids, int E, int k, int64_t D,
                                       float *__restrict__ out, int64_t ldo)
{
	KDEP_ENTRY();
	const int64_t i = blockIdx.y;
	const int64_t d = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (d >= D)
		return;
	float s = 0.0f;
	for (int j = 0; j < k; j++) {
		const int32_t e = ids[i * k + j];
		s = e >= 0 && e < E ? fmaf(w[i * k + j], y[(i * k + j) * D + d], s) : NAN;
	}
	out[i * ldo + d] = s;
}

/* prefill helpers: xs[j] = x[tok[j]]; out[tok[j]] += w[j] * ys[j] */
__global__ void moe_gather_kernel(const float *__restrict__ x, int64_t ldx, const int32_t *__restrict__ tok,
                                  int64_t D, float *__restrict__ xs)
{
	KDEP_ENTRY();
	const int64_t j = blockIdx.y;
	for (int64_t d = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; d < D;
	     d += (int64_t)gridDim.x * blockDim.x)
		xs[j * D + d] = x[(int64_t)tok[j] * ldx + d];
}
__global__ void moe_scatter_kernel(const float *__restrict__ ys, const int32_t *__restrict__ tok,
                                   const float *__restrict__ w, int64_t D, float *__restrict__ out,
                                   int64_t ldo)
{
	KDEP_ENTRY();
	const int64_t j = blockIdx.y;
	for (int64_t d = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; d < D;
	     d += (int64_t)gridDim.x * blockDim.x)
		out[(int64_t)tok[j] * ldo + d] = fmaf(w[j], ys[j * D + d], out[(int64_t)tok[j] * ldo + d]);
}

/* gate and up share a type (checked); down may differ (llama.cpp's Q4_K_M keeps some ffn_down_exps
 * in Q6_K): each stage is dispatched on its own weight's type */
template <int T>
static int moe_gate_up_t(struct kcuda_ctx *c, const float *x, int64_t ldx, int64_t np, const int32_t *ids,
                         int k, const struct kweight *gate, const struct kweight *up, int64_t E, int64_t F,
                         float *h)
{
	dim3 g1((unsigned)((F + MOE_WARPS - 1) / MOE_WARPS), (unsigned)np);
	return klaunch("moe_gate_up", moe_gate_up_kernel<T>, dim3(g1), dim3(MOE_WARPS * 32), 0, c->stream,
	               (const uint8_t *)gate->data, (const uint8_t *)up->data, gate->row_bytes, gate->n_in, F,
	               E, x, ldx, ids, k, h, c->err_dev);
}

template <int T>
static int moe_down_t(struct kcuda_ctx *c, int64_t np, const int32_t *ids, const struct kweight *down,
                      int64_t D, int64_t E, int64_t F, const float *h, float *y)
{
	dim3 g2((unsigned)((D + MOE_WARPS - 1) / MOE_WARPS), (unsigned)np);
	return klaunch("moe_down", moe_down_kernel<T>, dim3(g2), dim3(MOE_WARPS * 32), 0, c->stream,
	               (const uint8_t *)down->data, down->row_bytes, D, F, E, h, ids, y);
}

/* stages of the decode path in the profile (prof.h), nested under the backend's moe.experts */
static void stage_begin(const char *name, const struct kweight *w, double rows)
{
	if (kprof_active)
		kprof_push(kprof_active, name, w ? ktype_name(w->type) : NULL,
		           w ? rows * (double)w->row_bytes : 0.0);
}
static void stage_end(void)
{
	if (kprof_active)
		kprof_pop(kprof_active);
}

static int moe_decode(struct kcuda_ctx *c, const float *x, int64_t ldx, int64_t n, const int32_t *ids,
                      const float *weights, int k, const struct kweight *gate, const struct kweight *up,
                      const struct kweight *down, int64_t E, int64_t F, float *out, int64_t ldo)
{
	const int64_t D = gate->n_in, np = n * k;
	if ((size_t)np * (size_t)(F + D) * sizeof(float) > c->ws_bytes)
		return ERR_LIMIT;
	float *h = (float *)c->ws, *y = h + np * F;
	int rc = ERR_UNSUPPORTED;
	stage_begin("moe.experts/gate_up(pairs)", gate, 2.0 * (double)np * (double)F);
	switch (gate->type) {
#define X(T)                                                                                                 \
	case T: rc = moe_gate_up_t<T>(c, x, ldx, np, ids, k, gate, up, E, F, h); break;
		KCUDA_FOR_EACH_TYPE(X)
#undef X
	default: break;
	}
	stage_end();
	if (rc)
		return rc;
	rc = ERR_UNSUPPORTED;
	stage_begin("moe.experts/down(pairs)", down, (double)np * (double)D);
	switch (down->type) {
#define X(T)                                                                                                 \
	case T: rc = moe_down_t<T>(c, np, ids, down, D, E, F, h, y); break;
		KCUDA_FOR_EACH_TYPE(X)
#undef X
	default: break;
	}
	stage_end();
	if (rc)
		return rc;
	stage_begin("moe.experts/combine", NULL, 0);
	dim3 g3((unsigned)((D + 255) / 256), (unsigned)n);
	rc = klaunch("moe_combine", moe_combine_kernel, dim3(g3), dim3(256), 0, c->stream, y, weights, k, D,
	             out, ldo);
	stage_end();
	return rc;
}

template <int T>
static int moe_gate_up_sorted_t(struct kcuda_ctx *c, const float *x, int64_t ldx, int64_t slots, int k,
                                const int32_t *meta, int E, const struct kweight *gate,
                                const struct kweight *up, int64_t F, float *h)
{
	dim3 g1((unsigned)((F + MOE_WARPS - 1) / MOE_WARPS), (unsigned)slots);
	return klaunch("moe_gate_up_sorted", moe_gate_up_sorted_kernel<T>, dim3(g1), dim3(MOE_WARPS * 32), 0,
	               c->stream, (const uint8_t *)gate->data, (const uint8_t *)up->data, gate->row_bytes,
	               gate->n_in, F, x, ldx, k, meta, E, h);
}

template <int T>
static int moe_down_sorted_t(struct kcuda_ctx *c, int64_t slots, const int32_t *meta, int E,
                             const struct kweight *down, int64_t D, int64_t F, const float *h, float *y)
{
	const int64_t rows_per_block = MOE_WARPS * MOE_DOWN_RPW;
	dim3 g2((unsigned)((D + rows_per_block - 1) / rows_per_block), (unsigned)slots);
	return klaunch("moe_down_sorted", moe_down_sorted_kernel<T>, dim3(g2), dim3(MOE_WARPS * 32), 0,
	               c->stream, (const uint8_t *)down->data, down->row_bytes, D, F, h, meta, E, y);
}

/* workspace of the sorted path: [meta, 256-aligned][h: np x F][y: np x D] */
static size_t sorted_ws_bytes(int64_t np, int64_t E, int64_t F, int64_t D)
{
	return ((((size_t)(1 + E + E + 1 + np) * 4) + 255) & ~(size_t)255) +
	       (size_t)np * (size_t)(F + D) * sizeof(float);
}

static int moe_sorted(struct kcuda_ctx *c, const float *x, int64_t ldx, int64_t n, const int32_t *ids,
                      const float *weights, int k, const struct kweight *gate, const struct kweight *up,
                      const struct kweight *down, int64_t E, int64_t F, float *out, int64_t ldo)
{
	const int64_t D = gate->n_in, np = n * k, slots = np < E ? np : E;
	const size_t meta_bytes = (((size_t)(1 + E + E + 1 + np) * 4) + 255) & ~(size_t)255;
	if (sorted_ws_bytes(np, E, F, D) > c->ws_bytes)
		return ERR_LIMIT;
	int32_t *meta = (int32_t *)c->ws;
	float *h = (float *)((char *)c->ws + meta_bytes), *y = h + np * F;
	int rc = ERR_UNSUPPORTED;
	stage_begin("moe.experts/sort", NULL, 0);
	rc = klaunch("moe_sort", moe_sort_kernel, dim3(1), dim3(1024), 2 * (size_t)E * sizeof(int), c->stream,
	             ids, (int)np, (int)E, meta, c->err_dev);
	stage_end();
	if (rc)
		return rc;
	rc = ERR_UNSUPPORTED;
	stage_begin("moe.experts/gate_up(sorted)", gate, 2.0 * (double)slots * (double)F);
	switch (gate->type) {
#define X(T)                                                                                                 \
	case T: rc = moe_gate_up_sorted_t<T>(c, x, ldx, slots, k, meta, (int)E, gate, up, F, h); break;
		KCUDA_FOR_EACH_TYPE(X)
#undef X
	default: break;
	}
	stage_end();
	if (rc)
		return rc;
	rc = ERR_UNSUPPORTED;
	stage_begin("moe.experts/down(sorted)", down, (double)slots * (double)D);
	switch (down->type) {
#define X(T)                                                                                                 \
	case T: rc = moe_down_sorted_t<T>(c, slots, meta, (int)E, down, D, F, h, y); break;
		KCUDA_FOR_EACH_TYPE(X)
#undef X
	default: break;
	}
	stage_end();
	if (rc)
		return rc;
	stage_begin("moe.experts/combine", NULL, 0);
	dim3 g3((unsigned)((D + 255) / 256), (unsigned)n);
	rc = klaunch("moe_combine", moe_combine_ids_kernel, dim3(g3), dim3(256), 0, c->stream, y, weights,
	             ids, (int)E, k, D, out, ldo);
	stage_end();
	return rc;
}

/* TANDEM_MOE_SORTED=0 sends 17..256 tokens back to the grouped path (host sync; no graphs) */
static bool sorted_on(void)
{
	const char *v = getenv("TANDEM_MOE_SORTED");
	return !v || strcmp(v, "0") != 0;
}

extern "C" int kcuda_moe_ffn_sync_free_max(void)
{
	return sorted_on() ? MOE_SORTED_MAX : MOE_DECODE_MAX;
}

static int moe_grouped(struct kcuda_ctx *c, const float *x, int64_t ldx, int64_t n, const int32_t *ids,
                       const float *weights, int k, const struct kweight *gate, const struct kweight *up,
                       const struct kweight *down, int64_t E, int64_t F, float *out, int64_t ldo)
{
	const int64_t D = gate->n_in, np = n * k;
	int rc = 0;
	int32_t *hid = (int32_t *)malloc((size_t)np * sizeof(int32_t)),
	        *etok = (int32_t *)malloc((size_t)np * 4);
	float *hw = (float *)malloc((size_t)np * sizeof(float)), *ewt = (float *)malloc((size_t)np * 4);
	int64_t *eoff = (int64_t *)calloc((size_t)E + 1, sizeof(int64_t));
	void *dbuf = NULL;
	const size_t lists = (size_t)np * 8, fl = sizeof(float);
	const size_t bytes = lists + (size_t)n * fl * (2 * (size_t)D + 2 * (size_t)F) + 256;
	if (!hid || !etok || !hw || !ewt || !eoff) {
		rc = -ENOMEM;
		goto cleanup;
	}
	if ((rc = kcuda_download(c, hid, ids, (size_t)np * 4)) ||
	    (rc = kcuda_download(c, hw, weights, (size_t)np * 4)))
		goto cleanup;
	for (int64_t i = 0; i < np; i++) {
		if (hid[i] < 0 || hid[i] >= E) {
			rc = kcuda_bad_arg("moe_ffn", "expert id %d of pair %lld outside 0..%lld",
			                   (int)hid[i], (long long)i, (long long)E - 1);
			goto cleanup;
		}
		eoff[hid[i] + 1]++;
	}
	for (int64_t e = 0; e < E; e++)
		eoff[e + 1] += eoff[e];
	{
		int64_t *at = (int64_t *)malloc((size_t)E * sizeof(int64_t));
		if (!at) {
			rc = -ENOMEM;
			goto cleanup;
		}
		memcpy(at, eoff, (size_t)E * sizeof(int64_t));
		for (int64_t i = 0; i < np; i++) {
			const int64_t j = at[hid[i]]++;
			etok[j] = (int32_t)(i / k);
			ewt[j] = hw[i];
		}
		free(at);
	}
	if ((rc = kcuda_alloc(bytes, &dbuf)))
		goto cleanup;
	{
		int32_t *d_tok = (int32_t *)dbuf;
		float *d_w = (float *)(d_tok + np);
		float *xs = (float *)((char *)dbuf + ((lists + 255) & ~(size_t)255));
		float *t1 = xs + n * D, *t2 = t1 + n * F, *ys = t2 + n * F;
		if ((rc = kcuda_upload(c, d_tok, etok, (size_t)np * 4)) ||
		    (rc = kcuda_upload(c, d_w, ewt, (size_t)np * 4)))
			goto cleanup;
		for (int64_t r = 0; r < n; r++)
			if ((rc = kcuda_memset(c, out + r * ldo, 0, (size_t)D * fl)))
				goto cleanup;
		for (int64_t e = 0; e < E; e++) {
			const int64_t mt = eoff[e + 1] - eoff[e];
			if (!mt)
				continue;
			struct kweight wg = *gate, wu = *up, wd = *down;
			wg.n_out = wu.n_out = F;
			wd.n_out = D;
			wg.data = (const char *)gate->data + (size_t)e * (size_t)F * gate->row_bytes;
			wu.data = (const char *)up->data + (size_t)e * (size_t)F * up->row_bytes;
			wd.data = (const char *)down->data + (size_t)e * (size_t)D * down->row_bytes;
			dim3 gg((unsigned)((D + 255) / 256 < 64 ? (D + 255) / 256 : 64), (unsigned)mt);
			if ((rc = klaunch("moe_gather", moe_gather_kernel, dim3(gg), dim3(256), 0, c->stream,
			                  x, ldx, d_tok + eoff[e], D, xs)) ||
			    (rc = kcuda_matmul(c, &wg, xs, D, mt, t1, F)) ||
			    (rc = kcuda_matmul(c, &wu, xs, D, mt, t2, F)) ||
			    (rc = kcuda_swiglu(c, t1, F, t1, F, t2, F, F, mt)) ||
			    (rc = kcuda_matmul(c, &wd, t1, F, mt, ys, D)))
				goto cleanup;
			if ((rc = klaunch("moe_scatter", moe_scatter_kernel, dim3(gg), dim3(256), 0,
			                  c->stream, ys, d_tok + eoff[e], d_w + eoff[e], D, out, ldo)))
				goto cleanup;
		}
		rc = kcuda_sync(c); /* before the scratch is freed */
	}
cleanup:
	if (dbuf)
		kcuda_free(dbuf);
	free(hid);
	free(etok);
	free(hw);
	free(ewt);
	free(eoff);
	return rc;
}

/* kcuda_moe_ffn's argument checks (kernels.h): 0 or -EINVAL with a line on stderr */
static int ffn_check(struct kcuda_ctx *c, const float *x, int64_t ldx, int64_t n, const int32_t *ids,
                     const float *weights, int k, const struct kweight *gate, const struct kweight *up,
                     const struct kweight *down, int64_t E, int64_t F, float *out, int64_t ldo)
{
	if (!c || !x || !ids || !weights || !gate || !up || !down || !out)
		return kcuda_bad_arg("moe_ffn", "null pointer argument");
	if (n < 0 || k < 1 || E < 1 || F < 1)
		return kcuda_bad_arg("moe_ffn", "n %lld, k %d, E %lld, F %lld", (long long)n, k, (long long)E,
		                     (long long)F);
	if (!gate->data || !up->data || !down->data)
		return kcuda_bad_arg("moe_ffn", "expert weight without data");
	const int64_t D = gate->n_in;
	size_t rb;
	if (up->n_in != D || down->n_in != F || gate->n_out != E * F || up->n_out != E * F ||
	    down->n_out != E * D)
		return kcuda_bad_arg(
		    "moe_ffn", "shapes gate %lldx%lld up %lldx%lld down %lldx%lld for E %lld F %lld D %lld",
		    (long long)gate->n_out, (long long)gate->n_in, (long long)up->n_out, (long long)up->n_in,
		    (long long)down->n_out, (long long)down->n_in, (long long)E, (long long)F, (long long)D);
	if (ldx < D || ldo < D)
		return kcuda_bad_arg("moe_ffn", "ldx %lld or ldo %lld < D %lld", (long long)ldx,
		                     (long long)ldo, (long long)D);
	size_t rbu;
	if (!ktype_row_bytes(gate->type, D, &rb) || rb != gate->row_bytes ||
	    !ktype_row_bytes(up->type, D, &rbu) || rbu != up->row_bytes)
		return kcuda_bad_arg("moe_ffn", "gate %s / up %s row_bytes %zu/%zu for n_in %lld",
		                     ktype_name(gate->type), ktype_name(up->type), gate->row_bytes,
		                     up->row_bytes, (long long)D);
	if (!ktype_row_bytes(down->type, F, &rb) || rb != down->row_bytes)
		return kcuda_bad_arg("moe_ffn", "down %s row_bytes %zu for n_in %lld", ktype_name(down->type),
		                     down->row_bytes, (long long)F);
	return 0;
}

/* xp[p] = x[p / k]: each pair's token row (the split path below); a pair whose expert id is out of
 * range is counted here (its products give NaN, as in the fused kernels) */
__global__ void moe_pair_rows_kernel(const float *__restrict__ x, int64_t ldx, int k, int64_t D,
                                     const int32_t *__restrict__ ids, int64_t E, float *__restrict__ xp,
                                     unsigned *err)
{
	KDEP_ENTRY();
	const int64_t p = blockIdx.y;
	if (blockIdx.x == 0 && threadIdx.x == 0 && (ids[p] < 0 || ids[p] >= E))
		atomicAdd(err, 1u);
	const float *src = x + (p / k) * ldx;
	for (int64_t d = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; d < D;
	     d += (int64_t)gridDim.x * blockDim.x)
		xp[p * D + d] = src[d];
}

/* one per-pair expert product through the down kernel: y[p] = rows [e F_out, e F_out + F_out) of w times
 * in[p] (F_in values), e = ids[p] */
static int moe_pair_product(struct kcuda_ctx *c, int64_t np, const int32_t *ids, const struct kweight *w,
                            int64_t F_out, int64_t E, int64_t F_in, const float *in, float *y)
{
	switch (w->type) {
#define X(T)                                                                                                 \
	case T: return moe_down_t<T>(c, np, ids, w, F_out, E, F_in, in, y);
		KCUDA_FOR_EACH_TYPE(X)
#undef X
	default: return ERR_UNSUPPORTED;
	}
}

/* Gate and up of different types (a GGUF may give one of them more bits in some layers; every other
 * path reads both with one type's decoder): per chunk of tokens that fits the workspace, each pair's
 * token row gathered, gate and up as two per-pair products (the down kernel with the roles of D and F
 * swapped), h = SiLU(g) u by kcuda_swiglu (kcpu_swiglu's formula, as the fused kernels), then down and
 * the combine as moe_decode. No host sync (graphs can hold it). */
static int moe_split_types(struct kcuda_ctx *c, const float *x, int64_t ldx, int64_t n, const int32_t *ids,
                           const float *weights, int k, const struct kweight *gate, const struct kweight *up,
                           const struct kweight *down, int64_t E, int64_t F, float *out, int64_t ldo)
{
	const int64_t D = gate->n_in;
	const size_t per_tok = (size_t)k * (size_t)(2 * D + 2 * F) * sizeof(float);
	const int64_t chunk = (int64_t)(c->ws_bytes / per_tok);
	if (chunk < 1)
		return ERR_LIMIT;
	int rc = 0;
	stage_begin("moe.experts(split gate / up types)", gate, 2.0 * (double)(n * k) * (double)F);
	for (int64_t t0 = 0; t0 < n && !rc; t0 += chunk) {
		const int64_t nt = n - t0 < chunk ? n - t0 : chunk, np = nt * k;
		const int32_t *id = ids + t0 * k;
		float *xp = (float *)c->ws, *g = xp + np * D, *u = g + np * F, *y = u + np * F;
		const unsigned gx = (unsigned)((D + 255) / 256 < 8 ? (D + 255) / 256 : 8);
		rc = klaunch("moe_pair_rows", moe_pair_rows_kernel, dim3(gx, (unsigned)np), dim3(256), 0,
		             c->stream, x + t0 * ldx, ldx, k, D, id, E, xp, c->err_dev);
		if (!rc)
			rc = moe_pair_product(c, np, id, gate, F, E, D, xp, g);
		if (!rc)
			rc = moe_pair_product(c, np, id, up, F, E, D, xp, u);
		if (!rc)
			rc = kcuda_swiglu(c, g, F, g, F, u, F, F, np);
		if (!rc)
			rc = moe_pair_product(c, np, id, down, D, E, F, g, y);
		if (!rc)
			rc = klaunch("moe_combine", moe_combine_kernel,
			             dim3((unsigned)((D + 255) / 256), (unsigned)nt), dim3(256), 0, c->stream,
			             y, weights + t0 * k, k, D, out + t0 * ldo, ldo);
	}
	stage_end();
	return rc;
}

extern "C" enum kcuda_moe_path kcuda_moe_decode_path(int gate_type, int up_type, int down_type)
{
	if (gate_type != up_type)
		return KCUDA_MOE_SPLIT;
	return moe_mma_type_ok(gate_type) && moe_mma_type_ok(down_type) ? KCUDA_MOE_TENSOR_CORE
	                                                                : KCUDA_MOE_GENERIC;
}

extern "C" int kcuda_moe_ffn(struct kcuda_ctx *c, const float *x, int64_t ldx, int64_t n, const int32_t *ids,
                             const float *weights, int k, const struct kweight *gate,
                             const struct kweight *up, const struct kweight *down, int64_t E, int64_t F,
                             float *out, int64_t ldo)
{
	int rc = ffn_check(c, x, ldx, n, ids, weights, k, gate, up, down, E, F, out, ldo);
	if (rc)
		return rc;
	const int64_t D = gate->n_in;
	if (n == 0)
		return 0;
	/* the piece kernels need n_in multiples of 16, and 16-byte rows of float weights */
	auto rows_ok = [](const struct kweight *w) {
		return (w->type != KT_F32 && w->type != KT_F16 && w->type != KT_BF16) ||
		       w->row_bytes % 16 == 0;
	};
	if (up->type != gate->type) /* every other path decodes gate and up with one type */
		return D % 16 == 0 && F % 16 == 0 && rows_ok(gate) && rows_ok(up) && rows_ok(down)
		           ? moe_split_types(c, x, ldx, n, ids, weights, k, gate, up, down, E, F, out, ldo)
		           : ERR_UNSUPPORTED;
	/* the piece kernels: n_in multiples of 16; float weights also need 16-byte rows */
	const bool quant = gate->type != KT_F32 && gate->type != KT_F16 && gate->type != KT_BF16 &&
	                   down->type != KT_F32 && down->type != KT_F16 && down->type != KT_BF16;
	const bool pieces =
	    D % 16 == 0 && F % 16 == 0 && (quant || (gate->row_bytes % 16 == 0 && down->row_bytes % 16 == 0));
	/* the grouped tensor-core kernels (moe_prefill.cu): prompts, and from TANDEM_MOE_MMA_MIN tokens */
	const int mma_min = kcuda_moe_prefill_min();
	if (n >= mma_min) {
		const int rc = kcuda_moe_prefill(c, x, ldx, n, ids, weights, k, gate, up, down, E, F, NULL,
		                                 NULL, NULL, out, ldo);
		if (rc != ERR_UNSUPPORTED)
			return rc;
	}
	/* decode batches (1..256 tokens) on tensor cores (moe_mma.cu) */
	if (moe_mma_fits(c, x, ldx, n, k, gate, up, down, E, F))
		return moe_mma_ffn(c, x, ldx, n, ids, weights, k, gate, up, down, E, F, NULL, NULL, NULL, out,
		                   ldo);
	if (n <= MOE_DECODE_MAX && pieces)
		return moe_decode(c, x, ldx, n, ids, weights, k, gate, up, down, E, F, out, ldo);
	if (n <= MOE_SORTED_MAX && pieces && E <= 1024 && sorted_on() &&
	    sorted_ws_bytes(n * k, E, F, D) <= c->ws_bytes)
		return moe_sorted(c, x, ldx, n, ids, weights, k, gate, up, down, E, F, out, ldo);
	if (kcuda_moe_prefill_on() && n < mma_min) { /* TANDEM_MOE_SORTED=0: 17..256 tokens */
		const int rc = kcuda_moe_prefill(c, x, ldx, n, ids, weights, k, gate, up, down, E, F, NULL,
		                                 NULL, NULL, out, ldo);
		if (rc != ERR_UNSUPPORTED)
			return rc;
	}
	return moe_grouped(c, x, ldx, n, ids, weights, k, gate, up, down, E, F, out, ldo);
}

extern "C" int kcuda_moe_ffn_shexp(struct kcuda_ctx *c, const float *x, int64_t ldx, int64_t n,
                                   const int32_t *ids, const float *weights, int k,
                                   const struct kweight *gate, const struct kweight *up,
                                   const struct kweight *down, int64_t E, int64_t F,
                                   const struct kweight *sh_gate, const struct kweight *sh_up,
                                   const struct kweight *sh_down, float *out, int64_t ldo)
{
	int rc = ffn_check(c, x, ldx, n, ids, weights, k, gate, up, down, E, F, out, ldo);
	if (rc)
		return rc;
	if (!sh_gate || !sh_up || !sh_down)
		return kcuda_bad_arg("moe_ffn_shexp", "null shared-expert weight");
	if (n == 0)
		return 0;
	if (up->type != gate->type)
		return ERR_UNSUPPORTED; /* kcuda_moe_ffn's split path, the shared expert apart */
	/* prompts: the shared expert in the prefill pass (moe_prefill.cu); TANDEM_MOE_PREFILL_SHARED=0 (read
	 * on every call) leaves it to the caller, as before 2026-12-02 */
	const char *ps = getenv("TANDEM_MOE_PREFILL_SHARED");
	if (n >= kcuda_moe_prefill_min() && !(ps && strcmp(ps, "0") == 0)) {
		const int rc = kcuda_moe_prefill(c, x, ldx, n, ids, weights, k, gate, up, down, E, F, sh_gate,
		                                 sh_up, sh_down, out, ldo);
		if (rc != ERR_UNSUPPORTED)
			return rc;
	}
	if (!moe_mma_fits(c, x, ldx, n, k, gate, up, down, E, F) ||
	    !moe_mma_fits_shared(gate, down, F, sh_gate, sh_up, sh_down))
		return ERR_UNSUPPORTED; /* nothing enqueued: the caller runs the two parts itself */
	return moe_mma_ffn(c, x, ldx, n, ids, weights, k, gate, up, down, E, F, sh_gate, sh_up, sh_down, out,
	                   ldo);
}
