/* RMSNorm over rows: y = w * x / sqrt(mean(x^2) + eps) (MODEL-SPEC.md §2.2). The mean of squares
 * is accumulated in double so the result does not depend on summation order (what the fp32
 * reference computes up to its own last-bit rounding). y may alias x. */
#include <math.h>

#include "kernels/kernels.h"

void kcpu_rmsnorm(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w, int64_t n,
                  int64_t n_rows, float eps)
{
	for (int64_t r = 0; r < n_rows; r++) {
		const float *xr = x + r * ldx;
		float *yr = y + r * ldy;
		double ss = 0;
		for (int64_t i = 0; i < n; i++)
			ss += (double)xr[i] * xr[i];
		float scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
		for (int64_t i = 0; i < n; i++)
			yr[i] = w[i] * (xr[i] * scale);
	}
}
