/* kcuda_l2_prefetch: brings a weight's bytes into L2 ahead of the product that reads them, from a
 * kernel on another branch of the step (issue #4, session 12; WRITTEN, NOT YET MEASURED, off by
 * default: TANDEM_L2_PF, backend_cuda.c).
 *
 * Why: at batch 1 about half of a GLM-5 layer's ~81 us is kernels that read almost nothing (norms,
 * indexer, top-k, the attention's few MB of KV, the route), during which HBM idles; the products
 * after them (o: 13.4 MB of Q8_0 a rank) then stream at 2-3 TB/s from HBM. Started on the query
 * side branch, the prefetch overlaps that idle time, and o's copies hit L2 (~50 MB on an H200;
 * between the prefetch and o the step touches a few MB).
 *
 * How: grid of one 32-thread block per slice; lane 0 of each block issues the bulk prefetches of its
 * slice (kdep_prefetch_l2: cp.async.bulk.prefetch.L2 on sm_90+, 64 KB pieces; 128-byte line
 * prefetches before). A bulk prefetch is carried out by the issuing SM's copy engine at a few
 * hundred GB/s (PERFORMANCE.md, branch moe4, 2026-11-29: one block prefetching 21 MB ran at ~250 GB/s), so
 * the bytes are spread over up to one block per SM. Weights are never written while kernels run, so the
 * prefetch needs no ordering with the kernel before it; KDEP_ENTRY comes after the prefetches only
 * to keep klaunch's contract. A hint: no value changes whether it runs, or how far it gets. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/kernels.h"

__global__ void __launch_bounds__(32) l2_prefetch_kernel(const uint8_t *p, size_t bytes, size_t slice)
{
	const size_t s0 = (size_t)blockIdx.x * slice;
	if (threadIdx.x == 0 && s0 < bytes)
		kdep_prefetch_l2(p + s0, bytes - s0 < slice ? bytes - s0 : slice);
	KDEP_ENTRY();
}

extern "C" int kcuda_l2_prefetch(struct kcuda_ctx *c, const void *p, size_t bytes)
{
	if (!c || !p)
		return kcuda_bad_arg("l2_prefetch", "null context or pointer");
	if (bytes == 0)
		return 0;
	const size_t n_blk_max = c->n_sm > 0 ? (size_t)c->n_sm : 1;
	/* slices of at least 64 KB (one bulk piece), at most one block per SM */
	size_t slice = (bytes + n_blk_max - 1) / n_blk_max;
	if (slice < 65536)
		slice = 65536;
	slice = (slice + 127) & ~(size_t)127;
	const size_t n_blk = (bytes + slice - 1) / slice;
	return klaunch("l2_prefetch", l2_prefetch_kernel, dim3((unsigned)n_blk), dim3(32), 0, c->stream,
	               (const uint8_t *)p, bytes, slice);
}
