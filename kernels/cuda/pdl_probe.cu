/* kcuda_pdl_late_copy (pdl_probe.h): the producer of the PDL ordering tests. It is an ordinary
 * klaunch()ed kernel: KDEP_ENTRY first (so it follows whatever ran before it), then the spin, then
 * the copies, so the next kernel's blocks start (PDL) long before the copies land. The spin reads
 * %globaltimer (nanoseconds), not the SM clock, so its length does not depend on the clock rate. */
#include <errno.h>
#include <stdint.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/pdl_probe.h"

struct probe_args {
	uint32_t *dst[KPROBE_MAX];
	const uint32_t *src[KPROBE_MAX];
	size_t words[KPROBE_MAX];
	int n;
	unsigned long long spin_ns;
};

__device__ __forceinline__ unsigned long long probe_now(void)
{
	unsigned long long t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

__global__ void probe_kernel(probe_args a)
{
	KDEP_ENTRY();
	const unsigned long long t0 = probe_now();
	while (probe_now() - t0 < a.spin_ns)
		;
	for (int i = 0; i < a.n; i++)
		for (size_t j = threadIdx.x; j < a.words[i]; j += blockDim.x)
			a.dst[i][j] = a.src[i][j];
}

extern "C" int kcuda_pdl_late_copy(struct kcuda_ctx *c, int n, void *const *dst, const void *const *src,
                                   const size_t *bytes, double spin_us)
{
	if (!c || n < 0 || n > KPROBE_MAX || (n && (!dst || !src || !bytes)) ||
	    !(spin_us >= 0 && spin_us < 1e6))
		return -EINVAL;
	probe_args a = {};
	for (int i = 0; i < n; i++) {
		if (!dst[i] || !src[i] || bytes[i] % 4 || ((uintptr_t)dst[i] | (uintptr_t)src[i]) % 4)
			return -EINVAL;
		a.dst[i] = (uint32_t *)dst[i];
		a.src[i] = (const uint32_t *)src[i];
		a.words[i] = bytes[i] / 4;
	}
	a.n = n;
	a.spin_ns = (unsigned long long)(spin_us * 1000.0);
	return klaunch("pdl_late_copy", probe_kernel, dim3(1), dim3(256), 0, c->stream, a);
}
