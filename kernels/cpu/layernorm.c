/* LayerNorm over rows (mean-centred, weight and bias): the DSA indexer's k_norm (MODEL-SPEC.md
 * §2.2, eps 1e-6). Statistics in double; y may alias x. */
#include <math.h>

#include "kernels/kernels.h"

void kcpu_layernorm(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w, const float *b,
                    int64_t n, int64_t n_rows, float eps)
{
	for (int64_t r = 0; r < n_rows; r++) {
		const float *xr = x + r * ldx;
		float *yr = y + r * ldy;
		double s = 0;
		for (int64_t i = 0; i < n; i++)
			s += xr[i];
		double mean = s / (double)n, v = 0;
		for (int64_t i = 0; i < n; i++)
			v += ((double)xr[i] - mean) * ((double)xr[i] - mean);
		double inv = 1.0 / sqrt(v / (double)n + (double)eps);
		for (int64_t i = 0; i < n; i++)
			yr[i] = (float)(((double)xr[i] - mean) * inv) * w[i] +
			        (b ? b[i] : 0.0f); /* b NULL: no bias, as the CUDA op */
	}
}
