/* RMSNorm: y = w * x / sqrt(mean(x^2) + eps) per row (MODEL-SPEC.md §2.2), the CUDA twin of
 * kcpu_rmsnorm. Grid: one block per row; threads stride over the row, the sum of squares is
 * reduced in fp32 (warp shuffles, then shared memory), and the same threads scale and store.
 * y may alias x (each element is read before it is written by the same thread). */
#include <errno.h>

#include "kernels/cuda/cuda_common.cuh"

#define RMS_THREADS 256

__global__ void __launch_bounds__(RMS_THREADS)
    rmsnorm_kernel(float *y, int64_t ldy, const float *x, int64_t ldx, const float *__restrict__ w, int64_t n,
                   float eps)
{
	KDEP_ENTRY();
	__shared__ float red[RMS_THREADS / 32];
	const float *xr = x + blockIdx.x * ldx;
	float *yr = y + blockIdx.x * ldy;
	float ss = 0.0f;
	for (int64_t i = threadIdx.x; i < n; i += RMS_THREADS)
		ss = fmaf(xr[i], xr[i], ss);
	ss = kc_warp_sum(ss);
	if ((threadIdx.x & 31) == 0)
		red[threadIdx.x >> 5] = ss;
	__syncthreads();
	float tot = 0.0f;
#pragma unroll
	for (int k = 0; k < RMS_THREADS / 32; k++)
		tot += red[k];
	const float inv = 1.0f / sqrtf(tot / (float)n + eps);
	for (int64_t i = threadIdx.x; i < n; i += RMS_THREADS)
		yr[i] = w[i] * (xr[i] * inv);
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
