/* fp16 and bf16 <-> fp32 conversions, done with integer bit manipulation so that they are exact
 * on every CPU and identical to the hardware (F16C) conversions in round-to-nearest-even mode.
 * The SIMD row kernels use F16C directly; these scalar versions are the reference and are used
 * for block scales in the scalar paths. */
#include <string.h>

#include "kernels/kernels.h"

static inline uint32_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	return u;
}

static inline float bits_f32(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

float kfp16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1fu;
	uint32_t mant = h & 0x3ffu;

	if (exp == 0) {
		/* zero or subnormal: mant * 2^-24 is exact in fp32 */
		float v = (float)mant * 0x1p-24f;
		return bits_f32(f32_bits(v) | sign);
	}
	if (exp == 31) /* inf / NaN keep their payload */
		return bits_f32(sign | 0x7f800000u | (mant << 13));
	return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t kf32_to_fp16(float f)
{
	uint32_t x = f32_bits(f);
	uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);

	x &= 0x7fffffffu;
	if (x > 0x7f800000u) /* NaN: keep it quiet and keep the top payload bits */
		return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
	if (x >= 0x477ff000u) /* >= 65520 rounds to infinity (also inf itself) */
		return (uint16_t)(sign | 0x7c00u);
	if (x < 0x38800000u) {
		/* below the smallest normal half (2^-14): adding 0.5 puts the value in a binade whose
		 * ulp is 2^-24, so the FPU does the round-to-nearest-even to a subnormal half for us */
		float a = bits_f32(x) + 0.5f;
		return (uint16_t)(sign | (f32_bits(a) - 0x3f000000u));
	}
	/* normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even */
	uint32_t odd = (x >> 13) & 1u;
	x += 0xc8000fffu + odd;
	return (uint16_t)(sign | (x >> 13));
}

float kbf16_to_f32(uint16_t h)
{
	return bits_f32((uint32_t)h << 16);
}

uint16_t kf32_to_bf16(float f)
{
	uint32_t x = f32_bits(f);

	if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: force quiet so rounding cannot make it inf */
		return (uint16_t)((x >> 16) | 0x40u);
	x += 0x7fffu + ((x >> 16) & 1u);
	return (uint16_t)(x >> 16);
}
