/* Shared device helpers for the CUDA ops in kernels/cuda/: error checking, fp16/bf16 loads, warp
 * reductions, and loads of 32-bit words from the 2-byte-aligned GGUF blocks (Q8_0, Q6_K, ...).
 * Internal to kernels/cuda; other folders include only kernels/kernels.h. */
#ifndef TANDEM_KERNELS_CUDA_COMMON_CUH
#define TANDEM_KERNELS_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/base/err.h"
#include "kernels/kernels.h"

/* The context behind kcuda_* calls: one stream, a cuBLAS handle, a device workspace. */
struct kcuda_ctx {
	int device;
	cudaStream_t stream;
	void *cublas; /* cublasHandle_t */
	void *ws; /* device workspace (dequantized weight tiles for the prefill GEMM) */
	size_t ws_bytes;
	int n_sm;
	unsigned *err_dev; /* count of bad inputs seen by kernels (e.g. token ids out of range) */
	/* KCUDA_ZS_BYTES zeroed at creation; a kernel that counts across its blocks in it (the
	 * indexer's fused top-k: per-row histograms and tickets) leaves it zero again when done, so
	 * graph replays need no memset node */
	unsigned *zs;
	unsigned *tickets; /* KCUDA_N_TICKETS counters, zero between launches: a kernel whose last
	                    * block merges the others' partials (mla_attn_dec.cu) counts arrivals here
	                    * and that last block sets its counter back to 0 */
	cudaEvent_t dep_ev; /* recorded on this stream by kcuda_stream_after (one per context, reused:
	                     * a wait takes the event's state at the time of the wait call) */
	/* int8 parts of one activation (k45_i8.cuh's mi8_x per 256 elements of a row), written by
	 * kfuse_add_rmsnorm_parts and read by the one-token MoE units (moe_small.cu) instead of
	 * quantizing the activation in each of their blocks; xp_of / xp_rows / xp_n: the rows they
	 * are the parts of (xp_of NULL: none; kcuda_xparts_forget) */
	void *xp;
	const float *xp_of;
	int64_t xp_rows, xp_n;
};
#define KCUDA_XP_BYTES ((size_t)8 * 64 * 896) /* 8 rows of up to 16384 */
#define KCUDA_ZS_BYTES ((size_t)5 << 20)
#define KCUDA_N_TICKETS 16384

/* Sticky CUDA errors mean the context is unusable: abort loudly with file:line. */
#define KCUDA_CHECK(call)                                                                                    \
	do {                                                                                                 \
		cudaError_t e_ = (call);                                                                     \
		if (e_ != cudaSuccess) {                                                                     \
			fprintf(stderr, "%s:%d: CUDA error %s: %s\n", __FILE__, __LINE__, #call,             \
			        cudaGetErrorString(e_));                                                     \
			abort();                                                                             \
		}                                                                                            \
	} while (0)

/* launches made through the ops (kernels/cuda/prof.cu reports them per step) */
extern "C" unsigned long long kcuda_n_launch;

/* After a launch whose call returned e: the launch is counted, and e, or else an error pending
 * since (a <<< >>> launch reports only there), is returned as ERR_CUDA with a message on stderr
 * naming what failed; the kernels never log. */
static inline int kcuda_launch_result(const char *what, cudaError_t e)
{
	kcuda_n_launch++;
	if (e == cudaSuccess)
		e = cudaGetLastError();
	if (e == cudaSuccess)
		return 0;
	fprintf(stderr, "kcuda: %s launch failed: %s\n", what, cudaGetErrorString(e));
	return ERR_CUDA;
}
/* after a kern<<< >>>(...) launch */
static inline int kcuda_launch_status(const char *what)
{
	return kcuda_launch_result(what, cudaSuccess);
}

