/* Host stand-ins for what kernels/cuda/quant_piece.cuh (and quant_piece_iq.cuh) take from CUDA and
 * cuda_common.cuh, so tests can compile the piece decoders and the unit bodies built on them for the
 * host: read-only loads as plain loads, the word loaders with their alignment checked (a misaligned
 * one aborts where the GPU would fault). Include after tests/unit/sim_cuda.h and kernels/kernels.h. */
#ifndef TANDEM_TESTS_UNIT_SIM_PIECE_H
#define TANDEM_TESTS_UNIT_SIM_PIECE_H

#include <stdlib.h>
#include <string.h>

#define TANDEM_KERNELS_CUDA_COMMON_CUH 1 /* cuda_common.cuh is not included */
#define __device__
#define __forceinline__ inline

struct __half2 {
	uint16_t x, y;
};

static inline uint32_t __float_as_uint(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}
static inline int __popc(uint32_t v)
{
	return __builtin_popcount(v);
}
template <typename T> static inline T __ldg(const T *p)
{
	T v;
	memcpy(&v, p, sizeof v);
	return v;
}
static inline float2 __half22float2(__half2 h)
{
	return float2{kfp16_to_f32(h.x), kfp16_to_f32(h.y)};
}
static inline float kc_h2f(uint16_t h)
{
	return kfp16_to_f32(h);
}
static inline float kc_bf2f(uint16_t h)
{
	return __uint_as_float((uint32_t)h << 16);
}
static inline uint16_t kc_ld16(const uint8_t *p)
{
	uint16_t v;
	memcpy(&v, p, 2);
	return v;
}
template <int N> static inline void kc_ldw_a2(const uint8_t *p, uint32_t *w)
{
	if ((uintptr_t)p & 1)
		abort(); /* the CUDA version would fault */
	memcpy(w, p, 4 * N);
}
template <int N> static inline void kc_ldw_a4(const uint8_t *p, uint32_t *w)
{
	if ((uintptr_t)p & 3)
		abort();
	memcpy(w, p, 4 * N);
}
template <int N> static inline void kc_ldw_a16(const uint8_t *p, uint32_t *w)
{
	if ((uintptr_t)p & 15)
		abort();
	memcpy(w, p, 4 * N);
}
static inline uint32_t kc_byte(uint32_t w, int i)
{
	return (w >> (8 * i)) & 0xffu;
}

#endif
