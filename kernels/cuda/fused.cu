/* Fused small ops of the decode step (declared in fused.h): each kernel does, for a batch of
 * rows, what a short sequence of row ops did in several launches (issue #4: at batch 1 a captured
 * decode graph was ~3300 dependent nodes, most of them kernels of a few microseconds). The
 * per-element arithmetic is that of the ops replaced (rmsnorm.cu, rope.cu, model_fwd.cu's
 * layernorm / scale / kv_write), written out again here so one block can chain them on a row.
 *
 * Grids: one block of FU_THREADS per (row, part); blockIdx.x is the row, blockIdx.y picks the
 * part when a kernel serves two kinds of rows (mla_latent: 0 = c_q, 1 = [c | k_r]; idx_prep:
 * 0 = k_I, 1 = q_I and w_I). Rows are independent, so the parts need no ordering between them.
 *
 * Latency, not bandwidth, is what these rows cost (a 6144-float row is 24 KB): a loop that loads
 * one value, uses it and loads the next waits one L2 round trip per iteration (24 of them per
 * thread for kcuda_rmsnorm's 256 threads on a GLM-5 row, ~10 us measured per call). Rows of up to
 * FU_PER values per thread are therefore loaded into registers with every load issued before the
 * first use (fu_load), and add+rmsnorm runs 1024 threads (6 values each for 6144). The sums of
 * squares are reduced in another order than kcuda_rmsnorm's (fp32 either way; within the ops'
 * tolerance against the CPU). Longer rows take the plain loops. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cluster_bar.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/fused.h"
#include "kernels/cuda/k45_i8.cuh"

#define FU_THREADS 256 /* the block size of kcuda_rmsnorm / kfwd_layernorm */
#define FU_WIDE 1024 /* add+rmsnorm: one block per hidden row */
#define FU_PER 8 /* values per thread held in registers */
#define FU_DI_MAX 4096 /* indexer key width kept in shared memory */

extern "C" int kfuse_enabled(void)
{
	static int on = -1;
	if (on < 0) {
		const char *e = getenv("TANDEM_FUSE");
		on = !(e && strcmp(e, "0") == 0);
	}
	return on;
}

/* kf32_to_bf16 on the device (as model_fwd.cu's kv_write: round to nearest even, NaN kept quiet) */
__device__ __forceinline__ uint16_t fu_bf16(float f)
{
	uint32_t x = __float_as_uint(f);
	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x40u);
	x += 0x7fffu + ((x >> 16) & 1u);
	return (uint16_t)(x >> 16);
}

/* the pool row of token r at position p (NULL: no pool, a padding row or an unmapped block) */
__device__ __forceinline__ char *fu_kv_row(const kfuse_kv &kv, int64_t r, int32_t p, int64_t width)
{
	if (!kv.base || p < 0)
		return NULL;
	const int32_t blk = kv.blocks[(int64_t)kv.seq[r] * kv.ld_blocks + p / kv.block_tokens];
	if (blk < 0)
		return NULL;
	return (char *)kv.base + (size_t)blk * kv.block_bytes + kv.offset +
	       (size_t)(p % kv.block_tokens) * (size_t)width * (kv.bf16 ? 2 : 4);
}

__device__ __forceinline__ void fu_kv_put(const kfuse_kv &kv, char *row, int64_t j, float v)
{
	if (!row)
		return;
	if (kv.bf16)
		((uint16_t *)row)[j] = fu_bf16(v);
	else
		((float *)row)[j] = v;
}

/* the sum of v over a block of T threads (warp sums, then the T / 32 warps in order); red[T / 32] */
template <int T> __device__ __forceinline__ float fu_block_sum(float v, float *red)
{
	v = kc_warp_sum(v);
	if ((threadIdx.x & 31) == 0)
		red[threadIdx.x >> 5] = v;
	__syncthreads();
	float tot = 0.0f;
#pragma unroll
	for (int k = 0; k < T / 32; k++)
		tot += red[k];
	return tot;
}

/* v[k] = x[i] (+ a[i] when a) for i = threadIdx.x + k T < n, else 0; every load is issued before
 * any is used; returns this thread's sum of squares (n <= FU_PER * T) */
template <int T> __device__ __forceinline__ float fu_load(float *v, const float *x, const float *a, int64_t n)
{
#pragma unroll
	for (int k = 0; k < FU_PER; k++) {
		const int64_t i = threadIdx.x + (int64_t)k * T;
		v[k] = i < n ? x[i] : 0.0f;
	}
	if (a) {
#pragma unroll
		for (int k = 0; k < FU_PER; k++) {
			const int64_t i = threadIdx.x + (int64_t)k * T;
			v[k] += i < n ? a[i] : 0.0f;
		}
	}
	float ss = 0.0f;
#pragma unroll
	for (int k = 0; k < FU_PER; k++)
		ss = fmaf(v[k], v[k], ss);
	return ss;
}

/* RMSNorm of the row x (n values, in place when y == x) by a block of T threads; values that go
 * to the pool row as well when row != NULL (j = index in the row). Every thread of the block
 * must call it (block-wide sums inside). */
template <int T>
__device__ __forceinline__ void fu_rmsnorm_row(float *y, const float *x, const float *__restrict__ w,
                                               int64_t n, float eps, float *red, const kfuse_kv &kv,
                                               char *row, const float *wv = NULL, bool wv_ok = false)
{
	if (n <= (int64_t)FU_PER * T) { /* wv_ok: wv[k] = w[threadIdx.x + k T], in registers (fu_latent_w) */
		float v[FU_PER];
		const float ss = fu_load<T>(v, x, NULL, n);
		const float inv = 1.0f / sqrtf(fu_block_sum<T>(ss, red) / (float)n + eps);
#pragma unroll
		for (int k = 0; k < FU_PER; k++) {
			const int64_t i = threadIdx.x + (int64_t)k * T;
			if (i < n) {
				const float o = (wv_ok ? wv[k] : w[i]) * (v[k] * inv);
				y[i] = o;
				fu_kv_put(kv, row, i, o);
			}
		}
		return;
	}
	float ss = 0.0f;
	for (int64_t i = threadIdx.x; i < n; i += T)
		ss = fmaf(x[i], x[i], ss);
	const float inv = 1.0f / sqrtf(fu_block_sum<T>(ss, red) / (float)n + eps);
	for (int64_t i = threadIdx.x; i < n; i += T) {
		const float o = w[i] * (x[i] * inv);
		y[i] = o;
		fu_kv_put(kv, row, i, o);
	}
}

