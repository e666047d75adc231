/* Exact top-k of rows of given scores in ONE launch of many blocks, behind kcuda_topk_idx for
 * decode-sized batches (<= KSEL_MAX_ROWS rows of <= KSEL_MAX_KEYS scores; otherwise, and by
 * default, the radix / one-block kernels of topk_idx_radix.cu). Same result as
 * kcpu_topk: score descending, ties to the LOWER position, +0 == -0, NaN as -inf, min(k, n)
 * positions in ascending order. Only with TANDEM_IDX_TOPK=fused (measured slower than the other
 * kernels on the H200 at 19:30: off by default).
 *
 * Grid (slices of KSEL_SLICE positions, rows), KSEL_THREADS threads. Every block counts the top
 * 12 bits of its slice's keys into the row's histogram in ctx->zs and takes a ticket; the row's
 * last block finishes the selection (topk_sel.cuh, the same device code the fused indexer kernel
 * runs after its scores). Rows with n <= k are written as 0..n-1 by block 0 without reading. */
#include <errno.h>

#include "kernels/cuda/mla_attn_mode.cuh"
#include "kernels/cuda/topk_sel.cuh"

#define KSEL_THREADS 128
#define KSEL_PER 16 /* positions per thread in the counting phase */
#define KSEL_SLICE (KSEL_THREADS * KSEL_PER)

__global__ void __launch_bounds__(KSEL_THREADS)
    topk_sel_kernel(const float *__restrict__ s, int64_t ld, const int32_t *__restrict__ n_dev, int64_t n0,
                    int k, int32_t *__restrict__ out, int64_t ldo, int32_t *__restrict__ n_out, unsigned *zs,
                    unsigned *err, int smem)
{
	KDEP_ENTRY();
	extern __shared__ __align__(16) uint8_t ksel_sm[];
	__shared__ unsigned last_s;
	const int64_t row = blockIdx.y;
	const int tid = threadIdx.x;
	int64_t n64 = n_dev ? (int64_t)n_dev[row] : n0 + row + 1;
	if (n64 > ld) { /* longer than the row: counted, clamped (as the other top-k kernels) */
		if (tid == 0 && blockIdx.x == 0)
			atomicAdd(err, 1u);
		n64 = ld;
	}
	const int n = n64 < 0 ? 0 : (int)n64;
	int32_t *o = out + row * ldo;
	if (n <= k) { /* every position (or none), in order */
		if (blockIdx.x == 0) {
			for (int i = tid; i < n; i += KSEL_THREADS)
				o[i] = i;
			if (tid == 0 && n_out)
				n_out[row] = n;
		}
		return;
	}
	if (k <= 0) {
		if (blockIdx.x == 0 && tid == 0 && n_out)
			n_out[row] = 0;
		return;
	}
	const int i0 = blockIdx.x * KSEL_SLICE;
	if (i0 >= n)
		return; /* no ticket: the row counts ceil(n / KSEL_SLICE) blocks */
	const int i1 = min(n, i0 + KSEL_SLICE);
	const float *p = s + row * ld;
	unsigned *gh = zs + row * KSEL_ROW_WORDS;
	float v[KSEL_PER];
#pragma unroll
	for (int j = 0; j < KSEL_PER; j++) { /* every load in flight before the first count */
		const int i = i0 + j * KSEL_THREADS + tid;
		v[j] = i < i1 ? p[i] : 0.0f;
	}
#pragma unroll
	for (int j = 0; j < KSEL_PER; j++) {
		const int i = i0 + j * KSEL_THREADS + tid;
		ksel_count(gh, i < i1, ksel_key(v[j]));
	}
	__threadfence(); /* this thread's counts, before the ticket */
	__syncthreads();
	if (tid == 0) {
		const unsigned nblk = (unsigned)((n + KSEL_SLICE - 1) / KSEL_SLICE);
		last_s = atomicAdd(&gh[KSEL_BINS0], 1u) == nblk - 1;
	}
	__syncthreads();
	if (!last_s)
		return;
	__threadfence(); /* the other blocks' counts, after their tickets */
	ksel_tail<KSEL_THREADS>(p, n, k, gh, o, ksel_sm, (size_t)smem);
	if (tid == 0 && n_out)
		n_out[row] = k;
}

/* TANDEM_IDX_TOPK=fused selects this kernel (off by default, as the fused indexer top-k) */
static int ksel_enabled(void)
{
	const char *e = getenv("TANDEM_IDX_TOPK");
	return e && strcmp(e, "fused") == 0;
}

int kcuda_topk_sel(struct kcuda_ctx *c, const float *scores, int64_t ld, int64_t n_rows, const int32_t *n,
                   int64_t n0, int k, int32_t *out, int64_t ldo, int32_t *n_out)
{
	if (!c || !scores || !out || n_rows < 0 || k < 0 || ldo < k || ld < 1)
		return kcuda_bad_arg("topk_sel", "rows %lld k %d ldo %lld ld %lld%s", (long long)n_rows, k,
		                     (long long)ldo, (long long)ld,
		                     !c || !scores || !out ? ", or a null pointer" : "");
	if (!ksel_enabled() || kattn_use_ref() || !c->zs || n_rows > KSEL_MAX_ROWS || ld > KSEL_MAX_KEYS ||
	    (size_t)n_rows * KSEL_ROW_WORDS * sizeof(unsigned) > KCUDA_ZS_BYTES || ld % 4 ||
	    (uintptr_t)scores % 16)
		return ERR_UNSUPPORTED;
	if (n_rows == 0)
		return 0;
	const size_t smem = ksel_smem_base(ld) + (size_t)KSEL_CAND_MIN * 2 * sizeof(uint2);
	if (smem + 4096 >
	    (size_t)kcuda_smem_optin(c->device)) /* room for the static part (scan storage, ~1.4 KB) */
		return ERR_UNSUPPORTED;
	KCUDA_CHECK(
	    cudaFuncSetAttribute(topk_sel_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
	const dim3 grid((unsigned)((ld + KSEL_SLICE - 1) / KSEL_SLICE), (unsigned)n_rows);
	return klaunch("topk_sel", topk_sel_kernel, grid, dim3(KSEL_THREADS), smem, c->stream, scores, ld, n,
	               n0, k, out, ldo, n_out, c->zs, c->err_dev, (int)smem);
}