/* Programmatic dependent launch (PDL, sm_90 and later: H200, B200, RTX PRO 6000). A kernel launched
 * with klaunch() may be scheduled while the kernel before it on the stream is still running, so
 * its launch latency and block ramp-up hide behind that kernel's tail (in a decode graph of ~1900
 * small kernels that latency is a large part of the step). The price is a rule every such kernel
 * must keep: KDEP_ENTRY() is its FIRST statement, before any global load or store. griddepcontrol.wait
 * returns once every grid this one depends on has completed and its memory is visible (so a chain
 * A -> B -> C is ordered transitively: B only finishes after its own wait saw A finish); then
 * launch_dependents lets the next PDL kernel start its own launch. A kernel launched with <<< >>>
 * or by a library (cuBLAS, NCCL) keeps full stream order on both sides, so conversion can be
 * piecewise. Without the wait a klaunch()ed kernel would race with its predecessor: never launch a
 * kernel through klaunch() that does not begin with KDEP_ENTRY(). On the host, TANDEM_PDL=0 turns the
 * attribute off (plain stream order; the device instructions are then no-ops). */
__device__ __forceinline__ void kdep_entry(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.wait;" ::: "memory");
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
#define KDEP_ENTRY() kdep_entry()

/* The one exception to "KDEP_ENTRY() first": model WEIGHTS. They are written once, before the
 * first forward, and never while a kernel can run, so a kernel may touch them before its
 * KDEP_ENTRY(): prefetch them into L2 (kdep_prefetch_l2) or start cp.async copies of them into
 * shared memory. Under PDL the kernel's blocks are resident while the kernel before it still runs
 * (that one's launch_dependents comes right after its own wait), so this overlaps the next
 * product's weight stream with the current kernel instead of starting it after the handoff.
 * Nothing else may be read before KDEP_ENTRY(): activations, KV, routing ids, workspaces are all
 * written by earlier kernels. One narrower exception, argued where it is used (indexer_fast.cu,
 * idx_args.early_new): the step inputs the host uploads synchronously before the step's first
 * kernel (positions, key counts, block tables) and the KV rows of positions that earlier steps
 * wrote; the rows this step writes are read only after the wait (tests/ops/test_ops_indexer.c
 * checks it with a late producer, kernels/cuda/pdl_probe.h). kcuda_prefetch_enabled() (TANDEM_PREFETCH,
 * default on) is passed to the kernels as an argument so A/B runs need no rebuild. */
extern "C" int kcuda_prefetch_enabled(void); /* ctx.cu */
/* compute capability major of device dev (0 when unknown: a failed query or dev outside 0..63), cached
 * per device (ctx.cu; clusters and the bulk copies need 9 or more) */
extern "C" int kcuda_cc_major(int dev);
/* The most shared memory one block of device dev may have (cudaDevAttrMaxSharedMemoryPerBlockOptin:
 * 227 KB on sm_90 / sm_100, 99 KB on sm_120), 0 when unknown; every kernel that opts in to more than
 * 48 KB checks its need against this and takes another path (or refuses with an error) when it does
 * not fit. TANDEM_CUDA_SMEM_CAP=bytes lowers it, so a larger GPU runs the paths a smaller one takes
 * (e.g. 101376 on an H200: the RTX PRO 6000's sm_120 limit). Cached per device (ctx.cu). */
extern "C" int kcuda_smem_optin(int dev);

/* p, made opaque to the compiler from this point on: loads through the result cannot be scheduled
 * before it. A kernel that touches weights before KDEP_ENTRY() must pass every pointer to data an
 * earlier kernel writes through this right after KDEP_ENTRY(): __ldg and const __restrict__ loads
 * are "invariant" to the compiler, which may otherwise move them above griddepcontrol.wait (the
 * asm's memory clobber does not cover memory it believes read-only) and read the data before the
 * kernel that writes it has finished. Found on the H200 (2026-11-29 19:30: deepseek2-tiny-Q8_0 logits
 * off by 16, nondeterministic, with the head GEMVs' weight loads moved before the wait). */
template <typename T> __device__ __forceinline__ const T *kdep_after(const T *p)
{
	asm volatile("" : "+l"(p) : : "memory");
	return p;
}

/* Hint: bring [p, p + bytes) into L2 (this thread issues it; callers spread ranges over threads).
 * sm_90+ has a bulk prefetch (one instruction per range, done by the copy engine of the SM); it
 * needs 16-byte alignment, so the range is trimmed inward (at most 15 bytes each end stay out: a
 * prefetch never reaches outside the buffer). Earlier parts prefetch 128-byte lines. */
__device__ __forceinline__ void kdep_prefetch_l2(const void *p, size_t bytes)
{
	uintptr_t a = ((uintptr_t)p + 15) & ~(uintptr_t)15;
	const uintptr_t e = ((uintptr_t)p + bytes) & ~(uintptr_t)15;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	for (; a < e; a += 65536) { /* pieces of at most 64 KB */
		const uint32_t n = (uint32_t)(e - a < 65536 ? e - a : 65536);
		asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"(n) : "memory");
	}
#else
	for (a &= ~(uintptr_t)127; a < e; a += 128)
		asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
#endif
}

extern "C" int kcuda_pdl_enabled(void); /* TANDEM_PDL (default on); ctx.cu */

/* TANDEM_CARVEOUT=N (0..100, read once per translation unit; unset: -1, nothing done): klaunch sets
 * every kernel's preferred shared-memory carveout to N percent before launching it. An experiment
 * (gemv6, 2026-11-30): a block under PDL can only join an SM whose current L1 / shared split has room
 * for it, and each kernel's split follows its own needs (mla_dec's ~85 KB: the 100 KB split, leaving
 * ~15 KB), so a 35 KB gemv_res block cannot become resident beside it; with one split for all kernels
 * (100: the most shared memory) it can. */
static inline int kcuda_carveout_pref(void)
{
	static int v = -2;
	if (v == -2) {
		const char *e = getenv("TANDEM_CARVEOUT");
		v = e && *e ? atoi(e) : -1;
		v = v < -1 ? -1 : (v > 100 ? 100 : v);
	}
	return v;
}

/* The one place the launch attributes are set: kern over grid with the PDL attribute when
 * kcuda_pdl_enabled(), and in thread-block clusters of shape `cluster` (sm_90+) unless one of its
 * dimensions is 0 (dim3(0): no cluster attribute; a kernel that uses cluster barriers needs the
 * attribute even for clusters of one block). Returns cudaLaunchKernelEx's status as it is: nothing
 * counted, printed or cleared, for the callers that take a refusal as "use another kernel"
 * (mla_attn_merge.cuh's kmla_cluster_launch); the others use klaunch / klaunch_cl. kern must begin
 * with KDEP_ENTRY() (see above). */
template <typename... KArgs, typename... Args>
static inline cudaError_t klaunch_try(void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                      cudaStream_t stream, dim3 cluster, Args... args)
{
	cudaLaunchAttribute at[2];
	unsigned na = 0;
	if (kcuda_pdl_enabled()) {
		at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
		at[na].val.programmaticStreamSerializationAllowed = 1;
		na++;
	}
	if (cluster.x && cluster.y && cluster.z) {
		at[na].id = cudaLaunchAttributeClusterDimension;
		at[na].val.clusterDim.x = cluster.x;
		at[na].val.clusterDim.y = cluster.y;
		at[na].val.clusterDim.z = cluster.z;
		na++;
	}
	cudaLaunchConfig_t cfg = {};
	cfg.gridDim = grid;
	cfg.blockDim = block;
	cfg.dynamicSmemBytes = smem;
	cfg.stream = stream;
	cfg.attrs = at;
	cfg.numAttrs = na;
	return cudaLaunchKernelEx(&cfg, kern, ((KArgs)args)...);
}

/* kern<<<grid, block, smem, stream>>>(args...) with the PDL attribute (when enabled) and
 * TANDEM_CARVEOUT's carveout; returns the launch status like kcuda_launch_status(what). */
template <typename... KArgs, typename... Args>
static inline int klaunch(const char *what, void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem,
                          cudaStream_t stream, Args... args)
{
	const int co = kcuda_carveout_pref();
	if (co >= 0 &&
	    cudaFuncSetAttribute((const void *)kern, cudaFuncAttributePreferredSharedMemoryCarveout, co) !=
	        cudaSuccess)
		(void)cudaGetLastError(); /* a hint: a refusal only leaves the default split */
	return kcuda_launch_result(what, klaunch_try(kern, grid, block, smem, stream, dim3(0), args...));
}

/* klaunch in thread-block clusters of shape `cluster` (see klaunch_try; dim3(0): none), without
 * klaunch's TANDEM_CARVEOUT experiment (the cluster launches it replaced never had it). */
template <typename... KArgs, typename... Args>
static inline int klaunch_cl(const char *what, void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem,
                             cudaStream_t stream, dim3 cluster, Args... args)
{
	return kcuda_launch_result(what, klaunch_try(kern, grid, block, smem, stream, cluster, args...));
}

/* How many clusters of shape `cluster` of fn (block threads, smem bytes of dynamic shared memory a
 * block) can be resident at once (cudaOccupancyMaxActiveClusters; nothing launched). The query
 * carries the cluster attribute only: PDL does not change residency. */
static inline cudaError_t klaunch_max_clusters(const void *fn, dim3 cluster, dim3 block, size_t smem,
                                               cudaStream_t stream, int *n)
{
	cudaLaunchAttribute at[1];
	at[0].id = cudaLaunchAttributeClusterDimension;
	at[0].val.clusterDim.x = cluster.x;
	at[0].val.clusterDim.y = cluster.y;
	at[0].val.clusterDim.z = cluster.z;
	cudaLaunchConfig_t cfg = {};
	cfg.gridDim = cluster; /* one cluster: the grid must be a multiple of it */
	cfg.blockDim = block;
	cfg.dynamicSmemBytes = smem;
	cfg.stream = stream;
	cfg.attrs = at;
	cfg.numAttrs = 1;
	return cudaOccupancyMaxActiveClusters(n, fn, &cfg);
}

/* A rejected argument: one line on stderr naming the op and what is wrong, then -EINVAL, so a
 * failing forward explains itself (the ops have no errbuf; the backend only sees the code). */
#include <errno.h>
#include <stdarg.h>
/* an integer switch: getenv(name) when it parses into [lo, hi], else def (unset, empty, not a number or
 * out of range). Callers that read it once keep the value themselves. */
static inline long kcuda_env_long(const char *name, long lo, long hi, long def)
{
	const char *e = getenv(name);
	if (!e || !*e)
		return def;
	const long x = strtol(e, NULL, 10);
	return x >= lo && x <= hi ? x : def;
}
static inline int __attribute__((format(printf, 2, 3))) kcuda_bad_arg(const char *op, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "kcuda: %s: bad argument: ", op);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	return -EINVAL;
}