/* the rotation of pair (u0, u1) by angle pos * inv_freq (rope.cu with mscale 1) */
__device__ __forceinline__ void fu_rot(float u0, float u1, int32_t pos, float inv, float *o0, float *o1)
{
	const float a = (float)pos * inv;
	float s, co;
	sincosf(a, &s, &co);
	*o0 = u0 * co - u1 * s;
	*o1 = u0 * s + u1 * co;
}

/* element indices of pair i of a rotary part of width 2 * half */
__device__ __forceinline__ void fu_pair(int pairing, int i, int half, int *i0, int *i1)
{
	*i0 = pairing ? i : 2 * i;
	*i1 = pairing ? i + half : 2 * i + 1;
}

/* ---- add + RMSNorm ----------------------------------------------------------------------------- */
__global__ void __launch_bounds__(FU_WIDE)
    add_rmsnorm_kernel(float *h, const float *x, float *y, const float *__restrict__ w, int64_t n, float eps)
{
	/* the norm weight before KDEP_ENTRY (a weight: cuda_common.cuh), so its DRAM round trip
	 * overlaps the kernel before instead of following the block sum */
	float wv[FU_PER];
	const bool fits = n <= (int64_t)FU_PER * FU_WIDE;
	if (fits)
#pragma unroll
		for (int k = 0; k < FU_PER; k++) {
			const int64_t i = threadIdx.x + (int64_t)k * FU_WIDE;
			wv[k] = i < n ? __ldg(w + i) : 0.0f;
		}
	KDEP_ENTRY();
	__shared__ float red[FU_WIDE / 32];
	float *hr = h + blockIdx.x * n;
	const float *xr = x ? x + blockIdx.x * n : NULL;
	float *yr = y + blockIdx.x * n;
	if (fits) {
		float v[FU_PER];
		const float ss = fu_load<FU_WIDE>(v, hr, xr, n);
#pragma unroll
		for (int k = 0; k < FU_PER; k++) {
			const int64_t i = threadIdx.x + (int64_t)k * FU_WIDE;
			if (xr && i < n)
				hr[i] = v[k];
		}
		const float inv = 1.0f / sqrtf(fu_block_sum<FU_WIDE>(ss, red) / (float)n + eps);
#pragma unroll
		for (int k = 0; k < FU_PER; k++) {
			const int64_t i = threadIdx.x + (int64_t)k * FU_WIDE;
			if (i < n)
				yr[i] = wv[k] * (v[k] * inv);
		}
		return;
	}
	float ss = 0.0f;
	for (int64_t i = threadIdx.x; i < n; i += FU_WIDE) {
		float v = hr[i];
		if (xr) {
			v += xr[i];
			hr[i] = v;
		}
		ss = fmaf(v, v, ss);
	}
	const float inv = 1.0f / sqrtf(fu_block_sum<FU_WIDE>(ss, red) / (float)n + eps);
	for (int64_t i = threadIdx.x; i < n; i += FU_WIDE)
		yr[i] = w[i] * (hr[i] * inv);
}

/* PDL with an early trigger: launch_dependents BEFORE griddepcontrol.wait, so the next kernel's
 * blocks can become resident and prefetch their weights while the kernel before this one still
 * runs. Safe: the next kernel's griddepcontrol.wait still waits for THIS grid to complete, which
 * happens only after this grid's own wait saw its predecessor complete. */
