/* One-shot all-reduce of tandem's own for the small sums of a decode step (one token of GLM-5 is 6144
 * floats; TP=8 does ~157 of them per step), as an alternative to NCCL where peer access works.
 *
 * Every rank owns, in its own device memory, two data slots (ping and pong) of max_floats floats
 * and two rows of flags (one flag per source rank and per block). A call on rank r, block b:
 *   1. copies its chunk of buf into its own slot[parity] (local writes);
 *   2. publishes epoch e on every peer p: flags_p[parity][r][b] = e (a release store at system
 *      scope after a system fence, so the data of step 1 is visible before the flag);
 *   3. polls its own flags[parity][q][b] for every rank q until they read e (acquire), against a
 *      deadline (%globaltimer): past it the block counts a timeout in err and gives up (the output
 *      is then wrong, the host sees the count: kcuda_ar_errors);
 *   4. sums chunk b over ranks 0..T-1 in that fixed order from the peers' slots (peer loads over
 *      NVLink / PCIe) into buf, so every rank gets the same bits (0 + x0 + x1 + ...);
 *   5. stores e as its block's epoch.
 * The epoch lives in device memory (one counter per rank and block), so the kernel's arguments never
 * change and a captured graph replays it. Two slots make consecutive calls safe without a second
 * barrier: rank p can only write slot[parity] again at call e + 2, and it reaches call e + 2 only
 * after every rank has published e + 1, which each does after finishing its reads of call e.
 *
 * The test (tests/ops/test_ops_allreduce.c) runs T ranks as T streams of ONE GPU as well (same
 * protocol, plain device pointers); on several GPUs the slots are read through peer access, which
 * kcuda_ar_create enables and requires (it says which pair lacks it; the caller keeps NCCL then).
 * One block per 4096 floats up to AR_MAX_BLOCKS: the peers' loads of a 24 KB message are spread over
 * several SMs. Launched plainly (not klaunch): a spinning kernel must not start before the kernel
 * that produces buf has finished, and its peers' flags are outside any stream order anyway. */
#include <errno.h>
#include <string.h>

#include "kernels/cuda/cuda_common.cuh"

#define AR_MAX_RANKS 8
#define AR_MAX_BLOCKS 16
#define AR_THREADS 512
#define AR_CHUNK 4096 /* floats per block (rounded up to a multiple of 4 per block) */

struct ar_peers {
	float *slot[AR_MAX_RANKS]; /* rank q's two data slots (2 x max_floats) */
	unsigned *flags[AR_MAX_RANKS]; /* rank q's flags: [2][AR_MAX_RANKS][AR_MAX_BLOCKS] */
};

struct ar_rank {
	int device;
	cudaStream_t stream;
	float *slot;
	unsigned *flags;
	unsigned *epoch; /* [AR_MAX_BLOCKS] */
	unsigned *err;
};

struct kcuda_ar {
	int size;
	size_t max_floats;
	uint64_t timeout_ns;
	struct ar_peers peers;
	struct ar_rank r[AR_MAX_RANKS];
};

__device__ __forceinline__ uint64_t ar_now_ns(void)
{
	uint64_t t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}