__device__ __forceinline__ float kc_h2f(uint16_t h)
{
	return __half2float(__ushort_as_half(h));
}
__device__ __forceinline__ float kc_bf2f(uint16_t h)
{
	return __uint_as_float((uint32_t)h << 16);
}
__device__ __forceinline__ uint16_t kc_ld16(const uint8_t *p)
{
	return *(const uint16_t *)p;
}

__device__ __forceinline__ float kc_warp_sum(float v)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}
__device__ __forceinline__ float kc_warp_max(float v)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

/* N consecutive little-endian 32-bit words starting at a 2-byte-aligned address: N+1 aligned
 * loads and a funnel shift each. May read up to 2 bytes past p + 4N, which is why device weight
 * buffers carry 16 bytes of tail padding (kcuda_weight_upload). */
template <int N> __device__ __forceinline__ void kc_ldw_a2(const uint8_t *p, uint32_t *w)
{
	const uint32_t *b = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
	const uint32_t sh = ((uint32_t)(uintptr_t)p & 2u) * 8u; /* 0 or 16 */
	uint32_t prev = b[0];
#pragma unroll
	for (int i = 0; i < N; i++) {
		uint32_t next = b[i + 1];
		w[i] = __funnelshift_r(prev, next, sh);
		prev = next;
	}
}
/* Same for 4-byte-aligned addresses (plain loads). */
template <int N> __device__ __forceinline__ void kc_ldw_a4(const uint8_t *p, uint32_t *w)
{
	const uint32_t *b = (const uint32_t *)p;
#pragma unroll
	for (int i = 0; i < N; i++)
		w[i] = b[i];
}
/* 16-byte-aligned (vector loads). */
template <int N> __device__ __forceinline__ void kc_ldw_a16(const uint8_t *p, uint32_t *w)
{
	static_assert(N % 4 == 0, "kc_ldw_a16 loads whole uint4s");
	const uint4 *b = (const uint4 *)p;
#pragma unroll
	for (int i = 0; i < N / 4; i++) {
		uint4 v = __ldg(b + i);
		w[4 * i + 0] = v.x;
		w[4 * i + 1] = v.y;
		w[4 * i + 2] = v.z;
		w[4 * i + 3] = v.w;
	}
}

__device__ __forceinline__ uint32_t kc_byte(uint32_t w, int i)
{
	return (w >> (8 * i)) & 0xffu;
}

#endif