__device__ __forceinline__ void fu_trigger_early(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* add + RMSNorm of a row of n <= AN_T * AN_V * 4 floats, n % 4 == 0, 16-byte aligned rows: a block
 * of only AN_T threads, float4 loads all issued before the first use. Why not add_rmsnorm_kernel's
 * 1024 threads: in the decode graph (nsys, H200, 18:27) this row op cost 4.7 us on the critical
 * path, twice per layer, because a 1024-thread block finds no SM with room while the product
 * before it (1536 or 384 blocks) still runs, so PDL cannot start it early; a 256-thread block
 * usually fits beside them. 8 warps also make the block sum shorter. */
#define AN_T 256
#define AN_V 8 /* float4 per thread: rows up to 8192 */
__global__ void __launch_bounds__(AN_T)
    add_rmsnorm_v4_kernel(float *h, const float *x, float *y, const float *__restrict__ w, int64_t n,
                          float eps, int early)
{
	const int64_t n4 = n / 4;
	float4 wv[AN_V];
#pragma unroll
	for (int k = 0; k < AN_V; k++) { /* the weight before KDEP_ENTRY (cuda_common.cuh) */
		const int64_t i = threadIdx.x + (int64_t)k * AN_T;
		wv[k] = i < n4 ? __ldg((const float4 *)w + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
	}
	if (early) /* TANDEM_NORM_EARLY=1 (fu_trigger_early) */
		fu_trigger_early();
	KDEP_ENTRY();
	__shared__ float red[AN_T / 32];
	float4 *hr = (float4 *)const_cast<float *>(kdep_after((const float *)h) + blockIdx.x * n);
	const float *xa = x ? kdep_after(x) : NULL;
	const float4 *xr = xa ? (const float4 *)(xa + blockIdx.x * n) : NULL;
	float4 *yr = (float4 *)(y + blockIdx.x * n);
	float4 v[AN_V];
#pragma unroll
	for (int k = 0; k < AN_V; k++) {
		const int64_t i = threadIdx.x + (int64_t)k * AN_T;
		v[k] = i < n4 ? hr[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
	}
	if (xr) {
		float4 a[AN_V];
#pragma unroll
		for (int k = 0; k < AN_V; k++) {
			const int64_t i = threadIdx.x + (int64_t)k * AN_T;
			a[k] = i < n4 ? xr[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		}
#pragma unroll
		for (int k = 0; k < AN_V; k++) {
			const int64_t i = threadIdx.x + (int64_t)k * AN_T;
			v[k].x += a[k].x, v[k].y += a[k].y, v[k].z += a[k].z, v[k].w += a[k].w;
			if (i < n4)
				hr[i] = v[k];
		}
	}
	float ss = 0.0f;
#pragma unroll
	for (int k = 0; k < AN_V; k++) {
		ss = fmaf(v[k].x, v[k].x, ss);
		ss = fmaf(v[k].y, v[k].y, ss);
		ss = fmaf(v[k].z, v[k].z, ss);
		ss = fmaf(v[k].w, v[k].w, ss);
	}
	const float inv = 1.0f / sqrtf(fu_block_sum<AN_T>(ss, red) / (float)n + eps);
#pragma unroll
	for (int k = 0; k < AN_V; k++) {
		const int64_t i = threadIdx.x + (int64_t)k * AN_T;
		if (i < n4)
			yr[i] = make_float4(wv[k].x * (v[k].x * inv), wv[k].y * (v[k].y * inv),
			                    wv[k].z * (v[k].z * inv), wv[k].w * (v[k].w * inv));
	}
}

/* ---- add + RMSNorm over a thread-block cluster ---------------------------------------------------
 * Why: one block reading 48 KB (h, x) and writing 48 KB (h, y) is limited by one SM's load/store
 * path and its chain of round trips (4.8 us marginal per call in the 20:15 decode graph, twice a
 * layer). Here the row is cut into nb <= 8 contiguous slices, one block of AC_T threads each in a
 * cluster (sm_90+), every thread's float4 loads of its slice issued together (1-2 per thread at
 * 6144). The sum of squares goes block -> cluster by distributed shared memory: each block PUSHES
 * its partial into slot [its rank] of every block of the cluster, then one cluster barrier
 * (arrive.release / wait.acquire); nobody reads remote memory after it, so no second barrier
 * before exit. The first barrier phase (arrive at entry, wait before the pushes) only proves every
 * block of the cluster has started, which distributed shared memory requires; it costs nothing on
 * the path (arrived long before).
 * Precision: the sum of squares is accumulated in double (per thread, then the warp, the block's
 * warps and the cluster's blocks, each in a fixed order) and the scale is computed as the CPU op
 * does, (float)(1 / sqrt(ss / n + eps)) in double, so the only difference to kcpu_rmsnorm is the
 * double summation order (~1e-16 relative: the scale almost always has the CPU's bits) and no
 * fp32 overflow of ss for rows of large values. Deterministic: the order depends on n only.
 * Rows: grid (nb, rows), a cluster per row. */
#define AC_T 128
#define AC_V 4 /* float4 per thread: slices up to 2048 floats, rows up to 16384 */
#define AC_NB 8 /* portable cluster size */

__device__ __forceinline__ double fu_warp_sum_d(double v)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

__global__ void __launch_bounds__(AC_T)
    add_rmsnorm_cl_kernel(float *h, const float *x, float *y, const float *__restrict__ w, int64_t n, int s4,
                          float eps, int early, mi8_x *xq)
{
	const int b = (int)blockIdx.x, nb = (int)gridDim.x; /* the cluster is the grid's x extent */
	const int64_t n4 = n / 4, j0 = (int64_t)b * s4;
	const int64_t j1 = j0 + s4 < n4 ? j0 + s4 : n4;
	kcl_arrive_relaxed(); /* phase 1: this block has started */
	float4 wv[AC_V];
#pragma unroll
	for (int k = 0; k < AC_V; k++) { /* the weight slice before KDEP_ENTRY (cuda_common.cuh) */
		const int64_t j = j0 + threadIdx.x + (int64_t)k * AC_T;
		wv[k] = j < j1 ? __ldg((const float4 *)w + j) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
	}
	if (early)
		fu_trigger_early();
	KDEP_ENTRY();
	__shared__ double red[AC_T / 32];
	__shared__ double part[AC_NB];
	const int64_t row = blockIdx.y;
	float4 *hr = (float4 *)const_cast<float *>(kdep_after((const float *)h) + row * n);
	const float *xa = x ? kdep_after(x) : NULL;
	const float4 *xr = xa ? (const float4 *)(xa + row * n) : NULL;
	float4 *yr = (float4 *)(y + row * n);
	float4 v[AC_V], a[AC_V];
#pragma unroll
	for (int k = 0; k < AC_V; k++) {
		const int64_t j = j0 + threadIdx.x + (int64_t)k * AC_T;
		v[k] = j < j1 ? hr[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
	}
	if (xr) {
#pragma unroll
		for (int k = 0; k < AC_V; k++) {
			const int64_t j = j0 + threadIdx.x + (int64_t)k * AC_T;
			a[k] = j < j1 ? xr[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		}
#pragma unroll
		for (int k = 0; k < AC_V; k++) {
			const int64_t j = j0 + threadIdx.x + (int64_t)k * AC_T;
			v[k].x += a[k].x, v[k].y += a[k].y, v[k].z += a[k].z, v[k].w += a[k].w;
			if (j < j1)
				hr[j] = v[k];
		}
	}
	double ss = 0.0;
#pragma unroll
	for (int k = 0; k < AC_V; k++) {
		ss = fma((double)v[k].x, (double)v[k].x, ss);
		ss = fma((double)v[k].y, (double)v[k].y, ss);
		ss = fma((double)v[k].z, (double)v[k].z, ss);
		ss = fma((double)v[k].w, (double)v[k].w, ss);
	}
	ss = fu_warp_sum_d(ss);
	if ((threadIdx.x & 31) == 0)
		red[threadIdx.x >> 5] = ss;
	__syncthreads();
	kcl_wait(); /* phase 1 done: every block of the cluster runs, its shared memory exists */
	if ((int)threadIdx.x < nb) { /* thread q pushes this block's partial to block q */
		double s = 0.0;
#pragma unroll
		for (int k = 0; k < AC_T / 32; k++)
			s += red[k];
		kcl_put<double>(&part[b], threadIdx.x, s);
	}
	kcl_arrive_release();
	kcl_wait(); /* phase 2: every block's partial is in every block's part[] */
	double tot = 0.0;
	for (int q = 0; q < nb; q++) /* rank order: the same total in every block */
		tot += part[q];
	const float inv = (float)(1.0 / sqrt(tot / (double)n + (double)eps));
#pragma unroll
	for (int k = 0; k < AC_V; k++) {
		const int64_t j = j0 + threadIdx.x + (int64_t)k * AC_T;
		const float4 o = make_float4(wv[k].x * (v[k].x * inv), wv[k].y * (v[k].y * inv),
		                             wv[k].z * (v[k].z * inv), wv[k].w * (v[k].w * inv));
		if (j < j1)
			yr[j] = o;
		/* y's int8 parts (kfuse_add_rmsnorm_parts): s4 and j0 are multiples of 8, so a lane's
		 * 8-lane group holds one whole sub-block, all of it below j1 or none */
		if (xq && __any_sync(0xffffffffu, j < j1)) /* warp-uniform: warps past the slice skip it */
			mi8_put4(xq + row * (n / 256), j, o, j < j1);
	}
}

/* TANDEM_ADDNORM: unset / "cl" the cluster kernel where it applies, "v4" the 256-thread kernel,
 * "old" always the 1024-thread one (A/B and triage). Read once. */
static int an_env_kind(void)
{
	static int kind = -1;
	if (kind < 0) {
		const char *e = getenv("TANDEM_ADDNORM");
		kind = e && strcmp(e, "old") == 0  ? KFUSE_AN_OLD
		       : e && strcmp(e, "v4") == 0 ? KFUSE_AN_V4
		                                   : KFUSE_AN_CL;
	}
	return kind;
}

/* The early PDL trigger of the cluster / v4 kernel (fu_trigger_early) for a call of n_rows rows:
 * TANDEM_NORM_EARLY=1 always, =0 never, unset from 2 rows on. Measured (H200, 22:13, GLM-5 rank 0 of
 * TP=8, graphs): batch 8 22.76 -> 22.51 ms with it, batch 1 10.04 -> 10.02 (noise), and in
 * bench_cuda_norm's product + norm pair at one row it costs ~1 us (the next product's blocks,
 * resident early, slow the 1536-block product before the norm). Read once. */
static bool an_early(int64_t n_rows)
{
	static int mode = -2;
	if (mode == -2) {
		const char *e = getenv("TANDEM_NORM_EARLY");
		mode = e && strcmp(e, "1") == 0 ? 1 : e && strcmp(e, "0") == 0 ? 0 : -1;
	}
	return mode == 1 || (mode == -1 && n_rows >= 2);
}

static int an_launch_cl(struct kcuda_ctx *c, float *h, const float *x, float *y, const float *w, int64_t n,
                        int64_t n_rows, float eps, int early, mi8_x *xq)
{
	const int64_t n4 = n / 4;
	int64_t nb = (n4 + AC_T - 1) / AC_T; /* about one float4 per thread, at most 8 blocks */
	nb = nb < 1 ? 1 : nb > AC_NB ? AC_NB : nb;
	/* a block's slice a multiple of 8 float4 (whole 32-element sub-blocks for the int8 parts) */
	const int64_t s4 = ((n4 + nb - 1) / nb + 7) / 8 * 8;
	if (s4 > (int64_t)AC_T * AC_V)
		return ERR_UNSUPPORTED;
	/* the cluster attribute also at nb = 1: the kernel uses cluster barriers */
	return klaunch_cl("add_rmsnorm (cluster)", add_rmsnorm_cl_kernel,
	                  dim3((unsigned)nb, (unsigned)n_rows, 1), dim3(AC_T, 1, 1), 0, c->stream,
	                  dim3((unsigned)nb, 1, 1), h, x, y, w, n, (int)s4, eps, early, xq);
}

extern "C" int kfuse_add_rmsnorm_as(struct kcuda_ctx *c, int kind, float *h, const float *x, float *y,
                                    const float *w, int64_t n, int64_t n_rows, float eps)
{
	if (!c || !h || !y || !w || n <= 0 || n_rows < 0 || n_rows > INT32_MAX || y == h || y == x)
		return kcuda_bad_arg("add_rmsnorm", "n %lld rows %lld%s", (long long)n, (long long)n_rows,
		                     !c || !h || !y || !w ? ", or a null pointer" : ", or y aliases h / x");
	if (n_rows == 0)
		return 0;
	const bool al16 = ((uintptr_t)h | (uintptr_t)x | (uintptr_t)y | (uintptr_t)w) % 16 == 0;
	const int base = kind & ~KFUSE_AN_EARLY;
	if (base == KFUSE_AN_CL) {
		if (n % 4 || !al16 || n > (int64_t)AC_NB * AC_T * AC_V * 4 || n_rows > KFUSE_AN_CL_ROWS ||
		    kcuda_cc_major(c->device) < 9)
			return ERR_UNSUPPORTED;
		return an_launch_cl(c, h, x, y, w, n, n_rows, eps, (kind & KFUSE_AN_EARLY) != 0, NULL);
	}
	if (base == KFUSE_AN_V4) {
		if (n % 4 || n > (int64_t)AN_T * AN_V * 4 || !al16)
			return ERR_UNSUPPORTED;
		return klaunch("add_rmsnorm", add_rmsnorm_v4_kernel, dim3((unsigned)n_rows), dim3(AN_T), 0,
		               c->stream, h, x, y, w, n, eps, (kind & KFUSE_AN_EARLY) ? 1 : 0);
	}
	if (kind != KFUSE_AN_OLD)
		return kcuda_bad_arg("add_rmsnorm", "kernel kind %d", kind);
	return klaunch("add_rmsnorm", add_rmsnorm_kernel, dim3((unsigned)n_rows), dim3(FU_WIDE), 0, c->stream,
	               h, x, y, w, n, eps);
}

/* the kernel chosen by TANDEM_ADDNORM, falling back cl -> v4 -> old where a shape does not fit */
extern "C" int kfuse_add_rmsnorm(struct kcuda_ctx *c, float *h, const float *x, float *y, const float *w,
                                 int64_t n, int64_t n_rows, float eps)
{
	const int kind = an_env_kind(), early = an_early(n_rows) ? KFUSE_AN_EARLY : 0;
	int rc = ERR_UNSUPPORTED;
	if (kind == KFUSE_AN_CL)
		rc = kfuse_add_rmsnorm_as(c, KFUSE_AN_CL | early, h, x, y, w, n, n_rows, eps);
	if (rc == ERR_UNSUPPORTED && kind != KFUSE_AN_OLD)
		rc = kfuse_add_rmsnorm_as(c, KFUSE_AN_V4 | early, h, x, y, w, n, n_rows, eps);
	if (rc == ERR_UNSUPPORTED)
		rc = kfuse_add_rmsnorm_as(c, KFUSE_AN_OLD, h, x, y, w, n, n_rows, eps);
	return rc;
}

extern "C" void kcuda_xparts_forget(struct kcuda_ctx *c)
{
	if (c)
		c->xp_of = NULL, c->xp_rows = 0, c->xp_n = 0;
}

extern "C" const float *kcuda_xparts_of(struct kcuda_ctx *c)
{
	return c ? c->xp_of : NULL;
}

extern "C" int kfuse_add_rmsnorm_parts(struct kcuda_ctx *c, float *h, const float *x, float *y,
                                       const float *w, int64_t n, int64_t n_rows, float eps)
{
	kcuda_xparts_forget(c);
	if (!c)
		return kfuse_add_rmsnorm(c, h, x, y, w, n, n_rows, eps);
	const bool al16 = ((uintptr_t)h | (uintptr_t)x | (uintptr_t)y | (uintptr_t)w) % 16 == 0;
	if (c->xp && an_env_kind() == KFUSE_AN_CL && y && y != h && y != x && h && w && n > 0 &&
	    n % 256 == 0 && n <= (int64_t)AC_NB * AC_T * AC_V * 4 && n_rows >= 1 &&
	    n_rows <= KFUSE_AN_CL_ROWS &&
	    (size_t)n_rows * (size_t)(n / 256) * sizeof(mi8_x) <= KCUDA_XP_BYTES && al16 &&
	    kcuda_cc_major(c->device) >= 9) {
		const int rc = an_launch_cl(c, h, x, y, w, n, n_rows, eps, an_early(n_rows), (mi8_x *)c->xp);
		if (rc == 0)
			c->xp_of = y, c->xp_rows = n_rows, c->xp_n = n;
		if (rc != ERR_UNSUPPORTED)
			return rc;
	}
	return kfuse_add_rmsnorm(c, h, x, y, w, n, n_rows, eps);
}

/* ---- MLA latents: two RMSNorms, RoPE of k_r, the KV write ------------------------------------- */
/* The weight-like operands of part `part` of mla_latent, loaded BEFORE KDEP_ENTRY (they are never
 * written while kernels run: cuda_common.cuh), so their DRAM round trip overlaps the kernel before:
 * the norm weight (wv[k] = w[threadIdx.x + k FU_THREADS], rows up to FU_PER FU_THREADS; longer rows
 * read it in the loop) and, for part 1, this thread's rotary frequency (inv_freq[threadIdx.x]). */
struct fu_latent_pre {
	float wv[FU_PER];
	float invf;
	bool wv_ok;
};
__device__ __forceinline__ void fu_latent_w(int part, int64_t Cq, const float *__restrict__ wq, int64_t C,
                                            int64_t R, const float *__restrict__ wkv, const kfuse_rope &rp,
                                            fu_latent_pre *pre)
{
	const float *w = part == 0 ? wq : wkv;
	const int64_t n = part == 0 ? Cq : C;
	pre->wv_ok = n <= (int64_t)FU_PER * FU_THREADS;
#pragma unroll
	for (int k = 0; k < FU_PER; k++) {
		const int64_t i = threadIdx.x + (int64_t)k * FU_THREADS;
		pre->wv[k] = pre->wv_ok && i < n ? __ldg(w + i) : 0.0f;
	}
	pre->invf = part == 1 && (int64_t)threadIdx.x < R / 2 ? __ldg(rp.inv_freq + threadIdx.x) : 0.0f;
}

/* part 0 (c_q row) or 1 ([c | k_r] row) of mla_latent for row r; every thread of the block calls it */
__device__ __forceinline__ void fu_latent_part(int part, int64_t r, float *cq, int64_t Cq,
                                               const float *__restrict__ wq, float eps_q, float *kvl,
                                               int64_t C, int64_t R, const float *__restrict__ wkv,
                                               float eps_kv, const kfuse_rope &rp, const kfuse_kv &kv,
                                               float *red, const fu_latent_pre &pre, mi8_x *xq)
{
	if (part == 0) { /* c_q row: RMSNorm in place */
		float *xr = cq + r * Cq;
		const kfuse_kv none = {};
		fu_rmsnorm_row<FU_THREADS>(xr, xr, wq, Cq, eps_q, red, none, NULL, pre.wv, pre.wv_ok);
		if (xq) { /* the normed row's int8 parts (kfuse_mla_latent_parts: Cq % 256 == 0, so the
			   * loop's trip count is the same for the 32 lanes of a warp) */
			__syncthreads(); /* the row as stored, by every thread */
			const float4 *x4 = (const float4 *)xr;
			for (int64_t c8 = threadIdx.x; c8 < Cq / 8; c8 += FU_THREADS)
				mi8_put8(xq + r * (Cq / 256), c8, x4[2 * c8], x4[2 * c8 + 1]);
		}
		return;
	}
	/* [c | k_r] row: norm of c, rotation of k_r, each value also to the pool by its thread. The
	 * first pair of each thread is loaded before the norm (its loads beside the row's), so the
	 * rotation does not wait for another round trip after the block sum */
	float *xr = kvl + r * (C + R);
	float *kr = xr + C;
	const int half = (int)(R / 2);
	const bool first = (int)threadIdx.x < half;
	int f0 = 0, f1 = 0;
	float u0 = 0.0f, u1 = 0.0f;
	if (first) {
		fu_pair(rp.pairing, threadIdx.x, half, &f0, &f1);
		u0 = kr[f0];
		u1 = kr[f1];
	}
	const int32_t p = rp.pos[r];
	char *row = fu_kv_row(kv, r, p, C + R);
	fu_rmsnorm_row<FU_THREADS>(xr, xr, wkv, C, eps_kv, red, kv, row, pre.wv, pre.wv_ok);
	if (first) {
		float o0, o1;
		fu_rot(u0, u1, p, pre.invf, &o0, &o1);
		kr[f0] = o0;
		kr[f1] = o1;
		fu_kv_put(kv, row, C + f0, o0);
		fu_kv_put(kv, row, C + f1, o1);
	}
	for (int i = threadIdx.x + FU_THREADS; i < half; i += FU_THREADS) {
		int i0, i1;
		float o0, o1;
		fu_pair(rp.pairing, i, half, &i0, &i1);
		fu_rot(kr[i0], kr[i1], p, rp.inv_freq[i], &o0, &o1);
		kr[i0] = o0;
		kr[i1] = o1;
		fu_kv_put(kv, row, C + i0, o0);
		fu_kv_put(kv, row, C + i1, o1);
	}
}

__global__ void __launch_bounds__(FU_THREADS)
    mla_latent_kernel(float *cq, int64_t Cq, const float *__restrict__ wq, float eps_q, float *kvl, int64_t C,
                      int64_t R, const float *__restrict__ wkv, float eps_kv, kfuse_rope rp, kfuse_kv kv,
                      int early, mi8_x *xq)
{
	fu_latent_pre pre;
	fu_latent_w((int)blockIdx.y, Cq, wq, C, R, wkv, rp, &pre); /* weights: before KDEP_ENTRY */
	if (early) /* TANDEM_LATENT_EARLY=1 (fu_trigger_early) */
		fu_trigger_early();
	KDEP_ENTRY();
	cq = const_cast<float *>(kdep_after((const float *)cq)); /* no activation load above the wait */
	kvl = const_cast<float *>(kdep_after((const float *)kvl));
	__shared__ float red[FU_THREADS / 32];
	fu_latent_part((int)blockIdx.y, blockIdx.x, cq, Cq, wq, eps_q, kvl, C, R, wkv, eps_kv, rp, kv, red,
	               pre, xq);
}

/* mla_latent and idx_prep trigger their dependents before their wait (fu_trigger_early) unless
 * TANDEM_LATENT_EARLY=0. What starts earlier: the products after them (q_b and idx_q_b, 4.5 + 8.9 MB at
 * GLM-5 rank 0 of TP=8) become resident and prefetch their weights into L2 while the q_a / kv_a /
 * indexer products before mla_latent still run, instead of only once mla_latent has passed its wait.
 * Measured (H200, 22:13, GLM-5 rank 0 of TP=8, graphs): batch 1 10.04 -> 9.70 ms, batch 8 22.76 ->
 * 22.80 (noise), ctx 32k 11.76 -> 11.75. Read once. */
static int fu_latent_early(void)
{
	static int on = -1;
	if (on < 0) {
		const char *e = getenv("TANDEM_LATENT_EARLY");
		on = !(e && strcmp(e, "0") == 0);
	}
	return on;
}

static bool fu_rope_ok(const struct kfuse_rope *rp, int64_t R)
{
	return rp && rp->inv_freq && rp->pos && (rp->pairing == 0 || rp->pairing == 1) && R > 0 && R % 2 == 0;
}

static bool fu_kv_ok(const struct kfuse_kv *kv)
{
	return kv && (!kv->base || (kv->seq && kv->blocks && kv->block_tokens > 0 && kv->ld_blocks > 0));
}

extern "C" int kfuse_mla_latent(struct kcuda_ctx *c, float *cq, int64_t Cq, const float *wq, float eps_q,
                                float *kvl, int64_t C, int64_t R, const float *wkv, float eps_kv,
                                int64_t n_rows, const struct kfuse_rope *rp, const struct kfuse_kv *kv)
{
	if (!c || !cq || !wq || !kvl || !wkv || Cq <= 0 || C <= 0 || n_rows < 0 || n_rows > INT32_MAX ||
	    !fu_rope_ok(rp, R) || !fu_kv_ok(kv))
		return kcuda_bad_arg("mla_latent", "Cq %lld C %lld R %lld rows %lld%s", (long long)Cq,
		                     (long long)C, (long long)R, (long long)n_rows,
		                     ", or a null pointer / bad rope or pool description");
	if (n_rows == 0)
		return 0;
	return klaunch("mla_latent", mla_latent_kernel, dim3((unsigned)n_rows, 2), dim3(FU_THREADS), 0,
	               c->stream, cq, Cq, wq, eps_q, kvl, C, R, wkv, eps_kv, *rp, *kv, fu_latent_early(),
	               (mi8_x *)NULL);
}

extern "C" int kfuse_mla_latent_parts(struct kcuda_ctx *c, float *cq, int64_t Cq, const float *wq,
                                      float eps_q, float *kvl, int64_t C, int64_t R, const float *wkv,
                                      float eps_kv, int64_t n_rows, const struct kfuse_rope *rp,
                                      const struct kfuse_kv *kv)
{
	kcuda_xparts_forget(c);
	if (c && c->xp && cq && Cq > 0 && Cq % 256 == 0 && (uintptr_t)cq % 16 == 0 && n_rows >= 1 &&
	    n_rows <= INT32_MAX && (size_t)n_rows * (size_t)(Cq / 256) * sizeof(mi8_x) <= KCUDA_XP_BYTES &&
	    wq && kvl && wkv && C > 0 && fu_rope_ok(rp, R) && fu_kv_ok(kv)) {
		const int rc = klaunch("mla_latent", mla_latent_kernel, dim3((unsigned)n_rows, 2),
		                       dim3(FU_THREADS), 0, c->stream, cq, Cq, wq, eps_q, kvl, C, R, wkv,
		                       eps_kv, *rp, *kv, fu_latent_early(), (mi8_x *)c->xp);
		if (rc == 0)
			c->xp_of = cq, c->xp_rows = n_rows, c->xp_n = Cq;
		return rc;
	}
	return kfuse_mla_latent(c, cq, Cq, wq, eps_q, kvl, C, R, wkv, eps_kv, n_rows, rp, kv);
}

/* ---- indexer inputs: LayerNorm + RoPE + KV write of k_I, RoPE of q_I, scale of w_I ------------- */
/* k_I of row r: LayerNorm (kfwd_layernorm's statistics: double, tree sums over the block), RoPE
 * of its first R values, the KV write; red[FU_THREADS], ks[DI] shared; every thread calls it */
/* the sum of v over the FU_THREADS threads of the block in double: warp sums, then the warps' in
 * order (every thread gets the same value); red[FU_THREADS / 32] */
__device__ __forceinline__ double fu_block_sum_d(double v, double *red)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	if ((threadIdx.x & 31) == 0)
		red[threadIdx.x >> 5] = v;
	__syncthreads();
	double tot = 0;
#pragma unroll
	for (int k = 0; k < FU_THREADS / 32; k++)
		tot += red[k];
	return tot;
}

/* k_I's weight-like operands for this thread's first value, loaded BEFORE KDEP_ENTRY (weights and the
 * rope table are never written while kernels run): kw, kb at threadIdx.x (< DI), inv_freq at
 * threadIdx.x (< R / 2) */
struct fu_key_pre {
	float kw, kb, inv;
};
__device__ __forceinline__ fu_key_pre fu_key_w(int64_t DI, int64_t R, const float *__restrict__ kw,
                                               const float *__restrict__ kb, const kfuse_rope &rp)
{
	fu_key_pre k;
	const int64_t i = threadIdx.x;
	k.kw = i < DI ? __ldg(kw + i) : 0.0f;
	k.kb = kb && i < DI ? __ldg(kb + i) : 0.0f;
	k.inv = i < R / 2 ? __ldg(rp.inv_freq + i) : 0.0f;
	return k;
}

__device__ __forceinline__ void fu_idx_key(int64_t r, float *kI, int64_t DI, int64_t R,
                                           const float *__restrict__ kw, const float *__restrict__ kb,
                                           float eps, const kfuse_rope &rp, const kfuse_kv &kv, double *red,
                                           float *ks, const fu_key_pre &pre)
{
	const int32_t p = rp.pos[r];
	const int half = (int)(R / 2);
	char *row = fu_kv_row(kv, r, p, DI); /* its table lookup overlaps the sums below */
	const float *xr = kI + r * DI;
	/* statistics in double (kfwd_layernorm's precision), each a warp sum then the 8 warps' sums
	 * in order: one barrier per sum instead of the tree's nine (the row op's latency is its chain
	 * of barriers); red[0..7] and red[8..15] hold the two sums' parts, so no barrier between */
	double s = 0;
	for (int64_t i = threadIdx.x; i < DI; i += FU_THREADS)
		s += xr[i];
	const double mean = fu_block_sum_d(s, red) / (double)DI;
	double v2 = 0;
	for (int64_t i = threadIdx.x; i < DI; i += FU_THREADS)
		v2 += ((double)xr[i] - mean) * ((double)xr[i] - mean);
	const double inv = 1.0 / sqrt(fu_block_sum_d(v2, red + FU_THREADS / 32) / (double)DI + (double)eps);
	for (int64_t i = threadIdx.x; i < DI; i += FU_THREADS) {
		const bool pl = i == (int64_t)threadIdx.x; /* the first value's weights came before KDEP */
		ks[i] =
		    __fadd_rn(__fmul_rn((float)(((double)xr[i] - mean) * inv), pl ? pre.kw : kw[i]),
		              kb ? (pl ? pre.kb : kb[i]) : 0.0f); /* no FMA: the same bits in every kernel */
	}
	__syncthreads(); /* the pairs below cross threads */
	float *yr = kI + r * DI;
	for (int i = threadIdx.x; i < half; i += FU_THREADS) {
		int i0, i1;
		float o0, o1;
		fu_pair(rp.pairing, i, half, &i0, &i1);
		fu_rot(ks[i0], ks[i1], p, i == (int)threadIdx.x ? pre.inv : rp.inv_freq[i], &o0, &o1);
		yr[i0] = o0;
		yr[i1] = o1;
		fu_kv_put(kv, row, i0, o0);
		fu_kv_put(kv, row, i1, o1);
	}
	for (int64_t j = R + threadIdx.x; j < DI; j += FU_THREADS) {
		yr[j] = ks[j];
		fu_kv_put(kv, row, j, ks[j]);
	}
}

__global__ void __launch_bounds__(FU_THREADS)
    idx_prep_kernel(float *qI, float *wI, int64_t HI, float wscale, float *kI, int64_t DI, int64_t R,
                    const float *__restrict__ kw, const float *__restrict__ kb, float eps, kfuse_rope rp,
                    kfuse_kv kv, int early)
{
	const fu_key_pre pre = fu_key_w(DI, R, kw, kb, rp); /* weights: before KDEP_ENTRY */
	if (early) /* TANDEM_LATENT_EARLY=1 (fu_trigger_early) */
		fu_trigger_early();
	KDEP_ENTRY();
	qI = const_cast<float *>(kdep_after((const float *)qI)); /* no activation load above the wait */
	wI = const_cast<float *>(kdep_after((const float *)wI));
	kI = const_cast<float *>(kdep_after((const float *)kI));
	__shared__ double red[FU_THREADS];
	__shared__ float ks[FU_DI_MAX];
	const int64_t r = blockIdx.x;
	const int32_t p = rp.pos[r];
	const int half = (int)(R / 2);
	if (blockIdx.y == 1) { /* q_I heads and w_I */
		float *q = qI + r * HI * DI;
#pragma unroll 4
		for (int64_t g = threadIdx.x; g < HI * half; g += FU_THREADS) {
			const int i = (int)(g % half);
			float *v = q + (g / half) * DI;
			int i0, i1;
			fu_pair(rp.pairing, i, half, &i0, &i1);
			fu_rot(v[i0], v[i1], p, rp.inv_freq[i], &v[i0], &v[i1]);
		}
		for (int64_t j = threadIdx.x; j < HI; j += FU_THREADS)
			wI[r * HI + j] *= wscale;
		return;
	}
	fu_idx_key(r, kI, DI, R, kw, kb, eps, rp, kv, red, ks, pre);
}

extern "C" int kfuse_idx_prep(struct kcuda_ctx *c, float *qI, float *wI, int64_t HI, float wscale, float *kI,
                              int64_t DI, int64_t R, const float *kw, const float *kb, float eps,
                              int64_t n_rows, const struct kfuse_rope *rp, const struct kfuse_kv *kv)
{
	if (!c || !qI || !wI || !kI || !kw || HI <= 0 || DI <= 0 || DI > FU_DI_MAX || R > DI || n_rows < 0 ||
	    n_rows > INT32_MAX || !fu_rope_ok(rp, R) || !fu_kv_ok(kv))
		return kcuda_bad_arg("idx_prep", "HI %lld DI %lld R %lld rows %lld%s", (long long)HI,
		                     (long long)DI, (long long)R, (long long)n_rows,
		                     ", or a null pointer / bad rope or pool description / DI > 4096");
	if (n_rows == 0)
		return 0;
	return klaunch("idx_prep", idx_prep_kernel, dim3((unsigned)n_rows, 2), dim3(FU_THREADS), 0, c->stream,
	               qI, wI, HI, wscale, kI, DI, R, kw, kb, eps, *rp, *kv, fu_latent_early());
}

/* ---- MLA latents + the indexer's key and weights in one launch ---------------------------------
 * Grid (row, 3): parts 0 and 1 as mla_latent_kernel, part 2 the indexer key (fu_idx_key) and the
 * row's w_I scale: idx_prep without its q_I rope, which the score kernel then does on its loads
 * (kfuse_indexer_topk_rope), so the decode step has no idx_prep node. */
__global__ void __launch_bounds__(FU_THREADS)
    mla_latent_idx_kernel(float *cq, int64_t Cq, const float *__restrict__ wq, float eps_q, float *kvl,
                          int64_t C, int64_t R, const float *__restrict__ wkv, float eps_kv, kfuse_rope rp,
                          kfuse_kv kv, kfuse_idx_key ik)
{
	fu_latent_pre pre;
	fu_key_pre kpre = {0.0f, 0.0f, 0.0f};
	if (blockIdx.y < 2) /* weights: before KDEP_ENTRY */
		fu_latent_w((int)blockIdx.y, Cq, wq, C, R, wkv, rp, &pre);
	else
		kpre = fu_key_w(ik.DI, ik.R, ik.kw, ik.kb, ik.rp);
	KDEP_ENTRY();
	__shared__ float red[FU_THREADS / 32];
	__shared__ double redd[FU_THREADS];
	__shared__ float ks[FU_DI_MAX];
	const int64_t r = blockIdx.x;
	if (blockIdx.y < 2) {
		fu_latent_part((int)blockIdx.y, r, cq, Cq, wq, eps_q, kvl, C, R, wkv, eps_kv, rp, kv, red,
		               pre, NULL);
		return;
	}
	for (int64_t j = threadIdx.x; j < ik.HI; j += FU_THREADS)
		ik.wI[r * ik.HI + j] *= ik.wscale;
	fu_idx_key(r, ik.kI, ik.DI, ik.R, ik.kw, ik.kb, ik.eps, ik.rp, ik.kv, redd, ks, kpre);
}

extern "C" int kfuse_mla_latent_idx(struct kcuda_ctx *c, float *cq, int64_t Cq, const float *wq, float eps_q,
                                    float *kvl, int64_t C, int64_t R, const float *wkv, float eps_kv,
                                    int64_t n_rows, const struct kfuse_rope *rp, const struct kfuse_kv *kv,
                                    const struct kfuse_idx_key *ik)
{
	if (!c || !cq || !wq || !kvl || !wkv || Cq <= 0 || C <= 0 || n_rows < 0 || n_rows > INT32_MAX ||
	    !fu_rope_ok(rp, R) || !fu_kv_ok(kv) || !ik || !ik->kI || !ik->wI || !ik->kw || ik->HI < 1 ||
	    ik->DI < 1 || ik->DI > FU_DI_MAX || ik->R > ik->DI || !fu_rope_ok(&ik->rp, ik->R) ||
	    !fu_kv_ok(&ik->kv))
		return kcuda_bad_arg("mla_latent_idx", "Cq %lld C %lld R %lld rows %lld%s", (long long)Cq,
		                     (long long)C, (long long)R, (long long)n_rows,
		                     ", or a null pointer / bad rope, pool or indexer description");
	if (n_rows == 0)
		return 0;
	return klaunch("mla_latent_idx", mla_latent_idx_kernel, dim3((unsigned)n_rows, 3), dim3(FU_THREADS),
	               0, c->stream, cq, Cq, wq, eps_q, kvl, C, R, wkv, eps_kv, *rp, *kv, *ik);
}

/* ---- copy + RoPE (the absorbed query's rotary part): one thread per (token, head, pair) -------- */
__global__ void rope_copy_kernel(float *dst, int64_t ldd, int64_t dhs, const float *src, int64_t lds,
                                 int64_t shs, int64_t n_heads, int half, kfuse_rope rp, int64_t n)
{
	KDEP_ENTRY();
	const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (g >= n)
		return;
	const int i = (int)(g % half);
	const int64_t h = (g / half) % n_heads, t = g / half / n_heads;
	const float *s = src + t * lds + h * shs;
	float *d = dst + t * ldd + h * dhs;
	int i0, i1;
	fu_pair(rp.pairing, i, half, &i0, &i1);
	fu_rot(s[i0], s[i1], rp.pos[t], rp.inv_freq[i], &d[i0], &d[i1]);
}

extern "C" int kfuse_rope_copy(struct kcuda_ctx *c, float *dst, int64_t ldd, int64_t dhs, const float *src,
                               int64_t lds, int64_t shs, int64_t n_tok, int64_t n_heads, int64_t R,
                               const struct kfuse_rope *rp)
{
	if (!c || !dst || !src || n_tok < 0 || n_heads <= 0 || !fu_rope_ok(rp, R) ||
	    (n_heads > 1 && (dhs < R || shs < R)) ||
	    (n_tok > 1 && (ldd < (n_heads - 1) * dhs + R || lds < (n_heads - 1) * shs + R)))
		return kcuda_bad_arg("rope_copy", "n_tok %lld heads %lld R %lld ldd %lld lds %lld%s",
		                     (long long)n_tok, (long long)n_heads, (long long)R, (long long)ldd,
		                     (long long)lds, ", or a null pointer / bad rope description");
	const int64_t n = n_tok * n_heads * (R / 2);
	if (n == 0)
		return 0;
	if ((n + 255) / 256 > INT32_MAX)
		return ERR_LIMIT;
	return klaunch("rope_copy", rope_copy_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), 0,
	               c->stream, dst, ldd, dhs, src, lds, shs, n_heads, (int)(R / 2), *rp, n);
}
