/* Exact top-k of each row of indexer scores with a per-row length (the causal context of each
 * query): the CUDA twin of kcpu_topk (score descending, ties to the LOWER position, NaN as -inf,
 * result in ascending position order, min(k, n) entries).
 *
 * Grid: one block of 1024 threads per row. Radix select on an order-preserving 32-bit key: four
 * passes of 8-bit histograms (shared-memory atomics) narrow down the key T of the k-th best and
 * the number `need` of entries equal to T that belong to the result; a final pass in position
 * order keeps every key > T and the first `need` keys == T (block-wide prefix sums keep the output
 * sorted by position). Exact for any n and any ties; five reads of the row. The same method as
 * kcuda_topk (kernels/cuda/topk.cu), which takes one length for all rows. */
#include <cub/block/block_scan.cuh>
#include <errno.h>

#include "kernels/cuda/mla_attn_mode.cuh"

#define TKI_THREADS 1024

__device__ __forceinline__ uint32_t tki_key(float v)
{
	const uint32_t u = __float_as_uint(v);
	if (v == 0.0f) /* -0 ties with +0 as in the CPU's float comparison (position decides) */
		return 0x80000000u;
	if (v != v)
		return 0x007fffffu; /* NaN ranks as -inf (key of -inf) */
	return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(TKI_THREADS)
    topk_idx_kernel(const float *__restrict__ s, int64_t ld, const int32_t *__restrict__ n_dev, int64_t n0,
                    int k, int32_t *__restrict__ out, int64_t ldo, int32_t *__restrict__ n_out)
{
	KDEP_ENTRY();
	typedef cub::BlockScan<int, TKI_THREADS> scan_t;
	__shared__ typename scan_t::TempStorage scan_tmp;
	__shared__ unsigned hist[256];
	__shared__ uint32_t sh_prefix;
	__shared__ int sh_need;
	const int64_t row = blockIdx.x;
	const float *p = s + row * ld;
	int32_t *o = out + row * ldo;
	const int tid = threadIdx.x;
	int64_t n64 = n_dev ? (int64_t)n_dev[row] : n0 + row + 1;
	const int n = n64 < 0 ? 0 : (n64 > INT32_MAX ? INT32_MAX : (int)n64);
	const int kk = k < n ? k : n;
	if (n_out && tid == 0)
		n_out[row] = kk;
	if (kk <= 0)
		return;

	uint32_t prefix = 0, mask = 0;
	int need = kk;
	if (kk < n) {
		for (int b = 3; b >= 0; b--) {
			for (int i = tid; i < 256; i += TKI_THREADS)
				hist[i] = 0;
			__syncthreads();
			for (int i = tid; i < n; i += TKI_THREADS) {
				const uint32_t key = tki_key(p[i]);
				if ((key & mask) == prefix)
					atomicAdd(&hist[(key >> (8 * b)) & 255u], 1u);
			}
			__syncthreads();
			if (tid < 32) {
				/* warp 0 scans the 256 bins from the top: lane j holds bins 255-8j .. 248-8j
				 */
				unsigned c8[8], tot = 0;
#pragma unroll
				for (int q = 0; q < 8; q++) {
					c8[q] = hist[255 - 8 * tid - q];
					tot += c8[q];
				}
				unsigned incl = tot;
#pragma unroll
				for (int o2 = 1; o2 < 32; o2 <<= 1) {
					const unsigned v = __shfl_up_sync(0xffffffffu, incl, o2);
					if (tid >= o2)
						incl += v;
				}
				const unsigned excl = incl - tot;
				/* the lane whose range crosses `need` finds the bin */
				if (excl < (unsigned)need && incl >= (unsigned)need) {
					unsigned cum = excl;
					int bin = 0;
#pragma unroll
					for (int q = 0; q < 8; q++) {
						if (cum + c8[q] >= (unsigned)need) {
							bin = 255 - 8 * tid - q;
							break;
						}
						cum += c8[q];
					}
					sh_prefix = prefix | ((uint32_t)bin << (8 * b));
					sh_need = need - (int)cum;
				}
			}
			__syncthreads();
			prefix = sh_prefix;
			need = sh_need;
			mask |= 255u << (8 * b);
		}
	} else {
		prefix = 0; /* keep everything: every key > 0 except the NaN/-inf key, handled by need */
		need = n;
	}
	/* ordered compaction: keys > prefix, then the first `need` keys == prefix */
	int taken = 0, eq_seen = 0;
	for (int base = 0; base < n; base += TKI_THREADS) {
		const int i = base + tid;
		const uint32_t key = i < n ? tki_key(p[i]) : 0;
		const int all = kk == n && i < n;
		const int gt = all || (i < n && key > prefix), eq = !all && i < n && key == prefix;
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

int kcuda_topk_idx_ref(struct kcuda_ctx *c, const float *scores, int64_t ld, int64_t n_rows, const int32_t *n,
                       int64_t n0, int k, int32_t *out, int64_t ldo, int32_t *n_out)
{
	if (!c || !scores || !out || n_rows < 0 || k < 0 || ldo < k || ld < 1)
		return kcuda_bad_arg("topk_idx", "rows %lld k %d ldo %lld ld %lld%s", (long long)n_rows, k,
		                     (long long)ldo, (long long)ld,
		                     !c || !scores || !out ? ", or a null pointer" : "");
	if (n_rows == 0)
		return 0;
	if (n_rows > INT32_MAX)
		return ERR_LIMIT;
	return klaunch("topk_idx", topk_idx_kernel, dim3((unsigned)n_rows), dim3(TKI_THREADS), 0, c->stream,
	               scores, ld, n, n0, k, out, ldo, n_out);
}
