/* One warp of CUDA lanes as 32 std::threads, for the CPU simulations of the int8 tensor-core units
 * (k45_i8_sim.cc: kernels/cuda/k45_i8.cuh; xm_sim.cc: matmul_multi.cu's mm_xm_kernel warp): the
 * device keywords and gemv_mma.cuh's macros as plain C++, __syncwarp a barrier over the 32 threads,
 * __shfl_xor_sync an exchange behind it, and mma.sync m16n8k32 (s8 x s8 -> s32) a warp-wide exchange
 * of the fragments in the PTX layout, multiplied out in full. Set sim_bar to a std::barrier of 32 and
 * sim_lane in each thread; include before the cut kernel source. */
#ifndef TANDEM_TESTS_UNIT_SIM_WARP_H
#define TANDEM_TESTS_UNIT_SIM_WARP_H

#include <barrier>
#include <cmath>
#include <cstdint>

#include "tests/unit/sim_cuda.h"

#define __device__
#define __forceinline__ inline
#define GM_HD inline
#define GM_UNROLL
#define GM_FOR_ROWS(R)                                                                                       \
	for (int r = 0; r < R; r++)                                                                          \
		for (int hr = 0; hr < 2; hr++)

template <class V> static inline V gm_ldg(const V *p)
{
	return *p;
}
using std::max;
using std::min;

static inline float gm_f16(uint32_t h)
{
	return sim_h2f((uint16_t)h);
}
static inline float __fdividef(float a, float b)
{
	return a / b;
}
static inline int __float2int_rn(float f)
{
	return (int)std::nearbyint(f); /* the default rounding mode: to nearest, ties to even */
}
/* one warp */
static std::barrier<> *sim_bar;
thread_local int sim_lane;
static uint32_t sim_a[32][4], sim_b[32][2];
static inline void __syncwarp()
{
	sim_bar->arrive_and_wait();
}
template <class V> static inline V __shfl_xor_sync(unsigned, V v, int m)
{
	static V slot[32]; /* one per value type, as a warp's exchange */
	slot[sim_lane] = v;
	sim_bar->arrive_and_wait();
	const V r = slot[sim_lane ^ m];
	sim_bar->arrive_and_wait();
	return r;
}
/* mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32, PTX fragment layout: lane (g, t) holds A
 * (row g, k 4t..4t+3), (g + 8, 4t..), (g, 16 + 4t..), (g + 8, 16 + 4t..); B (k 4t.., column g),
 * (16 + 4t.., g); C (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1) */
static void mi8_mma(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1)
{
	const int l = sim_lane;
	sim_a[l][0] = a0, sim_a[l][1] = a1, sim_a[l][2] = a2, sim_a[l][3] = a3;
	sim_b[l][0] = b0, sim_b[l][1] = b1;
	sim_bar->arrive_and_wait();
	int A[16][32], B[32][8];
	for (int ln = 0; ln < 32; ln++) {
		const int g = ln >> 2, t = ln & 3;
		for (int i = 0; i < 4; i++) {
			A[g][4 * t + i] = (int8_t)(sim_a[ln][0] >> (8 * i));
			A[g + 8][4 * t + i] = (int8_t)(sim_a[ln][1] >> (8 * i));
			A[g][16 + 4 * t + i] = (int8_t)(sim_a[ln][2] >> (8 * i));
			A[g + 8][16 + 4 * t + i] = (int8_t)(sim_a[ln][3] >> (8 * i));
			B[4 * t + i][g] = (int8_t)(sim_b[ln][0] >> (8 * i));
			B[16 + 4 * t + i][g] = (int8_t)(sim_b[ln][1] >> (8 * i));
		}
	}
	sim_bar->arrive_and_wait(); /* every lane has read the fragments before any lane writes again */
	const int g = l >> 2, t = l & 3;
	const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
	for (int i = 0; i < 4; i++) {
		int64_t s = 0;
		for (int k = 0; k < 32; k++)
			s += (int64_t)A[rows[i]][k] * B[k][cols[i]];
		d[i] += (int)s;
	}
}
#define MI8_MMA_DEFINED

#endif
