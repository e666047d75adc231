/* Top-k selection per row, the CUDA twin of kcpu_topk: the indices of the k best scores (score
 * descending, ties to the lower index), returned in ascending index order. NaN ranks as -inf (as in
 * kcpu_topk: a NaN and a -inf tie, and the lower index wins).
 * Used by the sampler over the vocabulary and (later) by the DSA indexer over past tokens.
 *
 * Grid: one block of TOPK_THREADS per row. Radix select on an order-preserving 32-bit key: four
 * passes of 8-bit histograms over the row find the k-th key T and how many elements equal to T are
 * still needed; a fifth, ordered pass keeps every key > T and the first `need` keys == T by index,
 * placing them with two block-wide prefix sums so the output comes out sorted by index. Five reads
 * of the row, no sort of the whole row. */
#include <cub/block/block_scan.cuh>
#include <errno.h>

#include "kernels/cuda/cuda_common.cuh"

#define TOPK_THREADS 1024

__device__ __forceinline__ uint32_t topk_key(float v)
{
	const uint32_t u = __float_as_uint(v);
	if (v == 0.0f) /* -0 ties with +0 as in the CPU's float comparison */
		return 0x80000000u;
	if (v != v)
		return 0x007fffffu; /* NaN ranks as -inf */
	return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(TOPK_THREADS)
    topk_kernel(const float *__restrict__ s, int64_t ld, int n, int k, int32_t *__restrict__ out, int64_t ldo)
{
	KDEP_ENTRY();
	typedef cub::BlockScan<int, TOPK_THREADS> scan_t;
	__shared__ typename scan_t::TempStorage scan_tmp;
	__shared__ unsigned hist[256];
	__shared__ uint32_t sh_prefix;
	__shared__ int sh_need;
	const float *p = s + blockIdx.x * ld;
	int32_t *o = out + blockIdx.x * ldo;
	const int tid = threadIdx.x;

	uint32_t prefix = 0, mask = 0;
	int need = k;
	for (int b = 3; b >= 0; b--) {
		for (int i = tid; i < 256; i += TOPK_THREADS)
			hist[i] = 0;
		__syncthreads();
		for (int i = tid; i < n; i += TOPK_THREADS) {
			const uint32_t key = topk_key(p[i]);
			if ((key & mask) == prefix)
				atomicAdd(&hist[(key >> (8 * b)) & 255u], 1u);
		}
		__syncthreads();
		if (tid == 0) {
			int cum = 0, bin = 255;
			for (; bin > 0; bin--) {
				if (cum + (int)hist[bin] >= need)
					break;
				cum += (int)hist[bin];
			}
			sh_prefix = prefix | ((uint32_t)bin << (8 * b));
			sh_need = need - cum;
		}
		__syncthreads();
		prefix = sh_prefix;
		need = sh_need;
		mask |= 255u << (8 * b);
	}
	/* ordered compaction: keys > prefix, then the first `need` keys == prefix */
	int taken = 0, eq_seen = 0;
	for (int base = 0; base < n; base += TOPK_THREADS) {
		const int i = base + tid;
		const uint32_t key = i < n ? topk_key(p[i]) : 0;
		const int gt = i < n && key > prefix, eq = i < n && key == prefix;
		int eq_rank, eq_total;
		scan_t(scan_tmp).ExclusiveSum(eq, eq_rank, eq_total);
		__syncthreads();
		const int take = gt || (eq && eq_seen + eq_rank < need);
		int pos, take_total;
		scan_t(scan_tmp).ExclusiveSum(take, pos, take_total);
		__syncthreads();
		if (take)
			o[taken + pos] = i;
		taken += take_total;
		eq_seen += eq_total;
	}
}

extern "C" int kcuda_topk(struct kcuda_ctx *c, const float *scores, int64_t ld, int64_t n, int64_t n_rows,
                          int k, int32_t *out, int64_t ldo)
{
	if (!c || !scores || !out || n <= 0 || n > INT32_MAX || n_rows < 0 || n_rows > INT32_MAX || k <= 0 ||
	    ld < n || ldo < (k < n ? k : n))
		return kcuda_bad_arg("topk", "n %lld rows %lld k %d ld %lld ldo %lld%s", (long long)n,
		                     (long long)n_rows, k, (long long)ld, (long long)ldo,
		                     !c || !scores || !out ? ", or a null pointer" : "");
	if (n_rows == 0)
		return 0;
	const int kk = k < n ? k : (int)n;
	return klaunch("topk", topk_kernel, dim3((unsigned)n_rows), dim3(TOPK_THREADS), 0, c->stream, scores,
	               ld, (int)n, kk, out, ldo);
}
