/* Helpers shared by the CUDA-vs-CPU op tests (tests/ops/test_ops_*.c) and bench/bench_cuda_*:
 * a seeded RNG (seed printed so a failure can be replayed with TANDEM_SEED=...), random weight rows
 * in any block type (random quant bytes with sane fp16 scales patched in, so every bit pattern of
 * the packed fields is exercised), and device buffers with guard regions that must come back
 * untouched. Header-only because each test is one translation unit (Makefile). */
#ifndef TANDEM_TESTS_OPS_UTIL_H
#define TANDEM_TESTS_OPS_UTIL_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kernels.h"

/* Device 0 has the shared memory of an sm_120 GPU (99 KB a block), or less: true on an RTX PRO 6000 and
 * on an H200 under TANDEM_CUDA_SMEM_CAP=101376. Paths that need Hopper's 227 KB (fp32 KV tiles, the
 * one-launch MoE, the short top-k past ~24k keys) then decline, and the tests that force them report
 * that instead of failing; the results of what ran are checked all the same. */
static inline int ops_smem_small(void)
{
#ifdef TANDEM_CUDA
	const int m = kcuda_smem_optin(0);
	return m > 0 && m < 200 * 1024;
#else
	return 0;
#endif
}

static int ops_n_fail __attribute__((unused));
static int ops_n_check __attribute__((unused));

#define OPS_CHECK(cond, ...)                                                                                 \
	do {                                                                                                 \
		ops_n_check++;                                                                               \
		if (!(cond)) {                                                                               \
			ops_n_fail++;                                                                        \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);                                          \
			printf(__VA_ARGS__);                                                                 \
			printf("\n");                                                                        \
		}                                                                                            \
	} while (0)

static uint64_t ops_rng_state;

static inline uint64_t ops_rng_next(void)
{
	uint64_t z = (ops_rng_state += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}
static inline float ops_rng_unif(void) /* [-1, 1) */
{
	return (float)((double)(ops_rng_next() >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}
static inline uint64_t ops_seed_init(void)
{
	const char *s = getenv("TANDEM_SEED");
	uint64_t seed = s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
	ops_rng_state = seed;
	printf("seed %" PRIu64 " (replay with TANDEM_SEED=%" PRIu64 ")\n", seed, seed);
	return seed;
}

static inline void ops_put16(uint8_t *p, uint16_t v)
{
	memcpy(p, &v, 2);
}
/* a positive or negative fp16 scale of magnitude in [2^-9, 2^-6) */
static inline uint16_t ops_rand_scale(int allow_neg)
{
	float m = ldexpf(1.0f + 0.999f * fabsf(ops_rng_unif()), -9 + (int)(ops_rng_next() % 3));
	if (allow_neg && (ops_rng_next() & 1))
		m = -m;
	return kf32_to_fp16(m);
}

/* Fills n_rows rows of `type` (n_in elements each, row_bytes apart) with random content. */
static inline void ops_fill_weight(int type, int64_t n_in, int64_t n_rows, size_t row_bytes, uint8_t *w)
{
	const struct ktype_info *ti = ktype_get(type);
	for (int64_t r = 0; r < n_rows; r++) {
		uint8_t *row = w + (size_t)r * row_bytes;
		if (type == KT_F32 || type == KT_F16 || type == KT_BF16) {
			for (int64_t k = 0; k < n_in; k++) {
				float v = ops_rng_unif();
				if (type == KT_F32)
					memcpy(row + 4 * k, &v, 4);
				else
					ops_put16(row + 2 * k,
					          type == KT_F16 ? kf32_to_fp16(v) : kf32_to_bf16(v));
			}
			continue;
		}
		for (size_t i = 0; i < row_bytes; i += 8) {
			uint64_t z = ops_rng_next();
			memcpy(row + i, &z, row_bytes - i < 8 ? row_bytes - i : 8);
		}
		const int64_t nb = n_in / ti->blck;
		for (int64_t b = 0; b < nb; b++) {
			uint8_t *p = row + (size_t)b * (size_t)ti->bytes;
			switch (type) {
			case KT_Q8_0:
			case KT_Q4_0:
			case KT_Q5_0:
			case KT_IQ4_NL:
			case KT_IQ4_XS: ops_put16(p, ops_rand_scale(1)); break;
			case KT_Q4_1:
			case KT_Q5_1:
				ops_put16(p, ops_rand_scale(0));
				ops_put16(p + 2, ops_rand_scale(1));
				break;
			case KT_Q2_K:
				ops_put16(p + 80, ops_rand_scale(0));
				ops_put16(p + 82, ops_rand_scale(0));
				break;
			case KT_Q3_K: ops_put16(p + 108, ops_rand_scale(1)); break;
			case KT_Q4_K:
			case KT_Q5_K:
				ops_put16(p, ops_rand_scale(0));
				ops_put16(p + 2, ops_rand_scale(0));
				break;
			case KT_Q6_K: ops_put16(p + 208, ops_rand_scale(1)); break;
			case KT_IQ2_XXS:
			case KT_IQ2_XS:
			case KT_IQ2_S:
			case KT_IQ3_XXS:
			case KT_IQ3_S:
			case KT_IQ1_S: ops_put16(p, ops_rand_scale(1)); break;
			case KT_IQ1_M: { /* the fp16 scale is the top nibbles of the four scale words */
				const uint16_t d = ops_rand_scale(1);
				for (int k = 0; k < 4; k++)
					p[49 + 2 * k] =
					    (uint8_t)((p[49 + 2 * k] & 15) | (((d >> (4 * k)) & 15) << 4));
				break;
			}
			default: break;
			}
		}
	}
}

/* ---- guarded device buffers -------------------------------------------------------------------
 * The op writes into [user, user + bytes); OPS_GUARD bytes on each side (and any gaps the caller
 * leaves inside, e.g. ldy > n_out) are filled with 0xA5 and must still hold it afterwards. */
#define OPS_GUARD 256
#define OPS_FILL 0xA5

#ifdef TANDEM_CUDA
struct ops_dbuf {
	uint8_t *base; /* device allocation: guard | user | guard */
	void *user;
	size_t bytes;
};

static inline int ops_dbuf_init(struct kcuda_ctx *c, struct ops_dbuf *b, size_t bytes)
{
	b->bytes = bytes;
	if (kcuda_alloc(bytes + 2 * OPS_GUARD, (void **)&b->base))
		return -1;
	b->user = b->base + OPS_GUARD;
	return kcuda_memset(c, b->base, OPS_FILL, bytes + 2 * OPS_GUARD);
}
static inline void ops_dbuf_fini(struct ops_dbuf *b)
{
	kcuda_free(b->base);
	b->base = NULL;
}
/* Downloads the user part into host[bytes]; returns the number of damaged guard bytes. */
static inline size_t ops_dbuf_get(struct kcuda_ctx *c, const struct ops_dbuf *b, void *host)
{
	size_t total = b->bytes + 2 * OPS_GUARD, bad = 0;
	uint8_t *all = (uint8_t *)malloc(total);
	if (!all || kcuda_download(c, all, b->base, total)) {
		free(all);
		return (size_t)-1;
	}
	for (size_t i = 0; i < OPS_GUARD; i++)
		bad += (all[i] != OPS_FILL) + (all[OPS_GUARD + b->bytes + i] != OPS_FILL);
	memcpy(host, all + OPS_GUARD, b->bytes);
	free(all);
	return bad;
}
#endif

static inline int ops_is_fill_f32(float v)
{
	uint32_t u;
	memcpy(&u, &v, 4);
	return u == 0xA5A5A5A5u;
}

#endif
