/* Thread-block cluster barriers and remote shared-memory stores (device code only, sm_90+; below
 * sm_90 a cluster is one block, so the barriers are no-ops and a store to rank 0 is a local store).
 * The split-phase use that saves a barrier (fused.cu's add_rmsnorm_cl_kernel, matmul_multi.cu's
 * mm_multi_mqc_kernel): every thread arrives (relaxed) as the kernel starts; long after, it waits
 * (phase 1: every block of the cluster runs, so its shared memory exists), stores into other blocks'
 * shared memory, arrives with release and waits with acquire (phase 2: every store is visible).
 * Each block then reads only its own shared memory, so no third barrier is needed before a block
 * exits. Every thread of every block must take both phases. */
#ifndef TANDEM_KERNELS_CUDA_CLUSTER_BAR_CUH
#define TANDEM_KERNELS_CUDA_CLUSTER_BAR_CUH

#include <stdint.h>

__device__ __forceinline__ void kcl_arrive_relaxed(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void kcl_arrive_release(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void kcl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
/* *p in the shared memory of block `rank` of this cluster = v (T: float or double) */
template <class T> __device__ __forceinline__ void kcl_put(T *p, unsigned rank, T v)
{
	static_assert(sizeof(T) == 4 || sizeof(T) == 8, "float or double");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	const uint32_t la = (uint32_t)__cvta_generic_to_shared(p);
	uint32_t ra;
	asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(la), "r"(rank));
	if constexpr (sizeof(T) == 8)
		asm volatile("st.shared::cluster.f64 [%0], %1;" ::"r"(ra), "d"(v) : "memory");
	else
		asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(ra), "f"(v) : "memory");
#else
	if (rank == 0)
		*p = v;
#endif
}

#endif
