/* A barrier across G blocks of one launch (device code only), for kernels whose phases need every
 * block's partial results: moe_persist.cu (the whole grid) and topk_idx_radix.cu (the blocks of one
 * row). All G blocks must be resident together: the caller sizes its grid by the occupancy.
 * bar[0] counts arrivals; once a block is through it counts a departure in bar[1], and the last to
 * depart sets both back to 0 (every block has passed its spin by then), so the two words are zero
 * between launches and one pair serves one barrier of a launch. The spin has a deadline
 * (KGB_DEADLINE_NS): past it the block counts an error in err and goes on (its result is then
 * wrong, and the error says so; the words still return to 0 once every block has departed). */
#ifndef TANDEM_KERNELS_CUDA_GRID_BARRIER_CUH
#define TANDEM_KERNELS_CUDA_GRID_BARRIER_CUH

#define KGB_DEADLINE_NS 1000000000ull /* 1 s */

__device__ __forceinline__ unsigned kgb_ld_acquire(const unsigned *p)
{
	unsigned v;
	asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
	return v;
}

__device__ __forceinline__ unsigned long long kgb_now(void)
{
	unsigned long long t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

/* The arrival half alone, for a kernel with several barriers: every one of G blocks has arrived at
 * bar (false past the deadline). bar only counts up; the caller zeroes it once every block is past
 * its last wait (kgrid_done), which takes the departure count off each barrier's critical path. */
__device__ __forceinline__ bool kgrid_arrive_wait(unsigned *bar, unsigned G, unsigned *err)
{
	__shared__ int s_ok;
	__syncthreads();
	if (threadIdx.x == 0) {
		int ok = 1;
		__threadfence(); /* this block's partials before its arrival */
		atomicAdd(bar, 1u);
		const unsigned long long t0 = kgb_now();
		for (unsigned it = 0; kgb_ld_acquire(bar) < G; it++)
			if ((it & 255u) == 255u && kgb_now() - t0 > KGB_DEADLINE_NS) {
				atomicAdd(err, 1u);
				ok = 0;
				break;
			}
		__threadfence(); /* the other blocks' partials after their arrivals */
		s_ok = ok;
	}
	__syncthreads();
	return s_ok != 0;
}

/* Every one of G blocks has arrived at bar (kgrid_arrive_wait), then the departure: false when
 * the deadline passed first. Block-wide: every thread of the block calls it. */
__device__ __forceinline__ bool kgrid_barrier(unsigned *bar, unsigned G, unsigned *err)
{
	const bool ok = kgrid_arrive_wait(bar, G, err);
	if (threadIdx.x == 0 && atomicAdd(bar + 1, 1u) == G - 1) {
		atomicExch(bar, 0u);
		atomicExch(bar + 1, 0u);
	}
	return ok;
}

/* After a block's last kgrid_arrive_wait: counts it in *done; the last of the G blocks sets the
 * nbar arrival words and *done back to 0 (every block is past every wait by then). Block-wide. */
__device__ __forceinline__ void kgrid_done(unsigned *bars, int nbar, unsigned *done, unsigned G)
{
	if (threadIdx.x == 0 && atomicAdd(done, 1u) == G - 1) {
		for (int i = 0; i < nbar; i++)
			atomicExch(bars + i, 0u);
		atomicExch(done, 0u);
	}
}

#endif
