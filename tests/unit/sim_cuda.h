/* Host stand-ins for the CUDA vector types and bit intrinsics that the CPU simulations of kernel
 * source use (gemv_res_sim.cc, k45_i8_sim.cc, mm_multi_sim.cc): the same results as the device,
 * written plainly; the vector types aligned as CUDA aligns them. */
#ifndef TANDEM_TESTS_UNIT_SIM_CUDA_H
#define TANDEM_TESTS_UNIT_SIM_CUDA_H

#include <cmath>
#include <cstdint>
#include <cstring>

struct alignas(8) float2 {
	float x, y;
};
struct alignas(16) float4 {
	float x, y, z, w;
};
struct alignas(16) uint4 {
	uint32_t x, y, z, w;
};
struct alignas(8) uint2 {
	uint32_t x, y;
};
/* the four signed byte products of a and b, summed, plus c */
static inline int __dp4a(int a, int b, int c)
{
	for (int i = 0; i < 4; i++)
		c += (int)(int8_t)((uint32_t)a >> (8 * i)) * (int)(int8_t)((uint32_t)b >> (8 * i));
	return c;
}

/* IEEE half (bits) to float, subnormals and Inf / NaN included */
static inline float sim_h2f(uint16_t h)
{
	const uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
	float f;
	if (e == 0)
		f = std::ldexp((float)m, -24);
	else if (e == 31)
		f = m ? NAN : INFINITY;
	else
		f = std::ldexp((float)(m | 1024), (int)e - 25);
	return s ? -f : f;
}
/* float to IEEE half bits, normal range only, truncating (test scales); smaller magnitudes give a signed 0 */
static inline uint16_t sim_f2h(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	const uint32_t s = (u >> 16) & 0x8000u;
	const int e = (int)((u >> 23) & 255) - 127 + 15;
	if (e <= 0)
		return (uint16_t)s;
	return (uint16_t)(s | (uint32_t)e << 10 | ((u >> 13) & 1023u));
}
static inline float __uint_as_float(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}
static inline float __int_as_float(int i)
{
	return __uint_as_float((uint32_t)i);
}
/* CUDA semantics: result byte n = byte ((s >> 4n) & 7) of the 8 bytes {y (4..7), x (0..3)} */
static inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s)
{
	const uint64_t b = ((uint64_t)y << 32) | x;
	uint32_t r = 0;
	for (int n = 0; n < 4; n++)
		r |= (uint32_t)((b >> (8 * ((s >> (4 * n)) & 7))) & 0xff) << (8 * n);
	return r;
}
static inline uint32_t __funnelshift_r(uint32_t lo, uint32_t hi, uint32_t sh)
{
	return (uint32_t)((((uint64_t)hi << 32) | lo) >> (sh & 31));
}

#endif
