/* RoPE on a batch of tokens (MODEL-SPEC.md §2.3), the CUDA twin of kcpu_rope_cs + kcpu_rope:
 * x[t * ldx + h * head_stride + 0 .. R) of every token t and head h is rotated in place by the
 * angles pos[t] * inv_freq[i] (fp32 product, then precise sincosf), times `mscale` (YaRN's
 * magnitude factor; 1 when unused). inv_freq (R/2 values, YaRN blend included) comes from
 * kcpu_rope_freqs on the host. Pairing 0 = interleaved (x[2i], x[2i+1]), 1 = half-split
 * (x[i], x[i + R/2]). Grid: one thread per (token, head, pair). */
#include <errno.h>

#include "kernels/cuda/cuda_common.cuh"

__global__ void rope_kernel(float *x, int64_t ldx, int64_t n_heads, int64_t head_stride, int half,
                            const float *__restrict__ inv_freq, const int32_t *__restrict__ pos, int pairing,
                            float mscale, int64_t n)
{
	KDEP_ENTRY();
	const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (g >= n)
		return;
	const int i = (int)(g % half);
	const int64_t h = (g / half) % n_heads, t = g / half / n_heads;
	float *v = x + t * ldx + h * head_stride;
	const float a = (float)pos[t] * inv_freq[i];
	float s, co;
	sincosf(a, &s, &co);
	co *= mscale;
	s *= mscale;
	const int i0 = pairing ? i : 2 * i, i1 = pairing ? i + half : 2 * i + 1;
	const float u0 = v[i0], u1 = v[i1];
	v[i0] = u0 * co - u1 * s;
	v[i1] = u0 * s + u1 * co;
}

extern "C" int kcuda_rope(struct kcuda_ctx *c, float *x, int64_t ldx, int64_t n_tok, int64_t n_heads,
                          int64_t head_stride, int64_t R, const float *inv_freq, const int32_t *pos,
                          int pairing, float mscale)
{
	if (!c || !x || !inv_freq || !pos || n_tok < 0 || n_heads <= 0 || R <= 0 || R % 2 ||
	    (n_heads > 1 && head_stride < R) || (pairing != 0 && pairing != 1) ||
	    (n_tok > 1 && ldx < (n_heads - 1) * head_stride + R))
		return kcuda_bad_arg("rope", "n_tok %lld heads %lld stride %lld R %lld ldx %lld pairing %d%s",
		                     (long long)n_tok, (long long)n_heads, (long long)head_stride,
		                     (long long)R, (long long)ldx, pairing,
		                     !c || !x || !inv_freq || !pos ? ", or a null pointer" : "");
	const int64_t n = n_tok * n_heads * (R / 2);
	if (n == 0)
		return 0;
	return klaunch("rope", rope_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), 0, c->stream, x,
	               ldx, n_heads, head_stride, (int)(R / 2), inv_freq, pos, pairing, mscale, n);
}
