/* Rotary position embedding (MODEL-SPEC.md §2.3). kcpu_rope_freqs builds the per-pair inverse
 * frequencies (with the YaRN blend when factor > 1); kcpu_rope_cs the cos/sin of one position in
 * fp32, as the references compute them; kcpu_rope rotates one vector in place with either pairing:
 * interleaved (2i, 2i+1) or half-split (i, i + R/2). */
#include <math.h>

#include "kernels/kernels.h"

void kcpu_rope_freqs(float *inv_freq, int64_t R, float theta, float yarn_factor, int64_t yarn_orig_ctx,
                     float beta_fast, float beta_slow)
{
	int64_t half = R / 2;
	for (int64_t i = 0; i < half; i++)
		inv_freq[i] = 1.0f / powf(theta, (float)(2 * i) / (float)R);
	if (!(yarn_factor > 1.0f))
		return;
	/* correction range: dims whose wavelength fits beta_fast / beta_slow rotations in orig ctx */
	double lo =
	    floor((double)R * log((double)yarn_orig_ctx / (beta_fast * 2 * M_PI)) / (2 * log((double)theta)));
	double hi =
	    ceil((double)R * log((double)yarn_orig_ctx / (beta_slow * 2 * M_PI)) / (2 * log((double)theta)));
	if (lo < 0)
		lo = 0;
	if (hi > (double)(R - 1))
		hi = (double)(R - 1);
	if (lo == hi)
		hi += 0.001;
	for (int64_t i = 0; i < half; i++) {
		float ramp = (float)(((float)i - (float)lo) / (float)(hi - lo));
		ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
		float extra = inv_freq[i],
		      inter = 1.0f / (yarn_factor * powf(theta, (float)(2 * i) / (float)R));
		inv_freq[i] = inter * ramp + extra * (1.0f - ramp);
	}
}

void kcpu_rope_cs(const float *inv_freq, int64_t half, int64_t pos, float *cs)
{
	for (int64_t i = 0; i < half; i++) {
		float a = (float)pos * inv_freq[i];
		cs[i] = cosf(a);
		cs[half + i] = sinf(a);
	}
}

void kcpu_rope(float *x, int64_t R, const float *cs, int pairing)
{
	int64_t half = R / 2;
	const float *c = cs, *s = cs + half;
	for (int64_t i = 0; i < half; i++) {
		int64_t a = pairing == 0 ? 2 * i : i, b = pairing == 0 ? 2 * i + 1 : i + half;
		float u = x[a], v = x[b];
		x[a] = u * c[i] - v * s[i];
		x[b] = u * s[i] + v * c[i];
	}
}
