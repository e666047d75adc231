/* Random Q8_0 blocks for the CPU simulations of the int8 tensor-core products (xm_sim.cc, mq_sim.cc). */
#ifndef TANDEM_TESTS_UNIT_SIM_Q8_H
#define TANDEM_TESTS_UNIT_SIM_Q8_H

#include <cstdint>
#include <cstring>
#include <random>

#include "tests/unit/sim_cuda.h"

/* One 34-byte Q8_0 block at blk: an fp16 scale of magnitude [2^-9, 2^-6) and either sign, 32 quants over
 * the full int8 range (-128 included); w[0..31] gets its dequantized values. */
static inline void sim_q8_block(uint8_t *blk, double *w, std::mt19937_64 &rng)
{
	const int e = (int)(rng() % 3) - 9 + 15;
	const uint16_t d = (uint16_t)(((rng() & 1) << 15) | (e << 10) | (rng() & 1023));
	memcpy(blk, &d, 2);
	for (int i = 0; i < 32; i++) {
		const int8_t q = (int8_t)(rng() % 256);
		blk[2 + i] = (uint8_t)q;
		w[i] = (double)sim_h2f(d) * q;
	}
}

#endif
