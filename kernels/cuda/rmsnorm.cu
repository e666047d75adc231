/* RMSNorm: y = w * x / sqrt(mean(x^2) + eps) per row (MODEL-SPEC.md §2.2), the CUDA twin of
 * kcpu_rmsnorm. Grid: one block per row; threads stride over the row, the sum of squares is
 * reduced in fp32 (warp shuffles, then shared memory), and the same threads scale and store.
 * y may alias x (each element is read before it is written by the same thread). */
#include <errno.h>

#include "kernels/cuda/cuda_common.cuh"

#define RMS_THREADS 256
#define RMS_B 8 /* elements a thread in flight at once */

__global__ void __launch_bounds__(RMS_THREADS)
    rmsnorm_kernel(float *y, int64_t ldy, const float *x, int64_t ldx, const float *__restrict__ w, int64_t n,
                   float eps)
{
	KDEP_ENTRY();
	__shared__ float red[RMS_THREADS / 32];
	const float *xr = x + blockIdx.x * ldx;
	float *yr = y + blockIdx.x * ldy;
	/* RMS_B elements a thread loaded before the first is used: one L2 round trip per RMS_B of them,
	 * not one per element (the loop that loaded, used and loaded the next cost ~13 us on a 6144-float
	 * row: H200, session 24's nsys). The element order a thread sums in is that loop's, so the same
	 * bits. In place (y == x) stays right: every element is read and written by one thread only, and
	 * a batch is read before any of it is written. */
	float ss = 0.0f;
	for (int64_t i0 = threadIdx.x; i0 < n; i0 += (int64_t)RMS_THREADS * RMS_B) {
		float v[RMS_B];
#pragma unroll
		for (int k = 0; k < RMS_B; k++) {
			const int64_t i = i0 + (int64_t)k * RMS_THREADS;
			v[k] = i < n ? xr[i] : 0.0f;
		}
#pragma unroll
		for (int k = 0; k < RMS_B; k++)
			if (i0 + (int64_t)k * RMS_THREADS < n)
				ss = fmaf(v[k], v[k], ss);
	}
	ss = kc_warp_sum(ss);
	if ((threadIdx.x & 31) == 0)
		red[threadIdx.x >> 5] = ss;
	__syncthreads();
	float tot = 0.0f;
#pragma unroll
	for (int k = 0; k < RMS_THREADS / 32; k++)
		tot += red[k];
	const float inv = 1.0f / sqrtf(tot / (float)n + eps);
	for (int64_t i0 = threadIdx.x; i0 < n; i0 += (int64_t)RMS_THREADS * RMS_B) {
		float v[RMS_B], wv[RMS_B];
#pragma unroll
		for (int k = 0; k < RMS_B; k++) {
			const int64_t i = i0 + (int64_t)k * RMS_THREADS;
			v[k] = i < n ? xr[i] : 0.0f;
			wv[k] = i < n ? w[i] : 0.0f;
		}
#pragma unroll
		for (int k = 0; k < RMS_B; k++) {
			const int64_t i = i0 + (int64_t)k * RMS_THREADS;
			if (i < n)
				yr[i] = wv[k] * (v[k] * inv);
		}
	}
}

extern "C" int kcuda_rmsnorm(struct kcuda_ctx *c, float *y, int64_t ldy, const float *x, int64_t ldx,
                             const float *w, int64_t n, int64_t n_rows, float eps)
{
	if (!c || !y || !x || !w || n <= 0 || n_rows < 0 || ldx < n || ldy < n || n_rows > INT32_MAX)
		return kcuda_bad_arg("rmsnorm", "n %lld rows %lld ldx %lld ldy %lld%s", (long long)n,
		                     (long long)n_rows, (long long)ldx, (long long)ldy,
		                     !c || !y || !x || !w ? ", or a null pointer" : "");
	if (n_rows == 0)
		return 0;
	return klaunch("rmsnorm", rmsnorm_kernel, dim3((unsigned)n_rows), dim3(RMS_THREADS), 0, c->stream, y,
	               ldy, x, ldx, w, n, eps);
}
