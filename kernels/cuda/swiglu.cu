/* SwiGLU activation: y = SiLU(gate) * up, SiLU(g) = g / (1 + exp(-g)) (MODEL-SPEC.md §2.7), the CUDA
 * twin of kcpu_swiglu, over n_rows rows with their own strides. Grid: x over elements of a row,
 * y over rows. y may alias gate or up. */
#include <errno.h>

#include "kernels/cuda/cuda_common.cuh"

__global__ void swiglu_kernel(float *y, int64_t ldy, const float *gate, int64_t ldg, const float *up,
                              int64_t ldu, int64_t n)
{
	KDEP_ENTRY();
	const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= n)
		return;
	const int64_t r = blockIdx.y;
	const float g = gate[r * ldg + i];
	y[r * ldy + i] = g / (1.0f + expf(-g)) * up[r * ldu + i];
}

extern "C" int kcuda_swiglu(struct kcuda_ctx *c, float *y, int64_t ldy, const float *gate, int64_t ldg,
                            const float *up, int64_t ldu, int64_t n, int64_t n_rows)
{
	if (!c || !y || !gate || !up || n <= 0 || n_rows < 0 || ldy < n || ldg < n || ldu < n ||
	    n_rows > 65535)
		return kcuda_bad_arg("swiglu", "n %lld rows %lld (max 65535) ldy %lld ldg %lld ldu %lld%s",
		                     (long long)n, (long long)n_rows, (long long)ldy, (long long)ldg,
		                     (long long)ldu, !c || !y || !gate || !up ? ", or a null pointer" : "");
	if (n_rows == 0)
		return 0;
	dim3 grid((unsigned)((n + 255) / 256), (unsigned)n_rows);
	return klaunch("swiglu", swiglu_kernel, dim3(grid), dim3(256), 0, c->stream, y, ldy, gate, ldg, up,
	               ldu, n);
}