__device__ __forceinline__ void ar_store_release(unsigned *p, unsigned v)
{
	asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned ar_load_acquire(const unsigned *p)
{
	unsigned v;
	asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
	return v;
}

__global__ void __launch_bounds__(AR_THREADS)
    ar_kernel(float *buf, int64_t n, int64_t chunk, int rank, int size, size_t max_floats, struct ar_peers P,
              unsigned *epoch, unsigned *err, uint64_t timeout_ns)
{
	const int b = blockIdx.x;
	const int64_t lo = (int64_t)b * chunk, hi = lo + chunk < n ? lo + chunk : n;
	const unsigned e = epoch[b] + 1u;
	const int par = (int)(e & 1u);
	float *mine = P.slot[rank] + (size_t)par * max_floats;
	for (int64_t i = lo + threadIdx.x; i < hi; i += AR_THREADS)
		mine[i] = buf[i];
	__syncthreads();
	const size_t fl = ((size_t)par * AR_MAX_RANKS + (size_t)rank) * AR_MAX_BLOCKS + (size_t)b;
	if (threadIdx.x < (unsigned)size) {
		__threadfence_system();
		ar_store_release(P.flags[threadIdx.x] + fl, e);
	}
	__shared__ int timed_out;
	if (threadIdx.x == 0)
		timed_out = 0;
	__syncthreads();
	if (threadIdx.x < (unsigned)size) {
		const unsigned *f =
		    P.flags[rank] + ((size_t)par * AR_MAX_RANKS + threadIdx.x) * AR_MAX_BLOCKS + (size_t)b;
		const uint64_t t0 = ar_now_ns();
		while (ar_load_acquire(f) != e) {
			if (ar_now_ns() - t0 > timeout_ns) {
				timed_out = 1;
				break;
			}
		}
		__threadfence_system();
	}
	__syncthreads();
	if (timed_out) {
		if (threadIdx.x == 0)
			atomicAdd(err, 1u);
		/* the epoch still advances: the host treats the group as broken after any timeout */
	} else {
		for (int64_t i = lo + threadIdx.x; i < hi; i += AR_THREADS) {
			float s = 0.0f;
			for (int q = 0; q < size; q++)
				s += __ldcv(P.slot[q] + (size_t)par * max_floats + i);
			buf[i] = s;
		}
	}
	__syncthreads();
	if (threadIdx.x == 0)
		epoch[b] = e;
}

static void ar_free_rank(struct ar_rank *r)
{
	if (cudaSetDevice(r->device) != cudaSuccess)
		return;
	cudaFree(r->slot);
	cudaFree(r->flags);
	cudaFree(r->epoch);
	cudaFree(r->err);
	memset(r, 0, sizeof(*r));
}

extern "C" void kcuda_ar_destroy(struct kcuda_ar *a)
{
	if (!a)
		return;
	for (int i = 0; i < a->size; i++)
		ar_free_rank(&a->r[i]);
	free(a);
}

extern "C" int kcuda_ar_create(int size, struct kcuda_ctx *const *ctxs, size_t max_floats, double timeout_s,
                               struct kcuda_ar **out, char *why, size_t why_len)
{
	*out = NULL;
	if (why_len)
		why[0] = '\0';
	if (size < 1 || size > AR_MAX_RANKS || !ctxs || max_floats == 0 ||
	    max_floats > (size_t)AR_MAX_BLOCKS * AR_CHUNK || !(timeout_s > 0.0)) {
		snprintf(why, why_len, "one-shot all-reduce: %d ranks (1..%d), %zu floats (1..%d)", size,
		         AR_MAX_RANKS, max_floats, AR_MAX_BLOCKS * AR_CHUNK);
		return -EINVAL;
	}
	/* every pair of distinct devices must reach each other's memory */
	for (int i = 0; i < size; i++)
		for (int j = 0; j < size; j++) {
			int di = ctxs[i]->device, dj = ctxs[j]->device, ok = 0;
			if (di == dj)
				continue;
			if (cudaDeviceCanAccessPeer(&ok, di, dj) != cudaSuccess || !ok) {
				(void)cudaGetLastError();
				snprintf(why, why_len,
				         "one-shot all-reduce: GPU %d cannot access GPU %d (no peer access)",
				         di, dj);
				return ERR_UNSUPPORTED;
			}
		}
	struct kcuda_ar *a = (struct kcuda_ar *)calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	a->size = size;
	a->max_floats = (max_floats + 3) & ~(size_t)3;
	a->timeout_ns = (uint64_t)(timeout_s * 1e9);
	const size_t flag_bytes = 2u * AR_MAX_RANKS * AR_MAX_BLOCKS * sizeof(unsigned);
	int rc = 0;
	for (int i = 0; i < size && !rc; i++) {
		struct ar_rank *r = &a->r[i];
		r->device = ctxs[i]->device;
		r->stream = ctxs[i]->stream;
		if (cudaSetDevice(r->device) != cudaSuccess ||
		    cudaMalloc((void **)&r->slot, 2 * a->max_floats * sizeof(float)) != cudaSuccess ||
		    cudaMalloc((void **)&r->flags, flag_bytes) != cudaSuccess ||
		    cudaMalloc((void **)&r->epoch, AR_MAX_BLOCKS * sizeof(unsigned)) != cudaSuccess ||
		    cudaMalloc((void **)&r->err, sizeof(unsigned)) != cudaSuccess ||
		    cudaMemset(r->flags, 0, flag_bytes) != cudaSuccess ||
		    cudaMemset(r->epoch, 0, AR_MAX_BLOCKS * sizeof(unsigned)) != cudaSuccess ||
		    cudaMemset(r->err, 0, sizeof(unsigned)) != cudaSuccess) {
			snprintf(why, why_len, "one-shot all-reduce: cannot allocate %zu bytes on GPU %d: %s",
			         2 * a->max_floats * sizeof(float) + flag_bytes, r->device,
			         cudaGetErrorString(cudaGetLastError()));
			rc = -ENOMEM;
		}
		a->peers.slot[i] = r->slot;
		a->peers.flags[i] = r->flags;
	}
	for (int i = 0; i < size && !rc; i++)
		for (int j = 0; j < size && !rc; j++) {
			if (a->r[i].device == a->r[j].device)
				continue;
			cudaSetDevice(a->r[i].device);
			cudaError_t e = cudaDeviceEnablePeerAccess(a->r[j].device, 0);
			if (e == cudaErrorPeerAccessAlreadyEnabled)
				(void)cudaGetLastError();
			else if (e != cudaSuccess) {
				snprintf(why, why_len,
				         "one-shot all-reduce: enabling peer access %d -> %d: %s",
				         a->r[i].device, a->r[j].device, cudaGetErrorString(e));
				(void)cudaGetLastError();
				rc = ERR_UNSUPPORTED;
			}
		}
	/* the memsets above ran on the legacy stream: finish them before any rank's stream uses the slots */
	for (int i = 0; i < size && !rc; i++)
		if (cudaSetDevice(a->r[i].device) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)
			rc = ERR_CUDA;
	if (rc) {
		kcuda_ar_destroy(a);
		return rc;
	}
	*out = a;
	return 0;
}

extern "C" size_t kcuda_ar_max_floats(const struct kcuda_ar *a)
{
	return a ? a->max_floats : 0;
}

/* Enqueue the sum of buf[0..n) over all ranks on rank `rank`'s stream (the caller has selected that
 * rank's device). Every rank must make the same calls in the same order with the same n. */
extern "C" int kcuda_ar_sum(struct kcuda_ar *a, int rank, float *buf, int64_t n)
{
	if (!a || rank < 0 || rank >= a->size || !buf || n < 0 || (size_t)n > a->max_floats)
		return kcuda_bad_arg("all-reduce", "rank %d of %d, n %lld (max %zu)%s", rank, a ? a->size : 0,
		                     (long long)n, a ? a->max_floats : 0,
		                     !a || !buf ? ", or a null pointer" : "");
	if (n == 0 || a->size == 1)
		return 0;
	const struct ar_rank *r = &a->r[rank];
	/* blocks: one per AR_CHUNK floats, at most AR_MAX_BLOCKS; the chunk grows for larger n (the
	 * grid, not the chunk, is what must stay the same from call to call: the epochs are per block) */
	int64_t nb = (n + AR_CHUNK - 1) / AR_CHUNK;
	if (nb > AR_MAX_BLOCKS)
		nb = AR_MAX_BLOCKS;
	const int64_t chunk = (n + nb - 1) / nb;
	/* every call uses AR_MAX_BLOCKS blocks so each block's epoch advances on every call; blocks past
	 * the data only take part in the flag exchange */
	ar_kernel<<<AR_MAX_BLOCKS, AR_THREADS, 0, r->stream>>>(buf, n, chunk, rank, a->size, a->max_floats,
	                                                       a->peers, r->epoch, r->err, a->timeout_ns);
	return kcuda_launch_status("all-reduce");
}

/* timeouts seen by rank `rank`'s kernels so far (synchronous read; 0 = healthy) */
extern "C" unsigned kcuda_ar_errors(struct kcuda_ar *a, int rank)
{
	unsigned v = 0;
	if (!a || rank < 0 || rank >= a->size)
		return 0;
	if (cudaSetDevice(a->r[rank].device) != cudaSuccess ||
	    cudaMemcpy(&v, a->r[rank].err, sizeof(v), cudaMemcpyDeviceToHost) != cudaSuccess)
		return ~0u;
	return v;
}
